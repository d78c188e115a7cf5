"""The tap file's background writer: one thread writes the stage arrays a capture hands it, in the order handed,
while the forward goes on; a bounded number of bytes waits in between.

``TapWriter`` records every stage's offsets when the stage arrives (so the file's layout does not depend on
when the bytes land) and hands the bytes here. What it hands is an array the writer may keep: the stage in its
stored dtype, copied once where it still aliases the engine's memory (a tensor the forward may overwrite in place
later), the array itself where converting it already made a copy. The bytes in flight are bounded by
``limit`` (a capture's memory grows by at most that much); a stage larger than the limit waits until everything
before it is written, then goes alone.

A write that fails stops the thread; the error is raised, once, to the capture's thread by the next ``submit``
or by ``drain``, so a failure is the capture's error and nothing waits forever on a dead thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import BinaryIO

import numpy as np

#: bytes a capture may have handed over and not yet written (64 MiB: several of the 3B tower's largest stages)
LIMIT = 64 << 20


class BackgroundWrites:
    """Writes arrays to ``handle`` on one thread, in order; at most ``limit`` bytes wait."""

    def __init__(self, handle: BinaryIO, limit: int = LIMIT):
        self._handle = handle
        self._limit = limit
        self._items: deque[np.ndarray] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._reported = False
        self._stopping = False
        self.written = 0  # bytes written so far
        self._thread = threading.Thread(target=self._run, name="driftscope-tap-writer", daemon=True)
        self._thread.start()

    def submit(self, array: np.ndarray) -> None:
        """Queue ``array`` (C-contiguous, not changed afterwards) to be written after everything queued before;
        waits while the bytes in flight would pass the limit. Raises the writer's error if a write failed."""
        with self._cond:
            while self._error is None and self._pending and self._pending + array.nbytes > self._limit:
                self._cond.wait()
            self._raise_error()
            self._items.append(array)
            self._pending += array.nbytes
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until everything queued is written; raises the writer's error if a write failed."""
        with self._cond:
            while self._error is None and self._items:
                self._cond.wait()
            self._raise_error()

    def stop(self) -> None:
        """Write what is queued (unless a write failed), then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def discard(self) -> None:
        """Drop what is queued and end the thread (the file is being abandoned)."""
        with self._cond:
            self._items.clear()
            self._pending = 0
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    @property
    def failed(self) -> BaseException | None:
        return self._error

    def _raise_error(self) -> None:
        if self._error is not None and not self._reported:
            self._reported = True
            raise self._error
        if self._error is not None:
            raise RuntimeError("the tap writer failed before (see the first error)")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._cond.wait()
                if not self._items:
                    return
                array = self._items[0]
            try:
                self._handle.write(memoryview(array.reshape(-1)).cast("B"))  # releases the GIL while it copies
            except BaseException as err:  # noqa: BLE001 - handed to the capture's thread, never lost
                with self._cond:
                    self._error = err
                    self._items.clear()
                    self._pending = 0
                    self._cond.notify_all()
                return
            with self._cond:
                self._items.popleft()
                self._pending -= array.nbytes
                self.written += array.nbytes
                self._cond.notify_all()


def owned(array: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``array`` (``source`` in its stored dtype) as an array the writer may keep: copied where it still shares
    memory with ``source`` (the engine's buffer), itself where converting it already copied."""
    return array.copy() if np.may_share_memory(array, source) else array
