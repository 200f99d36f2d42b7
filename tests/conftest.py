"""Shared fixtures: tiny random-initialised models with a tiny tokenizer, saved locally; the three
tiny targets loaded once per session, and the heads trained on them once per session (one fixture
per head kind), so that a test module stands alone whichever modules run before it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from specbench.heads.train import Features

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


@contextmanager
def single_thread() -> Iterator[None]:
    """torch on one thread inside the block; the thread count it had, after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and leave the other core to whoever else is busy);
    modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`. (Session fixtures are
    set up before a module's, so those that compute take `single_thread` themselves.)"""
    with single_thread():
        yield


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


@pytest.fixture(scope="session")
def target_folders(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """Folders of the tiny Llama and Qwen2 (`tiny_models`) and of a tiny GPT-2 with their tokenizer."""
    from transformers import AutoTokenizer

    from helpers import gpt2_config, save_tiny

    tok = AutoTokenizer.from_pretrained(tiny_models["llama"])
    return {**tiny_models, "gpt2": save_tiny(tmp_path_factory.mktemp("gpt2") / "gpt2", gpt2_config(tok), tok)}


def model_state(model: torch.nn.Module) -> dict[str, object]:
    """What a test must leave as it found it in a shared model: its weights and buffers, which
    parameters train, which modules are in training mode."""
    return {"tensors": {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]},
            "grad": {name: p.requires_grad for name, p in model.named_parameters()},
            "training": {name: m.training for name, m in model.named_modules()}}


def same_state(a: dict[str, object], b: dict[str, object]) -> bool:
    return (a["grad"] == b["grad"] and a["training"] == b["training"] and a["tensors"].keys() == b["tensors"].keys()
            and all(torch.equal(t, b["tensors"][name]) for name, t in a["tensors"].items()))


@pytest.fixture(scope="session")
def targets(target_folders) -> Iterator[dict[str, LoadedModel]]:
    """The tiny Llama, Qwen2 and GPT-2 (helpers.THREE_ARCHS), loaded in float32 on the CPU once per
    session and shared by every module that asks: tests read them, never change them (a test that
    must, changes its own copy: load_model again, or copy.deepcopy); checked when the session ends.
    A module may define its own `targets` (then it cannot use the trained-head fixtures below)."""
    from helpers import CPU

    loaded = {arch: load_model(str(folder), device=CPU, dtype=torch.float32) for arch, folder in target_folders.items()}
    before = {arch: model_state(target.model) for arch, target in loaded.items()}
    yield loaded
    changed = [arch for arch, target in loaded.items() if not same_state(before[arch], model_state(target.model))]
    assert not changed, f"a test changed the shared targets {changed} (weights, requires_grad or training mode)"


@pytest.fixture(scope="session")
def greedy_features(targets) -> Callable[..., Features]:
    """`greedy_features(arch, layers=None)`: the frozen target's features (heads.train.Features) on
    its own greedy text (helpers.greedy_rows), with the hidden_states at `layers` fused when given
    (EAGLE-3); computed once per session per (arch, layers). Training only reads them."""
    from helpers import greedy_rows
    from specbench.heads.train import collect_features

    cache: dict[tuple[str, tuple[int, ...] | None], Features] = {}

    def features(arch: str, layers: tuple[int, ...] | list[int] | None = None) -> Features:
        key = (arch, tuple(layers) if layers is not None else None)
        if key not in cache:
            target = targets[arch]
            with single_thread():
                ids, valid = greedy_rows(target)
                cache[key] = collect_features(target.model, ids, valid, layers=key[1])
        return cache[key]

    return features


def trained_per_arch(tmp_path_factory: pytest.TempPathFactory, name: str, archs: list[str],
                     train: Callable[[str, Path], Path]) -> dict[str, Path]:
    """{arch: folder}: `train(arch, folder)` trains and saves one head per architecture, each in a
    fresh folder, on one thread (the thread count changes float sums, so the weights: one count for
    every order the modules run in)."""
    root = tmp_path_factory.mktemp(name)
    with single_thread():
        return {arch: train(arch, root / arch) for arch in archs}


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


# --- heads trained once per session on the targets' own greedy text (so their drafts get accepted
# and every path of the engine is exercised); each trainer is seeded with seed=0 (it seeds torch's
# global generator and its own from it), so a head is the same whichever module asks first.


@pytest.fixture(scope="session")
def medusa_heads(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.ARCHS (Llama, Qwen2): three Medusa heads with their own projections."""
    from helpers import ARCHS
    from specbench.heads.medusa import save_medusa
    from specbench.heads.train import train_medusa

    def train(arch: str, folder: Path) -> Path:
        lm_head = targets[arch].model.get_output_embeddings()
        heads, _ = train_medusa(greedy_features(arch), lm_head, num_heads=3, steps=150, batch_positions=128, lr=1e-2,
                                train_projections=True, seed=0)
        return save_medusa(heads, folder)

    return trained_per_arch(tmp_path_factory, "medusa-heads", ARCHS, train)


@pytest.fixture(scope="session")
def eagle_heads(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.ARCHS (Llama, Qwen2): an EAGLE-1 head (one layer)."""
    from helpers import ARCHS
    from specbench.heads.eagle import save_eagle
    from specbench.heads.train import train_eagle

    def train(arch: str, folder: Path) -> Path:
        model = targets[arch].model
        head, _ = train_eagle(greedy_features(arch), model.get_input_embeddings(), model.get_output_embeddings(),
                              model.config, steps=150, batch_rows=3, window=48, lr=5e-3, seed=0)
        return save_eagle(head, folder)

    return trained_per_arch(tmp_path_factory, "eagle-heads", ARCHS, train)


@pytest.fixture(scope="session")
def hydra_heads(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.THREE_ARCHS: three Hydra heads of two layers, distilled."""
    from helpers import THREE_ARCHS
    from specbench.heads.hydra import save_hydra
    from specbench.heads.train import train_hydra

    def train(arch: str, folder: Path) -> Path:
        model = targets[arch].model
        heads, stats = train_hydra(greedy_features(arch), model.get_input_embeddings(), model.get_output_embeddings(),
                                   num_heads=3, num_layers=2, steps=120, batch_positions=128, lr=1e-2, seed=0)
        assert stats.accuracy[0] > 0.5, (arch, stats)  # the first head learned the target's text
        return save_hydra(heads, folder)

    return trained_per_arch(tmp_path_factory, "hydra-heads", THREE_ARCHS, train)


@pytest.fixture(scope="session")
def ppd_heads(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.THREE_ARCHS: PPD's exit head after block 1 of 2."""
    from helpers import THREE_ARCHS
    from specbench.heads.exit import save_exit_head
    from specbench.heads.train import collect_exit_states, train_exit_head

    def train(arch: str, folder: Path) -> Path:
        model = targets[arch].model
        data = greedy_features(arch)
        states = collect_exit_states(model, data.input_ids, data.valid, exit_layer=1)
        lm_head = model.get_output_embeddings()
        head, stats = train_exit_head(data, states, lm_head, exit_layer=1, num_layers=2, steps=100,
                                      batch_positions=128, lr=1e-2, seed=0)
        assert stats.accuracy[0] > 0.3, (arch, stats)
        return save_exit_head(head, folder, int(lm_head.weight.shape[0]))

    return trained_per_arch(tmp_path_factory, "ppd-heads", THREE_ARCHS, train)


@pytest.fixture(scope="session")
def specdec_drafters(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.THREE_ARCHS: a block-3 SpecDec drafter started from a copy of the
    target (train_specdec copies it), so its blocks are often right and the verifier's paths get used."""
    from helpers import THREE_ARCHS
    from specbench.heads.specdec import save_specdec
    from specbench.heads.train import train_specdec

    def train(arch: str, folder: Path) -> Path:
        target = targets[arch]
        lm_head = target.model.get_output_embeddings()
        draft, queries, stats = train_specdec(greedy_features(arch), target.model, lm_head, block=3, steps=60,
                                              batch_rows=4, window=48, cuts=12, lr=3e-3, seed=0)
        assert stats.accuracy[0] > 0.5 and len(stats.accuracy) == 3, (arch, stats)
        return save_specdec(draft, queries, target.tokenizer, folder, int(lm_head.weight.shape[0]))

    return trained_per_arch(tmp_path_factory, "specdec-drafters", THREE_ARCHS, train)


@pytest.fixture(scope="session")
def eagle3_heads(targets, greedy_features, tmp_path_factory) -> dict[str, Path]:
    """Per architecture of helpers.THREE_ARCHS: an EAGLE-3 head on the published rule's fused layers;
    the Qwen2 one with a reduced draft vocabulary (the 120 most frequent tokens)."""
    from helpers import THREE_ARCHS
    from specbench.heads.eagle3 import feature_layers, save_eagle3
    from specbench.heads.train import train_eagle3

    def train(arch: str, folder: Path) -> Path:
        model = targets[arch].model
        data = greedy_features(arch, feature_layers(int(model.config.num_hidden_layers)))
        head, stats = train_eagle3(data, model.get_input_embeddings(), model.get_output_embeddings(), model.config,
                                   steps=150, batch_rows=3, window=48, lr=5e-3,
                                   draft_vocab=120 if arch == "qwen2" else None, seed=0)
        assert stats.accuracy[0] > 0.5, (arch, stats)  # step 0 learned the target's next tokens
        return save_eagle3(head, folder)

    return trained_per_arch(tmp_path_factory, "eagle3-heads", THREE_ARCHS, train)
