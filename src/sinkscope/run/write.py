"""Stage 4 of a run: the tidy table and the manifest of a finished run (a ``run.result.Result``);
``Result.save`` writes them with the token ids into the run folder, atomically.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.models.fingerprint import weights_fingerprint
from sinkscope.capture.families import layer_windows
from sinkscope.data import corpus as corpus_mod
from sinkscope.errors import SinkscopeError
from sinkscope.models.resolve import Source
from sinkscope.probes.base import Probe, window_values
from sinkscope.run.load import Loaded
from sinkscope.run.loaders import model_config_summary
from sinkscope.run.prepare import Prepared
from sinkscope.run.result import Result
from sinkscope.store.results import base_manifest, layer_type_rows, NOT_CONDITIONS, rows_to_frame


def run_conditions(source: Source) -> dict:
    """Columns that hold for every row of a run: a trainer checkpoint's variant, seed, step, tier."""
    if source.kind != "checkpoint":
        return {}
    from sinkscope.models.checkpoint_folder import read_config

    meta = read_config(source.path)
    return {key: meta.get(key) for key in ("variant", "seed", "step", "tier")}


def assemble(prepared: Prepared, loaded: Loaded, probes: list[Probe], run_s: float, rows: list | None = None) -> Result:
    """The table and the manifest of a finished run (``rows``: the table's rows, if not the probes')."""
    options, windows, source = prepared.options, loaded.windows, prepared.source
    conditions = {**run_conditions(source), **prepared.conditions}
    rows = list(rows) if rows is not None else [row for probe in probes for row in probe.rows()]
    model = loaded.model
    windows_per_layer = layer_windows(model.model, loaded.spec.n_layers)
    rows += layer_type_rows(rows, windows_per_layer)
    if not rows:
        raise SinkscopeError(f"the {prepared.command.name} run produced no numbers on this model "
                             f"({', '.join(p.name for p in probes)}: nothing to measure); no run folder was written.")
    frame = rows_to_frame(rows, run_conditions=conditions)
    decode_token_ids(frame, model.tokenizer)
    manifest = base_manifest(prepared.command.name, asdict(options))
    manifest.update(
        model={
            "source": source.to_dict(),
            "float32_cache": model.cache_path,
            "family": loaded.spec.family,
            "spec": asdict(loaded.spec),
            "n_parameters": sum(p.numel() for p in model.model.parameters()),
            "weights_sample_sha256": weights_fingerprint(model.model),  # models/fingerprint.py
            "config": model_config_summary(model.model),
            "device_map": getattr(model.model, "hf_device_map", None),
            "layer_windows": windows_per_layer,
            **({"transformer_lens": model.model.record()} if hasattr(model.model, "record") else {}),
        },
        conditions=conditions,
        dtype=str(model.dtype).removeprefix("torch."),
        device=str(model.device),
        processes=prepared.world_size,
        corpus=_corpus_record(prepared, windows),
        windows={
            "seq_len": int(windows.tokens.shape[1]), "n_seqs": int(windows.tokens.shape[0]), "seed": options.seed,
            "bos_policy": options.bos, "bos_id": windows.bos_id, "tokens_sha256": windows.sha256,
            "tokenizer_bos_id": getattr(model.tokenizer, "bos_token_id", None),
            "rule": _window_rule(prepared),
            "trained_context": loaded.trained_context,
            "starts": [list(s) for s in windows.starts],
            **({"inputs": prepared.inputs_record} if prepared.inputs_record else {}),
        },
        probes={p.name: {"options": p.options(), "metrics": {m: asdict(i) for m, i in p.metrics.items()}}
                for p in probes},
        kernels=_kernel_choices(),
        capture_check=loaded.capture_check,
        timing={"load_s": round(loaded.load_s, 3), "run_s": round(run_s, 3),
                "tokens_per_s": round(windows.tokens.size / max(run_s, 1e-9), 1)},
        plan=None if prepared.plan is None else prepared.plan.to_dict(),  # what produced the run (plan.Plan)
    )
    arrays = {name: array for probe in probes for name, array in probe.arrays().items()}
    metrics, values = window_values(probes)
    if metrics:
        arrays["window_values"] = values
        manifest["window_values"] = {"metrics": metrics, "rows": "layers 0 .. L - 1, then the model value",
                                     "windows": int(values.shape[-1])}
    return Result(frame, manifest, windows.tokens, arrays=arrays)



def assemble_lengths(prepared: Prepared, loaded: Loaded, finished: list) -> Result:
    """One table over the lengths (a ``seq_len`` column on every row) plus the leak-model fit.

    The manifest is the run's at its longest length (its tokens are the longest windows; the
    shorter ones are their prefixes), with ``windows.seq_lens`` listing every length.
    """
    from sinkscope.stats.leak import LEAK_METRICS, P0_ERROR_NOT_REPORTED, error_not_reported, leak_rows

    rows = [replace(row, conditions=(*row.conditions, ("seq_len", n)))
            for n, probes, _ in finished for probe in probes for row in probe.rows()]
    windows = layer_windows(loaded.model.model, loaded.spec.n_layers)
    rows += leak_rows(rows, windows)
    longest_n, probes, _ = finished[-1]
    run_s = sum(seconds for _, _, seconds in finished)
    result = assemble(prepared, loaded, probes, run_s, rows=rows)
    result.manifest["windows"]["seq_lens"] = [n for n, _, _ in finished]
    result.manifest["timing"]["run_s_per_length"] = {str(n): round(s, 3) for n, _, s in finished}
    if any(row.probe == "leak_fit" for row in rows):
        exempt = error_not_reported(windows, finished[0][0])
        result.manifest["probes"]["leak_fit"] = {"options": {"fitted_at": finished[0][0], **(
            {"p0_error_not_reported": {"layers": exempt, "reason": P0_ERROR_NOT_REPORTED}} if exempt else {})},
                                                 "metrics": {m: asdict(i) for m, i in LEAK_METRICS.items()}}
    return result


def _warn_non_finite(table: pd.DataFrame, log) -> None:
    """A table with NaN or infinite values is written, with a warning naming where they are."""
    bad = table[~np.isfinite(table["value"].to_numpy(dtype=float))]
    if bad.empty:
        return
    extra = [c for c in table.columns if c not in NOT_CONDITIONS]
    first = bad.iloc[0]
    where = ", ".join(f"{c} {first[c]}" for c in extra if not pd.isna(first[c]))
    log(f"warning: {len(bad)} of the {len(table)} numbers are not finite (NaN or inf), the first {first['metric']}"
        f"{f' at {where}' if where else ''}; the model's arithmetic overflowed there (a dose or a --dtype too large "
        "for it).")


def _kernel_choices() -> list[dict]:
    """Which fused attention kernel ran for each kind of call (capture/kernels.py), for the manifest."""
    from sinkscope.capture.kernels import kernel_choices

    return kernel_choices()


def decode_token_ids(frame: pd.DataFrame, tokenizer) -> None:
    """Rows that carry a ``token_id`` (per-token rows, e.g. ``token_gate``) get its text in ``token``.

    The column goes right after ``token_id``: ``tokenizer.decode([id])`` as the model's tokenizer
    writes that one token (special tokens kept, no clean-up); empty without a tokenizer.
    """
    if "token_id" not in frame.columns:
        return
    ids = frame["token_id"]
    texts = [None if pd.isna(i) or tokenizer is None else
             tokenizer.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    frame["token_id"] = ids.astype("Int64")
    frame.insert(frame.columns.get_loc("token_id") + 1, "token", pd.Series(texts, dtype="string", index=frame.index))


def _corpus_record(prepared: Prepared, windows: corpus_mod.Windows) -> dict | None:
    corpus = prepared.corpus
    if prepared.inputs_record:  # no text was read
        return {"kind": f"{prepared.inputs_record['kind']} tokens", "name": prepared.inputs_record["kind"], "n_tokens": 0}
    if prepared.checkpoint_split:
        return {"kind": "checkpoint validation split", "checkpoint": prepared.source.location,
                "checkpoint_abs_path": str(Path(prepared.source.path).resolve()), "n_tokens": windows.n_corpus_tokens}
    if corpus is None:
        return None
    return {**corpus.info, "name": corpus.name, "sha256": corpus.sha256, "n_documents": len(corpus.documents),
            "n_tokens": windows.n_corpus_tokens}


def _window_rule(prepared: Prepared) -> str:
    if prepared.inputs_record:
        return prepared.inputs_record["rule"] + " (seeded by seed); BOS prepended when bos_id is set"
    if prepared.checkpoint_split:
        return ("the checkpoint's validation split under the window policy it was trained with "
                "(sinkscope.train.tasks.checkpoint_windows, seeded by seed); the BOS policy is the task's")
    if prepared.corpus is None:
        return "token ids given by the caller"
    return ("non-overlapping per-document chunks, drawn without replacement by numpy.random.default_rng(seed), "
            "kept in corpus order; BOS prepended when bos_id is set")
