"""The notebooks of ``driftscope run`` render in a process of their own, started beside the investigation.

The process (``python -m driftscope.views.render_process SPEC``) imports papermill, nbclient and nbconvert, starts
the first notebook's kernel and runs its warm-up (:mod:`driftscope.views.warm`), compiles the HTML templates,
then executes the notebooks through papermill as before: each notebook's ``investigate(..., reuse=True)`` waits
for the run's lock and reads the report. The next notebook's kernel warms while one executes. What is left
after the verdict is the cells that read the report and the two HTML pages.

A process, not a thread: CPython 3.11 is not safe when two threads compile at once ("SystemError: AST
constructor recursion depth mismatch"), and the investigation imports transformers, MLX and JAX meanwhile; the
CLI's own process no longer imports the notebook stack at all. The process talks back on its stdout, one JSON
object a line: ``{"log": message}`` for each progress line, then ``{"errors": {notebook: error}}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The render process and its kernels yield the cores to the investigation while both run: warming a kernel beside
#: the investigation's own start-up made its first capture 5 s later on the loaded 2-core machine. Once the
#: report exists nothing else of the run competes, so on a machine of its own the niceness costs nothing.
NICE = 10


class RenderProcess:
    """The parent's handle: :meth:`start` it, then :meth:`wait` for ``{notebook: error}``.

    The process and its kernels write their temporary files (a kernel's connection file among them) in
    ``scratch``, which this handle removes once the process has ended: a render process that is killed leaves
    nothing in the machine's temporary folder."""

    def __init__(self, process: subprocess.Popen, log, scratch: Path):
        self.process, self.log, self.scratch = process, log, scratch
        self.errors: dict[str, str] | None = None
        self._reader = threading.Thread(target=self._read, name="driftscope-render-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, names, out_dir: Path, params_path: Path, cwd: Path, log, verbose: bool = False) -> RenderProcess:
        spec = {
            "notebooks": list(names),
            "out_dir": str(out_dir),
            "params_path": str(params_path),
            "cwd": str(cwd),
            "verbose": verbose,
        }
        scratch = Path(tempfile.mkdtemp(prefix="driftscope-render-"))
        spec["scratch"] = str(scratch)  # the process removes it on its way out; this handle, if it was killed
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "driftscope.views.render_process", json.dumps(spec)],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                cwd=str(cwd),
                env={**os.environ, "TMPDIR": str(scratch)},
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return cls(process, log, scratch)

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "log" in message:
                self.log(message["log"])
            elif "errors" in message:
                self.errors = dict(message["errors"])

    def wait(self) -> dict[str, str]:
        """``{notebook: error}`` once the process has ended; a process that ended without saying is an error."""
        code = self.process.wait()
        self._reader.join()
        self._remove_scratch()
        if self.errors is None:
            error = f"the render process exited with code {code} before its notebooks were rendered"
            self.log(f"the notebooks could not render: {error}")
            return {"notebooks": error}
        return self.errors

    def stop(self) -> None:
        """End the process (and, through its handler, its kernels) if it still runs."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        """Remove the scratch folder once the process has ended. A process that was killed could not shut its
        kernels down: a kernel still starting would write its connection file into the folder again (ipykernel
        recreates the folder) and run on until it noticed, so the kernels it recorded are ended first."""
        if self.process.returncode != 0:  # one that ended on its own shut its kernels down itself
            end_kernels(self.scratch / KERNEL_PIDS)
        shutil.rmtree(self.scratch, ignore_errors=True)


#: The file in the scratch folder where the render process records each kernel it starts (one pid a line).
KERNEL_PIDS = "kernels.pid"


def end_kernels(pids: Path, wait: float = 10.0) -> None:
    """Kill the kernels recorded in ``pids`` that still run (each leads a session of its own, as jupyter_client
    starts it, so its process group goes with it) and wait until they are gone."""
    import signal
    import time

    from driftscope.run.report import process_alive

    try:
        recorded = [int(line) for line in pids.read_text(encoding="utf-8").split()]
    except (OSError, ValueError):
        return
    for pid in recorded:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    for pid in recorded:
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def investigate_and_render(params, params_path: Path, out_dir: Path, reuse: bool, cwd: Path, log) -> dict[str, str]:
    """Run the investigation in this process while a render process warms the notebooks' kernels, then render.

    The render process (:mod:`driftscope.views.render_process`) starts each notebook's kernel and imports its
    modules while the investigation runs; each notebook's ``investigate(..., reuse=True)`` waits for this run
    (the output directory's lock) and reads its report. Returns ``{notebook: error}`` like
    :func:`driftscope.views.render.run_notebooks` (``"investigation"``: the investigation's own error); a failed
    investigation shows in the notebooks. The output directory stays locked until the last notebook is rendered,
    so no other run can replace the report under them.
    """
    from driftscope.run.investigation import investigate
    from driftscope.run.runlock import result_lock, run_lock

    from .run_state import stopped_at

    errors: dict[str, str] = {}
    verbose = logging.getLogger("papermill").getEffectiveLevel() <= logging.INFO
    with run_lock(out_dir) as lock:  # held before the kernel can ask for it, until the last notebook is rendered
        with result_lock(out_dir):  # this run's kernels wait on this one for the report
            names = list(params.notebooks)
            process = RenderProcess.start(names, out_dir, params_path, cwd, log, verbose) if names else None
            try:
                investigate(params, out_dir, reuse=reuse, lock=lock)
            except Exception as err:  # noqa: BLE001 - the report records where it stopped; the notebooks show it
                errors["investigation"] = f"{type(err).__name__}: {err}"
                if not stopped_at(out_dir / "report.json"):  # it failed before its report could say so
                    log(f"the investigation could not start: {type(err).__name__}: {err}")
            except BaseException:
                if process is not None:
                    process.stop()
                raise
        errors.update(process.wait() if process is not None else {})
    return errors


class KernelQueue:
    """Warm kernels for the notebooks in order: the first started at once (in the calling thread, so every code
    path the background thread uses has run once, imports included), each next one when the notebook before it
    is taken; :meth:`take` waits for a notebook's kernel (None: it could not start, papermill starts one)."""

    def __init__(self, names, cwd: Path, pids: Path | None = None):
        self.names, self.cwd, self.pids = list(names), cwd, pids
        self._kernels: dict[str, object] = {}
        self._taken = 0
        self._closed = False
        self._condition = threading.Condition()
        self._ready = {name: threading.Event() for name in self.names}
        self._thread: threading.Thread | None = None
        if self.names:
            self._start(self.names[0])
            first = self._kernels.get(self.names[0])
            if first is not None:
                first.ready()

    def start_rest(self) -> None:
        if len(self.names) > 1:
            self._thread = threading.Thread(target=self._warm_rest, name="driftscope-kernels", daemon=True)
            self._thread.start()

    def _start(self, name: str) -> None:
        from .execution import kernel_config, kernel_name, notebook_path
        from .warm import WarmKernel

        try:
            self._kernels[name] = WarmKernel(
                notebook_path(name), kernel_name(), self.cwd, kernel_config(), self._record
            )
        except Exception:  # noqa: BLE001 - no warm kernel: papermill starts one the usual way and reports why
            self._kernels[name] = None
        self._ready[name].set()

    def _record(self, pid: int | None) -> None:
        """Add a kernel this process started to :data:`KERNEL_PIDS` (closed, so written, before it is used)."""
        if self.pids is not None and pid is not None:
            with self.pids.open("a", encoding="utf-8") as file:
                file.write(f"{pid}\n")

    def _warm_rest(self) -> None:
        for index, name in enumerate(self.names[1:], start=1):
            with self._condition:
                self._condition.wait_for(lambda i=index: self._closed or self._taken >= i)
                if self._closed:
                    return
            self._start(name)  # its warm-up reply is waited for by whoever takes it (one thread per client)

    def take(self, name: str):
        if name not in self._ready:
            return None
        with self._condition:
            self._taken += 1
            self._condition.notify_all()
        self._ready[name].wait()
        return self._kernels.pop(name, None)

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()
        for kernel in self._kernels.values():
            if kernel is not None:
                kernel.shutdown()
        self._kernels.clear()


def serve(spec: dict, emit) -> dict[str, str]:
    """Warm the kernels and exporters, then execute and render the notebooks of ``spec``; ``{notebook: error}``."""
    from .pages import TEMPLATES, warm_pages
    from .preimport import prepare_notebook_stack
    from .render import drilldown_for_failing, run_notebooks
    from .warm import Exporters

    names = list(spec["notebooks"])
    out, params_path, cwd = Path(spec["out_dir"]), Path(spec["params_path"]), Path(spec["cwd"])
    prepare_notebook_stack(names)
    kernels = KernelQueue(names, cwd, Path(spec["scratch"]) / KERNEL_PIDS if spec.get("scratch") else None)
    try:
        exporters = Exporters(TEMPLATES)
        exporters.warm()
        warm_pages(exporters)  # before any page is rendered in a forked child: imported once, not in each
        kernels.start_rest()
        errors = run_notebooks(names, out, params_path, True, cwd, emit, echo=False, kernels=kernels, pages=exporters)
        added = drilldown_for_failing(names, out)
        if added:
            emit(f"the run fails: rendering {added[0]} too (the drill-down of its first divergence)")
            errors.update(run_notebooks(added, out, params_path, True, cwd, emit, echo=False, pages=exporters))
    finally:
        kernels.close()
    return errors


def _end_with_parent() -> None:
    """A run that is killed leaves no render process behind: its kernels would take the freed lock and run the
    investigation again. (A kernel ends with its own parent; this process is that parent now.)"""
    import signal
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="driftscope-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    import logging
    import signal

    with contextlib.suppress(OSError):
        os.nice(NICE)  # its kernels inherit it
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr: stdout carries only the messages below
    spec = json.loads(argv[0])
    from driftscope.run.runlock import RUN_PID

    os.environ[RUN_PID] = str(os.getppid())  # the kernels' notebooks belong to the run that started this process
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for name in ("papermill", "traitlets", "nbconvert"):
        logging.getLogger(name).setLevel(logging.INFO if spec.get("verbose") else logging.ERROR)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the kernels are shut down on the way out
    _end_with_parent()

    def emit(message: str) -> None:
        channel.write(json.dumps({"log": message}) + "\n")

    try:
        errors = serve(spec, emit)
    except Exception as err:  # noqa: BLE001 - the parent reports it: the run must not pass without its pages
        errors = {"notebooks": f"{type(err).__name__}: {err}"}
        emit(f"the notebooks could not render: {errors['notebooks']}")
    finally:  # its kernels are shut down: their connection files are gone; a run killed first leaves no handle
        if spec.get("scratch"):
            shutil.rmtree(spec["scratch"], ignore_errors=True)
    channel.write(json.dumps({"errors": errors}) + "\n")
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
