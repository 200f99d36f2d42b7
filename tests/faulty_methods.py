"""Methods that misbehave on purpose, for fault-handling tests (importable via PYTHONPATH=tests)."""

from specbench.methods.baseline import Baseline


class FailOnMarker(Baseline):
    """Raises inside generation when the prompt contains the word BOOM."""

    def prefill(self, input_ids, sampling):
        if "BOOM" in self.target.tokenizer.decode(input_ids[0]):
            raise RuntimeError("simulated failure inside the method")
        return super().prefill(input_ids, sampling)
