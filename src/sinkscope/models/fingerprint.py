"""A content hash of the weights a run loaded, cheap enough for every checkpoint of a series (issue 58).

Hub checkpoints are not always what their names say (EleutherAI/pythia#205: 86 of 154
``pythia-2.8b`` step branches serve final-era weights, 76 bit-identical to ``main``), so every run
records :func:`weights_fingerprint` in its manifest (``model.weights_sample_sha256``) and a series
flags two revisions with the same one (``run/comparison.py``).

The hash is over every parameter and buffer, in name order: its name, shape and dtype, and a
fixed sample of its values, at most :data:`SAMPLE` elements evenly spaced over the flattened
tensor (the first and last included), as float32 bytes. A decision of this project: the hub's
per-file hashes are not read (a model loaded from a folder, a GGUF file or memory has none, and a
sample of the tensors tells two checkpoints apart as surely for a fraction of the cost: hashing
every byte of a 20B model would read 40 GB). Two checkpoints that differ only in elements the
sample skips hash alike, which training never produces.
"""

from __future__ import annotations

import hashlib

import torch

#: elements sampled per tensor.
SAMPLE = 4096


def weights_fingerprint(model: torch.nn.Module) -> str:
    """The sha256 (hex) of every parameter's and buffer's name, shape, dtype and evenly spaced sample."""
    digest = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors.update((name, buffer) for name, buffer in model.named_buffers() if name not in tensors)
    for name in sorted(tensors):
        tensor = tensors[name]
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        if tensor.is_meta or tensor.numel() == 0:
            continue
        flat = tensor.detach().reshape(-1)
        if flat.numel() > SAMPLE:
            index = torch.linspace(0, flat.numel() - 1, SAMPLE, dtype=torch.float64, device=flat.device).round().long()
            flat = flat[index]
        digest.update(flat.to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()
