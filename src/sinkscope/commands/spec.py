"""What every measuring command is made of: its options and its declaration (no heavy imports).

The CLI checks a command's options with these before torch or transformers is imported, so a
mistake costs a fraction of a second; ``run/`` runs the command (``run/stages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from sinkscope.data.bos import BOS_POLICIES
from sinkscope.errors import SinkscopeError, check_field_values, check_seed, option
from sinkscope.store.files import expand_paths

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import Source

ATTENTION_MODES = ("fused", "explicit")


@dataclass
class RunOptions:
    """What every measuring command shares (recorded verbatim in the manifest).

    Attributes:
        model: hub id, local folder, GGUF file or trainer checkpoint; None for the embedded SmolLM2.
        out: run folder; None for ``reports/<run-id>``.
        text_file: a UTF-8 text file to use instead of the bundled corpus.
        dataset: a ``datasets`` name ``NAME[:CONFIG][:SPLIT]`` instead of the bundled corpus.
        seq_len: tokens per window, BOS included; None = 512 (a SmolLM2 run near a minute on 2
            cores), or the model's context if shorter (trainer checkpoints: 128 for ``tiny``).
            Several lengths (a tuple, ``--seq-len 128,512,2048``) measure every metric at each
            length in one run, on prefixes of the same windows (``run/measuring.py``, "several
            lengths"); the table gains a ``seq_len`` column. One length is the plain run.
        n_seqs: number of windows.
        batch_size: windows per forward pass (does not change the numbers).
        seed: seeds the window draw.
        bos: ``auto`` | ``add`` | ``none`` (see data/corpus.py).
        device, dtype, revision, trust_remote_code: model loading (see run/loaders.py).
        overwrite: replace an existing run folder.
        figures: draw the figures and write report.html.
        attention: ``fused`` (a fused kernel's log-sum-exp; memory linear in seq-len) or
            ``explicit`` (the model's eager weights; the reference). Same numbers (1e-5).
        resume: continue a killed or interrupted run into the same ``out`` from its last
            checkpoint of the accumulators (same options required); the table equals an
            uninterrupted run's.
        checkpoint_seconds: how often the accumulators are saved for ``resume`` (0: every batch).
        device_map: shard a large model over devices through accelerate (``auto``,
            ``balanced``, ``sequential``); probes run on each layer's device.
        explore_heads: the heads whose attention patterns the report's explorer keeps (``auto``:
            a seeded sample, then the others of highest position-0 mass; ``all``; ``none``; ``L.H,...``).
        explore_windows: how many of the first windows the explorer keeps (0: none).
        explore_max_mb: the explorer's data budget in the page, in MB (patterns past it are left
            out, window 0's top heads last); None: no budget.
        strict_revisions: a series in which two revisions or checkpoints load the same weights stops with an
            error instead of a warning (``run/comparison.py``, ``models/fingerprint.py``).
        loader: ``transformers`` (the model as it is) or ``transformer-lens`` (a TransformerLens 3
            ``HookedTransformer`` built from it, measured through its hooks: ``run/hooked_loader.py``).
        loader_option: ``KEY=true|false`` pairs of TransformerLens's weight processing (``fold_ln``, ...).
    """

    model: str | None = None
    out: str | None = None
    text_file: str | None = None
    dataset: str | None = None
    seq_len: int | tuple[int, ...] | None = None
    n_seqs: int = 16
    batch_size: int = 4
    seed: int = 0
    bos: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False
    overwrite: bool = False
    figures: bool = True
    progress: bool = True
    attention: str = "fused"
    resume: bool = False
    checkpoint_seconds: float = 30.0
    device_map: str | None = None
    explore_heads: str = "auto"
    explore_windows: int = 2
    explore_max_mb: float | None = 3.5
    strict_revisions: bool = False
    loader: str = "transformers"
    loader_option: tuple = ()

    def __post_init__(self):
        check_field_values(self)  # every number of its type and finite, whoever made the options
        expand_paths(self, model="MODEL", out=option("out"), text_file=option("text_file"))


@dataclass(frozen=True)
class Command:
    """A measuring command: its options, its probes and its checks (``commands/``).

    Attributes:
        name: the CLI command and the manifest's ``command``.
        summary: one line for listings.
        options: its options dataclass (a ``RunOptions`` subclass).
        probes: ``(options, spec) -> [(probe name, parameters), ...]``.
        check: cheap checks of the options, before anything is loaded.
        check_source: checks against the model's config file, before the weights load.
        check_model: checks needing the model's sizes, right after it loads.
        check_sources: checks across the models of one comparison (``MODEL [MODEL ...]``, see
            ``run.comparison.execute_several``), before any of them loads.
        read_windows: a function that replaces ``runner.run_probes`` (same signature) and reads
            each window its own way (``stream``: through a bounded cache); None: ``run_probes``.
        reads_past_context: the windows may be longer than the model's context (``stream``).
        one_window: the command reads one window, the text itself (its first ``seq_len`` tokens,
            BOS by the policy), not windows drawn from a corpus (``explore``).
        followup: ``(options, spec, probes) -> [(probe name, parameters), ...]``: probes of a
            second stage over the same windows, chosen from the first stage's finished probes
            (merged over processes), e.g. zeroing the heads the first stage found dormant
            (``heads --ablate-dormant``); None or an empty list: one stage.
    """

    name: str
    summary: str
    options: type[RunOptions]
    probes: Callable[[Any, "ModelSpec"], list[tuple[str, dict]]]
    check: Callable[[Any], None] = lambda options: None
    check_source: Callable[[Any, "Source"], None] = lambda options, source: None
    check_model: Callable[[Any, "ModelSpec"], None] = lambda options, spec: None
    check_sources: Callable[[Any, list["Source"]], None] = lambda options, sources: None
    followup: Callable[[Any, "ModelSpec", list], list[tuple[str, dict]]] | None = None
    read_windows: Callable[..., int] | None = None
    reads_past_context: bool = False
    one_window: bool = False


def check_options(options: RunOptions) -> None:
    """The options every command shares, checked in a second, before anything loads."""
    lengths = seq_lens(options.seq_len)
    if lengths is not None and min(lengths) < 2:
        raise SinkscopeError(f"{option('seq_len')} must be at least 2 (got {min(lengths)}).")
    if lengths is not None and len(lengths) > 1 and options.resume:
        raise SinkscopeError(f"{option('resume', True)} is not supported with several {option('seq_len')} values; run them without it.")
    if options.loader_option is None:
        options.loader_option = ()
    options.loader_option = tuple(options.loader_option) if not isinstance(options.loader_option, str) \
        else split_values(options.loader_option)
    if options.loader not in ("transformers", "transformer-lens"):
        raise SinkscopeError(f"unknown {option('loader')} {options.loader!r}; use transformers or transformer-lens.")
    if options.loader_option and options.loader != "transformer-lens":
        raise SinkscopeError(f"{option('loader_option')} sets TransformerLens's weight processing; it goes with "
                             f"{option('loader')} transformer-lens.")
    if options.loader == "transformer-lens":
        from sinkscope.capture.hooked import processing_options

        processing_options(options.loader_option)  # a bad KEY=VALUE is one sentence before anything loads
        if options.device_map:
            raise SinkscopeError(f"{option('loader')} transformer-lens builds the model on one device; drop "
                                 f"{option('device_map')}.")
    if options.n_seqs < 1:
        raise SinkscopeError(f"{option('n_seqs')} must be at least 1 (got {options.n_seqs}).")
    if options.batch_size < 1:
        raise SinkscopeError(f"{option('batch_size')} must be at least 1 (got {options.batch_size}).")
    if options.bos not in BOS_POLICIES:
        raise SinkscopeError(f"unknown {option('bos')} {options.bos!r}; use one of {', '.join(BOS_POLICIES)}.")
    if options.resume and not options.out:
        raise SinkscopeError(f"{option('resume', True)} needs the {option('out')} folder of the run to continue.")
    if options.attention not in ATTENTION_MODES:
        raise SinkscopeError(f"unknown {option('attention')} {options.attention!r}; use fused or explicit.")
    if not options.checkpoint_seconds >= 0:  # NaN too
        raise SinkscopeError(f"{option('checkpoint_seconds')} must be 0 or more (got {options.checkpoint_seconds:g}).")
    check_seed(options.seed)
    check_explore(options)


def check_explore(options: RunOptions) -> None:
    """``--explore-heads``, ``--explore-windows`` and ``--explore-max-mb``, before anything loads."""
    from sinkscope.store.explorer_format import check_max_mb, parse_heads

    parse_heads(options.explore_heads)
    if options.explore_windows < 0:
        raise SinkscopeError(f"{option('explore_windows')} must be 0 or more (got {options.explore_windows}).")
    check_max_mb(options.explore_max_mb)




def split_values(values) -> tuple:
    """CLI values as a tuple of strings: repeated options and comma-separated lists both work."""
    if isinstance(values, (str, int, float)):
        values = (values,)
    return tuple(v.strip() for item in values for v in str(item).split(",") if v.strip())


def parse_seq_len(text: str | int | None) -> int | tuple[int, ...] | None:
    """``--seq-len``: ``"512"`` -> 512; ``"128,512,2048"`` -> (128, 512, 2048) (sorted, distinct)."""
    if text is None or isinstance(text, int):
        return text
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise SinkscopeError(f"{option('seq_len')} takes a length or comma-separated lengths such as 128,512 (got {text!r})."
                             ) from None
    if not values:
        raise SinkscopeError(f"{option('seq_len')} needs at least one length.")
    return values[0] if len(values) == 1 else tuple(sorted(set(values)))


def seq_lens(seq_len) -> tuple[int, ...] | None:
    """The lengths of a ``seq_len`` option as a sorted tuple (None: not given)."""
    if seq_len is None:
        return None
    if isinstance(seq_len, (list, tuple)):
        if not seq_len:
            raise SinkscopeError(f"{option('seq_len')} needs at least one length.")
        bad = [v for v in seq_len if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise SinkscopeError(f"{option('seq_len')} lengths must be integers (got {bad[0]!r}).")
        return tuple(sorted(set(seq_len)))
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise SinkscopeError(f"{option('seq_len')} must be an integer or a list of them (got {seq_len!r}).")
    return (seq_len,)


def longest(seq_len: int | tuple[int, ...] | None) -> int | None:
    """The longest of the run's lengths (the windows are drawn at it; shorter ones are their prefixes)."""
    lengths = seq_lens(seq_len)
    return None if lengths is None else max(lengths)


def check_layer_start(start: int | None, n_layers: int | None, attention_layers=None,
                      flag: str = option("sink_layer_start")) -> None:
    """A layer index the user gave must name a layer: ``0 <= start < n_layers``, at most the last attention layer.

    Run twice: before loading with ``sources.layer_count`` (when the config is on disk) and after,
    with the model's spec; ``n_layers`` None checks the sign only, ``start`` None (not given) nothing.
    """
    if start is None:
        return
    if start < 0:
        raise SinkscopeError(f"{flag} must be 0 or more (got {start}).")
    if n_layers is not None and start >= n_layers:
        raise SinkscopeError(f"{flag} {start} is outside the model's {n_layers} layers; use 0 to {n_layers - 1}.")
    if attention_layers and start > max(attention_layers):
        raise SinkscopeError(f"{flag} {start} is past the model's last softmax-attention layer "
                             f"({max(attention_layers)}); use at most {max(attention_layers)}.")
