"""Tests for sinkscope.data.fetch (no network, no apt-get)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from sinkscope.data import fetch as cf
from sinkscope.errors import SinkscopeError

# ---------------------------------------------------------------------------
# Helpers that build R XDR serialization streams by hand
# ---------------------------------------------------------------------------

UTF8_LEVEL, ASCII_LEVEL, LATIN1_LEVEL = 1 << 3, 1 << 6, 1 << 2
HAS_ATTR, HAS_TAG = 1 << 9, 1 << 10


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def header(version: int = 3) -> bytes:
    out = b"X\n" + i32(version) + i32(0x00040201) + i32(0x00030500)
    if version == 3:
        out += i32(5) + b"UTF-8"
    return out


def charsxp(text: str | None, level: int | None = None, encoding: str = "utf-8") -> bytes:
    if text is None:
        return i32(9) + i32(-1)
    raw = text.encode(encoding)
    if level is None:
        level = ASCII_LEVEL if raw.isascii() else UTF8_LEVEL
    return i32(9 | (level << 12)) + i32(len(raw)) + raw


def strsxp(items: list[str | None], attrs: bytes = b"") -> bytes:
    flags = 16 | (HAS_ATTR if attrs else 0)
    return i32(flags) + i32(len(items)) + b"".join(charsxp(s) for s in items) + attrs


def intsxp(values: list[int]) -> bytes:
    return i32(13) + i32(len(values)) + struct.pack(f">{len(values)}i", *values)


def vecsxp(items: list[bytes], attrs: bytes = b"") -> bytes:
    flags = 19 | (HAS_ATTR if attrs else 0)
    return i32(flags) + i32(len(items)) + b"".join(items) + attrs


def names_attr(names: list[str]) -> bytes:
    """Pairlist ``names = <character>`` terminated by NILVALUE."""
    symbol = i32(1) + charsxp("names")
    return i32(2 | HAS_TAG) + symbol + strsxp(names) + i32(254)


def frame_z(payload: bytes) -> bytes:
    """R lazy-load framing: 4-byte BE length, type byte 'Z', zlib stream."""
    return struct.pack(">I", len(payload)) + b"Z" + zlib.compress(payload)


# ---------------------------------------------------------------------------
# Decompressor and reader
# ---------------------------------------------------------------------------

THREE = ["It is a truth universally acknowledged,", None, "caf\u00e9 \u00a320,000"]


@pytest.mark.parametrize("version", [2, 3])
def test_unserialize_strsxp_with_na_from_z_frame(version: int) -> None:
    blob = frame_z(header(version) + strsxp(THREE))
    assert blob[4:5] == b"Z"
    assert cf.unserialize(cf.decompress_lazyload(blob)) == THREE


@pytest.mark.parametrize(
    "tag, compress",
    [(b"2", bz2.compress), (b"X", lzma.compress), (b"0", bytes)],
)
def test_decompress_other_type_bytes(tag: bytes, compress) -> None:
    payload = header() + strsxp(["a", "b"])
    blob = struct.pack(">I", len(payload)) + tag + compress(payload)
    assert cf.decompress_lazyload(blob) == payload


def test_decompress_bare_zlib_frame_and_length_check() -> None:
    payload = header() + strsxp(["x"])
    assert cf.decompress_lazyload(struct.pack(">I", len(payload)) + zlib.compress(payload)) == payload
    bad = struct.pack(">I", len(payload) + 1) + b"Z" + zlib.compress(payload)
    with pytest.raises(ValueError):
        cf.decompress_lazyload(bad)


def test_reader_attributes_latin1_and_refs() -> None:
    # A STRSXP with a names attribute -> (value, {"names": [...]}).
    obj = cf.unserialize(header() + strsxp(["p", "q"], attrs=names_attr(["a", "b"])))
    assert obj == (["p", "q"], {"names": ["a", "b"]})
    # Latin-1 flagged CHARSXP is decoded as Latin-1.
    latin = header() + i32(16) + i32(1) + charsxp("\u00a3", LATIN1_LEVEL, "latin-1")
    assert cf.unserialize(latin) == ["\u00a3"]
    # A second use of a symbol is written as a REFSXP (index 1).
    two = i32(2 | HAS_TAG) + i32(1) + charsxp("names") + strsxp(["a"])
    two += i32(2 | HAS_TAG) + i32((1 << 8) | 255) + strsxp(["b"]) + i32(254)
    assert cf.unserialize(header() + two) == {"names": ["b"]}


def test_reader_rejects_non_xdr() -> None:
    with pytest.raises(ValueError):
        cf.unserialize(b"A\n" + b"\0" * 20)


# ---------------------------------------------------------------------------
# A fake lazy-load database and a fake apt-get / dpkg-deb
# ---------------------------------------------------------------------------

NOVELS = {name: [f"{name} line 1", None, f"{name} line 3"] for name in cf.AUSTEN_NAMES}


def write_fake_rdata(data_dir: Path) -> None:
    """Write Rdata.rdb / Rdata.rdx in the layout R's lazy-load DB uses."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rdb, positions = b"", []
    for name, lines in NOVELS.items():
        entry = frame_z(header() + strsxp(lines))
        positions.append(intsxp([len(rdb), len(entry)]))
        rdb += entry
    variables = vecsxp(positions, attrs=names_attr(list(NOVELS)))
    index = vecsxp(
        [variables, vecsxp([]), intsxp([1])],
        attrs=names_attr(["variables", "references", "compressed"]),
    )
    (data_dir / "Rdata.rdb").write_bytes(rdb)
    (data_dir / "Rdata.rdx").write_bytes(gzip.compress(header() + index))


def test_read_lazyload_db(tmp_path: Path) -> None:
    write_fake_rdata(tmp_path)
    objects = cf.read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")
    assert objects == NOVELS


class FakeApt:
    """Stands in for subprocess.run: apt-get download / update, dpkg-deb."""

    def __init__(self, fail_first_download: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail_first_download = fail_first_download

    def __call__(self, cmd, cwd=None, **kwargs):
        self.calls.append(list(cmd))
        ok = subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
        if cmd[:2] == ["apt-get", "download"]:
            if self.fail_first_download:
                self.fail_first_download = False
                return subprocess.CompletedProcess(
                    cmd, 100, "", "E: Unable to locate package r-cran-janeaustenr\n")
            (Path(cwd) / "r-cran-janeaustenr_1.0.0-1_all.deb").write_bytes(b"fake deb")
            return ok
        if cmd[:2] == ["apt-get", "update"]:
            return ok
        if cmd[:2] == ["dpkg-deb", "-f"]:
            return subprocess.CompletedProcess(cmd, 0, stdout="1.0.0-1\n", stderr="")
        if cmd[:2] == ["dpkg-deb", "-x"]:
            write_fake_rdata(Path(cmd[3]) / cf.RDATA_SUBDIR)
            return ok
        raise AssertionError(f"unexpected command {cmd}")


@pytest.fixture
def tools_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cf.shutil, "which", lambda name: f"/usr/bin/{name}")


@pytest.mark.usefixtures("tools_present")
def test_fetch_austen_end_to_end_with_fake_apt(tmp_path: Path, monkeypatch) -> None:
    fake = FakeApt(fail_first_download=True)
    monkeypatch.setattr(cf.subprocess, "run", fake)
    monkeypatch.setattr(cf, "_is_root", lambda: True)
    logs: list[str] = []
    dest = tmp_path / "corpus"
    assert cf.fetch_austen(dest, log=logs.append) == dest
    assert [c[:2] for c in fake.calls].count(["apt-get", "update"]) == 1
    assert cf.is_complete_corpus(dest)
    text = (dest / "austen_emma.txt").read_text(encoding="utf-8")
    assert text == "emma line 1\n\nemma line 3"
    manifest = json.loads((dest / "SOURCE.json").read_text(encoding="utf-8"))
    assert manifest["package"] == "r-cran-janeaustenr"
    assert manifest["package_version"] == "1.0.0-1"
    assert manifest["licence"] == "texts public domain; package MIT"
    assert set(manifest["files"]) == {f"austen_{n}.txt" for n in cf.AUSTEN_NAMES}
    assert manifest["files"]["austen_emma.txt"]["chars"] == len(text)
    assert not list(dest.glob(".*.tmp"))  # no temp files left behind
    assert logs and all("\n" not in line for line in logs)


@pytest.mark.usefixtures("tools_present")
def test_download_failure_is_one_sentence(tmp_path: Path, monkeypatch) -> None:
    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 100, "", "W: x\nE: Unable to locate package\n")

    monkeypatch.setattr(cf.subprocess, "run", failing)
    monkeypatch.setattr(cf, "_is_root", lambda: False)
    with pytest.raises(cf.CorpusFetchError) as info:
        cf.fetch_austen(tmp_path / "c", log=lambda _: None)
    message = str(info.value)
    assert "--text-file PATH" in message and "Unable to locate package" in message
    assert "\n" not in message and message.count(". ") == 0
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, SinkscopeError)


def test_missing_tools_raise_and_main_exits_1(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(cf.shutil, "which", lambda name: None)
    assert cf.main(["--dest", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip()
    assert "--text-file PATH" in err and "\n" not in err and "Traceback" not in err


def test_subprocess_oserror_becomes_corpus_fetch_error(tmp_path: Path, monkeypatch) -> None:
    def missing(cmd, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", cmd[0])

    monkeypatch.setattr(cf.subprocess, "run", missing)
    with pytest.raises(cf.CorpusFetchError, match="--text-file PATH"):
        cf.download_deb(tmp_path, log=lambda _: None)


# ---------------------------------------------------------------------------
# Existing corpus and default location
# ---------------------------------------------------------------------------


def make_complete_corpus(dest: Path) -> None:
    dest.mkdir(parents=True)
    files = {}
    for name in cf.AUSTEN_NAMES:
        (dest / f"austen_{name}.txt").write_text("abc", encoding="utf-8")
        files[f"austen_{name}.txt"] = {"sha256": "0", "chars": 3}
    (dest / "SOURCE.json").write_text(json.dumps({"files": files}), encoding="utf-8")


def test_existing_corpus_returned_without_apt(tmp_path: Path, monkeypatch, capsys) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("subprocess.run must not be called")

    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(cf.subprocess, "run", forbidden)
    dest = tmp_path / "austen"
    make_complete_corpus(dest)
    assert cf.fetch_austen(dest, log=lambda _: None) == dest
    assert cf.main(["--dest", str(dest)]) == 0
    assert "18 characters" in capsys.readouterr().out


def test_incomplete_corpus_is_not_complete(tmp_path: Path) -> None:
    dest = tmp_path / "austen"
    make_complete_corpus(dest)
    (dest / "austen_emma.txt").unlink()
    assert not cf.is_complete_corpus(dest)
    make_complete_corpus(tmp_path / "other")
    (tmp_path / "other" / "SOURCE.json").unlink()
    assert not cf.is_complete_corpus(tmp_path / "other")


def test_default_corpus_dir_precedence(tmp_path: Path, monkeypatch) -> None:
    for var in ("SINKSCOPE_CORPUS_DIR", "SINKSCOPE_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cf.default_corpus_dir() == tmp_path / "home/.cache/sinkscope/corpus/austen"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cf.default_corpus_dir() == tmp_path / "xdg/sinkscope/corpus/austen"
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    assert cf.default_corpus_dir() == tmp_path / "cache/corpus/austen"
    monkeypatch.setenv("SINKSCOPE_CORPUS_DIR", str(tmp_path / "explicit"))
    assert cf.default_corpus_dir() == tmp_path / "explicit"
