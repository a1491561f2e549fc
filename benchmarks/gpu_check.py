"""GPU check at real scale: a gpt-oss-20b-sized model (random bf16 weights) from its config.

    bash benchmarks/gpu_check.sh            # on a machine with one large GPU (H100/H200: ~45 GB used)

Builds ``GptOssConfig()`` (the 20b architecture: 24 layers, 64 query / 8 KV heads, 32 experts,
alternating sliding/full attention, learned sinks) with random weights directly on the GPU in
bfloat16, then reports tokens/s of a plain forward (the model's own attention: flex_attention
if it runs, else eager) against ``run_probes`` with the five sinks probes (fused capture), at
1,024 and 8,192 tokens, plus peak GPU memory of each and a check that the phantom mass is in
(0, 1). Random weights make the numbers meaningless as science; the point is speed and memory.
"""

from __future__ import annotations

import argparse
import time

import torch


def build(layers: int | None):
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig()
    if layers:
        config.num_hidden_layers = layers
        config.layer_types = config.layer_types[:layers]
    config._attn_implementation = "eager"
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = GptOssForCausalLM(config).eval()
        torch.set_default_dtype(torch.float32)
    return model


def timed(fn, repeats: int) -> tuple[float, float]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()  # warm-up at this length
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats, torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers for a quick try")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this check needs a CUDA GPU"
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import PROBES, SINKS_PROBES
    from sinkscope.results import rows_to_frame
    from sinkscope.runner import run_probes

    t0 = time.perf_counter()
    model = build(args.layers)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built gpt-oss-20b-sized model: {n_params / 1e9:.1f}B params, bf16, "
          f"{time.perf_counter() - t0:.0f} s, {torch.cuda.memory_allocated() / 2**30:.1f} GiB on {torch.cuda.get_device_name()}")
    spec = ModelSpec.from_model(model)
    plain_impl = "eager"
    try:
        model.set_attn_implementation("flex_attention")
        plain_impl = "flex_attention"
    except Exception as error:  # noqa: BLE001
        print(f"flex_attention unavailable ({str(error).splitlines()[0][:80]}); plain forward uses eager")
    print(f"{'tokens':>7} {'plain tok/s':>12} {'sinks tok/s':>12} {'ratio':>6} {'plain GiB':>10} {'sinks GiB':>10}")
    for n in args.lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")

        def plain():
            model.set_attn_implementation(plain_impl)
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

        probes_box = {}

        def sinks():
            probes = [PROBES[name](spec) for name in SINKS_PROBES]
            run_probes(model, ids.cpu().numpy(), probes, batch_size=1, progress=False, attention="fused")
            probes_box["p"] = probes

        try:
            plain_s, plain_mem = timed(plain, args.repeats)
            plain_txt = f"{n / plain_s:>12.0f}"
        except torch.OutOfMemoryError:
            plain_s, plain_mem, plain_txt = float("nan"), float("nan"), f"{'OOM':>12}"
            torch.cuda.empty_cache()
        sinks_s, sinks_mem = timed(sinks, args.repeats)
        print(f"{n:>7} {plain_txt} {n / sinks_s:>12.0f} {sinks_s / plain_s:>6.2f} {plain_mem:>10.1f} {sinks_mem:>10.1f}")
        table = rows_to_frame(r for p in probes_box["p"] for r in p.rows())
        phantom = table[(table.metric == "phantom_mass") & table.layer.isna()]["value"].iloc[0]
        assert 0.0 < phantom < 1.0, phantom
        print(f"        phantom_mass (model) = {phantom:.3f}, p0_mass = "
              f"{table[(table.metric == 'p0_mass') & table.layer.isna()]['value'].iloc[0]:.3f}")


if __name__ == "__main__":
    main()
