"""Speed and peak memory of `sinkscope sinks` against the usual ways of getting the same numbers.

    .venv/bin/python benchmarks/bench_sinks.py [--lengths 512 2048 8192] [--repeats 2]
        [--methods plain sinkscope heads circuit ...] [--mmap-thresholds default off 1048576]

For SmolLM2-135M (the embedded default, float32, CPU) on one window of Austen of each length:

  (a) plain      a forward pass with SDPA attention (no probes): the baseline
  (b) sinkscope  run_probes with the five sinks probes, fused capture (the default)
  (b') explicit  the same with the explicit capture (eager weights; the reference path)
  (c) hf-eager   HF eager attention with output_attentions=True (+ hidden states, v hooks),
                 the sink numbers computed from the returned tensors
  (d) tlens      TransformerLens TransformerBridge.run_with_cache, numbers from the cache
                 (needs `pip install transformer-lens`; booted offline from the model with tokenizer=)
  (e) heads, circuit   run_probes with the command's default probes (fused; circuit without its
                 BOS experiments, eight loss passes bench_commands.py times), against (a)
  (f) plain+loss a forward with every position's logits and the next-token loss (the floor of a
                 run that reads the loss: `heads --ablate-dormant`, `inject`)
  (g) selectivity       the command's probes on a trainer normgate GPT at SmolLM2's shape
                 (30 layers, 9 heads, width 576, vocabulary 49,152; random weights), against
  (g') gpt-plain        that GPT's own forward (SDPA, every position's logits, as it returns them)

--mmap-thresholds runs each sinkscope method once per setting of SINKSCOPE_MMAP_THRESHOLD
(sinkscope/heap.py): ``default`` (what a run does unasked: 4 MiB), ``off`` (glibc's own dynamic
threshold) or a size in bytes. The floors (plain, plain+loss, gpt-plain) run once, with
glibc's default, as a user's own forward would.

Each (method, length) runs in its own process. Time is the median wall time of the call over
--repeats runs after one warm-up at 64 tokens; peak memory is the process's peak resident set
during the call (sampled every 2 ms), reported as the absolute peak and as the increase over the
loaded model. A run that fails (out of memory under the --mem-limit-gb address-space cap) is
reported as such. Prints a table with ratios to (a).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

#: torch threads per benchmark process (``BENCH_THREADS``, default 1): on this project's 2-core
#: machines two OpenMP threads per process beside any other job made every pass 4-6x slower, and
#: 64-row passes worst (issue 25), so one thread is the default and more are asked for.
THREADS = int(os.environ.get("BENCH_THREADS", "1"))

METHODS = ["plain", "sinkscope", "explicit", "hf-eager", "tlens", "heads", "circuit", "plain+loss", "selectivity",
           "gpt-plain"]
#: the forward each method is compared with (its ratios' denominator).
FLOOR = {"selectivity": "gpt-plain", "gpt-plain": "gpt-plain", "plain+loss": "plain+loss"}
#: the methods that run sinkscope's runner (and so fix the mmap threshold); the others run once.
SINKSCOPE_METHODS = {"sinkscope", "explicit", "heads", "circuit", "selectivity"}


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakSampler:
    """Samples the resident set size in a thread; ``peak`` is the maximum seen."""

    def __init__(self, every_s: float = 0.002):
        self.every_s, self.peak, self._stop = every_s, rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def load():
    import torch
    from sinkscope.data.corpus import bundled_corpus
    from sinkscope.run.loaders import load_model
    from sinkscope.models.resolve import resolve_source

    torch.set_num_threads(THREADS)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    text = bundled_corpus().documents[0]
    ids = loaded.tokenizer(text[:400_000], add_special_tokens=False).input_ids
    return loaded, ids


def numbers_from_weights(attentions, values, hidden, n_kv, head_dim):
    """The sinks numbers (p0, sink rate, value-norm ratio, massive activation) from full tensors."""
    import torch

    out = {}
    for layer, a in enumerate(attentions):  # (1, H, T, T)
        a = a.float()
        out[f"p0_{layer}"] = (a[..., 1:, 0] / a[..., 1:, :].sum(-1)).mean().item()
        out[f"rate_{layer}"] = (a[..., :, 0].mean(-1) > 0.3).float().mean().item()
        norms = values[layer].view(values[layer].shape[0], -1, n_kv, head_dim).norm(dim=-1)  # (1, T, Hkv)
        out[f"vnr_{layer}"] = (norms[:, 0] / norms[:, 1:].median(dim=1).values).mean().item()
    for layer, h in enumerate(hidden):
        out[f"act_{layer}"] = h.abs().max().item()
    del torch
    return out


def _smollm2_shape_gpt():
    """A trainer normgate GPT at SmolLM2-135M's shape (random weights, float32, eval)."""
    import torch
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=49152, block_size=16384, n_layer=30, n_head=9, n_embd=576,
                         variant="normgate")).eval()


def _command_call(command_name: str, model):
    """``call(ids)``: run_probes with ``command_name``'s default probes (fused capture).

    ``circuit`` without its BOS experiments: those are eight more passes with every logit and the
    loss, timed against their own floor by ``bench_commands.py``; here the one measuring pass.
    """
    import dataclasses

    from sinkscope.capture import ModelSpec
    from sinkscope.commands import get_command, make_probes
    from sinkscope.forward.runner import run_probes

    command = get_command(command_name)
    spec = ModelSpec.from_model(model)
    options = command.options()
    if command_name == "circuit":
        options = dataclasses.replace(options, bos_experiments=False)

    def call(ids):
        probes = make_probes(command, options, spec)
        run_probes(model, ids.numpy(), probes, batch_size=1, progress=False)
        [p.rows() for p in probes]
    return call


def worker(method: str, length: int, repeats: int) -> dict:
    import torch

    loaded, corpus_ids = load()
    model, tok = loaded.model, loaded.tokenizer
    cfg = model.config
    n_kv, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads

    def make(n):
        return torch.tensor([corpus_ids[:n]], dtype=torch.long)

    if method == "plain":
        model.set_attn_implementation("sdpa")

        def call(ids):
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
    elif method == "plain+loss":
        model.set_attn_implementation("sdpa")

        def call(ids):
            with torch.inference_mode():
                model(input_ids=ids, labels=ids, use_cache=False).loss.item()
    elif method in ("heads", "circuit"):
        call = _command_call(method, model)
    elif method in ("selectivity", "gpt-plain"):
        del loaded, model
        gpt = _smollm2_shape_gpt()
        if method == "selectivity":
            call = _command_call("selectivity", gpt)
        else:
            def call(ids):
                with torch.inference_mode():
                    gpt(ids)
    elif method in ("sinkscope", "explicit"):
        from sinkscope.capture import ModelSpec
        from sinkscope.commands.sinks import SINKS_PROBES
        from sinkscope.probes import get_probe
        from sinkscope.forward.runner import run_probes

        spec = ModelSpec.from_model(model)
        mode = "fused" if method == "sinkscope" else "explicit"

        def call(ids):
            probes = [get_probe(name)(spec) for name in SINKS_PROBES]
            run_probes(model, ids.numpy(), probes, batch_size=1, progress=False, attention=mode)
            [p.rows() for p in probes]
    elif method == "hf-eager":
        model.set_attn_implementation("eager")
        values = {}
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.v_proj.register_forward_hook(lambda m, inp, o, i=i: values.__setitem__(i, o))

        def call(ids):
            with torch.inference_mode():
                out = model(input_ids=ids, use_cache=False, output_attentions=True, output_hidden_states=True,
                            logits_to_keep=1)
                numbers_from_weights(out.attentions, values, out.hidden_states[1:], n_kv, head_dim)
    elif method == "tlens":
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError:
            return {"error": "transformer-lens not installed"}
        model.set_attn_implementation("eager")
        bridge = TransformerBridge.boot_transformers(loaded.cache_path, hf_model=model, tokenizer=tok)
        L = cfg.num_hidden_layers
        names = ([f"blocks.{i}.attn.hook_pattern" for i in range(L)] + [f"blocks.{i}.attn.hook_v" for i in range(L)]
                 + [f"blocks.{i}.hook_resid_post" for i in range(L)])

        def call(ids):
            with torch.inference_mode():
                _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in names)
                numbers_from_weights([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(L)],
                                     {i: cache[f"blocks.{i}.attn.hook_v"].reshape(1, ids.shape[1], -1) for i in range(L)},
                                     [cache[f"blocks.{i}.hook_resid_post"] for i in range(L)], n_kv, head_dim)
    else:
        raise ValueError(method)

    call(make(64))  # warm-up
    base = rss_mb()
    times, peak = [], base
    try:
        for _ in range(repeats):
            with PeakSampler() as sampler:
                start = time.perf_counter()
                call(make(length))
                times.append(time.perf_counter() - start)
            peak = max(peak, sampler.peak)
    except (RuntimeError, MemoryError) as error:
        return {"error": f"failed: {str(error).splitlines()[0][:80]}", "base_mb": base}
    return {"time_s": statistics.median(times), "peak_mb": peak, "base_mb": base}


def run_one(method: str, length: int, repeats: int, mem_gb: float, mmap: str = "default") -> dict:
    cmd = [sys.executable, __file__, "--worker", method, str(length), "--repeats", str(repeats)]
    env = {k: v for k, v in os.environ.items() if k != "SINKSCOPE_MMAP_THRESHOLD"}
    if mmap != "default":
        env["SINKSCOPE_MMAP_THRESHOLD"] = mmap

    def limit():
        cap = int(mem_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"process failed (exit {proc.returncode}): {tail[:80]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mem-limit-gb", type=float, default=20.0)
    parser.add_argument("--mmap-thresholds", nargs="+", default=["default"], metavar="SETTING",
                        help="default | off | BYTES: SINKSCOPE_MMAP_THRESHOLD for the sinkscope methods")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.repeats)))
        return

    print(f"SmolLM2-135M float32 on CPU ({THREADS} thread{'s' if THREADS != 1 else ''}), one window per length; "
          f"median of {args.repeats}; peak = process peak RSS during the call (increase over the loaded model)")
    print(f"{'tokens':>6} {'method':>11} {'mmap':>8} {'time s':>8} {'x floor':>8} {'peak MB':>9} {'x floor':>8} "
          f"{'+MB':>8} {'x floor':>8}  floor")
    for length in args.lengths:
        results = {}
        for method in args.methods:
            for mmap in (args.mmap_thresholds if method in SINKSCOPE_METHODS else ["default"]):
                results[method, mmap] = run_one(method, length, args.repeats, args.mem_limit_gb, mmap)
        floors = {}
        for floor in {FLOOR.get(m, "plain") for m in args.methods}:
            floors[floor] = results.get((floor, "default")) or run_one(floor, length, args.repeats, args.mem_limit_gb)
        for (method, mmap), r in results.items():
            floor_name = FLOOR.get(method, "plain")
            if "error" in r:
                print(f"{length:>6} {method:>11} {mmap:>8}  {r['error']}")
                continue
            print_row(length, method, mmap, r, floors[floor_name], floor_name)


def print_row(length: int, method: str, mmap: str, r: dict, floor: dict, floor_name: str) -> None:
    """One table row: time, peak and peak increase, each with its ratio to ``floor``."""
    inc = r["peak_mb"] - r["base_mb"]
    t_ratio = r["time_s"] / floor["time_s"] if "time_s" in floor else float("nan")
    m_ratio = r["peak_mb"] / floor["peak_mb"] if "peak_mb" in floor else float("nan")
    floor_inc = floor.get("peak_mb", 0) - floor.get("base_mb", 0)
    i_ratio = inc / floor_inc if floor_inc > 0 else float("nan")
    print(f"{length:>6} {method:>11} {mmap:>8} {r['time_s']:>8.2f} {t_ratio:>8.2f} {r['peak_mb']:>9.0f} {m_ratio:>8.2f} "
          f"{inc:>8.0f} {i_ratio:>8.2f}  {floor_name}", flush=True)


if __name__ == "__main__":
    main()
