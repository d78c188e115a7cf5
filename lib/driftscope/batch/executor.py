"""Where a batch's runs execute (local threads, each run in its own process, or a Dask cluster); progress; stop.

Whatever happens to the executor (an unreachable scheduler, a lost worker, Ctrl-C, SIGTERM), :func:`execute`
returns one summary per task: the runs that finished, and "could not run" for the rest. A stop kills the
runs' processes (local), or tells every Dask worker to kill its run's processes, then cancels what is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from driftscope.batch.worker import CHECKOUT_ENV, RunTask, run_one
from driftscope.run.runrecord import outcome

STOP_WAIT_S = 60.0  # how long a stop waits for the runs in flight to kill their processes and report


class BatchInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the batch."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class ExecutorFailure(Exception):
    """The executor itself failed (e.g. the Dask scheduler cannot be reached)."""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """In the main thread, the first SIGINT or SIGTERM raises :class:`BatchInterrupted`; later ones wait for cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise BatchInterrupted(signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def not_run(task: RunTask, reason: str) -> dict:
    """The summary of a run that could not run (or not finish) because of the executor."""
    return {
        "name": task.name,
        "params": task.source,
        "commit": task.commit,
        "dir": None,
        "status": "error",
        "verdict": "error",
        "reasons": [],
        "error": f"could not run: {reason}",
        "reused": False,
        "seconds": 0.0,
    }


def progress_line(summary: dict) -> str:
    state = outcome(summary)
    line = f"  done  {summary['name']}: {state if state != 'error' else 'could not run'}"
    line += f" in {summary.get('seconds', 0.0):.1f}s" + (" [reused]" if summary.get("reused") else "")
    return line + (f" ({summary['error']})" if summary.get("error") else "")


def execute(
    tasks: list[RunTask], jobs: int, scheduler: str | None, log: Callable[[str], None], timeout: float | None = None
) -> tuple[list[dict], str | None]:
    """One summary per task (task order) and what went wrong with the executor, if anything."""
    done: dict[str, dict] = {}

    def finished(summary: dict) -> None:
        done[summary["name"]] = summary
        log(progress_line(summary))

    problem = None
    try:
        if scheduler:
            _dask(tasks, scheduler, finished, log, timeout)
        else:
            _local(tasks, jobs, finished, log)
    except BatchInterrupted as err:
        problem = f"the batch was stopped ({err.args[0]})"
    except ExecutorFailure as err:
        problem = str(err)
    return [done.get(task.name) or not_run(task, problem or "no result came back") for task in tasks], problem


def _start_line(event: dict) -> str:
    return f"  start {event['name']}" + (f" on {event['host']}" if event.get("host") else "")


def _local(tasks: list[RunTask], jobs: int, finished, log) -> None:
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="driftscope-run") as pool:
        futures = [pool.submit(run_one, task, stop.is_set, lambda e: log(_start_line(e))) for task in tasks]
        reported = set()
        try:
            for future in as_completed(futures):
                reported.add(future)
                finished(future.result())
        except BatchInterrupted:
            stop.set()  # each run in flight kills its process tree and returns
            for future in futures:
                future.cancel()
            for future in futures:
                if future not in reported and not future.cancelled():
                    finished(future.result())
            raise


def dask_run(task: RunTask) -> dict:
    """The Dask task: :func:`run_one` on a worker, stopped by the batch's Dask event, progress as worker events."""
    from distributed import Event, get_worker

    worker = get_worker()
    event = Event(f"driftscope-stop-{task.batch}")
    asked = [0.0, False]

    def stop() -> bool:
        if not asked[1] and time.monotonic() - asked[0] > 1.0:
            asked[0] = time.monotonic()
            with contextlib.suppress(Exception):  # a scheduler hiccup is not a stop
                asked[1] = event.is_set()
        return asked[1]

    def notify(message: dict) -> None:
        worker.log_event(f"driftscope-{task.batch}", message)

    return run_one(task, stop, notify, own_checkout=os.environ.get(CHECKOUT_ENV))


def _dask(tasks: list[RunTask], scheduler: str, finished, log, timeout: float | None) -> None:
    from driftscope.core.extras import require_extra

    require_extra({"distributed": "distributed"}, "dask", "--scheduler")
    from distributed import Client, Event
    from distributed import as_completed as dask_completed

    try:
        client = Client(scheduler, set_as_default=False, **({"timeout": timeout} if timeout else {}))
    except (OSError, TimeoutError, ValueError) as err:
        raise ExecutorFailure(f"cannot reach the Dask scheduler at {scheduler}: {err}") from err
    batch = tasks[0].batch if tasks else ""
    with client:
        client.subscribe_topic(f"driftscope-{batch}", lambda event: log(_start_line(event[1])))
        futures = {
            client.submit(dask_run, task, key=f"driftscope-{batch}-{index}", pure=False): task
            for index, task in enumerate(tasks)
        }
        reported = set()
        try:
            for future in dask_completed(list(futures), loop=client.loop):
                reported.add(future)
                finished(_result(future, futures[future]))
        except BatchInterrupted:
            Event(f"driftscope-stop-{batch}", client=client).set()  # runs in flight kill their processes
            # queued runs return at once, runs in flight once their processes are gone; what does not is cancelled
            deadline = time.monotonic() + STOP_WAIT_S
            while time.monotonic() < deadline and not all(f.done() for f in futures if f not in reported):
                time.sleep(0.2)
            for future, task in futures.items():
                if future not in reported and future.done():
                    finished(_result(future, task))
            client.cancel(list(futures), force=True)
            raise
        except Exception as err:  # noqa: BLE001 - the cluster itself failed mid-batch (scheduler gone)
            client.cancel(list(futures), force=True)
            raise ExecutorFailure(f"the Dask cluster failed: {type(err).__name__}: {err}") from err


def _result(future, task: RunTask) -> dict:
    """A finished future's summary; a lost worker (KilledWorker) is a run that could not finish."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - KilledWorker, CancelledError, a worker without driftscope
        summary = not_run(task, f"the worker running it was lost ({type(err).__name__}: {err})")
        summary["lost"] = True
        return summary
