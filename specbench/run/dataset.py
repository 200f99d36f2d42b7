"""Where a run's questions come from and where its answers go: the dataset's question file (a
generated dataset written first) and the results folder checked before anything loads."""

from __future__ import annotations

import importlib
import shutil
import sys
import time
import uuid
from pathlib import Path

from omegaconf import DictConfig

from specbench.core import questions as data
from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic
from specbench.core.longinput import lengthen_all
from specbench.engine.target import model_context
from specbench.models import load_tokenizer

#: positions a turn's chat template may add around its text (a margin in the context check)
TEMPLATE_MARGIN = 64


def load_dataset(dataset_cfg: DictConfig) -> list[data.Question]:
    """The dataset's questions. A generated dataset (`generator: module:function` in its config,
    called with the seed, returning question dicts) is written to its path first, but never over
    a different file already there: that is somebody's own question file."""
    path = Path(dataset_cfg.path)
    if dataset_cfg.get("generator"):
        write_generated(dataset_cfg, path)
    elif not path.exists():
        raise SpecbenchError(
            f"question file {path} not found; run `python -m specbench data fetch` (or `make data`) to download it"
        )
    return data.load_questions(path)


def write_generated(dataset_cfg: DictConfig, path: Path) -> None:
    module, _, function = str(dataset_cfg.generator).partition(":")
    try:
        generate = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise SpecbenchError(f"dataset {dataset_cfg.name}: generator '{dataset_cfg.generator}' cannot be imported; "
                             "write it as module:function") from None
    text = data.questions_jsonl(generate(int(dataset_cfg.seed)))
    if path.is_file():
        if path.read_bytes() == text.encode("utf-8"):
            return
        raise SpecbenchError(
            f"{path} exists and is not the {dataset_cfg.name} set of seed {dataset_cfg.seed}; to run that file use "
            f"dataset=spec_bench dataset.path={path}, to regenerate the {dataset_cfg.name} set remove it or choose "
            "another dataset.path=..."
        )
    write_atomic(path, text)


def check_writable(folder: Path, need_bytes: int = 50 << 20) -> None:
    """Fail before the model loads when answers could not be saved."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise SpecbenchError(
            f"results folder {folder} is not writable ({exc.strerror or exc}); choose another with output_dir=..."
        ) from None
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise SpecbenchError(
            f"only {free >> 20} MiB free under {folder}; free some space or choose another output_dir=..."
        )


def long_inputs(cfg: DictConfig, questions: list[data.Question], pool: list[data.Question],
                tokens: int) -> list[data.Question]:
    """The questions with first turns of about `tokens` tokens of the run's model (`length=N`,
    specbench.core.longinput), checked against its context: the longest conversation (every turn, each
    answer at max_new_tokens) must fit, else a one-line error with the largest length that would."""
    start = time.perf_counter()
    tokenizer, config = load_tokenizer(str(cfg.model.path), trust_remote_code=bool(cfg.model.trust_remote_code))

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    context = model_context(config)
    if context is not None:  # checked before any document is drawn: a first turn counts as N tokens or its own
        answers = int(cfg.max_new_tokens)
        need = {q.question_id: sum(max(count(t), tokens if i == 0 else 0) + TEMPLATE_MARGIN + answers
                                   for i, t in enumerate(q.turns)) for q in questions}
        worst = max(need, key=need.__getitem__)
        if need[worst] > context:
            room = tokens - (need[worst] - context)
            raise SpecbenchError(
                f"length={tokens} does not fit the context of {cfg.model.path} ({context} positions): question "
                f"{worst} would need {need[worst]} with max_new_tokens={answers} per turn; choose length <= "
                f"{max(room, 0)}, a smaller max_new_tokens=..., or a task without second turns"
            )
    longer = lengthen_all(questions, pool, tokens, count, int(cfg.seed))
    sizes = [count(new.turns[0]) for new, old in zip(longer, questions, strict=True) if new is not old]
    made = f"first turns of {min(sizes)}-{max(sizes)} tokens" if sizes else "none lengthened"
    kept = f", {len(longer) - len(sizes)} already longer kept as they are" if len(sizes) < len(longer) else ""
    print(f"long inputs: {len(sizes)} of {len(longer)} questions, {made}{kept} (length={tokens}; "
          f"{time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    return longer
