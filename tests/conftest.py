"""Shared fixtures: tiny random-initialised models with a tiny tokenizer, saved locally."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

import specbench.kit  # noqa: F401 - registers the kits' resolvers (`smollm2:`), as the cli does
import specbench.zoo  # noqa: F401 - registers the `zoo:` resolver, as the cli does
from specbench.models import LoadedModel, load_model

pytest.register_assert_rewrite("helpers")  # its shared checks (assert_matches_baseline, ...) report like a test's

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "SPECBENCH_COST_DIR" not in os.environ:  # draft-budget cost curves of test models: not in the user's cache
    os.environ["SPECBENCH_COST_DIR"] = tempfile.mkdtemp(prefix="specbench-costs-")
    atexit.register(shutil.rmtree, os.environ["SPECBENCH_COST_DIR"], ignore_errors=True)
if "SPECBENCH_SELF_SPEC_DIR" not in os.environ:  # self_spec's skip-set searches of test models: not in it either
    os.environ["SPECBENCH_SELF_SPEC_DIR"] = tempfile.mkdtemp(prefix="specbench-self-spec-")
    atexit.register(shutil.rmtree, os.environ["SPECBENCH_SELF_SPEC_DIR"], ignore_errors=True)
if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several test processes: one core each (subprocesses too)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens and the target verifies them",
    "translate the sentence into another language please",
    "summarize the passage in two sentences",
    "what is the capital of the kingdom of nowhere",
    "tom has 3 boxes with 12 apples each so he has 36 apples",
]


def make_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE with ~300 tokens, trained on a few sentences, with a chat template."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|bos|>", "<|end|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(TEXT * 20, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|end|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return tok


def make_model(folder: Path, arch: str, tok: PreTrainedTokenizerFast, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast: the everyday tier, `make test-fast` (no zoo, seconds each; a module "
                                       "opts in with `pytestmark = pytest.mark.fast`)")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders of a tiny random Llama and a tiny random Qwen2 sharing one tokenizer."""
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer(root / "tokenizer")
    return {arch: make_model(root / arch, arch, tok) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and leave the other core to whoever else is busy);
    modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def earlier(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """(folder, results folder, arguments): a results folder that already holds a baseline run of
    model=local on one qa question, and that run's arguments (bad-input cases add theirs)."""
    from helpers import cli, write_questions

    root = tmp_path_factory.mktemp("earlier")
    questions = write_questions(root / "q.jsonl", per_category=1)
    out = root / "results"
    args = ["run", "model=local", f"model.path={tiny_models['llama']}", "dataset=spec_bench",
            f"dataset.path={questions}", f"output_dir={out}", "max_new_tokens=8", "warmup=0", "progress=false",
            "task=qa"]
    done = cli(*args, cwd=root)
    assert done.code == 0 and (out / "spec_bench" / "local" / "baseline").is_dir(), done
    return root, out, args


@pytest.fixture(scope="module")
def targets(tiny_models) -> dict[str, LoadedModel]:
    """The tiny Llama and Qwen2, loaded in float32 on the CPU (a module may define its own `targets`)."""
    from helpers import ARCHS, CPU

    return {arch: load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32) for arch in ARCHS}


@pytest.fixture(scope="module")
def drafts(tiny_models, targets, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Per target: itself (all accepted), a noisy copy (some accepted), the other architecture."""
    from helpers import ARCHS, CPU

    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for arch in ARCHS:
        noisy = root / f"{arch}-noisy"
        model = load_model(str(tiny_models[arch]), device=CPU, dtype=torch.float32)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.005)
        model.model.save_pretrained(noisy)
        model.tokenizer.save_pretrained(noisy)
        other = "qwen2" if arch == "llama" else "llama"
        out[arch] = {"self": tiny_models[arch], "noisy": noisy, "cross": tiny_models[other]}
    return out
