"""``sinkscope explore``: one text's attention explorer (docs/explorer.md).

The window is the text itself (``--text`` or ``--text-file``; its first ``--seq-len`` tokens,
4,096 by default or the model's context if shorter; BOS by ``--bos``), measured as every command
is (a run folder with its table, manifest and tokens.npy) with the probes that colour the
explorer's heads grid: position-0 mass, phantom mass and the value-norm ratio. Its report is the
explorer page: the patterns of ``--explore-heads`` (auto: a seeded sample, then the other heads of
highest position-0 mass) on that one window.
"""

from __future__ import annotations

from dataclasses import dataclass

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions

#: the probes ``explore`` runs (the heads grid's colourings), in table order.
EXPLORE_PROBES: tuple[str, ...] = ("p0_mass", "phantom_mass", "value_norm_ratio")


@dataclass
class ExploreOptions(RunOptions):
    """``RunOptions`` plus the text to explore.

    Attributes:
        text: the text itself (instead of ``text_file``).
    """

    text: str | None = None
    n_seqs: int = 1
    explore_windows: int = 1


def _probes(options: ExploreOptions, spec) -> list[tuple[str, dict]]:
    return [(name, {}) for name in EXPLORE_PROBES]


def _check(options: ExploreOptions) -> None:
    if options.text is None and not options.text_file:
        raise SinkscopeError(f"give the text to explore with {option('text')} \"...\" or {option('text_file')} FILE.")
    if options.text is not None and options.text_file:
        raise SinkscopeError(f"give the text with {option('text')} or {option('text_file')}, not both.")
    if options.dataset:
        raise SinkscopeError(f"explore reads one text ({option('text')} or {option('text_file')}), not a dataset.")
    if options.explore_windows < 1:
        raise SinkscopeError(f"explore shows its one window: {option('explore_windows')} must be 1.")


EXPLORE = register_command(Command(
    name="explore",
    summary="one text's attention explorer: the heads grid, their patterns and the text view",
    options=ExploreOptions,
    probes=_probes,
    check=_check,
    one_window=True,
))
