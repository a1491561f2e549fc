"""Every documented line runs, for real (issue 61; the slow tier of tests/e2e/test_documented_lines.py).

The fast tier parses each line against the CLI with the heavy steps stubbed; here each one runs
through ``sinkscope.cli.app`` in this process (typer's runner: no interpreter start per line), with
the same code a newcomer's copy runs, only smaller:

- **Which lines**: the ``sinkscope`` lines of the code blocks of README.md, docs/getting-started.md,
  docs/explorer.md, docs/lengths.md and docs/commands/*.md, and of every command's ``--help``
  examples (a "page" of its own), as ``tests/doc_lines.py`` extracts them; and the Python blocks of
  README.md, docs/getting-started.md, docs/api.md and docs/explorer.md.
- **A folder per page**, the lines in the page's order, since later lines read earlier outputs
  (``train ... --out ckpt/sinklogit``, then ``sinks ckpt/sinklogit``); a line that reads what a
  later line of its page writes runs after that line (docs/commands/selectivity.md shows its
  comparison before the trainings that make its checkpoints). What no line of the page writes is
  put there first: trainer checkpoints at their initial weights (``ckpt/normgate``, ``ckpt/*-s0``
  as two of them), run folders of a tiny model (``runs/a``; ``runs/zoo`` a comparison), a text
  for ``--text-file book.txt``, README's probe as ``my_probes.py``.
- **Sizes shrunk** (:func:`shrink`): ``--seq-len`` 64, 32 on SmolLM2 (several lengths: 16,32,48,64),
  stream's ``--seq-len``/``--length`` 128 with ``--cache`` values below it, ``--n-seqs`` at most 2 (inject:
  ``--eval-batch 2``), ``--bucket`` 32, ``--steps`` 4 with ``--checkpoint-every 2 --eval-every 2``
  for the trainer, a sweep's seeds cut to two and its variants to two, the toy task's seeds to one;
  a recipe's steps get the same sizes through ``--set``; ``--no-progress`` where a command has it.
  Figures are built with every plotting call but not encoded (the slow tier's other tests encode
  them): encoding is most of a report's time and no documented line is about it.
- **Models**: a hub id is replaced by a tiny folder of the same architecture built from its
  transformers config (``tests/tiny_models.build``: pythia -> gpt_neox, gpt-oss -> gpt_oss,
  Qwen3 -> qwen3, gpt2 -> gpt2), saved with the tests' tokenizer; placeholders (``MODEL``,
  ``path/to/folder``, ``big/model``, ``model.gguf``) by a tiny Llama with SmolLM2's 9 heads (6
  layers), so the heads the docs name (``3.1``, ``5.0``, ``--subtract-head 0.6``) exist. The
  default model (no MODEL) is the bundled SmolLM2 GGUF for the first such line of each command and
  the first Python block that measures (and the one that traces); every later default-model line
  runs on the 9-head tiny Llama instead, named as its MODEL: a shrunk GGUF run takes 2-7 s on 2
  idle cores but 20-80 s when other jobs share them, and there are some 55 such lines.
- **Lines that name a need** (``# needs: weights``/``GPU``/``SLURM``/``Ray cluster``) also run as
  written, offline (``HF_HUB_OFFLINE=1``, an empty Hugging Face cache) on a machine without what
  they need: each must stop with exit 1 and exactly one ``error:`` line, one sentence naming the
  need, no traceback. A weights line then runs on its stand-in; the others only as written.
- ``torchrun`` lines run their ``sinkscope`` part in this process (one process; the launcher is
  the fast tier's and tests/e2e/test_scale_and_resume.py's).
- A line already run on another page with the same words is not run again (its page lists it).

Each line has :data:`LINE_BUDGET_S`; a line over it is reported. Every failure is collected and
reported at the end: the page and line, the words run, the last lines of output. Each run is
printed as it ends, and the slowest and the lines not run at the end. Measured (2 CPU cores shared
with other jobs): about 5 minutes at load average 2-3, 12 minutes at 4-5.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import functools
import glob
import io
import os
import re
import shlex
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import SAMPLE_TEXT, make_tokenizer
from doc_lines import DocLine, all_lines
from repo_paths import REPO
from sinkscope.data.fetch import default_corpus_dir, is_complete_corpus

pytestmark = [
    pytest.mark.slow,  # trains, loads the real SmolLM2
    pytest.mark.skipif(not is_complete_corpus(default_corpus_dir()),
                       reason="bundled corpus not fetched (run `python -m sinkscope.data.fetch`)"),
]

#: seconds one line may take (shrunk, on 2 shared cores); a line over it is reported
LINE_BUDGET_S = 120.0
#: the pages whose shell lines run (the --help examples too)
SHELL_PAGES = ("README.md", "docs/getting-started.md", "docs/explorer.md", "docs/lengths.md", "docs/commands/*.md")
#: the pages whose Python blocks run
PYTHON_PAGES = ("README.md", "docs/getting-started.md", "docs/api.md", "docs/explorer.md")
#: lines of output shown with a failure
TAIL = 8

#: hub ids -> the transformers family of their tiny stand-in (tests/tiny_models.py)
HUB_FAMILIES = (
    (r"EleutherAI/pythia-[\w.-]+", "gpt_neox"),
    (r"openai/gpt-oss-[\w.-]+", "gpt_oss"),
    (r"Qwen/Qwen3-Next-[\w.-]+", "qwen3_next"),
    (r"Qwen/Qwen3-[\w.-]+", "qwen3"),
    (r"Qwen/Qwen2[\w.-]*", "qwen2"),
    (r"gpt2(-medium|-large|-xl)?", "gpt2"),
    (r"(meta-llama|HuggingFaceTB)/[\w.-]+", "llama"),
    (r"mistralai/[\w.-]+", "mistral"),
    (r"google/gemma-3-[\w.-]+", "gemma3_text"),
)
#: words that stand for "your model" -> the 9-head tiny Llama
PLACEHOLDERS = ("MODEL", "path/to/folder", "big/model", "model.gguf")
#: the first folder of a path a line reads or writes
LOCAL_ROOTS = ("ckpt", "runs", "reports", "sweeps", "recipes")
#: run folders the docs name as a comparison's folder
COMPARISON_FOLDERS = ("runs/zoo",)
#: what a glob over checkpoints finds here (``ckpt/*-s0``: two variants; ``runs/ckpt-*``: two seeds of two)
GLOB_STEMS = {"ckpt": ("normgate", "sink+proj"), "runs": ("baseline-s0", "baseline-s1", "sinklogit-s0", "sinklogit-s1")}
#: commands that take the default model when no MODEL is given
MEASURING = ("sinks", "selectivity", "heads", "circuit", "inject", "stream", "measure", "explore")
#: how one need's error sentence names it
NEED_WORDS = {"weights": ("offline", "cache", "hub"), "GPU": ("cuda", "gpu"), "SLURM": ("slurm", "sbatch"),
              "Ray cluster": ("ray",), "TransformerLens 3": ("transformerlens 3",)}
#: sizes of a shrunk run
SEQ_LEN = 64  # above a trainer checkpoint's sliding window of 32 (docs/lengths.md's eviction lines)
SEQ_LEN_GGUF = 32
SEQ_LENS = (16, 32, 48, 64)  # several lengths, as many as the line gives
STREAM_LENGTH = 128
CACHES = (32, 64, 96)
N_SEQS = 2
TRAIN = {"steps": "4", "checkpoint_every": "2", "eval_every": "2"}
#: a recipe's steps, shrunk through --set (by the step's command)
RECIPE_SETS = {"train": {"steps": "4", "checkpoint_every": "2", "eval_every": "2", "progress": "false"},
               "sweep": {"steps": "4", "n_seqs": "2", "eval_windows": "2"},
               "toy": {"steps": "4", "seeds": "[0]"},
               "stream": {"length": str(STREAM_LENGTH), "n_seqs": "1", "progress": "false"},
               **{c: {"seq_len": str(SEQ_LEN_GGUF), "n_seqs": "2", "progress": "false"} for c in MEASURING
                  if c != "stream"}}


# ---- the lines -----------------------------------------------------------------------------------------------


def _on(page: str, patterns) -> bool:
    return any(fnmatch.fnmatch(page, pattern) for pattern in patterns)


@functools.cache
def _lines() -> tuple[DocLine, ...]:
    return tuple(all_lines())


def shell_lines() -> list[DocLine]:
    """The sinkscope lines this test runs: code blocks of SHELL_PAGES and every --help example."""
    return [line for line in _lines() if line.kind == "shell" and line.sinkscope_argv() is not None
            and (line.origin == "help" or (line.origin == "block" and _on(line.page, SHELL_PAGES)))]


def python_blocks() -> list[DocLine]:
    return [line for line in _lines() if line.kind == "python" and line.origin == "block"
            and _on(line.page, PYTHON_PAGES)]


@functools.cache
def _click_app():
    import typer

    from sinkscope.cli import app

    return typer.main.get_command(app)


@dataclass
class Words:
    """A sinkscope line cut into its command, positional words and options (name, word written, value)."""

    command: str
    positional: list[str]
    options: list[list]  # [param name, the option as written, value or None for a flag]

    @classmethod
    def parse(cls, argv: list[str]) -> Words:
        command, rest = argv[0], argv[1:]
        params = {}
        for param in _click_app().commands[command].params:
            for opt in (*param.opts, *getattr(param, "secondary_opts", ())):
                params[opt] = param
        positional, options = [], []
        k = 0
        while k < len(rest):
            word = rest[k]
            name, eq, inline = word.partition("=")
            param = params.get(name) if name.startswith("-") else None
            if param is None:
                positional.append(word)
            elif getattr(param, "is_flag", False) or getattr(param, "count", False):
                options.append([param.name, word, None])
            elif eq:
                options.append([param.name, name, inline])
            else:
                options.append([param.name, word, rest[k + 1] if k + 1 < len(rest) else ""])
                k += 1
            k += 1
        return cls(command, positional, options)

    def argv(self) -> list[str]:
        out = [self.command, *self.positional]
        for _, written, value in self.options:
            out += [written] if value is None else [written, value]
        return out

    def get(self, name: str) -> str | None:
        values = [value for n, _, value in self.options if n == name]
        return values[-1] if values else None

    def values(self, name: str) -> list[str]:
        return [value for n, _, value in self.options if n == name]

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.options)

    def set(self, name: str, value: str, written: str | None = None) -> None:
        """Replace the option's value where given, else add it (only if the command has the option)."""
        found = False
        for option in self.options:
            if option[0] == name:
                option[2] = value
                found = True
        if not found and written and self.takes(name):
            self.options.append([name, written, value])

    def takes(self, name: str) -> bool:
        return any(p.name == name for p in _click_app().commands[self.command].params)

    def models(self) -> list[str]:
        """The MODEL words (positional words of a measuring command, --model of a recipe)."""
        found = list(self.positional) if self.command in MEASURING else []
        return found + self.values("model")


def hub_family(word: str) -> str | None:
    return next((family for pattern, family in HUB_FAMILIES if re.fullmatch(pattern, word)), None)


def looks_like_hub_id(word: str) -> bool:
    return word in ("gpt2",) or bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.+-]+", word)
                                      and word.split("/")[0] not in LOCAL_ROOTS and word not in PLACEHOLDERS
                                      and not word.endswith((".toml", ".py", ".txt", ".gguf")))


def _toml_blocks() -> dict[str, str]:
    """The recipes written in the docs (``# name.toml`` blocks), saved in each page's folder."""
    return {line.name: line.text for line in _lines() if line.kind == "toml" and line.name}


def _recipe_steps(recipe: str) -> list[dict]:
    """A recipe's steps (``command`` and ``options`` each), from recipes/ or the docs' own blocks."""
    import tomllib

    path = REPO / recipe
    data = tomllib.loads(path.read_text(encoding="utf-8") if path.is_file() else _toml_blocks().get(recipe, ""))
    return data.get("steps", [{"command": data.get("command"), "options": data.get("options", {})}])


def uses_default_model(words: Words) -> bool:
    if words.command in MEASURING:
        return not words.positional
    if words.command == "run" and not words.get("model") \
            and not any(v.startswith("model=") for v in words.values("set_")):
        return any(step.get("command") in MEASURING and "model" not in step.get("options", {})
                   for recipe in words.positional for step in _recipe_steps(recipe))
    return False


def _shrink_list(value: str, sizes) -> str:
    return ",".join(str(s) for s in sizes[:max(1, len(value.split(",")))])


def shrink(words: Words, gguf: bool = False) -> Words:
    """The same line with the sizes of a quick run (module docstring); ``gguf``: on the bundled SmolLM2."""
    c = words.command
    if c in MEASURING and c != "stream":
        seq = words.get("seq_len")
        one = SEQ_LEN_GGUF if gguf else SEQ_LEN
        words.set("seq_len", _shrink_list(seq, SEQ_LENS) if seq and "," in seq else str(one), "--seq-len")
        n = words.get("n_seqs")
        words.set("n_seqs", str(min(int(n), N_SEQS)) if n else str(N_SEQS), "--n-seqs")
        if c == "inject":
            words.set("eval_batch", str(N_SEQS), "--eval-batch")
        if c == "explore" and not words.has("n_seqs"):
            words.set("n_seqs", "1", "--n-seqs")
    if c == "stream":
        words.set("length", str(STREAM_LENGTH), "--seq-len")
        cache = words.get("cache")
        words.set("cache", _shrink_list(cache, CACHES) if cache else "64", "--cache")
        if words.get("n_seqs"):
            words.set("n_seqs", str(min(int(words.get("n_seqs")), N_SEQS)))
        if words.get("bucket"):
            words.set("bucket", "32")
    if c in ("train", "sweep", "toy"):
        words.set("steps", TRAIN["steps"], "--steps")
    if c == "train":
        words.set("checkpoint_every", TRAIN["checkpoint_every"], "--checkpoint-every")
        words.set("eval_every", TRAIN["eval_every"], "--eval-every")
    if c == "sweep":
        words.set("n_seqs", str(N_SEQS), "--n-seqs")
        words.set("eval_windows", str(N_SEQS), "--eval-windows")
        if words.get("seeds"):
            words.set("seeds", ",".join(words.get("seeds").split(",")[:2]))
        else:
            words.set("seeds", "0,1", "--seeds")
        variants = words.get("variants") or "baseline,sinklogit,normgate,projgate,sink+norm,sink+proj"
        words.set("variants", ",".join(variants.split(",")[:2]), "--variants")
    if c == "toy":
        words.set("seeds", (words.get("seeds") or "0").split(",")[0], "--seeds")
        words.set("batch_size", "8", "--batch-size")
    if c == "run":
        _shrink_recipe_sets(words)
    if words.takes("progress") and not any(w in ("--progress", "--no-progress") for _, w, _ in words.options):
        words.options.append(["progress", "--no-progress", None])
    return words


def _shrink_recipe_sets(words: Words) -> None:
    """A recipe's steps get the quick sizes through --set (scoped by command when it has several steps)."""
    commands, several = [], False
    for recipe in words.positional:
        steps = _recipe_steps(recipe)
        several = several or len(steps) > 1
        for step in steps:
            if step.get("command") not in commands:
                commands.append(step.get("command"))
    given = {v.partition("=")[0].strip() for v in words.values("set_")}
    for option in words.options:  # the line's own sizes, shrunk
        if option[0] == "set_":
            key = option[2].partition("=")[0].strip()
            scope, _, name = key.rpartition(".")
            sizes = next((RECIPE_SETS[c] for c in ([scope] if scope else commands)
                          if name in RECIPE_SETS.get(c, {})), {})
            if name in sizes and name != "progress":
                option[2] = f"{key}={sizes[name]}"
    for command in commands:
        for key, value in RECIPE_SETS.get(command, {}).items():
            name = f"{command}.{key}" if several else key
            if name not in given and key not in given:
                words.options.append(["set_", "--set", f"{name}={value}"])


# ---- the page folder and its stand-ins -----------------------------------------------------------------------


class StandIns:
    """Tiny models and folders built once per session, copied into each page's folder."""

    def __init__(self, root: Path):
        self.root = root
        self.tokenizer = make_tokenizer()
        self._made: dict[str, Path] = {}

    def _once(self, key: str, make) -> Path:
        if key not in self._made:
            self._made[key] = make(self.root / re.sub(r"[^\w.+-]", "_", key))
        return self._made[key]

    def family(self, family: str) -> Path:
        """A save_pretrained folder of the family's tiny model (tests/tiny_models.py) with the tests' tokenizer."""
        def make(folder):
            from tiny_models import build

            build(family).save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            return folder
        return self._once(f"hf-{family}", make)

    def default(self) -> Path:
        """A tiny Llama with SmolLM2's 9 heads (6 layers), so the heads the docs name exist."""
        def make(folder):
            import torch
            from transformers import LlamaConfig, LlamaForCausalLM

            from tiny_models import VOCAB

            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=VOCAB, hidden_size=144, num_hidden_layers=6, num_attention_heads=9,
                                 num_key_value_heads=3, intermediate_size=288, max_position_embeddings=512)
            LlamaForCausalLM(config).eval().save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            return folder
        return self._once("smollm2-like", make)

    def checkpoint(self, name: str) -> Path:
        """A trainer checkpoint at its initial weights; the variant and seed read off the name (``normgate-s1``)."""
        from sinkscope.models.trainer_config import VARIANTS

        stem = Path(name).name
        match = re.match(r"^(.*?)(?:-s(\d+))?$", stem)
        variant, seed = match.group(1), int(match.group(2) or 0)
        variant = {"sink-proj": "sink+proj"}.get(variant, variant)
        variant = variant if variant in VARIANTS else "baseline"

        def make(folder):
            import torch

            from sinkscope.models.trainer_config import GPTConfig
            from sinkscope.train.checkpoint import save_checkpoint
            from sinkscope.train.model import GPT

            torch.manual_seed(seed)  # the context of --tier tiny (128), as the docs' checkpoints
            model = GPT(GPTConfig(vocab_size=len(self.tokenizer), block_size=128, n_layer=2, n_head=2, n_embd=32,
                                  variant=variant))
            save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=self.tokenizer,
                            meta={"tier": "tiny", "seed": seed})
            (folder / "validation.txt").write_text(SAMPLE_TEXT * 8, encoding="utf-8")
            return folder
        return self._once(f"ckpt-{variant}-s{seed}", make)

    def run_folder(self, name: str) -> Path:
        """A run folder (sinks of the 9-head tiny Llama; ``runs/ckpt-VARIANT-sN`` of that checkpoint; a
        comparison for :data:`COMPARISON_FOLDERS`)."""
        stem = Path(name).name
        if name in COMPARISON_FOLDERS:
            key, models = "comparison", [str(self.default()), str(self.family("gpt_neox"))]
        elif stem.startswith("ckpt-"):
            key, models = stem, [str(self.checkpoint(stem[len("ckpt-"):]))]
        else:
            key, models = "run", [str(self.default())]

        def make(folder):
            result = invoke(["sinks", *models, "--seq-len", "32", "--n-seqs", "2", "--no-figures", "--no-progress",
                             "--out", str(folder)])
            assert result.exit_code == 0, f"the stand-in {name} could not be made:\n{result.output}"
            return folder
        return self._once(f"run-{key}", make)


def invoke(argv: list[str]):
    from click.testing import CliRunner

    return CliRunner().invoke(_click_app(), argv, prog_name="sinkscope")


def _reads(words: Words) -> list[str]:
    """The local paths a line reads: its models and positional paths (checkpoints, run folders) and --text-file."""
    if words.command in ("ls", "run", "train", "sweep", "toy"):
        found = []
    else:
        found = [w for w in words.positional if w.split("/")[0] in LOCAL_ROOTS or "/" in w or w.endswith(".txt")]
    return found + [v for v in words.values("text_file")] + [m for m in words.values("model")]


def _writes(words: Words) -> list[str]:
    out = words.values("out")
    out += [v.partition("=")[2] for v in words.values("set_") if v.partition("=")[0].strip() in ("out", "sinks.out")]
    return [o.rstrip("/") for o in out]


def _matches(read: str, written: str) -> bool:
    return read.rstrip("/") == written or fnmatch.fnmatch(written, read) or read.startswith(written + "/")


@dataclass
class Entry:
    """One line to run in a page's folder."""

    line: DocLine
    words: Words  # what runs
    shown: str = ""  # what stands in for what is written
    after: list[int] = field(default_factory=list)


def prepare_page(folder: Path, entries: list[Entry], stand_ins: StandIns) -> None:
    """Put into ``folder`` what the page's lines read and no line of it writes."""
    (folder / "recipes").symlink_to(REPO / "recipes")
    (folder / "my_probes.py").write_text(_probe_example(), encoding="utf-8")
    for name, text in _toml_blocks().items():
        (folder / name).write_text(text, encoding="utf-8")
    written = [w for e in entries for w in _writes(e.words)]
    for entry in entries:
        for read in _reads(entry.words):
            if any(_matches(read, w) for w in written) or (folder / read).exists() or Path(read).is_absolute():
                continue
            _stand_in(folder, read, stand_ins)


def _stand_in(folder: Path, read: str, stand_ins: StandIns) -> None:
    root = read.split("/")[0]
    targets = [read.replace("*", stem) for stem in GLOB_STEMS.get(root, ())] if "*" in read else [read]
    for target in targets:
        path = folder / target
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if target.endswith(".txt") and root not in LOCAL_ROOTS:
            path.write_text(SAMPLE_TEXT * 40, encoding="utf-8")
        elif root == "ckpt" and target.endswith(".txt"):
            continue  # a checkpoint's own validation.txt comes with it
        elif root == "ckpt":
            shutil.copytree(stand_ins.checkpoint(target), path)
        elif root in ("runs", "reports"):
            shutil.copytree(stand_ins.run_folder(target), path)


def _probe_example() -> str:
    match = re.search(r"<!-- probe-example -->\s*```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"),
                      re.S)
    assert match, "README.md lost its probe example"
    return match.group(1)


def order(entries: list[Entry]) -> list[Entry]:
    """The page's order, except that a line runs after the lines that write what it reads."""
    for k, entry in enumerate(entries):
        reads = _reads(entry.words)
        entry.after = [j for j, other in enumerate(entries) if j != k
                       and any(_matches(r, w) for r in reads for w in _writes(other.words))]
    done, out = set(), []
    while len(out) < len(entries):
        ready = [k for k, e in enumerate(entries) if k not in done and all(j in done for j in e.after)]
        k = ready[0] if ready else min(set(range(len(entries))) - done)  # a cycle: the page's order
        done.add(k)
        out.append(entries[k])
    return out


# ---- running --------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    where: str
    argv: list[str]
    seconds: float
    problem: str | None
    output: str = ""


def _tail(text: str) -> str:
    return "\n".join("      " + row for row in text.strip().splitlines()[-TAIL:])


def _exception_tail(result) -> str:
    if result.exception is None or isinstance(result.exception, SystemExit):
        return ""
    return "".join(traceback.format_exception(result.exception)[-3:])


@contextlib.contextmanager
def probes_kept():
    """The probe registry as it was (every built-in probe), whatever a line's --plugin registers."""
    from sinkscope.probes import discover
    from sinkscope.probes.base import PROBES

    before = dict(discover())
    try:
        yield
    finally:
        PROBES.clear()
        PROBES.update(before)


@contextlib.contextmanager
def offline(empty_cache: Path):
    """HF_HUB_OFFLINE=1 and an empty Hugging Face cache (the variables are read at import, so both ways)."""
    import huggingface_hub.constants as constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HUB_CACHE", str(empty_cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        patch.setattr(constants, "HF_HUB_CACHE", str(empty_cache))
        yield


def run_line(where: str, argv: list[str], env: dict[str, str], writes: list[str] = ()) -> Outcome:
    """One line through the CLI in this process: exit 0, no traceback, its --out written, within the budget."""
    start = time.monotonic()
    with probes_kept(), pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        result = invoke(argv)
    seconds = time.monotonic() - start
    problem = None
    if result.exit_code != 0 or "Traceback" in result.output:
        problem = f"exit {result.exit_code}"
    elif missing := [out for out in writes if not Path(out).exists()]:
        problem = f"exit 0, but {missing[0]} was not written"
    elif seconds > LINE_BUDGET_S:
        problem = f"{seconds:.0f} s, over the budget of {LINE_BUDGET_S:.0f} s"
    return Outcome(where, argv, seconds, problem, result.output + _exception_tail(result))


def check_need(where: str, argv: list[str], need: str, empty_cache: Path) -> Outcome:
    """A marked line run as written offline: exit 1, one error line, one sentence naming the need."""
    start = time.monotonic()
    with probes_kept(), offline(empty_cache):
        result = invoke(argv)
    seconds = time.monotonic() - start
    output = result.output + _exception_tail(result)
    errors = [row for row in result.output.splitlines() if row.startswith("error:")]
    problem = None
    if result.exit_code != 1:
        problem = f"exit {result.exit_code}, not 1"
    elif "Traceback" in output or _exception_tail(result):
        problem = "a traceback"
    elif len(errors) != 1:
        problem = f"{len(errors)} lines start with 'error:', not one"
    elif not re.search(r"[.!?)]$", errors[0].strip()) or _sentences(errors[0]) > 1:
        problem = "the error is not one sentence"
    elif not any(word in errors[0].lower() for word in NEED_WORDS[need]):
        problem = f"the error does not say what is missing ({' / '.join(NEED_WORDS[need])})"
    return Outcome(f"{where} (as written, needs {need})", argv, seconds, problem, output)


def _sentences(text: str) -> int:
    """How many sentences: a stop followed by a capital starts another (``e.g.``/``i.e.`` aside)."""
    return 1 + len(re.findall(r"(?<!\be\.g)(?<!\bi\.e)[.!?]\)?\s+[A-Z]", text))


def need_is_here(need: str) -> bool:
    if need == "GPU":
        import torch

        return torch.cuda.is_available()
    if need == "TransformerLens 3":  # TransformerLens 4 (the test extras') has no HookedTransformer
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:
            return False
        return True
    return False


def plan(lines: list[DocLine], stand_ins: StandIns) -> tuple[dict[str, list[Entry]], list[tuple[DocLine, str]]]:
    """Each page's entries (stand-ins put in, sizes shrunk) and the lines not run here, with why."""
    pages: dict[str, list[Entry]] = {}
    skipped = []
    gguf_commands: set[str] = set()
    for line in lines:
        if re.search(r"<[\w-]+>|\[--", line.text):
            skipped.append((line, "a usage pattern, not a line"))
            continue
        words = Words.parse(line.sinkscope_argv())
        notes = []
        if line.argv()[0].endswith("torchrun"):
            notes.append("torchrun: one process")
        unknown = [w for w in words.models() if looks_like_hub_id(w) and not hub_family(w)]
        if unknown:
            skipped.append((line, f"no tiny stand-in for the hub id {unknown[0]} (add it to HUB_FAMILIES)"))
            continue
        for k, word in enumerate(words.positional):
            if words.command in MEASURING and (hub_family(word) or word in PLACEHOLDERS):
                words.positional[k] = str(stand_ins.family(hub_family(word)) if hub_family(word) else stand_ins.default())
                notes.append(f"{word} -> tiny {hub_family(word) or 'llama, 9 heads'}")
        for option in words.options:
            if option[0] == "model" and (hub_family(option[2]) or option[2] in PLACEHOLDERS):
                family = hub_family(option[2])
                notes.append(f"{option[2]} -> tiny {family or 'llama, 9 heads'}")
                option[2] = str(stand_ins.family(family) if family else stand_ins.default())
        gguf = uses_default_model(words)
        if gguf and words.command in gguf_commands:
            gguf = False
            if words.command == "run":
                words.options.append(["model", "--model", str(stand_ins.default())])
            else:
                words.positional.insert(0, str(stand_ins.default()))
            notes.append("default model -> tiny llama, 9 heads (SmolLM2 ran this command already)")
        elif gguf and line.needs is None:  # a GPU line runs only as written: the next line gets SmolLM2
            gguf_commands.add(words.command)
            notes.append("on the bundled SmolLM2")
        shrink(words, gguf)
        pages.setdefault(line.page, []).append(Entry(line, words, "; ".join(notes)))
    return pages, skipped


def test_documented_lines_run(tmp_path, capsys):
    """Every sinkscope line of the pages and the --help examples runs (module docstring)."""
    import webbrowser

    from sinkscope.report import figures
    from sinkscope.store.files import atomic_write_bytes

    stand_ins = StandIns(tmp_path / "stand-ins")
    stand_ins.root.mkdir()
    (tmp_path / "empty-hf-cache").mkdir()
    pages, skipped = plan(shell_lines(), stand_ins)
    outcomes: list[Outcome] = []
    ran: dict[str, str] = {}  # the words run -> where

    def report(outcome: Outcome) -> None:
        outcomes.append(outcome)
        with capsys.disabled():
            print(_progress(outcome), flush=True)

    start = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(webbrowser, "open", lambda url, *args, **kwargs: True)  # explore --open
        patch.setattr(figures, "_atomic_savefig", lambda _fig, path, fmt, **_: atomic_write_bytes(path, b"figure"))
        for page, entries in pages.items():
            folder = tmp_path / re.sub(r"[^\w.-]", "_", page)
            folder.mkdir()
            patch.chdir(folder)
            skipped += run_page(folder, entries, stand_ins, ran, report)
    total = time.monotonic() - start
    failures = [o for o in outcomes if o.problem]
    with capsys.disabled():
        print(_summary("documented lines run", outcomes, skipped, total, os.getloadavg()))
    assert not failures, "documented lines that do not run:\n" + "\n".join(
        f"{o.where}\n    sinkscope {shlex.join(o.argv)}\n    {o.problem}\n{_tail(o.output)}" for o in failures)


def run_page(folder: Path, entries: list[Entry], stand_ins: StandIns, ran: dict[str, str], report) -> list:
    """One page's lines in ``folder`` (the working directory): its marked lines as written, then every line it
    can run, in :func:`order`; returns the lines not run, with why."""
    skipped = []
    prepare_page(folder, entries, stand_ins)
    for entry in entries:  # marked lines, as written, where what they read is there
        if entry.line.needs:
            report(check_need(entry.line.where, _as_written(entry.line, stand_ins), entry.line.needs,
                              folder.parent / "empty-hf-cache"))
    runnable = [e for e in entries if e.line.needs in (None, "weights") or need_is_here(e.line.needs)]
    skipped += [(e.line, f"needs {e.line.needs}: run as written only") for e in entries if e not in runnable]
    ordered = order(runnable)
    for k, entry in enumerate(ordered):
        key = shlex.join(_canonical(entry.words.argv(), stand_ins))
        read_later = [r for later in ordered[k + 1:] for r in _reads(later.words)]
        if key in ran and not any(_matches(r, w) for r in read_later for w in _writes(entry.words)):
            skipped.append((entry.line, f"the same words ran at {ran[key]}"))
            continue
        outcome = run_line(entry.line.where, _expand_globs(entry.words.argv()), entry.line.env(),
                           _writes(entry.words))
        outcome.where += f"  [{entry.shown}]" if entry.shown else ""
        report(outcome)
        ran.setdefault(key, entry.line.where)
    return skipped


def _as_written(line: DocLine, stand_ins: StandIns) -> list[str]:
    """A marked line's words as written (placeholders such as MODEL or model.gguf stand for a local model)."""
    argv = line.sinkscope_argv()
    return [str(stand_ins.default()) if word in PLACEHOLDERS else word for word in argv]


def _canonical(argv: list[str], stand_ins: StandIns) -> list[str]:
    return [w.replace(str(stand_ins.root), "<stand-ins>") for w in argv]


def _expand_globs(argv: list[str]) -> list[str]:
    """What the shell passes: a word with ``*`` becomes the sorted paths it matches (itself if none)."""
    out = []
    for word in argv:
        matches = sorted(glob.glob(word)) if "*" in word and not word.startswith("-") else []
        out += matches or [word]
    return out


def _progress(outcome: Outcome) -> str:
    said = next((row for row in outcome.output.splitlines() if row.startswith("error:")), "")
    said = f"\n{' ' * 20}{said}" if said and "as written" in outcome.where else ""
    return f"  {outcome.seconds:6.1f} s  {'ok    ' if not outcome.problem else 'FAILED'}  {outcome.where}{said}"


def _summary(title: str, outcomes: list[Outcome], skipped, total: float, load) -> str:
    rows = [f"\n[{title}] {len(outcomes)} runs in {total:.0f} s (load average {load[0]:.1f} {load[1]:.1f} "
            f"{load[2]:.1f}); {sum(1 for o in outcomes if o.problem)} failed; {len(skipped)} not run"]
    for o in sorted(outcomes, key=lambda o: -o.seconds)[:12]:
        rows.append(f"  {o.seconds:6.1f} s  {o.where}")
    for line, why in skipped:
        text = line.text if line.kind == "shell" else f"{line.kind} block"
        rows.append(f"  not run: {line.where}: {text}  ({why})")
    return "\n".join(rows)


# ---- Python blocks ----------------------------------------------------------------------------------------------


def _needs_weights(code: str) -> str | None:
    """The hub id a block names (a string that reads as one), which this test does not download."""
    strings = [node.value for node in ast.walk(ast.parse(code))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return next((text for text in strings if looks_like_hub_id(text)), None)


class _Shrink(ast.NodeTransformer):
    """seq_len= and n_seqs= keywords shrunk, measure's progress bar off; a measure call without a model, or a
    trace of None, reads ``model`` (None: leave the default, the bundled SmolLM2)."""

    def __init__(self, model: str | None):
        self.model = model

    def visit_Call(self, node):
        self.generic_visit(node)
        for keyword in node.keywords:
            if keyword.arg == "seq_len" and isinstance(keyword.value, ast.Constant):
                keyword.value = ast.Constant(32)
            elif keyword.arg == "n_seqs" and isinstance(keyword.value, ast.Constant):
                keyword.value = ast.Constant(min(keyword.value.value, N_SEQS))
        name = ast.unparse(node.func)
        if self.model and name == "sinkscope.measure" and len(node.args) < 2 \
                and not any(k.arg == "model" for k in node.keywords):
            node.keywords.append(ast.keyword("model", ast.Constant(self.model)))
        if self.model and name == "sinkscope.trace" and node.args and ast.unparse(node.args[0]) == "None":
            node.args[0] = ast.Constant(self.model)
        if name == "sinkscope.measure" and not any(k.arg == "progress" for k in node.keywords):
            node.keywords.append(ast.keyword("progress", ast.Constant(False)))
        return node


def shrink_block(code: str, model: str | None) -> str:
    tree = ast.fix_missing_locations(_Shrink(model).visit(ast.parse(code)))
    return ast.unparse(tree)


def test_documented_python_blocks_run(tmp_path, capsys):
    """The Python blocks of README.md, getting-started, api.md and explorer.md run, sizes shrunk; the first
    that measures and the first that traces use the bundled SmolLM2, the others the 9-head tiny Llama."""
    from sinkscope.report import figures
    from sinkscope.store.files import atomic_write_bytes

    stand_ins = StandIns(tmp_path / "stand-ins")
    stand_ins.root.mkdir()
    outcomes, skipped, ran = [], [], {}
    on_gguf: set[str] = set()
    start = time.monotonic()
    for k, block in enumerate(python_blocks()):
        hub_id = _needs_weights(block.text)
        if hub_id:
            skipped.append((block, f"needs weights ({hub_id})"))
            continue
        if block.text in ran:
            skipped.append((block, f"the same block ran at {ran[block.text]}"))
            continue
        ran[block.text] = block.where
        uses = {api for api in ("measure", "trace") if f"sinkscope.{api}(" in block.text}
        model = None if not uses or not (uses & on_gguf) else str(stand_ins.default())
        on_gguf |= uses
        code = shrink_block(block.text, model)
        folder = tmp_path / f"block-{k}"
        folder.mkdir()
        printed = io.StringIO()
        begin = time.monotonic()
        problem = None
        with probes_kept(), pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)
            patch.setattr(figures, "_atomic_savefig", lambda _fig, path, fmt, **_: atomic_write_bytes(path, b"figure"))
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(code, block.where, "exec"), {"__name__": f"block_{k}"})
            except Exception as error:  # noqa: BLE001 - every failure is collected
                problem = f"{type(error).__name__}: {error}"
                printed.write(traceback.format_exc())
        seconds = time.monotonic() - begin
        if problem is None and seconds > LINE_BUDGET_S:
            problem = f"{seconds:.0f} s, over the budget of {LINE_BUDGET_S:.0f} s"
        note = "  [on the bundled SmolLM2]" if uses and model is None else ("  [tiny llama, 9 heads]" if uses else "")
        outcomes.append(Outcome(block.where + note, ["python"], seconds, problem, printed.getvalue()))
    total = time.monotonic() - start
    with capsys.disabled():
        print(_summary("documented Python blocks run", outcomes, skipped, total, os.getloadavg()))
    failures = [o for o in outcomes if o.problem]
    assert not failures, "documented Python blocks that do not run:\n" + "\n".join(
        f"{o.where}\n    {o.problem}\n{_tail(o.output)}" for o in failures)
