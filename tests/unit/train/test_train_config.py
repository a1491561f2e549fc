"""The trainer's options (src/sinkscope/train/config.py) and the one ``key=value`` parser (tasks.py).

Tier defaults, the checks of ``resolve_options``, ``--resume``'s merge, ``--set`` and
``--task-set`` through ``tasks.parse_fields``, and the import order inside train/: config and the
loop lean on tasks, never the other way round. No training, no data.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.train import config
from sinkscope.train.config import (NOT_RECORDED, RESULT_FIELDS, RUN_FIELDS, TASK_TIERS, TIER_TRAINING, TrainOptions,
                                    apply_overrides, merge_resume, resolve_options)
from sinkscope.models.trainer_config import TIERS, GPTConfig
from sinkscope.train.tasks import TriggerOptions, parse_fields, parse_task_options

TRAIN = Path(config.__file__).parent


def test_the_options_live_in_config_and_the_package_exports_them():
    import sinkscope.train

    assert sinkscope.train.TrainOptions is TrainOptions


def test_every_option_is_recorded_as_a_result_or_run_field_or_named_as_not_recorded():
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    groups = [set(RESULT_FIELDS), set(RUN_FIELDS), set(NOT_RECORDED)]
    assert set().union(*groups) == names
    assert sum(map(len, groups)) == len(names)  # no option in two groups
    assert set(TIER_TRAINING) <= set(TIERS) and set(TASK_TIERS.values()) <= set(TIER_TRAINING)


def test_resolve_fills_the_tier_defaults_and_scales_warmup_and_min_lr():
    text = resolve_options(TrainOptions())
    tiny = TIER_TRAINING["tiny"]
    assert (text.task, text.tier, text.variant, text.seed, text.windows) == ("text", "tiny", "baseline", 0, "doc-start")
    assert (text.steps, text.lr, text.min_lr, text.warmup_steps, text.log_every) == (
        tiny["steps"], tiny["lr"], tiny["min_lr"], tiny["warmup_steps"], 10)
    trigger = resolve_options(TrainOptions(task="trigger"))
    assert (trigger.tier, trigger.tokenizer, trigger.windows) == ("micro", None, None)
    scaled = resolve_options(TrainOptions(steps=1200, lr=4e-3))
    assert scaled.warmup_steps == 60 and math.isclose(scaled.min_lr, 4e-4)


@pytest.mark.parametrize("options, match", [
    (dict(tier="tinny"), r"unknown tier 'tinny'; did you mean 'tiny'\?; tiers: micro"),
    (dict(variant="sinklogits"), r"unknown variant 'sinklogits'; did you mean 'sinklogit'\?; variants:"),
    (dict(task="trigerr"), r"unknown --task 'trigerr'; did you mean 'trigger'\?; tasks: text, trigger\."),
    (dict(steps=0), "steps must be a positive integer"),
    (dict(steps=10, warmup_steps=10), r"warmup_steps must be in \[0, steps=10\)"),
    (dict(batch_size=10, grad_accum=4), "must be a multiple of grad_accum"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(monitor_every=-1), "monitor_every must be 0"),
    (dict(seed=-1), "seed must be a non-negative integer"),
])
def test_resolve_refuses_bad_options_in_one_sentence(options, match):
    """Types and finiteness are checked where the options are made, ranges when they are resolved."""
    with pytest.raises(SinkscopeError, match=match):
        resolve_options(TrainOptions(**options))


def test_resume_keeps_the_checkpoint_result_fields_and_takes_the_callers_run_fields(tmp_path):
    stored = dataclasses.asdict(resolve_options(TrainOptions(task="trigger", seed=3)))
    merged = merge_resume(TrainOptions(out=str(tmp_path), steps=5000, eval_every=7), stored, tmp_path)
    assert (merged.seed, merged.task, merged.steps, merged.eval_every, merged.resume) == (3, "trigger", 5000, 7, True)
    with pytest.raises(SinkscopeError, match="seed=4 was asked for and the checkpoint has seed=3"):
        merge_resume(TrainOptions(seed=4), stored, tmp_path)
    legacy = merge_resume(TrainOptions(), {"seed": 0}, tmp_path)  # from before tasks: text, random windows
    assert (legacy.task, legacy.windows) == ("text", "random")


def test_set_overrides_parse_literals_and_fail_with_the_suggest_form():
    base = GPTConfig(n_layer=2, n_head=2, n_embd=32)
    changed = apply_overrides(base, ["n_layer=3", "norm_gate_beta=4", "layer_pattern=sliding,full", "norm='rmsnorm'"])
    assert (changed.n_layer, changed.norm_gate_beta, changed.layer_pattern, changed.norm) == (
        3, 4.0, "sliding,full", "rmsnorm")
    assert type(changed.norm_gate_beta) is float
    with pytest.raises(SinkscopeError, match=r"^unknown --set key 'n_layers'; did you mean 'n_layer'\?; valid keys: "):
        apply_overrides(base, ["n_layers=2"])
    with pytest.raises(SinkscopeError, match=r"--set n_layer needs a int value, not '2\.5'; valid keys: vocab_size"):
        apply_overrides(base, ["n_layer=2.5"])
    with pytest.raises(SinkscopeError, match="invalid model settings: n_embd"):
        apply_overrides(base, ["n_embd=33"])


def test_task_set_and_set_share_one_parser():
    assert parse_task_options("trigger", ["vocab=32", "trigger_rate=0"]) == {"vocab": 32, "trigger_rate": 0.0}
    assert parse_fields(TriggerOptions(), ["vocab=32", "trigger_rate=0"], "--task-set") == {"vocab": 32,
                                                                                             "trigger_rate": 0.0}
    with pytest.raises(SinkscopeError, match=r"^unknown --task-set key 'trigger_rat' for the trigger task; "
                                             r"did you mean 'trigger_rate'\?; valid keys: vocab, trigger_rate"):
        parse_task_options("trigger", ["trigger_rat=0.1"])
    with pytest.raises(SinkscopeError, match=r"^--task-set takes key=value, not 'vocab'; valid keys: vocab"):
        parse_task_options("trigger", ["vocab"])
    with pytest.raises(SinkscopeError, match=r"^--task-set vocab needs a int value, not 'True'"):
        parse_task_options("trigger", ["vocab=True"])
    assert parse_fields(TriggerOptions(), None, "--task-set") == {}


def _imports(path: Path) -> set[str]:
    """Every sinkscope module ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sinkscope"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_the_trainer_modules_import_in_one_direction():
    """tasks < config < loop (the old loop <-> tasks circle), and config imports no torch at module level."""
    assert not _imports(TRAIN / "tasks.py") & {"sinkscope.train.loop", "sinkscope.train.config"}
    assert "sinkscope.train.loop" not in _imports(TRAIN / "config.py")
    assert "sinkscope.train.loop" not in _imports(TRAIN / "taps.py") | _imports(TRAIN / "model.py")
    top = [n for n in ast.parse((TRAIN / "config.py").read_text(encoding="utf-8")).body
           if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert {getattr(n, "module", None) or n.names[0].name for n in top} <= {
        "__future__", "dataclasses", "math", "pathlib", "sinkscope.errors"}
