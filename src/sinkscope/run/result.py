"""What a measurement gives the caller: a :class:`Result` (one run) or a :class:`ComparisonResult`
(several models, or one model's revisions), in memory until saved.

``Result.save(path)`` writes a run folder atomically under its lock; ``report(path)`` adds its
page. ``ComparisonResult`` holds one Result per run; ``report(path)`` writes a folder holding one run
folder per model and the comparison page, as ``sinkscope sinks A B --out path`` does.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.store.explorer_format import FILE as EXPLORER_FILE
from sinkscope.store.explorer_format import ExplorerData, read_npy
from sinkscope.store.results import lock_run_dir, staged_run_dir, write_tables


def _draw_report(stage: Path, out_dir: Path) -> None:
    """report.html into the staging folder. A report that fails to draw costs the report, never the
    measurement: the table, manifest and tokens are written all the same, and one sentence on
    stderr says how to draw it again (``sinkscope report RUN``)."""
    from sinkscope.report import build_report

    try:
        build_report([stage], out=stage, labels=[out_dir.name], shown_paths=[out_dir])
    except SinkscopeError:
        raise
    except Exception as error:  # noqa: BLE001 - a drawing bug must not throw away hours of measurement
        first = str(error).splitlines()[0][:200] if str(error) else "no message"
        print(f"warning: the report could not be drawn ({type(error).__name__}: {first}); the results are written in "
              f"{out_dir}, and `sinkscope report {out_dir}` draws it again. Please report this.", file=sys.stderr)


@dataclass
class Result:
    """What a measurement produced: the tidy table, the manifest and the exact token ids.

    ``save(path)`` writes a run folder (atomically); ``report(path)`` writes it with its
    ``report.html`` and returns the page's path.
    """

    table: pd.DataFrame
    manifest: dict
    tokens: np.ndarray
    path: Path | None = None
    #: further arrays of the run, written as ``<name>.npy`` (``stream_nll``: every token's NLL).
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    #: the report's explorer: a few heads' attention patterns (``store/explorer_format.py``), or None.
    explorer: ExplorerData | None = None

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        """The result a run folder holds (its table, manifest and token ids; no pickle is read).

        tokens.npy and explorer.npz are checked against the manifest before they are read: tokens.npy
        must be integers of the manifest's ``(n_seqs, seq_len)`` and no longer than its header says
        (``explorer_data.read_npy``), so a planted file is one sentence, never gigabytes allocated.
        """
        from sinkscope.store.files import read_json
        from sinkscope.store.results import read_results

        path = Path(path)
        manifest = read_json(path / "manifest.json", "the run's manifest")
        tokens = _read_tokens(path / "tokens.npy", manifest)
        explorer = ExplorerData.load(path / EXPLORER_FILE, manifest if isinstance(manifest, dict) else None) \
            if (path / EXPLORER_FILE).is_file() else None
        return cls(read_results(path), manifest, tokens, path, explorer=explorer)

    def save(self, path: str | Path, *, overwrite: bool = False, figures: bool = True) -> Path:
        """Write the run folder at ``path`` (table, manifest, tokens; with ``figures`` the report).

        The folder is locked while it is written (a second writer fails with one sentence);
        ``overwrite`` replaces only a run folder or an empty folder.
        """
        out_dir = Path(path)
        self._check_place(out_dir)
        with contextlib.ExitStack() as stack:
            if not _holds_lock(out_dir):
                stack.enter_context(lock_run_dir(out_dir))
            with staged_run_dir(out_dir, overwrite) as stage:
                write_tables(stage, self.table, self.manifest, self.tokens, self.arrays)
                if self.explorer is not None:
                    self.explorer.save(stage / EXPLORER_FILE)
                if figures:
                    _draw_report(stage, out_dir)
        self.path = out_dir
        return out_dir

    def _check_place(self, out_dir: Path) -> None:
        """Refuse what the command line refuses: the working folder (or one above it), and a folder inside
        (or holding) the model or the text file the run read (``fileio.check_inputs_outside``)."""
        from sinkscope.store.files import check_inputs_outside, check_not_cwd

        model = self.manifest.get("model") if isinstance(self.manifest.get("model"), dict) else {}
        source = model.get("source") if isinstance(model.get("source"), dict) else {}
        corpus = self.manifest.get("corpus") if isinstance(self.manifest.get("corpus"), dict) else {}
        check_not_cwd(out_dir, "save() needs", "runs/NAME")
        check_inputs_outside(out_dir, {"the model": source.get("path") if isinstance(source.get("path"), str) else None,
                                       "the text file": corpus.get("abs_path") if isinstance(corpus.get("abs_path"), str)
                                       else None}, flag="save()'s path")

    def report(self, path: str | Path | None = None, *, overwrite: bool = False) -> Path:
        """The run's ``report.html``: writes the run folder at ``path`` first unless already saved there."""
        if path is not None and (self.path is None or Path(path) != self.path):
            self.save(path, overwrite=overwrite)
        if self.path is None:
            raise SinkscopeError("give report() a folder to write the run into.")
        page = self.path / "report.html"
        if not page.is_file():
            from sinkscope.report import build_report

            build_report([self.path], out=self.path, labels=[self.path.name])
        return page

    def show(self, *, height: int = 900):
        """The attention explorer of this run (``docs/explorer.md``), inline in a notebook.

        In Jupyter (IPython) the explorer is displayed in an isolated frame of ``height`` pixels; elsewhere
        it is written to a temporary HTML file whose path is printed and returned (None in a notebook).
        A run measured with ``explore_heads="none"`` or ``explore_windows=0`` has no explorer: one sentence.
        """
        import html as html_mod

        from sinkscope.report.explorer_page import standalone

        if self.explorer is None:
            raise SinkscopeError("this result holds no attention patterns to show; measure with explore_windows >= 1 "
                                 "and explore_heads other than 'none'.")
        label = self.path.name if self.path is not None else str(self.manifest.get("command", "run"))
        page = standalone(label, self.table, self.manifest, self.explorer)
        frame = (f'<iframe srcdoc="{html_mod.escape(page, quote=True)}" style="width:100%;height:{int(height)}px;'
                 'border:1px solid #ddd" sandbox="allow-scripts"></iframe>')
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display
        except ImportError:
            get_ipython = None
        if get_ipython is not None and get_ipython() is not None:
            display(HTML(frame))
            return None
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".html", prefix="sinkscope-explorer-", delete=False,
                                         encoding="utf-8") as handle:
            handle.write(page)
        print(f"The explorer is in {handle.name}; open it in a browser.")
        return Path(handle.name)

    def __repr__(self) -> str:
        return (f"Result({self.manifest.get('command')!r}, {len(self.table)} rows, "
                f"tokens {tuple(self.tokens.shape)}{f', at {self.path}' if self.path else ''})")


#: run folders whose lock this process holds (taken in plan, released when the run is written).
_LOCKED: set[Path] = set()


def _read_tokens(file: Path, manifest) -> np.ndarray:
    """tokens.npy, checked against the manifest's windows before it is read (one sentence naming the file)."""
    windows = manifest.get("windows") if isinstance(manifest, dict) else None
    shape = None
    if isinstance(windows, dict):
        sizes = [windows.get("n_seqs"), windows.get("seq_len")]
        if all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
            shape = tuple(sizes)
    try:
        return read_npy(file, shape, "iu", "the token ids")
    except FileNotFoundError:
        raise SinkscopeError(f"{file.parent} holds no tokens.npy, so it is not a complete run folder; rerun the "
                             "measurement.") from None
    except (OSError, ValueError, EOFError) as error:
        raise SinkscopeError(f"the token ids at {file} are damaged ({error}); rerun the measurement.") from None


def _holds_lock(out_dir: Path) -> bool:
    return Path(os.path.abspath(out_dir)) in _LOCKED


@contextlib.contextmanager
def _locked(out_dir: Path):
    """``lock_run_dir`` for the whole run, remembered so that ``Result.save`` does not take it twice."""
    key = Path(os.path.abspath(out_dir))
    with lock_run_dir(out_dir):
        _LOCKED.add(key)
        try:
            yield
        finally:
            _LOCKED.discard(key)


@dataclass
class ComparisonResult:
    """Several runs compared (``sinkscope.measure(command, [A, B])`` or ``revisions=[...]``).

    Attributes:
        results: one :class:`Result` per run, in the plans' order.
        names: each run's folder name inside a saved comparison (the model's or the revision's).
        labels: each run's name on the page.
        series: the runs are one model's checkpoints (the page draws every metric against the step).
        group_by: the condition column whose runs the page averages, or None.
    """

    results: list[Result]
    names: list[str]
    labels: list[str]
    series: bool = False
    group_by: str | None = None
    path: Path | None = None

    @property
    def table(self) -> pd.DataFrame:
        """Every run's rows as one table, with a ``run`` column (its label) first after ``probe``."""
        frames = []
        for label, result in zip(self.labels, self.results):
            frame = result.table.copy()
            frame.insert(0, "run", label)
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)

    def report(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write one run folder per run into ``path`` and the comparison page; returns the page."""
        from sinkscope.run.plan import check_comparison_dir
        from sinkscope.report import build_report

        parent = Path(path)
        check_comparison_dir(parent, overwrite, False)
        children = [parent / name for name in self.names]
        for result, child in zip(self.results, children):
            result.save(child, overwrite=overwrite, figures=False)
        from sinkscope.store.files import write_inventory

        write_inventory(parent, "comparison")
        page = build_report(children, out=parent, labels=self.labels, group_by=self.group_by, overwrite=True)
        self.path = parent
        return page

    def __repr__(self) -> str:
        return f"ComparisonResult({len(self.results)} runs: {', '.join(self.labels)})"
