"""Conversation templates: Vicuna v1.1 as upstream Spec-Bench, the tokenizer's own chat
template, and plain text. A second turn sees the model's first answer, as upstream."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from specbench.core.errors import SpecbenchError

VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
TEMPLATES = ("vicuna_v1.1", "chat_template", "plain")


def vicuna_prompt(turns: Sequence[str], answers: Sequence[str]) -> str:
    """FastChat's vicuna_v1.1: `SYSTEM USER: q ASSISTANT: a</s>USER: q ASSISTANT:`."""
    text = VICUNA_SYSTEM + " "
    for i, turn in enumerate(turns):
        text += f"USER: {turn} "
        if i < len(answers):
            text += f"ASSISTANT: {answers[i]}</s>"
        else:
            text += "ASSISTANT:"
    return text


def plain_prompt(turns: Sequence[str], answers: Sequence[str]) -> str:
    """User turns and answers separated by blank lines, ending where the next answer starts."""
    parts: list[str] = []
    for i, turn in enumerate(turns):
        parts.append(turn)
        if i < len(answers):
            parts.append(answers[i])
    return "\n\n".join(parts) + "\n\n"


def messages_of(turns: Sequence[str], answers: Sequence[str]) -> list[dict[str, str]]:
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def prompt_ids(
    template: str, tokenizer: PreTrainedTokenizerBase, turns: Sequence[str], answers: Sequence[str]
) -> list[int]:
    """Token ids of the prompt for the last of `turns`, given the answers to the earlier ones."""
    if template == "chat_template":
        if not getattr(tokenizer, "chat_template", None):
            raise SpecbenchError(
                "the tokenizer has no chat_template; set model.template=vicuna_v1.1 or model.template=plain"
            )
        text = tokenizer.apply_chat_template(
            messages_of(turns, answers), add_generation_prompt=True, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False).input_ids
    if template == "vicuna_v1.1":
        return tokenizer(vicuna_prompt(turns, answers)).input_ids
    if template == "plain":
        return tokenizer(plain_prompt(turns, answers)).input_ids
    raise SpecbenchError(f"unknown template '{template}'; use one of {', '.join(TEMPLATES)}")

