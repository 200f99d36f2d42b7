"""Measurement guards of a timed run: did something else load the machine (contention), and how
much memory did the phase and the method's own modules take.

Contention on CPU is read from counters, never by sleeping during the run: the busy time of the
CPUs this process may use (/proc/stat) minus this process's own CPU time (threads included, and
children it has waited for) over the same interval is what other processes used, in cores. On
CUDA, other processes holding the GPU are listed by `nvidia-smi` (best effort: a container may
not see them).
"""

from __future__ import annotations

import math
import os
import re
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from specbench.engine.api import Method
from specbench.models import LoadedModel
from specbench.run.provenance import nvidia_smi

#: the "before" probe of a session's first timed run lasts at least this long (model loading and the
#: warm-up passes count toward it); later runs' cover the time since the previous one ended, at least
#: GAP_S (their method's loading and warm-up)
PROBE_S = 0.5
GAP_S = 0.1
#: the peak of other processes' use is taken over windows at least this long (tick-based counters
#: are too coarse for single short questions)
WINDOW_S = 1.0
CONTENTION_HOW = ("busy time of the CPUs this process may use (/proc/stat) minus this process's CPU time, "
                  "over the same interval, in cores")


@dataclass
class Sample:
    """CPU counters at one moment: seconds of busy and stolen time summed over the CPUs watched,
    our own CPU seconds, and the wall clock."""

    wall: float
    busy: float
    steal: float
    ours: float


def _clock_tick() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


CLK_TCK = _clock_tick()


def _watched_cpus() -> set[str] | None:
    """The /proc/stat line names (cpu0, cpu1, ...) of the CPUs this process may run on."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return {f"cpu{i}" for i in os.sched_getaffinity(0)}


def sample(cpus: set[str] | None) -> Sample | None:
    """The counters now; None where /proc/stat cannot be read (not Linux)."""
    busy = steal = 0
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if not line.startswith("cpu"):
                    break
                name, *fields = line.split()
                if (name == "cpu") != (cpus is None) or cpus is not None and name not in cpus:
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, stolen = (int(x) for x in (fields + ["0"] * 8)[:8])
                busy += user + nice + system + irq + softirq
                steal += stolen
    except (OSError, ValueError):
        return None
    times = os.times()
    ours = time.process_time() + times.children_user + times.children_system
    return Sample(time.perf_counter(), busy / CLK_TCK, steal / CLK_TCK, ours)


def other_cores(a: Sample, b: Sample, cpus: int | None = None) -> tuple[float, float, float]:
    """(other processes' use, stolen time, our use) between two samples, in cores; counter
    granularity (a tick per CPU) kept from making it negative or more than the `cpus` watched."""
    dt = max(b.wall - a.wall, 1e-9)
    other = max((b.busy - a.busy) - (b.ours - a.ours), 0.0) / dt
    return min(other, cpus) if cpus else other, max(b.steal - a.steal, 0.0) / dt, (b.ours - a.ours) / dt


def margin(cpus: int | None, seconds: float) -> float:
    """The counters' granularity in cores over `seconds`: /proc/stat counts each CPU in ticks (1/CLK_TCK
    s), so a short interval reads other processes' use only to about sqrt(cpus) ticks."""
    return math.sqrt(cpus or 1) / CLK_TCK / max(seconds, 1e-9)


def loadavg() -> float | None:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def gpu_processes(device: torch.device | None = None) -> dict[str, Any] | None:
    """Processes holding a context on our GPU besides this one (`nvidia-smi --query-compute-apps`);
    None without nvidia-smi. Apps on other GPUs are left out when our GPU's UUID is among those
    listed; when this process's id is not in the list (another pid namespace), every process but
    one counts as other. A container that cannot see other processes lists none: best effort."""
    out = nvidia_smi("--query-compute-apps=pid,used_memory,gpu_uuid")
    if out is None:
        return None
    apps = []
    for line in out.splitlines():
        pid, used, uuid = ([part.strip() for part in line.split(",")] + ["", ""])[:3]
        if pid.isdigit():
            apps.append((int(pid), used, uuid))
    ours = _gpu_uuid(device)
    if ours and any(ours in uuid for _, _, uuid in apps):
        apps = [a for a in apps if ours in a[2]]
    mine = any(pid == os.getpid() for pid, _, _ in apps)
    count = sum(pid != os.getpid() for pid, _, _ in apps) if mine else max(len(apps) - 1, 0)
    return {"others": count, "processes": [{"pid": p, "used_mib": u, "gpu": g} for p, u, g in apps]}


def _gpu_uuid(device: torch.device | None) -> str | None:
    if device is None or device.type != "cuda":
        return None
    try:
        return str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - older torch or no driver: every GPU's processes count
        return None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class ContentionGuard:
    """Other processes' CPU (and GPU) use around the timed runs of one session. `before()` covers
    the time since the guard was made (at least PROBE_S) or the last timed run ended (at least
    GAP_S); `start()`, `tick()` at each question boundary and `stop()` cover the timed run;
    `summary()` judges both."""

    def __init__(self, threshold: float, device: torch.device) -> None:
        self.threshold = float(threshold)
        self.device = device
        self.cpus = _watched_cpus()
        self.ncpu = len(self.cpus) if self.cpus else os.cpu_count()
        self.mark = sample(self.cpus)
        self.first: Sample | None = None
        self.window: Sample | None = None
        self.last: Sample | None = None
        self.window_max: float | None = None
        self.probe_s = PROBE_S

    def _measure(self, a: Sample, b: Sample) -> dict[str, Any]:
        other, steal, ours = other_cores(a, b, self.ncpu)
        found = {"seconds": _round(b.wall - a.wall), "other_cores": _round(other), "steal_cores": _round(steal),
                 "our_cores": _round(ours), "margin_cores": _round(margin(self.ncpu, b.wall - a.wall)),
                 "loadavg_1m": loadavg()}
        if self.device.type == "cuda":
            found["gpu"] = gpu_processes(self.device)
        return found

    def before(self) -> dict[str, Any]:
        """Other processes' use since the mark, sleeping until the probe's minimum has passed."""
        if self.mark is None:
            self.mark = sample(self.cpus)
            if self.mark is None:
                return {"available": False}
        time.sleep(max(0.0, self.probe_s - (time.perf_counter() - self.mark.wall)))
        now = sample(self.cpus) or self.mark
        found = self._measure(self.mark, now)
        self.mark, self.probe_s = now, GAP_S
        return found

    def start(self) -> None:
        self.first = self.window = self.last = sample(self.cpus)
        self.window_max = None

    def tick(self) -> None:
        """A question boundary: close the current window when it is long enough. Reads counters only."""
        if self.window is None:
            return
        now = sample(self.cpus)
        if now is None:
            return
        self.last = now
        if now.wall - self.window.wall >= WINDOW_S:
            other = other_cores(self.window, now, self.ncpu)[0]
            self.window_max = other if self.window_max is None else max(self.window_max, other)
            self.window = now

    def stop(self) -> dict[str, Any]:
        """Other processes' use over the timed run: the mean, and the peak over windows of at least
        WINDOW_S (the mean when the run was shorter)."""
        if self.first is None:
            return {"available": False}
        self.tick()
        first, end = self.first, self.last or self.first
        found = self._measure(first, end)
        mean = found["other_cores"]
        found["other_cores_max"] = mean if self.window_max is None else _round(max(self.window_max, mean))
        self.mark, self.first, self.window = end, None, None
        return found

    def summary(self, before: dict[str, Any] | None, during: dict[str, Any] | None) -> dict[str, Any]:
        """The meta's `contention` entry: flagged when other processes used more than the threshold
        (in cores, on average, beyond the counters' granularity) before or during the timed run, or
        held the GPU."""
        parts = {"before": before or {"available": False}, "during": during or {"available": False}}
        cores = [p["other_cores"] for p in parts.values() if isinstance(p.get("other_cores"), (int, float))]
        peaks = [p.get("other_cores_max", p.get("other_cores")) for p in parts.values()]
        gpu = [p["gpu"]["others"] for p in parts.values() if isinstance(p.get("gpu"), dict)]
        reasons = [f"other processes used {p['other_cores']:.2f} CPU cores on average {when} the timed run"
                   for when, p in (("before", parts["before"]), ("during", parts["during"]))
                   if isinstance(p.get("other_cores"), (int, float))
                   and p["other_cores"] - (p.get("margin_cores") or 0) > self.threshold]
        if any(gpu):
            reasons.append(f"{max(gpu)} other process(es) held the GPU")
        return {
            **parts,
            "busy_other_cores": max(cores) if cores else None,
            "busy_other_cores_max": max((x for x in peaks if isinstance(x, (int, float))), default=None),
            "threshold": self.threshold,
            "flagged": bool(reasons),
            "reasons": reasons,
            "measured_by": CONTENTION_HOW if cores else "not measured (no /proc/stat)",
        }


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            found = re.search(rf"^{key}:\s+(\d+) kB", fh.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


class MemoryProbe:
    """Memory of one phase and of each method run in it.

    The phase's peak: the CUDA allocator's peak on a GPU; on CPU the peak resident set (VmHWM, reset
    through /proc/self/clear_refs), else the process's lifetime peak (ru_maxrss). Each method run's
    own peak, in a phase where several take turns with every one's drafter loaded: the memory
    outside every method's own (the phase's start, less what each method holds resident) + what
    this method holds resident (its growth when built: draft model, heads, datastore) + the largest
    transient peak over its own answers (the peak reset before each)."""

    PER_RUN = ("per method run: the phase's memory outside every method's own (its start less each method's "
               "resident bytes) + this method's resident bytes (its growth when built, at least its drafter's "
               "weights) + its largest transient peak over its own answers (freed memory is reused, so a transient "
               "counts for whichever run first needs it)")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start_bytes: int | None = None
        self.how = ""
        self.phase_peak = 0
        self.phase_reserved = 0  # CUDA: the allocator's reserved peak over the phase (kept across per-call resets)
        self.resettable = False

    def current(self) -> int | None:
        """The memory held now: allocated CUDA memory, or the process's resident set."""
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        return _status_kib("VmRSS")

    def _reset_peak(self) -> bool:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.phase_reserved = max(self.phase_reserved, torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")  # 5: reset the peak resident set size to the current one
        except OSError:
            return False
        return True

    def _peak(self) -> int | None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return _status_kib("VmHWM") if self.resettable else None

    def start(self) -> None:
        self.start_bytes = self.current()
        self.resettable = self._reset_peak()
        self.phase_reserved = 0
        self.phase_peak = self.start_bytes or 0
        if self.device.type == "cuda":
            self.how = "torch.cuda.max_memory_allocated over the phase (allocator peak; CUDA context not included)"
        elif self.resettable:
            self.how = "peak resident set of the process over the phase (VmHWM, reset at its start)"
        else:
            self.how = ("peak resident set of the process since it started (ru_maxrss): may come from an earlier "
                        "phase of the same process")

    def call_start(self) -> int | None:
        """Before one timed call of a method run: the peak reset; the memory held now (None where
        the peak cannot be reset)."""
        if not self.resettable:
            return None
        self.phase_peak = max(self.phase_peak, self._peak() or 0)  # what the peak held until now
        self._reset_peak()
        return self.current()

    def call_end(self, before: int | None) -> int | None:
        """After the call: how far its peak rose above the memory held before it."""
        if before is None or (peak := self._peak()) is None:
            return None
        self.phase_peak = max(self.phase_peak, peak)
        return max(peak - before, 0)

    def stop(self) -> dict[str, Any]:
        if self.device.type == "cuda" or self.resettable:
            peak = max(self.phase_peak, self._peak() or 0)
        else:
            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        cuda = self.device.type == "cuda"
        extra = {"peak_reserved_bytes": max(self.phase_reserved, torch.cuda.max_memory_reserved(self.device))} \
            if cuda else {}
        return {"peak_bytes": peak, "start_bytes": self.start_bytes, "measured_by": self.how, **extra}

    def per_run(self, phase: dict[str, Any], resident: dict[str, int], name: str,
                working: int | None) -> dict[str, Any]:
        """Method run `name`'s own peak in the phase (`resident`: every run's resident bytes)."""
        out = {**phase, "phase_peak_bytes": phase["peak_bytes"]}
        if working is None or self.start_bytes is None:
            return out  # the phase's peak stands for every run of it
        shared = max(self.start_bytes - sum(resident.values()), 0)
        out.update(peak_bytes=shared + resident.get(name, 0) + working, resident_bytes=resident.get(name, 0),
                   working_bytes=working, measured_by=f"{self.how}; {self.PER_RUN}")
        return out


def drafter_memory(method: Method, target: LoadedModel) -> dict[str, Any]:
    """Bytes of the parameters the method holds besides the target's (a draft model, heads): its own
    modules found from its attributes, parameters it shares with the target left out. When that finds
    fewer parameters than `method.extra_parameters()` says, the count x the target's element size."""
    count = method.extra_parameters()
    shared = {p.data_ptr() for p in target.model.parameters()}
    seen: set[int] = set()
    found = weights = 0
    for module in _own_modules(method, target):
        for p in module.parameters():
            if p.data_ptr() in shared or p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            found += p.numel()
            weights += p.numel() * p.element_size()
    how = "parameters of the method's own modules (those shared with the target left out)"
    if found < count:
        weights = count * torch.empty((), dtype=target.dtype).element_size()
        how = "method.extra_parameters() x the target's element size"
    return {
        "weights_bytes": weights,
        "parameters": count,
        "measured_by": how,
        "caches": "not counted apart: the drafter's KV cache and draft trees live inside the phase's peak memory "
                  "(compare it with the baseline's)",
    }


def _own_modules(method: Method, target: LoadedModel, depth: int = 4) -> list[torch.nn.Module]:
    """torch modules reachable from the method's attributes (through specbench objects, lists and
    dicts, `depth` levels deep), the target's model excluded."""
    found: list[torch.nn.Module] = []
    seen = {id(target), id(target.model)}

    def walk(obj: Any, level: int) -> None:
        if id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found.append(obj)
        elif isinstance(obj, (list, tuple, set)):
            for item in obj:
                walk(item, level + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item, level + 1)
        elif type(obj).__module__.startswith("specbench") and hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                walk(item, level + 1)

    walk(method, 0)
    return found


def resumed(contention: dict[str, Any], memory: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """A resumed run's measurements cover its earlier parts too: it stays flagged when an earlier
    part was (listed under `earlier`), and its peak memory is the largest of all parts."""
    old = (previous or {}).get("contention")
    if isinstance(old, dict):
        earlier = [e for e in old.get("earlier") or [] if isinstance(e, dict)]
        earlier.append({k: old.get(k) for k in ("flagged", "busy_other_cores", "reasons")})
        contention["earlier"] = earlier
        contention["flagged"] = contention["flagged"] or any(bool(e.get("flagged")) for e in earlier)
    old_memory = (previous or {}).get("memory")
    if isinstance(old_memory, dict) and old_memory.get("measured_by") == memory["measured_by"]:
        peak = old_memory.get("peak_bytes")
        if isinstance(peak, int) and peak > (memory["peak_bytes"] or 0):
            memory["peak_bytes"] = peak
