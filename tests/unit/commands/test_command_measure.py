"""``sinkscope measure`` as declared in ``sinkscope.commands.measure``, called directly (no CLI).

Checked: ``parse_params`` (``PROBE.NAME=VALUE`` settings grouped per probe, and each malformed or
misdirected setting as one sentence naming ``--param``); the option check (no probe, a probe
named twice, an unknown probe, a parameter the probe does not have or cannot take, a missing
plugin file: one sentence each); and the probe list for given options, including a probe from a
plugin file, whose parameters the probe then types and whose run counts what it should.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from sinkscope.commands import get_command
from sinkscope.commands import measure as measure_cmd
from sinkscope.errors import SinkscopeError
from sinkscope.commands.spec import RunOptions

PLUGIN = '''
from sinkscope.capture import hooks
from sinkscope.probes import Param, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


@register_probe("unit_token_count", params=(Param("k", int, 1, "a factor"),),
                metrics={"tokens_times_k": MetricInfo("tokens x k", "1", "x", "test", per="model")})
class TokenCount(Probe):
    def setup(self):
        self.n = 0

    @observes(hooks.TOKENS)
    def tokens(self, layer, ids):
        self.n += ids.numel()

    def rows(self):
        return [Row(self.name, "tokens_times_k", None, None, float(self.n * self.k), self.n)]
'''


def assert_one_sentence(message: str, *words: str) -> None:
    """One line, one sentence (no full stop followed by a new capitalised sentence), naming ``words``."""
    assert "\n" not in message and message.endswith("."), message
    assert not re.search(r"[.!?]\s+[A-Z]", message), message
    for word in words:
        assert word in message, message


@pytest.fixture(scope="module", autouse=True)
def _registry():
    """The probe registry, imported once here (it imports torch) rather than inside the first test."""
    from sinkscope.probes import discover

    discover()


@pytest.fixture
def plugin(tmp_path):
    """A plugin file registering ``unit_token_count``; the probe registry is restored afterwards."""
    from sinkscope.probes import discover, PROBES

    discover()
    before, modules = dict(PROBES), set(sys.modules)
    path = tmp_path / "unit_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    yield path
    PROBES.clear()
    PROBES.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith("sinkscope_plugin_"):
            del sys.modules[name]


# ---- the declaration ------------------------------------------------------------------------------------------


def test_measure_is_registered_with_its_options():
    command = get_command("measure")
    assert command is measure_cmd.MEASURE
    assert command.options is measure_cmd.MeasureOptions and issubclass(command.options, RunOptions)
    assert command.followup is None and command.read_windows is None
    options = measure_cmd.MeasureOptions()
    assert options.probes == options.params == options.plugins == ()


# ---- parse_params ---------------------------------------------------------------------------------------------


def test_parse_params_groups_settings_per_probe_as_given():
    parsed = measure_cmd.parse_params([" sink_rate.epsilon = 0.5", "sink_rate.key=1", "value_norm.x=a=b"],
                                      ("p0_mass", "sink_rate", "value_norm"))
    assert parsed == {"p0_mass": {}, "sink_rate": {"epsilon": "0.5", "key": "1"}, "value_norm": {"x": "a=b"}}
    assert list(parsed) == ["p0_mass", "sink_rate", "value_norm"]  # table order: the --probe order
    assert measure_cmd.parse_params([], ("p0_mass",)) == {"p0_mass": {}}
    assert measure_cmd.parse_params(["sink_rate.key=1", "sink_rate.key=2"], ("sink_rate",)) == {
        "sink_rate": {"key": "2"}}  # the last setting wins


@pytest.mark.parametrize("item", ["sink_rate.epsilon", "epsilon=0.5", "sink_rate.=0.5", "=0.5", ""])
def test_a_malformed_param_is_one_sentence(item):
    with pytest.raises(SinkscopeError) as caught:
        measure_cmd.parse_params([item], ("sink_rate",))
    assert_one_sentence(str(caught.value), "--param", "PROBE.NAME=VALUE", repr(item))


def test_a_param_for_a_probe_not_run_is_one_sentence():
    with pytest.raises(SinkscopeError) as caught:
        measure_cmd.parse_params(["sink_rate.epsilon=0.5"], ("p0_mass", "value_norm"))
    assert_one_sentence(str(caught.value), "--param", "'sink_rate'", "p0_mass, value_norm")


# ---- the option check -----------------------------------------------------------------------------------------


def test_valid_options_pass_the_check():
    measure_cmd.MEASURE.check(measure_cmd.MeasureOptions(probes=("p0_mass", "sink_rate"),
                                                         params=("sink_rate.epsilon=0.2", "sink_rate.key=0")))


@pytest.mark.parametrize("probes, params, words", [
    ((), (), ["--probe"]),
    (("p0_mass", "sink_rate", "p0_mass"), (), ["--probe", "once"]),
    (("p0_mas",), (), ["'p0_mas'", "did you mean 'p0_mass'"]),
    (("sink_rate",), ("sink_rate.epsilom=0.1",), ["sink_rate", "'epsilom'", "did you mean 'epsilon'"]),
    (("sink_rate",), ("sink_rate.epsilon=high",), ["sink_rate", "epsilon", "float"]),
    (("sink_rate",), ("sink_rate.key=1.5",), ["sink_rate", "key", "int"]),
    (("sink_rate",), ("sink_rate.epsilon=2",), ["sink_rate", "epsilon"]),
    (("p0_mass",), ("sink_rate.epsilon=0.1",), ["--param", "'sink_rate'"]),
])
def test_an_option_mistake_is_one_sentence(probes, params, words):
    with pytest.raises(SinkscopeError) as caught:
        measure_cmd.MEASURE.check(measure_cmd.MeasureOptions(probes=probes, params=params))
    assert_one_sentence(str(caught.value), *words)


def test_a_missing_plugin_file_is_one_sentence(tmp_path):
    missing = tmp_path / "nowhere.py"
    with pytest.raises(SinkscopeError) as caught:
        measure_cmd.MEASURE.check(measure_cmd.MeasureOptions(probes=("p0_mass",), plugins=(str(missing),)))
    assert_one_sentence(str(caught.value), str(missing))


# ---- the probe list -------------------------------------------------------------------------------------------


def test_the_probe_list_is_the_named_probes_in_order_with_their_params():
    options = measure_cmd.MeasureOptions(probes=("sink_rate", "p0_mass"),
                                         params=("sink_rate.epsilon=0.25", "sink_rate.layer_start=1"))
    probes = measure_cmd.MEASURE.probes(options, None)
    assert probes == [("sink_rate", {"epsilon": "0.25", "layer_start": "1"}), ("p0_mass", {})]


def test_a_plugin_probe_is_checked_listed_typed_and_run(plugin):
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes
    from tiny_models import build, random_ids

    options = measure_cmd.MeasureOptions(probes=("p0_mass", "unit_token_count"), params=("unit_token_count.k=3",),
                                         plugins=(str(plugin),))
    measure_cmd.MEASURE.check(options)
    listed = measure_cmd.MEASURE.probes(options, None)
    assert listed == [("p0_mass", {}), ("unit_token_count", {"k": "3"})]

    with pytest.raises(SinkscopeError) as caught:  # the plugin probe's parameter is typed by the probe
        measure_cmd.MEASURE.check(measure_cmd.MeasureOptions(probes=("unit_token_count",), plugins=(str(plugin),),
                                                             params=("unit_token_count.k=three",)))
    assert_one_sentence(str(caught.value), "unit_token_count", "k", "int")

    model, ids = build("llama"), random_ids(2, 8, seed=1)
    spec = ModelSpec.from_model(model)
    probes = [get_probe(name)(spec, **params) for name, params in listed]
    assert probes[1].k == 3
    run_probes(model, ids.numpy(), probes, batch_size=2, progress=False)
    (row,) = probes[1].rows()
    assert row.n == ids.numel() and row.value == 3 * ids.numel()
