"""Reading and writing head checkpoints safely: safetensors, or plain-tensor pickles only.

Published EAGLE / Medusa heads ship as `pytorch_model.bin` / `medusa_lm_head.pt` (pickled state
dicts); we read those with torch's `weights_only` loader, which refuses anything but tensors
and containers, so a checkpoint can never run code. What we write is safetensors plus the
published file, so the published loaders (and our round-trip tests) can read our heads too.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specbench.core.digests import file_digest
from specbench.core.errors import SpecbenchError
from specbench.core.hub import download_checked, is_hub_id, listing

#: what `method.head` named for each folder a head was loaded from (a path, a hub id, `zoo:NAME`), and
#: the hub's `repo@commit` for a downloaded one: the head's provenance line names them
_NAMED: dict[Path, str] = {}
_FROM_HUB: dict[Path, str] = {}


def warn(line: str) -> None:
    """One `warning:` line on stderr (a head loaded with a tolerated difference, named, never silent)."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def head_record(folder: Path, weights: Path, fmt: str, variant: str) -> dict[str, str]:
    """Where a loaded head came from, for meta.json and the report: what `method.head` named, `source`
    (hub, folder, or built: the zoo's or a kit's part), the hub's `repo@commit` when it was downloaded, the
    format and the variant recognised, the weight file and its sha256 (one line: core.origin.head_line)."""
    from specbench.models import is_part

    named = _NAMED.get(folder, str(folder))
    record = {"head": named, "format": fmt, "variant": variant, "file": weights.name, "sha256": file_digest(weights),
              "source": "hub" if folder in _FROM_HUB else "built" if is_part(named) else "folder"}
    if folder in _FROM_HUB:
        record["hub"] = _FROM_HUB[folder]
    return record


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors file, or of a .pt / .bin state dict (weights_only)."""
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecbenchError(f"cannot read head weights {path}: {reason}; copy or download it again") from exc
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        text = str(exc)
        if "Weights only load failed" in text and "Unsupported operand" not in text:
            raise SpecbenchError(
                f"refused to load head weights {path}: the pickle holds more than plain tensors "
                "(torch's weights_only loader rejected it); convert it to safetensors"
            ) from exc
        raise SpecbenchError(
            f"cannot read head weights {path}: it is not a complete PyTorch checkpoint (empty, truncated, damaged "
            "or another kind of file); copy or download it again"
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # some trainers wrap the state dict
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecbenchError(f"head weights {path} are not a state dict of tensors")
    return dict(state)


def write_state_dict(state: dict[str, torch.Tensor], folder: Path, safetensors_name: str, pickle_name: str) -> None:
    """The same tensors as safetensors (what we load first) and as the published pickle file."""
    # Tied / shared tensors would make safetensors refuse: store independent contiguous copies.
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    save_file(plain, str(folder / safetensors_name), metadata={"format": "pt"})
    torch.save(plain, str(folder / pickle_name))


def read_config(folder: Path, kind: str) -> dict[str, Any]:
    """config.json of a head folder as a dict, with a clear error when it is missing or broken."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpecbenchError(f"{kind} head folder {folder} has no config.json; give method.head= the folder that "
                             "holds the head's config.json and weights")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SpecbenchError(f"{kind} head config {path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise SpecbenchError(f"{kind} head config {path} is not a JSON object")
    return config


def weights_file(folder: Path, candidates: tuple[str, ...], kind: str) -> Path:
    """The first of `candidates` present in `folder` (safetensors first by convention)."""
    for name in candidates:
        if (folder / name).is_file():
            return folder / name
    raise SpecbenchError(f"{kind} head folder {folder} has none of {', '.join(candidates)}")


def check_keys(state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], path: Path, kind: str,
               layout: str, ignore: tuple[str, ...] = ()) -> None:
    """Missing, unexpected or misshapen keys, as one error that names the published layout."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected and k not in ignore]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}")
        raise SpecbenchError(f"{kind} head {path}: {'; '.join(parts)} (expected the {layout} key layout)")
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise SpecbenchError(
                f"{kind} head {path}: {key} has shape {tuple(state[key].shape)}, its config.json implies {shape}"
            )


def head_folder(spec: str | None, model_cfg: Any, method: str, kind: str, weight_files: tuple[str, ...] = ()
                ) -> Path:
    """The folder that `spec` (the method's `head` setting) names: a path, `zoo:NAME` / `KIT:NAME`
    (built if needed), or a hub id `owner/name[@revision]` (its config.json and the first of
    `weight_files` the repository has, downloaded and checked against the hub's checksums).

    The zoo's and a kit's heads are trained for their own target only: for any other model they
    are refused before they would be built for nothing.
    """
    from specbench.models import find_resolver, resolve_path

    if not spec:
        raise SpecbenchError(f"method {method} needs a trained {kind} head (model.parts names no built ones for "
                             "this model); set method.head=/path/to/head_folder")
    spec = str(spec)
    target = str(model_cfg.get("path") or "")
    built_for = spec.partition(":")[0]
    if target and find_resolver(built_for) is not None and not target.startswith(built_for + ":"):
        raise SpecbenchError(
            f"method.head={spec} is the {kind} head built for {built_for}:target only; for {target} set "
            f"method.head=/path/to/its {kind} head (published releases load as they are), or train one with "
            f"`python -m specbench train-head method={method} model=...`"
        )
    prefix, sep, _ = spec.partition(":")
    if sep and prefix.isidentifier() and not Path(spec).exists():
        folder = Path(resolve_path(spec))  # a registered prefix:NAME
    elif is_hub_id(spec) and weight_files:
        folder = hub_head(spec, kind, weight_files)
    else:
        folder = Path(spec).expanduser()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "is not a folder (it does not exist)"
        raise SpecbenchError(f"{kind} head '{spec}' {what}; give method.head= the folder of a published or trained "
                             f"{kind} head, or its hub id (owner/name)")
    _NAMED[folder] = spec
    return folder


def hub_head(spec: str, kind: str, weight_files: tuple[str, ...]) -> Path:
    """A published head from the hub (`owner/name[@revision]`): its config.json and first weight file,
    each checked against the hub's checksum; the folder they are in (the hub's cache)."""
    repo, _, revision = spec.partition("@")
    local = f"download it where the hub answers (huggingface-cli download {repo} --local-dir DIR) and set " \
            "method.head=DIR"
    try:
        commit, listed = listing(repo, revision or "main", ["config.json", *weight_files])
    except SpecbenchError as exc:
        raise SpecbenchError(f"{kind} head {spec}: {exc}; {local}") from None
    weights = next((name for name in weight_files if name in listed), None)
    if "config.json" not in listed or weights is None:
        raise SpecbenchError(f"{kind} head {spec}: the hub repository has no "
                             f"{'config.json' if weights else ' nor '.join(weight_files)}; is it a {kind} head?")
    try:
        config = download_checked(repo, "config.json", commit, listed["config.json"])
        download_checked(repo, weights, commit, listed[weights])
    except SpecbenchError as exc:
        raise SpecbenchError(f"{kind} head {spec}: {exc}; or {local}") from None
    _FROM_HUB[config.parent] = f"{repo}@{commit}"
    return config.parent


def target_dims(model: torch.nn.Module) -> tuple[int, int, torch.nn.Module]:
    """The target's hidden size, logit width and LM head."""
    lm_head = model.get_output_embeddings()
    if lm_head is None or getattr(lm_head, "weight", None) is None:
        raise SpecbenchError("the target has no output embedding (LM head) for the heads to use")
    vocab, hidden = lm_head.weight.shape
    return int(hidden), int(vocab), lm_head
