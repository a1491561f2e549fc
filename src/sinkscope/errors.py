"""The one exception type users see.

Every anticipated failure (missing model, unsupported architecture, too-short text,
an existing run folder, ...) raises :class:`SinkscopeError` with one sentence that says what
happened and what to do. The CLI prints that sentence and exits with ``exit_code`` (1), never
a traceback; :class:`Interrupted` (Ctrl-C) exits 130 wherever it happens.
"""

from __future__ import annotations

import re

#: the command line's flag where it is not the option's name with dashes (a repeated option is singular).
FLAGS = {"probes": "probe", "params": "param", "plugins": "plugin", "cutoffs": "cutoff"}
_OPTION = re.compile("\x02([a-z_0-9]+)(?:=(True|False))?\x03")


def option(name: str, value: bool | None = None) -> str:
    """An option named in a sentence, phrased by whoever shows the sentence (:func:`phrase`): ``--seq-len``
    on the command line and ``seq_len`` in the Python API; a boolean ``value`` names the switch as set
    (``option("figures", False)``: ``--no-figures`` / ``figures=False``)."""
    return f"\x02{name}{'' if value is None else f'={value}'}\x03"


def phrase(message: str, style: str = "cli") -> str:
    """``message`` with its :func:`option` names in the words of ``style``: ``"cli"`` or ``"api"``."""
    def word(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        if style == "api":
            return name if value is None else f"{name}={value}"
        flag = "--" + FLAGS.get(name, name).replace("_", "-")
        return flag if value != "False" else "--no-" + flag[2:]
    return _OPTION.sub(word, message)


class SinkscopeError(RuntimeError):
    """A failure explained in one sentence, meant to be shown to the user as is.

    The sentence names options with :func:`option`; ``str(error)`` phrases them for the command line
    and ``error.phrased("api")`` for the Python API, so one message serves both. ``raw`` keeps the
    names unphrased (for a sentence that quotes another).
    """

    #: the process exit status the CLI uses for this failure
    exit_code = 1

    def __str__(self) -> str:
        return phrase(str(self.args[0]), "cli") if self.args else ""

    @property
    def raw(self) -> str:
        return str(self.args[0]) if self.args else ""

    def phrased(self, style: str) -> str:
        return phrase(self.raw, style)


class Interrupted(SinkscopeError):
    """Ctrl-C, with a sentence saying what was kept; exits 130 like any interrupted command."""

    exit_code = 130


def suggest(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` names, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---- values at the boundary: one rule for the command line, recipes and the Python API ----------------------------
_WHOLE = re.compile(r"[0-9]+")


def whole_number(text) -> int | None:
    """``text`` as a non-negative integer if it is written with the ASCII digits 0-9 alone, else None.

    ``str.isdigit`` also accepts superscripts and other digits (``"²".isdigit()`` is True, and
    ``int("²")`` then raises), so every count a user writes is parsed here.
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text >= 0 else None
    text = str(text).strip()
    return int(text) if _WHOLE.fullmatch(text) else None


def check_field_values(options, style_name=None) -> None:
    """Every int, float and bool field of the dataclass ``options`` holds a value of its declared type,
    and every float is finite: one sentence naming the option otherwise.

    The declared type is the field's annotation (``int``, ``float | None``, ...); fields of other
    types (strings, tuples, unions of several kinds) are left to their own checks. An int is
    accepted where a float is declared; a bool is never a number. Ranges (at least 1, ...) are each
    command's own checks; this is the check every path (CLI, recipe, ``sinkscope.measure``) shares,
    run where the options are made.
    """
    import dataclasses
    import math
    import numbers

    for field in dataclasses.fields(options):
        kind = _declared_kind(field.type)
        if kind is None:
            continue
        value = getattr(options, field.name)
        if value is None and kind[1]:
            continue
        name = style_name(field.name) if style_name else option(field.name)
        if kind[0] == "bool":
            if not isinstance(value, bool):
                raise SinkscopeError(f"{name} must be true or false (got {value!r}).")
            continue
        number = numbers.Real if kind[0] == "float" else numbers.Integral  # numpy's scalars too
        if isinstance(value, bool) or not isinstance(value, number):
            what = "an integer" if kind[0] == "int" else "a number"
            raise SinkscopeError(f"{name} must be {what} (got {value!r}).")
        if kind[0] == "float" and not math.isfinite(value):
            raise SinkscopeError(f"{name} must be a finite number (got {value!r}).")
        plain = int(value) if kind[0] == "int" else (value if isinstance(value, int) else float(value))
        if type(plain) is not type(value):  # a numpy scalar: a plain Python number, as the manifest's JSON needs
            object.__setattr__(options, field.name, plain)


def _declared_kind(annotation) -> tuple[str, bool] | None:
    """("int" | "float" | "bool", None allowed) for an annotation of one such type (optionally ``| None``)."""
    text = str(annotation if isinstance(annotation, str) else getattr(annotation, "__name__", annotation))
    optional = text.startswith("Optional[")
    parts = [part.strip() for part in (text[len("Optional["):-1] if optional else text).split("|")]
    optional = optional or "None" in parts
    kinds = [part for part in parts if part != "None"]
    if len(kinds) == 1 and kinds[0] in ("int", "float", "bool"):
        return kinds[0], optional
    return None


# ---- parameter checks the command line runs before torch loads (a probe's Param and a command's option) --------

_HEAD = re.compile(r"^[0-9]+\.[0-9]+$")  # ASCII digits only (\\d also takes other scripts)


def check_heads(heads: tuple, example: str = "0.3") -> str | None:
    """A ``Param`` check (and a command's option check): every item is a ``LAYER.HEAD`` pair.

    The error phrase shows ``example`` as a well-formed pair (``sinkscope circuit`` subtracts heads of
    layer 0, so its example is 0.3; head_ablation's is 3.1).
    """
    bad = [h for h in heads if not _HEAD.match(str(h))]
    return f"takes LAYER.HEAD pairs such as {example}, not {bad[0]!r}" if bad else None


def check_repeats(repeats: tuple) -> str | None:
    """A ``Param`` check (also ``sinkscope circuit``'s ``--repeats`` check): positive integers including 1
    (the reference)."""
    try:
        values = [int(r) for r in repeats]
    except (TypeError, ValueError):
        return "takes positive integers such as 1,2,4,8"
    if not values or min(values) < 1 or 1 not in values:
        return "takes positive integers including 1 (the reference), such as 1,2,4,8"
    return None


def check_seed(seed, flag: str = option("seed")) -> None:
    """A seed must be a non-negative integer (numpy's generators refuse negative ones)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SinkscopeError(f"{flag} must be a non-negative integer (got {seed}).")
