"""Hypothesis patches the hostile-input tests plant in runs (a module of their own: a run imports it by path)."""

from __future__ import annotations

import time
from pathlib import Path


def boom(model, **_):
    """Raises while the runtime loads (stands in for any crash in a user's patch)."""
    raise RuntimeError("planted crash")


def hang_once(model, marker: str, **_):
    """Writes ``marker`` and blocks the first run that loads it (a run to kill mid-capture); later runs pass."""
    path = Path(marker)
    if path.exists():
        return model
    path.write_text("loading\n")
    time.sleep(600)
    return model


def segfault(model, **_):
    """Kills the run's own process with SIGSEGV while the runtime loads (a native crash in a patch or engine)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def kill_the_run(model, **_):
    """Kills the run that loads it with SIGSEGV, as a native crash of the run's own process would (e.g. in an
    engine). A patch from outside driftscope runs in a child of the run (``run.isolated``): it signals its parent."""
    import os
    import signal

    os.kill(os.getppid(), signal.SIGSEGV)
    time.sleep(60)
