"""The conformance matrix: every causal-LM model type of the installed transformers, checked by machine.

    python -m sinkscope.conformance.matrix [--types llama,opt] [--out docs/architectures.md]

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

The result is ``docs/architectures.md`` (one row per model type: class, status, attention path,
hook points missing, reason for a failure) and ``verified.json`` beside this module (read by
``sinkscope ls families``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

VERIFIED = Path(__file__).with_name("verified.json")
#: classes whose models have softmax attention to check.
CHECKED_CLASSES = ("decoder", "hybrid", "multimodal-decoder")
TOLERANCE = 1e-5
COMMANDS = ("sinks", "heads", "inject", "circuit")


def read_verified() -> list[dict]:
    """The last matrix's rows (``verified.json``), or the first families when it has not run."""
    try:
        rows = json.loads(VERIFIED.read_text(encoding="utf-8"))["rows"]
        return [row for row in rows if row.get("class") in CHECKED_CLASSES]
    except (OSError, ValueError, KeyError):
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

    from sinkscope.capture.discover import discover
    from sinkscope.capture.families import find_submodule, get_submodule

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

    from sinkscope.capture.families import find_submodule, get_submodule

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

    import sinkscope

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
        table = sinkscope.measure(["p0_mass", "phantom_mass", "sink_rate"], model, windows=ids.numpy(),
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

    from sinkscope.capture import capture
    from sinkscope.capture import hooks as hp
    from sinkscope.capture.discover import discover
    from sinkscope.capture.families import find_submodule, get_submodule
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
    import sinkscope
    from sinkscope.errors import SinkscopeError

    done = []
    for command in (*COMMANDS, *(("selectivity",) if gated else ())):  # (inject: one condition; circuit: r = 1)
        options = {"doses": "0.4", "junk": "gaussian", "cutoffs": "median"} if command == "inject" else {}
        if command == "circuit":
            options = {"repeats": (1,), "bos_token_id": 1}
        try:
            sinkscope.measure(command, model, windows=ids.numpy(), **options)
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


def check_type(model_type: str, commands: bool = True) -> dict:
    """The matrix row of one model type."""
    import torch

    from sinkscope.conformance import tiny
    from sinkscope.runner import check_capture

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
    """docs/architectures.md: the counts, then one row per model type."""
    import transformers

    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    passed = [r for r in checked if r["status"] == "pass"]
    lines = [
        "# Architectures: the conformance matrix",
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
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    import torch

    from sinkscope.conformance import tiny

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated model types (default: all)")
    parser.add_argument("--out", default="docs/architectures.md")
    parser.add_argument("--no-commands", action="store_true", help="skip running the commands")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    types = args.types.split(",") if args.types else tiny.model_types()
    rows = []
    for model_type in types:
        row = check_type(model_type, commands=not args.no_commands)
        rows.append(row)
        print(f"{model_type:28s} {row['class']:18s} {row['status']:5s} {row.get('seconds', '')!s:6s} {row['reason'][:120]}",
              flush=True)
    if not args.types:
        write_markdown(rows, Path(args.out))
        VERIFIED.write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    print(f"{sum(r['status'] == 'pass' for r in checked)} of {len(checked)} checked types pass")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
