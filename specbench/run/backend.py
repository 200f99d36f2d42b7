"""What the runner asks of an engine: open a method, answer one turn (a question, or a batch), give
its measurements. The local backend is specbench's own engine (specbench.run.local); an engine we
did not write plugs in the same way (specbench.serving.vllm), named by `configs/backend/NAME.yaml`'s
`impl` (module:Class).

The runner (specbench.run.runner) owns everything else: the questions, the answer folders, resuming,
the meta, the turn order, the records and the outcome."""

from __future__ import annotations

import importlib
from contextlib import AbstractContextManager
from typing import Any, Protocol

from omegaconf import DictConfig

from specbench.core.errors import SpecbenchError


class MethodRun(Protocol):
    """One method as a backend opened it: what it is filed as and what identifies its answers."""

    label: str  # the answers' folder name (<name>, or <name>-fixed under budget=fixed)
    identity: dict[str, Any]  # what must not change between a run and its resumption
    facts: dict[str, Any]  # the method's description for the report


class Backend(Protocol):
    """An engine that answers the runner's questions."""

    cfg: DictConfig  # the run's config as the backend files it (an engine's answers under <model>-<suffix>)
    batch_size: int  # questions decoded together (the answers' batch-<B> folder level when > 1)
    questions_per_call: int  # questions one timed call answers (a batch, or a continuous batch's queue)

    @staticmethod
    def filed_config(cfg: DictConfig) -> DictConfig:
        """The run's config as its answers are filed (an engine's under model <model>-<suffix>)."""

    @staticmethod
    def plan(cfg: DictConfig) -> list[list[Any]]:
        """The job's phases, each the methods answered in turn question by question (one phase under
        schedule=interleaved, one per method under sequential); what `open` takes. Called once."""

    @staticmethod
    def parts(cfg: DictConfig, phases: list[list[Any]]) -> list[str]:
        """The model and part specs (`prefix:NAME`) the run will read: built before the clock."""

    def __init__(self, cfg: DictConfig, questions: list[Any]) -> None:
        """Ready to answer `questions` (the model loaded, the servers' commands known)."""

    def open(self, phase: list[Any]) -> list[MethodRun]:
        """A phase's methods made ready to answer (built, loaded; untimed)."""

    def lane_meta(self, method: MethodRun) -> dict[str, Any]:
        """A method run's meta besides what the runner writes (environment, weights, ...)."""

    def todo(self, method: MethodRun, questions: list[Any]) -> list[Any]:
        """The questions left, in the order this method answers them."""

    def phase(self, lanes: list[Any]) -> AbstractContextManager[None]:
        """Around the timed answers of `lanes` (runner lanes: `.method`, `.meta`, `.outcome`,
        `.previous`): set-up and warm-up before, measurements into each lane's meta after."""

    def tick(self) -> None:
        """A question (batch) boundary."""

    def answer(self, method: MethodRun, questions: list[Any]) -> list[dict[str, Any]]:
        """One timed call: the questions' answer records (specbench.core.record.AnswerRecord)."""

    def failed(self, exc: BaseException) -> bool:
        """A call failed: clean up after it, and say whether that ends the run (else the runner
        records its questions as failed and goes on)."""


def backend_class(cfg: DictConfig) -> type:
    """The backend class named by the run's `backend.impl` (module:Class)."""
    impl = str(cfg.backend.get("impl") or "")
    module, _, name = impl.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        raise SpecbenchError(f"backend {cfg.backend.get('name')}: impl '{impl}' cannot be imported; write it as "
                             "module:Class in configs/backend/") from None

