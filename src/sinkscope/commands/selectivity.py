"""``sinkscope selectivity``: the gate measurements of SPEC.md "Probes on gated models".

A model with a **value gate** (trainer variants ``normgate``, ``projgate``, ``sink+norm``,
``sink+proj``, ``routing-norm``) gets, per layer and head: gate selectivity and the
attention-weighted mean gate (``gate_selectivity``), the token-identity share of gate variance
with the per-token gate table (``token_share``), the gate over the reads (``read_gate``: seed
000 Table 8's mean gate and share below one half) and the value-norm ratio of the values and of
the gated reads (``value_norm_ratio``, ``gated_value_norm_ratio``). A model with a
**query-controlled output gate** (Qwen3-Next; trainer ``outgate``) gets the output-gate
statistics (``output_gate``); within-row selectivity is not defined for it.

Several models (``MODEL [MODEL ...]``) give one folder with a run per model and one comparison
page (``run.comparison.execute_several``): every model must have a gate, which is checked from the
config files before anything loads. Everything else (windows, loading, resume, torchrun, the
run folder, the report) is the pipeline's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import Source

#: what a value-gated model runs, in table order.
VALUE_GATE_PROBES: tuple[str, ...] = ("gate_selectivity", "token_share", "read_gate", "value_norm_ratio",
                                      "gated_value_norm_ratio")
#: what an output-gated model runs.
OUTPUT_GATE_PROBES: tuple[str, ...] = ("output_gate",)

#: windows measured by default (SelectivityOptions.n_seqs: the chance level of the token share).
DEFAULT_N_SEQS = 256

VALUE_GATED_VARIANTS = ("normgate", "projgate", "sink+norm", "sink+proj", "routing-norm")
OUTPUT_GATED_VARIANTS = ("outgate",)
WHO_HAS_GATES = ("value gates: the trainer variants " + ", ".join(VALUE_GATED_VARIANTS)
                 + "; output gates: the trainer variant outgate, and Hugging Face models whose heads are multiplied by "
                 "sigmoid(a projection) before W_O (Qwen3-Next, AFMoE, LFM3, ...: `sinkscope ls families`)")


@dataclass
class SelectivityOptions(RunOptions):
    """``RunOptions`` plus the token threshold, and a larger default sample.

    Attributes:
        n_seqs: 256 windows by default (the other commands: 16), because the token-identity
            share is read against its chance level (K - 1) / (N - 1), which is small only when
            the N positions far outnumber the K distinct tokens: 32,768 tokens at a tiny
            checkpoint's context of 128 (a few seconds on CPU), 131,072 at 512. Wang 2026 uses
            262,144 (eight validation batches at the training context); at 2,048 tokens (16
            windows of 128) the chance level of a 4,096-token vocabulary is above 0.3.
        min_count: ``token_share_frequent`` (column ``min_count``) and the report's token tables count only tokens seen at
            least K times in the run (Wang 2026: 50).
    """

    n_seqs: int = DEFAULT_N_SEQS
    min_count: int = 50


def gate_kind(source: Source) -> str | None:
    """``"value"``, ``"output"`` or ``"none"`` from the model's config file; None when there is none to read yet."""
    from sinkscope.capture.discover import QUIRKS
    from sinkscope.models.model_config import config_file_dict

    config = config_file_dict(source)
    if config is None:
        return None
    if source.kind == "checkpoint":
        variant = config.get("variant", "baseline")
        return "value" if variant in VALUE_GATED_VARIANTS else "output" if variant in OUTPUT_GATED_VARIANTS else "none"
    quirk = QUIRKS.get(config.get("model_type"))
    if quirk is not None and quirk.gate_module is not None:
        return "output"
    return None  # a Hugging Face model's output gate is found when it is loaded (discover._output_gate)


def _describe(source: Source) -> str:
    from sinkscope.models.model_config import config_file_dict

    config = config_file_dict(source) or {}
    what = f"variant {config.get('variant', 'baseline')}" if source.kind == "checkpoint" else \
        f"model type {config.get('model_type', 'unknown')}"
    return f"{source.location} ({what})"


def _no_gate(what: str) -> SinkscopeError:
    return SinkscopeError(f"{what} has no gate, so there is nothing for `sinkscope selectivity` to measure; "
                          f"gated models are: {WHO_HAS_GATES}.")


def _check(options: SelectivityOptions) -> None:
    if options.min_count < 1:
        raise SinkscopeError(f"{option('min_count')} must be at least 1 (got {options.min_count}).")


def _check_source(options: SelectivityOptions, source: Source) -> None:
    if gate_kind(source) == "none":
        raise _no_gate(_describe(source))
    if source.kind == "checkpoint":
        folder = Path(source.path)
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise SinkscopeError(
                f"the checkpoint {source.location} has no tokenizer (tokenizer.json), which `sinkscope selectivity` "
                "needs to decode the tokens of its per-token gate table; copy in the tokenizer it was trained with.")


def _check_sources(options: SelectivityOptions, sources: list[Source]) -> None:
    kinds = [gate_kind(source) for source in sources]
    ungated = [_describe(s) for s, kind in zip(sources, kinds) if kind == "none"]
    if ungated and len(ungated) < len(sources):
        raise SinkscopeError(
            f"{', '.join(ungated)} {'has' if len(ungated) == 1 else 'have'} no gate while the other models do; "
            f"`sinkscope selectivity` compares gated models only ({WHO_HAS_GATES}).")
    if len(ungated) == 1:
        raise _no_gate(ungated[0])
    if ungated:
        raise SinkscopeError(f"none of {', '.join(ungated)} has a gate, so there is nothing for `sinkscope "
                             f"selectivity` to measure; gated models are: {WHO_HAS_GATES}.")
    for source in sources:
        _check_source(options, source)


def _check_model(options: SelectivityOptions, spec: ModelSpec) -> None:
    if spec.output_gate_unread and not spec.has_output_gate:
        raise SinkscopeError(f"the {spec.family!r} model changes its attention output before W_O, and "
                             f"{spec.output_gate_unread}; `sinkscope selectivity` cannot tell whether that is a gate, "
                             "so it refuses rather than report the model as ungated.")
    if not spec.has_value_gate and not spec.has_output_gate:
        raise _no_gate(f"the model (family {spec.family})")


def _probes(options: SelectivityOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    if spec.has_value_gate:
        return [(name, {"min_count": options.min_count} if name == "token_share" else {})
                for name in VALUE_GATE_PROBES]
    return [(name, {}) for name in OUTPUT_GATE_PROBES]


SELECTIVITY = register_command(Command(
    name="selectivity",
    summary="gate selectivity, mean gate, token-identity share, per-token gates, output-gate statistics",
    options=SelectivityOptions,
    probes=_probes,
    check=_check,
    check_source=_check_source,
    check_model=_check_model,
    check_sources=_check_sources,
))
