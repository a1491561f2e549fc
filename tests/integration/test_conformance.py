"""Any causal LM: the architectures researchers bring, each checked as the conformance matrix checks it.

Every model type named in issue 24 is built tiny from its config class alone and must pass
``conformance.matrix.check_type``: its parts found, logits unchanged under the capture (fused and
explicit), per-head p0 and phantom mass equal to the model's own eager weights within 1e-5 (for a
rescaling sink, sigmoid(b - LSE) from explicit scores), the hook invariants, and every command run
or a missing hook point refused in one sentence. The whole matrix (every model type of the
installed transformers, at least 90% passing) is the slow test at the end.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.conformance.matrix import CHECKED_CLASSES, check_type
from sinkscope.errors import SinkscopeError

#: the architectures of issue 24's first paragraph (and what each stands for).
NAMED = {
    "opt": "Gu et al.'s family", "olmo2": "open checkpoints, post-norm", "olmo3": "open checkpoints",
    "gemma2": "soft-capping", "phi": "parallel block", "phi3": "fused gate/up", "falcon": "eager fallback",
    "stablelm": "partial rotary", "starcoder2": "code", "cohere2": "parallel, sliding", "mixtral": "MoE",
    "qwen2_moe": "MoE", "qwen3_moe": "MoE", "olmoe": "MoE", "smollm3": "NoPE layers", "llama4_text": "NoPE, MoE",
    "bloom": "ALiBi, eager fallback", "mpt": "ALiBi, eager fallback", "gptj": "parallel, partial rotary",
    "codegen": "parallel", "deepseek_v2": "MLA", "deepseek_v3": "MLA", "granite": "scaled logits",
    "granite_swa": "rescaling sink", "granitemoe_swa": "rescaling sink, MoE", "mimo_v2_flash": "sink column on SWA",
    "deepseek_v4": "sink column, float mask", "gpt_oss": "sink column", "qwen3_next": "output gate, linear layers",
    # the mechanisms the matrix made sinkscope learn, one model each
    "inkling_text": "position_bias folded into the mask", "deepseek_v32": "sparse indexer's indices",
    "zamba2": "attention module shared by layers", "dory": "looped layers", "gpt_neo": "eager fallback, no layer_idx",
    "inkling2_text": "sink logit per query (sink_proj), a softmax column, gate inside o_proj",
    "afmoe": "output gate from its own projection", "lfm3": "per-head output gate computed after attention",
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("model_type", sorted(NAMED))
def test_named_architecture_passes_the_matrix(model_type):
    row = check_type(model_type)
    assert row["status"] == "pass", f"{model_type} ({NAMED[model_type]}): {row['reason']}"


def test_sink_forms_are_read_off_the_models_own_eager_function():
    assert check_type("granite_swa", commands=False)["sink"] == "rescale"
    assert check_type("gpt_oss", commands=False)["sink"] == "column"
    assert check_type("deepseek_v4", commands=False)["sink"] == "column"
    assert check_type("llama", commands=False)["sink"] == ""


def test_every_command_really_runs_in_the_matrix():
    """A command the matrix calls wrongly (an unknown option) is a failure, never a 'refused' pass."""
    detail = check_type("llama")["reason"]
    for command in ("sinks", "heads", "inject", "circuit"):
        assert command in detail and f"{command} refused" not in detail, detail


def test_a_per_query_sink_logit_is_measured_against_its_projection():
    """Inkling2 computes b_hi = sink_proj(h_i) per query and appends it as a softmax column.

    Reference, independent of the capture: the eager model's own weights give phi_i = 1 - sum_j a_ij,
    and a forward hook on ``sink_proj`` gives b_hi; phantom_mass and sink_logit (the mean of b_hi over
    queries i >= 1) must match per head, fused and explicit.
    """
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny("inkling2_text").eval()
    ids = torch.randint(1, model.get_input_embeddings().num_embeddings - 1, (2, 12),
                        generator=torch.Generator().manual_seed(1))
    logits_seen: dict[int, list[torch.Tensor]] = {}
    handles = [layer.self_attn.sink_proj.register_forward_hook(
        lambda _m, _i, out, index=index: logits_seen.setdefault(index, []).append(out.detach().float()))
        for index, layer in enumerate(model.model.layers) if hasattr(layer.self_attn, "sink_proj")]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    for handle in handles:
        handle.remove()
    assert logits_seen, "the tiny Inkling2 has no sink_proj: the test would check nothing"
    for attention in ("fused", "explicit"):
        table = sinkscope.measure(["phantom_mass"], model, windows=ids.numpy(), attention=attention).table
        heads = table[table["head"].notna()]
        for layer, seen in logits_seen.items():
            b = torch.cat(seen)  # (B, T, H)
            expected_logit = b[:, 1:].mean(dim=(0, 1)).double()  # (H,)
            phi = 1 - weights[layer].float().sum(-1)  # (B, H, T)
            expected_mass = phi[:, :, 1:].mean(dim=(0, 2)).double()  # (H,)
            for metric, expected in (("sink_logit", expected_logit), ("phantom_mass", expected_mass)):
                got = heads[(heads["metric"] == metric) & (heads["layer"] == layer)].sort_values("head")["value"]
                assert torch.allclose(torch.tensor(got.to_numpy()), expected, atol=1e-5), (attention, metric, layer)
            assert float(expected_mass.max()) > 1e-3  # a phantom that takes mass: not a check of zeros


@pytest.mark.parametrize("model_type,gate_name", [("afmoe", "gate_proj"), ("lfm3", "g_proj")])
def test_an_output_gate_of_its_own_projection_is_read(model_type, gate_name):
    """out_gate_mean per head equals sigmoid(g) from a forward hook on the model's own gate projection."""
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny(model_type).eval()
    ids = torch.randint(1, model.get_input_embeddings().num_embeddings - 1, (2, 12),
                        generator=torch.Generator().manual_seed(1))
    gates: dict[int, torch.Tensor] = {}
    handles = []
    for index, layer in enumerate(model.model.layers):
        attention = getattr(layer, "self_attn", None)
        if attention is not None and getattr(attention, gate_name, None) is not None:
            handles.append(getattr(attention, gate_name).register_forward_hook(
                lambda _m, _i, out, index=index: gates.__setitem__(index, torch.sigmoid(out.detach().float()))))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for handle in handles:
        handle.remove()
    assert gates, f"the tiny {model_type} has no {gate_name}: the test would check nothing"
    table = sinkscope.measure(["output_gate"], model, windows=ids.numpy()).table
    rows = table[(table["metric"] == "out_gate_mean") & table["head"].notna()]
    n_heads = model.config.num_attention_heads
    for layer, g in gates.items():
        expected = g.view(*g.shape[:2], n_heads, -1).mean(dim=(0, 1, 3)).double()  # (H,)
        got = rows[rows["layer"] == layer].sort_values("head")["value"].to_numpy()
        assert torch.allclose(torch.tensor(got), expected, atol=1e-6), (layer, got, expected)


def test_a_change_before_w_o_that_is_not_a_sigmoid_gate_is_refused_by_selectivity():
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    model = build_tiny("dory")  # sigmoid(g * s^2): a scaled gate
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    with pytest.raises(SinkscopeError, match="changes its attention output before W_O") as info:
        sinkscope.measure("selectivity", model, windows=ids)
    assert "\n" not in str(info.value)


def test_the_eager_fallback_is_named_and_refuses_what_it_cannot_read():
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    row = check_type("bloom", commands=False)
    assert row["path"] == "eager fallback"
    model = build_tiny("bloom")
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    messages = []
    result = sinkscope.measure("sinks", model, windows=ids, log=messages.append)
    assert result.manifest["model"]["spec"]["attention_path"] == "eager"
    assert any("output_attentions" in m and "quadratic" in m for m in messages)
    assert any(m.startswith("warning: the probe value_norm") for m in messages)  # values: not under the fallback
    assert (result.table.metric == "p0_mass").any()
    with pytest.raises(SinkscopeError, match="hook_v"):
        sinkscope.measure("inject", model, windows=ids, eval_batch=2)  # whole batches: structured junk


def test_a_sink_parameter_the_interface_does_not_receive_is_refused():
    from sinkscope.capture.discover import discover
    from tiny_models import build

    model = build("llama")
    for layer in model.model.layers:
        layer.self_attn.attention_sink = torch.nn.Parameter(torch.zeros(4))  # never handed to attention
    with pytest.raises(SinkscopeError) as info:
        discover(model)
    assert "attention_sink" in str(info.value) and "phantom mass as 0" in str(info.value)


@pytest.mark.slow  # sweeps architectures (every model type in transformers)
def test_the_whole_matrix_passes_at_least_nine_in_ten(tmp_path):
    from sinkscope.conformance import matrix, tiny

    rows = [check_type(t) for t in tiny.model_types()]
    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    passed = [r for r in checked if r["status"] == "pass"]
    assert len(passed) >= 0.9 * len(checked), [(r["model_type"], r["reason"]) for r in checked if r not in passed]
    matrix.write_markdown(rows, tmp_path / "architectures.md")
    assert f"**{len(passed)} of {len(checked)}**" in (tmp_path / "architectures.md").read_text()


# ---- where the matrix writes (issue 38): its own run folder, never the package or the current folder's docs/ ----


def _stamp(path):
    return path.read_bytes(), path.stat().st_mtime_ns


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _stub_rows(monkeypatch):
    """``matrix.check_type`` as a stub row (the checks of the write path need no model); returns the types it saw."""
    from sinkscope.conformance import matrix

    calls = []
    monkeypatch.setattr(matrix, "check_type", lambda model_type, commands=True: calls.append(model_type) or {
        "model_type": model_type, "class": "decoder", "status": "pass", "path": "interface", "missing": [],
        "reason": "stub"})
    return calls


def _one_error(capsys):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_the_matrix_run_from_another_folder_writes_only_its_run_folder(tmp_path, monkeypatch):
    """``--types ''`` (every type; here the list is llama alone) from another project's folder leaves that
    folder's docs/architectures.md and the installed verified.json as they were: the page and the rows go
    into a fresh reports/<time>-conformance-<id> that records them."""
    import json
    import re

    from sinkscope.conformance import matrix, tiny
    from sinkscope.store.files import foreign_entries, read_inventory

    project = tmp_path / "other"
    (project / "docs").mkdir(parents=True)
    theirs = project / "docs" / "architectures.md"
    theirs.write_text("# their page\n")
    before = {path: _stamp(path) for path in (theirs, matrix.VERIFIED)}
    monkeypatch.chdir(project)
    monkeypatch.setattr(tiny, "model_types", lambda: ["llama"])
    assert matrix.main(["--types", "", "--no-commands"]) == 0
    assert {path: _stamp(path) for path in before} == before
    (run,) = (project / "reports").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}-conformance-[0-9a-f]{6}", run.name)
    assert _files(project) == ["docs/architectures.md", f"reports/{run.name}/.sinkscope-files",
                               f"reports/{run.name}/architectures.md", f"reports/{run.name}/verified.json"]
    assert read_inventory(run)["writer"] == "conformance" and not foreign_entries(run)
    assert "| `llama` | decoder | pass |" in (run / "architectures.md").read_text()
    assert [r["model_type"] for r in json.loads((run / "verified.json").read_text())["rows"]] == ["llama"]


def test_a_second_matrix_into_a_folder_holding_a_foreign_file_refuses(tmp_path, monkeypatch, capsys):
    from sinkscope.conformance import matrix

    calls = _stub_rows(monkeypatch)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "matrix"
    args = ["--types", "llama", "--out", str(out)]
    assert matrix.main(args) == 0
    capsys.readouterr()
    assert matrix.main(args) == 1  # the matrix's own folder: replaced only when asked
    assert "already exists; pass --overwrite" in _one_error(capsys)
    assert matrix.main([*args, "--overwrite"]) == 0
    (out / "notes.txt").write_text("mine\n")
    page = _stamp(out / "architectures.md")
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert matrix.main(args + extra) == 1
        err = _one_error(capsys)
        assert "notes.txt" in err and "sinkscope did not write" in err
    assert (out / "notes.txt").read_text() == "mine\n" and _stamp(out / "architectures.md") == page
    assert calls == ["llama", "llama"]  # each refusal came before any model was built
    assert _files(tmp_path) == ["matrix/.sinkscope-files", "matrix/architectures.md", "matrix/notes.txt",
                                "matrix/verified.json"]


def test_an_unknown_model_type_is_one_sentence_with_did_you_mean(tmp_path, monkeypatch, capsys):
    from sinkscope.conformance import matrix

    monkeypatch.chdir(tmp_path)
    assert matrix.main(["--types", "llama,lama"]) == 1
    err = _one_error(capsys)
    assert err.startswith("error: unknown model type 'lama'") and err.endswith("did you mean 'llama'?\n"), err
    assert not list(tmp_path.iterdir())
    with pytest.raises(SinkscopeError, match="did you mean 'llama'"):
        check_type("lama")


def _checkout(root, page=None):
    """A folder that looks like a sinkscope checkout, holding an earlier matrix's page and rows."""
    from sinkscope.conformance import matrix

    (root / "docs").mkdir(parents=True)
    (root / "src/sinkscope/conformance").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "sinkscope"\n')
    (root / "src/sinkscope/conformance/matrix.py").write_text("")
    (root / "docs/architectures.md").write_text(page or f"{matrix.PAGE_TITLE}\n\nan earlier matrix\n")
    (root / "src/sinkscope/conformance/verified.json").write_text('{"rows": []}\n')
    return root


def test_update_repo_rewrites_a_checkouts_page_and_rows(tmp_path, monkeypatch, capsys):
    """The maintainers' path: the whole matrix (``--update-repo``, no --types) rewrites the checkout's two files."""
    import json

    from sinkscope.conformance import matrix, tiny

    _stub_rows(monkeypatch)
    monkeypatch.setattr(tiny, "model_types", lambda: ["llama", "opt"])
    checkout = _checkout(tmp_path / "sinkscope")
    installed = _stamp(matrix.VERIFIED)
    monkeypatch.chdir(tmp_path)
    assert matrix.main(["--update-repo", str(checkout), "--out", str(tmp_path / "run")]) == 0
    page = (checkout / "docs/architectures.md").read_text()
    assert "| `llama` | decoder | pass |" in page and "| `opt` |" in page
    assert page == (tmp_path / "run/architectures.md").read_text()
    rows = json.loads((checkout / "src/sinkscope/conformance/verified.json").read_text())["rows"]
    assert [r["model_type"] for r in rows] == ["llama", "opt"]
    assert _stamp(matrix.VERIFIED) == installed


def test_update_repo_refuses_what_is_not_a_checkout_or_not_the_matrixs_own(tmp_path, monkeypatch, capsys):
    from sinkscope.conformance import matrix, tiny

    calls = _stub_rows(monkeypatch)
    monkeypatch.setattr(tiny, "model_types", lambda: ["llama"])
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    (project / "docs/architectures.md").write_text("# their page\n")
    theirs = _checkout(tmp_path / "sinkscope", page="# a page someone wrote\n")
    ours = _checkout(tmp_path / "ours")
    before = {p: _stamp(p) for p in (project / "docs/architectures.md", theirs / "docs/architectures.md",
                                     ours / "docs/architectures.md")}
    for args, words in ((["--update-repo", str(project)], "is not a sinkscope checkout"),
                        (["--update-repo", str(theirs)], "was not written by the conformance matrix"),
                        (["--update-repo", str(ours), "--types", "llama"], "without --types")):
        assert matrix.main(args) == 1
        assert words in _one_error(capsys)
    assert {p: _stamp(p) for p in before} == before
    assert calls == [] and not (tmp_path / "reports").exists()
