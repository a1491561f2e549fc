"""Issue 60, item 3 (memory follows the work asked for) and its low cases, through the command line:
one sentence, a non-zero exit, no traceback, nothing written.

- a run folder's planted explorer.npz (a member inflating to far more than its header, NaN metadata)
  and tokens.npy (a header declaring 10**12 ids) are refused before they are read;
- ``--explore-max-mb inf`` and ``--explore-heads '².1'``;
- a forward at a length that does not fit in memory (``--inputs random`` at a huge ``--seq-len``).

The peaks themselves are measured by tests/integration/test_memory_peaks.py (slow) and
benchmarks/bench_memory.py.
"""

from __future__ import annotations

import shutil
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.run.result import Result

runner = CliRunner()


def _one_sentence(result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _header(shape: tuple, descr: str) -> bytes:
    text = ("{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)).encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


@pytest.fixture(scope="module")
def run_folder(tiny_llama_dir, text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("planted") / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--explore-windows", "1", "--explore-heads", "0.1", "--out", str(out),
                                 "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (out / "explorer.npz").is_file()
    return out


def _copy(run_folder, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    return folder


def _replace_member(npz, name: str, raw: bytes) -> None:
    with zipfile.ZipFile(npz) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    members[f"{name}.npy"] = raw
    with zipfile.ZipFile(npz, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)


def test_report_refuses_an_explorer_member_that_inflates_past_its_header(run_folder, tmp_path):
    folder = _copy(run_folder, tmp_path)
    _replace_member(folder / "explorer.npz", "codes", _header((4,), "<u2") + bytes(32 << 20))  # 32 MB of zeros
    sentence = _one_sentence(runner.invoke(app, ["report", str(folder)]))
    assert "explorer.npz is damaged" in sentence and "inflates to" in sentence
    assert not (folder / "report.html").exists()


def test_report_says_nan_explorer_metadata_in_one_sentence(run_folder, tmp_path):
    folder = _copy(run_folder, tmp_path)
    buffer = __import__("io").BytesIO()
    np.save(buffer, np.array([np.nan, np.nan, 1.0, 1.0]))
    _replace_member(folder / "explorer.npz", "meta", buffer.getvalue())
    sentence = _one_sentence(runner.invoke(app, ["report", str(folder)]))
    assert "explorer.npz is damaged" in sentence and "nan" in sentence


def test_result_load_refuses_a_tokens_header_of_a_trillion_ids(run_folder, tmp_path):
    folder = _copy(run_folder, tmp_path)
    (folder / "tokens.npy").write_bytes(_header((10**6, 10**6), "<i8") + bytes(64))
    with pytest.raises(SinkscopeError) as error:
        Result.load(folder)
    message = str(error.value)
    assert message.startswith(f"the token ids at {folder / 'tokens.npy'} are damaged (") and message.count(". ") == 0
    assert Result.load(run_folder).tokens.shape == (2, 16)


@pytest.mark.parametrize("args,words", [
    (["--explore-max-mb", "inf"], "--explore-max-mb must be a finite number"),
    (["--explore-max-mb", "nan"], "--explore-max-mb"),
    (["--explore-max-mb", "-1"], "--explore-max-mb"),
    (["--explore-heads", "².1"], "--explore-heads takes auto, all, none or LAYER.HEAD"),
])
def test_explorer_options_that_are_not_numbers_are_one_sentence(args, words, tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "1", *args, "--out", str(out), "--no-figures", "--no-progress"])
    assert words in _one_sentence(result)
    assert not out.exists()


def test_a_forward_that_cannot_fit_names_the_longest_seq_len(tiny_llama_dir, tmp_path, monkeypatch):
    """``--inputs random`` at a length no corpus bounds: the forward's lower bound against the free memory
    (made 100 MB here), before the forward runs."""
    monkeypatch.setattr("sinkscope.forward.runner.free_memory", lambda device: 100_000_000)
    out = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--inputs", "random", "--seq-len", "200000",
                                 "--n-seqs", "1", "--out", str(out), "--no-figures", "--no-progress"])
    sentence = _one_sentence(result)
    assert "a forward over 200,000 tokens needs at least 307.2 MB" in sentence
    assert "the longest --seq-len that fits is 65,102" in sentence
    assert not out.exists()


def test_windows_too_large_to_draw_are_one_sentence(tiny_llama_dir, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--inputs", "repeated", "--seq-len", str(10**12),
                                 "--n-seqs", "4", "--out", str(out), "--no-figures", "--no-progress"])
    sentence = _one_sentence(result)
    assert "4 windows of 1,000,000,000,000 repeated tokens take" in sentence and "--seq-len" in sentence
    assert not out.exists()
