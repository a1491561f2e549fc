"""Every measuring command against the forward passes it cannot avoid (issue 28).

    .venv/bin/python benchmarks/bench_commands.py [--lengths 512 2048] [--commands sinks inject heads circuit]
                                                  [--repeats 1] [--no-probes] [--probe-lengths 512] [--quick]

For SmolLM2-135M (the embedded default, float32, CPU) on one window of Austen per length (BOS
first, as ``--bos auto`` gives), each command runs through ``sinkscope.measure`` (its checks, the
capture self-check, both stages, the table; no files written, the model loaded once per length):

  sinks                      the five sinks probes               floor: 1 plain pass
  inject                     --junk same-context,gaussian --cutoffs median --doses 0.8 --draws 2
                             --eval-batch 1 (1 clean + 2 conditions x 2 draws)
                                                                 floor: 1 + 4 passes
  heads --ablate-dormant     gates, importance, dormant heads, then their ablation
                                                                 floor: 1 + 1 (when a head is dormant)
  circuit                    norms, PCA, outliers, BOS experiments (2 settings x r = 1, 2, 4, 8)
                                                                 floor: 1 + 8 passes

The floor is counted, not assumed: every forward the runner makes is recorded (its pass, its
length and whether a probe of it reads the loss); the floor is one forward per distinct pass (a
second stage repeating the clean pass would be avoidable, so ``heads --ablate-dormant``'s floor is
1 + 1; it ran 3 until issue 28 and runs 2 since; column ``run``: the forwards made), each costed as the plain forward of the same shape: a plain SDPA forward with the last position's logits for a pass that reads no loss
(``plain``), with every position's logits and the cross-entropy for one that does (``plain+loss``);
both are timed at the window's length and scaled linearly to a pass's own length (the BOS passes
are up to 7 tokens shorter). ratio = the command's wall time / its floor.

Every probe of those commands is also timed alone (``run_probes``, batch 1) against the fused
capture alone (a probe that asks for attention records and reads nothing: sinkscope's attention
function on every layer, records built), per pass of the probe, so a slow probe shows by name.
That is done at the shortest length unless ``--probe-lengths`` says otherwise: every probe at
2,048 tokens adds about 9 minutes on this CPU.

Everything of one length runs in one process (``--worker``), interleaved over ``--repeats``
(the load of a shared machine then affects every variant alike); time is the median; memory is
the peak resident set during the call minus the resident set at its start (after returning freed
memory to the system), sampled every 2 ms. ``--quick``: 256 tokens, sinks and circuit, three
probes, one repeat (a smoke test of the script: 1.5 to 4 minutes on 2 shared cores). Each length's process runs under
an address-space cap (``--mem-limit-gb``). ``--jobs`` (default: one per free core at ``BENCH_THREADS``
threads each, at most one per length) runs the lengths' processes side by side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sinks import THREADS, PeakSampler, rss_mb  # noqa: E402  (same RSS sampling as bench_sinks.py)

COMMANDS = ["sinks", "inject", "heads", "circuit"]
#: the options each command runs with here (besides windows and progress)
COMMAND_OPTIONS = {
    "sinks": {},
    "inject": {"junk": ("same-context", "gaussian"), "cutoffs": ("median",), "doses": (0.8,), "draws": 2,
               "eval_batch": 1},
    "heads": {"ablate_dormant": True},
    "circuit": {},
}
LABELS = {"heads": "heads --ablate-dormant"}


def _trim() -> None:
    """Hand freed heap memory back to the system, so the next call's peak starts from what is live."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def worker(length: int, commands: list[str], repeats: int, probes_too: bool, probe_limit: int | None) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import sinkscope
    from sinkscope.forward import runner
    from sinkscope.capture import hooks as hp, ModelSpec
    from sinkscope.commands import get_command
    from sinkscope.data.corpus import bundled_corpus
    from sinkscope.probes import get_probe
    from sinkscope.probes.base import Probe
    from sinkscope.run.loaders import load_model
    from sinkscope.models.resolve import resolve_source

    torch.set_num_threads(THREADS)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    model, tok = loaded.model, loaded.tokenizer
    text = bundled_corpus().documents[0]
    corpus_ids = tok(text[:400_000], add_special_tokens=False).input_ids
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []

    def window(n):
        return np.array([bos + corpus_ids[:n - len(bos)]], dtype=np.int64)  # (1, n)

    spec = ModelSpec.from_model(model)
    own = model.config._attn_implementation

    # ---- the floor: plain forwards, and the runner's forwards counted -------------------------------
    def plain(ids_np, loss):
        model.set_attn_implementation("sdpa")
        ids = torch.from_numpy(ids_np)
        try:
            with torch.inference_mode():
                if loss:
                    logits = model(input_ids=ids, use_cache=False).logits  # (1, T, V)
                    F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
                else:
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)
        finally:
            model.set_attn_implementation(own)

    forwards: list[tuple[int, bool, str | None]] = []
    real_forward = runner._forward

    def counted(model_, ids_, dispatcher, **kwargs):
        forwards.append((int(ids_.shape[1]), hp.LOSS in dispatcher.observed, dispatcher.label))
        return real_forward(model_, ids_, dispatcher, **kwargs)

    runner._forward = counted

    class CaptureOnly(Probe):
        """Asks for attention records on the clean pass and reads nothing: the fused capture alone."""

        name, metrics, observers = "capture_only", {}, {hp.ATTN: "see"}

        def see(self, layer, record):
            pass

        def rows(self):
            return []

    # ---- the variants ---------------------------------------------------------------------------------
    variants: dict[str, callable] = {
        "plain": lambda: plain(window(length), False),
        "plain+loss": lambda: plain(window(length), True),
    }
    ids = window(length)
    for name in commands:
        options = dict(COMMAND_OPTIONS[name])
        variants[f"cmd:{name}"] = lambda name=name, options=options: sinkscope.measure(
            name, model, tok, windows=ids, progress=False, **options)
    probe_specs: dict[str, dict] = {}
    if probes_too:
        from sinkscope.run.measuring import available_probes

        for name in commands:
            command = get_command(name)
            opts = command.options(**{**COMMAND_OPTIONS[name], "seq_len": length, "n_seqs": 1})
            if name == "circuit":
                opts.bos_token_id = tok.bos_token_id
            for probe, params in available_probes(command, command.probes(opts, spec), spec, lambda m: None):
                probe_specs.setdefault(probe, params)
        names = list(probe_specs)[:probe_limit]
        variants["capture"] = lambda: runner.run_probes(model, ids, [CaptureOnly(spec)], batch_size=1,
                                                        progress=False)
        for probe in names:
            variants[f"probe:{probe}"] = lambda probe=probe: runner.run_probes(
                model, ids, [get_probe(probe)(spec, **probe_specs[probe])], batch_size=1, progress=False)

    # warm-up at 64 tokens: kernels chosen and checked, code paths run once
    plain(window(64), False)
    plain(window(64), True)
    for name in commands:
        try:
            sinkscope.measure(name, model, tok, windows=window(64), progress=False, **COMMAND_OPTIONS[name])
        except Exception:  # noqa: BLE001 - the timed call reports it
            pass

    times: dict[str, list[float]] = {k: [] for k in variants}
    peaks: dict[str, float] = {k: 0.0 for k in variants}
    passes: dict[str, list[tuple[int, bool, str | None]]] = {}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for key, call in variants.items():
            if key in errors:
                continue
            _trim()
            forwards.clear()
            start_rss = rss_mb()
            try:
                with PeakSampler() as sampler:
                    started = time.perf_counter()
                    call()
                    times[key].append(time.perf_counter() - started)
            except Exception as error:  # noqa: BLE001 - a refused or failed command is reported as such
                errors[key] = f"{type(error).__name__}: {str(error).splitlines()[0][:100] if str(error) else ''}"
                continue
            peaks[key] = max(peaks[key], sampler.peak - start_rss)
            passes[key] = list(forwards)
            print(f"# {length} {key} {times[key][-1]:.2f}s", file=sys.stderr, flush=True)
    return {"length": length, "threads": torch.get_num_threads(),
            "time_s": {k: statistics.median(v) for k, v in times.items() if v},
            "peak_mb": peaks, "passes": passes, "errors": errors}


def probe_lengths(args) -> list[int]:
    """The lengths at which every probe is also timed alone (``--probe-lengths``; default the shortest)."""
    return args.probe_lengths if args.probe_lengths else [min(args.lengths)]


def run_one(length: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(length), "--repeats", str(args.repeats),
           "--commands", *args.commands]
    if args.no_probes or length not in probe_lengths(args):
        cmd.append("--no-probes")
    if args.probe_limit is not None:
        cmd += ["--probe-limit", str(args.probe_limit)]

    def limit():
        cap = int(args.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if args.verbose else subprocess.PIPE,
                          text=True, preexec_fn=limit)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = ((proc.stderr or "").strip().splitlines() or ["no output"])[-1]
    return {"length": length, "error": f"process failed (exit {proc.returncode}): {tail[:100]}"}


def floor_of(passes: list, length: int, t_plain: float, t_loss: float) -> tuple[float, str, int]:
    """The unavoidable forwards: one per distinct pass (a second stage's repeat of the clean pass is
    avoidable), with the loss where any forward of that pass read it. Returns (seconds of the plain
    forwards of the same shapes, the count as 'n (k loss)', the forwards actually run)."""
    distinct: dict = {}
    for n, loss, *label in passes:
        key = label[0] if label else len(distinct)  # results without labels: every forward counts
        old = distinct.get(key, (0, False))
        distinct[key] = (max(n, old[0]), loss or old[1])
    seconds = sum((t_loss if loss else t_plain) * n / length for n, loss in distinct.values())
    with_loss = sum(1 for _, loss in distinct.values() if loss)
    return seconds, f"{len(distinct)}" + (f" ({with_loss} loss)" if with_loss else ""), len(passes)


def print_table(results: list[dict]) -> None:
    print(f"{'tokens':>6}  {'what':<24} {'time s':>8} {'peak +MB':>9} {'floor':>13} {'floor s':>8} {'ratio':>6} "
          f"{'run':>4}")
    for r in results:
        if "error" in r:
            print(f"{r['length']:>6}  {r['error']}")
            continue
        T, ts, peaks = r["length"], r["time_s"], r["peak_mb"]
        t_plain, t_loss = ts.get("plain", float("nan")), ts.get("plain+loss", float("nan"))
        for key in ("plain", "plain+loss"):
            if key in ts:
                print(f"{T:>6}  {key:<24} {ts[key]:>8.2f} {peaks[key]:>9.0f} {'1':>13} {ts[key]:>8.2f} {1.0:>6.2f}")
        for key in [k for k in ts if k.startswith("cmd:")] + [k for k in r["errors"] if k.startswith("cmd:")]:
            name = key[4:]
            label = LABELS.get(name, name)
            if key in r["errors"]:
                print(f"{T:>6}  {label:<24} {r['errors'][key]}")
                continue
            floor_s, count, ran = floor_of(r["passes"][key], T, t_plain, t_loss)
            print(f"{T:>6}  {label:<24} {ts[key]:>8.2f} {peaks[key]:>9.0f} {count:>13} {floor_s:>8.2f} "
                  f"{ts[key] / floor_s:>6.2f} {ran:>4}")
        if "capture" in ts:
            cap = ts["capture"]
            print(f"{T:>6}  {'capture alone':<24} {cap:>8.2f} {peaks['capture']:>9.0f} {'1':>13} {t_plain:>8.2f} "
                  f"{cap / t_plain:>6.2f}   (x plain)")
            for key in [k for k in ts if k.startswith("probe:")]:
                n = max(1, len(r["passes"][key]))
                with_loss = sum(1 for _, loss, *_ in r["passes"][key] if loss)
                # a pass that reads the loss also pays every position's logits: capture + (plain+loss - plain)
                base = cap * n + with_loss * (t_loss - t_plain)
                count = f"{n}" + (f" ({with_loss} loss)" if with_loss else "")
                print(f"{T:>6}  {'  ' + key[6:]:<24} {ts[key]:>8.2f} {peaks[key]:>9.0f} {count:>13} {base:>8.2f} "
                      f"{ts[key] / base:>6.2f}   (x capture per pass)")
            for key, error in r["errors"].items():
                if key.startswith("probe:"):
                    print(f"{T:>6}  {'  ' + key[6:]:<24} {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--commands", nargs="+", default=COMMANDS, choices=COMMANDS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-probes", action="store_true", help="skip the probes timed alone")
    parser.add_argument("--probe-limit", type=int, default=None, help="time only the first N probes alone")
    parser.add_argument("--probe-lengths", type=int, nargs="+", default=None,
                        help="lengths at which the probes are timed alone (default: the shortest of --lengths)")
    parser.add_argument("--quick", action="store_true", help="256 tokens, sinks and circuit, 3 probes, 1 repeat")
    parser.add_argument("--mem-limit-gb", type=float, default=20.0)
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--verbose", action="store_true", help="show each measurement as it finishes")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="only print the table of saved --json results")
    parser.add_argument("--jobs", type=int, default=None,
                        help="lengths measured side by side (default: CPUs // BENCH_THREADS, at most one per length)")
    parser.add_argument("--worker", type=int, metavar="LENGTH")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.commands, args.repeats, not args.no_probes, args.probe_limit)))
        return
    if args.table:
        results = []
        for path in args.table:
            with open(path) as handle:
                results += json.load(handle)
        print_table(results)
        return
    if args.quick:
        args.lengths, args.commands, args.repeats, args.probe_limit = [256], ["sinks", "circuit"], 1, 3
    print(f"SmolLM2-135M float32 on CPU ({THREADS} thread{'s' if THREADS != 1 else ''}), one window per length, "
          f"median of {args.repeats}; peak +MB = peak RSS during the call over its start; floor = plain SDPA "
          f"forwards of the same shapes (with every logit + loss where the pass reads the loss)", flush=True)
    jobs = args.jobs or max(1, (os.cpu_count() or 1) // THREADS)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(jobs, len(args.lengths)))) as pool:
        results = list(pool.map(lambda length: run_one(length, args), args.lengths))  # one process per length
    print_table(results)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
