"""`report --recheck`: the target alone, in float64, judges each greedy divergence.

The lossless audit (`audit.lossless_audit`) finds, for every greedy answer of a method that is
not the baseline's token for token, the first diverging token: run, question, turn, position,
with the baseline's token b and the method's token m there. The recheck rebuilds the exact
prompt of that turn (the question file and the model's tokenizer and template recorded in the
run's meta.json `config`, earlier turns answered by the baseline's recorded text, as the run
did; the rebuilt prompt must have the recorded `prompt_tokens`), appends the common prefix of
the two answers, and runs the target in float64 *with the weights the run had* (loaded
in the run's dtype, then widened: a bfloat16 run is judged against exact arithmetic on its own
bfloat16 weights, not against other weights). It reads the next-token logits z (t = argmax z,
flip gap g = |z[b] - z[m]|), and measures at that very place how far the run's own precision
moves the gap: the baseline's turn in the run's dtype, scored in one forward and as the prompt
plus the answer in blocks of 1, 8 and 32 rows, each shape's gap z'[b] - z'[m] against the float64
one (the local error e). The logits of a turn are computed once for all its divergences (one
forward over prompt + the baseline's whole answer per shape: causal, so a position's float64
logits do not depend on the tokens after it). The margin is the largest of --tie-margin, the
spread the run measured on its device (meta `precision`, see engine.precision) and e. Verdicts:

- "numerical": t is neither b nor m (the float64 target agrees with neither continuation), or
  t = b with g <= the margin: the two tokens lie within the arithmetic of the run's precision
  (or float noise) of a flip, so a forward over other rows may pick either;
- "baseline off": t = m: the method followed the float64 target and the baseline's own run was
  the one off (numerical too, on the baseline's side);
- "bug": t = b and g > the margin: exact arithmetic prefers the baseline's token by more than
  the precision of the run can move it, and the method left it;
- "not rechecked: <why>": the question file, the question, the model or the prompt could not be
  rebuilt, an answer ended at the divergence, or `limit` was reached (a warning names each cause
  once per group, with how many mismatches it left unchecked).

Where: the device the run decoded on (meta `environment.device`) when this machine has one of that
kind, else the CPU (`device=` overrides: "cpu", "cuda", "auto"). On the run's own device the
local error e is the arithmetic the run had (the same kernels); on another it is that dtype's
arithmetic elsewhere, a proxy of the same size. Each verdict records the device it was made on.

tie_margin is the report's `--tie-margin` (logits), the floor of the near-tie rule's margin too.
The analysis layer may import `specbench.models` (layers: models < analysis), so the forward pass
lives here.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbench.analysis.audit import BASELINE_OFF, BUG, NUMERICAL, run_dtype
from specbench.analysis.runs import BASELINE, Group, Run
from specbench.core import questions as data
from specbench.core.answers import EXTRA_KEY
from specbench.core.errors import SpecbenchError
from specbench.core.prompts import prompt_ids
from specbench.engine.precision import block_pass
from specbench.models import LoadedModel, first_line, load_model

NOT_RECHECKED = "not rechecked: "


@dataclass
class Rechecker:
    """Models (loaded once each: the run's dtype and float64), question files and forward passes, cached
    across groups."""

    tie_margin: float = 0.05
    device: str = "auto"  # auto: the run's device where this machine has it, else cpu
    limit: int | None = None  # at most this many mismatches rechecked (forward passes), all groups together
    done: int = 0
    models: dict[tuple[str, bool, str, str], tuple[LoadedModel, LoadedModel] | str] = field(default_factory=dict)
    # (spec, trust_remote_code, dtype, device) -> (the run-dtype model, its float64 copy), or why it cannot load
    questions: dict[tuple[str, ...], dict[int, data.Question] | str] = field(default_factory=dict)
    turn: tuple[tuple[str, str, tuple[int, ...]], dict[str, torch.Tensor]] | None = None  # the last turn's rows

    def group(self, group: Group) -> None:
        """Set `recheck` on every mismatch of the group's audits; name each cause left unchecked once."""
        base_runs = {run.run: run for run in group.methods.get(BASELINE, []) if run.records}
        skipped: Counter = Counter()
        todo = [(result, m) for result in group.results for m in (result.audit or {}).get("mismatches", [])]
        # the baseline's turns in order, so each turn's logits are computed once (`turn_logits` keeps the last)
        todo.sort(key=lambda rm: (rm[1].get("baseline_run", rm[1]["run"]), rm[1]["question_id"], rm[1]["turn"]))
        for result, m in todo:
            base = base_runs.get(m.get("baseline_run", m["run"]))
            method = next((r for r in group.methods.get(result.method, []) if r.run == m["run"]), None)
            try:
                m.update(self.mismatch(m, base, method))
            except _Skip as why:
                m["recheck"] = NOT_RECHECKED + str(why)
                skipped[str(why)] += 1
        for why, n in skipped.items():
            group.problems.append(f"{group.title}: float64 recheck: {why} ({n} mismatch(es) not rechecked)")

    def mismatch(self, m: dict[str, Any], base: Run | None, method: Run | None) -> dict[str, Any]:
        """{"recheck": verdict, "recheck_token": t, "recheck_gap": g} of one mismatch, or raises _Skip."""
        if base is None:
            raise _Skip("the baseline run it was compared with is gone")
        b, ours = m.get("baseline_token"), m.get("token")
        if b is None or ours is None:
            who = "the baseline's" if b is None else "the method's"
            raise _Skip(f"{who} answer ends where the other goes on (a length limit, not a token choice)")
        if self.limit is not None and self.done >= self.limit:
            raise _Skip(f"beyond --recheck-limit {self.limit}")
        record = next((r for r in base.records if r["question_id"] == m["question_id"]), None)
        if record is None:
            raise _Skip("the baseline's answer it was compared with is gone")
        cfg = _config(base) or _config(method)
        if cfg is None:
            raise _Skip("no meta.json config to rebuild the prompt from (answers not written by specbench run)")
        dtype = run_dtype(base) or run_dtype(method) or "float32"
        low, exact = self.model(cfg, dtype, recheck_device(self.device, base, method))
        question = self.question(cfg, base, m["question_id"])
        answer = list((record.get(EXTRA_KEY) or {})["output_ids"][m["turn"]])
        ids = self.prefix(exact, cfg, question, record, m["turn"], len(answer))
        self.done += 1
        key = (exact.path, dtype, tuple(ids))
        if self.turn is None or self.turn[0] != key:
            self.turn = None  # free the last turn's rows first
            try:
                self.turn = (key, turn_logits(low, exact, ids, len(answer)))
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory, past the context: this turn unchecked
                raise _Skip(f"the float64 and {dtype} forwards of {exact.path} failed ({first_line(exc)})") from None
        rows = self.turn[1]
        pos = m["position"]
        z = rows["float64"][pos]
        top = int(z.argmax())
        exact_gap = float(z[b] - z[ours])
        gap = abs(exact_gap)
        error = max(abs(float(low_rows[pos, b] - low_rows[pos, ours]) - exact_gap)
                    for shape, low_rows in rows.items() if shape != "float64")
        margin = max(self.tie_margin, float(m.get("tie_margin") or 0.0), error)
        if top not in (b, ours):
            verdict = NUMERICAL
        elif top == ours:
            verdict = BASELINE_OFF
        else:
            verdict = NUMERICAL if gap <= margin else BUG
        return {"recheck": verdict, "recheck_token": top, "recheck_gap": gap, "recheck_error": error,
                "recheck_margin": margin, "recheck_dtype": dtype, "recheck_device": str(low.device)}

    def model(self, cfg: dict[str, Any], dtype: str, device: str = "cpu") -> tuple[LoadedModel, LoadedModel]:
        """The run's target in the run's dtype on `device`, and a float64 copy of exactly those weights."""
        model_cfg = cfg.get("model") or {}
        spec, trust = model_cfg.get("path"), bool(model_cfg.get("trust_remote_code"))
        if not spec:
            raise _Skip("the run's config names no model.path")
        key = (str(spec), trust, dtype, device)
        if key not in self.models:
            try:
                torch_dtype = getattr(torch, dtype)
                low = load_model(str(spec), device=torch.device(device), dtype=torch_dtype, trust_remote_code=trust)
                wide = copy.deepcopy(low.model).to(torch.float64)
                exact = dataclasses.replace(low, model=wide, dtype=torch.float64)
                self.models[key] = (low, exact)
            except Exception as exc:  # noqa: BLE001 - any model that cannot load leaves its mismatches unchecked
                self.models[key] = f"model {spec} cannot be loaded ({first_line(exc)})"
        loaded = self.models[key]
        if isinstance(loaded, str):
            raise _Skip(loaded)
        return loaded

    def question(self, cfg: dict[str, Any], run: Run, qid: int) -> data.Question:
        dataset = cfg.get("dataset") or {}
        key = (str(dataset.get("path")), str(dataset.get("generator")), str(dataset.get("seed")), str(run.source))
        if key not in self.questions:
            try:
                self.questions[key] = {q.question_id: q for q in load_questions(dataset, run, cfg)}
            except SpecbenchError as exc:
                self.questions[key] = str(exc)
        found = self.questions[key]
        if isinstance(found, str):
            raise _Skip(found)
        if qid not in found:
            raise _Skip(f"question {qid} is not in the question file {dataset.get('path')} any more")
        return found[qid]

    @staticmethod
    def prefix(model: LoadedModel, cfg: dict[str, Any], question: data.Question, record: dict[str, Any],
               turn: int, position: int) -> list[int]:
        """The run's prompt of `turn` (earlier turns answered by the baseline's recorded text, as the
        run saw them) + the baseline's first `position` tokens of that turn."""
        extra = record.get(EXTRA_KEY) or {}
        answers = record["choices"][0].get("turns") or []
        if turn >= len(question.turns) or len(answers) < turn:
            raise _Skip(f"question {question.question_id} has fewer turns than its answer; the question file changed")
        template = (cfg.get("model") or {}).get("template") or "vicuna_v1.1"
        try:
            ids = prompt_ids(template, model.tokenizer, question.turns[: turn + 1], answers[:turn])
        except SpecbenchError as exc:
            raise _Skip(str(exc)) from None
        recorded = (extra.get("prompt_tokens") or [])
        if turn < len(recorded) and recorded[turn] != len(ids):
            raise _Skip(f"the rebuilt prompt of a turn has {len(ids)} tokens where the run recorded {recorded[turn]} "
                        "(question file, template or tokenizer changed since the run)")
        return ids + list(extra["output_ids"][turn][:position])


class _Skip(Exception):
    """Why one mismatch cannot be rechecked."""


def _config(run: Run | None) -> dict[str, Any] | None:
    cfg = (run.meta or {}).get("config") if run is not None else None
    return cfg if isinstance(cfg, dict) and cfg.get("model") and cfg.get("dataset") else None


def run_folder(run: Run, cfg: dict[str, Any]) -> Path | None:
    """The folder the run was started from, when its relative output_dir can be told from the
    answers' place (`<cwd>/<output_dir>/<dataset>/<model>/<method>/temp-<t>/run-<r>`)."""
    if run.source is None or not cfg.get("output_dir"):
        return None
    out = Path(str(cfg["output_dir"]))
    if out.is_absolute():
        return None
    root = run.source.absolute().parents[4]
    parts = out.parts
    if root.parts[-len(parts):] != parts:
        return None
    return Path(*root.parts[: -len(parts)])


def load_questions(dataset: dict[str, Any], run: Run, cfg: dict[str, Any]) -> list[data.Question]:
    """The run's question file: its path as recorded, else relative to the folder the run started
    in; a generated dataset (`generator`) missing from disk is generated again, in memory."""
    if not dataset.get("path"):
        raise SpecbenchError("the run's config names no dataset.path")
    path = Path(str(dataset["path"])).expanduser()
    where = run_folder(run, cfg)
    candidates = [path] + ([where / path] if where is not None and not path.is_absolute() else [])
    for candidate in candidates:
        if candidate.is_file():
            return data.load_questions(candidate)
    if dataset.get("generator"):
        module, _, function = str(dataset["generator"]).partition(":")
        try:
            generate = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError):
            raise SpecbenchError(f"question file {path} not found and its generator {dataset['generator']} "
                                 "cannot be imported") from None
        with tempfile.TemporaryDirectory(prefix="specbench-recheck-") as tmp:
            file = Path(tmp) / "question.jsonl"
            file.write_text(data.questions_jsonl(generate(int(dataset.get("seed") or 0))), encoding="utf-8")
            return data.load_questions(file)
    raise SpecbenchError(f"question file {path} not found (looked in {', '.join(map(str, candidates))})")


#: rows per forward with which `turn_logits` scores an answer on top of its cached prompt
ERROR_BLOCKS = (1, 8, 32)


@torch.inference_mode()
def turn_logits(low: LoadedModel, exact: LoadedModel, ids: list[int], n: int) -> dict[str, torch.Tensor]:
    """The next-token logits (n, V) at each of the last n tokens' places of `ids` (prompt + the
    baseline's answer of n tokens: row j is the distribution of answer token j): "float64" from
    `exact` in one forward (causal: in float64 a row does not depend on the rows after it), and in
    the run's dtype from `low` in one forward ("whole") and as the prompt in one forward, then the
    answer in blocks of 1, 8 and 32 rows on its cache ("1 rows", ...): the shapes whose spread
    bounds what that dtype can move."""
    prompt = torch.tensor([ids[: len(ids) - n]], device=low.device)
    out = {"float64": _rows(exact, ids, n), "whole": _rows(low, ids, n).float()}
    for block in ERROR_BLOCKS:
        out[f"{block} rows"] = block_pass(low, prompt, ids[len(ids) - n :], block)
    return out


def _rows(model: LoadedModel, ids: list[int], n: int) -> torch.Tensor:
    """Logits (n, V) of the positions before each of the last n tokens, one forward without a cache."""
    out = model.model(input_ids=torch.tensor([ids[:-1]], device=model.device), use_cache=False, logits_to_keep=n)
    return out.logits[0]


RECHECK_DEVICES = ("auto", "cpu", "cuda")


def recheck_device(wanted: str, *runs: Run | None) -> str:
    """The device the recheck runs on: `wanted`, or for "auto" the device the run decoded on
    (meta `environment.device`) when this machine has one of that kind, else "cpu"."""
    if wanted != "auto":
        return wanted
    for run in runs:
        env = ((run.meta or {}) if run is not None else {}).get("environment") or {}
        device = str(env.get("device") or "") if isinstance(env, dict) else ""
        if device.startswith("cuda"):
            return device if torch.cuda.is_available() and _index(device) < torch.cuda.device_count() else "cpu"
    return "cpu"


def _index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def recheck_groups(groups: list[Group], *, tie_margin: float = 0.05, limit: int | None = None,
                   device: str = "auto") -> Rechecker:
    """Recheck every greedy mismatch of the analysed groups (in place: `mismatch["recheck"]`)."""
    if device not in RECHECK_DEVICES:
        raise SpecbenchError(f"unknown recheck device {device!r}; use one of {', '.join(RECHECK_DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError("--recheck-device cuda but no CUDA device is visible; use --recheck-device cpu or auto")
    checker = Rechecker(tie_margin=tie_margin, limit=limit, device=device)
    for group in groups:
        if group.temperature == 0 and group.batch == 1:  # batched answers: audited against batch 1, not rechecked
            checker.group(group)
    return checker
