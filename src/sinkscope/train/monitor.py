"""Sinks through training: measure a model's sink probes every N steps of any training loop.

    from sinkscope.train.monitor import SinkMonitor

    monitor = SinkMonitor(every=100, windows=val_ids[:8], out="runs/monitor")   # fixed once
    for step in range(steps):
        ...                                                   # the loop's own forward/backward/step
        monitor.step(model, step + 1)                         # measures when (step + 1) % 100 == 0

    Trainer(..., callbacks=[SinkMonitor(every=100, windows=val_ids[:8])])   # it is a TrainerCallback

Every measurement runs the named probes (``p0_mass``, ``phantom_mass`` and ``value_norm_ratio``
by default) over the **same token windows** (given as ``windows`` or cut once from ``texts``),
with the fused capture, under ``torch.no_grad`` (not inference mode, so nothing the model caches
during the pass becomes an inference tensor its next training step cannot use), in eval mode.
Afterwards the model's mode and attention implementation are what they were. The numbers are
those ``sinkscope.measure(probes, checkpoint, windows=...)`` gives on the checkpoint saved at
that step (tests): the same probes, the same definitions (SPEC.md), the same tidy rows.

The table grows in ``out/monitor.csv``: ``step, probe, metric, layer, head, value, n, se`` (per
head, per layer and model rows, as in a run's ``results.csv``, ``se`` the standard error over the
windows), one block of rows per measured step, appended and flushed; a table written before ``se``
existed gets the column (empty) when a monitor continues it. ``p0_mass`` brings
``sink_head_share``, the share of heads whose p0 mass exceeds 0.5 (SPEC.md "Share of sink heads"). ``out/monitor.json`` records the probes, ``every`` and the windows'
sha256, ``out/monitor_tokens.npy`` the exact ids, and ``out/monitor_windows.npz`` each measured step's
per-window layer means and model values (``steps`` (S,), ``metrics`` (M,), ``values`` (S, M, L + 1, n)
float32), from which :meth:`SinkMonitor.emergence` gives the step where a metric emerges, with its
bootstrap interval over the windows (SPEC.md "The emergence step"). A folder holding a ``monitor.csv`` of
other probes or windows is refused, never appended to; a resumed run drops the rows after its
checkpoint (``truncate``).

Under data parallelism (``torch.distributed`` initialised) rank 0 measures and writes; the other
ranks skip (their replicas hold the same weights). The model handed in may be wrapped
(``DistributedDataParallel``, ``torch.compile``): its ``module`` / ``_orig_mod`` is measured.
A sharded model (FSDP) is not supported: its forward needs every rank.

Loggers: :meth:`scalars` turns a step's rows into ``{"sinks/p0_mass": ..., "sinks/p0_mass/layer_3": ...}``
(model and per-layer means). The monitor is a transformers ``TrainerCallback``: passed as
``Trainer(..., callbacks=[monitor])`` like ``EarlyStoppingCallback``, it measures at step 0 and
every ``every`` steps and logs the scalars as ``Trainer.log`` does: into ``state.log_history`` and
through the Trainer's callback handler's ``on_log``, so every ``report_to`` logger (TensorBoard,
W&B, ...) sees them. The handler is the one that calls the monitor's ``on_train_begin`` (found then,
once); a monitor driven by something else than a ``Trainer`` falls back to ``log_history`` only.
``trainer.add_callback(monitor.callback(trainer))`` still works and logs through ``trainer.log``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from transformers.trainer_callback import CallbackHandler, TrainerCallback

from sinkscope.errors import SinkscopeError

#: what the monitor measures when no probes are named: the sink-formation curves of issue 29.
DEFAULT_PROBES = ("p0_mass", "phantom_mass", "value_norm_ratio")
#: measure every this many steps when ``every`` is not given.
DEFAULT_EVERY = 100
TABLE = "monitor.csv"
MANIFEST = "monitor.json"
TOKENS = "monitor_tokens.npy"
#: each measured step's per-window values (the emergence step's bootstrap, ``stats/emergence.py``).
WINDOWS = "monitor_windows.npz"
COLUMNS = ("step", "probe", "metric", "layer", "head", "value", "n", "se")


def _unwrap(model):
    """The module that holds the weights: DDP's ``module``, torch.compile's ``_orig_mod``."""
    for attribute in ("module", "_orig_mod"):
        inner = getattr(model, attribute, None)
        if inner is not None and hasattr(inner, "parameters") and type(model).__name__ in (
                "DistributedDataParallel", "DataParallel", "OptimizedModule"):
            return _unwrap(inner)
    return model


def _rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def windows_from_texts(texts: Sequence[str], tokenizer, *, seq_len: int, n_seqs: int, seed: int = 0) -> np.ndarray:
    """(n_seqs, seq_len) int64 windows cut from ``texts`` by the pipeline's rule (``corpus.make_windows``)."""
    from sinkscope.data.corpus import make_windows, resolve_bos, tokenize_documents

    return make_windows(tokenize_documents(tokenizer, list(texts)), seq_len=seq_len, n_seqs=n_seqs, seed=seed,
                        bos_id=resolve_bos("auto", tokenizer)).tokens


def _whole(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int of at least ``minimum`` (numpy integers too), or one sentence naming ``name=``."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise SinkscopeError(f"{name}= must be a whole number of at least {minimum} (got {value!r}).")
    return int(value)


def _token_ids(windows) -> np.ndarray:
    """``windows`` as (n_seqs, seq_len) int64 token ids (whole, non-negative, n_seqs >= 1, seq_len >= 2)."""
    try:
        array = np.asarray(windows.detach().cpu() if hasattr(windows, "detach") else windows)
    except (ValueError, TypeError) as error:  # ragged lists
        raise SinkscopeError(f"windows= must be token ids of shape (n_seqs, seq_len), not a ragged list ({error}).") \
            from None
    if array.dtype.kind not in "iu" and not (array.dtype.kind == "f" and array.size and np.isfinite(array).all()
                                             and (array == np.round(array)).all()):
        raise SinkscopeError(f"windows= must hold whole token ids, not {array.dtype} values.")
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 2:
        raise SinkscopeError(f"windows= must be token ids of shape (n_seqs >= 1, seq_len >= 2), not {array.shape}.")
    if array.min() < 0:
        raise SinkscopeError(f"windows= holds a negative token id ({int(array.min())}).")
    return array.astype(np.int64)


class SinkMonitor(TrainerCallback):
    """Sink probes on fixed windows every ``every`` steps of a training loop (module docstring).

    Args:
        probes: registered probe names (``sinkscope ls probes``).
        every: measure at the steps divisible by it (step 0 included).
        windows: token ids (n_seqs, seq_len), fixed for the whole training.
        texts: or documents to cut the windows from, once (``corpus.make_windows``'s rule).
        tokenizer: the tokenizer that cuts ``texts``.
        seq_len: tokens per window cut from ``texts``.
        n_seqs: windows cut from ``texts``.
        seed: the draw of the windows cut from ``texts``.
        out: folder of the table (None: rows are only returned and kept in ``frames``).
        batch_size: windows per forward pass.
        attention: ``"fused"`` (default) or ``"explicit"``.
    """

    def __init__(self, probes: Sequence[str] = DEFAULT_PROBES, *, every: int = DEFAULT_EVERY, windows=None,
                 texts: Sequence[str] | None = None, tokenizer=None, seq_len: int = 128, n_seqs: int = 8,
                 seed: int = 0, out: str | Path | None = None, batch_size: int = 4, attention: str = "fused"):
        from sinkscope.probes import get_probe

        probes = (probes,) if isinstance(probes, str) else probes
        if not isinstance(probes, (list, tuple)) or not probes or not all(isinstance(p, str) for p in probes):
            raise SinkscopeError(f"probes= takes probe names (a list of strings, see sinkscope ls probes), not "
                                 f"{probes!r}.")
        every, batch_size = _whole("every", every), _whole("batch_size", batch_size)
        if (windows is None) == (texts is None):
            raise SinkscopeError("give the monitor either windows= (token ids) or texts= (with tokenizer=), once.")
        if texts is not None:
            if tokenizer is None:
                raise SinkscopeError("texts= needs tokenizer= to cut its windows.")
            if not isinstance(texts, str) and not (isinstance(texts, (list, tuple)) and texts
                                                   and all(isinstance(t, str) for t in texts)):
                raise SinkscopeError("texts= takes a string or a list of strings (the documents to cut windows from).")
            windows = windows_from_texts([texts] if isinstance(texts, str) else texts, tokenizer,
                                         seq_len=_whole("seq_len", seq_len, 2), n_seqs=_whole("n_seqs", n_seqs),
                                         seed=_whole("seed", seed, 0))
        tokens = _token_ids(windows)
        for name in probes:
            get_probe(name)  # one sentence for an unknown name, before training starts
        if attention not in ("fused", "explicit"):
            raise SinkscopeError(f"attention must be 'fused' or 'explicit', not {attention!r}.")
        if out is not None and (not isinstance(out, (str, Path)) or not str(out).strip()):
            raise SinkscopeError(f"out= takes a folder path (or None to keep the rows in memory), not {out!r}.")
        self.probes, self.every, self.tokens = tuple(probes), every, tokens
        self.batch_size, self.attention = batch_size, attention
        self.out = Path(out).expanduser() if out is not None else None
        self.frames: list = []  # every measured step's rows, in memory (pandas DataFrames)
        self._spec = None
        self._spec_of = None
        self._last_step: int | None = None  # a step is measured once (Lightning calls per micro-batch)
        self._handler: CallbackHandler | None = None  # the Trainer's, found at on_train_begin
        #: each measured step's (metric names, (M, L + 1, n) per-window values), in step order
        self.window_steps: dict[int, tuple[list[str], np.ndarray]] = {}
        self._last_windows: tuple[list[str], np.ndarray | None] = ([], None)
        if self.out is not None and _rank() == 0:
            self._open()

    # ---- the folder -------------------------------------------------------------------------------
    @property
    def sha256(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.tokens).tobytes()).hexdigest()

    def _manifest(self) -> dict:
        return {"probes": list(self.probes), "every": self.every, "windows_sha256": self.sha256,
                "windows": list(self.tokens.shape), "attention": self.attention}

    def _open(self) -> None:
        """Create ``out`` (or check that its table is this monitor's: same probes and windows)."""
        from sinkscope.store.files import atomic_write_bytes, atomic_write_text, read_json

        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SinkscopeError(f"could not create the monitor's folder {self.out} ({error.strerror or error}); give "
                                 "out= a folder you can write.") from error
        table, manifest = self.out / TABLE, self.out / MANIFEST
        if table.exists() or manifest.exists():
            held = read_json(manifest, "the monitor's manifest", expect=dict, missing_ok=True,
                             hint="give the monitor another out= folder")
            mine = self._manifest()
            if held is None or any(held.get(k) != mine[k] for k in ("probes", "windows_sha256")):
                raise SinkscopeError(f"{self.out} already holds a monitor table of other probes or windows (or one "
                                     "sinkscope did not write); give the monitor another out= folder.")
            self._add_se_column(table)
            self._read_windows()
            return  # the same monitor, continued (a resumed training): rows are appended
        atomic_write_text(manifest, json.dumps(self._manifest(), indent=2) + "\n")
        import io

        buffer = io.BytesIO()
        np.save(buffer, self.tokens)
        atomic_write_bytes(self.out / TOKENS, buffer.getvalue())
        with open(table, "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerow(COLUMNS)

    @staticmethod
    def _add_se_column(table: Path) -> None:
        """A table written before ``se`` existed gets the column, empty, before rows with it are appended."""
        from sinkscope.store.files import atomic_write_text

        if not table.exists():
            return
        with open(table, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        if not rows or tuple(rows[0]) == COLUMNS or tuple(rows[0]) != COLUMNS[:-1]:
            return
        lines = [",".join(COLUMNS)] + [",".join(r + [""]) for r in rows[1:] if r]
        atomic_write_text(table, "\n".join(lines) + "\n")

    def truncate(self, after_step: int) -> None:
        """Drop the table's rows of steps after ``after_step`` (a training resumed from its checkpoint there)."""
        if self.out is None or _rank() != 0 or not (self.out / TABLE).exists():
            return
        from sinkscope.store.files import atomic_write_text

        with open(self.out / TABLE, newline="", encoding="utf-8") as handle:
            rows = [r for r in csv.reader(handle)]
        kept = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= after_step]
        lines = [",".join(r) for r in kept]
        atomic_write_text(self.out / TABLE, "\n".join(lines) + "\n")
        self.window_steps = {step: held for step, held in self.window_steps.items() if step <= after_step}
        self._write_windows()

    def _read_windows(self) -> None:
        """The per-window values of a continued monitor's earlier steps (none if the file is missing or damaged)."""
        path = self.out / WINDOWS
        if not path.is_file():
            return
        try:
            with np.load(path, allow_pickle=False) as held:
                steps, metrics, values = held["steps"], [str(m) for m in held["metrics"]], held["values"]
        except (OSError, ValueError, KeyError):
            return
        if values.ndim == 4 and values.shape[:2] == (len(steps), len(metrics)):
            self.window_steps = {int(step): (metrics, values[k]) for k, step in enumerate(steps)}

    def _write_windows(self) -> None:
        """``monitor_windows.npz``, atomically: every kept step whose values have the latest step's metrics and shape."""
        if self.out is None or not self.window_steps:
            return
        import io

        from sinkscope.store.files import atomic_write_bytes

        last_metrics, last_values = self.window_steps[max(self.window_steps)]
        steps = sorted(step for step, (metrics, values) in self.window_steps.items()
                       if metrics == last_metrics and values.shape == last_values.shape)
        buffer = io.BytesIO()
        np.savez(buffer, steps=np.asarray(steps, dtype=np.int64), metrics=np.asarray(last_metrics),
                 values=np.stack([self.window_steps[step][1] for step in steps]).astype(np.float32))
        atomic_write_bytes(self.out / WINDOWS, buffer.getvalue())

    def emergence(self, metric: str = "p0_mass", *, layer: int | None = None, threshold: float | None = None):
        """The step where ``metric`` (the model value, or ``layer``'s mean over heads) emerges over the steps measured
        so far, with its 95% bootstrap interval over the monitor's windows (``stats.emergence.Emergence``, SPEC.md
        "The emergence step"); one sentence when fewer than 2 steps or no per-window values of it are kept."""
        from sinkscope.stats.emergence import emergence

        steps = sorted(step for step, (metrics, _) in self.window_steps.items() if metric in metrics)
        if len(steps) < 2:
            raise SinkscopeError(f"the monitor holds the per-window values of {metric!r} at {len(steps)} step(s); the "
                                 "emergence step needs 2 or more (a probe that measures it, every= steps apart).")
        row = -1 if layer is None else int(layer)
        values = np.stack([self.window_steps[step][1][self.window_steps[step][0].index(metric), row]
                           for step in steps])  # (K, n)
        return emergence(np.asarray(steps, dtype=float), values, threshold)

    # ---- measuring --------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return step % self.every == 0

    def step(self, model, step: int, *, force: bool = False):
        """Measure ``model`` at ``step`` when it is due (or ``force``); the rows as a DataFrame, else None.

        Only rank 0 measures; other ranks return None.
        """
        if not (force or self.due(step)) or _rank() != 0 or step == self._last_step:
            return None
        self._last_step = int(step)
        frame = self.measure(model)
        frame.insert(0, "step", int(step))
        self.frames.append(frame)
        metrics, values = self._last_windows
        if values is not None:
            self.window_steps[int(step)] = (metrics, values)
        if self.out is not None:
            with open(self.out / TABLE, "a", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                for row in frame.reindex(columns=list(COLUMNS)).itertuples(index=False):
                    writer.writerow(["" if _missing(v) else v for v in row])
                handle.flush()
            self._write_windows()
        return frame

    def measure(self, model):
        """The probes' rows on the monitor's windows (a DataFrame without ``step``); the model left as it was."""
        import torch

        from sinkscope.capture.families import ModelSpec
        from sinkscope.probes import get_probe
        from sinkscope.probes.base import window_values
        from sinkscope.store.results import rows_to_frame
        from sinkscope.forward.runner import run_probes

        model = _unwrap(model)
        if self._spec_of is not model:  # discovery traces one forward pass: once per model
            self._spec, self._spec_of = ModelSpec.from_model(model), model
        probes = [get_probe(name)(self._spec) for name in self.probes]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                run_probes(model, self.tokens, probes, batch_size=self.batch_size, progress=False,
                           attention=self.attention, inference=False, log=lambda _m: None)
        finally:
            model.train(was_training)
        frame = rows_to_frame([row for probe in probes for row in probe.rows()])
        self._last_windows = window_values(probes)  # after rows(): each accumulator knows its metric
        return frame[[c for c in COLUMNS if c != "step" and c in frame.columns]].copy()

    @staticmethod
    def scalars(frame, prefix: str = "sinks") -> dict[str, float]:
        """Model and per-layer means of a step's rows, for a logger: ``{prefix/metric[/layer_l]: value}``."""
        out: dict[str, float] = {}
        layers = frame[frame["head"].isna()]
        for row in layers.itertuples(index=False):
            if _missing(row.value):
                continue
            key = f"{prefix}/{row.metric}" if _missing(row.layer) else f"{prefix}/{row.metric}/layer_{int(row.layer)}"
            out[key] = float(row.value)
        return out

    def callback(self, trainer=None):
        """A transformers ``TrainerCallback`` measuring at step 0 and every ``every`` steps.

        With ``trainer``, the scalars go through ``trainer.log`` (its ``report_to`` loggers and
        ``log_history``); without it, into ``state.log_history`` only. The monitor is itself a
        callback (``Trainer(callbacks=[monitor])``); this form is kept for code written before.
        """
        return _trainer_callback(self, trainer)

    # ---- the TrainerCallback -----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        caller = sys._getframe(1).f_locals.get("self")  # CallbackHandler.call_event, which is calling us
        if isinstance(caller, CallbackHandler) and any(c is self for c in caller.callbacks):
            self._handler = caller
        if state.global_step == 0:
            self._log_step(args, state, control, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._log_step(args, state, control, model)

    def _log_step(self, args, state, control, model) -> None:
        """Measure when due, then log the scalars as ``Trainer.log`` does (module docstring)."""
        frame = self.step(model, state.global_step)
        if frame is None:
            return
        logs = self.scalars(frame)
        state.log_history.append({**logs, "step": state.global_step})
        if self._handler is not None:  # every callback's on_log, the report_to loggers included
            self._handler.on_log(args, state, control, dict(logs))

    def lightning_callback(self):
        """A Lightning ``Callback`` (needs ``lightning``): measures on ``on_train_batch_end`` at ``trainer.global_step``."""
        try:
            from lightning.pytorch.callbacks import Callback
        except ImportError as error:
            raise SinkscopeError("the Lightning callback needs `pip install lightning`; the monitor itself does "
                                 "not.") from error
        monitor = self

        class SinkMonitorLightning(Callback):
            def on_train_start(self, trainer, pl_module):
                self._log(trainer, monitor.step(pl_module, trainer.global_step))

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self._log(trainer, monitor.step(pl_module, trainer.global_step))

            @staticmethod
            def _log(trainer, frame):
                if frame is not None and trainer.logger is not None:
                    trainer.logger.log_metrics(monitor.scalars(frame), step=trainer.global_step)

        return SinkMonitorLightning()


def _missing(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _trainer_callback(monitor: SinkMonitor, trainer):
    from transformers import TrainerCallback

    class SinkMonitorCallback(TrainerCallback):
        """sinkscope's sink probes every ``monitor.every`` steps (``sinkscope.train.monitor``)."""

        def _measure(self, state, model):
            frame = monitor.step(model, state.global_step)
            if frame is None:
                return
            logs = monitor.scalars(frame)
            if trainer is not None:
                trainer.log(dict(logs))
            else:
                state.log_history.append({**logs, "step": state.global_step})

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0:
                self._measure(state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self._measure(state, model)

    return SinkMonitorCallback()
