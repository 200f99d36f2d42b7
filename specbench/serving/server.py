"""A server process that specbench starts, waits for and stops (or one already running, by URL).

The command comes from the backend's config (a list of arguments with {python}, {model}, {served},
{port}, {host}, {dtype}, {max_model_len} filled in, the method's `--speculative-config` appended);
its output goes to a log file beside the answers, whose last line is quoted when it fails."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.serving.client import Client, ServerError


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def last_line(log: Path) -> str:
    """The log's last line that says something (tracebacks end with the error)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "the log is empty"


class Server:
    """One method's server: started from `command` (or attached to `url`), healthy, stopped."""

    def __init__(self, label: str, command: list[str] | None, url: str | None, served: str, log: Path,
                 env: dict[str, str], start_timeout: float, request_timeout: float) -> None:
        self.label, self.command, self.served, self.log = label, command, served, log
        self.env, self.start_timeout = env, float(start_timeout)
        self.url = url
        self.request_timeout = float(request_timeout)
        self.process: subprocess.Popen | None = None
        self.client: Client | None = None
        self.started_in: float | None = None
        self.launched = 0.0

    def launch(self) -> None:
        """Start the server's process (not waiting for it: `start` does); nothing for a server by URL."""
        if self.command is None or self.process is not None:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.launched = time.perf_counter()
        with open(self.log, "ab") as out:
            out.write(f"\n# specbench starts: {json.dumps(self.command)}\n".encode())
            try:
                self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                                env={**os.environ, **self.env}, start_new_session=True)
            except OSError as exc:
                raise SpecbenchError(f"{self.label}: the server command could not start ({exc.strerror}: "
                                     f"{self.command[0]}); install vLLM with `make vllm` or set backend.python=...") \
                    from None

    def start(self) -> Client:
        """The server, healthy: launched if it was not, then waited for."""
        if self.command is None:  # a server somebody else runs
            client = Client(str(self.url), self.served, self.request_timeout)
            if not client.healthy():
                raise SpecbenchError(f"{self.label}: no healthy server at {self.url} (GET /health); start it, or "
                                     "leave backend.url unset for specbench to start one")
            self.client = client
            return client
        self.launch()
        start = self.launched
        client = Client(str(self.url), self.served, self.request_timeout)
        while not client.healthy():
            code = self.process.poll()
            if code is not None:
                raise SpecbenchError(f"{self.label}: the server exited with code {code} while starting: "
                                     f"{last_line(self.log)} (log: {self.log})")
            if time.perf_counter() - start > self.start_timeout:
                self.stop()
                raise SpecbenchError(f"{self.label}: the server was not healthy after {self.start_timeout:g} s "
                                     f"(last log line: {last_line(self.log)}); raise backend.start_timeout=... "
                                     f"or see {self.log}")
            time.sleep(0.25)
        self.started_in = time.perf_counter() - start
        self.client = client
        return client

    def check_alive(self, wait: float = 0.0) -> None:
        """A fatal error when the server that specbench started has exited (or exits within `wait` s)."""
        if self.process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=wait) if wait else None
        if (code := self.process.poll()) is not None:
            raise ServerError(f"{self.label}: the server died (exit code {code}): {last_line(self.log)}; the "
                              f"answers so far are kept; run the same command again to resume (log: {self.log})",
                              fatal=True)

    def peak_memory(self) -> int | None:
        """The peak resident memory of the server's processes (Linux VmHWM, else their resident memory
        now), summed; None for a server specbench did not start, or one already gone."""
        if self.process is None or self.process.poll() is not None:
            return None
        import psutil

        total = 0
        try:
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                total += _peak_rss(proc)
        except psutil.Error:
            return None
        return total or None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def fill(template: list[Any], values: dict[str, Any]) -> list[str]:
    """The command's arguments with {name} placeholders filled (a missing name is a config error)."""
    try:
        return [str(arg).format(**values) for arg in template]
    except KeyError as exc:
        raise SpecbenchError(f"backend.command names {{{exc.args[0]}}}, which is not one of "
                             f"{', '.join(sorted(values))}; fix backend.command") from None


def _peak_rss(proc: Any) -> int:
    try:
        with open(f"/proc/{proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(proc.memory_info().rss)
    except Exception:  # noqa: BLE001 - a process that just ended counts nothing
        return 0
