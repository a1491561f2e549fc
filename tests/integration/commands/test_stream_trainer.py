"""`sinkscope stream` on a sinkscope trainer checkpoint: the mask-based reading (``reader.read_native``).

References: the model's own forward (policy ``full``), the explicit attention path against the fused
one under the same cache visibility, and, on a one-layer model without position embeddings, the
model's plain forward on exactly the tokens the cache holds (its keys then depend on their token
only, so reading a bounded cache is reading the kept tokens).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from checkpoints import trainer_checkpoint
from conftest import make_tokenizer
from sinkscope.kvcache.policies import Policy, visible
from sinkscope.cli import app
from sinkscope.forward.stream.reader import read_native
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT

VARIANTS = ("baseline", "offbyone", "sinklogit", "sinktoken")
L = 24


def _model(variant: str, n_layer: int = 2, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=97, block_size=32, n_layer=n_layer, n_head=2, n_embd=32, variant=variant)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "sink_logit" in name:
                p.fill_(1.5)  # a trained-looking phantom
    return model


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (1, L), generator=torch.Generator().manual_seed(seed))  # (1, L)


def _last_nll(model: GPT, ids: torch.Tensor, target: int) -> float:
    logits, _ = model(ids)  # (1, T, V)
    return float(F.cross_entropy(logits[0, -1:].float(), torch.tensor([target])))


@pytest.mark.parametrize("variant", VARIANTS)
def test_full_is_the_plain_forward_and_both_attention_paths_agree_under_a_cache(variant):
    model, ids = _model(variant), _ids()
    with torch.no_grad():
        logits, _ = model(ids)
        dense = F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
        assert torch.allclose(read_native(model, ids, Policy("full")), dense, atol=1e-6)
        extra = 1 if variant == "sinktoken" else 0
        positions = torch.arange(L + extra)
        for policy in (Policy("window", 6, 0, "original"), Policy("sinks", 6, 2, "original")):
            seen = visible(policy, positions, positions)
            fused, _ = model(ids, visible=seen)
            explicit, _ = model(ids, visible=seen, attention="explicit")
            assert torch.allclose(fused, explicit, atol=1e-5), (variant, policy)
            assert not torch.allclose(fused, logits, atol=1e-3), (variant, policy)  # the cache changes the reading


@pytest.mark.parametrize("variant", ["baseline", "offbyone"])
def test_a_bounded_cache_reads_as_the_kept_tokens_alone_on_a_position_free_one_layer_model(variant):
    model, ids = _model(variant, n_layer=1), _ids()
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
        C, n = 6, 2
        window = read_native(model, ids, Policy("window", C, 0, "original"))  # (L - 1,)
        sinks = read_native(model, ids, Policy("sinks", C, n, "original"))
        for t in (C + 3, L - 2):
            target = int(ids[0, t + 1])
            assert float(window[t]) == pytest.approx(_last_nll(model, ids[:, t - C:t + 1], target), abs=1e-5)
            kept = torch.cat([ids[:, :n], ids[:, t - (C - n):t + 1]], dim=1)  # the n sinks and the C - n before t
            assert float(sinks[t]) == pytest.approx(_last_nll(model, kept, target), abs=1e-5)


def test_the_learned_sink_token_is_the_first_key_a_cache_holds():
    """sinktoken: ``sinks`` with 1 token keeps the learned token alone, ``window`` evicts it (StreamingLLM's 1+N, 0+N)."""
    model, ids = _model("sinktoken", n_layer=1), _ids()
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
        C = 6
        one = read_native(model, ids, Policy("sinks", C, 1, "original"))
        window = read_native(model, ids, Policy("window", C, 0, "original"))
        t = L - 2
        target = int(ids[0, t + 1])
        # the learned token (the model prepends it) and the C - 1 keys before document token t
        assert float(one[t]) == pytest.approx(_last_nll(model, ids[:, t - (C - 1):t + 1], target), abs=1e-5)
        # internal query t + 1 sees internal keys t + 1 - C .. t + 1: document tokens t - C .. t, no learned token
        assert abs(float(window[t]) - float(one[t])) > 1e-4


def test_a_trainer_checkpoint_streams_in_mask_mode_and_says_why_not_otherwise(tmp_path, text_file):
    ckpt = trainer_checkpoint(tmp_path / "ckpt", "sinktoken", make_tokenizer())
    out = tmp_path / "run"
    common = [str(ckpt), "--text-file", str(text_file), "--n-seqs", "2", "--cache", "8", "--sink-tokens", "0,1,2",
              "--policy", "full,window,sinks", "--positions", "original", "--no-progress", "--no-figures"]
    refused = CliRunner().invoke(app, ["stream", *common, "--length", "32", "--out", str(tmp_path / "no")])
    assert refused.exit_code != 0 and "--mode mask" in refused.output and "Traceback" not in refused.output
    too_long = CliRunner().invoke(app, ["stream", *common, "--mode", "mask", "--length", "80", "--out", str(tmp_path / "x")])
    assert too_long.exit_code != 0 and "64" in too_long.output and "Traceback" not in too_long.output
    result = CliRunner().invoke(app, ["stream", *common, "--mode", "mask", "--length", "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    conditions = json.loads((out / "manifest.json").read_text())["probes"]["stream"]["options"]["conditions"]
    assert [c["label"] for c in conditions][0] == "full" and len(conditions) == 4  # full, window, sinks 1, sinks 2
    nll = np.load(out / "stream_nll.npy")  # (conditions, windows, L - 1)
    tokens = torch.from_numpy(np.load(out / "tokens.npy"))
    from sinkscope.train.checkpoint import load_checkpoint

    model = load_checkpoint(ckpt)[0].eval()
    with torch.no_grad():
        for c, condition in enumerate(conditions):
            policy = Policy(condition["policy"], condition["cache"] or 0, condition["sink_tokens"] or 0, "original")
            assert np.allclose(nll[c, 1], read_native(model, tokens[1:2], policy).numpy(), atol=1e-5)
    overall = table[(table.metric == "stream_nll") & table.position_bucket.isna()]
    assert len(overall) == 4
    assert ((table.probe == "p0_mass") & (table.metric == "p0_mass")).any()
