"""Fetch a small, redistributable English prose corpus (six Jane Austen novels).

The texts come from the Debian package ``r-cran-janeaustenr``, which ships the
novels inside an R lazy-load database (``Rdata.rdb`` / ``Rdata.rdx``). This
module downloads the ``.deb`` with ``apt-get download`` (no installation, so R
is not needed), unpacks it with ``dpkg-deb -x`` and decodes the R database with
a small pure-Python reader for R's XDR serialization format.

The result is a directory with one UTF-8 text file per novel plus a
``SOURCE.json`` manifest, which is written last and therefore marks the
directory as complete.

Only the standard library is used (plus :mod:`sinkscope.errors`). Run it as a script::

    python -m sinkscope.data.fetch [--dest DIR] [--force]
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence

from sinkscope.errors import SinkscopeError
from sinkscope.store.files import atomic_write_bytes, sha256_bytes
from sinkscope.runtime.paths import cache_root

__all__ = [
    "AUSTEN_NAMES",
    "CorpusFetchError",
    "DEB_PACKAGE",
    "RReader",
    "atomic_write_bytes",
    "austen_filename",
    "corpus_chars",
    "deb_version",
    "decompress_lazyload",
    "default_corpus_dir",
    "download_deb",
    "extract_deb",
    "extract_novels",
    "fetch_austen",
    "is_complete_corpus",
    "lines_to_text",
    "main",
    "read_lazyload_db",
    "sha256_bytes",
    "unserialize",
    "write_corpus",
]

DEB_PACKAGE = "r-cran-janeaustenr"
"""Debian package that carries the Austen texts."""

AUSTEN_NAMES: tuple[str, ...] = (
    "emma",
    "mansfieldpark",
    "northangerabbey",
    "persuasion",
    "prideprejudice",
    "sensesensibility",
)
"""Object names of the six novels inside the R package's data."""

SOURCE_FILE = "SOURCE.json"
LICENCE = "texts public domain; package MIT"
RDATA_SUBDIR = Path("usr/lib/R/site-library/janeaustenr/data")

LogFn = Callable[[str], Any]


class CorpusFetchError(SinkscopeError):
    """Raised when the corpus cannot be fetched; the message is one sentence.

    A :class:`~sinkscope.errors.SinkscopeError` (hence a RuntimeError), so the
    CLI's one-sentence error handling covers it.
    """


def _fail(what: str) -> CorpusFetchError:
    """Build a CorpusFetchError with a hint on how to supply text instead.

    Args:
        what: Short description of the step that failed (no trailing period).

    Returns:
        The exception, ready to raise.
    """
    return CorpusFetchError(
        f"Could not fetch the Austen corpus ({what}); "
        "supply your own text instead with --text-file PATH."
    )


# ---------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------


def default_corpus_dir() -> Path:
    """Return the directory where the Austen corpus is kept by default.

    Precedence: ``$SINKSCOPE_CORPUS_DIR``; else ``$SINKSCOPE_CACHE/corpus/austen``;
    else ``${XDG_CACHE_HOME:-~/.cache}/sinkscope/corpus/austen``.

    Returns:
        The corpus directory (not created).
    """
    explicit = os.environ.get("SINKSCOPE_CORPUS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return cache_root() / "corpus" / "austen"


def austen_filename(name: str) -> str:
    """Return the text file name for a novel, e.g. ``austen_emma.txt``.

    Args:
        name: One of :data:`AUSTEN_NAMES`.

    Returns:
        The file name (no directory).
    """
    return f"austen_{name}.txt"


def is_complete_corpus(dest: Path) -> bool:
    """Tell whether ``dest`` already holds a complete corpus.

    A corpus is complete when ``SOURCE.json`` (written last) and all six
    ``austen_<name>.txt`` files exist.

    Args:
        dest: Directory to check.

    Returns:
        True if the corpus is complete.
    """
    dest = Path(dest)
    if not (dest / SOURCE_FILE).is_file():
        return False
    return all((dest / austen_filename(n)).is_file() for n in AUSTEN_NAMES)


# ---------------------------------------------------------------------------
# R lazy-load database reading
# ---------------------------------------------------------------------------


def decompress_lazyload(blob: bytes) -> bytes:
    """Decompress one entry of an R lazy-load database (``.rdb``/``.rdx``).

    R frames each entry as a 4-byte big-endian uncompressed length followed by
    either a bare zlib stream (compression type 1) or a type byte and payload:
    ``Z`` zlib, ``2`` bzip2, ``X`` xz, ``0`` stored.

    Args:
        blob: The raw framed entry.

    Returns:
        The serialized R object bytes.

    Raises:
        ValueError: If the frame is malformed or the length does not match.
    """
    if len(blob) < 5:
        raise ValueError("lazy-load entry too short")
    (expected,) = struct.unpack(">I", blob[:4])
    kind, payload = blob[4:5], blob[5:]
    decoders: dict[bytes, Callable[[bytes], bytes]] = {
        b"Z": zlib.decompress,
        b"2": bz2.decompress,
        b"X": lzma.decompress,
        b"0": bytes,
    }
    decoder = decoders.get(kind)
    out = decoder(payload) if decoder else zlib.decompress(blob[4:])
    if len(out) != expected:
        raise ValueError(f"lazy-load entry length {len(out)} != {expected}")
    return out


class RReader:
    """Minimal reader for R's XDR serialization format (versions 2 and 3).

    It understands what data-only lazy-load databases need: NULL and the
    special environments (returned as None), symbols, pairlists (returned as
    ``dict`` tag -> value), character strings, character/list vectors and
    logical/integer/real vectors. An object with attributes is returned as a
    ``(value, attributes_dict)`` tuple; NA strings are returned as None.

    Args:
        data: Serialized bytes starting with the ``X\\n`` header.
    """

    # SEXP type codes
    SYMSXP, LISTSXP, CHARSXP = 1, 2, 9
    LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 10, 13, 14, 16, 19
    REFSXP = 255
    NULL_LIKE = frozenset({254, 242, 253, 251, 250, 252})  # NILVALUE, envs, ...
    IS_OBJECT, HAS_ATTR, HAS_TAG = 1 << 8, 1 << 9, 1 << 10
    LATIN1_MASK = 1 << 2  # in the "levels" field (flags >> 12)

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.refs: list[Any] = []

    def read_int(self) -> int:
        """Read one big-endian signed 32-bit integer."""
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _read_array(self, code: str, n: int, size: int) -> list[Any]:
        """Read ``n`` big-endian items of struct ``code`` (``size`` bytes each)."""
        values = list(struct.unpack_from(f">{n}{code}", self.data, self.pos))
        self.pos += n * size
        return values

    def read_header(self) -> int:
        """Read the stream header and return the format version.

        Raises:
            ValueError: If the stream is not XDR or the version is unknown.
        """
        if self.data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization stream")
        self.pos = 2
        version = self.read_int()
        self.read_int()  # writer R version
        self.read_int()  # minimal reader R version
        if version == 3:
            name_length = self.read_int()  # native encoding name follows
            self.pos += name_length
        elif version != 2:
            raise ValueError(f"unsupported serialization version {version}")
        return version

    def read_object(self) -> Any:
        """Read one R object at the current position (see class docstring)."""
        flags = self.read_int()
        sexptype = flags & 0xFF
        if sexptype in self.NULL_LIKE:
            return None
        if sexptype == self.REFSXP:
            return self.refs[(flags >> 8) - 1]
        if sexptype == self.SYMSXP:
            value = self.read_object()
            self.refs.append(value)
            return value
        if sexptype == self.LISTSXP:
            return self._read_pairlist(flags)
        if sexptype == self.CHARSXP:
            return self._read_charsxp(flags)
        value = self._read_vector(sexptype)
        attrs = self.read_object() if flags & self.HAS_ATTR else None
        return (value, attrs) if attrs else value

    def _read_pairlist(self, flags: int) -> dict[Any, Any]:
        """Read a pairlist iteratively into a dict of tag -> value."""
        result: dict[Any, Any] = {}
        while True:
            if flags & self.HAS_ATTR:
                self.read_object()  # attributes of a pairlist node: ignored
            tag = self.read_object() if flags & self.HAS_TAG else None
            result[tag] = self.read_object()
            flags = self.read_int()
            if flags & 0xFF != self.LISTSXP:
                self.pos -= 4
                tail = self.read_object()
                if isinstance(tail, dict):
                    result.update(tail)
                return result

    def _read_charsxp(self, flags: int) -> str | None:
        """Read a CHARSXP body; None for NA_character_."""
        length = self.read_int()
        if length == -1:
            return None
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        encoding = "latin-1" if (flags >> 12) & self.LATIN1_MASK else "utf-8"
        return raw.decode(encoding, "replace")

    def _read_vector(self, sexptype: int) -> list[Any]:
        """Read the body of a vector SEXP of the given type."""
        n = self.read_int()
        if n == -1:  # long vector: two more ints give the length
            n = (self.read_int() << 32) | (self.read_int() & 0xFFFFFFFF)
        if sexptype in (self.STRSXP, self.VECSXP):
            return [self.read_object() for _ in range(n)]
        if sexptype in (self.LGLSXP, self.INTSXP):
            return self._read_array("i", n, 4)
        if sexptype == self.REALSXP:
            return self._read_array("d", n, 8)
        raise ValueError(f"unsupported R object type {sexptype}")


def unserialize(data: bytes) -> Any:
    """Decode a complete XDR R serialization stream.

    Args:
        data: Uncompressed serialized bytes (starting with ``X\\n``).

    Returns:
        The decoded object, in :class:`RReader`'s representation.
    """
    reader = RReader(data)
    reader.read_header()
    return reader.read_object()


def _split_attrs(obj: Any) -> tuple[Any, dict[Any, Any]]:
    """Split an RReader result into (value, attributes dict)."""
    if isinstance(obj, tuple):
        return obj[0], obj[1] or {}
    return obj, {}


def _decode_rdx(raw: bytes) -> bytes:
    """Return the serialized bytes of an ``.rdx`` index.

    R writes the index with ``saveRDS`` (gzip file), but an uncompressed stream
    or a lazy-load style framed entry are accepted as well.
    """
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:2] == b"X\n":
        return raw
    return decompress_lazyload(raw)


def read_lazyload_db(rdx_path: Path, rdb_path: Path) -> dict[str, Any]:
    """Read every variable of an R lazy-load database.

    Args:
        rdx_path: The index file (``Rdata.rdx``; a framed zlib entry).
        rdb_path: The data file (``Rdata.rdb``).

    Returns:
        Mapping from variable name to its decoded value (attributes dropped).
    """
    index = unserialize(_decode_rdx(Path(rdx_path).read_bytes()))
    values, attrs = _split_attrs(index)
    variables = dict(zip(attrs["names"], values))["variables"]
    positions, var_attrs = _split_attrs(variables)
    rdb = Path(rdb_path).read_bytes()
    out: dict[str, Any] = {}
    for name, (offset, length) in zip(var_attrs["names"], positions):
        start = int(offset)
        entry = rdb[start : start + int(length)]
        out[name] = _split_attrs(unserialize(decompress_lazyload(entry)))[0]
    return out


def lines_to_text(lines: Sequence[str | None]) -> str:
    """Join an R character vector into text; NA lines become empty lines.

    Args:
        lines: The vector's elements (None for NA).

    Returns:
        The lines joined with ``\\n``.
    """
    return "\n".join(line or "" for line in lines)


# ---------------------------------------------------------------------------
# File helpers
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Debian package handling
# ---------------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing output; raise CorpusFetchError if it is missing."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except (FileNotFoundError, PermissionError):
        raise _fail(f"the program {cmd[0]!r} is not available") from None
    except OSError as exc:
        raise _fail(f"running {cmd[0]!r} failed: {exc.strerror or exc}") from None


def _last_line(text: str) -> str:
    """Return the last non-empty line of some command output, stripped."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1].rstrip(".") if lines else "no output"


def _is_root() -> bool:
    """Tell whether the process runs as root (False where unknown)."""
    geteuid = getattr(os, "geteuid", None)
    return bool(geteuid) and geteuid() == 0


def download_deb(workdir: Path, log: LogFn = print) -> Path:
    """Download the ``r-cran-janeaustenr`` .deb into ``workdir``.

    If the first attempt fails and we are root, run ``apt-get update`` once
    (package lists may be empty in fresh containers) and retry.

    Args:
        workdir: Directory to download into.
        log: Progress callback.

    Returns:
        Path of the downloaded .deb.

    Raises:
        CorpusFetchError: If apt-get is missing or the download fails.
    """
    log(f"downloading {DEB_PACKAGE} with apt-get download")
    proc = _run(["apt-get", "download", DEB_PACKAGE], cwd=workdir)
    if proc.returncode != 0 and _is_root():
        log("apt-get download failed; running apt-get update once and retrying")
        update = _run(["apt-get", "update"])
        if update.returncode != 0:
            raise _fail(f"apt-get update failed: {_last_line(update.stderr)}")
        proc = _run(["apt-get", "download", DEB_PACKAGE], cwd=workdir)
    if proc.returncode != 0:
        raise _fail(f"apt-get download {DEB_PACKAGE} failed: {_last_line(proc.stderr)}")
    debs = sorted(workdir.glob(f"{DEB_PACKAGE}_*.deb"))
    if not debs:
        raise _fail(f"apt-get download produced no {DEB_PACKAGE} .deb file")
    return debs[-1]


def deb_version(deb: Path) -> str:
    """Return the ``Version`` control field of a .deb (via ``dpkg-deb -f``).

    Raises:
        CorpusFetchError: If dpkg-deb is missing or fails.
    """
    proc = _run(["dpkg-deb", "-f", str(deb), "Version"])
    if proc.returncode != 0:
        raise _fail(f"dpkg-deb -f failed: {_last_line(proc.stderr)}")
    return proc.stdout.strip()


def extract_deb(deb: Path, target: Path) -> Path:
    """Unpack a .deb with ``dpkg-deb -x`` and return its R data directory.

    Args:
        deb: The .deb file.
        target: Directory to unpack into.

    Returns:
        The directory holding ``Rdata.rdb`` and ``Rdata.rdx``.

    Raises:
        CorpusFetchError: If dpkg-deb fails or the data files are missing.
    """
    proc = _run(["dpkg-deb", "-x", str(deb), str(target)])
    if proc.returncode != 0:
        raise _fail(f"dpkg-deb -x failed: {_last_line(proc.stderr)}")
    data_dir = target / RDATA_SUBDIR
    if not (data_dir / "Rdata.rdb").is_file() or not (data_dir / "Rdata.rdx").is_file():
        raise _fail(f"the package has no R data in {RDATA_SUBDIR}")
    return data_dir


def extract_novels(data_dir: Path) -> dict[str, str]:
    """Decode the six novels from the package's R data directory.

    Args:
        data_dir: Directory with ``Rdata.rdb`` / ``Rdata.rdx``.

    Returns:
        Mapping from novel name (see :data:`AUSTEN_NAMES`) to its text.

    Raises:
        CorpusFetchError: If the database cannot be decoded or lacks a novel.
    """
    try:
        objects = read_lazyload_db(data_dir / "Rdata.rdx", data_dir / "Rdata.rdb")
    except (ValueError, KeyError, TypeError, IndexError, struct.error, zlib.error,
            lzma.LZMAError, OSError) as exc:
        raise _fail(f"the R data could not be decoded: {exc}") from None
    missing = [n for n in AUSTEN_NAMES if not isinstance(objects.get(n), list)]
    if missing:
        raise _fail(f"the R data lacks the novels {', '.join(missing)}")
    return {name: lines_to_text(objects[name]) for name in AUSTEN_NAMES}


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def write_corpus(dest: Path, texts: dict[str, str], package_version: str,
                 deb_sha256: str) -> dict[str, Any]:
    """Write the text files and, last, ``SOURCE.json`` into ``dest``.

    Args:
        dest: Target directory (created if needed).
        texts: Novel name -> text.
        package_version: Debian package version.
        deb_sha256: SHA-256 of the downloaded .deb.

    Returns:
        The manifest written to ``SOURCE.json``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    for name, text in texts.items():
        data = text.encode("utf-8")
        filename = austen_filename(name)
        atomic_write_bytes(dest / filename, data)
        files[filename] = {"sha256": sha256_bytes(data), "chars": len(text)}
    manifest = {
        "name": "austen",
        "package": DEB_PACKAGE,
        "package_version": package_version,
        "deb_sha256": deb_sha256,
        "licence": LICENCE,
        "files": files,
    }
    payload = json.dumps(manifest, indent=2, sort_keys=False) + "\n"
    atomic_write_bytes(dest / SOURCE_FILE, payload.encode("utf-8"))
    return manifest


def fetch_austen(dest: Path | None = None, *, force: bool = False,
                 log: LogFn = print) -> Path:
    """Make sure the Austen corpus exists in ``dest`` and return that path.

    Args:
        dest: Target directory; defaults to :func:`default_corpus_dir`.
        force: Re-fetch even if ``dest`` already holds a complete corpus.
        log: Progress callback, called with one line per step.

    Returns:
        The corpus directory.

    Raises:
        CorpusFetchError: If apt-get/dpkg-deb are unavailable or any step fails.
    """
    dest = Path(dest) if dest is not None else default_corpus_dir()
    if not force and is_complete_corpus(dest):
        log(f"corpus already present in {dest}")
        return dest
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise _fail(f"{' and '.join(missing)} not found on PATH")
    with tempfile.TemporaryDirectory(prefix="sinkscope-austen-") as tmp:
        workdir = Path(tmp)
        deb = download_deb(workdir, log)
        version = deb_version(deb)
        log(f"extracting {deb.name} (version {version})")
        data_dir = extract_deb(deb, workdir / "root")
        log("decoding the R lazy-load database")
        texts = extract_novels(data_dir)
        log(f"writing {len(texts)} novels and {SOURCE_FILE} to {dest}")
        try:
            write_corpus(dest, texts, version, sha256_bytes(deb.read_bytes()))
        except OSError as exc:
            raise _fail(f"writing to {dest} failed: {exc.strerror or exc}") from None
    return dest


def corpus_chars(dest: Path) -> int:
    """Return the total character count recorded in ``dest``'s SOURCE.json."""
    from sinkscope.store.files import read_json

    manifest = read_json(Path(dest) / SOURCE_FILE, "the corpus record", expect=dict,
                         hint="fetch the corpus again with --force")
    return sum(int(info["chars"]) for info in manifest["files"].values())


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m sinkscope.data.fetch``.

    Args:
        argv: Arguments (defaults to ``sys.argv[1:]``).

    Returns:
        Exit code: 0 on success, 1 on CorpusFetchError.
    """
    parser = argparse.ArgumentParser(
        prog="python -m sinkscope.data.fetch",
        description="Fetch six Jane Austen novels from the Debian package "
        f"{DEB_PACKAGE} (no R needed).",
    )
    parser.add_argument("--dest", type=Path, default=None,
                        help=f"target directory (default: {default_corpus_dir()})")
    parser.add_argument("--force", action="store_true",
                        help="re-fetch even if the corpus is already present")
    args = parser.parse_args(argv)
    try:
        path = fetch_austen(args.dest, force=args.force)
    except CorpusFetchError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    try:
        total = corpus_chars(path)
    except SinkscopeError as exc:  # a record that is not JSON (or nested too deeply): its own sentence
        print(str(exc), file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(_fail(f"{path / SOURCE_FILE} is unreadable: {exc}; rerun with --force"),
              file=sys.stderr)
        return 1
    print(f"corpus: {path} ({total:,} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
