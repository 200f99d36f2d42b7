"""GGUF files as model folders: converted once into safetensors, then loaded like any local model.

transformers reads a GGUF file (llama.cpp's format) when the `gguf` and `accelerate` packages are
installed, dequantising every tensor to the dtype asked for. Doing that at every run costs half a
minute for a 135M model, and the loaded model refuses `save_pretrained` while the GGUF quantizer
is attached. So `gguf_folder(file)` converts the file once into `<cache>/gguf/<sha256[:16]>/`
(config, tokenizer with its chat template, generation config, float32 safetensors, `source.json`
naming the file and its checksum), built in a temporary sibling and renamed into place under a
file lock like the zoo. The folder's name is the file's content hash: a changed file converts anew.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from specbench.core.errors import SpecbenchError
from specbench.core.files import build_once
from specbench.core.questions import sha256_of
from specbench.core.resources import CACHE_VAR, cache_root

#: The file a finished conversion writes last (its presence means the folder is complete).
SOURCE_FILE = "source.json"
#: Bump when a change here changes what a conversion writes.
GGUF_CODE_VERSION = "gguf-1"


#: the SHA-256 of a file, read in blocks (the one the question download checks with)
file_sha256 = sha256_of


def is_gguf(path: str | os.PathLike) -> bool:
    """A file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _need_packages() -> None:
    from importlib.util import find_spec

    missing = [name for name in ("gguf", "accelerate") if find_spec(name) is None]
    if missing:
        raise SpecbenchError(f"reading a GGUF file needs the package(s) {', '.join(missing)}; "
                             f"pip install {' '.join(missing)}")


def gguf_folder(path: str | os.PathLike, *, sha256: str | None = None) -> Path:
    """The safetensors folder converted from the GGUF file `path` (converted on first use).
    `sha256`, when given, is the checksum the file must have (a download is refused otherwise)."""
    gguf = Path(path).expanduser().resolve()
    if not is_gguf(gguf):
        raise SpecbenchError(f"'{path}' is not a GGUF file (it lacks the GGUF magic bytes); give a .gguf file "
                             "or a model folder")
    digest = file_sha256(gguf)
    if sha256 is not None and digest != sha256:
        raise SpecbenchError(f"checksum mismatch for {gguf}: expected sha256 {sha256}, got {digest}; delete the file "
                             "and fetch it again")
    root = cache_root() / "gguf"
    final = root / digest[:16]
    if (final / SOURCE_FILE).is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecbenchError(f"cannot create {root} ({exc.strerror}); set {CACHE_VAR} to a writable folder") from exc

    def fill(tmp: Path) -> None:
        _need_packages()
        seconds = _convert(gguf, tmp)
        source = {"gguf": gguf.name, "sha256": digest, "bytes": gguf.stat().st_size, "code": GGUF_CODE_VERSION,
                  "convert_seconds": round(seconds, 1), "dtype": "float32",
                  "converted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")  # last: marks the folder complete

    return build_once(final, SOURCE_FILE, fill, f"specbench: converting {gguf.name} into safetensors at {final} "
                      "(once; then cached)")  # a second process waits, then reuses the folder


def _convert(gguf: Path, out: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf))
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=str(gguf), dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError) as exc:
        gist = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise SpecbenchError(f"cannot read the GGUF file {gguf}: {gist}; is it a causal LM that transformers "
                             "supports (Llama, Qwen2, Mistral, ...)?") from exc
    # The weights are plain float32 tensors now; the GGUF quantizer only blocks saving them.
    model.hf_quantizer = None
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    model.config.name_or_path = gguf.name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # the chat template inside tokenizer_config.json
    return time.perf_counter() - start
