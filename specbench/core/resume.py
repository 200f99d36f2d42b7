"""A long training's progress kept on disk, so that a stopped build resumes where it last saved.

A part of a real model's kit can train for hours on a CPU (a head over millions of positions), more
than one working session. `TrainingState` is handed to a training loop: every `every_s` seconds the
loop saves what it needs to go on exactly as if it had never stopped (the trained parameters, the
optimiser, the step, its random generators and running statistics), and on its next start it loads
that and skips the steps already done. The file is written whole, then renamed (a kill mid-save
keeps the last one), read with `weights_only=True` (tensors, numbers, lists and dicts only), and
deleted when the part is finished. A resumed run gives the same weights as one that never stopped.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch


class TrainingState:
    """Where one training's progress is kept (`path`) and how often it is saved (`every_s`)."""

    def __init__(self, path: Path | str, every_s: float = 300.0) -> None:
        self.path = Path(path)
        self.every_s = float(every_s)
        self.last = time.monotonic()

    def load(self) -> dict[str, Any] | None:
        """The saved progress, or None (nothing saved, or a file this code cannot read: started over)."""
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: train from the start
            print(f"specbench: {self.path} cannot be read ({type(exc).__name__}); training from the start",
                  file=sys.stderr, flush=True)
            return None
        print(f"specbench: resuming from step {state.get('step')} ({self.path})", file=sys.stderr, flush=True)
        return state

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every_s

    def save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        self.last = time.monotonic()

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


def resume(ckpt: TrainingState | None, module: torch.nn.Module, opt: torch.optim.Optimizer,
           gen: torch.Generator | None = None) -> tuple[int, dict[str, Any]]:
    """(the step a training loop starts at, its saved statistics), `module`, `opt` and the random
    generators set as they were saved; (0, {}) without a TrainingState or saved progress."""
    state = ckpt.load() if ckpt is not None else None
    if state is None:
        return 0, {}
    restore(module, state["params"])
    opt.load_state_dict(state["opt"])
    set_rng_state(state["rng"], gen)
    return int(state["step"]), dict(state["stats"])


def keep(ckpt: TrainingState | None, done: int, total: int, module: torch.nn.Module, opt: torch.optim.Optimizer,
         stats: dict[str, Any], gen: torch.Generator | None = None, *, last: bool = False) -> None:
    """After `done` of `total` steps: the loop's progress saved when its TrainingState says it is time;
    with `last`, also when the loop is done (a group that trains several parts in turn keeps the
    finished ones while the next trains)."""
    if ckpt is not None and (done < total and ckpt.due() or last and done == total):
        ckpt.save({"step": done, "params": trainable(module), "opt": opt.state_dict(), "rng": rng_state(gen),
                   "stats": stats})


def trainable(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters a training changes (frozen ones, e.g. copies of a target's LM head, are rebuilt
    by the loop's own start and not saved)."""
    return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}


def restore(module: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    params = dict(module.named_parameters())
    missing = [name for name, p in params.items() if p.requires_grad and name not in saved]
    if missing or any(name not in params for name in saved):
        raise RuntimeError(f"saved training state does not fit this model (missing {missing[:3]}); delete it")
    with torch.no_grad():
        for name, value in saved.items():
            params[name].copy_(value)


def rng_state(gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    return {"torch": torch.get_rng_state(), **({"gen": gen.get_state()} if gen is not None else {})}


def set_rng_state(saved: dict[str, torch.Tensor], gen: torch.Generator | None = None) -> None:
    torch.set_rng_state(saved["torch"])
    if gen is not None:
        gen.set_state(saved["gen"])
