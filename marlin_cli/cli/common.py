"""What every command shares: option types, the progress display, and output (tables to stderr, JSON to stdout)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

if TYPE_CHECKING:
    from marlin_cli.pipeline import Progress as Event

# A log (stderr not a terminal, no COLUMNS) has no width: tables and lines keep their natural width there instead of
# rich's default 80 columns, which folded each layer name over several lines of a CI job's log. No markup: paths,
# layer names and error texts are printed as they are (rich would drop "[v2]" from a path); colour goes in as Text.
LOG_WIDTH = 1000
err_console = Console(
    stderr=True, markup=False, width=None if sys.stderr.isatty() or "COLUMNS" in os.environ else LOG_WIDTH
)


def flagged(flag: str, style: str, message: str = "") -> Text:
    """`flag` in colour, then `message` as it is: "error: ...", "FAIL ..."."""
    return Text.assemble((flag, style), f" {message}" if message else "")


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout (logs stay on stderr).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists (it is swapped in atomically).")]
DeviceOpt = Annotated[
    str | None,
    typer.Option("--device", help="Where to compute: cpu, cuda or cuda:N. \\[default: cuda when present, else cpu]"),
]
ShardOpt = Annotated[
    str, typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 5GB, 500MB, or bytes.")
]
OutputArg = Annotated[
    Path, typer.Argument(help="Directory to write; created atomically, never over an existing one without --force.")
]


def memory() -> str:
    """Peak host and GPU memory so far, for the progress line."""
    from marlin_cli.pipeline import peak_memory

    peak = peak_memory()
    text = f"host {peak['peak_host_gib']:.1f} GiB"
    if peak["peak_gpu_gib"] is not None:
        text += f", gpu {peak['peak_gpu_gib']:.1f} GiB"
    return text


# Seconds between a stage's progress lines in a log.
LOG_INTERVAL = 30.0


class ProgressView:
    """Progress on stderr, one entry per pipeline stage; usable as the pipeline's on_progress callback. In a terminal,
    rich progress bars. In a log (stderr not a terminal), where rich would draw the bars only once, at the end, a
    line when a stage starts, when it ends and at most every LOG_INTERVAL seconds between, so that a long run in a CI
    job shows where it is."""

    def __init__(self, enabled: bool = True) -> None:
        self.lines = enabled and not err_console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}", markup=False),  # as markup, "[host 0.6 GiB]" would vanish
            console=err_console,
            disable=not enabled or self.lines,
        )
        self.tasks: dict[str, TaskID] = {}
        self.started: dict[str, float] = {}  # stage -> when its first event came
        self.last_line: dict[str, float] = {}  # stage -> when its last line was printed

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.progress.stop()

    def __call__(self, event: Event) -> None:
        detail = f"{event.detail}  [{memory()}]"
        if self.lines:
            self.line(event, detail)
            return
        if event.stage not in self.tasks:
            self.tasks[event.stage] = self.progress.add_task(event.stage, total=event.total, detail=detail)
        self.progress.update(self.tasks[event.stage], completed=event.done, total=event.total, detail=detail)

    def line(self, event: Event, detail: str) -> None:
        now = time.monotonic()
        start = self.started.setdefault(event.stage, now)
        last = self.last_line.get(event.stage)
        if last is None or event.done >= event.total or now - last >= LOG_INTERVAL:
            self.last_line[event.stage] = now
            elapsed = timedelta(seconds=int(now - start))
            err_console.print(
                f"{event.stage:<10} {event.done}/{event.total} {elapsed} {detail}",
                highlight=False,
                soft_wrap=True,
            )


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 2)


def note_kernel_build(device: str | None) -> None:
    """Say so when work on `device` (--device; default the GPU when there is one) is about to compile the CUDA
    kernels: the first use on this GPU, or after an upgrade."""
    from marlin_cli.config import default_device
    from marlin_cli.kernel import build

    if default_device(device).type == "cuda" and build.needs_build():
        err_console.print(
            "compiling the CUDA kernels for this GPU (first use: about a minute; cached afterwards; "
            "`marlin build-kernels` does it ahead of time)",
            highlight=False,
        )
