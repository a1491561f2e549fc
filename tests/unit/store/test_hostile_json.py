"""Files that are valid JSON but hostile (issue 38): every JSON file sinkscope reads is one sentence
naming it when it is nested 200,000 levels deep, not JSON, not UTF-8 or of the wrong type, never a
``RecursionError`` traceback. The reader itself (``fileio.read_json``) and each reader that uses it;
the commands are in tests/e2e/test_hostile_json_cli.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sinkscope.store import files as fileio
from sinkscope.errors import SinkscopeError
from sinkscope.store.files import INVENTORY, JSON_MAX_DEPTH, parse_json, read_inventory, read_json, try_parse_json

#: a file of 200,000 nested lists: valid JSON that crashes a recursive parser.
DEEP = "[" * 200_000 + "]" * 200_000
#: nested deeper than JSON_MAX_DEPTH, but shallow enough that json.loads parses it.
DEEPISH = '{"a": ' * (JSON_MAX_DEPTH + 5) + "1" + "}" * (JSON_MAX_DEPTH + 5)


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _one_sentence(error: pytest.ExceptionInfo, path: Path) -> str:
    message = str(error.value)
    assert str(path) in message, message
    assert "\n" not in message and message.endswith("."), message
    return message


# ---- the reader ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, reason", [
    (DEEP, "not valid JSON (nested too deeply)"),
    (DEEPISH, f"not valid JSON (nested too deeply, more than {JSON_MAX_DEPTH} levels)"),
    ('{"a": 1,}', "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 9)"),
    ("", "not valid JSON (Expecting value at line 1 column 1)"),
    ("1" * 5000, "not valid JSON (Exceeds the limit"),
    (b'{"a": "\xff"}', "not UTF-8 text (byte 0xff at offset 7)"),
    ("[1, 2]", "holds a list where a JSON object belongs"),
    ('"text"', "holds a string where a JSON object belongs"),
])
def test_read_json_names_the_file_and_what_is_wrong(tmp_path, text, reason):
    path = _write(tmp_path / "config.json", text)
    with pytest.raises(SinkscopeError) as error:
        read_json(path, "the model's config.json", expect=dict)
    message = _one_sentence(error, path)
    assert message.startswith(f"the model's config.json at {path} is ") or \
        message.startswith(f"the model's config.json at {path} holds "), message
    assert reason in message and message.endswith("; repair or replace it."), message


def test_read_json_reads_what_is_sound(tmp_path):
    nested = {"a": [{"b": [1, 2.5, None, True, "ü"]}]}
    assert read_json(_write(tmp_path / "ok.json", json.dumps(nested)), "x", expect=dict) == nested
    at_limit = "[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH
    assert read_json(_write(tmp_path / "limit.json", at_limit), "x", expect=list) is not None
    assert read_json(_write(tmp_path / "list.json", "[1]"), "x") == [1]  # no expect: any type
    assert read_json(_write(tmp_path / "either.json", "[1]"), "x", expect=(dict, list)) == [1]


def test_read_json_missing_and_unreadable_files(tmp_path):
    assert read_json(tmp_path / "absent.json", "the record", missing_ok=True) is None
    with pytest.raises(SinkscopeError, match=re.escape(f"there is no the record at {tmp_path / 'absent.json'}")):
        read_json(tmp_path / "absent.json", "the record")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(SinkscopeError, match="could not read the record at .*folder.json"):
        read_json(tmp_path / "folder.json", "the record", hint="delete it")


def test_parse_json_and_try_parse_json():
    assert try_parse_json(DEEP) == (None, "nested too deeply")
    assert try_parse_json('{"a": [1]}') == ({"a": [1]}, None)
    with pytest.raises(SinkscopeError, match=r"^the header of X is not valid JSON \(nested too deeply\); delete it\.$"):
        parse_json(DEEP, "the header of X", hint="delete it")
    with pytest.raises(SinkscopeError, match="holds a JSON object where a list belongs"):
        parse_json("{}", "the rows", expect=list)


# ---- sinkscope's own files -----------------------------------------------------------------------------


def test_a_deep_inventory_is_one_sentence_and_no_inventory_is_none(tmp_path):
    assert read_inventory(tmp_path) is None
    path = _write(tmp_path / INVENTORY, DEEP)
    with pytest.raises(SinkscopeError) as error:
        read_inventory(tmp_path)
    assert "record of its files" in _one_sentence(error, path)
    with pytest.raises(SinkscopeError):  # and so every check that reads it
        fileio.check_replaceable(tmp_path, True, kind="run")
    _write(path, json.dumps({"writer": "run"}))
    with pytest.raises(SinkscopeError, match="holds no list of files"):
        read_inventory(tmp_path)
    _write(path, json.dumps({"sinkscope_files": 1, "writer": "run", "files": ["a"], "trees": []}))
    assert read_inventory(tmp_path)["files"] == ["a"]


def test_run_and_sweep_predicates_treat_a_deep_file_as_not_theirs(tmp_path):
    from sinkscope.run.comparison import _kept_tokens
    from sinkscope.store.results import is_run_folder
    from sinkscope.lab.sweep import _is_sweep_json

    _write(tmp_path / "run" / "manifest.json", DEEP)
    assert not is_run_folder(tmp_path / "run")
    assert _kept_tokens([tmp_path / "run"], [None]) is None
    assert not _is_sweep_json(_write(tmp_path / "sweep.json", DEEP))


def test_a_deep_run_manifest_is_one_sentence_in_read_run(tmp_path):
    from sinkscope.report.build import read_run

    path = _write(tmp_path / "run" / "manifest.json", DEEP)
    with pytest.raises(SinkscopeError) as error:
        read_run(tmp_path / "run")
    assert _one_sentence(error, path).startswith("the run's manifest at ")


def test_a_deep_checkpoint_config(tmp_path):
    from sinkscope.models.resolve import _checkpoint_step, one_training
    from sinkscope.models.checkpoint_folder import is_checkpoint, read_config

    path = _write(tmp_path / "step-7" / "config.json", DEEP)
    assert not is_checkpoint(path.parent)  # a predicate: resolving the model names the file
    assert _checkpoint_step(path.parent) == 7  # from the folder's name
    assert not one_training([str(path.parent)])
    with pytest.raises(SinkscopeError) as error:
        read_config(path.parent)
    message = _one_sentence(error, path)
    assert "not valid JSON (nested too deeply)" in message and "damaged" in message


def test_a_deep_state_file_header_is_damaged(tmp_path):
    import torch
    from safetensors.torch import save

    from sinkscope.store.statefile import load_state, read_header

    path = tmp_path / ".run.progress.safetensors"
    path.write_bytes(save({"t0": torch.zeros(2)}, metadata={"sinkscope_state": "1", "header": DEEP, "skeleton": DEEP}))
    with pytest.raises(SinkscopeError, match=r"damaged or was not written by sinkscope \(its header is not JSON "
                                             r"\(nested too deeply\)\)"):
        read_header(path)
    with pytest.raises(SinkscopeError, match=r"its skeleton is not JSON \(nested too deeply\)"):
        load_state(path)


def test_a_deep_monitor_manifest(tmp_path):
    from sinkscope.train.monitor import MANIFEST, SinkMonitor
    from sinkscope.report.steps import MONITOR_TABLE, read_monitor

    path = _write(tmp_path / MANIFEST, DEEP)
    with pytest.raises(SinkscopeError) as error:
        SinkMonitor(every=1, windows=np.zeros((1, 8), dtype=np.int64), out=tmp_path)
    assert _one_sentence(error, path).startswith("the monitor's manifest at ")
    _write(tmp_path / MONITOR_TABLE, "step,metric,layer,head,value\n0,p0_mass,0,,0.5\n")
    assert read_monitor(tmp_path)[1] is None  # the windows' length is unknown, as for any unreadable manifest


def test_a_deep_corpus_record(tmp_path):
    from sinkscope.data.fetch import SOURCE_FILE, corpus_chars

    path = _write(tmp_path / SOURCE_FILE, DEEP)
    with pytest.raises(SinkscopeError) as error:
        corpus_chars(tmp_path)
    assert "--force" in _one_sentence(error, path)


def test_a_deep_conformance_file_counts_as_none(tmp_path, monkeypatch):
    from sinkscope.conformance import matrix

    monkeypatch.setattr(matrix, "VERIFIED", _write(tmp_path / "verified.json", DEEP))
    assert matrix.read_verified() and all(row["path"] == "interface" for row in matrix.read_verified())
    assert not matrix._is_rows(tmp_path / "verified.json")


# ---- models' and tokenizers' files, read before transformers reads them ---------------------------------------


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json", "generation_config.json",
                                  "special_tokens_map.json", "model.safetensors.index.json"])
def test_check_model_files_names_a_deep_file(tmp_path, name):
    from sinkscope.models.resolve import check_model_files, resolve_source

    _write(tmp_path / "config.json", json.dumps({"model_type": "llama"}))
    check_model_files(tmp_path)  # sound
    path = _write(tmp_path / name, DEEP)
    for call in (lambda: check_model_files(tmp_path), lambda: resolve_source(str(tmp_path))):
        with pytest.raises(SinkscopeError) as error:
            call()
        assert _one_sentence(error, path).startswith(f"the model's {name} at {path} is not valid JSON (nested too deeply)")


def test_the_loaders_check_before_transformers(tmp_path):
    from sinkscope.models.resolve import Source
    from sinkscope.run.loaders import load_model, load_tokenizer
    from sinkscope.models.model_config import check_json_files, config_file_dict
    from sinkscope.train.data import load_tokenizer_folder

    path = _write(tmp_path / "config.json", DEEP)
    source = Source("folder", str(tmp_path), str(tmp_path))  # as the API may build one, not resolved
    for call in (lambda: check_json_files(source), lambda: config_file_dict(source),
                 lambda: load_tokenizer(source), lambda: load_model(source, device="cpu")):
        with pytest.raises(SinkscopeError) as error:
            call()
        assert _one_sentence(error, path).startswith("the model's config.json at ")
    with pytest.raises(SinkscopeError) as error:
        load_tokenizer_folder(tmp_path, f"in {tmp_path}")
    assert _one_sentence(error, path).startswith("the tokenizer's config.json at ")


def test_a_deep_gguf_cache_file_is_rebuilt_not_fatal(tmp_path, monkeypatch):
    from sinkscope.models import model_config as sources
    from sinkscope.run import loaders

    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "_KEYS", {})
    gguf = _write(tmp_path / "m.gguf", b"GGUF" + bytes(64))
    _write(tmp_path / "cache" / "gguf-hashes.json", DEEP)
    cache = sources.gguf_cache_dir(gguf)  # a damaged index: rehashed and rewritten
    assert json.loads((tmp_path / "cache" / "gguf-hashes.json").read_text())
    _write(cache / "config.json", DEEP)
    _write(cache / "SINKSCOPE_COMPLETE", "done")
    assert not loaders._gguf_cached(cache)  # rebuilt from the GGUF when the model loads
    assert sources.config_file_dict(sources.Source("gguf", str(gguf), str(gguf))) is None


def test_read_json_once_parses_each_version_of_a_file_once(tmp_path, monkeypatch):
    """A model's config.json is asked for when it is resolved, checked and loaded: parsed once per version,
    each caller its own copy, and a damaged file is never remembered (every caller gets its sentence)."""
    import os

    from sinkscope.store import files as fileio

    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 2}')
    calls = []
    original = fileio.read_json
    monkeypatch.setattr(fileio, "read_json", lambda *a, **k: calls.append(a[0]) or original(*a, **k))
    first = fileio.read_json_once(path, "the model's config.json", expect=dict)
    first["num_hidden_layers"] = 99  # a caller's change stays its own
    assert fileio.read_json_once(path, "the model's config.json") == {"num_hidden_layers": 2} and len(calls) == 1
    path.write_text('{"num_hidden_layers": 3, "x": 1}')  # a new version is read again
    os.utime(path, ns=(1, 10 ** 18))
    assert fileio.read_json_once(path, "the model's config.json")["num_hidden_layers"] == 3 and len(calls) == 2
    with pytest.raises(SinkscopeError, match="holds a JSON object where a JSON array belongs|where"):
        fileio.read_json_once(path, "the model's config.json", expect=list)
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 200000 + "]" * 200000)
    for _ in range(2):  # not remembered: read (and refused) each time
        with pytest.raises(SinkscopeError, match="bad.json"):
            fileio.read_json_once(bad, "the run's manifest")
    with pytest.raises(SinkscopeError, match="there is no"):
        fileio.read_json_once(tmp_path / "absent.json", "the model's config.json")
