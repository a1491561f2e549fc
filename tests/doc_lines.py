"""Every documented line: the shell commands and Python blocks of README.md, docs/ (docs/*.md,
docs/commands/, docs/results/, the tutorial notebook) and the CLI's ``--help`` examples, read as a
newcomer copies them (issue 61). ``tests/e2e/test_documented_lines.py`` parses each against the code
(fast tier) and runs each (slow tier).

What counts as a documented line:

- **shell**: a line of a code block (fenced ```` ```bash ````/plain, or indented by 4 spaces) whose
  program is ``sinkscope``, ``.venv/bin/sinkscope``, ``torchrun``, ``python``, ``make``, ``pip`` or
  ``bash`` (after ``NAME=value`` assignments); ``\\`` continuations are joined, and a ``for V in a b;
  do ... done`` loop gives one line per value. Other lines of such blocks (a folder listing, an error
  message, a generated batch script) are output, not commands.
- **inline**: a code span in prose that is a whole ``sinkscope COMMAND ...`` line (a synopsis with
  ``[``, ``...``, ``<`` or ``|`` is a usage pattern, not a line), and every dotted name
  ``sinkscope.a.b`` in a code span or block (it must resolve).
- **python**: a fenced ```` ```python ```` block, or a code cell of the notebook.
- **js**: a fenced ```` ```js ```` block (the explorer's console API).
- **toml**: a fenced ```` ```toml ```` block whose first line names its file (``# name.toml``).
- **help**: the lines of the ``\\b`` example paragraphs of every command's docstring.

A line that cannot run offline on a CPU says so in its trailing comment, with ``needs:`` and one of
:data:`NEEDS` (``# needs: weights`` for a hub model, ``# needs: GPU``, ``# needs: SLURM``,
``# needs: TransformerLens 3`` for ``--loader transformer-lens``,
``# needs: Ray cluster``); the marker may follow other words of the comment (``# one page; needs:
weights``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from repo_paths import REPO

#: what a marked line needs
NEEDS = ("weights", "GPU", "SLURM", "Ray cluster", "TransformerLens 3")
#: the pages read: the README and every page of the site
PAGES = ("README.md", "docs/*.md", "docs/commands/*.md", "docs/results/*.md", "recipes/README.md")
NOTEBOOK = "docs/tutorial.ipynb"
#: the programs whose lines are commands
PROGRAMS = ("sinkscope", ".venv/bin/sinkscope", "torchrun", ".venv/bin/torchrun", "python", "python3",
            ".venv/bin/python", "make", "pip", "bash")
_NEEDS_RE = re.compile(r"needs: (" + "|".join(re.escape(n) for n in NEEDS) + r")")
#: a dotted name; one cut short (``sinkscope.cap...``, a truncated docstring in a tree) is no name
_DOTTED = re.compile(r"(?<![\w./])sinkscope(?:\.[A-Za-z_]\w*+)++(?!\.\.)")


@dataclass
class DocLine:
    """One documented line (or block).

    Attributes:
        where: ``page:line`` (``sinkscope CMD --help`` for a help example, ``docs/tutorial.ipynb:cell N``).
        page: the page (the help's command name for a help example).
        kind: ``shell``, ``python``, ``js`` or ``toml``.
        origin: ``block``, ``inline``, ``help`` or ``notebook``.
        text: the command (one logical line, without its comment) or the block's code.
        comment: the trailing comment of a shell line (``# ...`` without the ``#``).
        needs: what the line's marker says it needs (:data:`NEEDS`), or None.
        name: a toml block's file name.
    """

    where: str
    page: str
    kind: str
    origin: str
    text: str
    comment: str = ""
    needs: str | None = None
    name: str | None = None
    extra: dict = field(default_factory=dict)

    def argv(self) -> list[str]:
        """The shell line's words (shlex), without leading ``NAME=value`` assignments."""
        words = shlex.split(self.text)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        return words

    def env(self) -> dict[str, str]:
        """The leading ``NAME=value`` assignments of a shell line."""
        out = {}
        for word in shlex.split(self.text):
            match = re.match(r"^([A-Z_][A-Z0-9_]*)=(.*)$", word)
            if not match:
                break
            out[match.group(1)] = match.group(2)
        return out

    def sinkscope_argv(self) -> list[str] | None:
        """The arguments after ``sinkscope`` (``sinkscope``, ``.venv/bin/sinkscope``, ``python -m
        sinkscope``, ``torchrun ... -m sinkscope``), or None for another program."""
        words = self.argv()
        if not words:
            return None
        if words[0] in ("sinkscope", ".venv/bin/sinkscope"):
            return words[1:]
        if "-m" in words and words[0] in ("python", "python3", ".venv/bin/python", "torchrun", ".venv/bin/torchrun"):
            at = words.index("-m")
            if at + 1 < len(words) and words[at + 1] == "sinkscope":
                return words[at + 2:]
        return None

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment): the comment starts at the first ``#`` outside quotes that follows a space."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _needs(comment: str) -> str | None:
    match = _NEEDS_RE.search(comment)
    return match.group(1) if match else None


def _is_command(text: str) -> bool:
    try:
        words = shlex.split(text)
    except ValueError:
        return False
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    return bool(words) and words[0] in PROGRAMS


def shell_lines(lines: list[tuple[int, str]], page: str, origin: str) -> list[DocLine]:
    """The commands of a code block (``(line number, text)`` pairs, indentation removed)."""
    out: list[DocLine] = []
    logical: list[tuple[int, str]] = []  # (first line number, joined text)
    pending, first = "", None
    for number, raw in lines:
        text = raw.rstrip()
        if first is None:
            first = number
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        logical.append((first, pending + text.strip()))
        pending, first = "", None
    if pending:
        logical.append((first, pending.strip()))
    i = 0
    while i < len(logical):
        number, text = logical[i]
        loop = re.match(r"^for (\w+) in (.+?); do$", text.strip())
        if loop:
            name, values = loop.group(1), loop.group(2).split()
            body = []
            i += 1
            while i < len(logical) and logical[i][1].strip() != "done":
                body.append(logical[i])
                i += 1
            for value in values:
                for inner_number, inner in body:
                    command, comment = split_comment(inner.strip())
                    command = command.replace(f"${name}", value).replace("${" + name + "}", value)
                    if _is_command(command):
                        out.append(DocLine(f"{page}:{inner_number}", page, "shell", origin, command, comment,
                                           _needs(comment), extra={"loop": f"{name}={value}"}))
            i += 1
            continue
        command, comment = split_comment(text.strip())
        if _is_command(command):
            out.append(DocLine(f"{page}:{number}", page, "shell", origin, command, comment, _needs(comment)))
        i += 1
    return out


_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _inline(text: str, number: int, page: str) -> list[DocLine]:
    """The command lines and dotted names of a prose line's code spans."""
    out = []
    for span in _SPAN.findall(text):
        span = span.strip()
        if re.match(r"^(sinkscope|\.venv/bin/sinkscope) [a-z]", span) and not re.search(r"\[|\.\.\.|<|\||…", span):
            command, comment = split_comment(span)
            out.append(DocLine(f"{page}:{number}", page, "shell", "inline", command, comment, _needs(comment)))
        for name in _DOTTED.findall(span):
            out.append(DocLine(f"{page}:{number}", page, "name", "inline", name))
    return out


def markdown_lines(text: str, page: str, first_line: int = 1, origin: str = "block") -> list[DocLine]:
    """Every documented line of one markdown text."""
    out: list[DocLine] = []
    lines = text.split("\n")
    i = 0
    blank_before = True
    while i < len(lines):
        line = lines[i]
        number = first_line + i
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            indent, mark, lang = len(fence.group(1)), fence.group(2), fence.group(3).lower()
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(mark):
                body.append((first_line + i, lines[i][indent:] if lines[i][:indent].isspace() else lines[i]))
                i += 1
            i += 1
            code = "\n".join(b for _, b in body)
            if lang in ("python", "py"):
                out.append(DocLine(f"{page}:{number}", page, "python", origin, code))
            elif lang in ("js", "javascript"):
                out.append(DocLine(f"{page}:{number}", page, "js", origin, code))
            elif lang == "toml":
                named = re.match(r"^#\s*(\S+\.toml)", code.strip())
                out.append(DocLine(f"{page}:{number}", page, "toml", origin, code,
                                   name=named.group(1) if named else None))
            elif lang in ("", "bash", "sh", "shell", "console", "text"):
                out += shell_lines(body, page, origin)
            out += [DocLine(f"{page}:{n}", page, "name", origin, name)
                    for n, b in body for name in _DOTTED.findall(b)]
            blank_before = False
            continue
        if blank_before and line.startswith("    ") and line.strip():
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                if lines[i].strip() or (i + 1 < len(lines) and lines[i + 1].startswith("    ")):
                    body.append((first_line + i, lines[i][4:]))
                i += 1
            out += shell_lines(body, page, origin)
            out += [DocLine(f"{page}:{n}", page, "name", origin, name)
                    for n, b in body for name in _DOTTED.findall(b)]
            blank_before = False
            continue
        out += _inline(line, number, page)
        blank_before = not line.strip()
        i += 1
    return out


def page_paths() -> list[Path]:
    seen = []
    for pattern in PAGES:
        for path in sorted(REPO.glob(pattern)):
            if path not in seen:
                seen.append(path)
    return seen


def notebook_lines() -> list[DocLine]:
    """The notebook's code cells (python) and the lines of its markdown cells."""
    nb = json.loads((REPO / NOTEBOOK).read_text(encoding="utf-8"))
    out = []
    for k, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        where = f"{NOTEBOOK}:cell {k}"
        if cell["cell_type"] == "code":
            out.append(DocLine(where, NOTEBOOK, "python", "notebook", source))
            out += [DocLine(where, NOTEBOOK, "name", "notebook", name) for name in _DOTTED.findall(source)]
        elif cell["cell_type"] == "markdown":
            for line in markdown_lines(source, NOTEBOOK):
                line.where = f"{where}, line {line.where.rsplit(':', 1)[1]}"
                out.append(line)
    return out


def help_lines() -> list[DocLine]:
    """The ``\\b`` example paragraphs of every command's docstring (what ``sinkscope CMD --help`` prints)."""
    import inspect

    from sinkscope.cli import app

    out = []
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.lower().replace("_", "-")
        doc = inspect.getdoc(info.callback) or ""
        paragraphs = re.split(r"\n\s*\n", doc)
        for paragraph in paragraphs:
            rows = paragraph.split("\n")
            if rows[0].strip() != "\b":
                continue
            body = [(0, row.strip()) for row in rows[1:] if row.strip()]
            for line in shell_lines(body, f"sinkscope {name} --help", "help"):
                line.where = f"sinkscope {name} --help"
                out.append(line)
    return out


def all_lines() -> list[DocLine]:
    """Every documented line: the pages, the notebook, the help."""
    out = []
    for path in page_paths():
        out += markdown_lines(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    return out + notebook_lines() + help_lines()
