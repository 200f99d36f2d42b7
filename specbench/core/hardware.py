"""What machine this is: the CPU (model, cores, cgroup quota), its memory, and the name of a torch
device, read from /proc and the platform, never raising where a fact is missing. Used by
provenance (every run's environment) and by the draft budget's cost-curve cache (its key)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

import torch


def device_name(device: torch.device, cpu: dict[str, Any] | None = None) -> str:
    """The GPU's name for a CUDA device, else the CPU model (from `cpu`, a `cpu_info()`, when given)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = (cpu if cpu is not None else cpu_info()).get("model")
    return model or platform.processor() or platform.machine()


#: the instruction-set extensions that change how fast torch's CPU kernels run (x86 `flags`, Arm
#: `Features` in /proc/cpuinfo): two machines with one model name ("AMD EPYC") may differ in these,
#: and in every speed measured on them (bf16 matrix units above all)
SPEED_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
                  "asimd", "sve", "sve2", "i8mm", "bf16")


def cpu_info(text: str | None = None) -> dict[str, Any]:
    """CPU model name, cores and speed-relevant extensions: /proc/cpuinfo (or `text`, its contents) on
    Linux, platform's answer elsewhere. `physical_cores` counts distinct (package, core) pairs;
    `usable_cores` the CPUs this process may run on; `quota_cores` a cgroup v2 CPU limit when one is
    set; `features` those of SPEED_FEATURES the first CPU lists (None where the file lists no flags)."""
    model, cores, flags = None, set(), None
    if text is None:
        text = read_text("/proc/cpuinfo") or ""
    package = core = None
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model", "Hardware", "cpu model") and not model and value:
            model = value
        elif key in ("flags", "Features") and flags is None:
            flags = set(value.split())
        elif key == "physical id":
            package = value
        elif key == "core id":
            core = value
        elif not key and core is not None:  # a blank line ends one logical CPU's block
            cores.add((package, core))
            package = core = None
    if core is not None:
        cores.add((package, core))
    if not model and sys.platform == "darwin":
        model = run_command(["sysctl", "-n", "machdep.cpu.brand_string"])
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "model": model or platform.processor() or platform.machine() or None,
        "physical_cores": len(cores) or None,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "quota_cores": _cgroup_quota(),
        "features": None if flags is None else [f for f in SPEED_FEATURES if f in flags],
    }


def _cgroup_quota() -> float | None:
    quota, _, period = (read_text("/sys/fs/cgroup/cpu.max") or "max").partition(" ")
    try:
        return round(int(quota) / int(period), 2)
    except ValueError:  # "max": no limit
        return None


def total_memory() -> int | None:
    """Total RAM in bytes (/proc/meminfo, else sysconf)."""
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run_command(argv: list[str], timeout: float = 5.0) -> str | None:
    """The command's output, stripped ("" when it printed nothing); None when it failed or is absent."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


#: the dtypes a training computes in (`autocast_dtype`)
TRAIN_DTYPES = ("float32", "bfloat16", "auto")


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype a training computes in: `float32`, `bfloat16`, or `auto` = bfloat16 where the CPU
    has native bf16 matrix units (AMX or AVX512-BF16: about 1.6x faster steps on the 2-core
    machine, weights still kept and saved in float32), float32 elsewhere (bf16 would be emulated)."""
    if name == "auto":
        native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
        return torch.bfloat16 if native else None
    if name not in TRAIN_DTYPES:
        raise ValueError(f"train dtype must be one of {', '.join(TRAIN_DTYPES)}, got {name!r}")
    return torch.bfloat16 if name == "bfloat16" else None
