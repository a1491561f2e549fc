"""Every probe's state survives a checkpoint, a process merge and a rollback (issue 23, item 9).

Each registered probe of the package runs three ways over the same windows and must give the
same rows (keys, values, n, standard errors over windows): one pass; a resumed run (state after the first windows written with
``statefile.save_state``, read back, loaded into a fresh probe, the rest run from ``start=k``);
and a two-process merge done as ``distributed.merge_into_rank0`` does it (share A, share B, a
fresh probe loads B's gathered state, A merges it). A rolled-back batch (``snapshot`` /
``restore``) must leave the rows as they were. The registry is enumerated, so a probe added later
is covered; one that no model here can run fails, saying so. Batches line up in all three runs,
so the sums add in the same order and float64 accumulators agree to rounding.
"""

from __future__ import annotations

import functools
import math
import pickle
from dataclasses import dataclass

import pytest
import torch

from sinkscope.capture import ModelSpec
from sinkscope.probes import discover
from sinkscope.probes.base import HeadMeans, Probe
from sinkscope.forward.runner import run_probes
from sinkscope.store.statefile import load_state, save_state
from tiny_models import build

N_WINDOWS, SEQ_LEN, BATCH, SPLIT = 6, 16, 2, 4  # SPLIT: windows before the checkpoint / in share A
RTOL, ATOL = 1e-9, 1e-12

#: parameters beyond the defaults: what a probe needs (a BOS id) or what exercises its second pass.
PARAMS = {
    "bos_experiment": {"bos_id": 0},
    "head_ablation": {"heads": ("0.1",)},
    "mlp_pca": {"heads": ("0.1",)},
    "mlp_pca_up": {"heads": ("0.1",)},
}


def _trainer(variant: str, **config):
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, variant=variant,
                         **config)).eval()


#: tried in order; a probe runs on the first that gives it rows. "gated": phantom, value gate and
#: sliding-window layers; "outgate": output gates; "llama": a gated MLP (mlp.hook_pre_linear).
MODELS = {
    "gated": lambda: _trainer("sink+norm", layer_pattern="sliding,full", window=8),
    "outgate": lambda: _trainer("outgate"),
    "llama": lambda: build("llama"),
}


@functools.lru_cache(maxsize=None)
def model_and_windows(name: str):
    model = MODELS[name]()
    spec = ModelSpec.from_model(model)
    g = torch.Generator().manual_seed(1)
    return model, spec, torch.randint(0, spec.vocab_size or 64, (N_WINDOWS, SEQ_LEN), generator=g).numpy()


def package_probes() -> list[str]:
    """Every probe registered by the package itself (not test or plugin probes) that ``run_probes`` runs.

    ``stream`` reads its windows through its command's own reader; its resume and two-process
    merge are tested end to end in tests/integration/commands/test_stream.py. ``explorer`` keeps
    patterns, not sums, in a pass of its own after the measurement: it is never resumed or merged
    (tests/unit/probes/test_explorer.py tests its rollback).
    """
    return sorted(name for name, cls in discover().items()
                  if cls.__module__.startswith("sinkscope.probes.") and not cls.reads_windows and name != "explorer")


def run(model, tokens, probe: Probe, start: int = 0) -> Probe:
    run_probes(model, tokens, [probe], batch_size=BATCH, progress=False, start=start)
    return probe


def table(probe: Probe) -> dict:
    """{(metric, layer, head, conditions): (value, n, se)} of the probe's rows."""
    out = {}
    for r in probe.rows():
        key = (r.metric, r.layer, r.head, r.conditions)
        assert key not in out, f"{probe.name} gives two rows {key}"
        out[key] = (r.value, r.n, r.se)
    return out


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)


def assert_same_rows(got: dict, want: dict, probe: str, how: str) -> None:
    missing, extra = [k for k in want if k not in got], [k for k in got if k not in want]
    assert not missing and not extra, f"{probe} {how}: rows missing {missing[:3]}, extra {extra[:3]}"
    bad = [(k, got[k], want[k]) for k in want if got[k][1] != want[k][1] or not _close(got[k][0], want[k][0])
           or not _close(got[k][2], want[k][2])]
    assert not bad, (f"{probe} {how}: {len(bad)} of {len(want)} rows differ from one pass, e.g. "
                     + "; ".join(f"{k}: (value, n, se) {g} != {w}" for k, g, w in bad[:3]))


def pick(name: str):
    """(model, spec, windows, one-pass probe) of the first model on which the probe gives rows."""
    cls, reasons = discover()[name], []
    for model_name in MODELS:
        model, spec, tokens = model_and_windows(model_name)
        try:
            probe = run(model, tokens, cls(spec, **PARAMS.get(name, {})))
        except Exception as error:  # noqa: BLE001 - a model the probe cannot run on: try the next
            reasons.append(f"{model_name}: {type(error).__name__}: {str(error)[:120]}")
            continue
        if probe.rows():
            return model, spec, tokens, probe
        reasons.append(f"{model_name}: no rows")
    pytest.fail(f"the probe {name} cannot be run on any model of this test ({'; '.join(reasons)}); give it a "
                "model in MODELS or parameters in PARAMS")


def test_every_package_probe_is_covered():
    assert {"exposure", "massive_activation", "bos_experiment", "token_share"} <= set(package_probes())


@pytest.mark.parametrize("name", package_probes())
def test_resume_merge_and_rollback_equal_one_pass(name, tmp_path):
    cls, params = discover()[name], PARAMS.get(name, {})
    model, spec, tokens, once = pick(name)
    want = table(once)

    # resume: the state after SPLIT windows goes through the --resume file format
    first = run(model, tokens[:SPLIT], cls(spec, **params))
    save_state(tmp_path / "progress.safetensors", first.state_dict(), header={"next": SPLIT})
    resumed = cls(spec, **params)
    resumed.load_state_dict(load_state(tmp_path / "progress.safetensors"))
    assert_same_rows(table(run(model, tokens, resumed, start=SPLIT)), want, name, "resumed")

    # two processes, merged as distributed.merge_into_rank0 does (the state pickled by all_gather_object)
    share_a = run(model, tokens[:SPLIT], cls(spec, **params))
    share_b = run(model, tokens, cls(spec, **params), start=SPLIT)
    gathered = cls(spec, **params)
    gathered.load_state_dict(pickle.loads(pickle.dumps(share_b.state_dict())))
    share_a.merge(gathered)
    assert_same_rows(table(share_a), want, name, "merged")

    # an out-of-memory retry: a batch observed after the snapshot is rolled back
    saved = once.snapshot()
    run(model, tokens[:BATCH], once)
    once.restore(saved)
    assert_same_rows(table(once), want, name, "rolled back")


# ---- what the base class takes as state ------------------------------------------------------------

SPEC = ModelSpec(family="test", n_layers=2, n_heads=2, n_kv_heads=2, head_dim=4, hidden_size=8,
                 attention_layers=(0, 1), has_phantom=False, has_output_gate=False)


class _Box:
    def __init__(self):
        self.sums = torch.zeros(3)


@dataclass
class _Pair:
    acc: HeadMeans


class _Holding(Probe):
    """A probe keeping ``held`` as its accumulator (never registered)."""

    held = None

    def setup(self) -> None:
        self.held = type(self).held()

    def rows(self):
        return []


@pytest.mark.parametrize("held", [_Box, lambda: {torch.zeros(2)}, lambda: _Pair(HeadMeans(2, 2)),
                                  lambda: {"sums": torch.zeros(2), "n": 0}],
                         ids=["object", "set", "dataclass", "mixed-dict"])
def test_state_the_base_class_cannot_handle_is_a_type_error_naming_the_attribute(held):
    probe = type("HoldingProbe", (_Holding,), {"held": staticmethod(held)})(SPEC)
    for take in (probe.state_dict, probe.snapshot):
        with pytest.raises(TypeError, match=r"attribute 'held' of the probe HoldingProbe"):
            take()


def test_declared_configuration_is_not_state():
    probe = type("Declared", (_Holding,), {"held": staticmethod(_Box), "not_state": ("held",)})(SPEC)
    assert probe.state_dict() == {}


def test_nested_accumulators_are_checkpointed_merged_and_rolled_back():
    class Nested(_Holding):
        def setup(self):
            self.held = {"means": [HeadMeans(2, 2)], "sums": (torch.zeros(2, dtype=torch.float64),)}
            self.labels = {"a": 1}  # no tensor: configuration

        def add(self, x: float):
            self.held["means"][0].add(0, torch.full((1, 2), x), item_dims=(0,))
            self.held["sums"] = (self.held["sums"][0] + x,)

        def numbers(self):
            return self.held["means"][0].means()[0].tolist(), self.held["sums"][0].tolist()

    a, b = Nested(SPEC), Nested(SPEC)
    a.add(1.0)
    b.add(3.0)
    assert set(a.state_dict()) == {"held.means.0", "held.sums.0"}
    saved = a.snapshot()
    a.add(10.0)
    a.restore(saved)
    assert a.numbers() == ([1.0, 1.0], [1.0, 1.0])
    c = Nested(SPEC)
    c.load_state_dict(b.state_dict())
    a.merge(c)
    assert a.numbers() == ([2.0, 2.0], [4.0, 4.0]) and a.held["means"][0].counts[0].tolist() == [2, 2]
    with pytest.raises(ValueError, match="held.sums.0"):
        Nested(SPEC).load_state_dict({"held.means.0": b.state_dict()["held.means.0"]})
