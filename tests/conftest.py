"""Shared fixtures: offline tokenizers, tiny saved models, a short text file.

Nothing here touches the network: models are built from config classes (tests/tiny_models.py)
and tokenizers are trained in-process with the ``tokenizers`` library.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny_models import VOCAB, build  # noqa: E402

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
