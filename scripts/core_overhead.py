"""What the one decode core costs the baseline: the baseline's decode (the engine's shared step with an
empty draft) against a bare loop of target forwards and argmaxes on the same prompts, in turn, the
order alternating, on the zoo's target. Prints per-token times and their paired ratio.

    .venv/bin/python scripts/core_overhead.py --prompts 24 --tokens 128

The ratio is the share of a decode step that the engine adds around the target's forward (drafting
nothing, the stop rule, the counters, the timing sections); it is paid by the baseline and by every
method alike, per step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from omegaconf import OmegaConf

from specbench import synth
from specbench.core.prompts import prompt_ids
from specbench.core.resources import CONFIG_DIR
from specbench.core.sampling import SamplingParams
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.methods.baseline import Baseline
from specbench.models import load_model


@torch.inference_mode()
def bare(model: torch.nn.Module, cache, first: int, n: int) -> list[int]:
    """The leanest greedy loop: one forward and one argmax per token, no stop rule but the count."""
    tokens = [first]
    while len(tokens) < n:
        logits = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    model_cfg = OmegaConf.load(CONFIG_DIR / "model" / "tiny.yaml")
    target = load_model(model_cfg.path, device=torch.device("cpu"), dtype=torch.float32)
    method = Baseline(target, OmegaConf.create({"name": "baseline"}), model_cfg)
    greedy = SamplingParams()
    stop = StopCriteria.build([], args.tokens)  # no EOS: both loops make exactly `tokens` tokens
    questions = synth.make_questions(1)[: args.prompts]
    times: dict[str, list[float]] = {"bare loop": [], "baseline (shared step)": []}
    for i, q in enumerate(questions):
        prompt = torch.tensor([prompt_ids(model_cfg.template, target.tokenizer, q["turns"][0], [])])
        order = list(times) if i % 2 == 0 else list(reversed(times))
        results = {}
        for name in order:
            state = method.prefill(prompt, greedy)
            start = time.perf_counter()
            if name == "bare loop":
                results[name] = bare(target.model, state.cache, state.tokens[0], args.tokens)
            else:
                results[name] = method.decode(state, greedy, stop, CpuTimer()).tokens
            times[name].append((time.perf_counter() - start) / (args.tokens - 1))
        if results["bare loop"] != results["baseline (shared step)"]:
            raise SystemExit(f"prompt {i}: the two loops emitted different tokens")
    ratios = [math.log(s / b) for s, b in zip(times["baseline (shared step)"], times["bare loop"], strict=True)]
    mean = statistics.fmean(ratios)
    half = 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios))
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, {torch.get_num_threads()} threads, same tokens")
    print("| loop | ms per token (median) |")
    print("|---|---|")
    for name, values in times.items():
        print(f"| {name} | {1e3 * statistics.median(values):.3f} |")
    print(f"shared step / bare loop, paired: {math.exp(mean):.4f} [{math.exp(mean - half):.4f}, "
          f"{math.exp(mean + half):.4f}] (95%)")


if __name__ == "__main__":
    main()
