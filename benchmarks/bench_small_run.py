"""What a small run costs outside its forward passes (issue 61, "Small runs are quick"): a tiny
random Llama (2 layers, built from its config) through `sinkscope sinks`, as a user runs it (one
process, cold imports), with and without figures, beside the in-memory API path and the bare imports.

    python benchmarks/bench_small_run.py            # median of 3 per line
    python benchmarks/bench_small_run.py --repeats 5

Prints wall seconds per line and the target (a tiny-model `sinks` in 5 s on 2 cores). The run's
manifest splits the measurement itself (`timing.load_s`, `timing.run_s`); the rest is imports,
windows, figures, the explorer and the page.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 5.0


def tiny_model(folder: Path) -> Path:
    """A 2-layer Llama of hidden size 64 and a byte-level tokenizer, saved as a folder."""
    code = f"""
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
torch.manual_seed(0)
config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
LlamaForCausalLM(config).save_pretrained({str(folder)!r})
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
from tokenizers import trainers
tok.train_from_iterator(["The quick brown fox jumps over the lazy dog. " * 50],
                        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained({str(folder)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return folder


def wall(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sinkscope-small-") as tmp:
        folder = Path(tmp)
        model = tiny_model(folder / "tiny-llama")
        sinks = [sys.executable, "-m", "sinkscope", "sinks", str(model), "--seq-len", "128", "--n-seqs", "8",
                 "--no-progress", "--overwrite", "--out"]
        api = ("import sinkscope; sinkscope.measure('sinks', {!r}, seq_len=128, n_seqs=8, progress=False, "
               "explore_windows=0)").format(str(model))
        lines = {
            "imports (sinkscope, torch, transformers)": [sys.executable, "-c",
                                                         "import sinkscope.run.stages, sinkscope.run.load"],
            "sinks, figures and explorer (the default)": [*sinks, str(folder / "a")],
            "sinks --no-figures": [*sinks, str(folder / "b"), "--no-figures"],
            "sinks --no-figures --explore-windows 0": [*sinks, str(folder / "c"), "--no-figures",
                                                       "--explore-windows", "0"],
            "sinkscope.measure in memory (no files, no explorer)": [sys.executable, "-c", api],
        }
        wall(lines["sinks, figures and explorer (the default)"], folder)  # the token cache and compiled files warm
        rows = []
        for label, argv in lines.items():
            seconds = statistics.median(wall(argv, folder) for _ in range(args.repeats))
            rows.append((label, seconds))
            print(f"{seconds:6.2f} s  {label}", file=sys.stderr, flush=True)
        timing = json.loads((folder / "a" / "manifest.json").read_text())["timing"]
    print(f"\n| line | wall (median of {args.repeats}) |\n|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.1f} s |")
    default = rows[1][1]
    print(f"\nmeasurement itself: load {timing['load_s']:.2f} s, forward and probes {timing['run_s']:.2f} s; "
          f"the default run is {default / TARGET_S:.2f}x the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
