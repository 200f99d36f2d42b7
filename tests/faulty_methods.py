"""Methods that misbehave on purpose, for fault-handling tests (importable via PYTHONPATH=tests)."""

from specbench.methods.baseline import Baseline


class FailOnMarker(Baseline):
    """Raises inside generation when the prompt contains the word BOOM."""

    def prefill(self, input_ids, sampling):
        if "BOOM" in self.target.tokenizer.decode(input_ids[0]):
            raise RuntimeError("simulated failure inside the method")
        return super().prefill(input_ids, sampling)


class AlwaysFail(Baseline):
    """Every question fails."""

    def prefill(self, input_ids, sampling):
        raise RuntimeError("simulated failure of every question")


class KillOnce(Baseline):
    """Kills its own process (SIGKILL, as `kill -9`) at the question whose prompt contains KILL,
    the first time only: the file named by $SPECBENCH_KILL_FLAG is the one-shot trigger."""

    def prefill(self, input_ids, sampling):
        import os
        import signal
        from pathlib import Path

        flag = Path(os.environ.get("SPECBENCH_KILL_FLAG", "/nonexistent"))
        if "KILL" in self.target.tokenizer.decode(input_ids[0]) and flag.exists():
            flag.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().prefill(input_ids, sampling)


class CtrlCTwice(Baseline):
    """Presses Ctrl-C twice (two SIGINTs to its own process) at the question whose prompt
    contains INTERRUPT: the second one must stop the run at once, with exit code 130."""

    def prefill(self, input_ids, sampling):
        import os
        import signal
        import time

        if "INTERRUPT" in self.target.tokenizer.decode(input_ids[0]):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the second SIGINT raises here
        return super().prefill(input_ids, sampling)
