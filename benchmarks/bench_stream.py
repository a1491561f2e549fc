"""Memory and speed of `sinkscope stream`'s reader against plain forward passes (issue 25).

    .venv/bin/python benchmarks/bench_stream.py [--long 32768] [--cache 512] [--tokens 4096] [--repeats 3]

SmolLM2-135M (the embedded default, float32, CPU), one Austen text. Each measurement runs in its
own process, after loading the model and one warm-up forward pass of 64 tokens:

  memory   peak resident set (sampled every 2 ms) of
           (a) a plain forward pass of --cache tokens (SDPA, no probes), and
           (b) streaming --long tokens through a cache of --cache keys (sinks, 4 sink tokens,
               cache positions, chunk 64), reported absolute and as the increase over the loaded model;
           target (issue 25): (b) <= 1.3 x (a).
  speed    over the same --tokens tokens: (c) the model's own forward passes reading them 64 tokens
           at a time through a DynamicCache cut to its last --cache keys (SDPA, no probes, original
           positions): the passes a bounded-cache reader at chunk 64 cannot avoid, its floor; (d) the
           reader at chunk 64 for window, sinks and h2o (cache --cache, cache positions); median of
           --repeats, interleaved per repeat; target (issues 25 and 28): (d) / (c) <= 1.5.
           For scale, also: plain forward passes of --cache tokens each (SDPA; on CPU a chunk of 64
           rows reads every weight 8x as often per token as a pass of 512) and one dense forward
           over all --tokens tokens. (e) The quantised cache (issue 45): sinks at 4-bit kivi and at
           2-bit per-token with the 4 sink tokens exact, against (d)'s unquantised sinks; target <= 1.3x.

Prints a table; `--json PATH` also writes the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sinks import THREADS, PeakSampler, rss_mb  # noqa: E402


def load(n_tokens: int):
    import torch

    from sinkscope.data.corpus import bundled_corpus
    from sinkscope.run.loaders import load_model
    from sinkscope.models.resolve import resolve_source

    torch.set_num_threads(THREADS)
    torch.set_grad_enabled(False)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    text = max(bundled_corpus().documents, key=len)
    ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < n_tokens:
        raise SystemExit(f"the longest bundled document has {len(ids)} tokens, fewer than {n_tokens}")
    return loaded.model, torch.tensor([ids[:n_tokens]])


@contextlib.contextmanager
def sdpa(model):
    """The model runs transformers' SDPA attention inside the block (no probes), its own implementation after."""
    own = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(own)


def plain(model, ids):
    """SDPA forward passes over ids in windows of ids' own length (no probes)."""
    with sdpa(model):
        return model(input_ids=ids, use_cache=False).logits[0, -1, 0].item()


def chunked(model, ids, chunk: int, cache_size: int):
    """The model's own reading of ids ``chunk`` tokens at a time, its DynamicCache cut to the last ``cache_size`` keys."""
    import torch
    from transformers import DynamicCache

    with sdpa(model):
        cache = DynamicCache()
        for t0 in range(0, ids.shape[1], chunk):
            positions = torch.arange(t0, min(t0 + chunk, ids.shape[1])).unsqueeze(0)  # (1, k)
            model(input_ids=ids[:, t0:t0 + chunk], position_ids=positions, use_cache=True, cache=cache)
            for layer in cache.layers:  # (1, H_kv, S, D)
                if layer.keys.shape[2] > cache_size:
                    layer.keys = layer.keys[:, :, -cache_size:].contiguous()
                    layer.values = layer.values[:, :, -cache_size:].contiguous()


def worker(kind: str, args) -> dict:
    import torch

    from sinkscope.kvcache.policies import Policy
    from sinkscope.forward.stream.reader import layout_of, read_stream

    n_tokens = args.long if kind == "memory-stream" else (args.cache if kind == "memory-plain" else args.tokens)
    model, ids = load(max(n_tokens, 64))
    plain(model, ids[:, :64])  # warm-up
    base = rss_mb()
    layout = layout_of(model, model.config.num_hidden_layers, ids.shape[1])
    if kind == "memory-plain":
        with PeakSampler() as peak:
            plain(model, ids[:, :args.cache])
        return {"peak_mb": peak.peak, "over_model_mb": peak.peak - base}
    if kind == "memory-stream":
        started = time.perf_counter()
        with PeakSampler() as peak:
            nll = read_stream(model, ids, Policy("sinks", args.cache, 4, "cache"), layout, chunk=64)
        return {"peak_mb": peak.peak, "over_model_mb": peak.peak - base, "seconds": time.perf_counter() - started,
                "tokens": int(ids.shape[1]), "ppl": float(torch.exp(nll.double().mean()))}
    times: dict[str, list[float]] = {}
    policies = {"window": Policy("window", args.cache, 0, "cache"), "sinks": Policy("sinks", args.cache, 4, "cache"),
                "h2o": Policy("h2o", args.cache, 0, "cache", args.cache // 2),
                "sinks-kivi4": Policy("sinks", args.cache, 4, "cache", kv_bits=4, kv_group=64, kv_scheme="kivi"),
                "sinks-token2": Policy("sinks", args.cache, 4, "cache", kv_bits=2, kv_group=64, kv_scheme="per-token",
                                       protect_sinks=4),
                "sinks-token2-top-p0": Policy("sinks", args.cache, 4, "cache", kv_bits=2, kv_group=64,
                                              kv_scheme="per-token", protect="top-p0:4")}
    windows = [ids[:, s:s + args.cache] for s in range(0, ids.shape[1], args.cache)]
    for _ in range(args.repeats):
        started = time.perf_counter()
        for window in windows:
            plain(model, window)
        times.setdefault("plain", []).append(time.perf_counter() - started)
        started = time.perf_counter()
        chunked(model, ids, 64, args.cache)
        times.setdefault("floor", []).append(time.perf_counter() - started)
        started = time.perf_counter()
        plain(model, ids)
        times.setdefault("dense", []).append(time.perf_counter() - started)
        for name, policy in policies.items():
            started = time.perf_counter()
            read_stream(model, ids, policy, layout, chunk=64)
            times.setdefault(name, []).append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", type=int, default=32768)
    parser.add_argument("--cache", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    results = {}
    for kind in ("memory-plain", "memory-stream", "speed"):
        command = [sys.executable, __file__, "--worker", kind, "--long", str(args.long), "--cache", str(args.cache),
                   "--tokens", str(args.tokens), "--repeats", str(args.repeats)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    plain_mem, stream_mem, speed = results["memory-plain"], results["memory-stream"], results["speed"]
    print(f"SmolLM2-135M float32, CPU, {THREADS} thread{'s' if THREADS != 1 else ''}\n")
    print(f"memory                                   peak MB   over model MB")
    print(f"  (a) plain forward, {args.cache} tokens            {plain_mem['peak_mb']:8.0f}   {plain_mem['over_model_mb']:8.0f}")
    print(f"  (b) stream {args.long} tokens, cache {args.cache}      {stream_mem['peak_mb']:8.0f}   "
          f"{stream_mem['over_model_mb']:8.0f}   ({stream_mem['seconds']:.0f} s, ppl {stream_mem['ppl']:.2f})")
    print(f"  ratio (b)/(a): peak {stream_mem['peak_mb'] / plain_mem['peak_mb']:.2f}x   (target <= 1.3x)\n")
    print(f"speed over {args.tokens} tokens (median of {args.repeats})     seconds   tokens/s    / (c)   / plain")
    for name in ("floor", "plain", "dense", "window", "sinks", "h2o"):
        label = {"floor": f"(c) own reading, chunk 64, cache {args.cache}",
                 "plain": f"    plain forwards of {args.cache}", "dense": f"    dense forward of {args.tokens}",
                 "window": "(d) stream window, chunk 64", "sinks": "(d) stream sinks 4, chunk 64",
                 "h2o": "(d) stream h2o, chunk 64"}[name]
        print(f"  {label:38s} {speed[name]:8.2f}   {args.tokens / speed[name]:8.0f}   {speed[name] / speed['floor']:6.2f}x   {speed[name] / speed['plain']:6.2f}x")
    print("  (ratios: to (c), then to the plain forwards); target (d) / (c) <= 1.5x, h2o / (c) <= 1.2x (issue 56)")
    print(f"\nquantised cache (issue 45), over {args.tokens} tokens         seconds   / unquantised sinks")
    for name, label in (("sinks-kivi4", "(e) sinks 4, 4-bit kivi g64"), ("sinks-token2", "(e) sinks 4, 2-bit per-token g64, 4 exact"),
                        ("sinks-token2-top-p0", "(f) the same, --protect top-p0:4 instead")):
        print(f"  {label:44s} {speed[name]:8.2f}   {speed[name] / speed['sinks']:6.2f}x")
    print("  target (e) / (d) sinks <= 1.3x; (f) / (d) sinks <= 1.2x (issue 56)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), **results}, handle, indent=1)


if __name__ == "__main__":
    main()
