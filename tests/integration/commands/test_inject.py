"""``sinkscope inject`` (issue 11; SPEC.md "Value-read injection" and "Quiet mass (exposure)"; Wang 2026 §5.1).

The reference side is independent of the probes: quiet sets and medians from ``np.quantile`` /
``np.median`` over the read norms, quiet and phantom mass from the model's own eager weights
(``output_attentions``) in float64, and the values the attention kernel actually read (the
``hook_v`` point observed after the replacement) compared with the clean ones.
"""

from __future__ import annotations

import math

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import sinkscope
from sinkscope.capture import hooks as hp, ModelSpec
from sinkscope.capture.record import QUIET_CUTOFFS, quiet_reads
from sinkscope.cli import app
from sinkscope.commands import inject as inject_command
from sinkscope.errors import phrase
from sinkscope.data.junk import batch_problem
from sinkscope.probes import get_probe, injection as injection_module
from sinkscope.probes.base import Probe, observes, register_probe
from sinkscope.stats.paired import fmt_pm
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.injection import Injection, condition_label, other_positions
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from tiny_models import FAMILY_NAMES, build
from repo_paths import REPO

runner = CliRunner()
TOL = 1e-5
TRAINER_VARIANTS = ["baseline", "sinklogit", "sink+proj", "routing-norm", "sinktoken", "normgate"]


# ---- helpers ---------------------------------------------------------------------------------------


@register_probe("test_inject_values", metrics={"unused": MetricInfo("unused", "", "", "test")})
class ValuesSeen(Probe):
    """Keeps the values the kernel read (hook_v after any replacement), per pass and layer."""

    def setup(self) -> None:
        self.labels: tuple = (None,)
        self.seen: dict = {}

    def passes(self):
        return self.labels

    @observes(hp.ATTN_V)
    def values(self, layer, v):  # (B, S, Hkv, D)
        self.seen.setdefault((self.pass_label, layer), []).append(v.detach().double().clone())

    def get(self, label, layer) -> np.ndarray:
        return torch.cat(self.seen[(label, layer)]).numpy()  # (N, S, Hkv, D)

    def rows(self) -> list[Row]:
        return []


def ids_for(n: int = 4, T: int = 16, vocab: int = 512, seed: int = 3) -> np.ndarray:
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed)).numpy()


def trainer_model(variant: str, seed: int = 0):
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32, variant=variant)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(3.0)
            if hasattr(block.attn, "sink_logit"):
                block.attn.sink_logit.copy_(torch.randn(4, generator=g))
            if hasattr(block.attn, "gate_w"):
                block.attn.gate_w.copy_(torch.randn(4, 8, generator=g))
    return model


def model_for(name: str):
    return trainer_model(name.removeprefix("trainer:")) if name.startswith("trainer:") else build(name)


MODELS = FAMILY_NAMES + [f"trainer:{v}" for v in ("baseline", "sink+proj", "sinktoken")]


def vocab_of(model) -> int:
    return ModelSpec.from_model(model).vocab_size


def injected(model, ids, *, junk="structured", cutoff="median", dose=0.8, attention="fused", seed=0,
             batch_size=4, extra=()):
    """Run one injection condition with a values recorder; returns (injection probe, recorder, label)."""
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=(junk,), cutoffs=(cutoff,), doses=(dose,), seed=seed,
                                   eval_batch=batch_size)
    seen = ValuesSeen(spec)
    label = condition_label(junk, cutoff, float(dose))
    seen.labels = (None, label)
    run_probes(model, ids, [probe, seen, *extra], batch_size=batch_size, progress=False, attention=attention)
    return probe, seen, label


def np_quiet(norms: np.ndarray, q: float) -> np.ndarray:
    """(B, S, Hkv) norms -> quiet (B, S, Hkv): strictly below numpy's quantile over S."""
    return norms < np.quantile(norms, q, axis=1, keepdims=True)


# ---- the quiet set ------------------------------------------------------------------------------


def test_quiet_reads_follow_numpy_quantiles_with_a_strict_cutoff():
    g = torch.Generator().manual_seed(0)
    norms = torch.rand(3, 2, 17, generator=g)  # (B, Hkv, S): odd S
    norms[0, 0] = 1.0  # every norm equal: nothing is quiet
    norms[1, 1, :8] = 0.5  # ties at the 25th percentile
    for S in (17, 16):  # odd and even (the median between two norms)
        x = norms[..., :S]
        got = quiet_reads(x).numpy()  # (B, Hkv, S, K)
        for k, (_, q) in enumerate(QUIET_CUTOFFS):
            want = x.numpy() < np.quantile(x.numpy(), q, axis=-1, keepdims=True)
            np.testing.assert_array_equal(got[..., k], want)
        assert not got[0, 0].any()


@pytest.mark.parametrize("name", MODELS)
def test_quiet_and_phantom_mass_equal_the_definition_on_both_paths(name):
    """Exposure (fused: indicator columns appended to v; explicit: the weights) equals numpy on the eager
    weights, averaged over every query i >= 0; for GQA the quiet set is the KV head's."""
    model = model_for(name)
    ids = ids_for(vocab=vocab_of(model))
    spec = ModelSpec.from_model(model)
    tables = {}
    for attention in ("fused", "explicit"):
        exposure, seen = get_probe("exposure")(spec), ValuesSeen(spec)
        run_probes(model, ids, [exposure, seen], batch_size=2, progress=False, attention=attention)
        tables[attention] = {(r.metric, r.layer, r.head): r.value for r in exposure.rows()}
    # the reference: eager weights (B, H, T, S) and the values the kernel read
    if name.startswith("trainer:"):
        weights = {}

        class Tap:
            def on_attention(self, record):
                weights[record.layer] = record.weights.double().numpy()

            def on_residual(self, layer, hidden):
                pass
        with torch.no_grad():
            model(torch.from_numpy(ids), tap=Tap())
        attentions = [weights[layer] for layer in spec.attention_layers]
    else:
        with torch.no_grad():
            attentions = [a.double().numpy() for a in model(torch.from_numpy(ids), output_attentions=True,
                                                            use_cache=False).attentions]
    groups = spec.n_heads // spec.n_kv_heads
    for layer, A in zip(spec.attention_layers, attentions):
        v = seen.get(None, layer)  # (B, S, Hkv, D)
        norms = np.linalg.norm(v, axis=-1)  # (B, S, Hkv)
        for name_, q in QUIET_CUTOFFS:
            quiet = np_quiet(norms, q)  # (B, S, Hkv)
            per_head = np.repeat(quiet, groups, axis=2).transpose(0, 2, 1)  # (B, H, S)
            mass = (A * per_head[:, :, None, :]).sum(-1)  # (B, H, T): phantom in the normaliser
            for h in range(spec.n_heads):
                for attention in ("fused", "explicit"):
                    assert tables[attention][(f"quiet_mass_{name_}", layer, h)] == pytest.approx(
                        mass[:, h].mean(), abs=TOL), (name, attention, layer, h)
        phantom = 1.0 - A.sum(-1)  # (B, H, T)
        for h in range(spec.n_heads):
            assert tables["fused"][("exposure_phantom_mass", layer, h)] == pytest.approx(phantom[:, h].mean(), abs=TOL)


# ---- the corruption ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_only_quiet_reads_change_by_eps_times_the_heads_median_norm(name):
    """At the first attention layer (nothing below it is corrupted) the values the kernel reads differ
    from the clean ones exactly on the quiet set, by eps x the (window, KV head)'s median read norm."""
    model = model_for(name)
    ids = ids_for(vocab=vocab_of(model))
    spec = ModelSpec.from_model(model)
    layer = spec.attention_layers[0]
    for junk, cutoff, dose in (("structured", "median", 0.8), ("gaussian", "q25", 0.4)):
        _, seen, label = injected(model, ids, junk=junk, cutoff=cutoff, dose=dose)
        clean, dirty = seen.get(None, layer), seen.get(label, layer)  # (B, S, Hkv, D)
        norms = np.linalg.norm(clean, axis=-1)  # (B, S, Hkv)
        quiet = np_quiet(norms, dict(QUIET_CUTOFFS)[cutoff])
        changed = np.abs(dirty - clean).max(-1) > 0  # (B, S, Hkv)
        np.testing.assert_array_equal(changed, quiet)
        step = np.linalg.norm(dirty - clean, axis=-1)  # (B, S, Hkv)
        median = np.median(norms, axis=1, keepdims=True)  # (B, 1, Hkv)
        np.testing.assert_allclose(step[quiet], np.broadcast_to(dose * median, step.shape)[quiet], rtol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gpt_oss", "trainer:sinktoken"])
@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_dose_zero_reproduces_the_clean_loss_exactly(name, attention):
    model = model_for(name)
    ids = ids_for(vocab=vocab_of(model))
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=("structured", "gaussian"), cutoffs=("median",), doses=(0.0,),
                                   eval_batch=2)
    run_probes(model, ids, [probe, get_probe("exposure")(spec)], batch_size=2, progress=False, attention=attention)
    rows = {(r.metric, dict(r.conditions).get("junk")): r.value for r in probe.rows()}
    for junk in ("structured", "gaussian"):
        assert rows[("inject_loss", junk)] == rows[("inject_loss_clean", None)]
        assert rows[("inject_loss_delta", junk)] == 0.0


def test_exposure_columns_leave_the_fused_output_unchanged():
    """Appending the quiet indicators to v (and padding q, k) keeps the clean loss (1e-5)."""
    model = build("llama")
    ids = ids_for()
    spec = ModelSpec.from_model(model)
    losses = []
    for extra in ([], [get_probe("exposure")(spec)]):
        probe = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("q25",), doses=(0.2,), eval_batch=2)
        run_probes(model, ids, [probe, *extra], batch_size=2, progress=False)
        losses.append(probe.rows()[0].value)
    assert losses[0] == pytest.approx(losses[1], abs=TOL)


def test_other_positions_are_uniform_and_never_the_own_position():
    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 7):
        draws = other_positions(n, (n, 4000), g)  # (n, 4000)
        own = torch.arange(n).view(n, 1)
        assert not (draws == own).any()
        assert draws.min() >= 0 and draws.max() < n
        for p in range(n):
            counts = torch.bincount(draws[p], minlength=n).double()
            others = torch.cat([counts[:p], counts[p + 1:]])
            assert counts[p] == 0 and (others / 4000 - 1 / (n - 1)).abs().max() < 0.05


@pytest.mark.parametrize("junk", ["structured", "same-context"])
def test_transplanted_junk_is_another_positions_clean_read(junk):
    """Each corrupted read's junk direction is the normalised clean read of the same KV head at another
    position: anywhere in the batch (structured) or in the same window (same-context), never itself."""
    model = build("llama")  # GQA: 2 KV heads
    ids = ids_for(n=4, T=12)
    spec = ModelSpec.from_model(model)
    _, seen, label = injected(model, ids, junk=junk, cutoff="median", dose=0.4)
    layer = spec.attention_layers[0]
    clean, dirty = seen.get(None, layer), seen.get(label, layer)  # (B, S, Hkv, D)
    B, S, Hkv, _ = clean.shape
    unit = clean / np.linalg.norm(clean, axis=-1, keepdims=True)  # (B, S, Hkv, D)
    other_window = 0
    for b, s, h in zip(*np.nonzero(np.abs(dirty - clean).max(-1) > 0)):
        u = (dirty[b, s, h] - clean[b, s, h]) / np.linalg.norm(dirty[b, s, h] - clean[b, s, h])
        cos = unit[:, :, h] @ u  # (B, S)
        # at the first layer a read is a function of its token: every copy of the source token matches
        sources = {(int(i), int(j)) for i, j in zip(*np.nonzero(cos > 1 - 1e-5))} - {(b, s)}
        assert sources, (b, s, h)
        if junk == "same-context":
            assert any(i == b for i, _ in sources)
        other_window += all(i != b for i, _ in sources)
    if junk == "structured":
        assert other_window > 0  # most draws land in another window of the batch


def test_draws_are_seeded_per_batch_and_layer_and_shared_by_models_of_the_same_shapes():
    """Gaussian and random-direction junk do not depend on the weights: two trainer models of the same shapes
    (different seeds) get the same directions; another --seed gets other ones; a rerun gets the same table."""
    ids = ids_for(vocab=64)
    directions = {}
    for junk in ("gaussian", "random-direction"):
        for seed_model, seed in ((0, 0), (1, 0), (0, 5)):
            model = trainer_model("baseline", seed=seed_model)
            _, seen, label = injected(model, ids, junk=junk, cutoff="median", dose=0.4, seed=seed, batch_size=2)
            clean, dirty = seen.get(None, 0), seen.get(label, 0)
            d = dirty - clean
            norm = np.linalg.norm(d, axis=-1, keepdims=True)
            directions[(junk, seed_model, seed)] = np.where(norm > 0, d / np.where(norm > 0, norm, 1), 0)
        same, other_model, other_seed = (directions[(junk, 0, 0)], directions[(junk, 1, 0)],
                                         directions[(junk, 0, 5)])
        both = (np.abs(same).sum(-1) > 0) & (np.abs(other_model).sum(-1) > 0)
        np.testing.assert_allclose(same[both], other_model[both], atol=1e-5)
        assert not np.allclose(same[both], other_seed[both], atol=1e-3)
    # a random direction is one unit vector per head for the whole batch
    d = directions[("random-direction", 0, 0)]
    for h in range(d.shape[2]):
        rows = d[:2, :, h][np.abs(d[:2, :, h]).sum(-1) > 0]  # the first batch (2 windows)
        np.testing.assert_allclose(rows, np.broadcast_to(rows[0], rows.shape), atol=1e-5)
    assert injection_module.draw_seed(0, 0, 1) != injection_module.draw_seed(0, 2, 1)


def test_own_direction_is_the_projection_gates_direction(tmp_path, tokenizer):
    from sinkscope.train.checkpoint import save_checkpoint

    model = trainer_model("projgate")
    folder = tmp_path / "projgate"
    save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer,
                    meta={"seed": 0, "tier": "test"})
    spec = model.model_spec()
    probe = get_probe("injection")(spec, junk=("own-direction",), cutoffs=("median",), doses=(0.8,),
                                   directions=str(folder), eval_batch=2)
    seen = ValuesSeen(spec)
    label = condition_label("own-direction", "median", 0.8)
    seen.labels = (None, label)
    run_probes(model, ids_for(vocab=64), [probe, seen], batch_size=2, progress=False)
    d = seen.get(label, 0) - seen.get(None, 0)  # (B, S, H, D)
    w = model.transformer.h[0].attn.gate_w.detach().double().numpy()  # (H, D)
    unit = w / np.linalg.norm(w, axis=-1, keepdims=True)
    moved = np.abs(d).sum(-1) > 0
    got = d / np.linalg.norm(d, axis=-1, keepdims=True).clip(1e-30)
    np.testing.assert_allclose(got[moved], np.broadcast_to(unit, got.shape)[moved], atol=1e-5)


# ---- a trained checkpoint ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_ckpt(tmp_path_factory):
    """A trigger-task checkpoint trained for 80 steps (two layers of 4 heads)."""
    from sinkscope.train.loop import train
    from sinkscope.train.config import TrainOptions

    out = tmp_path_factory.mktemp("inject-ckpt") / "trigger"
    train(TrainOptions(out=str(out), task="trigger", task_options=["vocab=16"], steps=80, batch_size=16,
                       warmup_steps=5, eval_every=80, eval_windows=8, checkpoint_every=80,
                       overrides=["n_layer=2", "n_head=4", "n_embd=32", "block_size=32"], progress=False),
          log=lambda message: None)
    return out


@pytest.mark.slow  # trains
def test_loss_increase_grows_with_dose_on_a_trained_checkpoint(trained_ckpt, tmp_path):
    result = sinkscope.measure("inject", str(trained_ckpt), n_seqs=8, eval_batch=4, junk=("structured", "gaussian"),
                               out=str(tmp_path / "run"), figures=False)
    table = result.table
    deltas = table[table.metric == "inject_loss_delta"]
    for (junk, cutoff), part in deltas.groupby(["junk", "cutoff"]):
        values = part.sort_values("dose")["value"].to_numpy()
        se = part.sort_values("dose")["se"].to_numpy()
        # every dose scales the same junk on the same windows, so the curve rises; at eps 0.2 Gaussian junk
        # in the q25 reads moves this toy's loss by ~1e-5 +- 1e-3: its sign is noise, not a property
        assert (np.diff(values) > 0).all() and values[-1] > 0 and values[0] > -2 * se[0], (junk, cutoff, values, se)
    assert table["variant"].iloc[0] == "baseline"  # the checkpoint's conditions ride along
    manifest = result.manifest
    assert manifest["options"]["eval_batch"] == 4 and manifest["options"]["batch_size"] == 4
    assert manifest["probes"]["injection"]["options"]["eval_batch"] == 4


# ---- the command ----------------------------------------------------------------------------------------


def test_inject_command_writes_the_table_the_figures_and_the_report(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["inject", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "4", "--eval-batch", "2", "--doses", "0.4,1.6", "--junk",
                                 "structured,gaussian", "--cutoff", "q25", "--cutoff", "median", "--no-progress",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert {"junk", "cutoff", "dose"} <= set(table.columns)
    deltas = table[table.metric == "inject_loss_delta"]
    assert len(deltas) == 2 * 2 * 2
    assert set(deltas.cutoff) == {"q25", "median"} and set(deltas.dose) == {0.4, 1.6}
    assert {"quiet_mass_median", "quiet_mass_q25", "exposure_phantom_mass"} <= set(table.metric)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "inject" and manifest["options"]["eval_batch"] == 2
    assert manifest["probes"]["injection"]["options"]["junk"] == ["structured", "gaussian"]
    page = (out / "report.html").read_text()
    assert 'data-probe="injection"' in page and 'data-probe="exposure"' in page
    assert "Exposure: share of each row" in page and "every query, row 0 included" in page
    for junk in ("structured", "gaussian"):
        assert (out / "figures" / f"dose_response_{junk}.png").is_file()


def test_several_models_give_one_comparison(tiny_llama_dir, text_file, tmp_path, tokenizer):
    oss = tmp_path / "tiny-oss"
    build("gpt_oss").save_pretrained(oss)
    tokenizer.save_pretrained(oss)
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["inject", str(tiny_llama_dir), str(oss), "--text-file", str(text_file), "--seq-len",
                                 "16", "--n-seqs", "2", "--eval-batch", "2", "--doses", "0.8", "--junk", "structured",
                                 "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(out / "report.html")  # the summary, then the page
    page = (out / "report.html").read_text()
    assert "sinkscope comparison of 2 runs" in page and "tiny-oss" in page
    assert (out / "figures" / "dose_response_structured.png").is_file()
    for folder in (out / tiny_llama_dir.name, out / "tiny-oss"):
        assert (folder / "results.csv").is_file()


def test_mistakes_are_one_sentence(tiny_llama_dir, text_file, tmp_path, tokenizer):
    from sinkscope.train.checkpoint import save_checkpoint

    base = tmp_path / "baseline"
    save_checkpoint(base, trainer_model("baseline"), None, step=0, train_state=None, tokenizer=tokenizer,
                    meta={"seed": 0, "tier": "test"})
    cases = [
        (["inject", str(tiny_llama_dir), "--junk", "own-direction"], "only projection-gate trainer checkpoints"),
        (["inject", str(base), "--junk", "own-direction"], "(variant baseline) has none"),
        (["inject", str(tiny_llama_dir), "--junk", "salt"], "unknown --junk 'salt'"),
        (["inject", str(tiny_llama_dir), "--cutoff", "q10"], "unknown --cutoff 'q10'"),
        (["inject", str(tiny_llama_dir), "--doses", "0.2,x"], "--doses takes numbers"),
        (["inject", str(tiny_llama_dir), "--doses", "-1"], "--doses takes finite numbers >= 0"),
        (["inject", str(tiny_llama_dir), "--doses", "0.2,0.2"], "--doses lists a value twice"),
        (["inject", str(tiny_llama_dir), "--eval-batch", "0"], "--eval-batch must be at least 1"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "x")])
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and result.output.count("error:") == 1, (args, result.output)


def test_a_resumed_or_merged_run_gives_the_one_pass_table():
    """The junk of a batch is named by its first window, so continuing from a checkpoint of the first batch,
    or merging a second process's share, gives the uninterrupted table exactly."""
    model = build("llama")
    ids = ids_for(n=4)
    spec = ModelSpec.from_model(model)
    params = dict(junk=("structured", "gaussian"), cutoffs=("q25",), doses=(0.4,), eval_batch=2)

    def table(probe):
        return rows_to_frame(probe.rows())

    whole = get_probe("injection")(spec, **params)
    run_probes(model, ids, [whole], batch_size=2, progress=False)
    first = get_probe("injection")(spec, **params)
    run_probes(model, ids[:2], [first], batch_size=2, progress=False)
    resumed = get_probe("injection")(spec, **params)
    resumed.load_state_dict(first.state_dict())
    run_probes(model, ids, [resumed], batch_size=2, progress=False, start=2)
    pd.testing.assert_frame_equal(table(resumed), table(whole))
    second = get_probe("injection")(spec, **params)
    run_probes(model, ids, [second], batch_size=2, progress=False, start=2)  # process 1's share [2, 4)
    first.merge(second)
    pd.testing.assert_frame_equal(table(first), table(whole), check_exact=False, rtol=1e-12)


def test_out_of_memory_never_halves_the_evaluation_batch():
    model = build("llama")
    spec = ModelSpec.from_model(model)

    def hook(_m, args, kwargs):
        raise torch.OutOfMemoryError("CPU out of memory (simulated)")
    handle = model.model.layers[1].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        probe = get_probe("injection")(spec, junk=("structured",), cutoffs=("q25",), doses=(0.4,), eval_batch=4)
        with pytest.raises(sinkscope.SinkscopeError, match="cannot be halved.*--eval-batch"):
            run_probes(model, ids_for(n=4), [probe], batch_size=4, progress=False)
    finally:
        handle.remove()


def test_torchrun_shares_must_be_whole_evaluation_batches(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    inject_command._check(inject_command.InjectOptions(n_seqs=8, eval_batch=4))  # shares [0, 4), [4, 8)
    with pytest.raises(sinkscope.SinkscopeError, match="whole evaluation batches"):
        inject_command._check(inject_command.InjectOptions(n_seqs=6, eval_batch=2))  # process 1 starts at 3


def test_the_command_and_the_probe_list_the_same_choices():
    assert inject_command.JUNK_TYPES == injection_module.JUNK_TYPES
    assert inject_command.DEFAULT_JUNK == injection_module.DEFAULT_JUNK
    assert inject_command.CUTOFFS == injection_module.DEFAULT_CUTOFFS
    assert inject_command.DEFAULT_DOSES == injection_module.DEFAULT_DOSES
    assert inject_command.PROJECTION_GATE_VARIANTS == injection_module.PROJECTION_GATE_VARIANTS
    assert Injection.fixed_batch


# ---- issue 27: junk from the clean pass, whole batches, several draws ----------------------------------
#
# The references below never use the probe's own arithmetic: the clean and corrupted reads are the
# tiny Llama's ``v_proj`` outputs caught with plain forward hooks (Llama's values carry no RoPE, so
# they are the hook_v reads), quiet sets and medians come from numpy, and the losses of the draws
# test are recomputed from a forward pass whose corruption is applied by a ``v_proj`` hook.


def v_proj_outputs(model, run) -> dict[int, list[np.ndarray]]:
    """Every ``v_proj`` output (B, S, Hkv, D) float64 per layer, in call order, while ``run()`` runs."""
    spec = ModelSpec.from_model(model)
    seen: dict[int, list[np.ndarray]] = {}
    handles = []
    for layer, block in enumerate(model.model.layers):
        def hook(_module, _args, out, layer=layer):
            B, S, _ = out.shape
            seen.setdefault(layer, []).append(out.detach().double().view(B, S, spec.n_kv_heads, -1).numpy().copy())
        handles.append(block.self_attn.v_proj.register_forward_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("source", ["clean", "corrupted"])
def test_quiet_set_and_median_come_from_the_clean_pass_of_the_batch(source):
    """Above the first layer the reads of a corrupted pass differ from the clean ones; with the default
    junk source every layer's quiet set and m_h are those of the clean pass's reads (numpy on the
    ``v_proj`` outputs of that pass), with ``corrupted`` those of the reads the layer receives."""
    model = build("llama")
    ids = ids_for(n=2, T=16)
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("median",), doses=(1.6,), eval_batch=2,
                                   junk_source=source)
    seen = ValuesSeen(spec)
    label = condition_label("gaussian", "median", 1.6)
    seen.labels = (None, label)
    calls = v_proj_outputs(model, lambda: run_probes(model, ids, [probe, seen], batch_size=2, progress=False))
    differs = 0
    for layer in spec.attention_layers:
        clean, received = calls[layer]  # one batch: the clean pass, then the condition's
        dirty = seen.get(label, layer)  # (B, S, Hkv, D): what the kernel read in the corrupted pass
        reference = clean if source == "clean" else received
        norms = np.linalg.norm(reference, axis=-1)  # (B, S, Hkv)
        quiet = np_quiet(norms, 0.5)
        step = np.linalg.norm(dirty - received, axis=-1)  # (B, S, Hkv)
        np.testing.assert_array_equal(step > 0, quiet, err_msg=f"layer {layer}")
        median = np.broadcast_to(np.median(norms, axis=1, keepdims=True), step.shape)  # (B, S, Hkv)
        np.testing.assert_allclose(step[quiet], 1.6 * median[quiet], rtol=1e-4, err_msg=f"layer {layer}")
        other = np_quiet(np.linalg.norm(received if source == "clean" else clean, axis=-1), 0.5)
        differs += int((other != quiet).sum())
    assert differs > 0  # the two protocols pick other quiet sets on this model: the test tells them apart


def test_structured_junk_is_transplanted_from_the_clean_pass():
    """Above the first layer each corrupted read's junk direction is the normalised *clean* read (the
    clean pass's ``v_proj`` output) of the same KV head at another position, not a corrupted-pass read."""
    model = build("llama")
    ids = ids_for(n=2, T=12)
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=("structured",), cutoffs=("median",), doses=(1.6,), eval_batch=2)
    seen = ValuesSeen(spec)
    label = condition_label("structured", "median", 1.6)
    seen.labels = (None, label)
    calls = v_proj_outputs(model, lambda: run_probes(model, ids, [probe, seen], batch_size=2, progress=False))
    for layer in spec.attention_layers[1:]:
        clean, received = calls[layer]
        dirty = seen.get(label, layer)
        unit = {name: x / np.linalg.norm(x, axis=-1, keepdims=True) for name, x in
                (("clean", clean), ("received", received))}
        moved = np.abs(dirty - received).max(-1) > 0  # (B, S, Hkv)
        assert moved.sum() > 10
        for b, s, h in zip(*np.nonzero(moved)):
            u = (dirty[b, s, h] - received[b, s, h]) / np.linalg.norm(dirty[b, s, h] - received[b, s, h])
            best = {name: float((x[:, :, h] @ u).max()) for name, x in unit.items()}
            assert best["clean"] > 1 - 1e-5, (layer, b, s, h, best)
            assert best["received"] < 1 - 1e-3, (layer, b, s, h, best)


def test_a_short_last_batch_is_refused_for_structured_junk(tiny_llama_dir, text_file, tmp_path):
    """Three windows in batches of two leave a last batch of one window, whose structured junk could
    only come from that window: refused in one sentence, before anything runs (CLI, API, runner)."""
    args = ["inject", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "3",
            "--eval-batch", "2", "--doses", "0.4", "--junk", "structured,gaussian", "--no-progress", "--no-figures"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert result.exit_code == 1, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert "3 windows leave a last batch of 1; use --n-seqs 2 or 4" in result.output
    assert not (tmp_path / "r").exists()
    # --eval-batch 1: every batch is one window
    result = runner.invoke(app, ["inject", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--eval-batch", "1", "--doses", "0.4", "--no-progress",
                                 "--no-figures", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "--eval-batch 2 or more (got 1)" in result.output, result.output
    # the Python API with windows of its own, and the runner itself, refuse before the first forward pass
    model = build("llama")
    spec = ModelSpec.from_model(model)  # (finding the parts runs one forward pass of its own)
    forwards = []
    handle = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(sinkscope.SinkscopeError, match="leave a last batch of 1"):
            sinkscope.measure("inject", model, windows=ids_for(n=3), eval_batch=2, junk=("structured",),
                              doses=(0.4,))
        probe = get_probe("injection")(spec, junk=("structured",), cutoffs=("q25",), doses=(0.4,), eval_batch=2)
        with pytest.raises(sinkscope.SinkscopeError, match="leave a last batch of 1"):
            run_probes(model, ids_for(n=3), [probe], batch_size=2, progress=False)
        assert not forwards
        # junk that never looks across windows takes a short last batch
        gaussian = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("q25",), doses=(0.4,), eval_batch=2)
        run_probes(model, ids_for(n=3), [gaussian], batch_size=2, progress=False)
        assert gaussian.rows()[0].n == 3  # the windows, the last batch's one too
    finally:
        handle.remove()


def test_batch_problem_refuses_only_batches_structured_junk_cannot_use():
    # junk that never looks across windows takes any batches, short last batch and single windows included
    for junk in (("gaussian",), ("gaussian", "same-context"), ("random-direction",)):
        for eval_batch in (1, 2, 3, 8):
            for n in (1, 2, 3, 7, 8, 17):
                assert batch_problem(junk, eval_batch, n) is None
    for junk in (("structured",), ("gaussian", "structured")):
        # whole batches of two or more windows
        for eval_batch, n in ((2, 2), (2, 8), (3, 9), (8, 8), (8, 64)):
            assert batch_problem(junk, eval_batch, n) is None
        # one-window batches: structured junk would be same-window junk
        for n in (1, 4):
            assert "needs --eval-batch 2 or more (got 1)" in phrase(batch_problem(junk, 1, n))
        # a short last batch: the sentence names both whole-batch counts
        problem = phrase(batch_problem(junk, 2, 3))
        assert "3 windows leave a last batch of 1" in problem and "use --n-seqs 2 or 4" in problem
        problem = phrase(batch_problem(junk, 8, 17))
        assert "17 windows leave a last batch of 1" in problem and "use --n-seqs 16 or 24" in problem
        assert "--eval-batch (8) windows" in problem and "divides 17" in problem
        # fewer windows than one batch: only the larger count is offered
        problem = phrase(batch_problem(junk, 8, 3))
        assert "there are only 3 windows" in problem and "use --n-seqs 8," in problem


@pytest.mark.slow  # spawns Python
def test_batch_problem_lives_in_a_torch_free_module():
    import subprocess
    import sys

    code = ("import sys\nfrom sinkscope.data.junk import batch_problem\n"
            "import sinkscope.commands.inject\n"
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)\n")
    src = str(REPO / "src")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": src}, timeout=60)


def corrupted_losses(model, ids, *, dose, cutoff_q, seed, draw, batch) -> np.ndarray:
    """Each window's mean next-token loss (B,) with Gaussian junk applied by ``v_proj`` hooks.

    The quiet set and m_h of every layer come from a plain clean forward of the batch (numpy on its
    ``v_proj`` outputs); the junk is the normalised ``torch.randn(B, S, Hkv, D)`` of the documented
    generator seed, SeedSequence([seed, batch, layer] + [draw if draw]) -> first uint64 >> 1.
    """
    spec = ModelSpec.from_model(model)
    x = torch.from_numpy(ids)
    with torch.no_grad():
        clean = v_proj_outputs(model, lambda: model(x, use_cache=False))
    handles = []
    for layer, block in enumerate(model.model.layers):
        norms = np.linalg.norm(clean[layer][0], axis=-1)  # (B, S, Hkv)
        quiet = norms < np.quantile(norms, cutoff_q, axis=1, keepdims=True)
        step = dose * np.median(norms, axis=1, keepdims=True) * quiet  # (B, S, Hkv)
        entropy = [seed, batch, layer] + ([draw] if draw else [])
        word = int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)
        B, S, Hkv, D = clean[layer][0].shape
        g = torch.randn(B, S, Hkv, D, generator=torch.Generator().manual_seed(word)).double()
        junk = torch.from_numpy(step)[..., None] * g / g.norm(dim=-1, keepdim=True)  # (B, S, Hkv, D)

        def hook(_module, _args, out, junk=junk):
            return out + junk.reshape(out.shape).to(out.dtype)
        handles.append(block.self_attn.v_proj.register_forward_hook(hook))
    try:
        with torch.no_grad():
            logits = model(x, use_cache=False).logits.double()  # (B, T, V)
    finally:
        for handle in handles:
            handle.remove()
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                           reduction="none").view(x.shape[0], -1)  # (B, T-1)
    return ce.mean(dim=1).numpy()


def test_several_draws_give_the_mean_and_its_standard_error_over_windows():
    """--draws 3: the loss increase is the mean over draws and windows, its standard error the sd over
    windows (n - 1) / sqrt(n) of each window's draw-mean increase; each draw's increase is a row.
    All recomputed with hooks and numpy (draw 0 is the single draw of earlier runs)."""
    model = build("llama")
    ids = ids_for(n=4, T=16)
    spec = ModelSpec.from_model(model)
    K, dose, seed = 3, 0.8, 7
    probe = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("q25",), doses=(dose,), eval_batch=2,
                                   seed=seed, draws=K)
    run_probes(model, ids, [probe], batch_size=2, progress=False)
    table = rows_to_frame(probe.rows())
    clean = np.concatenate([corrupted_losses(model, ids[b:b + 2], dose=0.0, cutoff_q=0.25, seed=seed, draw=0, batch=b)
                            for b in (0, 2)])  # (N,)
    under = np.stack([np.concatenate([corrupted_losses(model, ids[b:b + 2], dose=dose, cutoff_q=0.25, seed=seed,
                                                       draw=d, batch=b) for b in (0, 2)]) for d in range(K)])  # (K, N)
    delta = under.mean(axis=0) - clean  # (N,): each window's draw-mean increase

    def value(metric, **conditions):
        rows = table[table.metric == metric]
        for key, v in conditions.items():
            rows = rows[rows[key] == v]
        assert len(rows) == 1, (metric, conditions)
        return rows.iloc[0]

    assert value("inject_loss_clean")["value"] == pytest.approx(clean.mean(), abs=1e-5)
    assert value("inject_loss_clean")["se"] == pytest.approx(clean.std(ddof=1) / 2, abs=1e-5)
    row = value("inject_loss_delta", junk="gaussian")
    assert row["value"] == pytest.approx(delta.mean(), abs=1e-5)
    assert row["se"] == pytest.approx(delta.std(ddof=1) / np.sqrt(4), abs=1e-5)
    assert value("inject_loss", junk="gaussian")["se"] == pytest.approx(
        under.mean(axis=0).std(ddof=1) / 2, abs=1e-5)
    for d in range(K):
        assert value("inject_loss_delta_draw", draw=d)["value"] == pytest.approx(under[d].mean() - clean.mean(),
                                                                                 abs=1e-5)
    per_draw = under.mean(axis=1) - clean.mean()  # (K,)
    draws = value("inject_loss_delta_se_draws", junk="gaussian")
    assert draws["value"] == pytest.approx(per_draw.std(ddof=1) / np.sqrt(K), abs=1e-5) and draws["n"] == K
    assert len({round(float(under[d].mean()), 6) for d in range(K)}) == K  # three different draws


def test_one_window_gives_no_standard_error_and_one_draw_no_draw_rows():
    model = build("llama")
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("q25",), doses=(0.4,), eval_batch=1)
    run_probes(model, ids_for(n=1), [probe], batch_size=1, progress=False)
    metrics = {r.metric for r in probe.rows()}
    assert metrics == {"inject_loss_clean", "inject_loss", "inject_loss_delta"}
    assert all(math.isnan(r.se) for r in probe.rows())  # one window: no standard error
    with pytest.raises(sinkscope.SinkscopeError, match="draws must be at least 1"):
        get_probe("injection")(spec, draws=0)


def test_draws_appear_in_the_table_the_figures_and_the_report(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["inject", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "4", "--eval-batch", "2", "--doses", "0.4,1.6", "--junk", "gaussian",
                                 "--cutoff", "median", "--draws", "2", "--no-exposure", "--no-progress",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    se = table[table.metric == "inject_loss_delta"][["dose", "se"]].rename(columns={"se": "value"})
    assert len(se) == 2 and (se["value"] > 0).all()
    assert set(table[table.metric == "inject_loss_delta_draw"]["draw"]) == {0, 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["draws"] == 2 and manifest["options"]["junk_source"] == "clean"
    assert manifest["probes"]["injection"]["options"]["draws"] == 2
    page = (out / "report.html").read_text()
    delta = table[table.metric == "inject_loss_delta"].sort_values("dose")
    assert fmt_pm(delta['value'].iloc[0], se.sort_values('dose')['value'].iloc[0], sign=True) in page
    assert "standard error over the 4 windows" in page and "its 2 draws" in page


def test_the_dose_response_figure_draws_error_bars():
    from sinkscope.report import curves

    points = pd.DataFrame({"run": ["a"] * 3, "cutoff": ["median"] * 3, "dose": [0.2, 0.4, 0.8],
                           "value": [0.1, 0.5, 2.0], "se": [0.01, 0.05, 0.2]})
    fig = curves.dose_response(points, "gaussian")
    (ax,) = fig.axes
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    np.testing.assert_allclose([s[:, 1] for s in segments], [[0.09, 0.11], [0.45, 0.55], [1.8, 2.2]])
