"""The trainer's data, checkpoints and loop (src/sinkscope/train/{data,checkpoint,loop}.py).

Tiny models (2 layers x 2 heads x 32, context 32) on a generated, repetitive text with a
300-entry BPE trained in the test, so every run takes a second or two on two CPU cores. The
cache (tokenizers, token streams) goes to a temporary folder.
"""

from __future__ import annotations

import json
import os
import random
import socket

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sinkscope.errors import SinkscopeError
from sinkscope.models import checkpoint_folder
from sinkscope.train import checkpoint as ckpt
from sinkscope.train import data as tdata
from sinkscope.train.loop import LOG_COLUMNS, log_columns, lr_at, read_log, train
from sinkscope.train.config import TrainOptions, apply_overrides, resolve_options
from sinkscope.models.trainer_config import TIERS, GPTConfig
from sinkscope.train.model import GPT

SMALL = ["n_layer=2", "n_head=2", "n_embd=32", "block_size=32"]
WORDS = ("the cat dog bird sat ran flew on under a mat house tree and with red blue small big quietly "
         "she he they saw").split()


def quiet(_message: str) -> None:
    pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A private cache and a repetitive text file (~45k tokens under the test BPE) in paragraphs of
    three lines (1,000 passage starts for doc-start windows)."""
    root = tmp_path_factory.mktemp("trainer")
    old = os.environ.get("SINKSCOPE_CACHE")
    os.environ["SINKSCOPE_CACHE"] = str(root / "cache")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(3000)]
    paragraphs = ["\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)]
    text = root / "words.txt"
    text.write_text("\n\n".join(paragraphs), encoding="utf-8")
    yield {"root": root, "text": str(text)}
    if old is None:
        os.environ.pop("SINKSCOPE_CACHE", None)
    else:
        os.environ["SINKSCOPE_CACHE"] = old


def options(env, out, **kw) -> TrainOptions:
    base = dict(out=str(out), text_file=env["text"], tokenizer="bpe300", steps=20, batch_size=8, warmup_steps=2,
                eval_every=10, eval_windows=8, checkpoint_every=10, overrides=list(SMALL), progress=False)
    base.update(kw)
    return TrainOptions(**base)


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def trained(env):
    """One 30-step sinklogit run that later tests inspect."""
    out = env["root"] / "trained"
    train(options(env, out, variant="sinklogit", steps=30), log=quiet)
    return out


# ---- options ----------------------------------------------------------------------------------


def test_overrides_are_parsed_and_validated():
    config = GPTConfig(**TIERS["tiny"], vocab_size=300)
    new = apply_overrides(config, ["n_layer=2", "n_embd=64", "variant=sink+proj", "norm_gate_beta=4",
                                   "outgate_mode='headwise'"])
    assert (new.n_layer, new.n_embd, new.variant, new.outgate_mode) == (2, 64, "sink+proj", "headwise")
    assert new.norm_gate_beta == 4.0 and isinstance(new.norm_gate_beta, float)
    assert config.n_layer == 4  # the original is untouched
    with pytest.raises(SinkscopeError, match="unknown --set key 'n_layers'.*did you mean 'n_layer'.*valid keys: vocab_size"):
        apply_overrides(config, ["n_layers=2"])
    with pytest.raises(SinkscopeError, match="n_layer needs a int value, not '2.5'"):
        apply_overrides(config, ["n_layer=2.5"])
    with pytest.raises(SinkscopeError, match="n_layer needs a int value"):
        apply_overrides(config, ["n_layer=True"])
    with pytest.raises(SinkscopeError, match="key=value"):
        apply_overrides(config, ["n_layer"])
    with pytest.raises(SinkscopeError, match="divisible by n_head"):
        apply_overrides(config, ["n_embd=130"])
    with pytest.raises(SinkscopeError, match="unknown variant"):
        apply_overrides(config, ["variant=sinky"])


def test_options_resolve_tier_defaults_and_fail_clearly():
    tiny = resolve_options(TrainOptions())
    assert (tiny.variant, tiny.tier, tiny.seed, tiny.tokenizer) == ("baseline", "tiny", 0, "bpe4096")
    assert (tiny.steps, tiny.batch_size, tiny.lr, tiny.warmup_steps) == (600, 32, 2e-3, 30)
    assert tiny.min_lr == pytest.approx(2e-4)
    paper = resolve_options(TrainOptions(tier="124M"))
    assert (paper.steps, paper.batch_size, paper.grad_accum, paper.lr, paper.min_lr, paper.warmup_steps) == (
        48800, 32, 4, 6e-4, 6e-5, 800)
    assert resolve_options(TrainOptions(tier="124M", steps=4880)).warmup_steps == 80  # same warmup fraction
    with pytest.raises(SinkscopeError, match="unknown tier '124m'.*did you mean '124M'"):
        resolve_options(TrainOptions(tier="124m"))
    with pytest.raises(SinkscopeError, match="unknown variant 'sink-proj'.*did you mean 'sink\\+proj'"):
        resolve_options(TrainOptions(variant="sink-proj"))
    with pytest.raises(SinkscopeError, match="multiple of grad_accum"):
        resolve_options(TrainOptions(batch_size=10, grad_accum=4))


def test_schedule_warms_up_then_decays_to_min_lr():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=10, steps=100)
    assert lr_at(0, **kw) == pytest.approx(0.1) and lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0) and lr_at(99, **kw) == pytest.approx(0.1)
    values = [lr_at(i, **kw) for i in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))


# ---- data ---------------------------------------------------------------------------------------


def test_validation_comes_first_and_is_disjoint(env):
    from sinkscope.data.corpus import load_corpus

    corpus = load_corpus(env["text"])
    tokenizer = tdata.load_tokenizer("bpe300", corpus)
    assert tokenizer.eos_token == tdata.EOS_TOKEN and len(tokenizer) <= 300
    again = tdata.load_tokenizer("bpe300", corpus)  # from the cache
    assert tdata.tokenizer_fingerprint(again) == tdata.tokenizer_fingerprint(tokenizer)
    stream = tdata.token_stream(corpus, tokenizer)
    assert stream.dtype == np.uint16
    np.testing.assert_array_equal(tdata.token_stream(corpus, tokenizer), stream)  # cached copy
    val, train_tokens = tdata.split_stream(stream, block_size=32)
    assert len(val) == max(int(0.05 * len(stream)), 4 * 33)
    np.testing.assert_array_equal(val, stream[:len(val)])
    np.testing.assert_array_equal(train_tokens, stream[len(val):])
    assert len(val) + len(train_tokens) == len(stream)
    # tiny stream: still at least 4 validation windows
    small_val, _ = tdata.split_stream(stream[:1000], block_size=32)
    assert len(small_val) == 4 * 33
    x, y = tdata.eval_batches(val, 32, 8)
    assert x.shape == y.shape == (8, 32)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    stride = len(val) // 8
    for i in range(8):
        np.testing.assert_array_equal(x[i].numpy(), val[i * stride:i * stride + 32])
    assert stride >= 33  # non-overlapping
    with pytest.raises(SinkscopeError, match="too few"):
        tdata.split_stream(stream[:100], block_size=32)


def test_tokenizer_choices_fail_in_one_sentence(env, monkeypatch):
    import transformers

    def absent(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", absent)
    with pytest.raises(SinkscopeError, match="GPT-2 tokenizer is not in the local Hugging Face cache"):
        tdata.load_tokenizer("gpt2")
    with pytest.raises(SinkscopeError, match="unknown tokenizer 'gtp2'; use bpe4096"):
        tdata.load_tokenizer("gtp2")


def test_batches_follow_the_seed_and_shard_across_processes(env):
    tokens = np.arange(5000, dtype=np.uint16)
    a = tdata.TrainBatches(tokens, 16, 8, seed=0)
    b = tdata.TrainBatches(tokens, 16, 8, seed=0)
    c = tdata.TrainBatches(tokens, 16, 8, seed=1)
    first = [a.next()[0] for _ in range(3)]
    assert all(torch.equal(p, b.next()[0]) for p in first)
    assert not torch.equal(first[0], c.next()[0])
    # a process's rows are its contiguous share of the one global batch
    full = tdata.TrainBatches(tokens, 16, 8, seed=3)
    shards = [tdata.TrainBatches(tokens, 16, 8, seed=3) for _ in range(2)]
    for _ in range(2):
        x, y = full.next()
        parts = [s.next(rank, 2) for rank, s in enumerate(shards)]
        assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    # state round trip
    state = a.state_dict()
    nxt = a.next()[0]
    d = tdata.TrainBatches(tokens, 16, 8, seed=0)
    d.load_state_dict(state)
    assert torch.equal(d.next()[0], nxt) and d.index == a.index


@pytest.mark.slow  # trains
def test_variants_with_one_seed_see_identical_batches(env, monkeypatch):
    seen: dict[str, list[torch.Tensor]] = {}
    original = tdata.TrainBatches.next

    def record(self, rank=0, world_size=1):
        x, y = original(self, rank, world_size)
        seen.setdefault(self._tag, []).append(x.clone())
        return x, y

    monkeypatch.setattr(tdata.TrainBatches, "next", record)
    for variant, seed in [("baseline", 0), ("sinklogit", 0), ("baseline", 1)]:
        tag = f"{variant}-{seed}"
        monkeypatch.setattr(tdata.TrainBatches, "_tag", tag, raising=False)
        train(options(env, env["root"] / f"pair-{tag}", variant=variant, seed=seed, steps=4, eval_every=100,
                      checkpoint_every=100), log=quiet)
    assert len(seen["baseline-0"]) == 4
    assert all(torch.equal(p, q) for p, q in zip(seen["baseline-0"], seen["sinklogit-0"]))
    assert not any(torch.equal(p, q) for p, q in zip(seen["baseline-0"], seen["baseline-1"]))


# ---- training, logging, checkpoints ----------------------------------------------------------------


@pytest.mark.slow  # trains
def test_training_lowers_val_loss_and_logs(trained):
    rows = read_log(trained)
    header = (trained / "log.csv").read_text().splitlines()[0]
    assert header == ",".join(log_columns(2))  # LOG_COLUMNS, then the load imbalance and its value per layer
    assert header.startswith(",".join(LOG_COLUMNS) + ",load_imbalance,load_imbalance_l0,load_imbalance_l1")
    evals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    assert [s for s, _ in evals] == [0, 10, 20, 30]
    assert evals[0][1] > 5.0  # about ln(300) at init
    assert all(a[1] > b[1] for a, b in zip(evals, evals[1:])), evals
    assert evals[-1][1] < evals[0][1] - 1.0, evals
    assert [int(r["step"]) for r in rows] == [0, 10, 20, 30]  # log_every 10
    assert int(rows[-1]["tokens"]) == 30 * 8 * 32
    assert all(float(r["tokens_per_s"]) > 0 for r in rows[1:])
    meta = json.loads((trained / "config.json").read_text())
    assert meta["val_loss"] == pytest.approx(evals[-1][1], abs=1e-5) and meta["val_loss_step"] == 30


@pytest.mark.slow  # trains (its fixture)
def test_checkpoint_round_trip(trained, env):
    meta = json.loads((trained / "config.json").read_text())
    assert meta["sinkscope_trainer"] == 1 and checkpoint_folder.is_checkpoint(trained)
    assert (meta["variant"], meta["tier"], meta["seed"], meta["step"]) == ("sinklogit", "tiny", 0, 30)
    assert meta["tokens_seen"] == 30 * 8 * 32
    assert meta["model"]["n_layer"] == 2 and meta["model"]["vocab_size"] == meta["data"]["vocab_size"]
    assert meta["train_options"]["overrides"] == SMALL and meta["train_options"]["lr"] == 2e-3
    assert "torch" in meta["versions"]
    model, tokenizer, meta2, opt_state = ckpt.load_checkpoint(trained)
    assert opt_state is None and meta2 == meta
    assert model.lm_head.weight is model.transformer.wte.weight  # re-tied
    with safe_open(str(trained / "model.safetensors"), framework="pt") as handle:
        assert "lm_head.weight" not in handle.keys()  # stored once
    saved = weights(trained)
    for name, tensor in model.state_dict().items():
        key = "transformer.wte.weight" if name == "lm_head.weight" else name
        assert torch.equal(tensor, saved[key]), name
    assert tokenizer("the cat sat").input_ids == tdata.load_tokenizer("bpe300", _corpus(env)).encode(
        "the cat sat", add_special_tokens=False)
    _, _, _, state = ckpt.load_checkpoint(trained, for_training=True)
    assert state["step"] == 30 and state["train_state"]["batches"]["index"] == 30
    # save -> load of a fresh model keeps every tensor bitwise
    torch.manual_seed(5)
    fresh = GPT(GPTConfig(vocab_size=300, block_size=16, n_layer=1, n_head=2, n_embd=16, variant="sink+proj"))
    folder = env["root"] / "roundtrip"
    ckpt.save_checkpoint(folder, fresh, None, 0, None, tokenizer, {"tier": "tiny", "seed": 5})
    back, _, meta3, _ = ckpt.load_checkpoint(folder)
    assert meta3["variant"] == "sink+proj" and meta3["step"] == 0 and not (folder / "optimizer.pt").exists()
    for (n1, t1), (n2, t2) in zip(fresh.state_dict().items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".roundtrip")]  # no stage left


def _corpus(env):
    from sinkscope.data.corpus import load_corpus

    return load_corpus(env["text"])


@pytest.mark.slow  # trains (its fixture `trained`)
def test_damaged_checkpoints_fail_in_one_sentence(trained, env, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(trained, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(SinkscopeError, match="model.safetensors .* damaged or incomplete"):
        ckpt.load_checkpoint(bad)
    (bad / "model.safetensors").unlink()
    with pytest.raises(SinkscopeError, match="no model.safetensors"):
        ckpt.load_checkpoint(bad)
    shutil.copy(trained / "model.safetensors", bad / "model.safetensors")
    (bad / "optimizer.pt").write_bytes(b"junk")
    with pytest.raises(SinkscopeError, match="optimizer.pt .* damaged"):
        ckpt.load_checkpoint(bad, for_training=True)
    (bad / "config.json").write_text("{not json")
    assert not checkpoint_folder.is_checkpoint(bad)
    with pytest.raises(SinkscopeError, match="config.json .* damaged"):
        ckpt.load_checkpoint(bad)
    with pytest.raises(SinkscopeError, match="no trainer checkpoint"):
        ckpt.load_checkpoint(tmp_path / "nowhere")


@pytest.mark.slow  # trains
def test_existing_out_and_bad_resume_are_refused(trained, env, tmp_path):
    import shutil

    with pytest.raises(SinkscopeError, match="already exists; pass --resume"):
        train(options(env, trained), log=quiet)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SinkscopeError, match="holds files sinkscope did not write"):
        train(options(env, other, overwrite=True), log=quiet)
    assert (other / "notes.txt").exists()
    replaced = tmp_path / "replaced"
    shutil.copytree(trained, replaced)
    train(options(env, replaced, overwrite=True, steps=3, eval_every=100), log=quiet)
    assert json.loads((replaced / "config.json").read_text())["step"] == 3
    assert [int(r["step"]) for r in read_log(replaced)] == [0, 3]
    with pytest.raises(SinkscopeError, match="no trainer checkpoint to resume"):
        train(options(env, tmp_path / "empty", resume=True), log=quiet)
    with pytest.raises(SinkscopeError, match="variant='baseline' was asked for and the checkpoint has variant='sinklogit'"):
        train(TrainOptions(out=str(trained), resume=True, variant="baseline", progress=False), log=quiet)
    with pytest.raises(SinkscopeError, match="seed=1 was asked for and the checkpoint has seed=0"):
        train(TrainOptions(out=str(trained), resume=True, seed=1, progress=False), log=quiet)
    with pytest.raises(SinkscopeError, match="past steps=20"):
        train(TrainOptions(out=str(trained), resume=True, steps=20, progress=False), log=quiet)


@pytest.mark.slow  # trains
def test_resume_gives_the_uninterrupted_result(env):
    straight = env["root"] / "straight"
    train(options(env, straight, variant="sink+proj"), log=quiet)
    split = env["root"] / "split"
    train(options(env, split, variant="sink+proj", stop_at=10), log=quiet)
    assert json.loads((split / "config.json").read_text())["step"] == 10
    # the interrupted run logged a row after its checkpoint: resume drops it
    with open(split / "log.csv", "a") as handle:
        handle.write("12,3072,1.0,,0.001,1.0,1.0\n")
    train(TrainOptions(out=str(split), resume=True, progress=False), log=quiet)
    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    opt_a = torch.load(straight / "optimizer.pt", weights_only=True)
    opt_b = torch.load(split / "optimizer.pt", weights_only=True)
    for sa, sb in zip(opt_a["optimizer"]["state"].values(), opt_b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    steps = [int(r["step"]) for r in read_log(split)]
    assert steps == [0, 10, 20]
    straight_rows, split_rows = read_log(straight), read_log(split)
    assert [r["val_loss"] for r in straight_rows] == [r["val_loss"] for r in split_rows]


@pytest.mark.slow  # trains
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(env, monkeypatch):
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if targets is not None and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] >= 13:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    out = env["root"] / "diverged"
    with pytest.raises(SinkscopeError) as info:
        train(options(env, out, checkpoint_every=5), log=quiet)
    message = str(info.value)
    assert message.startswith(f"training diverged at step 13 (loss nan); the last good checkpoint at step 10 is in {out}")
    meta = json.loads((out / "config.json").read_text())
    assert meta["step"] == 10
    model, _, _, state = ckpt.load_checkpoint(out, for_training=True)
    assert state["step"] == 10 and all(torch.isfinite(p).all() for p in model.parameters())
    # before the first checkpoint, the message says none was written
    calls["n"] = 0
    with pytest.raises(SinkscopeError, match="no checkpoint had been written yet"):
        train(options(env, env["root"] / "diverged-early", checkpoint_every=15), log=quiet)


# ---- several processes ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, opts: TrainOptions, cache: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                       "RANK": str(rank), "LOCAL_RANK": str(rank), "SINKSCOPE_CACHE": cache,
                       "TOKENIZERS_PARALLELISM": "false"})
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    train(opts, log=quiet)


@pytest.mark.slow  # spawns Python (a process pool), trains
def test_two_processes_match_one(env):
    one = env["root"] / "ddp-one"
    two = env["root"] / "ddp-two"
    kw = dict(variant="sinklogit", steps=8, eval_every=100, checkpoint_every=100, device="cpu")
    train(options(env, one, **kw), log=quiet)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), options(env, two, **kw),
                                                   os.environ["SINKSCOPE_CACHE"]), nprocs=2, join=True)
    a, b = weights(one), weights(two)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    losses_one = [float(r["train_loss"]) for r in read_log(one) if r["train_loss"]]
    losses_two = [float(r["train_loss"]) for r in read_log(two) if r["train_loss"]]
    assert losses_one == pytest.approx(losses_two, abs=1e-5)
