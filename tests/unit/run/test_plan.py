"""plan.plan: every torch-free check once, each model resolved once, plain plans (src/sinkscope/run/plan.py).

The references are the models and folders built in the test: a tiny Llama folder (two copies), a
folder of two trainer checkpoints of one training (a series) and of two trainings (two models).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

import sinkscope.run.plan as plan_mod
from checkpoints import trainer_checkpoint
from sinkscope.errors import SinkscopeError
from sinkscope.run.plan import Comparison, Plan, plan


def _resolves(monkeypatch) -> list:
    """Count resolve_source calls (each model must be resolved exactly once)."""
    calls = []
    original = plan_mod.resolve_source

    def counted(model, revision=None):
        calls.append((model, revision))
        return original(model, revision)

    monkeypatch.setattr(plan_mod, "resolve_source", counted)
    return calls


def test_one_model_is_one_plain_plan(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    calls = _resolves(monkeypatch)
    plans = plan("sinks", {"model": str(tiny_llama_dir), "text_file": str(text_file), "seq_len": "32",
                           "out": str(tmp_path / "run")})
    assert calls == [(str(tiny_llama_dir), None)]
    (one,) = plans
    assert isinstance(one, Plan) and one.comparison is None and one.command == "sinks"
    assert one.source.kind == "folder" and one.options.seq_len == 32 and one.options.out == str(tmp_path / "run")
    record = json.loads(json.dumps(one.to_dict()))  # JSON-able, as the manifest stores it
    assert record["source"]["location"] == str(tiny_llama_dir) and record["options"]["seq_len"] == 32
    assert pickle.loads(pickle.dumps(one)) == one  # picklable, for executors that ship plans


def test_several_models_share_one_comparison(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    other = tmp_path / "other-llama"
    shutil.copytree(tiny_llama_dir, other)
    calls = _resolves(monkeypatch)
    plans = plan("heads", {"text_file": str(text_file), "out": str(tmp_path / "cmp")},
                 models=[str(tiny_llama_dir), str(other)], labels=["a", "b"])
    assert len(calls) == 2 and len(plans) == 2
    comparison = plans[0].comparison
    assert comparison == Comparison(str(tmp_path / "cmp"), False, None, ("a", "b"), figures=True)
    assert all(p.comparison is comparison for p in plans)
    outs = [Path(p.options.out) for p in plans]
    assert [o.parent for o in outs] == [tmp_path / "cmp"] * 2 and len(set(outs)) == 2
    assert not any(p.options.figures for p in plans)  # the figures are drawn once, on the comparison page


def test_a_folder_of_one_trainings_checkpoints_is_a_series(tmp_path, tokenizer, text_file):
    root = tmp_path / "ckpts"
    for step in ("step-1", "step-2"):
        trainer_checkpoint(root / step, "baseline", tokenizer)
    plans = plan("sinks", {"text_file": str(text_file), "out": str(tmp_path / "series")}, models=[str(root)])
    assert [dict(p.conditions) for p in plans] == [{"revision": "step-1"}, {"revision": "step-2"}]
    assert plans[0].comparison.series and plans[0].comparison.labels == ("step-1", "step-2")


def test_several_trainings_checkpoints_are_several_models(tmp_path, tokenizer, text_file):
    root = tmp_path / "ckpts"
    trainer_checkpoint(root / "baseline", "baseline", tokenizer, seed=0)
    trainer_checkpoint(root / "normgate", "normgate", tokenizer, seed=1)
    plans = plan("sinks", {"text_file": str(text_file), "out": str(tmp_path / "cmp")}, models=str(root))
    assert len(plans) == 2 and not plans[0].comparison.series and all(p.conditions == () for p in plans)


@pytest.mark.parametrize("call, words", [
    (dict(models=["a", "b"], revisions="step0,step1"), "several revisions are the checkpoints of one model"),
    (dict(group_by="variant"), "--group-by averages runs of several models"),
    (dict(models=[3, 4]), "models are hub ids or paths"),
    (dict(labels=["x", "y"]), "give one label per model"),
])
def test_mistakes_are_one_sentence_before_anything_loads(call, words, tiny_llama_dir, text_file):
    models = call.pop("models", [str(tiny_llama_dir)])
    with pytest.raises(SinkscopeError, match=words):
        plan("sinks", {"text_file": str(text_file)}, models=models, **call)


def test_the_inputs_a_user_gets_wrong_are_refused_here(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    with pytest.raises(SinkscopeError, match="no text file at"):
        plan("sinks", {"model": str(tiny_llama_dir), "text_file": str(tmp_path / "missing.txt")})
    with pytest.raises(SinkscopeError, match="no model file or folder"):
        plan("sinks", {"model": str(tmp_path / "no-such-model"), "text_file": str(text_file)})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(SinkscopeError, match="sinkscope did not write"):
        plan("sinks", {"model": str(tiny_llama_dir), "text_file": str(text_file), "out": str(tmp_path / "full")})
    plan("sinks", {"model": str(tiny_llama_dir), "text_file": str(text_file), "out": str(tmp_path / "full")},
         write=False)  # an in-memory run has no folder to check
    with pytest.raises(SinkscopeError, match="--seq-len must be at least 2"):
        plan("sinks", {"model": str(tiny_llama_dir), "seq_len": 1})


def test_plan_imports_no_torch():
    """The command line plans before torch loads: run/plan.py and what it imports stay torch-free."""
    import ast

    tree = ast.parse(Path(plan_mod.__file__).read_text(encoding="utf-8"))
    modules = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(m.split(".")[0] in ("torch", "transformers") for m in modules)
    assert not {"sinkscope.run.prepare", "sinkscope.run.load", "sinkscope.run.loaders"} & set(modules)
