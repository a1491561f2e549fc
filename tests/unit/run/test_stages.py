"""One plan through the run's stages (run/stages.py): prepare -> load -> measure -> write.

The stages are functions of the previous stage's record; these tests follow a model handed over as
an object (the Python API's route, ``run.dispatch.measure_command``: plan, then execute) through
them, and check the records each stage hands on.
"""

from __future__ import annotations

import numpy as np

from sinkscope.commands import get_command
from sinkscope.run.dispatch import measure_command
from sinkscope.run.load import load
from sinkscope.run.measuring import measure
from sinkscope.run.plan import in_memory_source, plan
from sinkscope.run.prepare import Inputs, first_inputs, prepare, progress_path
from sinkscope.run.stages import run_plan
from sinkscope.run.write import assemble
from tiny_models import build, random_ids


def test_windows_handed_over_decide_n_seqs_before_the_checks():
    command = get_command("sinks")
    options, inputs = first_inputs(command.options(n_seqs=99), Inputs(windows=[[1, 2, 3], [4, 5, 6]]))
    assert options.n_seqs == 2 and inputs.windows.dtype == np.int64 and inputs.windows.shape == (2, 3)


def test_the_progress_file_sits_beside_the_run_folder(tmp_path):
    assert progress_path(tmp_path / "run") == tmp_path / ".run.progress.safetensors"


def test_each_stage_hands_its_record_to_the_next_and_the_chain_is_run_plan():
    model = build("llama")
    ids = random_ids(2, 12).numpy()
    command = get_command("measure")
    options, inputs = first_inputs(command.options(probes=("p0_mass",), progress=False), Inputs(model=model, windows=ids))
    planned, = plan(command, options, model_object=model, write=False)
    assert planned.source == in_memory_source(model) and planned.source.kind == "object"
    prepared = prepare(planned, inputs, write=False)
    assert prepared.out_dir is None and prepared.options.seq_len == 12 and prepared.options.n_seqs == 2
    loaded = load(prepared, log=lambda _m: None)
    assert loaded.windows.tokens.shape == (2, 12) and loaded.spec.n_layers == model.config.num_hidden_layers
    probes, seconds = measure(prepared, loaded, log=lambda _m: None)
    by_stage = assemble(prepared, loaded, probes, seconds).table
    whole = run_plan(planned, inputs, write=False, log=lambda _m: None).table
    via_api_route = measure_command(command, options, Inputs(model=model, windows=ids), write=False,
                                    log=lambda _m: None).table
    for table in (whole, via_api_route):
        np.testing.assert_allclose(table["value"].to_numpy(), by_stage["value"].to_numpy(), rtol=1e-6)
    assert (by_stage["metric"] == "p0_mass").any()
