"""RowsFirstLinear (specbench.models): a float32 CPU step of up to ROWS_FIRST_MAX rows (ROWS_FIRST_MAX_ONE_THREAD
on one thread) computed as W @ x^T, the same linear map as PyTorch's (float32 rounding apart), everything else
PyTorch's own; a float32 model load_model gives on a CPU runs it when its linear weights are too large to stay in
the caches (ROWS_FIRST_MIN_BYTES), unless SPECBENCH_LINEAR=torch, and a run records which."""

from __future__ import annotations

import pytest
import torch

from specbench import models
from specbench.models import (
    ROWS_FIRST_MAX,
    ROWS_FIRST_MAX_ONE_THREAD,
    RowsFirstLinear,
    linear_kernel,
    load_model,
    rows_first_linears,
)

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _threads():
    """The tests set torch's thread count (the kernel's row limit depends on it); the process gets its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _pair(bias: bool, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 80, bias=bias).to(dtype)
    fast = torch.nn.Linear(48, 80, bias=bias).to(dtype)
    fast.load_state_dict(plain.state_dict())
    assert rows_first_linears(fast) == 0, "a layer this small stays in the caches: PyTorch's linear"
    assert rows_first_linears(fast, min_bytes=0) == 1
    return plain, fast


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48), (1, 2, 48), (3, 48), (2, 4, 48), (1, ROWS_FIRST_MAX, 48)])
def test_small_steps_match_torch_linear(bias, shape):
    torch.set_num_threads(2)  # up to ROWS_FIRST_MAX rows on two threads
    plain, fast = _pair(bias)
    assert type(fast) is RowsFirstLinear
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = plain(x), fast(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, ROWS_FIRST_MAX + 1, 48), (300, 48), (0, 48)])
def test_larger_steps_are_torch_linear_exactly(shape):
    torch.set_num_threads(2)
    plain, fast = _pair(True)
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert torch.equal(fast(x), plain(x))


def test_one_thread_keeps_torch_linear_above_its_own_limit(monkeypatch):
    """On one thread W @ x^T lost from 5 rows on (the zoo's target and SmolLM2, scripts/linear_kernel.py)."""
    plain, fast = _pair(True)
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a[0].shape) or linear(*a))
    with torch.inference_mode():
        one = ROWS_FIRST_MAX_ONE_THREAD
        for threads, rows, torch_path in ((1, one + 1, True), (1, one, False), (2, one + 1, False)):
            torch.set_num_threads(threads)
            x = torch.randn(1, rows, 48)
            calls.clear()
            got = fast(x)
            assert bool(calls) == torch_path, (threads, rows, calls)
            torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)


def test_other_dtypes_stay_plain_and_torch_opt_out(monkeypatch):
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)
    assert rows_first_linears(half) == 0 and type(half) is torch.nn.Linear
    monkeypatch.setenv("SPECBENCH_LINEAR", "torch")
    layer = torch.nn.Linear(8, 8)
    assert rows_first_linears(layer) == 0 and type(layer) is torch.nn.Linear and linear_kernel(layer) == "torch"


def test_gradients_flow_as_through_torch_linear():
    plain, fast = _pair(True)
    x = torch.randn(2, 48, requires_grad=True)
    fast(x).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    plain(x).sum().backward()
    torch.testing.assert_close(grad, x.grad, rtol=1e-5, atol=1e-5)
    assert fast.weight.grad is not None


def test_load_model_runs_it_on_cpu_float32(tiny_models, monkeypatch):
    small = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    assert linear_kernel(small.model) == "torch"  # a random tiny Llama's weights stay in the caches
    monkeypatch.setattr(models, "ROWS_FIRST_MIN_BYTES", 0)  # as a model too large for them
    loaded = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    assert linear_kernel(loaded.model) == "rows-first"
    assert isinstance(loaded.model.get_output_embeddings(), RowsFirstLinear)
    state = loaded.model.state_dict()
    monkeypatch.setenv("SPECBENCH_LINEAR", "torch")
    plain = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.float32)
    assert linear_kernel(plain.model) == "torch"
    assert state.keys() == plain.model.state_dict().keys()
    ids = torch.tensor([[3, 7, 11, 5]])
    with torch.inference_mode():
        for n in (1, 2, 4):  # a forward of n rows: the logits of both kernels agree
            fast_out = loaded.model(input_ids=ids[:, -n:]).logits
            plain_out = plain.model(input_ids=ids[:, -n:]).logits
            torch.testing.assert_close(fast_out, plain_out, rtol=1e-4, atol=1e-4)
    bf16 = load_model(str(tiny_models["llama"]), device=torch.device("cpu"), dtype=torch.bfloat16)
    assert linear_kernel(bf16.model) == "torch"


def test_rows_reach_the_product_one_after_another(monkeypatch):
    """A layer's output is a transposed view (W @ x^T, then ^T); fed to the next layer as is (SmolLM2's gated MLP
    into down_proj) its rows are columns, and MKL's product over such a B runs 3-4x slower for 2-8 rows: the rows
    are laid out one after another first."""
    torch.set_num_threads(2)
    plain, fast = _pair(False)
    seen = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(b.stride()) or mm(a, b))
    x = torch.randn(48, 3).t()[None]  # (1, 3, 48), its rows strided as another RowsFirstLinear's output
    assert not x.is_contiguous()
    with torch.inference_mode():
        got = fast(x)
    assert seen == [(1, 48)], "x^T handed to the product with its rows as columns"
    torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)
