"""The only forward loop: windows in, probe accumulators filled.

A transformers model runs under :func:`sinkscope.capture.capture`, which installs the hook
points the probes ask for; the bundled trainer's model emits the same points natively
(``model(ids, hooks=...)``, no hooks installed). Either way each point's value goes to every
probe that reads it the moment it exists, and nothing per-token outlives its layer. The LM
head's logits are computed only where a probe reads ``loss``; otherwise, where the model
supports it, only the last position's.

Per batch, the loop runs one forward pass per *pass label* the probes ask for (None, the clean
pass, unless a probe asks for others, e.g. one pass per injection condition); a probe sees only
the passes it lists, and its interventions act only in those. Nothing moves to the host inside
the layer loop: the non-finite check is accumulated on the device and read once per batch. The
progress bar counts windows, or passes where a batch runs several (``inject``'s 25), so it moves
within a batch.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sinkscope.runtime import heap
from sinkscope.capture.attention import capture
from sinkscope.capture import hooks as hp
from sinkscope.capture.discover import input_device
from sinkscope.runtime.memory import free_memory
from sinkscope.errors import SinkscopeError, option
from sinkscope.probes.base import Probe
from sinkscope.runtime.progress import progress_bar


@dataclass
class Dispatcher:
    """Routes hook points to the probes that read them, for one pass (the capture's sink)."""

    probes: list[Probe]
    #: the pass (None: the clean pass); each probe observes what it reads on it (``Probe.pass_observers``).
    label: str | None = None
    observed: frozenset[str] = field(init=False)
    intervened: frozenset[str] = field(init=False)
    #: crafted value columns some probe reads from fused attention records (``Probe.record_columns``).
    record_columns: frozenset[str] = field(init=False)

    def __post_init__(self):
        self._observers: dict[str, list[Callable]] = {}
        self._interveners: dict[str, list[Callable]] = {}
        for probe in self.probes:
            for template, method in probe.pass_observers(self.label).items():
                self._observers.setdefault(template, []).append(getattr(probe, method))
            for template, method in probe.interventions.items():
                self._interveners.setdefault(template, []).append(getattr(probe, method))
        self.observed = frozenset(self._observers)
        self.intervened = frozenset(self._interveners)
        #: run sinkscope's attention function although no record may be read (``Probe.attention_function``).
        self.attention_function = any(p.attention_function for p in self.probes)
        self.record_columns = frozenset().union(*(p.record_columns for p in self.probes)) \
            if hp.ATTN in self.observed else frozenset()
        self.finite: list[tuple[int, Tensor]] = []

    def emit(self, template: str, layer: int | None, value) -> None:
        if template == hp.ATTN:  # checked on the device, read once per batch (check_finite)
            # a fused record's LSE is D times smaller than q, and a NaN or inf in q reaches it
            inputs = value.kernel_lse if value.kernel_lse is not None else (
                value.query if value.query is not None else value.weights)
            self.finite.append((layer, torch.isfinite(inputs).all()))
        for observe in self._observers.get(template, ()):
            observe(layer, value)

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor:
        for intervene in self._interveners.get(template, ()):
            replaced = intervene(layer, value)
            if replaced is not None:
                value = replaced
        return value

    def check_finite(self) -> None:
        """One host read per batch: the first layer whose attention inputs were not finite."""
        if not self.finite:
            return
        first = self.finite[0][1].device  # a sharded model's flags meet on one device, then one read
        flags = torch.stack([flag.to(first) for _, flag in self.finite]).tolist()
        layers = [layer for layer, _ in self.finite]
        self.finite = []
        for layer, ok in zip(layers, flags):
            if not ok:
                raise SinkscopeError(
                    f"the model produced non-finite (NaN or inf) attention inputs at layer {layer}; its weights "
                    f"may be damaged, or {option('dtype')} too narrow (try {option('dtype')} float32).")


class _PassSwitch:
    """One capture for every pass: forwards each point to the current pass's dispatcher.

    ``observed`` and ``intervened`` (every pass's points) decide what the capture installs;
    ``live_observed`` and ``live_intervened`` (the current pass's) what it computes: a pass
    builds no attention record and computes no point that none of its probes reads (a BOS
    pass of ``circuit`` that reads only the loss runs the model's layers and nothing else).
    """

    def __init__(self, dispatchers: Sequence[Dispatcher]):
        self.observed = frozenset().union(*(d.observed for d in dispatchers))
        self.intervened = frozenset().union(*(d.intervened for d in dispatchers))
        self.record_columns = frozenset().union(*(d.record_columns for d in dispatchers))
        self.attention_function = any(d.attention_function for d in dispatchers)
        self.current = dispatchers[0]

    @property
    def live_observed(self) -> frozenset[str]:
        return self.current.observed

    @property
    def live_intervened(self) -> frozenset[str]:
        return self.current.intervened

    def emit(self, template: str, layer: int | None, value) -> None:
        if template in self.current.observed:
            self.current.emit(template, layer, value)

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor:
        return self.current.replace(template, layer, value) if template in self.current.intervened else value


def hook_points(probes: Sequence[Probe]) -> frozenset[str]:
    """Every hook template the probes read or intervene on."""
    return frozenset(t for p in probes for t in (*p.observers, *p.interventions))


def _forward_kwargs(model: torch.nn.Module, need_logits: bool) -> dict:
    """``use_cache=False`` and, unless logits are needed, ``logits_to_keep=1`` where accepted."""
    kwargs = {"use_cache": False}
    if not need_logits and "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    return kwargs


#: positions per block of the loss: the float32 log-softmax of a block is LOSS_BLOCK x vocabulary, not T x vocabulary.
LOSS_BLOCK = 1024


def next_token_loss(logits: Tensor, ids: Tensor) -> Tensor:
    """Cross-entropy of predicting ``ids[:, i + 1]`` at position i, float32 (B, T-1).

    Computed over blocks of :data:`LOSS_BLOCK` positions: each position's loss is its own row's
    (the same numbers as one call), and the float32 copy and log-softmax never hold more than a
    block (at 16,384 tokens a whole (T, V) float32 copy is 3.2 GB for SmolLM2's 49,152 tokens).
    """
    B, T = ids.shape
    targets = ids[:, 1:].to(logits.device)  # (B, T-1)
    losses = torch.empty(B, T - 1, dtype=torch.float32, device=logits.device)  # (B, T-1)
    for start in range(0, T - 1, LOSS_BLOCK):
        stop = min(start + LOSS_BLOCK, T - 1)
        block = logits[:, start:stop].float()  # (B, n, V)
        losses[:, start:stop] = F.cross_entropy(block.reshape(-1, block.shape[-1]), targets[:, start:stop].reshape(-1),
                                                reduction="none").view(B, stop - start)
    return losses


def is_native(model: torch.nn.Module) -> bool:
    """The bundled trainer's model: it emits hook points itself."""
    return hasattr(model, "model_spec")


def _passes(probes: Sequence[Probe]) -> list[str | None]:
    labels: list[str | None] = [] if probes else [None]  # no probe: one plain pass
    for probe in probes:
        labels += [p for p in probe.passes() if p not in labels]
    return sorted(labels, key=lambda p: (p is not None, "" if p is None else str(p)))


class _Bar:
    """The forward loop's progress bar: windows when each batch is one pass; passes when it is several.

    A command whose probes ask for several passes per batch (``inject``: one clean pass and one per
    junk type x cutoff x dose x draw; ``circuit``'s BOS experiments) counts each pass as it ends, so
    the bar moves within a batch (one batch of 8 windows is 25 passes of ``inject``'s default); the
    windows done are its postfix. Out of memory, the batch's counted passes are taken back and the
    total follows the halved batch size.
    """

    def __init__(self, n: int, start: int, batch_size: int, passes: int, progress: bool):
        self.n, self.passes, self.counted, self.index = n, passes, 0, start
        if passes <= 1:
            self.bar = progress_bar(total=n, initial=start, desc="windows", unit="win", disable=not progress,
                                    file=sys.stderr, dynamic_ncols=True)
            return
        done = -(-start // batch_size) * passes  # the batches before ``start``, as whole batches of passes
        self.bar = progress_bar(total=done + self._left(start, batch_size), initial=done,
                                desc=f"passes ({passes} per batch)", unit="pass", disable=not progress,
                                file=sys.stderr, dynamic_ncols=True)
        self.bar.set_postfix_str(f"{start}/{n} windows", refresh=False)

    def _left(self, index: int, batch_size: int) -> int:
        return -(-(self.n - index) // batch_size) * self.passes

    def passed(self) -> None:
        """One pass of the batch has run."""
        if self.passes > 1:
            self.bar.update(1)
            self.counted += 1

    def retry(self, index: int, batch_size: int) -> None:
        """The batch at ``index`` runs again at ``batch_size``: its passes are not counted twice."""
        if self.passes > 1:
            self.bar.n -= self.counted
            self.bar.total = self.bar.n + self._left(index, batch_size)
            self.bar.refresh()
        self.counted = 0

    def batch_done(self, index: int) -> None:
        """The windows before ``index`` are measured."""
        if self.passes > 1:
            self.bar.set_postfix_str(f"{index}/{self.n} windows")
        else:
            self.bar.update(index - self.index)
        self.counted, self.index = 0, index

    def close(self) -> None:
        self.bar.close()


def run_probes(
    model: torch.nn.Module,
    tokens: np.ndarray,
    probes: Sequence[Probe],
    *,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress: bool = True,
    attention: str = "fused",
    start: int = 0,
    on_batch_done: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    inference: bool = True,
) -> int:
    """Run ``model`` over ``tokens[start:]`` (n_seqs, seq_len) in batches, feeding ``probes``.

    Results do not depend on ``batch_size``: probes only add per-sequence sums (except a probe
    with ``fixed_batch``, e.g. injection's junk drawn across the batch: its batch is part of the
    measurement, is never halved, and every probe learns each batch's first window, ``batch_start``). ``attention``
    chooses the capture: ``"fused"`` (kernel log-sum-exp, memory linear in the sequence length)
    or ``"explicit"`` (the model's eager weights; the reference). After each batch
    ``on_batch_done(next_window)`` is called (the caller checkpoints there). ``inference=False``
    runs under ``torch.no_grad`` instead of inference mode (a model that trains on afterwards:
    ``sinkscope.train.monitor``; a buffer it caches in the pass stays usable by autograd). Before the first batch
    every probe may refuse the batching (``Probe.check_batches``: a short last batch), in one sentence.

    Out of memory: the batch's partial contributions are rolled back (probes are snapshot on
    their device before each batch), the batch size is halved once and the batch retried,
    saying so; the numbers do not change. A second out-of-memory error is raised.

    Returns:
        The batch size finally used.
    """
    own_readers = [p.name for p in probes if p.reads_windows]
    if own_readers:
        raise SinkscopeError(f"the probe {own_readers[0]} reads each window its own way; run it with `sinkscope "
                             f"{own_readers[0]}`.")
    device = torch.device(device) if device is not None else input_device(model)
    log = log or (lambda message: print(message, file=sys.stderr))
    native = is_native(model)
    passes = [(label, Dispatcher([p for p in probes if label in p.passes()], label)) for label in _passes(probes)]
    n = tokens.shape[0]
    for probe in probes:
        problem = probe.check_batches(n - start, batch_size)
        if problem:
            raise SinkscopeError(problem)
    if not passes:  # every probe has what it needs already (a second stage that changes nothing): no forward
        return batch_size
    heap.fix_mmap_threshold(heap.RUN_THRESHOLD_BYTES)  # else glibc's heap fragments at long windows (runtime/heap.py)
    for probe in probes:  # what a probe allocates by the model's size is decided (and stated) before the bar
        probe.prepare(device, log)
    bar = _Bar(n, start, batch_size, len(passes), progress)
    switch = _PassSwitch([d for _, d in passes])
    # logits of every position only on the passes that read the loss (the others: the last position's)
    pass_kwargs = [{} if native else _forward_kwargs(model, need_logits=hp.LOSS in d.observed) for _, d in passes]
    if n > start:  # one window must fit, or the run stops here in one sentence
        check_forward_fits(model, int(tokens.shape[1]), device,
                           all_logits=native or any("logits_to_keep" not in kwargs for kwargs in pass_kwargs))
    attached = contextlib.nullcontext() if native else capture(model, switch, mode=attention)
    retried = False
    index = start
    with attached, (torch.inference_mode() if inference else torch.no_grad()):
        while index < n:
            snapshot = [p.snapshot() for p in probes]
            ids = torch.from_numpy(np.ascontiguousarray(tokens[index:index + batch_size])).to(device)  # (B, T)
            try:
                for (label, dispatcher), kwargs in zip(passes, pass_kwargs):
                    for probe in dispatcher.probes:
                        probe.pass_label = label
                        probe.batch_start = index
                    switch.current = dispatcher
                    _forward(model, _pass_inputs(dispatcher, label, ids), dispatcher, native=native,
                             attention=attention, kwargs=kwargs, switch=switch)
                    dispatcher.check_finite()
                    bar.passed()
                for probe in probes:
                    probe.end_batch()
            except torch.OutOfMemoryError:
                for probe, state in zip(probes, snapshot):
                    probe.restore(state)
                del ids
                if retried or batch_size == 1:
                    raise
                fixed = [p.name for p in probes if p.fixed_batch]
                if fixed:
                    raise SinkscopeError(
                        f"out of memory at {batch_size} windows per batch; {', '.join(fixed)} draws across its "
                        "evaluation batch, so the batch cannot be halved without changing the numbers: rerun with "
                        f"a smaller {option('eval_batch')}, a shorter {option('seq_len')} or a larger device.") from None
                retried, batch_size = True, max(1, batch_size // 2)
                bar.retry(index, batch_size)
                _free_cache(device)
                log(f"Out of memory; retrying with --batch-size {batch_size} (the numbers do not change).")
                continue
            index += ids.shape[0]
            bar.batch_done(index)
            if on_batch_done is not None:
                on_batch_done(index)
    bar.close()
    return batch_size


# ---- the memory a forward needs, before it runs ---------------------------------------------------------


@dataclass(frozen=True)
class ForwardCost:
    """A lower bound of what one forward allocates beyond the weights (see :func:`forward_cost`)."""

    per_token: int  # bytes per token of the batch
    fixed: int  # bytes whatever the length (the last position's logits)
    width: int  # C, the residual stream's width
    mlp: int  # F, the widest projection inside the model (the MLP's, or a fused q/k/v)
    vocab: int  # V, the logits' width

    def bytes(self, seq_len: int, batch: int = 1) -> int:
        return batch * (seq_len * self.per_token + self.fixed)

    def longest(self, memory: int, batch: int = 1) -> int:
        """The longest length whose forward fits in ``memory`` bytes (0: none)."""
        return max(0, (memory // batch - self.fixed) // self.per_token) if self.per_token else 1 << 62


def forward_cost(model: torch.nn.Module, *, all_logits: bool) -> ForwardCost:
    """What one forward of T tokens at least allocates beyond the weights, read off the model's modules:

        bytes >= B T b (2 C + 2 F) + B T' V b      (b bytes per activation; T' = T with ``all_logits``
                                                     (a pass that reads the loss, or a model that always
                                                     computes every position's logits), else 1)

    C is the token embedding's width and V its rows (or the output embedding's), F the widest
    linear projection below the output embedding (the MLP's first; GPT-2's ``Conv1D`` too). At the
    MLP, the residual stream, the normalised input and two F-wide intermediates are alive at once
    (gate and up, or the pre-activation and its activation); attention runs in a fused kernel whose
    memory is linear in T, so it adds nothing of a higher order. Everything else a forward holds
    (q, k, v, the kernel's output, the probes' accumulators) comes on top: this is a lower bound.
    """
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    token = max(embeddings, key=lambda m: m.num_embeddings * m.embedding_dim, default=None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    width = token.embedding_dim if token is not None else 0
    vocab = int(getattr(head, "out_features", 0) or (token.num_embeddings if token is not None else 0))
    widths = [int(m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
              and not (head is None and m.out_features == vocab)]
    widths += [int(m.nf) for m in model.modules()  # GPT-2's Conv1D: (in, nf)
               if type(m).__name__ == "Conv1D" and isinstance(getattr(m, "nf", None), int)]
    mlp = max(widths, default=width)
    weight = token.weight if token is not None else next(model.parameters())
    size = weight.element_size() if weight.is_floating_point() else 2
    per_token = size * (2 * width + 2 * mlp) + (size * vocab if all_logits else 0)
    return ForwardCost(per_token, 0 if all_logits else size * vocab, width, mlp, vocab)


def check_forward_fits(model: torch.nn.Module, seq_len: int, device: torch.device, *, all_logits: bool,
                       memory: int | None = None) -> None:
    """Refuse, in one sentence naming the longest ``--seq-len`` that fits, a forward of one window of
    ``seq_len`` tokens whose lower bound (:func:`forward_cost`) exceeds the free memory
    (:func:`free_memory`; ``memory`` overrides it, for tests).

    Run before the first batch: a length that no corpus bounds (``sinks --inputs random`` at
    ``--seq-len 1000000``) would otherwise run for minutes and end in out-of-memory errors. One
    window is what must fit (a larger batch is halved on a device's out-of-memory error).
    """
    cost = forward_cost(model, all_logits=all_logits)
    memory = free_memory(device) if memory is None else memory
    if memory is None or cost.bytes(seq_len) <= memory:
        return
    what = f"the {cost.width}-wide residual stream and the {cost.mlp}-wide MLP" + (
        f", and every position's logits over {cost.vocab:,} ids" if all_logits else "")
    longest = cost.longest(memory)
    advice = f"the longest {option('seq_len')} that fits is {longest:,}" if longest >= 2 else \
        "not even 2 tokens fit: free memory or use a larger device"
    raise SinkscopeError(f"a forward over {seq_len:,} tokens needs at least {_gb(cost.bytes(seq_len))} beyond the "
                         f"weights ({what}), but {_gb(memory)} is free on {device.type}; {advice}.")


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _pass_inputs(dispatcher: Dispatcher, label: str | None, ids: Tensor) -> Tensor:
    """The token ids of one pass: the batch's, unless a probe of this pass rewrites them.

    A probe whose pass needs other inputs than the windows (``circuit``'s BOS experiments: the
    window without its BOS, the first token repeated r times) returns them from
    ``Probe.pass_inputs(ids)`` (called with ``pass_label`` set); the clean pass (None) always
    reads the windows. Two probes rewriting one pass differently is an error.
    """
    if label is None:
        return ids
    chosen = None
    for probe in dispatcher.probes:
        rewritten = probe.pass_inputs(ids)
        if rewritten is None:
            continue
        if chosen is not None and (chosen.shape != rewritten.shape or not torch.equal(chosen, rewritten)):
            raise SinkscopeError(f"two probes give different inputs for the pass {label!r}.")
        chosen = rewritten
    return ids if chosen is None else chosen


def _forward(model: torch.nn.Module, ids: Tensor, dispatcher: Dispatcher, *, native: bool, attention: str,
             kwargs: dict, switch: _PassSwitch | None = None) -> None:
    """One forward pass of ``ids`` (B, T); the capture (or the native model) feeds ``dispatcher``.

    The native model gets the pass switch (as the capture does), so every pass of a batch runs the
    same attention kernels (the native model builds records where any pass observes them) and two
    passes that change nothing give bit-identical logits; only the current pass's probes receive
    anything. A captured transformers model runs sinkscope's attention function on every pass too
    (the same kernel), but builds records and computes points only on the passes that read them.
    """
    if hp.TOKENS in dispatcher.observed:
        dispatcher.emit(hp.TOKENS, None, ids)
    if native:
        logits, _ = model(ids, hooks=switch if switch is not None else dispatcher, attention=attention)  # (B, T, V)
    else:
        logits = model(input_ids=ids, **kwargs).logits  # (B, T|1, V)
    if hp.LOSS in dispatcher.observed:
        dispatcher.emit(hp.LOSS, None, next_token_loss(logits, ids))  # (B, T-1)


def _free_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- the self-check: the capture must not change the model's logits -------------------------------------

#: tokens of the self-check (a prefix of the first window: causal, so a prefix is a valid check).
CHECK_TOKENS = 32
#: the largest |logit difference| allowed, relative to the largest |logit| (at least 1), by dtype.
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def check_capture(model: torch.nn.Module, tokens: np.ndarray, *, attention: str = "fused",
                  device: torch.device | str | None = None) -> dict:
    """Compare the logits of the model's own forward with the logits under the capture, on one prefix.

    The first window's first :data:`CHECK_TOKENS` tokens run twice: as the model computes them
    (its own attention implementation, no hook), and with the capture attached in ``attention``
    mode, observing attention records (so sinkscope's attention function computes every softmax
    layer) and intervening on nothing. A capture that observes the architecture exactly leaves the
    logits unchanged to the dtype's round-off (:data:`CHECK_TOLERANCE`); anything else stops the
    run with one sentence naming the architecture, so a new architecture is never measured wrong.

    Returns:
        ``{"tokens", "max_abs_diff", "relative", "tolerance", "dtype"}`` for the manifest.
    """
    if is_native(model):
        return {}
    device = torch.device(device) if device is not None else input_device(model)
    ids = torch.from_numpy(np.ascontiguousarray(tokens[:1, :CHECK_TOKENS])).to(device)  # (1, T')
    dtype = next(model.parameters()).dtype
    observer = DiscardRecords()
    with torch.inference_mode():
        own = model(input_ids=ids, use_cache=False).logits.float()  # (1, T', V)
        with capture(model, observer, mode=attention):
            seen = model(input_ids=ids, use_cache=False).logits.float()  # (1, T', V)
    if not bool(torch.isfinite(own).all()):  # the model itself is broken: the run's own check names the layer
        return {"tokens": int(ids.shape[1]), "skipped": "the model's own logits are not finite"}
    diff = float((own - seen).abs().max())
    scale = max(1.0, float(own.abs().max()))
    tolerance = CHECK_TOLERANCE.get(dtype, 5e-2)
    result = {"tokens": int(ids.shape[1]), "max_abs_diff": diff, "relative": diff / scale, "tolerance": tolerance,
              "dtype": str(dtype).removeprefix("torch."), "attention": attention}
    if not diff / scale <= tolerance:  # also catches NaN
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise SinkscopeError(
            f"sinkscope's capture changes the {model_type!r} model's logits (by {diff:.3g}, {diff / scale:.2g} of their "
            f"scale, on the first {ids.shape[1]} tokens; {tolerance:g} is allowed in {result['dtype']}), so its "
            f"attention is not observed exactly and nothing would be measured right; sinkscope stops here "
            f"({option('attention')} {'explicit' if attention == 'fused' else 'fused'} may work; please report the architecture).")
    return result


class DiscardRecords:
    """Observes attention records (so the capture computes attention) and discards them: the capture's check,
    and ``stream``'s readings that read no record."""

    observed = frozenset({hp.ATTN})
    intervened = frozenset()
    record_columns = frozenset()

    def emit(self, template, layer, value) -> None:
        pass

    def replace(self, template, layer, value):
        return value
