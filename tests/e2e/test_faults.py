"""Bad input battery: every failure is one sentence, a non-zero exit, and nothing written is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import sinkscope

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.models.resolve import default_gguf_path
from tiny_models import build
from repo_paths import GOLDEN, REPO

runner = CliRunner()
_SRC = str(Path(sinkscope.__file__).parents[1])  # the code under test, for subprocesses


def _error_line(result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _sinks(*args):
    return runner.invoke(app, ["sinks", *args, "--no-progress", "--no-figures", "--seq-len", "16", "--n-seqs", "2"])


@pytest.fixture
def existing_run(tiny_llama_dir, text_file, tmp_path) -> Path:
    """A finished run folder whose bytes must survive every failure below."""
    out = tmp_path / "existing"
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out)).exit_code == 0
    return out


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_truncated_safetensors_is_one_sentence(tiny_llama_dir, text_file, tmp_path, existing_run):
    broken = Path(shutil.copytree(tiny_llama_dir, tmp_path / "truncated"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(broken), "--text-file", str(text_file), "--out", str(existing_run), "--overwrite"))
    assert "could not load the model folder" in line
    assert _snapshot(existing_run) == before


def test_gguf_with_a_flipped_header_byte(tmp_path, text_file):
    broken = tmp_path / "broken.gguf"
    data = bytearray(default_gguf_path().read_bytes())
    data[0] ^= 0xFF  # the magic "GGUF" is no longer
    broken.write_bytes(bytes(data))
    line = _error_line(_sinks(str(broken), "--text-file", str(text_file), "--out", str(tmp_path / "out")))
    assert "could not read the GGUF file" in line
    assert not (tmp_path / "out").exists()


def test_model_with_a_nan_weight(tmp_path, text_file, existing_run):
    model = build("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
    folder = tmp_path / "nan-model"
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(folder), "--text-file", str(text_file), "--out", str(existing_run), "--overwrite"))
    assert "non-finite" in line and "layer 0" in line
    assert _snapshot(existing_run) == before


def test_unknown_hub_id_offline(tmp_path, text_file, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    line = _error_line(_sinks("EleutherAI/pythia-1bb", "--text-file", str(text_file), "--out", str(tmp_path / "o")))
    assert "not available offline" in line


def test_unwritable_output_is_one_sentence(tiny_llama_dir, text_file, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(blocker / "run")))
    assert "could not write" in line or "not a folder" in line


def test_same_command_gives_byte_identical_tables(tiny_llama_dir, text_file, tmp_path):
    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seed", "7"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert _sinks(*args, "--out", str(a)).exit_code == 0
    assert _sinks(*args, "--out", str(b)).exit_code == 0
    assert (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()
    assert (a / "tokens.npy").read_bytes() == (b / "tokens.npy").read_bytes()


def test_remote_code_is_refused_without_the_flag(tmp_path, text_file):
    """A folder whose config asks for custom code is not executed unless --trust-remote-code."""
    import json

    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {
        "AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (folder / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    make_tokenizer().save_pretrained(folder)
    result = _sinks(str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "o"))
    line = _error_line(result)
    assert "remote code ran" not in result.output
    assert "trust-remote-code" in line or "cannot build" in line or "could not load" in line


def test_inputs_are_checked_before_the_model_loads(tiny_llama_dir, tmp_path, monkeypatch):
    """A too-short text fails before any weights are read, at any --seq-len (one past the trained context only warns)."""
    import sinkscope.run.load

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(sinkscope.run.load, "load_model", no_loading)
    short = tmp_path / "short.txt"
    short.write_text("three words only", encoding="utf-8")
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(short), "--out", str(tmp_path / "a")))
    assert "enough for 0 windows" in line
    line = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(short), "--seq-len", "9999",
                               "--out", str(tmp_path / "b")])
    assert "enough for 0 windows" in _error_line(line)


def test_a_full_disk_is_one_sentence_and_keeps_the_old_run(tiny_llama_dir, text_file, existing_run, monkeypatch):
    import errno

    def disk_full(stage, *args, **kwargs):
        (Path(stage) / "results.csv").write_text("half a tab")  # a partial write inside the stage ...
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(stage) / "results.parquet"))

    import sinkscope.run.result

    monkeypatch.setattr(sinkscope.run.result, "write_tables", disk_full)
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(existing_run),
                              "--overwrite"))
    assert "No space left on device" in line and "unchanged" in line
    assert _snapshot(existing_run) == before  # ... never reaches the run folder
    assert not list(existing_run.parent.glob(".existing.partial-*"))


# ---- issue 17: nothing lost ------------------------------------------------------------------------


def _no_loading(monkeypatch):
    """Fail the test if the model is loaded (for checks that must come first)."""
    import sinkscope.run.load

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(sinkscope.run.load, "load_model", no_loading)


def test_overwrite_never_replaces_the_model_being_measured(tiny_llama_dir, text_file, tmp_path):
    """`sinks ckpt --out ckpt --overwrite` used to delete the model it was measuring."""
    model = Path(shutil.copytree(tiny_llama_dir, tmp_path / "model"))
    before = _snapshot(model)
    line = _error_line(_sinks(str(model), "--text-file", str(text_file), "--out", str(model), "--overwrite"))
    assert "lies inside" in line or "did not write" in line
    assert _snapshot(model) == before


def test_overwrite_never_replaces_a_folder_of_other_files(tiny_llama_dir, text_file, tmp_path):
    mydata = tmp_path / "mydata"
    mydata.mkdir()
    (mydata / "thesis.tex").write_text("\\documentclass{article}")
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(mydata),
                              "--overwrite"))
    assert "holds files sinkscope did not write" in line
    assert (mydata / "thesis.tex").read_text() == "\\documentclass{article}"
    # an empty folder, or a run folder (our manifest), may be replaced
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(empty)).exit_code == 0
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(empty),
                  "--overwrite").exit_code == 0


def test_a_second_writer_of_one_folder_fails_with_one_sentence(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from sinkscope.store.results import lock_run_dir
    from sinkscope.store.files import lock_path

    out = tmp_path / "race"
    _no_loading(monkeypatch)
    with lock_run_dir(out):  # a first run, still writing
        line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out)))
        assert "another sinkscope run" in line and "is writing" in line and str(out) in line
    assert not lock_path(out).exists()  # released and removed
    monkeypatch.undo()
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out)).exit_code == 0
    assert not lock_path(out).exists()


def test_the_lock_is_released_when_a_run_fails(tiny_llama_dir, text_file, tmp_path):
    from sinkscope.store.files import lock_path

    out = tmp_path / "again"
    bad = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out), "--sink-epsilon", "0.1",
                 "--attention", "nope")
    assert bad.exit_code == 1
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    assert _sinks(str(broken), "--text-file", str(text_file), "--out", str(out)).exit_code == 1
    assert not lock_path(out).exists()
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out)).exit_code == 0


@pytest.mark.slow  # spawns Python
def test_the_lock_holds_across_processes(tmp_path):
    """flock: another process holding the lock file is seen, and a killed holder leaves no stale lock."""
    import signal
    import subprocess
    import sys
    import time

    from sinkscope.errors import SinkscopeError
    from sinkscope.store.results import lock_run_dir
    from sinkscope.store.files import lock_path

    out = tmp_path / "shared"
    src = _SRC
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from sinkscope.store.results import lock_run_dir\n"
         f"with lock_run_dir({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SinkscopeError, match=f"process {holder.pid}"):
            with lock_run_dir(out):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(out).exists()  # the killed holder's file is left ...
    deadline = time.time() + 5
    with lock_run_dir(out):  # ... but not its lock
        assert time.time() < deadline
    assert not lock_path(out).exists()


def test_default_run_ids_are_unique_per_run(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from sinkscope.store.results import default_run_dir

    ids = {default_run_dir("SmolLM2", seed).name for seed in (0, 0, 1, 1)}
    assert len(ids) == 4
    assert all("-SmolLM2-s" in name for name in ids)
    # two runs with the default --out started in the same second keep both seeds
    monkeypatch.chdir(tmp_path)
    for seed in ("0", "1"):
        assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seed", seed).exit_code == 0
    runs = sorted((tmp_path / "reports").iterdir())
    assert len(runs) == 2
    import json

    assert sorted(json.loads((r / "manifest.json").read_text())["windows"]["seed"] for r in runs) == [0, 1]


def test_an_unwritable_cache_warns_and_keeps_the_model_in_memory(tmp_path, monkeypatch):
    """A GGUF load whose float32 cache cannot be written goes on with the dequantised model."""
    import transformers

    from sinkscope.run import loaders as sources

    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("SINKSCOPE_CACHE", str(blocker / "sub"))  # mkdir fails even for root
    model, tokenizer = build("llama"), make_tokenizer()
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    messages: list[str] = []
    loaded, loaded_tokenizer, cache = sources._load_gguf(gguf, messages.append)
    assert loaded is model and loaded_tokenizer is tokenizer
    assert not sources._gguf_cached(cache)  # so load_model records no float32_cache in the manifest
    warnings = [m for m in messages if m.startswith("warning: could not cache")]
    assert len(warnings) == 1 and "going on with the model in memory" in warnings[0]


# ---- issue 17: one sentence instead of a traceback ------------------------------------------------------


def test_a_tokenizer_of_another_model_is_one_sentence(tmp_path, text_file):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128))
    folder = tmp_path / "small-vocab"
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)  # ids up to ~300
    line = _error_line(_sinks(str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "o")))
    assert "embedding has only 64 rows" in line and "does not belong to this model" in line


def test_the_vocab_check_runs_on_the_loaded_model_too():
    import numpy as np

    from sinkscope.data.corpus import check_token_range
    from sinkscope.errors import SinkscopeError
    from sinkscope.run.loaders import embedding_rows

    rows = embedding_rows(build("gpt2"))
    check_token_range(np.array([[0, rows - 1]]), rows)
    with pytest.raises(SinkscopeError, match=f"token id {rows}"):
        check_token_range(np.array([[0, rows]]), rows)


@pytest.mark.parametrize("device", ["mps", "xpu", "meta", "cuda:7"])
def test_unsupported_devices_fail_before_loading(device, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--device", device,
                              "--out", str(tmp_path / "o")))
    assert f"--device {device}" in line
    assert not (tmp_path / "o").exists()


def test_a_negative_seed_is_one_sentence(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seed", "-1",
                              "--out", str(tmp_path / "o")))
    assert "--seed must be a non-negative integer" in line


@pytest.mark.parametrize("start, phrase", [("-1", "must be 0 or more"), ("3", "outside the model's 3 layers"),
                                           ("7", "outside the model's 3 layers")])
def test_sink_layer_start_must_name_a_layer(start, phrase, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    _no_loading(monkeypatch)  # the folder's config.json says 3 layers: refused before loading
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--sink-layer-start", start,
                              "--out", str(tmp_path / "o")))
    assert phrase in line


def test_sink_layer_start_is_checked_on_the_loaded_model():
    from sinkscope.errors import SinkscopeError
    from sinkscope.commands.spec import check_layer_start

    check_layer_start(None, 2)  # not given: 2 on models with more than 2 layers, else no [2:] row
    check_layer_start(1, 2, (0, 1))
    with pytest.raises(SinkscopeError, match="outside the model's 4 layers"):
        check_layer_start(4, 4, (1, 3))
    with pytest.raises(SinkscopeError, match="past the model's last softmax-attention layer"):
        check_layer_start(2, 3, (0, 1))  # Qwen3-Next style: layer 2 has no softmax attention


def test_a_default_sink_layer_start_on_a_two_layer_model_gives_no_mislabelled_row(tiny_llama_dir, text_file,
                                                                                  tokenizer, tmp_path):
    import pandas as pd
    from transformers import LlamaConfig, LlamaForCausalLM

    two = tmp_path / "two-layers"
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=128)).save_pretrained(two)
    tokenizer.save_pretrained(two)
    out = tmp_path / "o"
    assert _sinks(str(two), "--text-file", str(text_file), "--seq-len", "32", "--out", str(out)).exit_code == 0
    metrics = set(pd.read_csv(out / "results.csv").metric)
    assert "sink_rate_from_layer" not in metrics
    out = tmp_path / "three"  # the 3-layer tiny model gets the P0-sink study's [2:] row
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "32", "--out", str(out)).exit_code == 0
    table = pd.read_csv(out / "results.csv")
    assert table.loc[table.metric == "sink_rate_from_layer", "layer_start"].tolist() == [2]


def test_a_garbage_device_map_names_the_option(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--device-map", "garbage",
                              "--out", str(tmp_path / "o")))
    assert "unknown --device-map 'garbage'" in line and "architecture" not in line


@pytest.mark.parametrize("out", [".", "..", "{cwd}"])
def test_the_current_folder_is_refused_before_loading(out, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _no_loading(monkeypatch)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", out.format(cwd=work),
                              "--overwrite"))
    assert "is the current folder or one above it" in line


def test_an_unwritable_output_place_is_refused_before_loading(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _no_loading(monkeypatch)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(blocker / "run")))
    assert "could not write the run folder" in line
    assert blocker.read_text() == "not a folder"


def _golden_copy(tmp_path, name="run_tiny_llama") -> Path:
    return Path(shutil.copytree(GOLDEN / name, tmp_path / name))


def _damage_missing_value(run: Path) -> None:
    import pandas as pd

    for name, write in (("results.csv", lambda f, p: f.to_csv(p, index=False)),
                        ("results.parquet", lambda f, p: f.to_parquet(p, index=False))):
        frame = pd.read_csv(run / "results.csv") if name.endswith("csv") else pd.read_parquet(run / name)
        write(frame.drop(columns=["value"]), run / name)


def _damage_csv(run: Path) -> None:
    (run / "results.parquet").unlink()
    (run / "results.csv").write_bytes(b'probe,metric,layer,head,value,n\n"p0_mass,\x00\xff"broken\n')


def _damage_parquet(run: Path) -> None:
    (run / "results.parquet").write_bytes(b"")


def _damage_value(run: Path) -> None:
    (run / "results.parquet").unlink()
    text = (run / "results.csv").read_text().splitlines()
    fields = text[1].split(",")
    fields[4] = "abc"
    (run / "results.csv").write_text("\n".join([text[0], ",".join(fields), *text[2:]]) + "\n")


def _damage_disagree(run: Path) -> None:
    text = (run / "results.csv").read_text().splitlines()
    fields = text[3].split(",")
    fields[4] = "0.123456"
    (run / "results.csv").write_text("\n".join([*text[:3], ",".join(fields), *text[4:]]) + "\n")


@pytest.mark.parametrize("damage, phrase", [
    (_damage_missing_value, "lacks the columns ['value']"),
    (_damage_csv, "results.csv"),
    (_damage_parquet, "could not read"),
    (_damage_value, "not a number"),
    (_damage_disagree, "results.parquet and results.csv"),
])
def test_report_on_damaged_tables_is_one_sentence(damage, phrase, tmp_path):
    run = _golden_copy(tmp_path)
    damage(run)
    line = _error_line(runner.invoke(app, ["report", str(run)]))
    assert phrase in line
    assert not (run / "report.html").exists()


def test_report_says_which_copy_disagrees_and_how_to_recover(tmp_path):
    run = _golden_copy(tmp_path)
    _damage_disagree(run)
    line = _error_line(runner.invoke(app, ["report", str(run)]))
    assert "disagree" in line and "delete the wrong one" in line and "row 3" in line
    (run / "results.csv").unlink()  # the user deletes the edited copy: the report works again
    assert runner.invoke(app, ["report", str(run)]).exit_code == 0


@pytest.mark.parametrize("text, phrase", [
    ('command = "sinks"\noptions = 3\n', "must be a table"),
    ('command = "sinks"\nmodel = "EleutherAI/pythia-1b"\n[options]\nn_seqs = 2\n',
     "unknown top-level key 'model' (an option: put it under [options])"),
    ('command = "sinks"\nfoo = 1\n', "unknown top-level key 'foo'"),
])
def test_recipe_mistakes_are_one_sentence(text, phrase, tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    assert phrase in _error_line(runner.invoke(app, ["run", str(recipe)]))


# ---- issue 17: friction --------------------------------------------------------------------------------


@pytest.mark.slow  # spawns Python
def test_an_uncached_hub_id_fails_fast_without_retries(tmp_path):
    """Online but the hub unreachable: one short request, no 'Retrying' lines, one sentence (was ~50 s)."""
    import os
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(PYTHONPATH=_SRC, HF_HOME=str(tmp_path / "hf"),
               HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there: connection refused
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sinkscope", "sinks", "EleutherAI/pythia-1bb", "--text-file",
                           str(GOLDEN / "sample.txt"), "--out", str(tmp_path / "o")],
                          env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - started
    assert proc.returncode == 1, proc.stderr
    assert "Retrying" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the hub could not be reached" in errors[0], proc.stderr
    assert took < 45, took  # imports included, on a loaded CI machine; ~50 s of retries before (the retries: no "Retrying")


def test_a_mistyped_local_folder_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    from sinkscope.errors import SinkscopeError
    from sinkscope.models.resolve import resolve_source

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(SinkscopeError, match="no model file or folder at ckpt/sinklogt"):
        resolve_source("ckpt/sinklogt")


def test_a_run_names_its_folder_keeps_the_umask_and_says_what_bos_did(tiny_llama_dir, text_file, tmp_path):
    import json
    import os
    import stat

    out = tmp_path / "named"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert f"<code>{out}</code>" in html and ".partial-" not in html
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask  # not mkdtemp's 0o700
    assert stat.S_IMODE((out / "figures").stat().st_mode) == 0o777 & ~umask
    # the tokenizer has a BOS (<bos>, id 0) that it does not add
    assert json.loads((out / "manifest.json").read_text())["windows"]["tokenizer_bos_id"] == 0
    assert "auto: no BOS prepended (the tokenizer's BOS, id 0, is not added by default)" in html.replace("&#39;", "'")
    assert "bos id none" not in html


def test_bos_summary_says_what_happened_at_position_0():
    from sinkscope.report.page import bos_summary

    assert bos_summary({"bos_policy": "auto", "bos_id": None, "tokenizer_bos_id": 1}) == (
        "auto: no BOS prepended (the tokenizer's BOS, id 1, is not added by default)")
    assert bos_summary({"bos_policy": "auto", "bos_id": 1, "tokenizer_bos_id": 1}) == (
        "auto: BOS id 1 prepended to every window (the tokenizer adds it by default)")
    assert bos_summary({"bos_policy": "add", "bos_id": 1, "tokenizer_bos_id": 1}) == "add: BOS id 1 prepended to every window"
    assert bos_summary({"bos_policy": "none", "bos_id": None, "tokenizer_bos_id": None}) == (
        "none: no BOS prepended (the tokenizer has no BOS token)")


def test_phantom_figures_only_for_models_with_a_phantom(tmp_path):
    from sinkscope.report import build_report

    llama = _golden_copy(tmp_path)
    html = build_report([llama]).read_text()
    assert not list((llama / "figures").glob("*phantom*"))
    assert "The model has no learned phantom key, so its phantom_mass is 0 by construction" in html
    gpt_oss = _golden_copy(tmp_path, "run_tiny_gpt_oss")
    build_report([gpt_oss])
    assert (gpt_oss / "figures" / "heatmap_phantom_mass.png").is_file()
    # a comparison draws the phantom heatmap of the run that has one, and says which has none
    page = build_report([llama, gpt_oss], out=tmp_path / "cmp").read_text()
    assert "run_tiny_llama has no learned phantom key" in page
    assert [p.name for p in (tmp_path / "cmp" / "figures").glob("heatmap_phantom_mass*.png")] == [
        "heatmap_phantom_mass_run1.png"]  # named by the run's position


def test_p0_figures_draw_the_uniform_floor(tmp_path, monkeypatch):
    import numpy as np

    from sinkscope.report import build, build_report, figures

    drawn = {}
    for name in ("per_layer_line", "layer_head_heatmap"):
        original = getattr(figures, name)

        def spy(table, metric, *args, _original=original, _name=name, **kwargs):
            fig = _original(table, metric, *args, **kwargs)
            drawn.setdefault((_name, metric), fig)
            return fig

        monkeypatch.setattr(figures, name, spy)
    build_report([_golden_copy(tmp_path)])
    floor = np.mean([1 / (i + 1) for i in range(1, 32)])  # seq-len 32
    assert build.uniform_p0(32) == pytest.approx(floor)
    line_fig = drawn[("per_layer_line", "p0_mass")]
    refs = [l for l in line_fig.axes[0].lines if np.allclose(l.get_ydata(), floor)]
    assert len(refs) == 1 and "uniform attention" in refs[0].get_label()
    heat = drawn[("layer_head_heatmap", "p0_mass")]
    colorbar_marks = [l for l in heat.axes[1].lines if np.allclose(l.get_ydata(), floor)]
    lo, hi = heat.axes[0].images[0].get_clim()
    assert colorbar_marks or not lo <= floor <= hi
    # other metrics get no reference
    assert not [l for l in drawn[("per_layer_line", "value_norm_ratio")].axes[0].lines if l.get_linestyle() == "--"]


def test_the_comparison_warns_when_the_windows_differ(tmp_path):
    import json

    from sinkscope.report import build_report

    a, b = _golden_copy(tmp_path), _golden_copy(tmp_path, "run_tiny_gpt_oss")
    same = build_report([a, b], out=tmp_path / "same").read_text()
    assert "Check before comparing" not in same
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["windows"].update(seq_len=64, bos_policy="add", bos_id=0)
    manifest["corpus"].update(name="other.txt", sha256="f" * 64)
    (b / "manifest.json").write_text(json.dumps(manifest))
    page = build_report([a, b], out=tmp_path / "differ").read_text()
    assert "Check before comparing" in page
    for what in ("seq-len", "corpus", "BOS policy"):
        assert f"The runs differ in {what}" in page


def test_help_says_what_no_figures_skips_and_shows_train_defaults():
    import re

    def text(args):
        result = runner.invoke(app, args)
        assert result.exit_code == 0
        return re.sub(r"\s+", " ", result.output)

    assert "--no-figures writes neither" in text(["sinks", "--help"])
    train_help = text(["train", "--help"])
    for default in ("[default: baseline]", "[default: micro for --task trigger, tiny for text]", "[default: 0]",
                    "[default: the tier's; 600 for tiny, 1000 for micro]", "[default: text]"):
        assert default in train_help


def test_readme_does_not_show_a_shell_pipe_for_ls_and_documents_offline_mode():
    readme = (REPO / "README.md").read_text()
    assert "ls probes | families" not in readme
    assert "HF_HUB_OFFLINE" in readme


@pytest.mark.slow  # trains
def test_the_printed_training_loss_is_the_one_in_log_csv(tmp_path, text_file):
    import csv

    from sinkscope.train.loop import train
    from sinkscope.train.config import TrainOptions

    messages: list[str] = []
    out = tmp_path / "ckpt"
    train(TrainOptions(out=str(out), text_file=str(text_file), tokenizer="bpe300", steps=6, batch_size=4, windows="random",
                       warmup_steps=1, eval_every=3, eval_windows=2, checkpoint_every=6, log_every=3,
                       overrides=["n_layer=1", "n_head=2", "n_embd=32", "block_size=16"], progress=False),
          log=messages.append)
    rows = {int(r["step"]): r for r in csv.DictReader((out / "log.csv").open())}
    lines = [m for m in messages if m.startswith("step ")]
    assert len(lines) == 2
    for line in lines:
        step = int(line.split(":")[0].split()[1])
        printed = line.split("train ")[1].split()[0]
        assert "as in log.csv" in line
        assert float(printed) == pytest.approx(float(rows[step]["train_loss"]), abs=1e-4)


def test_progress_messages_count_documents_in_english():
    from sinkscope.data.corpus import Corpus

    assert Corpus("sample.txt", ["a"]).describe() == "'sample.txt' (1 document)"
    assert Corpus("austen", ["a", "b"]).describe() == "'austen' (2 documents)"


@pytest.mark.parametrize("after_a_checkpoint", [False, True])
def test_ctrl_c_exits_130_before_and_after_the_first_checkpoint(after_a_checkpoint, tiny_llama_dir, text_file,
                                                               tmp_path, monkeypatch):
    import sinkscope.run.measuring

    def interrupted(model, tokens, probes, *, on_batch_done, **kwargs):
        if after_a_checkpoint:
            on_batch_done(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(sinkscope.run.measuring, "run_probes", interrupted)
    out = tmp_path / "o"
    result = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out), "--checkpoint-seconds", "0")
    assert result.exit_code == 130
    line = _error_line(result)
    assert ("--resume" in line) == after_a_checkpoint
    assert not out.exists()


def test_the_manifest_records_the_text_file_as_given_and_absolute(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(text_file.parent)
    out = tmp_path / "o"
    assert _sinks(str(tiny_llama_dir), "--text-file", text_file.name, "--out", str(out)).exit_code == 0
    corpus = json.loads((out / "manifest.json").read_text())["corpus"]
    assert corpus["path"] == text_file.name and corpus["abs_path"] == str(text_file.resolve())
