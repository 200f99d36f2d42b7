"""The quality card: held-out perplexity/accuracy, draft-target agreement, greedy answers
(EOS within budget, math exact match) and decode speed.

Quality numbers are deterministic for a seed and are checked against floors by the tests;
speed numbers are wall-clock and only printed and saved (never asserted).
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedTokenizerBase

from specbench import synth
from specbench.core.stopping import StopCriteria
from specbench.engine.decode import autoregressive
from specbench.zoo.data import Packed, render

ANSWER_RE = re.compile(r"The answer is (-?[\d,]*\d(?:\.\d+)?)")


@torch.inference_mode()
def heldout_metrics(models: dict[str, torch.nn.Module], data: Packed, batch_size: int,
                    reference: str = "target") -> dict[str, dict[str, float]]:
    """Per model: perplexity and next-token accuracy on all and on answer tokens; for every
    other model also its top-1 agreement with `reference` (the chance a greedy draft token
    is the token greedy verification keeps)."""
    sums: dict[str, dict[str, float]] = {name: {} for name in models}

    def add(name: str, key: str, value: float) -> None:
        sums[name][key] = sums[name].get(key, 0.0) + value

    for start in range(0, len(data), batch_size):
        ids = data.input_ids[start : start + batch_size]
        targets = data.labels[start : start + batch_size, 1:]
        keep = targets != -100
        answer = data.assistant[start : start + batch_size, 1:] & keep
        tops = {}
        for name, model in models.items():
            logits = model(input_ids=ids).logits[:, :-1].float()
            nll = F.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
            tops[name] = logits.argmax(-1)
            hit = tops[name] == targets
            for scope, mask in (("all", keep), ("answer", answer)):
                add(name, f"nll_{scope}", float(nll[mask].sum()))
                add(name, f"hit_{scope}", float(hit[mask].sum()))
                add(name, f"n_{scope}", float(mask.sum()))
        for name in models:
            if name != reference:
                same = tops[name] == tops[reference]
                add(name, "agree_all", float(same[keep].sum()))
                add(name, "agree_answer", float(same[answer].sum()))
    out: dict[str, dict[str, float]] = {}
    for name, s in sums.items():
        row = {}
        for scope in ("all", "answer"):
            n = max(s[f"n_{scope}"], 1.0)
            row[f"ppl_{scope}"] = round(math.exp(s[f"nll_{scope}"] / n), 4)
            row[f"accuracy_{scope}"] = round(s[f"hit_{scope}"] / n, 4)
            if name != reference:
                row[f"agreement_{scope}"] = round(s[f"agree_{scope}"] / n, 4)
        row["tokens_all"], row["tokens_answer"] = int(s["n_all"]), int(s["n_answer"])
        out[name] = row
    return out


def greedy(model: torch.nn.Module, prompt: Sequence[int], eos_id: int, max_new_tokens: int) -> list[int]:
    """Greedy decoding with a KV cache: the harness's baseline itself (the engine's shared step with
    an empty draft); EOS is kept."""
    return autoregressive(model, list(prompt), StopCriteria.build([eos_id], max_new_tokens)).tokens


def final_answer(text: str) -> str | None:
    """N of the last "The answer is N." (commas dropped), None when absent."""
    found = ANSWER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def subtask_of(category: str) -> str:
    return "mt_bench" if category in synth.MT_BENCH_CATEGORIES else category


def question_sample(per_subtask: int, seed: int) -> list[dict]:
    """`per_subtask` benchmark questions per subtask, evenly spread (so MT-bench's categories mix)."""
    questions = synth.make_questions(seed)
    picked = []
    for subtask in synth.SUBTASKS:
        pool = [q for q in questions if subtask_of(q["category"]) == subtask]
        step = max(1, len(pool) // max(per_subtask, 1))
        picked.extend(pool[::step][:per_subtask])
    return picked


def generation_checks(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, questions: list[dict],
                      math_items: list[dict], max_new_tokens: int) -> dict:
    """Greedy answers to benchmark prompts (every turn, later turns after the model's own
    earlier answers, as the runner does) and to held-out math problems."""
    eos_id = tokenizer.eos_token_id
    ended: list[bool] = []
    lengths: list[int] = []
    per_subtask: dict[str, list[bool]] = {}

    def answer(messages: list[dict]) -> str:
        prompt = tokenizer(render(tokenizer, messages, generation_prompt=True), add_special_tokens=False).input_ids
        new = greedy(model, prompt, eos_id, max_new_tokens)
        ended.append(new[-1] == eos_id)
        lengths.append(len(new))
        return tokenizer.decode(new, skip_special_tokens=True)

    for q in questions:
        messages: list[dict] = []
        for turn in q["turns"]:
            messages.append({"role": "user", "content": turn})
            messages.append({"role": "assistant", "content": answer(messages)})
            per_subtask.setdefault(subtask_of(q["category"]), []).append(ended[-1])
    n_questions = len(ended)
    correct = 0
    for item in math_items:
        text = answer([{"role": "user", "content": item["turns"][0]}])
        gold = final_answer(item["reference"][0])
        correct += gold is not None and final_answer(text) == gold
    return {
        "answers": len(ended),
        "eos_fraction": round(sum(ended) / max(len(ended), 1), 4),
        "eos_fraction_questions": round(sum(ended[:n_questions]) / max(n_questions, 1), 4),
        "eos_fraction_by_subtask": {k: round(sum(v) / len(v), 4) for k, v in per_subtask.items()},
        "mean_answer_tokens": round(statistics.fmean(lengths), 1) if lengths else 0.0,
        "max_answer_tokens": max(lengths, default=0),
        "math_exact_match": round(correct / max(len(math_items), 1), 4),
        "math_problems": len(math_items),
        "max_new_tokens": max_new_tokens,
    }


@torch.inference_mode()
def measure_speed(target: torch.nn.Module, draft: torch.nn.Module, context: int, verify_tokens: int,
                  reps: int, seed: int) -> dict:
    """Target decode of 1 token vs a forward of `verify_tokens` on the same KV cache, and the
    draft's 1-token decode. Calls are interleaved and each ratio is the median of per-round
    ratios, so load from other processes on the shared cores mostly cancels out."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=gen)
    caches = {}
    for name, model in (("target", target), ("draft", draft)):
        caches[name] = DynamicCache(config=model.config)
        model(input_ids=prompt, cache=caches[name], use_cache=True, logits_to_keep=1)

    def timed(model: torch.nn.Module, cache: DynamicCache, n: int) -> float:
        ids = torch.randint(0, vocab, (1, n), generator=gen)
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, use_cache=True)
        elapsed = time.perf_counter() - start
        cache.crop(-n)  # back to the prompt: every round sees the same context length
        return elapsed

    rounds = []
    for i in range(reps + 3):
        row = (timed(target, caches["target"], 1), timed(target, caches["target"], verify_tokens),
               timed(draft, caches["draft"], 1))
        if i >= 3:  # warm-up rounds: allocator and kernel caches
            rounds.append(row)
    d1, v8, dr = (statistics.median(r[k] for r in rounds) for k in range(3))
    return {
        "context_tokens": context,
        "verify_tokens": verify_tokens,
        "target_decode1_ms": round(d1 * 1e3, 3),
        f"target_verify{verify_tokens}_ms": round(v8 * 1e3, 3),
        "verify_over_decode": round(statistics.median(r[1] / r[0] for r in rounds), 3),
        "draft_decode1_ms": round(dr * 1e3, 3),
        "draft_over_target": round(statistics.median(r[2] / r[0] for r in rounds), 3),
        "threads": torch.get_num_threads(),
        # Other processes on the same cores distort these numbers badly (torch's OpenMP threads
        # spin-wait for a descheduled sibling): the load average tells a reader whether to trust them.
        "load_average": round(os.getloadavg()[0], 2),
    }


def format_speed(speed: dict) -> str:
    """One line of decode timings (see measure_speed)."""
    k = speed["verify_tokens"]
    load = f", load average {speed['load_average']}" if "load_average" in speed else ""
    return (f"speed ({speed['threads']} threads{load}, {speed['context_tokens']} tokens of context): "
            f"target decode 1 {speed['target_decode1_ms']:.2f} ms, verify {k} "
            f"{speed[f'target_verify{k}_ms']:.2f} ms (x{speed['verify_over_decode']:.2f}), "
            f"draft decode 1 {speed['draft_decode1_ms']:.2f} ms (x{speed['draft_over_target']:.3f} of target)")


def format_card(card: dict) -> str:
    """The card as a small plain-text table."""
    lines = [f"tiny zoo {card.get('zoo_hash', '?')}  (generator {card.get('generator_version', '?')})", ""]
    models = card.get("heldout", {})
    header = f"{'model':<12}{'params':>10}{'ppl':>8}{'acc':>7}{'ppl ans':>9}{'acc ans':>9}{'agree':>7}{'agr ans':>9}"
    lines += [header, "-" * len(header)]
    for name, row in models.items():
        params = card.get("models", {}).get(name, {}).get("params", 0)
        agree = f"{row['agreement_all']:.3f}" if "agreement_all" in row else "-"
        agree_ans = f"{row['agreement_answer']:.3f}" if "agreement_answer" in row else "-"
        lines.append(f"{name:<12}{params / 1e6:>9.2f}M{row['ppl_all']:>8.2f}{row['accuracy_all']:>7.3f}"
                     f"{row['ppl_answer']:>9.2f}{row['accuracy_answer']:>9.3f}{agree:>7}{agree_ans:>9}")
    gen = card.get("generation", {})
    if gen:
        lines += ["", f"greedy target answers: {gen['answers']} (max_new_tokens {gen['max_new_tokens']}), "
                  f"end with EOS {gen['eos_fraction']:.3f} (benchmark prompts {gen['eos_fraction_questions']:.3f}), "
                  f"mean length {gen['mean_answer_tokens']} tokens, max {gen['max_answer_tokens']}",
                  f"math exact match (held-out): {gen['math_exact_match']:.3f} of {gen['math_problems']}"]
    if card.get("speed"):
        lines += ["", format_speed(card["speed"])]
    build = card.get("build_seconds", {})
    if build:
        lines += ["", "build: " + ", ".join(f"{k} {v:.0f}s" for k, v in build.items())]
    floors = card.get("floors", {})
    if floors:
        lines += ["floors: " + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'} ({v['value']} >= {v['floor']})"
                                         for k, v in floors.items())]
    return "\n".join(lines)
