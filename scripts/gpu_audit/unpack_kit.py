"""On the device: `<file>.bf16` + `<file>.refs.json` back into a float32 `<file>` (see pack_kit.py);
references come from the converted target (argv[2]: its model.safetensors)."""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

target = load_file(sys.argv[2])
for path in sorted(Path(sys.argv[1]).rglob("*.safetensors.bf16")):
    final = path.with_suffix("")
    side = json.loads(Path(str(final) + ".refs.json").read_text())
    tensors = load_file(str(path))
    for k, ref in side["refs"].items():
        tensors[k] = target[ref].clone()
    tensors = {k: v.to(getattr(torch, side["dtypes"][k])) for k, v in tensors.items()}
    save_file(tensors, str(final), metadata=side["metadata"])
    path.unlink()
    Path(str(final) + ".refs.json").unlink()
    print("restored", final, len(tensors), "tensors,", len(side["refs"]), "from the target")
