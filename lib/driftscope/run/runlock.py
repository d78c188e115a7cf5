"""One run per output directory at a time: an exclusive ``flock`` on ``<out>/.investigation.lock``.

A second process asking for the same directory either fails with a clear error or, when it only wants
the result (``reuse``), waits for the running one and then reads its report. ``driftscope run`` holds
the directory until its last notebook is rendered, and ``<out>/.result.lock`` while its investigation
runs: the notebooks it starts (their kernels are its children) wait on that one for the report, so a
second run cannot re-investigate under notebooks that are still rendering the first one's report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from driftscope.errors import DriftscopeError

LOCK_NAME = ".investigation.lock"
RESULT_NAME = ".result.lock"


class BusyError(DriftscopeError):
    """Another process is running an investigation into the same output directory."""


@dataclass
class RunLock:
    """A held lock; ``waited`` says whether another process held it first (its run has just ended)."""

    path: Path
    waited: bool = False


def holder(out: Path) -> str:
    """The pid written by the process that holds (or last held) the lock, or ``"?"``."""
    try:
        return (Path(out) / LOCK_NAME).read_text().strip() or "?"
    except OSError:
        return "?"


@contextmanager
def run_lock(
    out: Path, wait: bool = False, log: Callable[[str], None] | None = None, what: str = "investigation"
) -> Iterator[RunLock]:
    """Hold the directory's lock for the block; without ``wait``, raise :class:`BusyError` if it is taken.
    ``what`` the lock guards, in messages (e.g. a reference capture into a ``run.refcache`` entry)."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: no protection, as before locks existed
        yield RunLock(Path(out) / LOCK_NAME)
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    with open(path, "a+") as handle:
        lock = RunLock(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = holder(out)
            if not wait:
                raise BusyError(
                    f"another {what} (pid {pid}) is writing to {out}",
                    "wait for it to finish, or give this run another output directory (--out / out_dir)",
                ) from None
            if log:
                log(f"waiting for the {what} running in {out} (pid {pid})")
            fcntl.flock(handle, fcntl.LOCK_EX)
            lock.waited = True
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield lock
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def result_lock(out: Path) -> Iterator[None]:
    """Held by ``driftscope run`` while its investigation writes the report its notebooks will read."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(Path(out) / RESULT_NAME, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: The ``driftscope run`` whose notebooks a process renders: the render process sets it to its parent's pid for
#: its kernels, whose own parent is the render process.
RUN_PID = "DRIFTSCOPE_RUN_PID"


def run_pid() -> str:
    """The pid of the ``driftscope run`` this process belongs to: :data:`RUN_PID`, else the parent's."""
    return os.environ.get(RUN_PID) or str(os.getppid())


def held_by_parent(out: Path) -> bool:
    """Whether the directory's lock is held by the ``driftscope run`` whose notebook this is (:func:`run_pid`)."""
    try:
        import fcntl
    except ImportError:
        return False
    path = Path(out) / LOCK_NAME
    if holder(out) not in (str(os.getppid()), run_pid()) or not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def refuse_orphaned_notebook(out: Path) -> None:
    """A notebook kernel of a ``driftscope run`` (:data:`RUN_PID` set by its render process) whose run has died
    was orphaned: it must not take the freed directory and run the whole investigation again (the render process
    ends with its run, but a kernel could reach the lock first)."""
    from driftscope.run.report import process_alive

    pid = os.environ.get(RUN_PID)
    if pid and not process_alive(int(pid)):
        raise BusyError(
            f"the driftscope run (pid {pid}) that started this notebook is gone and no longer holds {out}: it was "
            "killed before its pages were rendered, so this notebook does not run the investigation again",
            f"run it again: driftscope run <parameters> --out {out}",
        )


def wait_for_result(out: Path) -> None:
    """Wait until no investigation holds ``out``'s result lock (its report is then final)."""
    with result_lock(out):
        pass
