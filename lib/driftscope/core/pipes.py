"""Output to a reader that stopped reading: ``driftscope show RUN | head -1`` is a normal way to read a verdict.

When the reader closes the pipe, the rest of the output has nowhere to go and is dropped; the command still ends
with its own exit code (the verdict's, for a gate), not a ``BrokenPipeError``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class ClosedReaderSafe:
    """A text stream that writes to ``stream`` until its reader goes away, then to nowhere."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.closed_reader = False

    def _drop(self) -> None:
        """Point the stream's descriptor at /dev/null, so the interpreter's last flush does not fail either."""
        self.closed_reader = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self.closed_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        if self.closed_reader:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """``sys.stdout`` as a :class:`ClosedReaderSafe` stream for the block, flushed at its end (a reader gone by then
    would fail the interpreter's last flush, exit 120)."""
    previous = sys.stdout
    guarded = ClosedReaderSafe(previous) if previous is not None else None
    sys.stdout = guarded
    try:
        yield
    finally:
        if guarded is not None:
            guarded.flush()
        sys.stdout = previous
