"""The trainer's data sources (src/sinkscope/train/tasks.py, data.py): the trigger task's generator,
BOS-first text windows, validation without position 0, checkpoint windows and the task options.

Everything is small: a generated text with known paragraphs and a 300-entry BPE, and the trigger
task at vocabulary 16 and a few steps, so the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import json
import math
import os
import random

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from sinkscope.data.corpus import Corpus, Windows
from sinkscope.errors import SinkscopeError
from sinkscope.train import data as tdata
from sinkscope.train.loop import evaluate, read_log, train
from sinkscope.train.config import TrainOptions, resolve_options
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT
from sinkscope.train.tasks import (
    TextTask,
    TriggerOptions,
    TriggerTask,
    checkpoint_windows,
    make_task,
    parse_task_options,
)

SMALL = ["n_layer=1", "n_head=2", "n_embd=32", "block_size=24"]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def quiet(_message: str) -> None:
    pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A private cache, and a text of 400 paragraphs whose first word is P<n> (so a window's first
    real token can be checked): each paragraph 2-4 lines, blank lines between them."""
    root = tmp_path_factory.mktemp("tasks")
    old = os.environ.get("SINKSCOPE_CACHE")
    os.environ["SINKSCOPE_CACHE"] = str(root / "cache")
    rng = random.Random(1)
    paragraphs = []
    for n in range(400):
        lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(rng.randint(2, 4))]
        lines[0] = f"Para{n} " + lines[0]
        paragraphs.append("\n".join(lines))
    text = root / "paragraphs.txt"
    text.write_text("\n\n\n".join(paragraphs[:3]) + "\n\n" + "\n\n".join(paragraphs[3:]), encoding="utf-8")
    yield {"root": root, "text": str(text), "paragraphs": paragraphs}
    if old is None:
        os.environ.pop("SINKSCOPE_CACHE", None)
    else:
        os.environ["SINKSCOPE_CACHE"] = old


def text_options(env, out, **kw) -> TrainOptions:
    base = dict(out=str(out), text_file=env["text"], tokenizer="bpe300", steps=6, batch_size=4, warmup_steps=1,
                eval_every=3, eval_windows=6, checkpoint_every=6, overrides=list(SMALL), progress=False)
    base.update(kw)
    return TrainOptions(**base)


def trigger_options(out, **kw) -> TrainOptions:
    base = dict(out=str(out), task="trigger", task_options=["vocab=16"], steps=6, batch_size=8, warmup_steps=1,
                eval_every=3, eval_windows=8, checkpoint_every=3,
                overrides=["n_layer=1", "n_head=2", "n_embd=32", "block_size=20"], progress=False)
    base.update(kw)
    return TrainOptions(**base)


# ---- the trigger task -------------------------------------------------------------------------------


def test_trigger_generator_statistics():
    """SPEC.md "Trigger-conditional task": every window follows the rule exactly, and the trigger
    rate, the key distribution and the Bayes-optimal loss match the options."""
    p, V, T = 0.12, 64, 64
    task = TriggerTask(TriggerOptions(vocab=V, trigger_rate=p), block_size=T)
    seq = task.sample(4000, T, torch.Generator().manual_seed(0))  # (N, T+1)
    assert seq.shape == (4000, T + 1)
    assert torch.all(seq[:, 0] == 0)  # <bos>
    keys = seq[:, 1]
    assert keys.min() >= 2 and keys.max() < V  # the key is a content token
    succ = task.successor
    # the successor is one cycle through every content token (no fixed point, no short cycle)
    x, visited = 2, []
    for _ in range(V - 2):
        visited.append(x)
        x = int(succ[x])
    assert x == 2 and sorted(visited) == list(range(2, V))
    prev, nxt = seq[:, 1:-1], seq[:, 2:]  # (N, T-1) each
    after = prev == 1
    assert torch.equal(nxt[after], keys.unsqueeze(1).expand_as(nxt)[after])  # after a trigger: the key
    fired = (nxt == 1) & ~after
    assert torch.equal(nxt[~after & ~fired], succ[prev[~after & ~fired]])  # otherwise the successor
    assert not torch.any((nxt == 1) & after)  # never two triggers in a row
    n = int((~after).sum())
    rate = fired.sum().item() / n
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n)  # binomial, 4 sigma
    counts = torch.bincount(keys - 2, minlength=V - 2).double()
    expected = len(keys) / (V - 2)
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < (V - 3) + 6 * math.sqrt(2 * (V - 3))  # uniform keys
    # the Bayes-optimal loss over positions >= 1 of the data, against the documented H(p) / (1 + p)
    coin = torch.where(nxt == 1, torch.tensor(-math.log(p)), torch.tensor(-math.log(1 - p)))
    bayes = torch.where(after, torch.zeros(()), coin).double().mean().item()
    assert bayes == pytest.approx(task.info["optimal_loss_per_position"], abs=0.01)


def test_trigger_draws_are_seeded_and_prefix_stable():
    task = TriggerTask(TriggerOptions(vocab=16), block_size=20)
    a = task.sample(10, 20, torch.Generator().manual_seed(3))
    b = task.sample(4, 20, torch.Generator().manual_seed(3))
    assert torch.equal(a[:4], b)  # row i does not depend on how many rows are drawn
    assert not torch.equal(a, task.sample(10, 20, torch.Generator().manual_seed(4)))
    other = TriggerTask(TriggerOptions(vocab=16, task_seed=1), block_size=20)
    assert not torch.equal(task.successor, other.successor)
    assert task.info["fingerprint"] != other.info["fingerprint"]
    # eval windows: the same for every run, and the first windows of the validation draw with seed 0
    x, y = task.eval_batches(5)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.all(x[:, 0] == 0)
    windows = task.windows(seq_len=20, n_seqs=8, seed=0)
    assert isinstance(windows, Windows) and windows.tokens.shape == (8, 20) and windows.bos_id == 0
    np.testing.assert_array_equal(windows.tokens[:5], x.numpy())
    assert not np.array_equal(task.windows(seq_len=20, n_seqs=8, seed=1).tokens, windows.tokens)
    # the training stream is another stream (the run seed's generator)
    batches = task.train_batches(5, seed=0)
    assert not torch.equal(batches.next()[0], x)


def test_trigger_tokenizer_and_validation_text(tmp_path):
    from transformers import AutoTokenizer

    task = TriggerTask(TriggerOptions(vocab=16, length=12), block_size=20)
    tokenizer = task.tokenizer
    assert len(tokenizer) == 16 and tokenizer.bos_token_id == 0
    assert tokenizer.convert_ids_to_tokens(list(range(4))) == ["<bos>", "<trigger>", "t2", "t3"]
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    lines = task.extra_files()["validation.txt"].decode().splitlines()
    assert len(lines) == 256
    ids = np.asarray([reloaded(line).input_ids for line in lines[:6]])  # no special tokens added
    np.testing.assert_array_equal(ids, task.windows(seq_len=12, n_seqs=6, seed=0).tokens)
    assert reloaded.decode(ids[0][:3]).split() == lines[0].split()[:3]


def test_trigger_options_fail_in_one_sentence():
    assert parse_task_options("trigger", ["vocab=32", "trigger_rate=0.2", "length=16", "task_seed=2"]) == dict(
        vocab=32, trigger_rate=0.2, length=16, task_seed=2)
    assert parse_task_options("trigger", ["trigger_rate=0"]) == {"trigger_rate": 0.0}
    with pytest.raises(SinkscopeError, match="unknown --task-set key 'rate'.*valid keys: vocab"):
        parse_task_options("trigger", ["rate=0.1"])
    with pytest.raises(SinkscopeError, match="vocab needs a int value"):
        parse_task_options("trigger", ["vocab=6.5"])
    with pytest.raises(SinkscopeError, match="key=value"):
        parse_task_options("trigger", ["vocab"])
    with pytest.raises(SinkscopeError, match="--task-set is for synthetic tasks"):
        parse_task_options("text", ["vocab=3"])
    with pytest.raises(SinkscopeError, match="vocab >= 4"):
        make_task("trigger", 16, task_options=["vocab=3"])
    with pytest.raises(SinkscopeError, match="trigger_rate must be in"):
        make_task("trigger", 16, task_options=["trigger_rate=1.5"])
    with pytest.raises(SinkscopeError, match="length must be between 2 and block_size"):
        make_task("trigger", 16, task_options=["length=17"])
    with pytest.raises(SinkscopeError, match="unknown --task 'trigerr'.*did you mean 'trigger'"):
        resolve_options(TrainOptions(task="trigerr"))
    with pytest.raises(SinkscopeError, match="--text-file, --windows are for --task text"):
        resolve_options(TrainOptions(task="trigger", text_file="x.txt", windows="random"))
    with pytest.raises(SinkscopeError, match="unknown --windows 'start'"):
        resolve_options(TrainOptions(windows="start"))
    resolved = resolve_options(TrainOptions(task="trigger"))
    assert (resolved.tier, resolved.tokenizer, resolved.windows) == ("micro", None, None)
    assert (resolve_options(TrainOptions()).tier, resolve_options(TrainOptions()).windows) == ("tiny", "doc-start")


# ---- BOS-first text windows ---------------------------------------------------------------------------


def _para(tokenizer, ids) -> int | None:
    """n when the decoded ids start with the paragraph's first word Para<n>, else None."""
    import re

    match = re.match(r"\s*Para(\d+) ", tokenizer.decode([int(i) for i in ids]))
    return int(match.group(1)) if match else None


def _corpus(env):
    from sinkscope.data.corpus import load_corpus

    return load_corpus(env["text"])


def test_passage_index_finds_every_paragraph(env):
    corpus = _corpus(env)
    tokenizer = tdata.load_tokenizer("bpe300", corpus)
    stream = tdata.token_stream(corpus, tokenizer)
    starts, ends = tdata.passage_index(corpus, tokenizer)
    assert len(starts) == 400 and np.all(ends == len(stream))  # one document: its end is the stream's
    for n in (0, 1, 2, 3, 57, 399):  # 0..3 are separated by two blank lines
        assert _para(tokenizer, stream[starts[n]:starts[n] + 12]) == n
    again = tdata.passage_index(corpus, tokenizer)  # from the cache
    np.testing.assert_array_equal(again[0], starts)
    # two documents: starts of the second are offset past the end-of-text id, ends per document
    two = Corpus("two", ["First line.\n\nSecond para.", "Another doc.\n\n\nLast para here."])
    s2, e2 = tdata.passage_index(two, tokenizer)
    stream2 = tdata.token_stream(two, tokenizer)
    assert [tokenizer.decode(stream2[s:s + 20].tolist()).split()[0] for s in s2] == ["First", "Second", "Another", "Last"]
    eos = int(np.flatnonzero(stream2 == tdata.end_of_text_id(tokenizer))[0])
    np.testing.assert_array_equal(e2, [eos, eos, len(stream2), len(stream2)])


def test_doc_start_windows_start_with_bos_at_a_paragraph(env):
    corpus = _corpus(env)
    tokenizer = tdata.load_tokenizer("bpe300", corpus)
    bos = tdata.end_of_text_id(tokenizer)
    task = TextTask(corpus, tokenizer, 24, windows="doc-start")
    assert task.info["windows"] == "doc-start" and task.info["bos_id"] == bos
    x, y = task.train_batches(64, seed=0).next()
    vx, vy = task.eval_batches(6)
    for inputs, targets in ((x, y), (vx, vy)):
        assert torch.all(inputs[:, 0] == bos)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        for row in targets:  # the first real token begins a paragraph
            assert _para(tokenizer, row[:12]) is not None
        assert not torch.any(targets == bos)
    # validation windows lie in the validation split (the first paragraphs), training windows after it
    val_paras = [_para(tokenizer, row[:12]) for row in vy]
    train_paras = [_para(tokenizer, row[:12]) for row in y]
    assert val_paras[0] == 0 and val_paras == sorted(val_paras)
    assert max(val_paras) < min(train_paras)
    assert len(set(train_paras)) > 40  # drawn with replacement from many starts
    # random windows keep the old behaviour: any offset, no BOS
    old = TextTask(corpus, tokenizer, 24, windows="random")
    rx, _ = old.train_batches(64, seed=0).next()
    assert (rx[:, 0] != bos).any() and old.info["windows"] == "random"
    ex, _ = old.eval_batches(4)
    stride = len(old.val) // 4
    np.testing.assert_array_equal(ex[1].numpy(), old.val[stride:stride + 24])


def test_text_without_paragraphs_fails_in_one_sentence(env, tmp_path):
    flat = tmp_path / "flat.txt"
    flat.write_text(" ".join(["word"] * 3000), encoding="utf-8")
    with pytest.raises(SinkscopeError, match="no passage start .* use --windows random"):
        train(text_options(env, tmp_path / "ckpt", text_file=str(flat)), log=quiet)


# ---- validation excludes position 0 ------------------------------------------------------------------


def test_validation_loss_excludes_position_zero():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 50, (5, 16), generator=g)
    y = torch.randint(0, 50, (5, 16), generator=g)
    val_loss, val_loss_all, importance = evaluate(model, x, y, chunk=2, device=torch.device("cpu"),
                                                  autocast=lambda: torch.autocast("cpu", enabled=False))
    with torch.no_grad():
        logits, _ = model(x)  # (5, 16, 50)
    ce = F.cross_entropy(logits.reshape(-1, 50), y.reshape(-1), reduction="none").view(5, 16)  # (5, 16)
    assert val_loss == pytest.approx(ce[:, 1:].mean().item(), abs=1e-6)
    assert val_loss_all == pytest.approx(ce.mean().item(), abs=1e-6)
    assert abs(val_loss - val_loss_all) > 1e-4
    # Imp over chunks of 2, 2 and 1 windows is the mean over all five (weighted by windows)
    with torch.no_grad():
        model(x, importance=True)
    torch.testing.assert_close(importance, model.last_importance.double(), atol=1e-6, rtol=0)
    # TNLM's training loss is the same quantity: val_loss is the fair comparison (the P0-sink study, Table 1(b))
    with torch.no_grad():
        assert model(x, y, tnlm=True)[1].item() == pytest.approx(val_loss, abs=1e-6)


# ---- training on tasks, checkpoints, checkpoint_windows ------------------------------------------------


@pytest.mark.slow  # trains
def test_trigger_training_checkpoint_and_probe_windows(tmp_path):
    out = tmp_path / "trigger"
    train(trigger_options(out, variant="sinklogit"), log=quiet)
    meta = json.loads((out / "config.json").read_text())
    assert meta["task"] == "trigger" and meta["data"]["task"] == "trigger" and meta["model"]["vocab_size"] == 16
    assert meta["train_options"]["task_options"] == ["vocab=16"] and meta["tier"] == "micro"
    assert (out / "validation.txt").is_file() and (out / "tokenizer.json").is_file()
    rows = read_log(out)
    evals = [r for r in rows if r["val_loss"]]
    assert [int(r["step"]) for r in evals] == [0, 3, 6]
    assert all(float(r["val_loss"]) != float(r["val_loss_all"]) for r in evals)  # position 0 is excluded
    assert float(evals[-1]["val_loss"]) < float(evals[0]["val_loss"])
    assert meta["val_loss"] == pytest.approx(float(evals[-1]["val_loss"]), abs=1e-5)
    assert meta["val_loss_all"] == pytest.approx(float(evals[-1]["val_loss_all"]), abs=1e-5)
    # the checkpoint's own windows: a seeded validation draw of its task (seed 0 = the eval windows first)
    windows = checkpoint_windows(out, n_seqs=12, seed=0)
    task = TriggerTask(TriggerOptions(vocab=16), block_size=20)
    np.testing.assert_array_equal(windows.tokens[:8], task.eval_batches(8)[0].numpy())
    assert checkpoint_windows(out, seq_len=10, n_seqs=3, seed=5).tokens.shape == (3, 10)
    with pytest.raises(SinkscopeError, match="--seq-len must be between 2 and the model's context"):
        checkpoint_windows(out, seq_len=40, n_seqs=3, seed=0)
    # resume continues bit for bit
    split = tmp_path / "split"
    train(trigger_options(split, variant="sinklogit", stop_at=3), log=quiet)
    train(TrainOptions(out=str(split), resume=True, progress=False), log=quiet)
    from safetensors.torch import load_file

    a, b = load_file(str(out / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SinkscopeError, match="task_options=\\['vocab=20'\\] was asked for"):
        train(TrainOptions(out=str(split), resume=True, task_options=["vocab=20"], progress=False), log=quiet)


@pytest.mark.slow  # trains
def test_trigger_checkpoint_is_a_model_for_sinks(tmp_path):
    """`sinkscope sinks CKPT --text-file CKPT/validation.txt --bos none` measures the task's windows."""
    from typer.testing import CliRunner

    from sinkscope.cli import app

    out = tmp_path / "ckpt"
    train(trigger_options(out, steps=3, checkpoint_every=3), log=quiet)
    runner = CliRunner()
    run = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(out), "--text-file", str(out / "validation.txt"), "--bos", "none",
                                 "--n-seqs", "4", "--out", str(run), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    tokens = np.load(run / "tokens.npy")
    assert tokens.shape == (4, 20) and np.all(tokens[:, 0] == 0)  # every window is a task window
    task = TriggerTask(TriggerOptions(vocab=16), block_size=20)
    allowed = {tuple(r) for r in task.windows(seq_len=20, n_seqs=256, seed=0).tokens.tolist()}
    assert all(tuple(r) in allowed for r in tokens.tolist())


@pytest.mark.slow  # trains
@pytest.mark.parametrize("policy", ["doc-start", "random"])
def test_text_checkpoint_windows_come_from_the_validation_split(env, policy):
    out = env["root"] / f"text-{policy}"
    train(text_options(env, out, windows=policy), log=quiet)
    meta = json.loads((out / "config.json").read_text())
    assert meta["train_options"]["windows"] == policy and meta["data"]["windows"] == policy
    windows = checkpoint_windows(out, n_seqs=5, seed=0)
    assert windows.tokens.shape == (5, 24)
    corpus = _corpus(env)
    tokenizer = tdata.load_tokenizer("bpe300", corpus)
    stream = tdata.token_stream(corpus, tokenizer)
    n_val = meta["data"]["val_tokens"]
    for (_, start), row in zip(windows.starts, windows.tokens):
        body = row[1:] if policy == "doc-start" else row
        assert start + len(body) <= n_val  # inside the validation split
        np.testing.assert_array_equal(stream[start:start + len(body)], body)
    if policy == "doc-start":
        assert windows.bos_id == tdata.end_of_text_id(tokenizer) and np.all(windows.tokens[:, 0] == windows.bos_id)
        assert all(_para(tokenizer, r[1:13]) is not None for r in windows.tokens)
    else:
        assert windows.bos_id is None
    assert [s for _, s in windows.starts] == sorted(s for _, s in windows.starts)
    np.testing.assert_array_equal(checkpoint_windows(out, n_seqs=5, seed=0).tokens, windows.tokens)
    with pytest.raises(SinkscopeError, match="fewer than --n-seqs 100000"):
        checkpoint_windows(out, n_seqs=100000, seed=0)


@pytest.mark.slow  # trains
def test_sinks_on_a_checkpoint_uses_its_validation_split(tmp_path):
    """Without --text-file, `sinkscope sinks CKPT` draws the checkpoint's own validation windows."""
    from typer.testing import CliRunner

    from sinkscope.cli import app

    out = tmp_path / "ckpt"
    train(trigger_options(out, steps=3, checkpoint_every=3), log=quiet)
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["sinks", str(out), "--n-seqs", "5", "--seed", "2", "--out", str(run),
                                      "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    assert "validation split" in result.output
    tokens = np.load(run / "tokens.npy")
    np.testing.assert_array_equal(tokens, checkpoint_windows(out, n_seqs=5, seed=2).tokens)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["corpus"]["kind"] == "checkpoint validation split"
    assert manifest["windows"]["seq_len"] == 20 and "validation split" in manifest["windows"]["rule"]
    table = pd.read_csv(run / "results.csv")
    assert set(table.variant) == {"baseline"} and set(table.step) == {3}  # the run's condition columns
