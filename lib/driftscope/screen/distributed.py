"""A screen on a Dask cluster (``--scheduler``): the inputs a screen lacks are split into one share per worker,
and each worker runs :func:`capture_all` on its share, so it loads each runtime once. The screen's directory must
be one every worker can write (the same machine, or a shared file system); each capture reports itself as a
worker event, which advances the bar here. The judging and the ranking then run here, as for a local screen."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from driftscope.batch.executor import ExecutorFailure
from driftscope.screen.capture import Job, capture_all
from driftscope.screen.inputs import ScreenInput

TOPIC = "driftscope-screen"


def _share(job: Job, items: list[ScreenInput], topic: str) -> int:
    from distributed import get_worker

    worker = get_worker()

    def advance(label: str, item: ScreenInput) -> None:
        with contextlib.suppress(Exception):  # a scheduler hiccup loses one tick of the bar, not the capture
            worker.log_event(topic, {"runtime": label, "input": item.key, "label": item.label})

    return capture_all(job, items, advance, lambda message: None)


def shares(items: list[ScreenInput], count: int) -> list[list[ScreenInput]]:
    """``items`` dealt round-robin into at most ``count`` non-empty shares."""
    count = max(1, min(count, len(items)))
    return [items[start::count] for start in range(count) if items[start::count]]


def capture_on_cluster(
    job: Job, items: list[ScreenInput], scheduler: str, total: int, advance: Callable | None, log: Callable
) -> int:
    from driftscope.core.extras import require_extra

    require_extra({"distributed": "distributed"}, "dask", "--scheduler")
    from distributed import Client

    from driftscope.screen.progress import screen_progress

    try:
        client = Client(scheduler, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:
        raise ExecutorFailure(f"cannot reach the Dask scheduler at {scheduler}: {err}") from err
    by_key = {item.key: item for item in items}
    with client, contextlib.nullcontext(advance) if advance else screen_progress(total) as bar:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        split = shares(items, workers)
        log(f"screen on {scheduler}: {len(items)} input(s) in {len(split)} share(s) over {workers} worker(s)")
        topic = f"{TOPIC}-{id(job)}"
        client.subscribe_topic(topic, lambda event: bar(event[1]["runtime"], by_key[event[1]["input"]]))
        futures = [client.submit(_share, job, share, topic, pure=False) for share in split]
        try:
            return sum(client.gather(futures))
        except KeyboardInterrupt:
            client.cancel(futures, force=True)
            raise
