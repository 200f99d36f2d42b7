"""Pack the smollm2 kit (and the GGUF) for the device tool. In each safetensors file of the parts,
a tensor bitwise equal to the target's embedding (Medusa's and Hydra's frozen vocabulary projections)
travels as a reference (`<file>.refs.json`), the other float32 tensors as bfloat16 (`<file>.bf16`);
unpack_kit.py restores float32 files (the references from the device's own converted target). The tar
is split into chunks of CHUNK MiB."""
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

cache = Path(os.environ.get("SPECBENCH_CACHE_DIR", Path.home() / ".cache/specbench"))
out = Path(sys.argv[1])
chunk = int(sys.argv[2]) * 2**20
out.mkdir(parents=True, exist_ok=True)
target_file = json.loads((cache / "smollm2" / "target.json").read_text())["folder"] + "/model.safetensors"
embed = load_file(target_file)["model.embed_tokens.weight"]
buf = io.BytesIO()
report = []
with tarfile.open(fileobj=buf, mode="w") as tar:
    gguf = "downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
    tar.add(cache / gguf, arcname=gguf)
    for path in sorted((cache / "smollm2").rglob("*")):
        if path.suffix in (".bin", ".pt", ".pth"):  # upstream-format pickle copies; the loaders read safetensors
            continue
        if path.is_dir() or path.name == "target.json" or path.suffix == ".lock" or any(
                part.startswith(".") for part in path.relative_to(cache).parts):
            continue
        arc = str(path.relative_to(cache))
        if path.suffix != ".safetensors":
            tar.add(path, arcname=arc)
            continue
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        tensors = load_file(str(path))
        refs = {k: "model.embed_tokens.weight" for k, v in tensors.items()
                if v.shape == embed.shape and v.dtype == embed.dtype and torch.equal(v, embed)}
        rest = {k: (v.to(torch.bfloat16) if v.dtype == torch.float32 else v)
                for k, v in tensors.items() if k not in refs}
        dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()}
        tmp = Path("/tmp/pack.part")
        save_file(rest, str(tmp), metadata=meta)
        tar.add(tmp, arcname=arc + ".bf16")
        side = Path("/tmp/pack.refs")
        side.write_text(json.dumps({"refs": refs, "dtypes": dtypes, "metadata": meta}))
        tar.add(side, arcname=arc + ".refs.json")
        mib = path.stat().st_size / 2**20, tmp.stat().st_size / 2**20
        report.append(f"{arc}: {len(tensors)} tensors, {len(refs)} as references, {mib[0]:.1f} -> {mib[1]:.1f} MiB")
data = buf.getvalue()
print("\n".join(report))
print(f"tar {len(data) / 2**20:.1f} MiB")
first = int(sys.argv[3]) * 2**20 if len(sys.argv) > 3 else chunk
pieces = [data[:first]] + [data[i:i + chunk] for i in range(first, len(data), chunk)]
for n, piece in enumerate(pieces):
    (out / f"kit.tar.{n:02d}").write_bytes(piece)
print(len(pieces), "chunks")
