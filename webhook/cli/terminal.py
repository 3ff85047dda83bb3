"""How `dra-guard` writes to the user: its messages on stderr (say, fail), wrapped on a terminal,
and a progress display.

Both depend on the stream being a TTY (``isatty()``); in pipes and files the output is exactly
what the renderers return (scripts and CI logs parse it), and there is no progress display.
No colour is used anywhere, so there is nothing for NO_COLOR or a --no-color flag to turn off.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import threading
from types import TracebackType
from typing import IO, Any, Final

#: the environment variable that sets how many seconds an audit runs before its progress shows
PROGRESS_DELAY_ENV: Final = "DRA_GUARD_PROGRESS_DELAY"
PROGRESS_DELAY_SECONDS: Final = 2.0


def is_terminal(stream: IO[str]) -> bool:
    """Whether `stream` is a TTY (False for pipes, files, and streams without a file descriptor)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def wrap(text: str, width: int) -> str:
    """`text` with every line of prose longer than `width` columns wrapped at spaces; the continuation
    lines are indented 2 columns more than the line itself, so they stay under their heading (a
    finding's row, a drain-plan item). Words longer than a line (URLs, object names) are never split.
    Lines that fit, and table rows (two spaces in a row after the indent: aligned columns), are
    returned unchanged."""
    out = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if len(line) <= width or "  " in body:
            out.append(line)
            continue
        indent = line[: len(line) - len(body)]
        out.append(
            textwrap.fill(
                body,
                width=width,
                initial_indent=indent,
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def for_stream(text: str, stream: IO[str]) -> str:
    """`text` wrapped to the terminal's width (shutil.get_terminal_size: $COLUMNS, else the TTY's
    size) when `stream` is a TTY; else `text` itself, byte for byte."""
    if not is_terminal(stream):
        return text
    return wrap(text, max(shutil.get_terminal_size().columns, 20))


def say(kind: str, message: str) -> None:
    """Print "dra-guard: KIND: MESSAGE" on stderr, each line of `message` on a line of its own
    (wrapped to the width of a terminal; as-is in pipes and files)."""
    for line in message.split("\n"):
        print(for_stream(f"dra-guard: {kind}: {line}", sys.stderr), file=sys.stderr)


def fail(message: str) -> int:
    """Print the error `message` (one line each if it has several, e.g. a ConfigError's) and return 2."""
    say("error", message)
    return 2


def progress_delay() -> float:
    """Seconds before the progress display shows ($DRA_GUARD_PROGRESS_DELAY, default 2; 0: at once).

    Raises ValueError naming the variable when it is not a number >= 0.
    """
    raw = os.environ.get(PROGRESS_DELAY_ENV, "")
    if not raw:
        return PROGRESS_DELAY_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"{PROGRESS_DELAY_ENV}: must be a number of seconds >= 0; got {raw!r}")
    return value


class Progress:
    """A one-line progress display on a TTY (rich.progress: spinner, what is being done, elapsed
    time), shown only once the work has lasted `delay` seconds and erased when it ends.

    rich redraws the line from a thread of its own, so the spinner and the elapsed time move
    while one long step (parsing a 10 MB file, judging its objects) gives no news. Only stderr is
    redirected through it (lines printed meanwhile appear above it); stdout is left alone.
    Use as a context manager; step(text) says what is being done.
    """

    def __init__(self, stream: IO[str], delay: float, description: str = "starting") -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress
        from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

        # color_system=None: no colour (nothing for NO_COLOR to turn off)
        console = Console(file=stream, color_system=None, highlight=False)
        self._progress = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=True,
        )
        self._task = self._progress.add_task(f"dra-guard audit: {description}", total=None)
        self._delay = delay
        self._lock = threading.Lock()
        self._shown = self._closed = False
        self._timer = threading.Timer(delay, self._show)
        self._timer.daemon = True

    def _show(self) -> None:
        with self._lock:
            if not self._closed and not self._shown:
                self._progress.start()
                self._shown = True

    def step(self, description: str) -> None:
        """Show `description` (what is being done now) on the line."""
        self._progress.update(self._task, description=f"dra-guard audit: {description}")

    def __enter__(self) -> Progress:
        if self._delay <= 0:
            self._show()  # at once, in this thread: shown even when the work is over in a moment
        else:
            self._timer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._shown:
                self._progress.stop()


class NoProgress:
    """Progress's interface, doing nothing (pipes, files, --quiet)."""

    def step(self, description: str) -> None:
        """Nothing."""

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None
