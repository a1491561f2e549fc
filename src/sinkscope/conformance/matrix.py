"""The conformance matrix: every causal-LM model type of the installed transformers, checked by machine.

    python -m sinkscope.conformance.matrix [--types llama,opt] [--out FOLDER] [--overwrite]
    python -m sinkscope.conformance.matrix --update-repo CHECKOUT     (maintainers: the whole matrix)

For each model type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (``tiny.model_types()``), classified
by ``tiny.classify`` (decoder, hybrid, multimodal decoder, encoder-decoder, encoder, attention-free),
every type with softmax attention gets a tiny random model built from its config class alone
(``tiny.build_tiny``) and these checks, each against a reference that does not use sinkscope's
capture:

1. **discovery** finds the parts (``capture/discover.py``), and **W_O** is right: its output is the
   attention module's output and its input the model's eager attention output, times the output
   gate discovery found (``sigmoid`` of that module's output, computed here), unless the model is
   named as having a gate sinkscope cannot read (``check_output_projection``);
2. **logits unchanged** under the capture, fused and explicit (``runner.check_capture``, the same
   self-check every run makes on its first window);
3. **per-head p0 mass, phantom mass and sink alpha**, fused and explicit, equal an independent
   eager computation within 1e-5: the model's own eager attention weights, recorded from its eager
   function (w_i0 = a_i0 / sum_j a_ij over queries i >= 1; phantom = 1 - sum_j a_ij for a sink
   column; for a rescaling sink sigmoid(b - LSE_i) from the explicit scores q.k; alpha_0 = mean over
   t of a_t0 with the phantom in the normaliser);
4. **hook-point invariants** (``tests/unit/capture/test_hooks.py``'s): ``resid_post[l] == resid_pre[l+1]``,
   ``hook_z`` is W_O's input, the heads' ``hook_result`` plus W_O's bias is W_O's output;
5. **each command runs** (``sinks``, ``heads``, ``inject``, ``circuit``, and ``selectivity`` on
   gated models) through the API on the tiny model, or refuses a hook point the model lacks (or a
   gate it cannot read) in one sentence; a refusal of the matrix's own options is a failure.

The result is a page, ``architectures.md`` (one row per model type: class, status, attention path,
hook points missing, reason for a failure), and its rows as ``verified.json``, written into a run
folder of their own: ``--out``, by default a fresh ``reports/<time>-conformance-<id>`` under the
current folder (``results.default_run_dir``). The folder is staged and renamed into place and
records what it wrote (``.sinkscope-files``); an existing one is replaced only with
``--overwrite`` and only when it holds nothing sinkscope did not write (``fileio.check_replaceable``).
The matrix never writes into the installed package nor into the current folder's ``docs/``.

The copies in the source tree, ``docs/architectures.md`` and ``verified.json`` beside this module
(package data, read by ``sinkscope ls families``), are regenerated only when a maintainer asks:
``--update-repo CHECKOUT`` runs the whole matrix (no ``--types``), checks that CHECKOUT is a
sinkscope checkout and that the two files there are absent or the matrix's own, then rewrites
them (atomically) as well as writing the run folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

VERIFIED = Path(__file__).with_name("verified.json")
#: the page and the rows, in a run folder (``--out``) and, with ``--update-repo``, in a checkout.
PAGE, ROWS = "architectures.md", "verified.json"
#: where ``--update-repo CHECKOUT`` writes them, relative to the checkout.
REPO_PAGE, REPO_ROWS = Path("docs") / PAGE, Path("src") / "sinkscope" / "conformance" / ROWS
#: the first line of every page the matrix writes (how its own page is recognised before it is replaced).
PAGE_TITLE = "# Architectures: the conformance matrix"
#: what wrote a run folder of the matrix (its ``.sinkscope-files``).
WRITER = "conformance"
#: classes whose models have softmax attention to check.
CHECKED_CLASSES = ("decoder", "hybrid", "multimodal-decoder")
TOLERANCE = 1e-5
COMMANDS = ("sinks", "heads", "inject", "circuit")


def read_verified() -> list[dict]:
    """The last matrix's rows (``verified.json``), or the first families when it has not run."""
    from sinkscope.errors import SinkscopeError
    from sinkscope.store.files import read_json

    try:  # a damaged file (not JSON, [[[[...]]]], not the matrix's rows) counts as none
        rows = read_json(VERIFIED, "the conformance matrix's verified.json", expect=dict)["rows"]
        return [row for row in rows if isinstance(row, dict) and row.get("class") in CHECKED_CLASSES]
    except (SinkscopeError, KeyError, TypeError):
        from sinkscope.capture.families import FIRST_FAMILIES

        return [{"model_type": t, "status": "pass", "path": "interface"} for t in FIRST_FAMILIES]


# ---- references that do not use the capture --------------------------------------------------------------


def _eager_reference(model, ids, outputs_of: dict | None = None):
    """Per attention layer: the model's own eager weights (B, H, T, S), its explicit scores and sink logits.

    ``outputs_of`` (a dict, filled when given) receives each layer's eager outputs (B, T, H, Dv).

    Every ``eager_attention_forward`` of the model's modeling files is wrapped for one eager forward
    pass: it receives q, k, the mask and the scale from the model and returns the weights the model
    computes; the wrapper keeps them with the scores q.k * scale + mask, per decoder layer (its own
    forward pre-hooks on the layers). Nothing of sinkscope's capture takes part.
    """
    import torch

    from sinkscope.capture.discover import discover, find_submodule
    from sinkscope.capture.families import get_submodule

    parts = discover(model)
    layers = get_submodule(model, parts.layers)
    attention_modules = {id(find_submodule(layers[i], parts.attention)) for i in parts.attention_layers}
    current: list[int] = []
    seen: dict[int, list[tuple]] = {}
    outputs: dict[int, list] = {}
    files = {sys.modules[type(m).__module__] for m in model.modules()
             if callable(getattr(sys.modules[type(m).__module__], "eager_attention_forward", None))}
    originals = {f: f.eager_attention_forward for f in files}

    def wrap(original):
        def recording(module, query, key, value, attention_mask, scaling=None, **kwargs):
            out, weights = original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            if current and id(module) in attention_modules:  # a layer run twice (Dory's loop) is seen twice
                groups = query.shape[1] // key.shape[1]
                k = key.float().repeat_interleave(groups, dim=1)
                scale = query.shape[-1] ** -0.5 if scaling is None else scaling
                scores = torch.matmul(query.float(), k.transpose(-1, -2)) * scale
                if attention_mask is not None:
                    scores = scores + attention_mask[:, :, :, : key.shape[-2]].float()
                sink = kwargs.get("s_aux", getattr(module, "sinks", None))
                seen.setdefault(current[-1], []).append((weights, scores, sink))
                outputs.setdefault(current[-1], []).append(out.detach())  # (B, T, H, Dv): before any gate and W_O
            return out, weights
        return recording

    def leave(_module, _args, _output) -> None:  # returns None: the layer's output is kept
        current.pop()

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda _m, _a, index=index: current.append(index)))
        handles.append(layer.register_forward_hook(leave))
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    for f in files:
        f.eager_attention_forward = wrap(originals[f])
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for f, original in originals.items():
            f.eager_attention_forward = original
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    if outputs_of is not None:
        outputs_of.update(outputs)
    return parts, seen


def check_output_projection(model, ids) -> tuple[bool, str]:
    """W_O is the module that turns the heads' outputs into the attention module's output.

    Against the model's own eager attention (``_eager_reference``): W_O's output must be the
    attention module's output, and W_O's input must be the eager attention output a (ungated), or
    sigmoid(g) * a for the gate projection discovery found, or the model must be named as having an
    output gate sinkscope cannot read. A projection of the layer's input taken for W_O (a per-head
    gate's g_proj called after attention) fails here.
    """
    import torch

    from sinkscope.capture.discover import find_submodule
    from sinkscope.capture.families import get_submodule

    outputs: dict = {}
    parts, _ = _eager_reference(model, ids, outputs)
    if parts.out_proj is None or not parts.interface:
        return True, "no W_O to check"
    layers = get_submodule(model, parts.layers)
    seen: dict = {}
    handles = []
    for layer in parts.attention_layers:
        for name, path in (("attn", parts.attention), ("o", parts.out_proj), ("g", parts.gate_module)):
            module = find_submodule(layers[layer], path) if path else None
            if module is not None:
                handles.append(module.register_forward_hook(
                    lambda _m, args, out, key=(layer, name): None if seen.setdefault(key, (args, out)) else None))
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    first = lambda x: x if isinstance(x, torch.Tensor) else x[0]  # noqa: E731
    for layer in parts.attention_layers:
        if (layer, "o") not in seen or layer not in outputs:
            continue
        (o_args, o_out), (_, attn_out) = seen[(layer, "o")], seen[(layer, "attn")]
        if not torch.equal(first(attn_out), o_out):
            return False, f"W_O ({parts.out_proj}) does not give the attention module's output at layer {layer}"
        a = outputs[layer][0].float()  # (B, T, H, Dv)
        z = o_args[0].float().reshape(a.shape)  # (B, T, H, Dv)
        if parts.gate_module is not None and (layer, "g") in seen:  # the gate as the capture reads it: (B, T, H, Dv)
            a = a * parts.gate_reader(first(seen[(layer, "g")][1]), a.shape[2], a.shape[3])
        if not torch.allclose(z, a, rtol=1e-4, atol=1e-5) and parts.gate_unread is None:
            return False, f"W_O's input is not the attention output (times its gate) at layer {layer}"
    return True, "W_O ok"


def check_p0_and_phantom(model, ids) -> tuple[bool, str]:
    """Per-head p0_mass, phantom_mass and sink_alpha (a_i0 with the phantom in the normaliser), fused and
    explicit, against the eager reference (1e-5)."""
    import numpy as np
    import torch

    from sinkscope.api import measure

    parts, seen = _eager_reference(model, ids)
    if not parts.interface:  # the eager fallback reads output_attentions: the check is of the reduction and layers
        with torch.no_grad():
            weights = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
        seen = {layer: [(w, None, None)] for layer, w in zip(parts.attention_layers, weights)}
    missing = [layer for layer in parts.attention_layers if layer not in seen or seen[layer][0][0] is None]
    if missing:
        return False, f"the model's eager attention gave no weights at layers {missing}"
    references = {}
    for layer in parts.attention_layers:
        calls = seen[layer]  # every call of the layer: a looped model runs some layers more than once
        a = torch.cat([w.detach().float() for w, _, _ in calls])  # (calls x B, H, T, S)
        rows = a.sum(-1)  # (calls x B, H, T)
        p0 = (a[..., 0] / rows)[:, :, 1:].mean(dim=(0, 2)).double()  # (H,): w_i0 over i >= 1
        if parts.sink_form == "rescale":  # the eager rows sum to 1; phi from the explicit scores
            phi = torch.cat([torch.sigmoid(sink.detach().float().view(1, -1, 1) - torch.logsumexp(scores, -1))
                             for _, scores, sink in calls])  # (calls x B, H, T)
        else:
            phi = 1 - rows
        a0 = a[..., 0] / rows * (1 - phi)  # (calls x B, H, T): a_i0, the phantom in the normaliser
        references[layer] = {"p0_mass": p0, "phantom_mass": phi[:, :, 1:].mean(dim=(0, 2)).double(),
                             "sink_alpha": a0.mean(dim=2).mean(dim=0).double()}  # Gu et al.'s alpha_0, t >= 0
    worst = 0.0
    for attention in ("fused", "explicit") if parts.interface else ("fused",):
        table = measure(["p0_mass", "phantom_mass", "sink_rate"], model, windows=ids.numpy(),
                                  attention=attention).table
        for layer, wanted in references.items():
            for metric, reference in wanted.items():
                got = table[(table.metric == metric) & (table.layer == layer) & table["head"].notna()]
                if metric == "phantom_mass" and parts.sink_form is None:
                    if len(got) and not np.allclose(got["value"], 0):
                        return False, f"phantom_mass is not 0 at layer {layer} on a model without a sink"
                    continue
                values = torch.tensor(got.sort_values("head")["value"].to_numpy())
                if values.shape != reference.shape:
                    return False, (f"{metric} ({attention}) at layer {layer} has {values.numel()} heads, the reference "
                                   f"{reference.numel()}")
                worst = max(worst, float((values - reference).abs().max()))
    if worst > TOLERANCE:
        return False, f"p0/phantom mass differ from the eager reference by {worst:.2g}"
    return True, f"p0/phantom within {worst:.1g}"


def check_hooks(model, ids) -> tuple[bool, str, list[str]]:
    """The hook-point invariants; returns (ok, detail, hook points the model lacks)."""
    import torch

    from sinkscope.capture.attention import capture
    from sinkscope.capture import hooks as hp
    from sinkscope.capture.discover import discover, find_submodule
    from sinkscope.capture.families import get_submodule
    from sinkscope.errors import SinkscopeError

    parts = discover(model)
    wanted = [hp.RESID_PRE, hp.RESID_POST, hp.RESID_MID, hp.LN1_NORMALIZED, hp.ATTN_OUT, hp.ATTN_Z, hp.ATTN_RESULT,
              hp.MLP_PRE, hp.MLP_PRE_LINEAR]
    missing = sorted(parts.absent)
    present = [t for t in wanted if t not in parts.absent]

    class Sink:
        observed, intervened, record_columns = frozenset(present), frozenset(), frozenset()
        values: dict = {}

        def emit(self, template, layer, value):
            self.values.setdefault(template, {})[layer] = value

        def replace(self, template, layer, value):
            return value

    sink = Sink()
    reference: dict = {}
    layers = get_submodule(model, parts.layers)
    handles = []
    runs: dict[int, int] = {}
    for index, layer_module in enumerate(layers):
        handles.append(layer_module.register_forward_pre_hook(
            lambda _m, _a, index=index: runs.__setitem__(index, runs.get(index, 0) + 1)))
    for layer in parts.attention_layers:
        out_proj = find_submodule(layers[layer], parts.out_proj)
        if out_proj is not None:
            handles.append(out_proj.register_forward_hook(
                lambda _m, args, out, layer=layer: reference.__setitem__(layer, (args[0], out))))
    try:
        with torch.no_grad(), capture(model, sink, mode="fused"):
            model(input_ids=ids, use_cache=False)
    except SinkscopeError as error:
        return False, f"hooks: {error}", missing
    finally:
        for handle in handles:
            handle.remove()
    values = sink.values
    n = len(layers) if all(count == 1 for count in runs.values()) else 0  # a looped model reruns layers: no chain
    for layer in range(n - 1):
        pre, post = values.get(hp.RESID_PRE, {}).get(layer + 1), values.get(hp.RESID_POST, {}).get(layer)
        if pre is not None and post is not None and not torch.equal(pre, post):
            return False, f"resid_post[{layer}] != resid_pre[{layer + 1}]", missing
    for layer in parts.attention_layers:
        if layer not in reference or hp.ATTN_Z not in values:
            continue
        o_in, o_out = reference[layer]
        z = values[hp.ATTN_Z].get(layer)
        if z is None or not torch.equal(z.reshape(o_in.shape), o_in):
            return False, f"hook_z is not W_O's input at layer {layer}", missing
        bias = getattr(find_submodule(layers[layer], parts.out_proj), "bias", None)
        total = values[hp.ATTN_RESULT][layer].sum(dim=2) + (bias if bias is not None else 0.0)
        if not torch.allclose(total, o_out, atol=1e-5, rtol=1e-4):
            return False, f"the heads' hook_result does not sum to W_O's output at layer {layer}", missing
    return True, "hooks ok", missing


def check_commands(model, ids, gated: bool) -> tuple[bool, str]:
    """Each command runs on the tiny model, or refuses a hook point it lacks in one sentence."""
    from sinkscope.api import measure
    from sinkscope.errors import SinkscopeError

    done = []
    for command in (*COMMANDS, *(("selectivity",) if gated else ())):  # (inject: one condition; circuit: r = 1)
        options = {"doses": "0.4", "junk": "gaussian", "cutoffs": "median"} if command == "inject" else {}
        if command == "circuit":
            options = {"repeats": (1,), "bos_token_id": 1}
        try:
            measure(command, model, windows=ids.numpy(), **options)
            done.append(command)
        except SinkscopeError as error:
            text = str(error)
            if "no option" in text:  # the matrix's own call is wrong: never a pass
                raise
            if "\n" in text or not any(word in text for word in ("has no", "have no", "does not have", "lacks", "no MLP",
                                                                     "not a subtraction", "cannot")):
                return False, f"{command}: {text[:200]}"
            done.append(f"{command} refused ({text[:100]})")
    return True, ", ".join(done)


# ---- one row per model type ----------------------------------------------------------------------------------


def known_types(types: list[str]) -> list[str]:
    """``types`` (stripped, empty names dropped), or one sentence naming the first that is not a model type.

    The model types are those of the installed transformers (``tiny.model_types``); an empty list
    stays empty (the caller's "every type").
    """
    import transformers

    from sinkscope.conformance import tiny
    from sinkscope.errors import SinkscopeError, suggest

    names = [t.strip() for t in types if t.strip()]
    known = tiny.model_types()
    unknown = [t for t in names if t not in known]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise SinkscopeError(f"unknown model type {unknown[0]!r}{more}: not a causal-LM model type of transformers "
                             f"{transformers.__version__}"
                             + (suggest(unknown[0], known) or "; give comma-separated types such as llama,opt."))
    return names


def check_type(model_type: str, commands: bool = True) -> dict:
    """The matrix row of one model type (an unknown type is one sentence, ``known_types``)."""
    import torch

    from sinkscope.conformance import tiny
    from sinkscope.forward.runner import check_capture

    known_types([model_type])
    kind = tiny.classify(model_type)
    row = {"model_type": model_type, "class": kind, "status": "n/a", "path": "", "missing": [], "reason": ""}
    if kind not in CHECKED_CLASSES:
        row["reason"] = tiny.CLASS_REASONS.get(model_type, "") if hasattr(tiny, "CLASS_REASONS") else ""
        return row
    started = time.perf_counter()
    try:
        torch.manual_seed(0)
        model = tiny.build_tiny(model_type)
        vocab = min(model.get_input_embeddings().num_embeddings, model.get_output_embeddings().out_features
                    if hasattr(model.get_output_embeddings(), "out_features") else 10 ** 9)
        ids = torch.randint(1, max(vocab - 1, 2), (2, 16), generator=torch.Generator().manual_seed(0))
        from sinkscope.capture.discover import discover

        parts = discover(model)
        row["path"] = "interface" if parts.interface else "eager fallback"
        row["sink"] = parts.sink_form or ""
        row["gate"] = "output" if parts.gate_module else "unread" if parts.gate_unread else ""
        for attention in ("fused", "explicit"):
            check_capture(model, ids.numpy(), attention=attention)
        ok, detail = check_p0_and_phantom(model, ids)
        if not ok:
            raise AssertionError(detail)
        ok, wo_detail = check_output_projection(model, ids)
        if not ok:
            raise AssertionError(wo_detail)
        ok, hooks_detail, missing = check_hooks(model, ids)
        row["missing"] = missing
        if not ok:
            raise AssertionError(hooks_detail)
        commands_detail = ""
        if commands:
            ok, commands_detail = check_commands(model, ids, parts.gate_module is not None or bool(parts.gate_unread))
            if not ok:
                raise AssertionError(commands_detail)
        row.update(status="pass", reason=f"{detail}; ran {commands_detail}" if commands_detail else detail)
    except Exception as error:  # noqa: BLE001 - every failure is a row, with its reason
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        row.update(status="fail", reason=f"{type(error).__name__}: {text[:240]}")
        if "--debug" in sys.argv:
            traceback.print_exc()
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def write_markdown(rows: list[dict], path: Path) -> None:
    """Write the page (:func:`markdown`) to ``path``."""
    Path(path).write_text(markdown(rows), encoding="utf-8")


def markdown(rows: list[dict]) -> str:
    """The page (``architectures.md``): the counts, then one row per model type."""
    import transformers

    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    passed = [r for r in checked if r["status"] == "pass"]
    lines = [
        PAGE_TITLE,
        "",
        f"Every causal-LM model type of transformers {transformers.__version__} "
        f"(`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, {len(rows)} types), checked by "
        "`python -m sinkscope.conformance.matrix` on a tiny random model built from its config class alone: "
        "discovery of the parts, W_O (its output is the attention module's, its input the attention output times "
        "any gate found), logits unchanged under the capture (fused and explicit), per-head p0 mass, "
        "phantom mass and sink alpha (fused and explicit) against the model's own eager weights (1e-5), the "
        "hook-point invariants, and every "
        "command (`sinks`, `heads`, `inject`, `circuit`, `selectivity` where gated).",
        "",
        "The repository's `docs/architectures.md` and `src/sinkscope/conformance/verified.json` (read by "
        "`sinkscope ls families`) are regenerated from a sinkscope checkout by "
        "`python -m sinkscope.conformance.matrix --update-repo .`; without `--update-repo` the matrix writes this "
        "page and its rows into a run folder of its own (`--out`, by default `reports/<time>-conformance-<id>`), "
        "never into the installed package.",
        "",
        f"**{len(passed)} of {len(checked)}** model types with softmax attention pass "
        f"({100 * len(passed) / max(len(checked), 1):.0f}%). Encoder-decoder, encoder-only and attention-free "
        "types are classified, not counted.",
        "",
        "The *sink* column is the learned-sink form (`column`: an extra softmax logit; `rescale`: the output "
        "scaled by sigmoid(LSE - b)); *gate* is an output gate read before W_O (`output`: sigmoid of a projection, "
        "its own or packed into q_proj), or something between attention and W_O that sinkscope cannot read as a "
        "gate (`unread`: a scaled or softplus gate, a norm; `selectivity` refuses these).",
        "",
        "| model type | class | status | attention path | sink | gate | hook points missing | detail |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        missing = ", ".join(m.replace("blocks.{l}.", "") for m in r.get("missing", []) if not m.endswith("pre_linear"))
        lines.append(f"| `{r['model_type']}` | {r['class']} | {r['status']} | {r.get('path', '')} | "
                     f"{r.get('sink', '')} | {r.get('gate', '')} | {missing} | {r.get('reason', '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def rows_json(rows: list[dict]) -> str:
    """The rows as ``verified.json`` holds them (read by :func:`read_verified`)."""
    return json.dumps({"rows": rows}, indent=1) + "\n"


def _is_page(path: Path) -> bool:
    """Whether ``path`` is a page the matrix wrote (its first line is the matrix's title)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().rstrip("\n") == PAGE_TITLE
    except (OSError, UnicodeDecodeError):
        return False


def _is_rows(path: Path) -> bool:
    """Whether ``path`` is a rows file the matrix wrote (``{"rows": [...]}``)."""
    from sinkscope.errors import SinkscopeError
    from sinkscope.store.files import read_json

    try:  # not JSON, or nested too deeply: not the matrix's
        record = read_json(path, "the conformance matrix's rows")
    except SinkscopeError:
        return False
    return isinstance(record, dict) and isinstance(record.get("rows"), list)


def checkout_targets(checkout: str | os.PathLike) -> tuple[Path, Path]:
    """The page and the rows file ``--update-repo CHECKOUT`` rewrites, after checking it may.

    CHECKOUT must be a sinkscope checkout (a ``pyproject.toml`` naming the project ``sinkscope``,
    ``src/sinkscope/conformance/matrix.py`` and ``docs/``), and each of the two files absent or one
    the matrix wrote (the page starts with its title, the rows file is ``{"rows": [...]}``), never a
    symbolic link: sinkscope overwrites no file it did not write. Anything else is one sentence.
    """
    from sinkscope.errors import SinkscopeError

    root = Path(checkout)
    try:
        project = (root / "pyproject.toml").read_text(encoding="utf-8") if str(checkout).strip() else ""
    except (OSError, UnicodeDecodeError):
        project = ""
    if not re.search(r"""^name\s*=\s*["']sinkscope["']\s*$""", project, re.MULTILINE) \
            or not (root / REPO_ROWS.parent / "matrix.py").is_file() or not (root / REPO_PAGE.parent).is_dir():
        raise SinkscopeError(f"--update-repo {str(checkout)!r} is not a sinkscope checkout (a folder holding "
                             "sinkscope's pyproject.toml, src/sinkscope/ and docs/); give the root of one, e.g. "
                             "--update-repo . from inside it.")
    page, rows = root / REPO_PAGE, root / REPO_ROWS
    for path, ours in ((page, _is_page), (rows, _is_rows)):
        if path.is_symlink() or (path.exists() and not (path.is_file() and ours(path))):
            raise SinkscopeError(f"{path} was not written by the conformance matrix (a link, or not its page or rows); "
                                 "sinkscope never overwrites a file it did not write: move it, then run --update-repo "
                                 "again.")
    return page, rows


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` the matrix may not take: the current folder or one above it, a folder inside the
    installed package (or holding it), a file, a folder that exists (without ``--overwrite``) or holds
    anything sinkscope did not write (``fileio.check_replaceable``)."""
    from sinkscope.store.files import check_inputs_outside, check_not_cwd, check_replaceable

    check_not_cwd(out, "the matrix needs", "reports/matrix")
    check_inputs_outside(out, {"the installed sinkscope package": Path(__file__).resolve().parent.parent})
    check_replaceable(out, overwrite, kind="conformance matrix", hint="pass --overwrite")


def write_run_folder(page: str, rows: list[dict], out: Path, overwrite: bool) -> None:
    """``out``/architectures.md and verified.json, staged beside it, recorded (``.sinkscope-files``) and
    renamed into place; on any error ``out`` is left as it was."""
    import shutil
    import tempfile

    from sinkscope.store.files import default_folder_mode, replace_folder, write_inventory

    _check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        os.chmod(stage, default_folder_mode())
        (stage / PAGE).write_text(page, encoding="utf-8")
        (stage / ROWS).write_text(rows_json(rows), encoding="utf-8")
        write_inventory(stage, WRITER)
        _check_out(out, overwrite)  # nothing of anyone else's appeared there while the matrix ran
        replace_folder(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def update_checkout(checkout: str | os.PathLike, page: str, rows: list[dict]) -> tuple[Path, Path]:
    """Rewrite a checkout's ``docs/architectures.md`` and ``verified.json`` (atomically), checked again first."""
    from sinkscope.store.files import atomic_write_text

    page_path, rows_path = checkout_targets(checkout)
    atomic_write_text(page_path, page)
    atomic_write_text(rows_path, rows_json(rows))
    return page_path, rows_path


def main(argv: list[str] | None = None) -> int:
    """``python -m sinkscope.conformance.matrix``: 0 once the matrix is written; a refusal is ``error: `` and one
    sentence on stderr, exit status 1 (130 when interrupted), no traceback (``--debug`` adds it)."""
    from sinkscope.errors import SinkscopeError

    parser = argparse.ArgumentParser(prog="python -m sinkscope.conformance.matrix",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated model types (default, or empty: every causal-LM model type "
                                        "of the installed transformers)")
    parser.add_argument("--out", help="the run folder for architectures.md and verified.json (default: a fresh "
                                      "reports/<time>-conformance-<id> under the current folder)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out when it exists and holds only what sinkscope wrote")
    parser.add_argument("--update-repo", metavar="CHECKOUT",
                        help="maintainers: also rewrite CHECKOUT's docs/architectures.md and "
                             "src/sinkscope/conformance/verified.json (the whole matrix: no --types; CHECKOUT must "
                             "be a sinkscope checkout)")
    parser.add_argument("--no-commands", action="store_true", help="skip running the commands")
    parser.add_argument("--debug", action="store_true", help="print the traceback of a failure")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except SinkscopeError as error:
        if args.debug:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; no file was left half-written.", file=sys.stderr)
        return 130
    except OSError as error:  # a full disk, a read-only place
        if args.debug:
            traceback.print_exc()
        where = f" {error.filename}" if error.filename else ""
        print(f"error: could not write or read{where} ({error.strerror or error}); files already written are "
              "unchanged.", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    """The matrix of ``main``: every check of the options and the output places first, then the rows, then the
    writes."""
    import torch

    from sinkscope.conformance import tiny
    from sinkscope.errors import SinkscopeError
    from sinkscope.store.files import lock_folder
    from sinkscope.store.results import default_run_dir

    named = known_types((args.types or "").split(","))
    if args.update_repo is not None and named:
        raise SinkscopeError("--update-repo rewrites the checkout's whole matrix; run it without --types.")
    if args.update_repo is not None:
        checkout_targets(args.update_repo)
        if Path(args.update_repo).resolve() not in Path(__file__).resolve().parents:
            print(f"note: the matrix runs the sinkscope at {Path(__file__).resolve().parents[1]}, not the one in "
                  f"{args.update_repo}.", file=sys.stderr)
    if named and not any(tiny.classify(t) in CHECKED_CLASSES for t in named):
        classes = ", ".join(f"{t} is {tiny.classify(t)}" for t in named[:4])
        raise SinkscopeError(f"none of --types has softmax attention this matrix checks ({classes}), so nothing would be "
                             "checked; name a type such as llama or opt.")
    out = Path(args.out) if args.out else default_run_dir("conformance")
    _check_out(out, args.overwrite)
    types = named or tiny.model_types()
    threads = torch.get_num_threads()
    with lock_folder(out, kind="conformance matrix"):
        _check_out(out, args.overwrite)  # now that no other writer can change it
        torch.set_num_threads(1)
        rows = []
        try:
            for model_type in types:
                row = check_type(model_type, commands=not args.no_commands)
                rows.append(row)
                print(f"{model_type:28s} {row['class']:18s} {row['status']:5s} {row.get('seconds', '')!s:6s} "
                      f"{row['reason'][:120]}", flush=True)
        finally:
            torch.set_num_threads(threads)
        page = markdown(rows)
        write_run_folder(page, rows, out, args.overwrite)
    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    print(f"{sum(r['status'] == 'pass' for r in checked)} of {len(checked)} checked types pass")
    print(f"wrote {out / PAGE} and {out / ROWS}")
    if args.update_repo is not None:
        written = update_checkout(args.update_repo, page, rows)
        print(f"wrote {written[0]} and {written[1]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
