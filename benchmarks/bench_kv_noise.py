"""How far a quantised cache's perplexity moves with the last bit of its input (issue 62, "Noise stated").

A quantiser rounds each cached key and value to one of 2^bits levels; an input that moves by one
float32 ulp can push an element across a rounding boundary, and the flipped level propagates
through every later token. This script reads SmolLM2-135M-Instruct (the bundled default) over
``--docs`` documents of ``--length`` tokens with a full cache (``stream``'s ``full`` policy, chunks
of 64), at 16, 8, 4 and 2 bits under ``kivi`` and ``per-token`` (group 64), twice: as loaded, and
with every input embedding moved by one ulp (``torch.nextafter`` towards +inf). It prints, per
setting, the perplexity with its standard error over documents, and the largest relative change
of a document's perplexity that the nudge caused: the last-bit sensitivity that docs/commands/stream.md
and SPEC.md quote. A difference between two quantised rows smaller than that is not an effect.

    python benchmarks/bench_kv_noise.py                 # 4 documents of 512 tokens (about 3 min on 2 cores)
    python benchmarks/bench_kv_noise.py --docs 8 --length 1024
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sinks import THREADS  # noqa: E402

SETTINGS = ((16, "kivi"), (8, "kivi"), (8, "per-token"), (4, "kivi"), (4, "per-token"), (2, "kivi"), (2, "per-token"))


def documents(tokenizer, n_docs: int, length: int):
    """``n_docs`` windows of ``length`` tokens from the bundled corpus, each from its own document where one is long
    enough (the longest documents first), as (n_docs, length) int64."""
    import torch

    from sinkscope.data.corpus import bundled_corpus

    texts = sorted(bundled_corpus().documents, key=len, reverse=True)
    windows = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) >= length:
            windows.append(ids[:length])
        if len(windows) == n_docs:
            return torch.tensor(windows)
    raise SystemExit(f"the bundled corpus has {len(windows)} documents of {length} tokens or more, fewer than {n_docs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--group", type=int, default=64)
    args = parser.parse_args()

    import torch

    from sinkscope.forward.stream.reader import layout_of, read_stream
    from sinkscope.kvcache.policies import Policy
    from sinkscope.models.resolve import resolve_source
    from sinkscope.run.loaders import load_model

    torch.set_num_threads(THREADS)
    torch.set_grad_enabled(False)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    model = loaded.model
    docs = documents(loaded.tokenizer, args.docs, args.length)  # (D, L)
    layout = layout_of(model, model.config.num_hidden_layers, args.length)
    embedding = model.get_input_embeddings().weight
    as_loaded = embedding.detach().clone()
    nudged = torch.nextafter(as_loaded, torch.full_like(as_loaded, math.inf))  # every entry one ulp up

    def perplexities(policy) -> list[float]:
        return [float(torch.exp(read_stream(model, docs[d:d + 1], policy, layout, chunk=64).double().mean()))
                for d in range(docs.shape[0])]

    started = time.perf_counter()
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, float32), {args.docs} documents x {args.length} tokens, full cache, "
          f"chunks of 64, group {args.group}", file=sys.stderr)
    print("\n| bits | scheme | ppl ± se (documents) | largest change of a document's ppl, embeddings + 1 ulp |\n"
          "|---|---|---|---|")
    for bits, scheme in SETTINGS:
        policy = Policy("full", kv_bits=bits, kv_group=args.group, kv_scheme=scheme)
        embedding.data.copy_(as_loaded)
        base = perplexities(policy)
        embedding.data.copy_(nudged)
        moved = perplexities(policy)
        embedding.data.copy_(as_loaded)
        mean = sum(base) / len(base)
        se = (sum((p - mean) ** 2 for p in base) / (len(base) - 1)) ** 0.5 / len(base) ** 0.5 if len(base) > 1 else math.nan
        change = max(abs(m - b) / b for m, b in zip(moved, base))
        label = "16 (not quantised)" if bits == 16 else str(bits)
        print(f"| {label} | {'' if bits == 16 else scheme} | {mean:.2f} ± {se:.2f} | {100 * change:.3f}% |", flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
