"""The zoo's text side: corpus, chat template, byte-level BPE tokenizer, packed training rows.

Training text is rendered with the very chat template that is saved with the tokenizer, so the
model sees at training time exactly the token stream the runner builds at inference time
(`apply_chat_template(messages, add_generation_prompt=True)` followed by the answer).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from specbench import synth

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS.values()]

# Every message is `<|role|>\n{content}<|end|>\n`; the prompt ends with `<|assistant|>\n`, so the
# model's answer is the content followed by `<|end|>` (the EOS). The BOS is written by the
# template itself: the runner tokenizes the rendered prompt with add_special_tokens=False.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def conversations(cfg: DictConfig, split: str) -> list[dict]:
    """The corpus items of a split ("train" or "heldout"); the held-out one uses its own seed."""
    n, seed = (cfg.corpus.n_train, cfg.corpus.train_seed) if split == "train" else (
        cfg.corpus.n_heldout, cfg.corpus.heldout_seed)
    return list(synth.make_corpus(int(n), seed=int(seed), question_seed=int(cfg.corpus.question_seed)))


def corpus_digest(items: Iterable[dict]) -> str:
    """SHA-256 of the conversations' messages: names the exact corpus a zoo was trained on."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps(synth.conversation_messages(item), sort_keys=True).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def train_tokenizer(cfg: DictConfig, items: Sequence[dict]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on message contents and wrap it as a Hugging Face tokenizer."""
    texts = [m["content"] for it in items for m in synth.conversation_messages(it)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(cfg.tokenizer.vocab_size),
        min_frequency=int(cfg.tokenizer.min_frequency),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts[: int(cfg.tokenizer.max_texts)], trainer)
    # Like Llama, a plain `tokenizer(text)` starts with BOS; the chat path adds none of its own.
    bos_id = core.token_to_id(BOS)
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=CHAT_TEMPLATE,
        model_max_length=int(cfg.max_position_embeddings),
    )


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], *, generation_prompt: bool = False) -> str:
    """A conversation as text through the tokenizer's own chat template."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def encode_items(tokenizer: PreTrainedTokenizerBase, items: Sequence[dict]) -> list[list[int]]:
    """Token ids of whole rendered conversations (batch-encoded by the Rust tokenizer: fast)."""
    texts = [render(tokenizer, synth.conversation_messages(it)) for it in items]
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [e.ids for e in encodings]


@dataclass
class Packed:
    """Conversations packed whole into rows of seq_len tokens, padded at the end.

    `labels` is -100 at padding; `assistant` marks the answer tokens (content and `<|end|>`),
    the positions where speculative decoding drafts and verifies.
    """

    input_ids: torch.Tensor  # (rows, seq_len) int64
    labels: torch.Tensor  # (rows, seq_len) int64
    assistant: torch.Tensor  # (rows, seq_len) bool
    n_tokens: int
    n_truncated: int

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def assistant_mask(ids: Sequence[int], assistant_id: int, newline_id: int, eos_id: int) -> list[bool]:
    """True on answer tokens: after `<|assistant|>\\n` up to and including the next `<|end|>`."""
    mask, inside, skip_newline = [], False, False
    for tok in ids:
        if skip_newline:
            mask.append(False)
            skip_newline = False
            inside = tok == newline_id  # the template always writes it; be strict anyway
            continue
        if tok == assistant_id:
            mask.append(False)
            skip_newline = True
            continue
        mask.append(inside)
        if inside and tok == eos_id:
            inside = False
    return mask


def pack(seqs: Sequence[Sequence[int]], seq_len: int, tokenizer: PreTrainedTokenizerBase, seed: int) -> Packed:
    """Best-fit-decreasing packing: every row starts at a conversation start (position 0, as at
    inference) and almost no tokens are wasted on padding; rows are then shuffled with `seed`."""
    pad_id = tokenizer.pad_token_id
    assistant_id = tokenizer.convert_tokens_to_ids(ROLE_TOKENS["assistant"])
    newline_id = tokenizer.backend_tokenizer.encode("\n", add_special_tokens=False).ids[0]
    eos_id = tokenizer.eos_token_id
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free space, row index), sorted: bisect finds the best fit
    n_truncated = 0
    for i in order:
        seq = list(seqs[i][:seq_len])
        n_truncated += len(seqs[i]) > seq_len
        pos = bisect.bisect_left(free, (len(seq), -1))
        if pos < len(free):
            space, row = free.pop(pos)
        else:
            space, row = seq_len, len(rows)
            rows.append([])
        rows[row].extend(seq)
        if space - len(seq) > 0:
            bisect.insort(free, (space - len(seq), row))
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    assistant = torch.zeros((len(rows), seq_len), dtype=torch.bool)
    for r, src in enumerate(perm):
        ids = rows[src]
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        assistant[r, : len(ids)] = torch.tensor(assistant_mask(ids, assistant_id, newline_id, eos_id))
    labels = input_ids.clone()
    labels[input_ids == pad_id] = -100
    n_tokens = int((labels != -100).sum())
    return Packed(input_ids, labels, assistant, n_tokens, n_truncated)
