"""Host synchronisation of a whole sinks run: per batch, not per layer (counted on CPU tensors).

The median's CPU band path reads counts back on purpose (free on a CPU); the accelerators'
radix select is used here, so the counts are those a GPU run would have.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sinkscope.capture import ModelSpec
from sinkscope.commands.sinks import SINKS_PROBES
from sinkscope.probes import get_probe, stats
from sinkscope.forward.runner import run_probes
from sync_guard import HostSyncGuard
from tiny_models import VOCAB, random_ids


def _llama(layers: int) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _sinkscope_syncs(layers: int, probe_names, monkeypatch) -> dict[str, int]:
    """{call site in src/sinkscope: count} for 2 batches of 2 windows x 200 tokens."""
    monkeypatch.setattr(stats, "CPU_BAND", False)
    model = _llama(layers)
    spec = ModelSpec.from_model(model)
    ids = random_ids(4, 200, seed=3).numpy()
    run_probes(model, ids[:2], [get_probe(n)(spec) for n in probe_names], batch_size=2, progress=False)  # warm-up
    probes = [get_probe(n)(spec) for n in probe_names]
    with HostSyncGuard() as guard:
        run_probes(model, ids, probes, batch_size=2, progress=False)
    sites: dict[str, int] = {}
    for call in guard.calls:
        if "/sinkscope/" in call.where:
            site = call.where.split("/sinkscope/", 1)[1]
            sites[site] = sites.get(site, 0) + 1
    return sites


def test_massive_activation_syncs_once_per_batch_whatever_the_depth(monkeypatch):
    shallow = _sinkscope_syncs(2, ["massive_activation"], monkeypatch)
    deep = _sinkscope_syncs(6, ["massive_activation"], monkeypatch)
    mine = {site: n for site, n in deep.items() if site.startswith("probes/massive_activation.py")}
    assert sum(mine.values()) == 0  # the runner snapshots on the device; rows() runs after the guard
    assert {s: n for s, n in shallow.items() if s.startswith("probes/massive")} == mine


def test_a_sinks_run_syncs_per_batch_not_per_layer(monkeypatch):
    shallow = _sinkscope_syncs(2, SINKS_PROBES, monkeypatch)
    deep = _sinkscope_syncs(6, SINKS_PROBES, monkeypatch)
    assert sum(deep.values()) == sum(shallow.values()), (shallow, deep)
