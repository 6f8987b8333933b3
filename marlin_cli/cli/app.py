"""The `marlin` command: wires the subcommands, maps errors to exit codes (0 ok, 1 failed, 2 bad input, 3 internal)."""

from __future__ import annotations

import inspect
import os
import signal
import sys
from collections.abc import Callable
from importlib.metadata import version
from typing import Annotated

import typer

from marlin_cli import __version__
from marlin_cli.cli.build_kernels import build_kernels_command
from marlin_cli.cli.common import err_console, flagged
from marlin_cli.cli.inspect import inspect_command
from marlin_cli.cli.pack import pack_command
from marlin_cli.cli.quantize import EXAMPLES, quantize_command
from marlin_cli.cli.verify import verify_command
from marlin_cli.errors import MarlinError

app = typer.Typer(
    name="marlin",
    help="Quantize Hugging Face models to 4-bit Marlin-format safetensors, and verify them with the bundled kernel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:  # the versions a conversion job's log should carry
        print(f"marlin {__version__} (torch {version('torch')}, transformers {version('transformers')})")
        raise typer.Exit


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", help="Print the versions and exit.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    pass


def _add_command(name: str, command: Callable[..., None], epilog: str | None = None) -> None:
    """Register `command` with its docstring's paragraphs each on one line: Typer's help keeps the source's line
    breaks, which would leave ragged paragraphs at any terminal width."""
    paragraphs = inspect.cleandoc(command.__doc__ or "").split("\n\n")
    app.command(name, help="\n\n".join(" ".join(p.split()) for p in paragraphs), epilog=epilog)(command)


_add_command("quantize", quantize_command, epilog=EXAMPLES)
_add_command("pack", pack_command)
_add_command("verify", verify_command)
_add_command("inspect", inspect_command)
_add_command("build-kernels", build_kernels_command)

INTERNAL_ERROR = 3


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so every cleanup on the way out runs (partial output is removed)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def _quiet_transformers() -> None:
    """Our progress bars and errors replace transformers' logging and bars: said before it is imported (the commands
    import it when they need it, so `--help` starts in a fraction of a second), or to it if it is loaded already."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if (transformers := sys.modules.get("transformers")) is not None:
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


def _out_of_gpu_memory(e: BaseException) -> bool:
    torch = sys.modules.get("torch")  # not loaded: the error is not torch's
    return torch is not None and isinstance(e, torch.OutOfMemoryError)


def main() -> None:
    """Entry point: a MarlinError is one line on stderr and its exit code; anything else is an internal error."""
    _quiet_transformers()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        app(standalone_mode=True)
    except MarlinError as e:
        err_console.print(flagged("error:", "red", str(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, Terminated) as e:
        err_console.print("interrupted; no output was left behind")
        sys.exit(143 if isinstance(e, Terminated) else 130)
    except Exception as e:
        if _out_of_gpu_memory(e):
            err_console.print(
                flagged(
                    "error:",
                    "red",
                    "the GPU ran out of memory; nothing was written. Lower --nsamples or --seqlen, free the GPU, or "
                    "run with --device cpu",
                ),
                soft_wrap=True,
            )
            sys.exit(2)
        if os.environ.get("MARLIN_DEBUG"):  # a bug: say so, keep the traceback one variable away
            raise
        err_console.print(
            flagged("internal error:", "red", f"{type(e).__name__}: {e} (set MARLIN_DEBUG=1 for the traceback)"),
            soft_wrap=True,
        )
        sys.exit(INTERNAL_ERROR)
