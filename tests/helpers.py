"""Small helpers shared by tests: plain names (functions, constants, classes); shared fixtures live
in conftest.py. Test modules share code through these two, never by importing each other
(test_layers.test_no_test_module_imports_another checks it).
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from specbench.analysis import frame
from specbench.analysis.runs import Run
from specbench.core.answers import AnswerWriter, run_dir, write_meta
from specbench.core.prompts import prompt_ids
from specbench.core.sampling import SamplingParams, probs_from_logits, sample
from specbench.core.stopping import StopCriteria
from specbench.core.timing import CpuTimer
from specbench.engine import DraftContext, Drafter, DraftTree, Feedback, SpeculativeMethod, Verdict
from specbench.models import LoadedModel
from specbench.run.registry import build_method

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = REPO.parent / "shared" / "spec_bench" / "question.jsonl"
CATEGORIES = ["writing", "roleplay", "translation", "summarization", "qa", "math_reasoning", "rag"]


def write_questions(path: Path, per_category: int = 2) -> Path:
    """A small question file in the official schema: every subtask, mt_bench with two turns."""
    lines = []
    qid = 1
    for category in CATEGORIES:
        for i in range(per_category):
            turns = [f"please {category} item number {i} for the quick brown fox"]
            if category in ("writing", "roleplay"):
                turns.append("now summarize the passage in two sentences")
            lines.append(json.dumps({"question_id": qid, "category": category, "turns": turns}))
            qid += 1
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def specbench(*args: str, cwd: Path, check: bool = False, timeout: float = 600,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m specbench ARGS` in `cwd` (with `env` added to the environment), capturing output."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"specbench {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class CliResult:
    """What one in-process `specbench` command left: its exit code, stdout and stderr."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, err={self.err[-2000:]!r})"


def cli(*args: str, cwd: Path) -> CliResult:
    """Run `specbench ARGS` in this process (about 10x quicker than a subprocess once torch is
    imported): the exit code, what it printed; an exception escaping `main` propagates."""
    import contextlib
    import io

    from specbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv[:], os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv[:] = argv
        os.chdir(here)
    return CliResult(code, out.getvalue(), err.getvalue())


def error_lines(text: str) -> list[str]:
    """The `error: ...` lines of a command's stderr."""
    return [line for line in text.splitlines() if line.startswith("error:")]


def assert_one_line_error(result: CliResult | subprocess.CompletedProcess, pattern: str, code: int = 2) -> str:
    """The command failed with `code`, printed exactly one `error:` line matching `pattern`
    (a regular expression) and no traceback. Returns that line."""
    import re

    err = result.err if isinstance(result, CliResult) else result.stderr
    rc = result.code if isinstance(result, CliResult) else result.returncode
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert rc == code and len(lines) == 1 and re.search(pattern, lines[0]), (rc, err[-3000:])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: to show that a failed command left them alone."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the package's import graph (test_layers, test_synth) -----------------------------------------


PACKAGE = Path(__file__).resolve().parents[1] / "specbench"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the specbench modules it imports anywhere in its body (the most specific
    module named: `from specbench.zoo import data` is an edge to specbench.zoo.data)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


# --- a small run's arguments and its answer file (test_cli, test_faults) --------------------------


def base_args(model_dir, questions, out, *extra):
    return ["run", "model=local", f"model.path={model_dir}", "dataset=spec_bench", f"dataset.path={questions}",
            f"output_dir={out}", "max_new_tokens=8", "warmup=0", "progress=false", *extra]


def answers_file(out, method="baseline", temp="0", run=1, model="local"):
    return out / "spec_bench" / model / method / f"temp-{temp}" / f"run-{run}" / "answers.jsonl"


# --- hand-made answer files whose numbers are known (test_report and the report tests) ------------


CATS = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]


def record(qid, category, tokens, seconds, accept, ids=None, margins=None, depths=None):
    """A record in our format; `depths` = per-step draft depths, summarised as the engine does."""
    stats = {}
    if margins:
        stats["top2_margin"] = margins
    if depths:
        top = max(depths)
        stats["position_drafted"] = [sum(d > i for d in depths) for i in range(top)]
        stats["position_accepted"] = [sum(a - 1 > i for a in accept) for i in range(top)]
    return {
        "question_id": qid, "category": category, "answer_id": f"a{qid}", "model_id": "m", "tstamp": 0.0,
        "choices": [{"index": 0, "turns": ["x"], "decoding_steps": [len(accept)], "new_tokens": [tokens],
                     "wall_time": [seconds], "accept_lengths": accept}],
        "specbench": {"output_ids": [ids or list(range(tokens))], "prefill_time": [seconds / 10],
                      "sections": [{"draft": seconds / 5, "verify": seconds / 2}],
                      "stats": [stats]},
    }


def write_run(root, method, records, temperature=0.0, run=1, facts=None):
    folder = run_dir(root, "synthetic", "tiny", method, temperature, run)
    with AnswerWriter(folder / "answers.jsonl") as w:
        for r in records:
            w.write(r)
    write_meta(folder / "meta.json", {"identity": {"dtype": "float32", "model": "zoo:target",
                                                   "method": {"name": method, "facts": facts or {}}},
                                      "environment": {"device": "cpu"},
                                      "config": {"method": {"name": method, "facts": facts or {}}},
                                      "target_parameters": 1000, "extra_parameters": 10})
    return folder


def base_records(seconds=1.0):
    return [record(i, c, 10, seconds, [1] * 9, margins=[0.01] * 10) for i, c in enumerate(CATS)]


def speedup_rows(ours, base):
    """`frame.speedups` of `ours` against `base` (one run each): row dicts, subtasks then overall."""
    runs = [Run("synthetic", "tiny", "baseline", 0.0, 1, base), Run("synthetic", "tiny", "fast", 0.0, 1, ours)]
    return frame.speedups(frame.tidy(runs)).loc["fast"].reset_index().to_dict("records")


# --- lossless: greedy equal to the baseline, samples follow the target (test_lossless, the methods) ---


CPU = torch.device("cpu")
GREEDY = SamplingParams()
EMPTY = OmegaConf.create({})
ARCHS = ["llama", "qwen2"]
PROMPTS = [["the quick brown fox jumps over the lazy dog, the quick brown fox"], ["tom has 3 boxes"],
           ["summarize the passage", "now translate it"]]
LENGTHS = (1, 6, 40)


def method_cfg(name: str, **overrides) -> OmegaConf:
    cfg = OmegaConf.load(REPO / "configs" / "method" / f"{name}.yaml")
    return OmegaConf.merge(cfg, overrides)


def prompt_of(target: LoadedModel, turns: list[str]) -> torch.Tensor:
    return torch.tensor([prompt_ids("chat_template", target.tokenizer, turns, ["an answer"] * (len(turns) - 1))])


def run(method, input_ids: torch.Tensor, stop: StopCriteria, sampling: SamplingParams = GREEDY):
    result = method.decode(method.prefill(input_ids, sampling), sampling, stop, CpuTimer())
    assert len(result.tokens) == 1 + sum(result.accept_lengths)
    assert all(a >= 1 for a in result.accept_lengths) or not method.splits_prefill
    return result


_BASELINE: dict = {}


def baseline_tokens(target: LoadedModel, input_ids: torch.Tensor, stop: StopCriteria) -> list[int]:
    key = (target.path, tuple(input_ids[0].tolist()), stop.max_new_tokens, stop.eos_ids, stop.stop_strings)
    if key not in _BASELINE:
        base = build_method(method_cfg("baseline"), target, EMPTY)
        _BASELINE[key] = run(base, input_ids, stop).tokens
    return _BASELINE[key]


def assert_matches_baseline(method, target: LoadedModel, lengths=LENGTHS) -> list:
    results = []
    for turns in PROMPTS:
        input_ids = prompt_of(target, turns)
        for max_new in lengths:
            stop = StopCriteria.build(target.eos_ids, max_new)
            result = run(method, input_ids, stop)
            assert result.tokens == baseline_tokens(target, input_ids, stop), (turns, max_new)
            results.append(result)
    return results


class RandomChainDrafter(Drafter):
    """Random tokens, nonsense 'probabilities', lengths that ignore the budget."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.rng = random.Random(seed)

    def propose(self, ctx: DraftContext) -> DraftTree:
        n = self.rng.randint(0, 12)
        tokens = torch.tensor([self.rng.randrange(self.vocab) for _ in range(n)], dtype=torch.long)
        probs = torch.rand(n, self.vocab) * 3  # not distributions at all
        return DraftTree.chain(tokens, probs)


class RandomTreeDrafter(Drafter):
    """Multi-branch deterministic trees with the target's continuation on a random branch."""

    def __init__(self, continuation: list[int], seed: int = 0) -> None:
        self.continuation = continuation
        self.rng = random.Random(seed)
        self.non_prefix_paths = 0

    def propose(self, ctx: DraftContext) -> DraftTree:
        good = self.continuation[len(ctx.tokens) : len(ctx.tokens) + self.rng.randint(0, 5)]
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(-1, True)]  # (node, on the good path)
        for depth in range(len(good) + 1):
            nxt = []
            for node, on_path in frontier:
                width = self.rng.randint(1, 3)
                slot = self.rng.randrange(width) if on_path and depth < len(good) else -1
                for k in range(width):
                    token = good[depth] if k == slot else self.rng.randrange(320)
                    parents.append(node)
                    tokens.append(token)
                    nxt.append((len(tokens) - 1, k == slot))
            frontier = [f for f in nxt if self.rng.random() < 0.6 or f[1]]
        return DraftTree(torch.tensor(tokens, dtype=torch.long), tuple(parents))

    def accepted(self, feedback: Feedback) -> None:
        path = feedback.verdict.path
        self.non_prefix_paths += path != list(range(len(path)))


def long_continuation(target: LoadedModel, input_ids: torch.Tensor, n: int = 80) -> list[int]:
    return baseline_tokens(target, input_ids, StopCriteria.build((), n))


def greedy_rows(target: LoadedModel, n: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    """Training rows for heads in tests: each of PROMPTS followed by the target's own greedy
    continuation, right-padded with 0; (ids, valid)."""
    rows = [prompt_of(target, turns)[0].tolist() + long_continuation(target, prompt_of(target, turns), n)
            for turns in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    valid = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return ids, valid


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells expected below `min_expected` are pooled."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = probs * counts.sum()
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def accept_everything(tree: DraftTree, target_probs: torch.Tensor) -> Verdict:
    """A broken verifier: takes the first branch whole and samples the bonus token after it."""
    layout = tree.layout
    path: list[int] = []
    row = 0
    while layout.children[row]:
        path.append(layout.children[row][0])
        row = path[-1] + 1
    tokens = [int(tree.tokens[i]) for i in path]
    return Verdict(path, tokens, int(sample(target_probs[row])))


VOCAB = 5
START = VOCAB  # the context "before the first token" gets its own row in the bigram tables


def bigram_tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits, (VOCAB + 1, VOCAB): row = previous token (START for the first)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB + 1, VOCAB, generator=gen) * 1.5, torch.randn(VOCAB + 1, VOCAB, generator=gen) * 1.5


def draft_tree(kind: str, prev: int, draft_p: torch.Tensor, depth: int) -> DraftTree:
    """A sampled draft for a bigram draft model: chains, i.i.d. / without-replacement siblings,
    or deterministic top candidates."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[torch.Tensor] = []
    frontier = [(-1, prev)]
    widths = {"chain": 1, "iid": 3, "without_replacement": 3, "deterministic": 2}
    for _ in range(depth):
        nxt = []
        for node, token in frontier:
            p = draft_p[token]
            width = widths[kind]
            if kind == "deterministic":
                picks = p.topk(width).indices.tolist()
            else:
                picks = torch.multinomial(p, width, replacement=kind != "without_replacement").tolist()
            for x in picks:
                parents.append(node)
                tokens.append(x)
                rows.append(p)
                nxt.append((len(tokens) - 1, x))
        frontier = nxt
    if kind == "deterministic":
        return DraftTree(torch.tensor(tokens), tuple(parents))
    return DraftTree(torch.tensor(tokens), tuple(parents), torch.stack(rows), "iid" if kind == "chain" else kind)


def sample_first_tokens(kind: str, params: SamplingParams, verifier, draws: int, n_tokens: int = 3, seed: int = 0,
                        depth: int = 2, shape=None, dtype: torch.dtype = torch.float32):
    """Counts of the first `n_tokens` tokens of `draws` simulated generations with a bigram target
    whose logits (target and draft) are held in `dtype`.
    `shape(tree, prev, p_table)`, when given, changes each draft before verification (what a draft
    budget keeps of it) and `shape.observe(tree, verdict)` hears each verdict."""
    target_logits, draft_logits = (t.to(dtype) for t in bigram_tables(seed))
    q_table, p_table = probs_from_logits(target_logits, params), probs_from_logits(draft_logits, params)
    torch.manual_seed(seed)
    counts = torch.zeros((VOCAB,) * n_tokens)
    for _ in range(draws):
        out: list[int] = []
        prev = START
        while len(out) < n_tokens:
            tree = draft_tree(kind, prev, p_table, depth=depth)
            if shape is not None:
                tree = shape(tree, prev, p_table)
            rows = [prev, *tree.tokens.tolist()]  # bigram: a row's distribution depends on its own token
            verdict = verifier(tree, q_table[rows])
            if shape is not None:
                shape.observe(tree, verdict)
            out += [*verdict.tokens, verdict.token]
            prev = out[-1]
        counts[tuple(out[:n_tokens])] += 1
    return counts, exact_distribution(q_table, n_tokens)


def exact_distribution(q_table: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """P(t1, ..., tn) of the bigram target."""
    dist = q_table[START]
    for _ in range(n_tokens - 1):
        dist = dist[..., None] * q_table[:VOCAB].reshape((1,) * (dist.dim() - 1) + (VOCAB, VOCAB))
    return dist


def tiny_vocab_model(seed: int, vocab: int = VOCAB, layers: int = 1, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A Llama of `layers` blocks (one by default) over `vocab` tokens with a sharpened head
    (distinct, peaked distributions), in `dtype`."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)
    tokenizer = SimpleNamespace(eos_token_id=None)
    return LoadedModel(model.to(dtype), tokenizer, f"tiny-vocab-{seed}", CPU, dtype)


def exact_first_three(target: LoadedModel, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """P(t1, t2, t3) by enumeration: one batched forward over every two-token continuation."""
    v = VOCAB
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
    ids = torch.cat([torch.tensor(prompt).expand(v * v, -1), pairs], dim=1)
    with torch.no_grad():
        logits = target.model(input_ids=ids).logits
    probs = probs_from_logits(logits, params).double()
    n = len(prompt)
    p1 = probs[0, n - 1]
    p2 = probs[:, n].reshape(v, v, v)[:, 0]  # row (t1, any t2) -> P(t2 | t1)
    p3 = probs[:, n + 1].reshape(v, v, v)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_end_to_end(method: SpeculativeMethod, prompt: list[int], params: SamplingParams, draws: int):
    counts = torch.zeros(VOCAB, VOCAB, VOCAB)
    stop = StopCriteria.build((), 4)  # depth-2 drafts in the first step; only 3 tokens are counted
    input_ids = torch.tensor([prompt])
    torch.manual_seed(0)
    for _ in range(draws):
        tokens = run(method, input_ids, stop, params).tokens
        counts[tuple(tokens[:3])] += 1
    return counts


# --- a tiny GPT-2 beside the tiny Llama and Qwen2 (test_architectures, the methods) ---------------


#: the architectures of conftest's `targets` (the GPT-2 is saved by its `target_folders`) and of the
#: trained-head fixtures but Medusa's and EAGLE's (those train on ARCHS)
THREE_ARCHS = ["llama", "qwen2", "gpt2"]


def save_tiny(folder: Path, config, tokenizer) -> Path:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def gpt2_config(tok) -> GPT2Config:
    return GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


# --- a kit on a tiny random Llama (test_kit_build, test_kit_yaml) --------------------------------

#: a kit's YAML as a dict, sized for tiny_models' Llama: every part builds in seconds
TINY_KIT = {
    "name": "testkit", "title": "Test kit", "source": "pypi",
    "build": {
        "threads": 1, "seed": 0, "heldout_fraction": 0.4,
        "corpus": {"shards": 2, "seed": 3, "max_new_tokens": 12, "turn_tokens": 8, "sampled": 0.5,
                   "temperatures": [0.8], "top_p": 0.95, "topk": 4, "batch_size": 4, "dtype": "float32",
                   "per_shard": {"instruct": 2, "hinted": 2, "math": 3, "foreign": 3, "summarize": 1, "rag": 1,
                                 "translate": 1, "second": 1}},
        "drafts": {
            "dtype": "float32", "max_positions": 512,
            "arch": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                     "tie_word_embeddings": True},
            # draft: the target's first block with its embedding and head, frozen (shipped: stored once)
            **{name: {"init": init, "layers": 1, "train_embeddings": False, "epochs": 1.0, "batch_tokens": 64,
                      "evaluations": 1, "chain": 3, "lr": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 1,
                      "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "kd_alpha": kd}
               for name, init, kd in (("draft", "target_layers", 0.9), ("draft_plain", "pca", 0.0))},
        },
        "heads": {"medusa": {"num_heads": 2, "steps": 3, "batch_positions": 32},
                  "eagle": {"steps": 3, "batch_rows": 2, "window": 32},
                  "hydra": {"num_heads": 2, "steps": 3, "batch_positions": 32},
                  "ppd": {"exit_layer": None, "steps": 3, "batch_positions": 32},
                  "eagle3": {"layers": None, "steps": 3, "batch_rows": 2, "window": 32, "draft_vocab": 200},
                  "specdec": {"block": 3, "steps": 3, "batch_rows": 2, "window": 32, "cuts": 4}},
    },
}
