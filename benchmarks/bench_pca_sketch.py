"""mlp_pca's sketch against its exact covariance on SmolLM2-135M-Instruct, and the memory crossover (issue 56, item 3).

The up projection (``mlp.hook_pre_linear``, F = 1,536) of chosen layers is read once over N windows of
the bundled corpus; each value is fed to ``mlp_pca_up`` probes that hold the covariance exactly and as
Frequent Directions sketches of several ranks (the same windows, the same order). Printed per layer
and rank: PC1's and PC2's angle to the exact ones, the explained shares and separation scores of both,
the sketch's reported bound, and the time the probe took. Then the memory each way plans
(``probes/pca_memory.py``) at the widths of SmolLM2, Llama-3.2-1B, Llama-3-8B and Llama-3-70B, and
the largest width the exact way takes under a few budgets. Run at one thread per free core:

    python benchmarks/bench_pca_sketch.py --windows 16 --seq-len 512 --layers 0,15,29
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sinks import THREADS  # noqa: E402

RANKS = (16, 32, 64, 128, 256, 512)
WIDTHS = (("SmolLM2-135M", 1536), ("Llama-3.2-1B", 8192), ("Llama-3-8B", 14336), ("Llama-3-70B", 28672))


def corpus_windows(tokenizer, n: int, length: int):
    """``n`` consecutive windows of ``length`` tokens of the bundled corpus, its documents joined, (n, length)."""
    import torch

    from sinkscope.data.corpus import bundled_corpus

    ids: list[int] = []
    for text in bundled_corpus().documents:
        ids += tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) >= n * length:
            return torch.tensor(ids[:n * length]).view(n, length)
    raise SystemExit(f"the bundled corpus has {len(ids):,} tokens, fewer than {n} x {length}")


def _angle(a, b) -> float:
    """Degrees between two directions (signs ignored)."""
    import torch

    cos = float(torch.dot(a, b).abs() / (a.norm() * b.norm()))
    return math.degrees(math.acos(min(1.0, cos)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--layers", default="0,15,29")
    args = parser.parse_args()

    import torch

    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import resolve_source
    from sinkscope.probes.mlp_pca import MlpPcaUp
    from sinkscope.probes.pca_memory import common_bytes, exact_bytes, sketch_bytes
    from sinkscope.run.loaders import load_model

    torch.set_num_threads(THREADS)
    torch.set_grad_enabled(False)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    model = loaded.model
    spec = ModelSpec.from_model(model)
    windows = corpus_windows(loaded.tokenizer, args.windows, args.seq_len)  # (N, T)
    layers = [int(x) for x in args.layers.split(",")]
    quiet = lambda message: None  # noqa: E731
    probes = {(layer, rank): MlpPcaUp(spec, layer=layer, covariance="exact" if rank == 0 else "sketch",
                                      sketch_rank=max(rank, 16))
              for layer in layers for rank in (0, *RANKS)}
    for probe in probes.values():
        probe.announce = quiet
    seconds = {key: 0.0 for key in probes}
    values: dict[int, torch.Tensor] = {}
    handles = [model.model.layers[layer].mlp.up_proj.register_forward_hook(
        lambda module, inputs, output, layer=layer: values.__setitem__(layer, output)) for layer in layers]
    for start in range(0, windows.shape[0], 4):
        model(windows[start:start + 4])
        for (layer, rank), probe in probes.items():
            began = time.perf_counter()
            probe.pre(layer, values[layer])
            seconds[(layer, rank)] += time.perf_counter() - began
    for handle in handles:
        handle.remove()

    print(f"SmolLM2-135M-Instruct (float32), {args.windows} windows x {args.seq_len} tokens, mlp_pca_up "
          f"(F = {spec.mlp_width:,}), {THREADS} threads\n")
    print("| layer | way | PC1 angle | PC2 angle | PC1 share | separation | best (PC) | bound | probe time |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for layer in layers:
        exact = probes[(layer, 0)].pca(0)
        for rank in (0, *RANKS):
            fit = probes[(layer, rank)].pca(0)
            way = "exact" if rank == 0 else f"sketch l = {rank}"
            print(f"| {layer} | {way} | {_angle(fit['v1'], exact['v1']):.2f}° | {_angle(fit['v2'], exact['v2']):.2f}° | "
                  f"{fit['pc1']:.4f} | {fit['separation']:.3f} | {fit['best']:.3f} ({fit['best_pc']}) | "
                  f"{fit['bound']:.3g} | {seconds[(layer, rank)]:.2f} s |", flush=True)

    print("\nPeak memory each way plans (one pass; the scatter defaults, 64 x 32 positions), GB:\n")
    print("| model | F | exact | sketch l = 64 | sketch l = 128 | sketch l = 256 |\n|---|---|---|---|---|---|")
    for name, width in WIDTHS:
        base = common_bytes(width, 1, 64, 32)
        cells = [exact_bytes(width, 1) + base] + [sketch_bytes(width, 1, r) + base for r in (64, 128, 256)]
        print(f"| {name} | {width:,} | " + " | ".join(f"{c / 1e9:.3f}" for c in cells) + " |")
    print("\nThe widest F the exact way takes (one pass / two passes), by budget:\n")
    print("| budget | one pass | two passes |\n|---|---|---|")
    for budget in (2, 8, 20, 40):
        widest = [max(f for f in range(256, 60_000, 256) if exact_bytes(f, p) + common_bytes(f, p, 64, 32)
                      <= budget * 1e9) for p in (1, 2)]
        print(f"| {budget} GB | {widest[0]:,} | {widest[1]:,} |")


if __name__ == "__main__":
    main()
