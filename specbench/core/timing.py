"""Timers for the runner: CUDA events on GPU, perf_counter_ns on CPU, one interface.

The runner starts a timer around a method call and reads the result after `stop()`.
Methods only open named sections (`with timer.section("draft"):`) so that a step can be
split into draft / verify / the rest; they never read clocks themselves.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class Timing:
    """What one timed call took, in seconds."""

    total: float
    marks: dict[str, float] = field(default_factory=dict)  # label -> seconds since start
    sections: dict[str, float] = field(default_factory=dict)  # label -> summed seconds


class Timer:
    """Interface: start(), mark(label), section(label), stop() -> Timing."""

    def start(self) -> None:
        raise NotImplementedError

    def mark(self, label: str) -> None:
        raise NotImplementedError

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        raise NotImplementedError
        yield

    def stop(self) -> Timing:
        raise NotImplementedError


class CpuTimer(Timer):
    """Wall clock with time.perf_counter_ns."""

    def __init__(self) -> None:
        self._t0 = 0
        self._marks: dict[str, int] = {}
        self._sections: dict[str, int] = defaultdict(int)

    def start(self) -> None:
        self._marks.clear()
        self._sections.clear()
        self._t0 = time.perf_counter_ns()

    def mark(self, label: str) -> None:
        self._marks[label] = time.perf_counter_ns()

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            self._sections[label] += time.perf_counter_ns() - t

    def stop(self) -> Timing:
        end = time.perf_counter_ns()
        return Timing(
            total=(end - self._t0) / 1e9,
            marks={k: (v - self._t0) / 1e9 for k, v in self._marks.items()},
            sections={k: v / 1e9 for k, v in self._sections.items()},
        )


class CudaTimer(Timer):
    """CUDA events on the current stream; synchronises once, at stop()."""

    def __init__(self, device: torch.device | None = None) -> None:
        self._device = device
        self._start = self._event()
        self._marks: dict[str, torch.cuda.Event] = {}
        self._sections: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @staticmethod
    def _event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._marks.clear()
        self._sections.clear()
        torch.cuda.synchronize(self._device)
        self._start.record()

    def mark(self, label: str) -> None:
        event = self._event()
        event.record()
        self._marks[label] = event

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        begin, end = self._event(), self._event()
        begin.record()
        try:
            yield
        finally:
            end.record()
            self._sections.append((label, begin, end))

    def stop(self) -> Timing:
        end = self._event()
        end.record()
        torch.cuda.synchronize(self._device)
        sections: dict[str, float] = defaultdict(float)
        for label, begin, finish in self._sections:
            sections[label] += begin.elapsed_time(finish) / 1e3
        return Timing(
            total=self._start.elapsed_time(end) / 1e3,
            marks={k: self._start.elapsed_time(v) / 1e3 for k, v in self._marks.items()},
            sections=dict(sections),
        )


def timer_for(device: torch.device) -> Timer:
    """The right timer for a device: CUDA events on cuda, perf counters elsewhere."""
    if device.type == "cuda":
        return CudaTimer(device)
    return CpuTimer()
