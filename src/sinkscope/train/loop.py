"""The training loop of the bundled trainer (``sinkscope train``).

Optimiser and schedule (SPEC.md "Trainer variants"; Wang 2026 Appendix A): AdamW with betas
(0.9, 0.95), weight decay on tensors of dim >= 2 only (``GPT.param_groups``), linear warmup to
the peak learning rate, cosine decay to ``min_lr`` reached at the final iteration, gradient
clipping to a global norm of 1, bf16 autocast on CUDA (the model keeps its gate maths in fp32),
fp32 on CPU.

Options (``config.py``): ``TrainOptions``, the tiers' training defaults (``TIER_TRAINING``,
``TASK_TIERS``) and ``resolve_options``, which fills and checks them before any file is touched;
the names are importable from here too.

Data (``tasks.py``): ``--task text`` (the corpus; ``--windows doc-start``, the default, puts BOS
at a passage start, ``random`` keeps the old random offsets) or ``--task trigger`` (generated;
options by ``--task-set key=value``). The task is built once and the loop only asks it for
batches and validation windows.

Validation (SPEC.md "Training data (resolved)"; the P0-sink study, Table 1(b)): ``val_loss`` is the mean
next-token cross-entropy over positions i >= 1 of the fixed validation windows, for every
variant, so TNLM (trained without position 0) is compared on equal terms; ``val_loss_all``
includes position 0. Both are in log.csv and config.json.

Reproducibility: the seed sets the initialisation (``torch.manual_seed(seed)`` right before the
model is built) and, through a separate generator, the batch order (``data.TrainBatches``), so
variants with one seed are paired. A checkpoint carries the optimiser, the batch generator and
the RNG states, so ``resume`` continues to the bitwise-identical result on CPU as long as
``steps`` (which shapes the cosine schedule) is unchanged.

The output folder (``out``): one training at a time holds ``.NAME.lock`` beside it (rank 0, from
before any check of the folder to the end). It is written only while it holds nothing but what
sinkscope wrote (its ``.sinkscope-files``, or a checkpoint's fixed names from before
inventories), with or without ``overwrite``; ``overwrite`` trains into a hidden sibling
``.NAME.replacing-PID`` that gives its log to the first checkpoint, which replaces the old folder
in one swap: until then the old checkpoint stays whole, and a failed or interrupted replacement
leaves it exactly as it was. A save killed between its two renames leaves no ``out`` and the
previous checkpoint beside it (``.NAME.old-PID``): ``resume`` puts it back and says so, and a new
run without ``overwrite`` is refused rather than removing it. A checkpoint that cannot be written (a full disk) is one sentence
naming the step and the checkpoint that stays valid. ``resume`` with another ``steps`` warns on
stderr and records ``rescheduled`` (``at_step``, ``steps_before``, ``steps_after``) in config.json.

Several processes (``torchrun --nproc-per-node N``; ``WORLD_SIZE > 1``): DDP over gloo on CPU
or NCCL on CUDA. Every process draws the same global batch and trains on its contiguous share of
rows, so the batches and the result are those of one process, up to the order of float
reductions. Only rank 0 evaluates, logs and writes.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from sinkscope.errors import SinkscopeError, option, phrase, whole_number
from sinkscope.store.files import (atomic_write_text, check_inputs_outside, check_not_cwd, check_replaceable,
                              describe_entries, is_temporary_name, lock_folder, write_inventory)
from sinkscope.models.checkpoint_folder import (WRITER, checkpoint_legacy, clean_leftovers, foreign_files, interrupted_save,
                                                is_checkpoint, read_config, restore_interrupted_save)
from sinkscope.train.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from sinkscope.train.config import NOT_RECORDED, TrainOptions, apply_overrides, merge_resume, resolve_options
from sinkscope.train.data import load_tokenizer

#: Columns of log.csv (one row every ``log_every`` steps, at every evaluation and checkpoint).
#: ``val_loss`` excludes position 0 (the fair comparison); ``val_loss_all`` includes it. The
#: head load imbalance follows (``log_columns``).
LOG_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "val_loss_all", "lr", "tokens_per_s", "elapsed_s")
#: The model's head load imbalance at each evaluation (Fu et al. 2026 Fig. 5): the mean over layers of
#: the per-layer CV of head importance, then one column per layer (``load_imbalance_l{l}``).
IMBALANCE_COLUMN = "load_imbalance"


#: validation windows the monitor measures (``--monitor-every``): the first of the fixed evaluation windows.
MONITOR_WINDOWS = 8


def log_columns(n_layer: int) -> tuple[str, ...]:
    """The columns of a model's log.csv: ``LOG_COLUMNS``, the imbalance, then its value per layer."""
    return LOG_COLUMNS + (IMBALANCE_COLUMN, *(f"{IMBALANCE_COLUMN}_l{layer}" for layer in range(n_layer)))


def lr_at(it: int, *, lr: float, min_lr: float, warmup_steps: int, steps: int) -> float:
    """Learning rate of iteration ``it`` (0-based): linear warmup, then cosine to ``min_lr`` at ``steps - 1``."""
    if it < warmup_steps:
        return lr * (it + 1) / warmup_steps
    ratio = min(1.0, (it - warmup_steps) / max(1, steps - 1 - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# ---- processes and devices ----------------------------------------------------------------------


@dataclass
class _Dist:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _resolve_device(name: str, local_rank: int) -> torch.device:
    """The device of this process: ``auto``/``cuda`` become ``cuda:LOCAL_RANK`` when GPUs exist."""
    from sinkscope.models.devices import resolve_device

    if name in ("auto", "cuda") and torch.cuda.is_available():
        name = f"cuda:{local_rank}"
    return resolve_device(name)


def _init_dist(device_name: str) -> _Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not dist.is_initialized():
        cuda = _resolve_device(device_name, local_rank).type == "cuda"
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        owns = True
    return _Dist(dist.get_world_size(), dist.get_rank(), local_rank, owns)


def _main_first(env: _Dist, fn):
    """Run ``fn`` on rank 0 first (it fills the caches), then on the other ranks."""
    if not env.enabled:
        return fn()
    if env.is_main:
        try:
            return fn()
        finally:
            env.barrier()
    env.barrier()
    return fn()


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):
            torch.cuda.set_rng_state_all(state["cuda"])


# ---- log.csv --------------------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def read_log(folder: str | os.PathLike) -> list[dict]:
    """The rows of ``folder/log.csv`` as dicts of strings (complete rows only).

    Every column of ``LOG_COLUMNS`` is there (those an older log lacks, ``val_loss_all``, read
    as empty strings), followed by the log's other columns (the load imbalance).
    """
    path = Path(folder) / "log.csv"
    if not path.is_file():
        return []
    reader = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))
    rows = list(reader)
    header = reader.fieldnames or []
    complete = [r for r in rows if all(r.get(c) is not None for c in header) and whole_number(r.get("step") or "") is not None]
    columns = list(LOG_COLUMNS) + [c for c in header if c not in LOG_COLUMNS]
    return [{c: r.get(c) or "" for c in columns} for r in complete]


def _write_log(folder: Path, rows: list[dict], columns: tuple[str, ...]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: r.get(c, "") for c in columns} for r in rows)
    atomic_write_text(folder / "log.csv", buffer.getvalue())


def _append_log(folder: Path, row: dict, columns: tuple[str, ...]) -> None:
    """One complete line in one write (O_APPEND), flushed to disk."""
    line = ",".join(str(row.get(c, "")) for c in columns) + "\n"
    fd = os.open(folder / "log.csv", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the loop ---------------------------------------------------------------------------------------


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out that training may not fill: one holding files sinkscope did not write (with or
    without --overwrite; ``checkpoint.foreign_files``), or any existing one without --overwrite.

    A checkpoint written before inventories, or a folder holding only its log.csv (a run stopped
    before its first checkpoint), is recognised by its fixed file names (``checkpoint_legacy``). An
    absent --out beside the checkpoint a save killed between its renames left
    (``checkpoint.interrupted_save``) is refused without --overwrite too: the first save would remove it.
    """
    _check_not_cwd(out)
    leftover = None if overwrite else interrupted_save(out)
    if leftover is not None:
        raise SinkscopeError(f"there is no {out}, but {leftover} next to it is the checkpoint saved before a save was "
                             f"interrupted; pass {option('resume', True)} to continue it (it is put back first), {option('overwrite', True)} to start a "
                             f"new run in its place, or choose another {option('out')}.")
    if out.is_dir() and not out.is_symlink():
        subfolders = [f for f in foreign_files(out) if f.endswith("/")]
        if subfolders:  # check_replaceable counts another writer's folder as sinkscope's; a checkpoint has none
            raise SinkscopeError(f"the folder {out} holds folders that are not part of a checkpoint "
                                 f"({describe_entries(subfolders)}), and writing a checkpoint replaces the folder whole; "
                                 f"sinkscope never deletes them, with or without {option('overwrite', True)}: move them out, or choose "
                                 f"another {option('out')}.")
    hint = "pass --resume to continue it, --overwrite to replace it" if is_checkpoint(out) else "pass --overwrite"
    check_replaceable(out, overwrite, kind="trainer checkpoint", hint=hint, legacy=checkpoint_legacy(out)
                      if out.is_dir() else None)


def _check_not_cwd(out: Path) -> None:
    """Checkpoints replace their folder whole: never the current folder or one above it."""
    check_not_cwd(out, "a checkpoint needs", "ckpt/NAME")


def _on_main(env: "_Dist", fn) -> None:
    """Run ``fn`` on rank 0 only; a SinkscopeError it raises is raised on every rank (the same sentence)."""
    failure: SinkscopeError | None = None
    if env.is_main:
        try:
            fn()
        except SinkscopeError as error:
            failure = error
    if env.enabled:
        box = [None if failure is None else str(failure)]
        torch.distributed.broadcast_object_list(box, src=0)
        if box[0] is not None and failure is None:
            failure = SinkscopeError(box[0])
    if failure is not None:
        raise failure


class Evaluation(NamedTuple):
    """What one evaluation on the fixed validation windows measures."""

    val_loss: float  # mean next-token cross-entropy at positions i >= 1
    val_loss_all: float  # ... at every position
    importance: torch.Tensor  # (L, H) float64 on the CPU: Imp^{l,h} over the validation windows


@torch.no_grad()
def evaluate(model, inputs: torch.Tensor, targets: torch.Tensor, *, chunk: int, device: torch.device,
             autocast) -> Evaluation:
    """Validation losses and head importance over the fixed validation windows (module docstring).

    The losses are means over tokens, so windows of one length weigh equally; the model's own
    loss terms (load balancing) are not part of them. ``importance`` is Imp^{l,h} (Fu et al. 2026;
    ``sinkscope.stats.gates``) from the same forward passes, the mean over the chunks weighted by their
    windows (every window adds the same number of queries), so it is the mean over all windows.
    """
    import torch.nn.functional as F

    after0, total, n_after0, n_total = 0.0, 0.0, 0, 0
    importance, windows = None, 0
    for start in range(0, inputs.shape[0], chunk):
        x = inputs[start:start + chunk].to(device)  # (b, T)
        y = targets[start:start + chunk].to(device)  # (b, T)
        with autocast():
            logits, _ = model(x, importance=True)  # (b, T, V)
        ce = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # (b, T)
        after0 += float(ce[:, 1:].sum())
        total += float(ce.sum())
        n_after0 += ce[:, 1:].numel()
        n_total += ce.numel()
        part = model.last_importance.to("cpu", torch.float64) * x.shape[0]  # (L, H): chunk mean x windows
        importance = part if importance is None else importance + part
        windows += x.shape[0]
    return Evaluation(after0 / max(n_after0, 1), total / n_total, importance / max(windows, 1))


def imbalance_columns(importance: torch.Tensor) -> dict[str, str]:
    """log.csv's imbalance cells from Imp (L, H): the mean over layers of CV, and each layer's CV."""
    from sinkscope.stats.gates import load_imbalance

    cv = load_imbalance(importance)  # (L,)
    cells = {IMBALANCE_COLUMN: _fmt(float(cv.mean()), ".6f")}
    cells.update({f"{IMBALANCE_COLUMN}_l{layer}": _fmt(float(value), ".6f") for layer, value in enumerate(cv)})
    return cells


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during :func:`train`; ``advice`` says what ``--out`` keeps and the command that
    continues from there (a KeyboardInterrupt still, for callers that catch one)."""

    def __init__(self, advice: str):
        super().__init__(advice)
        self.advice = advice


@dataclass
class _Kept:
    """What ``--out`` holds as a training goes, for the sentence of an interruption (:meth:`advice`)."""

    out: Path
    resume: bool
    started: bool = False  # --out (or the replacement's sibling) was written to
    replacing: bool = False  # --overwrite of a folder that holds something: it is unchanged until the first checkpoint
    checkpoint: int | None = None  # the step of the checkpoint --out holds for this training
    first_due: int | None = None  # the step of the first checkpoint

    def advice(self) -> str:
        if self.checkpoint is not None:
            return (f"{self.out} keeps the checkpoint of step {self.checkpoint}; continue with the same command and "
                    f"{option('resume', True)}")
        if self.resume or not self.started:
            return f"nothing in {self.out} was changed; rerun the same command"
        due = f" (the first was due at step {self.first_due})" if self.first_due is not None else ""
        if self.replacing:
            return (f"no checkpoint was written yet{due}, so {self.out} still holds what it held before; rerun the "
                    f"same command (with {option('overwrite', True)}) to start again")
        return (f"no checkpoint was written yet{due}, so {self.out} holds only this run's log; start again with "
                f"the same command and {option('overwrite', True)}")


def train(options: TrainOptions, log: Callable[[str], None] | None = None) -> Path:
    """Train (or resume) one model; returns the checkpoint folder. See the module docstring.

    Ctrl-C (or SIGTERM, which the command line turns into one) raises :class:`TrainingInterrupted`, whose
    ``advice`` names what to run next from the state ``--out`` is left in.
    """
    log = log or _stderr
    env = _init_dist(options.device)
    kept = _Kept(Path(options.out).expanduser(), bool(options.resume))
    try:
        with contextlib.ExitStack() as held:  # --out's lock (rank 0) and the replacement's sibling, to the end
            return _train(options, log, env, held, kept)
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:
        raise TrainingInterrupted(phrase(kept.advice())) from None
    finally:
        env.close()


def _warn(message: str) -> None:
    """A ``warning:`` line on stderr, whatever ``log`` is (the CLI user must see it)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _train(options: TrainOptions, log: Callable[[str], None], env: _Dist, held: contextlib.ExitStack,
           left: _Kept) -> Path:
    from sinkscope.models.trainer_config import TIERS, GPTConfig
    from sinkscope.train.model import GPT
    from sinkscope.train.tasks import make_task

    out = Path(options.out).expanduser()
    if options.resume and options.overwrite:
        raise SinkscopeError(f"{option('resume', True)} continues the checkpoint in {out} and {option('overwrite', True)} replaces it; they "
                             "contradict each other: drop one of them.")
    if not options.resume:
        opts = resolve_options(options)  # bad options fail before any file is touched
    # --out's lock first (rank 0), held to the end; then the folder's checks, under it.
    _on_main(env, lambda: (_check_not_cwd(out),  # --out's lock for the whole training: a second one fails at once
                           held.enter_context(lock_folder(out, kind="checkpoint", writer="training"))))
    device = _resolve_device(options.device, env.local_rank)
    saved_state = None
    previous_step = None  # --overwrite: the step of the checkpoint being replaced, for messages
    replacing = False  # --overwrite of a folder that holds something: train beside it, swap at the first checkpoint
    if options.resume:
        def check_resume() -> None:
            restored = restore_interrupted_save(out)  # --out absent, its previous checkpoint beside it: put back
            if restored is not None:
                log(f"restored the checkpoint{restored[1]} that an interrupted save left at {restored[0]} to {out}")
            if not is_checkpoint(out):
                if out.is_dir() and (out / "log.csv").is_file() and not foreign_files(out):
                    raise SinkscopeError(f"{out} holds only the log of a training stopped before its first checkpoint, "
                                         f"so there is nothing to resume; start again without {option('resume', True)} "
                                         f"and with {option('overwrite', True)}.")
                raise SinkscopeError(f"there is no trainer checkpoint to resume in {out}; run without {option('resume', True)} first.")
            _check_out(out, True)  # every save replaces the folder whole: nothing of anyone else's may be in it

        _on_main(env, check_resume)
        model, tokenizer, meta, saved_state = load_checkpoint(out, for_training=True)
        if env.is_main:  # killed saves' leftovers beside it (only what they recorded, never a running writer's)
            removed = clean_leftovers(out)
            if removed:
                log(f"removed what interrupted saves left beside {out}: {', '.join(p.name for p in removed)}")
        opts = resolve_options(merge_resume(options, meta.get("train_options", {}), out))
        start = int(saved_state["step"])
        if opts.steps < start:
            raise SinkscopeError(f"the checkpoint in {out} is at step {start}, past steps={opts.steps}.")
        config = model.config
    else:
        def check_new() -> None:
            _check_out(out, opts.overwrite)
            inputs = {"the text file": opts.text_file}
            if opts.tokenizer and Path(opts.tokenizer).expanduser().is_dir():
                inputs["the tokenizer folder"] = Path(opts.tokenizer).expanduser()
            check_inputs_outside(out, inputs)

        _on_main(env, check_new)
        start = 0
        replacing = opts.overwrite and out.is_dir() and any(not is_temporary_name(p.name) for p in out.iterdir())
        if replacing and is_checkpoint(out):
            with contextlib.suppress(SinkscopeError):
                previous_step = read_config(out)["step"]
    if opts.batch_size % (opts.grad_accum * env.world_size):
        raise SinkscopeError(
            f"batch_size ({opts.batch_size}) must be a multiple of grad_accum x processes "
            f"({opts.grad_accum} x {env.world_size})."
        )

    corpus = None
    if opts.task == "text":
        from sinkscope.data.corpus import load_corpus

        corpus = load_corpus(opts.text_file, opts.dataset)
    if not options.resume:
        if opts.task == "text":
            tokenizer = _main_first(env, lambda: load_tokenizer(opts.tokenizer, corpus,
                                                                trust_remote_code=opts.trust_remote_code))
            vocab = len(tokenizer)
        else:  # a synthetic task's vocabulary is one of its options; its tokenizer comes with it
            from sinkscope.train.tasks import TriggerOptions, parse_task_options

            tokenizer = None
            vocab = TriggerOptions(**parse_task_options(opts.task, opts.task_options)).vocab
        try:
            base = GPTConfig(**{**TIERS[opts.tier], "vocab_size": vocab, "variant": opts.variant,
                                **({} if opts.force_sink_k is None else {"force_sink_k": opts.force_sink_k})})
        except (TypeError, ValueError) as error:
            raise SinkscopeError(f"invalid model settings: {error}.") from error
        config = apply_overrides(base, opts.overrides)
        if config.vocab_size < vocab:
            raise SinkscopeError(f"vocab_size {config.vocab_size} is smaller than the task's {vocab} tokens.")
    task = _main_first(env, lambda: make_task(opts.task, config.block_size, corpus=corpus, tokenizer=tokenizer,
                                              windows=opts.windows, val_tokens=opts.val_tokens,
                                              task_options=opts.task_options))
    saved_data = meta.get("data", {}) if options.resume else {}
    if options.resume and task.info["fingerprint"] != saved_data.get("fingerprint", saved_data.get("stream_sha256")):
        raise SinkscopeError(
            f"the data differs from the data the checkpoint in {out} was trained on (corpus, tokenizer or task "
            "options; token stream or task hash); resume needs the same data."
        )

    if not options.resume:
        torch.manual_seed(opts.seed)  # the initialisation; shared weights are equal across variants
        model = GPT(config)
    model.to(device)
    optimizer = torch.optim.AdamW(model.param_groups(opts.weight_decay), lr=opts.lr, betas=(0.9, 0.95), eps=1e-8)
    batches = task.train_batches(opts.batch_size, opts.seed)
    val_x, val_y = task.eval_batches(opts.eval_windows)  # (n, T) each
    tokens_per_step = opts.batch_size * val_x.shape[1]
    elapsed_before = 0.0
    rescheduled = list(meta.get("rescheduled", [])) if options.resume else []
    if saved_state is not None:
        try:
            optimizer.load_state_dict(saved_state["optimizer"])
            train_state = saved_state.get("train_state", {})
            batches.load_state_dict(train_state["batches"])
            _set_rng_state(train_state.get("rng", {}))
            elapsed_before = float(train_state.get("elapsed_s", 0.0))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
            if isinstance(error, SinkscopeError):
                raise
            raise SinkscopeError(f"the checkpoint's optimizer.pt in {out} does not fit its model or its data "
                                 f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}); "
                                 "it is damaged, so it cannot be resumed.") from error
        old_steps = meta.get("train_options", {}).get("steps")
        if opts.steps != old_steps:
            rescheduled.append({"at_step": start, "steps_before": old_steps, "steps_after": opts.steps})
            if env.is_main:
                _warn(f"--steps {opts.steps} changes the checkpoint's steps={old_steps}, and the cosine schedule "
                      "with it: the result is not the run an uninterrupted training would give (config.json records "
                      "it under \"rescheduled\").")

    ddp_model = model
    if env.enabled:
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    use_bf16 = device.type == "cuda"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()

    per_rank = opts.batch_size // env.world_size
    micro = per_rank // opts.grad_accum
    recorded = {k: v for k, v in asdict(opts).items() if k not in NOT_RECORDED}

    # -- the folder and the log (rank 0) --
    last_ckpt = start if options.resume else None
    left.checkpoint, left.replacing = last_ckpt, replacing
    left.first_due = min(start + opts.checkpoint_every - start % opts.checkpoint_every, opts.stop_at or opts.steps)
    columns = log_columns(config.n_layer)
    log_dir = out  # where log.csv grows: --out, or the replacement's sibling until its first checkpoint
    if env.is_main:
        if options.resume:
            rows = [r for r in read_log(out) if int(r["step"]) <= start]
            _write_log(out, rows, columns)  # drops rows logged after the checkpoint by an interrupted run
        elif replacing:  # the old folder stays whole and loadable until the first checkpoint replaces it
            log_dir = out.parent / f".{out.name}.replacing-{os.getpid()}"
            shutil.rmtree(log_dir, ignore_errors=True)
            held.callback(shutil.rmtree, log_dir, ignore_errors=True)  # a failed or interrupted replacement
            log_dir.mkdir(parents=True)
            _write_log(log_dir, [], columns)
        else:
            out.mkdir(parents=True, exist_ok=True)
            _write_log(out, [], columns)
            write_inventory(out, WRITER)  # a run stopped before its first checkpoint leaves a folder that is ours
        n_params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
        if opts.task == "text":
            what = (f"{task.info['corpus']} ({opts.windows} windows): {task.info['train_tokens']:,} training and "
                    f"{task.info['val_tokens']:,} validation tokens, vocab {task.info['vocab_size']:,}")
        else:
            what = f"the {opts.task} task ({', '.join(f'{k} {v}' for k, v in task.info['options'].items())})"
        log(f"{'resuming' if options.resume else 'training'} {config.variant} ({opts.tier}, "
            f"{config.n_layer}L x {config.n_head}H x {config.n_embd}, ctx {config.block_size}, {n_params:,} parameters) "
            f"seed {opts.seed} on {what}; "
            f"{opts.steps} steps x {tokens_per_step:,} tokens on {device}"
            f"{f' x {env.world_size} processes' if env.enabled else ''} -> {out}")
    left.started = True  # --out, or the replacement's sibling, holds this run's log
    monitor = None
    if opts.monitor_every and env.is_main:  # sink formation: the same validation windows at every measured step
        from sinkscope.train.monitor import SinkMonitor

        monitor = SinkMonitor(every=opts.monitor_every, windows=val_x[:MONITOR_WINDOWS].cpu().numpy(), out=log_dir,
                              batch_size=max(1, micro))
        if options.resume:
            monitor.truncate(start)  # rows an interrupted run measured after its checkpoint
        elif log_dir == out:
            write_inventory(out, WRITER)  # the monitor's files are the run's
    env.barrier()

    run_start = time.perf_counter()
    val_loss: float | None = meta.get("val_loss") if options.resume else None
    val_loss_all: float | None = meta.get("val_loss_all") if options.resume else None
    val_step: int | None = meta.get("val_loss_step") if options.resume else None
    imbalance: dict[str, str] = {}  # the last evaluation's imbalance cells (log_columns)
    meta_imbalance: float | None = meta.get("load_imbalance") if options.resume else None

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - run_start

    def do_eval(step: int) -> float | None:
        nonlocal val_loss, val_loss_all, val_step, imbalance
        if not env.is_main:
            return None
        result = evaluate(model, val_x, val_y, chunk=micro, device=device, autocast=autocast)
        val_loss, val_loss_all, val_step = result.val_loss, result.val_loss_all, step
        imbalance = imbalance_columns(result.importance)
        return val_loss

    def kept() -> str:
        """What --out holds after a failed checkpoint write, for the message."""
        if last_ckpt is not None:
            return (f"the checkpoint of step {last_ckpt} in {out} is unchanged and still valid; free some space (or "
                    "fix the cause) and continue with --resume")
        if replacing and log_dir != out:
            held_before = f" (its checkpoint of step {previous_step})" if previous_step is not None else ""
            return (f"{out} is unchanged and still holds what it held before this --overwrite{held_before}; free some "
                    "space (or fix the cause) and start again")
        return "no checkpoint had been written yet; free some space (or fix the cause) and start again"

    def save(step: int) -> None:
        nonlocal last_ckpt, log_dir

        def write() -> None:
            nonlocal log_dir
            train_state = {"batches": batches.state_dict(), "rng": _rng_state(),
                           "tokens_seen": step * tokens_per_step, "elapsed_s": elapsed()}
            meta_out = {"tier": opts.tier, "task": opts.task, "seed": opts.seed, "tokens_seen": step * tokens_per_step,
                        "val_loss": val_loss, "val_loss_all": val_loss_all, "val_loss_step": val_step,
                        "load_imbalance": float(imbalance[IMBALANCE_COLUMN]) if imbalance else meta_imbalance,
                        "train_options": recorded, "data": task.info,
                        **({"rescheduled": rescheduled} if rescheduled else {})}
            try:
                save_checkpoint(out, model, optimizer, step, train_state, task.tokenizer, meta_out,
                                extra_files=task.extra_files(), carry_from=log_dir)
            except CheckpointWriteError as error:
                raise SinkscopeError(f"could not write the checkpoint of step {step} into {out} ({error.reason}); "
                                     f"{kept()}.") from error
            if log_dir != out:  # the replacement is in place: its log now grows there
                shutil.rmtree(log_dir, ignore_errors=True)
                log_dir = out

        _on_main(env, write)
        last_ckpt = left.checkpoint = step

    if not options.resume and monitor is not None:
        monitor.step(model, 0)
    if not options.resume and env.is_main:
        v = do_eval(0)
        _append_log(log_dir, {"step": 0, "tokens": 0, "train_loss": "", "val_loss": _fmt(v, ".6f"),
                          "val_loss_all": _fmt(val_loss_all, ".6f"), "lr": "",
                          "tokens_per_s": "", "elapsed_s": _fmt(elapsed(), ".2f"), **imbalance}, columns)

    from sinkscope.runtime.progress import progress_bar as tqdm

    stop = opts.stop_at or opts.steps
    bar = tqdm(total=opts.steps, initial=start, unit="step", file=sys.stderr, dynamic_ncols=True,
               disable=not (opts.progress and env.is_main))
    window_loss, window_steps, window_time = 0.0, 0, 0.0
    tokens_per_s = None
    try:
        for it in range(start, stop):
            step = it + 1
            t0 = time.perf_counter()
            lr = lr_at(it, lr=opts.lr, min_lr=opts.min_lr, warmup_steps=opts.warmup_steps, steps=opts.steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.next(env.rank, env.world_size)  # (B / world, T) each
            step_loss = torch.zeros((), device=device)
            for m in range(opts.grad_accum):
                xb = x[m * micro:(m + 1) * micro].to(device, non_blocking=True)  # (micro, T)
                yb = y[m * micro:(m + 1) * micro].to(device, non_blocking=True)  # (micro, T)
                sync = not env.enabled or m == opts.grad_accum - 1
                with (contextlib.nullcontext() if sync else ddp_model.no_sync()):
                    with autocast():
                        _, loss = ddp_model(xb, yb, tnlm=opts.tnlm, lb_lambda=opts.lb_lambda)
                    (loss / opts.grad_accum).backward()
                step_loss += loss.detach().float() / opts.grad_accum
            if env.enabled:
                torch.distributed.all_reduce(step_loss)
                step_loss /= env.world_size
            loss_value = float(step_loss)
            if not math.isfinite(loss_value):
                where = (f"the last good checkpoint at step {last_ckpt} is in {out}" if last_ckpt is not None
                         else f"no checkpoint had been written yet (the first was due at step "
                              f"{min(opts.checkpoint_every, opts.steps)})")
                raise SinkscopeError(f"training diverged at step {step} (loss {loss_value}); {where}; "
                                     "try a lower --lr or more --warmup-steps.")
            if opts.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            window_loss, window_steps, window_time = window_loss + loss_value, window_steps + 1, window_time + dt
            bar.update(1)
            bar.set_postfix_str(f"step loss {loss_value:.3f}, {tokens_per_step / max(dt, 1e-9):,.0f} tok/s", refresh=False)

            is_eval = step % opts.eval_every == 0 or step == opts.steps
            is_ckpt = step % opts.checkpoint_every == 0 or step == opts.steps or step == stop
            if is_eval:
                do_eval(step)
            if monitor is not None:
                monitor.step(model, step)  # rank 0: the module itself, not the DDP wrapper
            if env.is_main and (is_eval or is_ckpt or step % opts.log_every == 0):
                tokens_per_s = window_steps * tokens_per_step / max(window_time, 1e-9)
                train_loss, train_steps = window_loss / window_steps, window_steps  # what log.csv records
                _append_log(log_dir, {"step": step, "tokens": step * tokens_per_step,
                                  "train_loss": _fmt(train_loss, ".6f"),
                                  "val_loss": _fmt(val_loss if is_eval else None, ".6f"),
                                  "val_loss_all": _fmt(val_loss_all if is_eval else None, ".6f"), "lr": _fmt(lr, ".6g"),
                                  "tokens_per_s": _fmt(tokens_per_s, ".1f"), "elapsed_s": _fmt(elapsed(), ".2f"),
                                  **(imbalance if is_eval else {})}, columns)
                window_loss, window_steps, window_time = 0.0, 0, 0.0
                if is_eval:
                    line = (f"step {step}: train {train_loss:.4f} (mean of the last {train_steps} steps, as in "
                            f"log.csv), val {val_loss:.4f}, head load imbalance {imbalance[IMBALANCE_COLUMN]}, "
                            f"{tokens_per_s:,.0f} tok/s")
                    bar.write(line, file=sys.stderr) if not bar.disable else log(line)
            if is_ckpt:
                save(step)
                if monitor is not None:
                    monitor.out = log_dir  # the replacement's sibling became --out at its first checkpoint
                if env.is_main and step != stop:  # one line per phase, bar or not (the last: the end's line)
                    line = f"step {step}: checkpoint written to {out} (--resume continues from it)"
                    bar.write(line, file=sys.stderr) if not bar.disable else log(line)
                env.barrier()
    finally:
        bar.close()
    if env.is_main:
        if options.resume and stop > start and rescheduled and rescheduled[-1]["at_step"] == start:
            _warn(f"this run was rescheduled at step {start} from steps={rescheduled[-1]['steps_before']} to "
                  f"steps={opts.steps}; it is not an uninterrupted run (config.json: \"rescheduled\").")
        done = "stopped" if stop < opts.steps else "finished"
        log(f"{done} at step {stop} in {elapsed():.0f} s; val loss {val_loss if val_loss is None else round(val_loss, 4)}"
            f" (step {val_step}); checkpoint in {out}")
    return out
