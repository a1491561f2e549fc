"""What ``sinkscope train`` takes: its options, the tiers' training defaults, and their resolution.

Per-tier defaults (``TIER_TRAINING``) are Wang 2026's Table 4 for the published tiers. The
``tiny`` tier is research/tiny-tier-cpu.md's CPU tier: 4 layers x 4 heads x 128, context 128,
BPE-4096, batch 32, 600 steps (2.5M tokens), peak lr 2e-3 -> 2e-4, warmup 30 (its "S" run, whose
val loss 4.57 and phantom-mass curves are recorded there; a 1.3M-parameter model wants a larger
rate than GPT-2's 6e-4), about three minutes on two CPU cores. The ``micro`` tier is the trigger
task's (SPEC.md "Trigger-conditional task"): 2 layers x 4 heads x 128, context 64, batch 64,
1,000 steps (4.1M tokens; at 400 steps the baseline's sink is still forming), peak lr 2e-3 ->
2e-4, warmup 50; the default tier of ``--task trigger`` (``tiny`` for ``--task text``).

:func:`resolve_options` fills every option left at ``None`` from the tier and checks them all
before any file is touched; :func:`merge_resume` gives a resumed run the checkpoint's options
(``RESULT_FIELDS``) with the caller's run fields (``RUN_FIELDS``); :func:`apply_overrides` is
``--set key=value`` on the model's ``GPTConfig``. The model, the tasks and the data (all of them
torch) are imported on first use, so this module imports without torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from sinkscope.errors import SinkscopeError, option, suggest

#: Default tier of each task.
TASK_TIERS = {"text": "tiny", "trigger": "micro"}

#: Per-tier training defaults. Published tiers: Wang 2026 Table 4 (batch = sequences per
#: optimizer step = micro-batch x accumulation), peak lr 6e-4 -> 6e-5. ``warmup_steps`` scales
#: with ``steps`` when those are changed (same warmup fraction).
TIER_TRAINING: dict[str, dict] = {
    "micro": dict(steps=1000, batch_size=64, grad_accum=1, lr=2e-3, min_lr=2e-4, warmup_steps=50,
                  eval_every=100, checkpoint_every=200),
    "tiny": dict(steps=600, batch_size=32, grad_accum=1, lr=2e-3, min_lr=2e-4, warmup_steps=30,
                 eval_every=50, checkpoint_every=200),
    "10M": dict(steps=6000, batch_size=64, grad_accum=1, lr=6e-4, min_lr=6e-5, warmup_steps=200,
                eval_every=250, checkpoint_every=1000),
    "50M": dict(steps=29000, batch_size=32, grad_accum=2, lr=6e-4, min_lr=6e-5, warmup_steps=500,
                eval_every=500, checkpoint_every=1000),
    "124M": dict(steps=48800, batch_size=32, grad_accum=4, lr=6e-4, min_lr=6e-5, warmup_steps=800,
                 eval_every=500, checkpoint_every=1000),
    "350M": dict(steps=177000, batch_size=32, grad_accum=4, lr=6e-4, min_lr=6e-5, warmup_steps=2000,
                 eval_every=500, checkpoint_every=1000),
}


@dataclass
class TrainOptions:
    """Everything ``sinkscope train`` takes.

    ``None`` means "not given": the default named in the comment, or the tier's default
    (``TIER_TRAINING``). It also lets ``resume`` tell an explicit value from an absent one.
    """

    variant: str | None = None  # one of model.VARIANTS; None = baseline
    task: str | None = None  # text | trigger (tasks.TASKS); None = text
    tier: str | None = None  # one of model.TIERS (model shape and training defaults); None = the task's (TASK_TIERS)
    seed: int | None = None  # initialisation and batch order, shared across variants; None = 0
    out: str = "ckpt"  # the checkpoint folder (config.json, model.safetensors, log.csv, ...)
    steps: int | None = None  # optimizer steps; also the length of the cosine schedule
    batch_size: int | None = None  # sequences per optimizer step, over all processes
    grad_accum: int | None = None  # micro-batches per step (per process); batches do not change
    lr: float | None = None  # peak learning rate
    min_lr: float | None = None  # the cosine's floor, reached at the last step
    warmup_steps: int | None = None  # linear warmup steps
    weight_decay: float = 0.1  # on tensors of dim >= 2 only (SPEC.md)
    grad_clip: float = 1.0  # global gradient norm; 0 = off
    eval_every: int | None = None  # validation loss every N steps (and at step 0 and the end)
    eval_windows: int = 64  # fixed validation windows of block_size tokens (Wang 2026: 64)
    checkpoint_every: int | None = None  # checkpoint every N steps (and at the end)
    log_every: int | None = None  # a log.csv row every N steps (default 10)
    val_tokens: int | None = None  # validation split size; None = 5% (at least 4 windows)
    text_file: str | None = None  # train on this UTF-8 file instead of the bundled corpus
    dataset: str | None = None  # or on NAME[:CONFIG][:SPLIT] through `datasets`
    tokenizer: str | None = None  # bpe4096 (default; trained on the corpus), bpe<N>, gpt2, or a folder
    trust_remote_code: bool = False  # let code in a --tokenizer folder run (never a checkpoint's own tokenizer)
    windows: str | None = None  # text task: doc-start (default; BOS at a passage start) | random
    task_options: list[str] = field(default_factory=list)  # synthetic tasks: `--task-set key=value`
    tnlm: bool = False  # the P0-sink study's TNLM loss: no cross-entropy term at position 0
    lb_lambda: float = 0.0  # Fu et al. 2026's load-balancing loss weight (1e-4 in the paper)
    force_sink_k: int | None = None  # the P0-sink study's force-sink masking, k channels (16 in the paper)
    device: str = "auto"  # auto (CUDA when available), cpu, cuda, cuda:N
    resume: bool = False  # continue the checkpoint in `out`
    overwrite: bool = False  # replace the checkpoint in `out`
    overrides: list[str] = field(default_factory=list)  # `--set key=value` on GPTConfig fields
    stop_at: int | None = None  # stop after this step (checkpointed) as if interrupted; resume later
    monitor_every: int | None = None  # sink probes every N steps on fixed validation windows (monitor.csv); None/0 = off
    progress: bool = True  # a tqdm bar on stderr

    def __post_init__(self):
        from sinkscope.errors import check_field_values
        from sinkscope.store.files import expand_paths

        check_field_values(self)  # every number of its type and finite, whoever made the options
        expand_paths(self, out="--out", text_file="--text-file", tokenizer="--tokenizer")


#: Options that change the trained weights: a resumed run keeps the checkpoint's values.
RESULT_FIELDS = ("variant", "task", "windows", "task_options", "tier", "seed", "batch_size", "grad_accum", "lr", "min_lr", "warmup_steps",
                 "weight_decay", "grad_clip", "val_tokens", "text_file", "dataset", "tokenizer", "tnlm",
                 "lb_lambda", "force_sink_k", "overrides")
#: Options a resumed run may change (None = the checkpoint's value).
RUN_FIELDS = ("steps", "eval_every", "checkpoint_every", "log_every", "eval_windows", "monitor_every")
#: Options not recorded in the checkpoint.
NOT_RECORDED = ("out", "resume", "overwrite", "progress", "device", "stop_at", "trust_remote_code")


# ---- resolving and merging -------------------------------------------------------------------


def resolve_options(options: TrainOptions) -> TrainOptions:
    """A copy with every ``None`` filled from the tier's defaults, validated."""
    from sinkscope.train.data import DEFAULT_TOKENIZER, WINDOW_POLICIES
    from sinkscope.models.trainer_config import TIERS, VARIANTS
    from sinkscope.train.tasks import TASKS, parse_task_options

    task = "text" if options.task is None else options.task
    if task not in TASKS:
        raise SinkscopeError(f"unknown --task {task!r}{suggest(str(task), TASKS)}; tasks: {', '.join(TASKS)}.")
    if task != "text":
        given = [flag for flag, value in (("--text-file", options.text_file), ("--dataset", options.dataset),
                                          ("--tokenizer", options.tokenizer), ("--windows", options.windows),
                                          ("--val-tokens", options.val_tokens)) if value is not None]
        if given:
            raise SinkscopeError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --task text; the "
                                 f"{task} task makes its own data (set its options with --task-set).")
    elif options.windows is not None and options.windows not in WINDOW_POLICIES:
        raise SinkscopeError(f"unknown --windows {options.windows!r}; use {' or '.join(WINDOW_POLICIES)}.")
    parse_task_options(task, options.task_options)  # unknown keys and bad values fail here, before any data
    options = dataclasses.replace(
        options,
        variant="baseline" if options.variant is None else options.variant,
        task=task,
        tier=TASK_TIERS[task] if options.tier is None else options.tier,
        seed=0 if options.seed is None else options.seed,
        tokenizer=(options.tokenizer or DEFAULT_TOKENIZER) if task == "text" else None,
        windows=(options.windows or "doc-start") if task == "text" else None,
        task_options=list(options.task_options or []),
    )
    if not isinstance(options.seed, int) or isinstance(options.seed, bool) or options.seed < 0:
        raise SinkscopeError(f"seed must be a non-negative integer, not {options.seed!r}.")
    if options.tier not in TIERS or options.tier not in TIER_TRAINING:
        raise SinkscopeError(f"unknown tier {options.tier!r}{suggest(options.tier, TIERS)}; tiers: {', '.join(TIERS)}.")
    if options.variant not in VARIANTS:
        raise SinkscopeError(
            f"unknown variant {options.variant!r}{suggest(options.variant, VARIANTS)}; variants: {', '.join(VARIANTS)}."
        )
    tier = TIER_TRAINING[options.tier]
    out = dataclasses.replace(options, overrides=list(options.overrides))
    for name in ("steps", "batch_size", "grad_accum", "lr", "eval_every", "checkpoint_every"):
        if getattr(out, name) is None:
            setattr(out, name, tier[name])
    if out.min_lr is None:
        out.min_lr = tier["min_lr"] * out.lr / tier["lr"]  # the tier's floor-to-peak ratio (1/10)
    if out.warmup_steps is None:
        out.warmup_steps = round(tier["warmup_steps"] * out.steps / tier["steps"])
    if out.log_every is None:
        out.log_every = 10
    for name in ("steps", "batch_size", "grad_accum", "eval_every", "checkpoint_every", "log_every", "eval_windows"):
        value = getattr(out, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SinkscopeError(f"{name} must be a positive integer, not {value!r}.")
    if out.monitor_every is not None and (not isinstance(out.monitor_every, int) or isinstance(out.monitor_every, bool)
                                          or out.monitor_every < 0):
        raise SinkscopeError(f"monitor_every must be 0 (off) or a positive integer, not {out.monitor_every!r}.")
    if not 0 <= out.warmup_steps < out.steps:
        raise SinkscopeError(f"warmup_steps must be in [0, steps={out.steps}), not {out.warmup_steps}.")
    for name in ("lr", "min_lr", "weight_decay", "grad_clip", "lb_lambda"):
        value = getattr(out, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise SinkscopeError(f"{name} must be a finite number, not {value!r}.")
    if not (out.lr > 0 and 0 <= out.min_lr <= out.lr):
        raise SinkscopeError(f"need lr > 0 and 0 <= min_lr <= lr (got lr={out.lr}, min_lr={out.min_lr}).")
    if out.weight_decay < 0 or out.grad_clip < 0 or out.lb_lambda < 0:
        raise SinkscopeError("weight_decay, grad_clip and lb_lambda must not be negative.")
    if out.batch_size % out.grad_accum:
        raise SinkscopeError(f"batch_size ({out.batch_size}) must be a multiple of grad_accum ({out.grad_accum}).")
    if out.stop_at is not None and not 1 <= out.stop_at <= out.steps:
        raise SinkscopeError(f"stop_at must be between 1 and steps ({out.steps}), not {out.stop_at}.")
    return out


def apply_overrides(config, overrides):
    """``config`` with ``key=value`` overrides (``--set``) applied (``tasks.parse_fields``: Python literals).

    Unknown keys, values of the wrong type, and invalid combinations raise a one-sentence
    :class:`SinkscopeError` that lists the valid keys.
    """
    from sinkscope.train.tasks import parse_fields

    changes = parse_fields(config, overrides, "--set")
    try:
        return dataclasses.replace(config, **changes)
    except (ValueError, TypeError) as error:
        raise SinkscopeError(f"invalid model settings: {error}.") from error


def merge_resume(caller: TrainOptions, stored: dict, out: Path) -> TrainOptions:
    """The checkpoint's options, with the caller's run fields; conflicting result fields fail."""
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    if "task" not in stored:  # a checkpoint from before tasks: text with random windows
        stored = {**stored, "task": "text", "windows": "random"}
    saved = TrainOptions(**{k: v for k, v in stored.items() if k in names})
    defaults = TrainOptions()
    for name in RESULT_FIELDS:
        mine, theirs = getattr(caller, name), getattr(saved, name)
        if mine != getattr(defaults, name) and mine != theirs:
            raise SinkscopeError(
                f"{option('resume', True)} continues the run in {out} with its own settings, but {name}={mine!r} was asked "
                f"for and the checkpoint has {name}={theirs!r}; drop the option or start a new run."
            )
    merged = dataclasses.replace(saved, out=caller.out, resume=True, overwrite=False, progress=caller.progress,
                                 device=caller.device, stop_at=caller.stop_at, trust_remote_code=False)
    for name in RUN_FIELDS:
        mine = getattr(caller, name)
        if mine is not None and mine != getattr(defaults, name):
            setattr(merged, name, mine)
    return merged
