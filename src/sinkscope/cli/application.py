"""The ``sinkscope`` app and its error policy: every anticipated failure is a
:class:`~sinkscope.errors.SinkscopeError` whose one sentence is printed as ``error: ...`` with exit
code 1 (never a traceback); Ctrl-C exits 130 and SIGTERM 143 wherever they land, with the sentence
that says what was kept and how to resume.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Annotated

import typer
from typer.core import TyperGroup

from sinkscope.errors import Interrupted, SinkscopeError


class _Sinkscope(TyperGroup):
    """The app's group: ``--debug``, a global option, is taken wherever it stands on the line (before a
    ``--``): ``sinkscope sinks MODEL --debug`` is ``sinkscope --debug sinks MODEL``, for every command."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, debug_first(args))


def debug_first(args: list[str]) -> list[str]:
    """``args`` with every ``--debug`` before a ``--`` moved to the front, where the app's callback reads it."""
    end = args.index("--") if "--" in args else len(args)
    kept = [arg for arg in args[:end] if arg != "--debug"]
    return list(args) if len(kept) == end else ["--debug", *kept, *args[end:]]


app = typer.Typer(
    cls=_Sinkscope,
    name="sinkscope",
    help="Measure attention sinks in causal language models.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)
# Examples in the commands' help are paragraphs that open with a line holding only ``\b``: click
# prints such a paragraph as written instead of rewrapping it, so every example can be pasted.


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("sinkscope")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from sinkscope.version import __version__ as number
    typer.echo(f"sinkscope {number}")
    raise typer.Exit()


@app.callback()
def _global_options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", envvar="SINKSCOPE_DEBUG",
                                        help="Print the traceback behind an error (a plugin's, say) before its sentence.")] = False,
) -> None:
    """Measure attention sinks in causal language models."""
    _state["debug"] = debug


#: what the global options set for the command that runs (the callback runs before each command).
_state = {"debug": False}


def _echo_traceback(error: BaseException) -> None:
    """Under --debug: the error's traceback, with what caused it (a plugin's own frames)."""
    if _state["debug"]:
        import traceback

        typer.echo("".join(traceback.format_exception(error)).rstrip(), err=True)



class _Stop:
    """The signal that stopped the command (None: Ctrl-C or still running)."""

    signal_name: str | None = None


def _on_stop_signal(signum, _frame):
    _Stop.signal_name = signal.Signals(signum).name
    raise KeyboardInterrupt  # the Ctrl-C paths: progress kept, the sentence that says how to resume


@contextlib.contextmanager
def _stop_signals():
    """SIGTERM (a scheduler's stop, `kill`) ends a command as Ctrl-C does, with its sentence, exit 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Stop.signal_name = None
    previous = signal.signal(signal.SIGTERM, _on_stop_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted() -> tuple[str, int]:
    """("interrupted", 130) after Ctrl-C; ("stopped by SIGTERM", 143) after SIGTERM (128 + 15)."""
    name = _Stop.signal_name
    return (f"stopped by {name}", 128 + signal.Signals[name].value) if name else ("interrupted", 130)


def _friendly_errors(func):
    """Turn anticipated failures into one sentence on stderr and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with _stop_signals():
                return func(*args, **kwargs)
        except typer.Exit:  # the command's own exit code (an interrupted training's 130), already explained
            raise
        except SinkscopeError as error:
            _echo_traceback(error)
            message, code = str(error), error.exit_code  # 1; 130 for an interrupted run (errors.Interrupted)
            if isinstance(error, Interrupted) and _Stop.signal_name:
                word, code = _interrupted()
                message = message.replace("interrupted", word, 1)
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(code) from None
        except KeyboardInterrupt:
            word, code = _interrupted()
            typer.echo(f"error: {word}; no run folder was written.", err=True)
            raise typer.Exit(code) from None
        except BrokenPipeError:  # `sinkscope ls probes | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except OSError as error:  # a full disk, a read-only or blocked output path, ...
            if isinstance(error, ConnectionError):  # a network peer, not a file: the last line of defence below
                _unforeseen(error)
            _echo_traceback(error)
            where = f" {error.filename}" if error.filename else ""
            typer.echo(f"error: could not write or read{where} ({error.strerror or error}); "
                       "results already written are unchanged.", err=True)
            raise typer.Exit(1) from None
        except Exception as error:
            if not _is_out_of_memory(error):
                _unforeseen(error)
            typer.echo("error: out of memory; lower --batch-size or --seq-len, or use a larger device.", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _unforeseen(error: BaseException) -> None:
    """The last line of defence: an exception no check foresaw is one sentence naming it (its
    traceback under --debug), exit 1; results already written stay as they are."""
    _echo_traceback(error)
    text = (str(error).strip().splitlines() or [""])[0][:300]
    what = f"{type(error).__name__}: {text}" if text else type(error).__name__
    hint = "" if _state["debug"] else "; rerun with --debug to see the traceback"
    typer.echo(f"error: sinkscope stopped on an unexpected {what} (a bug, or input no check foresaw{hint}); "
               "results already written are unchanged.", err=True)
    raise typer.Exit(1) from None


def _is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError, recognised without importing torch (commands import it lazily)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.OutOfMemoryError)

