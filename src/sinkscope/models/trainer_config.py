"""The bundled trainer's model settings, torch-free: the attention variants, the tiers and ``GPTConfig``.

A trainer checkpoint is a MODEL like any other: reading its config.json (``models.checkpoint_folder``),
telling whether it has a phantom key, and checking its sizes need these settings before torch
loads. ``train/model.py`` builds the model they describe (SPEC.md "Trainer variants").
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- variants and tiers ---------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """What one attention variant adds to plain causal softmax attention."""

    phantom: str | None = None  # None | "fixed" (logit 0, offbyone) | "learned" (b_h)
    value_gate: str | None = None  # None | "norm" | "proj"
    routing: bool = False  # the value gate acts in the routing slot (logits + log g_j)
    sink_token: bool = False  # a learned vector prepended to every sequence
    output_gate: bool = False  # Qiu et al. 2025's G1 gate on each head's output

    def __post_init__(self):
        if self.phantom not in (None, "fixed", "learned"):
            raise ValueError(f"phantom must be None, 'fixed' or 'learned', not {self.phantom!r}")
        if self.value_gate not in (None, "norm", "proj"):
            raise ValueError(f"value_gate must be None, 'norm' or 'proj', not {self.value_gate!r}")
        if self.routing and self.value_gate is None:
            raise ValueError("the routing slot holds a value gate's log g_j, so routing needs a value_gate")
        if self.routing and self.phantom is not None:
            raise ValueError(
                "a routing-slot gate (rows sum to 1 over real keys) and a phantom (rows sum to 1 - phi) do not "
                "compose; no seed trains that pair"
            )

    @property
    def has_phantom(self) -> bool:
        return self.phantom is not None


VARIANTS: dict[str, Variant] = {
    "baseline": Variant(),
    "offbyone": Variant(phantom="fixed"),
    "sinklogit": Variant(phantom="learned"),
    "sinktoken": Variant(sink_token=True),
    "normgate": Variant(value_gate="norm"),
    "projgate": Variant(value_gate="proj"),
    "sink+norm": Variant(phantom="learned", value_gate="norm"),
    "sink+proj": Variant(phantom="learned", value_gate="proj"),
    "routing-norm": Variant(value_gate="norm", routing=True),
    "outgate": Variant(output_gate=True),
}

OUTGATE_MODES = ("elementwise", "headwise")
NORMS = ("layernorm", "rmsnorm")
LAYER_KINDS = ("full", "sliding")
#: gpt-oss clamps its learned sink logits to this range in the forward pass (the learned-sinks note, SPEC.md).
SINK_LOGIT_RANGE = (-10.0, 15.0)

#: Model shapes by tier (Wang 2026 Table 4; "tiny" is the CPU tier of research/tiny-tier-cpu.md).
#: The vocabulary comes from the tokenizer, not the tier.
TIERS: dict[str, dict] = {
    # The trigger task's shape (SPEC.md "Trigger-conditional task"): 2 layers x 4 heads x 128,
    # context 64; the default tier of ``--task trigger``.
    "micro": dict(n_layer=2, n_head=4, n_embd=128, block_size=64),
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "10M": dict(n_layer=6, n_head=6, n_embd=384, block_size=512),
    "50M": dict(n_layer=10, n_head=10, n_embd=640, block_size=1024),
    "124M": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "350M": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
}


@dataclass
class GPTConfig:
    """Everything that fixes the model's architecture (a checkpoint stores this, as a dict)."""

    # GPT-2 BPE, the tokenizer of Wang 2026's tiers (the CPU tier trains its own 4096-entry BPE).
    vocab_size: int = 50257
    # Context length; this and the three shape fields below are the 10M tier (Wang 2026 Table 4),
    # the smallest published one, so a bare GPTConfig() is a model the paper trained.
    block_size: int = 512
    n_layer: int = 6
    n_head: int = 6
    # Residual width C; head dim D = C / H = 64 at every published tier.
    n_embd: int = 384
    # One of VARIANTS; the plain decoder by default so nothing else is trained silently.
    variant: str = "baseline"
    # outgate only. Qiu et al. 2025: the elementwise, head-specific G1 gate is the one that won; the
    # headwise gate (one scalar per head) costs C*H instead of C*C and recovers most of it.
    outgate_mode: str = "elementwise"
    # Norm-gate sharpness beta; 8 in every experiment of Wang 2026 (and SPEC.md).
    norm_gate_beta: float = 8.0
    # Initial norm-gate threshold tau_h. At 0 every gate starts >= 0.5, and at init
    # ||v_j||/sqrt(D) ~ 0.02 sqrt(C) (LayerNorm'd input times N(0, 0.02) weights), so the gate
    # starts mostly open: ~0.86 at C=128, ~0.96 at C=384, ~0.99 at C=768.
    norm_gate_tau_init: float = 0.0
    # Initial projection-gate bias c_h: sigmoid(2) = 0.88, so the gate starts mostly open
    # (w_h starts tiny, N(0, 0.02)); 0 would start every read at a uniform 0.5.
    proj_gate_bias_init: float = 2.0
    # Force-sink masking (the P0-sink study): k residual channels reserved for position 0. 0 = off;
    # the P0-sink study (and SPEC.md) use k = 16 when it is on (32 in their data-saturated runs).
    force_sink_k: int = 0
    # Pre-norm kind: GPT-2's LayerNorm (SPEC.md; Wang 2026) or RMSNorm (the P0-sink study's models). Both
    # without bias; RMSNorm eps 1e-5 like the LayerNorm.
    norm: str = "layernorm"
    # Per-layer attention kinds, comma-separated and repeated over the layers (the learned-sinks note):
    # "full" everywhere by default; "sliding,full" alternates starting with a sliding layer 0.
    layer_pattern: str = "full"
    # Sliding window W of the sliding layers: query i sees keys i-W+1..i. gpt-oss uses 128.
    window: int = 128

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; known variants are: {', '.join(VARIANTS)}")
        if self.outgate_mode not in OUTGATE_MODES:
            raise ValueError(f"outgate_mode must be one of {', '.join(OUTGATE_MODES)}, not {self.outgate_mode!r}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, not {getattr(self, name)!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0 <= self.force_sink_k < self.n_embd:
            raise ValueError(f"force_sink_k must be in [0, n_embd), not {self.force_sink_k}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, not {self.norm!r}")
        kinds = [k.strip() for k in str(self.layer_pattern).split(",")]
        if not all(k in LAYER_KINDS for k in kinds):
            raise ValueError(
                f"layer_pattern must be comma-separated {' / '.join(LAYER_KINDS)} (e.g. 'sliding,full'), "
                f"not {self.layer_pattern!r}"
            )
        if self.window < 1:
            raise ValueError(f"window must be a positive integer, not {self.window!r}")

    @classmethod
    def from_tier(cls, tier: str, **overrides) -> "GPTConfig":
        """The config of a named tier (``TIERS``), with any field overridden."""
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; known tiers are: {', '.join(TIERS)}")
        return cls(**{**TIERS[tier], **overrides})

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def variant_spec(self) -> Variant:
        """The :class:`Variant` named by ``variant``."""
        return VARIANTS[self.variant]

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (``layer_pattern`` repeated over the layers), None if full."""
        kinds = [k.strip() for k in self.layer_pattern.split(",")]
        return self.window if kinds[layer % len(kinds)] == "sliding" else None
