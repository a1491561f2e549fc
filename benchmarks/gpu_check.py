"""GPU check: time and peak memory of the sinks probes against a plain forward, two model shapes.

    bash benchmarks/gpu_check.sh                  # one large CUDA GPU (H200: under 5 minutes, ~45 GB)
    python benchmarks/gpu_check.py --profile      # + a profiler top-10 of all five probes per model
    python benchmarks/gpu_check.py --tiny         # tiny shapes on whatever device there is (CPU: a dry run)
    bash benchmarks/gpu_check.sh --long           # long context only (issue 42; H200: about 4 minutes)

Models, random weights built directly on the device in bfloat16 (``_from_config(dtype=...)``
under ``torch.device``: no float32 copy; the build's peak is printed beside the weights):

- ``llama-1b``: the Llama-3.2-1B shape, 16 layers, 32 query / 8 KV heads, d 2048, SDPA plain forward;
- ``gpt-oss-20b``: gpt-oss-20b's shape, 24 layers x 32 experts (4 active), 64 / 8 heads, alternating
  sliding (128) / full attention, learned sinks; 20.9B parameters. (``GptOssConfig()``'s
  defaults are the 120b shape, 36 x 128, which does not fit.) Plain forward: flex_attention
  (its own compile is warmed up before timing), eager if flex is unavailable.

For each model and length (default 1,024 and 8,192 tokens, one window): a plain forward, the
fused capture with no probe, each sinks probe alone, all five; then, at the longest length,
``sinkscope stream``'s reader (sinks, cache = length / 8, chunk 64) against plain forwards of
the cache's length over the same tokens, and (Llama only) the sink monitor's measurement against
one training step. Time is the median of
``--repeats`` runs after a warm-up at that length; peak is ``torch.cuda.max_memory_allocated``
during them. Printed as ratios to the plain forward; ``all 5`` is marked against the 1.15x
target of issue 16. Before the models, each fused attention kernel this device offers is run
once against the exact blocked path (max |error| of output and LSE), the exact median is
compared with a sort on the device (and timed against kthvalue), and the kernel the capture
chose for each kind of layer is printed after each model: what only a GPU can exercise.
Random weights make the probe values meaningless; a phantom mass in (0, 1) is asserted for
gpt-oss as a smoke test.

``--long`` (issue 42, docs/costs.md "Memory at long context") replaces the lengths, stream and
monitor rows with long windows: Llama at 32,768 and 131,072 tokens, gpt-oss-20b at 32,768 (``--tiny``:
256 and 512, and 256), each a plain forward against all five sinks probes, time and peak, marked
against <= 1.15x time and <= 1.2x peak memory; and before them, at 4,096 tokens (``--tiny``: 128),
every head's p0 mass from the fused capture against the exact path (``--attention explicit``: the
model's own eager weights), max |difference| printed and held under :data:`P0_TOLERANCE`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Callable

import numpy as np
import torch

SINKS_PROBES = ("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation")
#: --long: tokens per window for each model, full shapes and --tiny.
LONG_LENGTHS = {"llama-1b": (32768, 131072), "gpt-oss-20b": (32768,)}
LONG_LENGTHS_TINY = {"llama-1b": (256, 512), "gpt-oss-20b": (256,)}
#: --long: the length of the exactness check (fused p0 mass against the explicit path), full and --tiny.
EXACT_LENGTH, EXACT_LENGTH_TINY = 4096, 128
#: --long: the largest |p0 fused - p0 explicit| of any head accepted (bfloat16 weights and activations).
P0_TOLERANCE = 2e-2
#: --long: the targets, time and peak memory of all five probes against a plain forward (issue 42).
LONG_TIME_TARGET, LONG_MEMORY_TARGET = 1.15, 1.2


# ---- the only calls into sinkscope's runner and probes: adapt here when their API changes ------
def run_sinks(model: torch.nn.Module, ids: np.ndarray, probe_names: tuple[str, ...]) -> Callable[[], dict[str, float]]:
    """Run the named probes (fused capture) over ``ids`` (B, T) in one batch.

    Returns ``summary()``, which finalises the probes into {metric: model-level value}; it is
    called outside the timed region (a real run finalises once, not per batch).
    """
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes

    spec = ModelSpec.from_model(model)
    # no names: the capture alone (fused attention with records handed to a probe that reads nothing)
    probes = [get_probe(name)(spec) for name in probe_names] or [_capture_only_probe()(spec)]
    run_probes(model, ids, probes, batch_size=ids.shape[0], progress=False, attention="fused")
    return lambda: {r.metric: r.value for p in probes for r in p.rows() if r.layer is None and r.head is None}


def head_p0(model: torch.nn.Module, ids: np.ndarray, attention: str) -> dict[tuple[int, int], float]:
    """Every head's p0 mass over ``ids`` (B, T) under ``attention`` (fused or explicit): {(layer, head): value}."""
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes

    probe = get_probe("p0_mass")(ModelSpec.from_model(model))
    run_probes(model, ids, [probe], batch_size=ids.shape[0], progress=False, attention=attention)
    return {(r.layer, r.head): r.value for r in probe.rows()
            if r.metric == "p0_mass" and r.layer is not None and r.head is not None}


def _capture_only_probe():
    """A probe that observes every attention record and does nothing: the capture's own cost."""
    from sinkscope.capture import hooks
    from sinkscope.probes import Probe, observes, register_probe
    from sinkscope.store.results import MetricInfo

    @register_probe("gpu_check_capture_only", metrics={"none": MetricInfo("nothing", "", "", "gpu_check")})
    class CaptureOnly(Probe):
        @observes(hooks.ATTN)
        def attention(self, layer, record):
            pass

        def rows(self):
            return []

    return CaptureOnly


# ---- model shapes -------------------------------------------------------------------------------
def model_configs(tiny: bool) -> dict[str, tuple[type, object, str]]:
    """name -> (model class, config, plain attention implementation preference)."""
    from transformers import GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM

    if tiny:
        llama = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
        oss = GptOssConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                           num_experts_per_tok=2, sliding_window=8, max_position_embeddings=1024,
                           rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
    else:
        llama = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                            tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
        # gpt-oss-20b's config.json; everything else is GptOssConfig's default (the 120b's too)
        oss = GptOssConfig(num_hidden_layers=24, num_local_experts=32, num_experts_per_tok=4)
    return {"llama-1b": (LlamaForCausalLM, llama, "sdpa"), "gpt-oss-20b": (GptOssForCausalLM, oss, "flex_attention")}


def build(cls, config, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights allocated and initialised on ``device`` in ``dtype`` (no float32 copy)."""
    config._attn_implementation = "eager"
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    return model.eval()


# ---- measuring ----------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, float | None, object]:
    """(median seconds, peak GiB or None off CUDA, last result) of ``fn`` after one warm-up."""
    fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return statistics.median(times), peak, result


def plain_forward(model: torch.nn.Module, ids: np.ndarray, implementation: str, device: torch.device) -> None:
    model.set_attn_implementation(implementation)
    with torch.inference_mode():
        model(input_ids=torch.from_numpy(ids).to(device), use_cache=False, logits_to_keep=1)


def choose_plain(model: torch.nn.Module, preferred: str, device: torch.device, ids: np.ndarray) -> str:
    """The preferred attention implementation if it runs here (flex compiles now), else sdpa/eager."""
    for implementation in dict.fromkeys([preferred if device.type == "cuda" or preferred == "sdpa" else "eager",
                                         "sdpa", "eager"]):
        try:
            plain_forward(model, ids, implementation, device)
            return implementation
        except Exception as error:  # noqa: BLE001 - any refusal means: try the next one
            print(f"  plain forward: {implementation} unavailable ({str(error).splitlines()[0][:90]})")
    raise RuntimeError("no attention implementation ran")


def kernel_check(device: torch.device, dtype: torch.dtype, tiny: bool) -> None:
    """Each fused kernel of kernels.py on this device against the blocked path, once."""
    from sinkscope.capture import kernels as K
    from sinkscope.capture.masks import causal_additive_mask

    g = torch.Generator().manual_seed(0)
    B, H, T, D = (1, 2, 200, 64) if tiny else (1, 8, 1000, 64)  # T: not a multiple of the kernels' tiles
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(device, dtype) for _ in range(3))
    window = 16 if tiny else 128
    mask = causal_additive_mask(T, T, dtype, device, window)
    print(f"kernels on {device} ({str(dtype).removeprefix('torch.')}, B {B} H {H} T {T} D {D}):")
    cases = (("causal", {}), (f"sliding window {window}", {"window": window}), ("explicit mask", {"mask": mask}))
    for label, kwargs in cases:
        m = kwargs.pop("mask", None)
        problem = K.Problem(dtype, D, m is not None, kwargs.get("window"), True)
        ref_out, ref_lse = K.blocked_attention_with_lse(q, k, v, D ** -0.5, m, window=kwargs.get("window"))
        for kernel in K.candidate_kernels(K.device_info(device), problem):
            K.reset_kernel_state()
            out, lse = K.attention_with_lse(q, k, v, D ** -0.5, m, kernels=[kernel], **kwargs)
            ran = K.kernel_choices()[-1]["kernel"]
            out_err = (out.float() - ref_out.float()).abs().max()
            print(f"  {label:<19} {kernel:<13} ran {ran:<13} max|d out| {out_err:.1e}"
                  f"  max|d lse| {(lse - ref_lse).abs().max():.1e}")
    K.reset_kernel_state()


def median_check(device: torch.device, tiny: bool) -> None:
    """stats.median (radix select on accelerators) against a sort on this device: exact? how fast?"""
    from sinkscope.probes.stats import median

    g = torch.Generator().manual_seed(0)
    n = 50_000 if tiny else 4096 * 2048  # Llama-1B's |h| per window at 4,096 tokens; tiny: past SORT_MAX
    x = torch.randn(2, n, generator=g).abs().to(device)  # (2, n)
    for dtype in (torch.bfloat16, torch.float32):
        y = x.to(dtype)
        ordered = torch.sort(y, dim=-1).values  # (2, n)
        expected = (ordered[:, n // 2 - 1].float() + ordered[:, n // 2].float()) / 2
        got = median(y, dim=-1, dtype=torch.float32)
        seconds, _, _ = timed(lambda: median(y, dim=-1, dtype=torch.float32), device, 5)
        old, _, _ = timed(lambda: torch.kthvalue(y.float(), n // 2, dim=-1), device, 5)
        print(f"median of 2 x {n} {str(dtype).removeprefix('torch.'):<9} exact: {bool(torch.equal(got, expected))}, "
              f"{seconds * 1e3:.2f} ms (kthvalue of the lower middle alone: {old * 1e3:.2f} ms)")


def profile(fn: Callable[[], object], device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        fn()
        _sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=10))


def check_model(name: str, cls, config, preferred: str, args, device: torch.device, dtype: torch.dtype) -> list[dict]:
    from sinkscope.capture.kernels import kernel_choices, reset_kernel_state

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    model = build(cls, config, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    n_params = sum(p.numel() for p in model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    build_peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    print(f"\n{name}: {n_params / 1e9:.2f}B params {dtypes}, {config.num_hidden_layers} layers, built in "
          f"{time.perf_counter() - start:.0f} s; weights {weights:.1f} GiB, build peak {build_peak:.1f} GiB")
    rng = np.random.default_rng(0)
    preferred = preferred if args.plain_attn == "auto" else args.plain_attn
    implementation = choose_plain(model, preferred, device, rng.integers(0, config.vocab_size, (1, 16)))
    configs = [("plain", None), ("capture", ())] + [(p, (p,)) for p in SINKS_PROBES] + [("all 5", SINKS_PROBES)]
    print(f"  plain forward: {implementation}; target for 'all 5': <= {args.target:.2f}x time")
    reset_kernel_state()
    if args.long:
        results = long_rows(name, model, config, implementation, args, device, rng)
    else:
        results = length_rows(name, model, config, implementation, configs, args, device, rng)
        results.append(stream_row(name, model, config, implementation, args, device, rng))
        if name.startswith("llama"):  # gpt-oss-20b's AdamW state (4 x 20.9B x 2 bytes) does not fit beside it
            results.append(monitor_row(name, model, config, implementation, args, device, rng))
    for choice in kernel_choices():
        masking = "explicit mask" if choice["masked"] else f"window {choice['window']}" if choice["window"] else "causal"
        print(f"  capture kernel: {choice['kernel']:<12} for {choice['dtype']}, head dim {choice['head_dim']}, {masking}")
    if args.profile:
        ids = rng.integers(0, config.vocab_size, (1, max(args.lengths)))
        print(f"  profile: all five probes, {max(args.lengths)} tokens")
        profile(lambda: run_sinks(model, ids, SINKS_PROBES), device)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def length_rows(name: str, model, config, implementation: str, configs, args, device: torch.device, rng) -> list[dict]:
    """At each of ``args.lengths``: the plain forward, the capture alone, each probe alone and all five."""
    print(f"  {'tokens':>6} {'run':<19} {'time ms':>9} {'x plain':>8} {'peak GiB':>9} {'x plain':>8}")
    results = []
    for length in args.lengths:
        ids = rng.integers(0, config.vocab_size, (1, length))  # (1, T)
        base_s = base_peak = None
        for label, probes in configs:
            if probes is None:
                fn = lambda: plain_forward(model, ids, implementation, device)  # noqa: E731
            else:
                fn = lambda probes=probes: run_sinks(model, ids, probes)  # noqa: E731
            seconds, peak, summary = timed(fn, device, args.repeats)
            if probes is None:
                base_s, base_peak = seconds, peak
            ratio = seconds / base_s
            mem = f"{peak:>9.2f} {peak / base_peak:>8.2f}" if peak is not None else f"{'-':>9} {'-':>8}"
            flag = ("  ok" if ratio <= args.target else "  OVER TARGET") if label == "all 5" else ""
            print(f"  {length:>6} {label:<19} {seconds * 1e3:>9.1f} {ratio:>8.2f} {mem}{flag}", flush=True)
            results.append(dict(model=name, tokens=length, run=label, seconds=seconds, ratio=ratio, peak=peak))
            if label == "all 5":
                values = summary()
                if name.startswith("gpt-oss"):
                    assert 0.0 < values["phantom_mass"] < 1.0, values["phantom_mass"]
                print(f"  {'':>6} {'':<19} model rows: phantom_mass {values['phantom_mass']:.3f}, "
                      f"p0_mass {values['p0_mass']:.3f}, massive_activation_ratio "
                      f"{values['massive_activation_ratio']:.1f}")
    return results


def long_rows(name: str, model, config, implementation: str, args, device: torch.device, rng) -> list[dict]:
    """--long: the exactness check at EXACT_LENGTH, then plain forward against all five probes at each long length.

    Peak memory is ``torch.cuda.max_memory_allocated`` (weights included) on CUDA; off CUDA it is
    not measured here (``benchmarks/bench_sinks.py`` measures the process's resident memory).
    """
    exact_length = EXACT_LENGTH_TINY if args.tiny else EXACT_LENGTH
    ids = rng.integers(0, config.vocab_size, (1, exact_length))  # (1, T)
    fused, explicit = head_p0(model, ids, "fused"), head_p0(model, ids, "explicit")
    assert fused.keys() == explicit.keys() and fused, (len(fused), len(explicit))
    worst = max(abs(fused[k] - explicit[k]) for k in fused)
    print(f"  {exact_length:>6} p0 mass, fused against the exact path (explicit): max |d| {worst:.1e} over "
          f"{len(fused)} heads (tolerance {P0_TOLERANCE:.0e})", flush=True)
    assert worst <= P0_TOLERANCE, worst
    results = [dict(model=name, tokens=exact_length, run="p0 exact", seconds=0.0, ratio=worst, peak=None)]
    print(f"  {'tokens':>6} {'run':<19} {'time ms':>9} {'x plain':>8} {'peak GiB':>9} {'x plain':>8}")
    for length in (LONG_LENGTHS_TINY if args.tiny else LONG_LENGTHS)[name]:
        ids = rng.integers(0, config.vocab_size, (1, length))  # (1, T)
        base_s, base_peak, _ = timed(lambda: plain_forward(model, ids, implementation, device), device, args.repeats)
        seconds, peak, summary = timed(lambda: run_sinks(model, ids, SINKS_PROBES), device, args.repeats)
        ratio = seconds / base_s
        memory = peak / base_peak if peak is not None else None
        ok = ratio <= LONG_TIME_TARGET and (memory is None or memory <= LONG_MEMORY_TARGET)
        flag = "  ok" if ok else "  OVER TARGET"
        for label, s, p, r, m in (("plain", base_s, base_peak, 1.0, 1.0), ("all 5", seconds, peak, ratio, memory)):
            mem = f"{p:>9.2f} {m:>8.2f}" if p is not None else f"{'-':>9} {'-':>8}"
            print(f"  {length:>6} {label:<19} {s * 1e3:>9.1f} {r:>8.2f} {mem}{flag if label == 'all 5' else ''}",
                  flush=True)
        values = summary()
        print(f"  {'':>6} {'':<19} model rows: p0_mass {values['p0_mass']:.3f}, phantom_mass "
              f"{values['phantom_mass']:.3f}", flush=True)
        results.append(dict(model=name, tokens=length, run="plain", seconds=base_s, ratio=1.0, peak=base_peak))
        results.append(dict(model=name, tokens=length, run="all 5", seconds=seconds, ratio=ratio, peak=peak,
                            memory_ratio=memory))
    return results


def stream_row(name: str, model, config, implementation: str, args, device: torch.device, rng) -> dict:
    """``sinkscope stream``'s reader (sinks 4, cache = length / 8, chunk 64) against plain forwards of cache tokens.

    The plain forwards cover the same tokens in windows of the cache's size (what a reader bounded by
    that context must compute at least); issue 25/28's target is <= 1.5x on CPU.
    """
    from sinkscope.kvcache.policies import Policy
    from sinkscope.forward.stream.reader import layout_of, read_stream

    length = max(args.lengths)
    cache = max(8, length // 8)
    ids = rng.integers(0, config.vocab_size, (1, length))  # (1, T)
    layout = layout_of(model, config.num_hidden_layers, length)
    policy = Policy("sinks", cache, 4, "cache" if layout.inv_freq is not None else "original")
    tokens = torch.from_numpy(ids).to(device)

    def windows():
        for start in range(0, length, cache):
            plain_forward(model, ids[:, start:start + cache], implementation, device)

    def streamed():
        with torch.inference_mode():
            return read_stream(model, tokens, policy, layout, chunk=64)

    plain_s = timed(windows, device, args.repeats)[0]
    stream_s, peak, nll = timed(streamed, device, args.repeats)
    assert bool(torch.isfinite(nll).all())
    mem = f"{peak:>9.2f}" if peak is not None else f"{'-':>9}"
    print(f"  {length:>6} {'stream sinks ' + str(cache):<19} {stream_s * 1e3:>9.1f} {stream_s / plain_s:>8.2f} {mem}"
          f"   (x plain forwards of {cache} tokens over the same {length})", flush=True)
    return dict(model=name, tokens=length, run="stream", seconds=stream_s, ratio=stream_s / plain_s, peak=peak)


def monitor_row(name: str, model, config, implementation: str, args, device: torch.device, rng) -> dict:
    """The sink monitor (``SinkMonitor.measure``: its default probes on 8 windows of 128 tokens) against
    one training step (forward with the loss, backward, AdamW) on 4 windows of the shortest length.

    ``--monitor-every N`` adds ``t_monitor / (N t_step)`` to training's wall time (issue 29: <= 2% at 100).
    """
    from sinkscope.train.monitor import SinkMonitor

    T = min(args.lengths)
    batch = torch.from_numpy(rng.integers(0, config.vocab_size, (4, T))).to(device)  # (4, T)
    monitor = SinkMonitor(every=100, windows=rng.integers(0, config.vocab_size, (8, 128)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.set_attn_implementation(implementation)

    def train_step():
        model.train()
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.eval()

    step_s = timed(train_step, device, args.repeats)[0]
    monitor_s, peak, frame = timed(lambda: monitor.measure(model), device, args.repeats)
    assert len(frame) > 0
    overhead = monitor_s / (100 * step_s)
    mem = f"{peak:>9.2f}" if peak is not None else f"{'-':>9}"
    print(f"  {T:>6} {'monitor 8 x 128':<19} {monitor_s * 1e3:>9.1f} {monitor_s / step_s:>8.2f} {mem}"
          f"   (x a training step of 4 x {T}; at --monitor-every 100: {overhead:.2%})", flush=True)
    del optimizer
    model.zero_grad(set_to_none=True)
    model.eval()
    return dict(model=name, tokens=T, run="monitor", seconds=monitor_s, ratio=monitor_s / step_s, peak=peak)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="tokens per window (default 1024 8192)")
    parser.add_argument("--models", nargs="+", default=["llama-1b", "gpt-oss-20b"], choices=["llama-1b", "gpt-oss-20b"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=1.15, help="time ratio 'all 5' should stay under")
    parser.add_argument("--profile", action="store_true", help="print a profiler top-10 per model")
    parser.add_argument("--plain-attn", default="auto", choices=["auto", "sdpa", "flex_attention", "eager"],
                        help="the plain forward's attention (auto: sdpa for Llama, flex_attention for gpt-oss)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a dry run, e.g. on a CPU)")
    parser.add_argument("--long", action="store_true",
                        help="long context only: Llama at 32k and 128k, gpt-oss-20b at 32k, p0 exact at 4k (issue 42)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu with --tiny")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.tiny:
        parser.error("the full shapes need a CUDA GPU; use --tiny for a dry run")
    args.lengths = args.lengths or ([64, 128] if args.tiny else [1024, 8192])
    dtype = torch.bfloat16
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"sinkscope GPU check on {label}: torch {torch.__version__}, {str(dtype).removeprefix('torch.')}, "
          f"lengths {args.lengths}, median of {args.repeats}")
    start = time.perf_counter()
    kernel_check(device, dtype, args.tiny)
    median_check(device, args.tiny)
    results = []
    for name, (cls, config, preferred) in model_configs(args.tiny).items():
        if name in args.models:
            results += check_model(name, cls, config, preferred, args, device, dtype)
    target = LONG_TIME_TARGET if args.long else args.target
    over = ", ".join(f"{r['model']} at {r['tokens']} ({r['ratio']:.2f}x time"
                     + (f", {r['memory_ratio']:.2f}x peak" if r.get("memory_ratio") is not None else "") + ")"
                     for r in results if r["run"] == "all 5" and (
                         r["ratio"] > target or (r.get("memory_ratio") or 0) > LONG_MEMORY_TARGET))
    print(f"\ndone in {time.perf_counter() - start:.0f} s; 'all 5' over target: {over or 'none'}")
    return results


if __name__ == "__main__":
    main()
