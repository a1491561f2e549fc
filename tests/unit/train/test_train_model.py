"""The trainer's model (src/sinkscope/train/model.py) on tiny configs.

Every attention variant trains, its fused and explicit paths agree, and the records it emits
obey SPEC.md's identities and feed the sinks probes. No data, no network: random token ids.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import AttentionRecord
from sinkscope.capture import hooks
from sinkscope.commands.sinks import sinks_probes
from sinkscope.forward.runner import Dispatcher
from sinkscope.models.trainer_config import TIERS, VARIANTS, GPTConfig
from sinkscope.train.model import GPT, load_balance_loss

VOCAB, T, B = 64, 16, 4
L, H, C = 2, 4, 32
D = C // H
PHANTOM = {"offbyone", "sinklogit", "sink+norm", "sink+proj"}
VALUE_GATED = {"normgate", "projgate", "sink+norm", "sink+proj", "routing-norm"}
CASES = [(v, "elementwise") for v in VARIANTS] + [("outgate", "headwise")]
CASE_IDS = [v if v != "outgate" else f"outgate-{m}" for v, m in CASES]


def make(variant: str = "baseline", mode: str = "elementwise", seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, block_size=32, n_layer=L, n_head=H, n_embd=C, variant=variant,
                  outgate_mode=mode)
    return GPT(GPTConfig(**{**fields, **overrides}))


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (B, T), generator=g)  # (B, T)
    targets = torch.randint(0, VOCAB, (B, T), generator=g)  # (B, T)
    return idx, targets


@torch.no_grad()
def perturb(model: GPT, seed: int = 2) -> GPT:
    """Move every variant parameter off its init so the identities are tested where they bite."""
    g = torch.Generator().manual_seed(seed)
    for block in model.transformer.h:
        attn = block.attn
        attn.c_attn.weight.mul_(4.0)  # sharper attention than at init
        if hasattr(attn, "sink_logit"):
            attn.sink_logit.copy_(torch.randn(H, generator=g))
        if hasattr(attn, "gate_tau"):  # ||v_j||/sqrt(D) is ~0.45 after the x4: gates land mid-range
            attn.gate_tau.copy_(0.45 + 0.1 * torch.randn(H, generator=g))
        if hasattr(attn, "gate_w"):
            attn.gate_w.copy_(torch.randn(H, D, generator=g))
            attn.gate_b.copy_(0.5 * torch.randn(H, generator=g))
        if hasattr(attn, "c_gate"):
            attn.c_gate.weight.copy_(0.5 * torch.randn(attn.c_gate.weight.shape, generator=g))
    if model.sink_token is not None:
        model.sink_token.copy_(torch.randn(C, generator=g))
    return model


class Recorder:
    """A tap that keeps everything."""

    def __init__(self):
        self.records: list[AttentionRecord] = []
        self.residuals: dict[int, torch.Tensor] = {}

    def on_attention(self, record: AttentionRecord) -> None:
        self.records.append(record)

    def on_residual(self, layer: int, hidden: torch.Tensor) -> None:
        self.residuals[layer] = hidden


def recorded(model: GPT, idx: torch.Tensor) -> Recorder:
    tap = Recorder()
    with torch.no_grad():
        model(idx, tap=tap)
    return tap


# ---- config ---------------------------------------------------------------------------------


def test_config_validation():
    with pytest.raises(ValueError, match="sinklogit"):
        GPTConfig(variant="sink-logit")
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="outgate_mode"):
        GPTConfig(variant="outgate", outgate_mode="rowwise")
    with pytest.raises(ValueError, match="force_sink_k"):
        GPTConfig(n_embd=32, n_head=4, force_sink_k=32)
    with pytest.raises(ValueError, match="tier"):
        GPTConfig.from_tier("7B")
    with pytest.raises(ValueError, match="attention"):
        make()(batch()[0], attention="flash")
    with pytest.raises(ValueError, match="block_size"):
        make()(torch.zeros(1, 33, dtype=torch.long))


def test_tiers_and_init():
    assert TIERS["10M"] == dict(n_layer=6, n_head=6, n_embd=384, block_size=512)
    assert TIERS["124M"] == dict(n_layer=12, n_head=12, n_embd=768, block_size=1024)
    assert GPTConfig.from_tier("350M").head_dim == 64
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_tier("tiny", vocab_size=4096))
    # research/tiny-tier-cpu.md: 4L x 4H x 128, ctx 128, BPE-4096 -> 1,328,256 params (tied).
    assert model.num_parameters() == 1_328_256
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not any(m.bias is not None for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)))
    block = model.transformer.h[0]
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.03)
    for proj in (block.attn.c_proj.weight, block.mlp.c_proj.weight):  # 0.02 / sqrt(2L), L = 4
        assert proj.std().item() == pytest.approx(0.02 / 8**0.5, rel=0.03)


def test_baseline_equals_hf_gpt2():
    """Reference equivalence: the baseline is GPT-2 with every bias at zero and exact GELU."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ours = perturb(make("baseline"))
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=C, n_layer=L, n_head=H, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                        bos_token_id=None, eos_token_id=None)
    reference = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
        reference.transformer.wte.weight.copy_(ours.transformer.wte.weight)
        reference.transformer.wpe.weight.copy_(ours.transformer.wpe.weight)
        reference.transformer.ln_f.weight.copy_(ours.transformer.ln_f.weight)
        for theirs, mine in zip(reference.transformer.h, ours.transformer.h):
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):  # Conv1D stores W^T
                theirs.get_submodule(name).weight.copy_(mine.get_submodule(name).weight.T)
            theirs.ln_1.weight.copy_(mine.ln_1.weight)
            theirs.ln_2.weight.copy_(mine.ln_2.weight)
        idx, _ = batch()
        expected = reference(idx).logits  # (B, T, V)
        for path in ("fused", "explicit"):
            assert (ours(idx, attention=path)[0] - expected).abs().max().item() < 1e-5


def test_paired_init_shares_weights_and_rng_stream():
    """Same seed, any variant: identical shared weights, and the global RNG left in the same state."""
    reference = make("baseline", seed=7)
    after_reference = torch.rand(3)
    shared = dict(reference.named_parameters())
    for variant, mode in [("projgate", "elementwise"), ("outgate", "elementwise"), ("sinktoken", "elementwise"),
                          ("sink+proj", "elementwise"), ("outgate", "headwise")]:
        model = make(variant, mode, seed=7)
        assert torch.equal(torch.rand(3), after_reference)
        for name, p in model.named_parameters():
            if name in shared:
                assert torch.equal(p, shared[name]), (variant, name)


def test_param_groups():
    model = make("sink+proj")
    decay, no_decay = model.param_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert "transformer.wte.weight" in decayed and "transformer.h.0.attn.c_attn.weight" in decayed
    assert "transformer.h.0.attn.gate_w" in kept  # 2-D, but a gate direction: never decayed
    assert {"transformer.h.1.attn.sink_logit", "transformer.h.1.attn.gate_b", "transformer.ln_f.weight"} <= kept
    assert len(decayed) + len(kept) == len(names)
    assert all(p.dim() >= 2 for p in decay["params"])


# ---- training -------------------------------------------------------------------------------


TRAIN_CASES = CASES + [("baseline", "tnlm+force_sink+lb"), ("sinklogit", "lb")]


@pytest.mark.slow  # trains
@pytest.mark.parametrize("variant,mode", TRAIN_CASES, ids=CASE_IDS + ["baseline-options", "sinklogit-lb"])
def test_loss_falls(variant, mode):
    options = {}
    if mode == "tnlm+force_sink+lb":
        model, options = make(variant, force_sink_k=4), dict(tnlm=True, lb_lambda=1e-2)
    elif mode == "lb":
        model, options = make(variant), dict(lb_lambda=1e-2)
    else:
        model = make(variant, mode)
    idx, targets = batch()
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(25):
        _, loss = model(idx, targets, **options)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses  # ~4.19 -> ~2.1 in practice


@pytest.mark.parametrize("variant", ["sink+proj", "routing-norm", "outgate", "normgate"])
def test_bf16_autocast(variant):
    """SPEC.md trains under bf16 autocast with the gate maths in float32: both paths run and stay close."""
    model = perturb(make(variant))
    idx, targets = batch()
    reference = model(idx, targets)[1].item()
    for path in ("fused", "explicit"):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, targets, attention=path, lb_lambda=1e-4)
        loss.backward()
        assert torch.isfinite(loss) and abs(loss.item() - reference) < 0.05
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ---- fused == explicit ------------------------------------------------------------------------


@pytest.mark.parametrize("variant,mode", CASES, ids=CASE_IDS)
def test_fused_matches_explicit(variant, mode):
    """Logits, loss (with the load-balancing term) and gradients agree between the two paths."""
    model = perturb(make(variant, mode, force_sink_k=3 if variant == "sinktoken" else 0))
    idx, targets = batch()
    results = {}
    for path in ("fused", "explicit"):
        model.zero_grad(set_to_none=True)
        logits, loss = model(idx, targets, attention=path, lb_lambda=1.0)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[path] = logits, loss, model.last_loss_terms["lb"], grads
    (lf, loss_f, lb_f, gf), (le, loss_e, lb_e, ge) = results["fused"], results["explicit"]
    assert (lf - le).abs().max().item() < 1e-5
    assert abs(loss_f.item() - loss_e.item()) < 1e-5
    assert lb_f.item() > 0 and abs(lb_f.item() - lb_e.item()) < 1e-6
    for name in gf:
        assert torch.allclose(gf[name], ge[name], atol=1e-5, rtol=1e-4), name


# ---- phantom ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(PHANTOM))
def test_phantom_mass_identities(variant):
    model = perturb(make(variant))
    idx, _ = batch()
    for record in recorded(model, idx).records:
        b = record.sink_logits  # (H,)
        assert b.shape == (H,)
        if variant == "offbyone":
            assert torch.equal(b, torch.zeros(H))
        s = record.logits()  # (B, H, T, S)
        column = b.view(1, H, 1, 1).expand(B, H, T, 1)  # (B, H, T, 1)
        phantom_column = torch.softmax(torch.cat([column, s], dim=-1), dim=-1)[..., 0]  # (B, H, T)
        formula = torch.sigmoid(b.view(1, H, 1) - torch.logsumexp(s, dim=-1))  # (B, H, T)
        assert torch.allclose(phantom_column, formula, atol=1e-6)
        assert torch.allclose(record.phantom_mass(), 1 - record.weights.sum(-1), atol=1e-6)
        assert record.phantom_mass().min() > 0


def test_offbyone_is_sinklogit_at_zero():
    idx, _ = batch()
    offbyone, sinklogit = make("offbyone", seed=3), make("sinklogit", seed=3)
    with torch.no_grad():
        for block in sinklogit.transformer.h:
            block.attn.sink_logit.zero_()
        for path in ("fused", "explicit"):
            assert torch.equal(offbyone(idx, attention=path)[0], sinklogit(idx, attention=path)[0])
        sinklogit.transformer.h[0].attn.sink_logit.fill_(1.0)
        assert not torch.allclose(offbyone(idx)[0], sinklogit(idx)[0])


# ---- value gates ------------------------------------------------------------------------------


def test_routing_norm_rows_sum_to_one():
    model = perturb(make("routing-norm"))
    for record in recorded(model, batch()[0]).records:
        assert torch.allclose(record.weights.sum(-1), torch.ones(B, H, T), atol=1e-6)
        # the record's logits carry the routing slot's log g_j (key_bias), as the weights do
        assert record.routing_gate and torch.allclose(record.key_bias, torch.log(record.value_gate), atol=1e-6)
        assert torch.allclose(record.weights, torch.softmax(record.logits(), dim=-1), atol=1e-6)
        plain = record.logits() - torch.log(record.value_gate).unsqueeze(2)  # (B, H, T, S): scale * q.k + mask
        assert not torch.allclose(record.weights, torch.softmax(plain, dim=-1), atol=1e-3)


@pytest.mark.parametrize("variant", ["normgate", "projgate", "sink+norm"])
def test_value_gate_is_routing_gate_times_row_scale(variant):
    """Lemma 3.1: sum_j a_ij g_j v_j = Z_i sum_j (a_ij g_j / Z_i) v_j, Z_i = sum_j a_ij g_j."""
    model = perturb(make(variant))
    heads: dict[int, torch.Tensor] = {}
    for layer, block in enumerate(model.transformer.h):  # the input of W_O = the head outputs
        block.attn.c_proj.register_forward_pre_hook(
            lambda _m, args, layer=layer: heads.__setitem__(layer, args[0].view(B, T, H, D).transpose(1, 2))
        )
    records = recorded(model, batch()[0]).records
    for record in records:
        g = record.value_gate  # (B, H, S)
        assert g.shape == (B, H, T) and 0 < g.min() and g.max() < 1
        effective = record.weights * g.unsqueeze(2)  # (B, H, T, S): a_ij g_j
        Z = effective.sum(-1, keepdim=True)  # (B, H, T, 1)
        rerouted = effective / Z  # (B, H, T, S): the routing-slot gate, rows sum to 1
        assert torch.allclose(rerouted.sum(-1), torch.ones(B, H, T), atol=1e-6)
        expected = Z * torch.matmul(rerouted, record.value.float())  # (B, H, T, D)
        assert torch.allclose(heads[record.layer], expected, atol=1e-6)
        assert Z.max() < 1  # a value gate shrinks the row; the routing slot alone would not


# ---- output gate, sink token, objective options ----------------------------------------------------


@pytest.mark.parametrize("mode", ["elementwise", "headwise"])
def test_outgate_shapes(mode):
    model = perturb(make("outgate", mode))
    assert model.transformer.h[0].attn.c_gate.weight.shape == ((C if mode == "elementwise" else H), C)
    for record in recorded(model, batch()[0]).records:
        gate = record.output_gate
        assert gate.shape == (B, T, H, D) and 0 < gate.min() and gate.max() < 1
        if mode == "headwise":
            assert torch.equal(gate, gate[..., :1].expand_as(gate))
        else:
            assert (gate - gate[..., :1]).abs().max() > 1e-3


def test_sinktoken_positions():
    model = perturb(make("sinktoken"))
    idx, _ = batch()
    logits, _ = model(idx)
    assert logits.shape == (B, T, VOCAB)
    tap = recorded(model, idx)
    assert all(r.query.shape == (B, H, T + 1, D) and r.weights.shape == (B, H, T + 1, T + 1) for r in tap.records)
    assert all(h.shape == (B, T + 1, C) for h in tap.residuals.values())
    # key 0 of layer 0 is the sink token: the same value vector in every sequence
    block = model.transformer.h[0]
    with torch.no_grad():
        v0 = block.attn.c_attn(block.ln_1(model.sink_token))[2 * C:].view(H, D)  # (H, D)
    assert torch.allclose(tap.records[0].value[:, :, 0], v0.expand(B, H, D), atol=1e-6)


def test_tnlm_drops_position_zero():
    model = make()
    idx, targets = batch()
    logits, loss = model(idx, targets, tnlm=True)
    manual = F.cross_entropy(logits[:, 1:].reshape(-1, VOCAB), targets[:, 1:].reshape(-1))
    assert abs(loss.item() - manual.item()) < 1e-6
    full = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    assert abs(model(idx, targets)[1].item() - full.item()) < 1e-6 and abs(full.item() - loss.item()) > 1e-5


@pytest.mark.parametrize("variant", ["baseline", "sinktoken"])
def test_force_sink_mask(variant):
    k = 4
    model = perturb(make(variant, force_sink_k=k))
    tap = recorded(model, batch()[0])
    assert len(tap.residuals) == L
    for hidden in tap.residuals.values():  # (B, T', C)
        assert torch.all(hidden[:, 0, k:] == 0)  # position 0 keeps only the first k channels
        assert torch.all(hidden[:, 1:, :k] == 0)  # every other position loses them
        assert hidden[:, 0, :k].abs().min() > 0 and hidden[:, 1:, k:].abs().min() > 0


@pytest.mark.parametrize("variant,mode", [("baseline", "elementwise"), ("sinklogit", "elementwise"),
                                          ("sinktoken", "elementwise"), ("outgate", "headwise")])
def test_load_balancing_loss(variant, mode):
    model = perturb(make(variant, mode))
    idx, targets = batch()
    _, plain = model(idx, targets)
    _, with_lb = model(idx, targets, lb_lambda=1.0)
    lb = model.last_loss_terms["lb"]
    assert lb > 0 and torch.allclose(with_lb - plain, lb, atol=1e-6)
    grads = torch.autograd.grad(with_lb - plain, [model.transformer.h[0].attn.c_attn.weight])
    assert grads[0].abs().max() > 0
    # the same number from the records (SPEC.md: G_i = 1 - A_sink,i; outgate: mean gate value)
    imps = []
    for record in recorded(model, idx).records:
        if record.output_gate is not None:
            G = record.output_gate.mean(-1).transpose(1, 2)  # (B, H, T)
        elif record.has_phantom:
            G = 1 - record.phantom_mass()  # (B, H, T)
        else:
            G = 1 - record.key_mass(0, over="all")  # (B, H, T)
        imps.append(G[:, :, 1:].mean(dim=(0, 2)))  # (H,)
    assert abs(load_balance_loss(torch.stack(imps)).item() - lb.item()) < 1e-6
    assert load_balance_loss(torch.ones(3, 4)).item() == 0.0


# ---- records and probes -------------------------------------------------------------------------


@pytest.mark.parametrize("variant,mode", CASES, ids=CASE_IDS)
def test_records_feed_the_probes(variant, mode):
    model = perturb(make(variant, mode))
    tap = recorded(model, batch()[0])
    S = T + 1 if variant == "sinktoken" else T
    spec = ModelSpec(family="sinkscope-gpt", n_layers=L, n_heads=H, n_kv_heads=H, head_dim=D, hidden_size=C,
                     attention_layers=tuple(range(L)), has_phantom=variant in PHANTOM,
                     has_output_gate=variant == "outgate", has_value_gate=variant in VALUE_GATED, vocab_size=VOCAB,
                     mlp_width=4 * C)
    assert model.model_spec() == spec
    assert [r.layer for r in tap.records] == list(range(L))
    for r in tap.records:
        assert r.query.shape == r.key.shape == r.value.shape == (B, H, S, D)
        assert r.weights.shape == (B, H, S, S) and r.weights.dtype == torch.float32
        assert r.mask.shape == (1, 1, S, S) and r.scale == pytest.approx(D**-0.5)
        assert torch.all(r.weights.triu(1) == 0)
        assert (r.sink_logits is not None) == (variant in PHANTOM)
        assert (r.value_gate is not None) == (variant in VALUE_GATED)
        assert (r.output_gate is not None) == (variant == "outgate")
        p0 = r.key_mass(0, over="real")  # (B, H, T)
        assert p0.shape == (B, H, S) and 0 <= p0.min() and p0.max() <= 1 + 1e-6
        assert torch.allclose(p0[:, :, 0], torch.ones(B, H))  # row 0 sees only key 0
        assert torch.allclose(r.key_mass(slice(None), over="real"), torch.ones(B, H, S), atol=1e-6)
        real = r.weights.sum(-1)  # (B, H, T): 1 - phi
        assert torch.allclose(real, 1 - r.phantom_mass(), atol=1e-6)
        # a_ij = (1 - phi_i) softmax_j(s_ij), s_ij with routing-norm's log g_j
        assert torch.allclose(r.weights, real.unsqueeze(-1) * torch.softmax(r.logits(), -1), atol=1e-6)
    probes = sinks_probes(spec)
    dispatcher = Dispatcher(probes)
    for r in tap.records:
        dispatcher.emit(hooks.ATTN, r.layer, r)
    for layer, hidden in tap.residuals.items():
        dispatcher.emit(hooks.RESID_POST, layer, hidden)
    rows = [row for probe in probes for row in probe.rows()]
    model_rows = {row.metric: row.value for row in rows if row.layer is None and row.head is None}
    assert {"p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation"} <= set(model_rows)
    assert (model_rows["phantom_mass"] > 0) == (variant in PHANTOM)
    assert ("sink_logit" in model_rows) == (variant in PHANTOM)


@pytest.mark.parametrize("pattern", ["full", "sliding,full"])
@pytest.mark.parametrize("variant,mode", CASES, ids=CASE_IDS)
def test_fused_records_answer_like_explicit_ones(variant, mode, pattern):
    """A probe run's fused record (kernel LSE, gate moments as value columns, no weights) gives the
    explicit record's row reductions and the same logits, within 1e-5."""
    from collect import Collect

    model = perturb(make(variant, mode, layer_pattern=pattern, window=5))
    idx = batch()[0]
    records, logits = {}, {}
    for attention in ("explicit", "fused"):
        sink = Collect(hooks.ATTN)
        sink.record_columns = frozenset({"value_gate"})
        with torch.no_grad():
            logits[attention], _ = model(idx, attention=attention, hooks=sink)
        records[attention] = sink.records
    torch.testing.assert_close(logits["fused"], logits["explicit"], atol=1e-5, rtol=0)
    for e, f in zip(records["explicit"], records["fused"]):
        assert f.is_fused and f.weights is None and not e.is_fused
        assert (f.mask is None) == (f.sliding_window is None)  # a full layer keeps no (T, S) mask
        pairs = [(e.lse(), f.lse()), (e.phantom_mass(), f.phantom_mass()), (e.key_mass(0), f.key_mass(0)),
                 (e.key_mass(0, over="all"), f.key_mass(0, over="all")), (e.key_mass(slice(1, 4)), f.key_mass(slice(1, 4)))]
        if variant in VALUE_GATED:
            pairs += list(zip(e.gate_moments(), f.gate_moments()))
        else:
            assert f.gate_columns is None
        for a, b in pairs:
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
