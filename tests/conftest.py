"""Shared fixtures: offline tokenizers, tiny saved models, a short text file, figures laid out
but not encoded in the fast tier, and the tier rule (tests/tier_rule.py).

Nothing here touches the network: models are built from config classes (tests/tiny_models.py)
and tokenizers are trained in-process with the ``tokenizers`` library. The helper modules
(tiny_models, collect, sync_guard, synthetic_attention, repo_paths) sit beside this file, which
puts this folder on sys.path for every test under unit/, integration/ and e2e/.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny_models import VOCAB, build  # noqa: E402

pytest_plugins = ["tier_rule"]

SAMPLE_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be on "
    "his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding "
    "families, that he is considered the rightful property of some one or other of their daughters. "
)


def free_port() -> int:
    """A TCP port nothing listens on now (for torchrun's --master-port: a fixed one collides with a
    concurrent run's)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tokenizer(add_bos: bool = False, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on SAMPLE_TEXT (ids < VOCAB), optionally adding BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([SAMPLE_TEXT] * 4, trainer=trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")
    assert len(fast) <= VOCAB
    return fast


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny Llama saved with save_pretrained, with its tokenizer: a real MODEL folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = build("llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    """A text long enough for a few dozen 32-token windows."""
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text(SAMPLE_TEXT * 12, encoding="utf-8")
    return path


@pytest.fixture
def chromium():
    """(Chromium's executable, playwright's sync_api) for the headless-browser tests; skips where either is missing."""
    path = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)),
                None)
    if path is None:
        pytest.skip("no chromium on this machine (make test installs Debian's chromium when it can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    return path, sync_api


def _one_pixel_png() -> bytes:
    """A valid 1 x 1 white PNG, built from the format's chunks."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff"))
            + chunk(b"IEND", b""))


#: what a fast test's figure files hold (see ``quick_figures``).
_PLACEHOLDER = {"png": _one_pixel_png(), "svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'}


def pytest_addoption(parser):
    parser.addoption("--real-figures", action="store_true",
                     help="encode every figure as PNG and SVG (make test-all); by default fast tests outside "
                          "tests/unit/ build figures but write placeholder files")


def _quick_figures_for(item) -> bool:
    if item.config.getoption("--real-figures"):
        return False
    in_unit = Path(str(item.fspath)).resolve().relative_to(Path(__file__).parent.resolve()).parts[0] == "unit"
    return not (in_unit or item.get_closest_marker("slow") or item.get_closest_marker("real_figures"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In fast tests outside tests/unit/, a figure is built but not drawn: ``make test`` only.

    Drawing and encoding every figure as a 150-dpi PNG and an SVG is most of a report's time
    (about 0.3 s a figure, 50 figures a comparison page). Here ``report.figures._atomic_savefig``
    writes a placeholder file instead, after the figure was built with every plotting call (so bad
    data still fails). Figures are drawn and encoded for real in tests/unit/ (the figure library's
    own tests), in every test marked ``slow`` or ``real_figures``, and in every test under
    ``--real-figures``, which ``make test-all`` (CI) passes. The patch spans the whole test, so a
    module fixture built for it is covered too.
    """
    if not _quick_figures_for(item):
        yield
        return
    from sinkscope.store.files import atomic_write_bytes
    from sinkscope.report import figures

    def placeholder(_fig, path, fmt, **_kwargs):
        atomic_write_bytes(path, _PLACEHOLDER[fmt])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "_atomic_savefig", placeholder)
        yield
