"""A candidate whose code may crash the interpreter is captured in a process of its own: a crash costs that candidate.

A hypothesis patch from outside driftscope (``file.py:fn``, a user's module) runs inside the runtime's model; a
native crash there (a segfault in an extension, ``os.abort``) would kill the whole run, leave its report "running"
and the other candidates unjudged. Such a candidate's capture (load, patch, forward) runs in a child Python process
(``python -m driftscope.run.isolated JOB``) fed the run's own inputs, plan and run id, and writing the TapSet where
the run would have; the child dies with the run (``PR_SET_PDEATHSIG``). A child killed by a signal makes the
candidate "could not run" (:class:`CaptureCrashed`); an error it raised is raised again here, as its own type when
it is driftscope's (so a patch that raises still stops the run, naming the patch), with its traceback in the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from driftscope import errors
from driftscope.errors import DriftscopeError

if TYPE_CHECKING:
    from driftscope.inputs.processor_output import ModelInputs
    from driftscope.run.params import RuntimeSpec
    from driftscope.taps.stages import StagePlan
    from driftscope.taps.tapset import TapSet

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder holding the driftscope package
TRUSTED_ENV = "DRIFTSCOPE_TRUSTED_PATCHES"


class CaptureCrashed(DriftscopeError):
    """A candidate's capture ended its process without an error (a signal: a native crash in the patch or engine)."""


def isolated(spec: RuntimeSpec) -> bool:
    """Whether a candidate's capture runs in a process of its own: it runs a patch from outside driftscope that
    ``$DRIFTSCOPE_TRUSTED_PATCHES`` does not name (files, folders or module names, separated by ``os.pathsep``:
    patches the user vouches for run in the run's own process, where a crash stops the run)."""
    if spec.patch is None or spec.patch.target.startswith("driftscope."):
        return False
    module = spec.patch.target.rsplit(":", 1)[0]
    trusted = [entry for entry in os.environ.get(TRUSTED_ENV, "").split(os.pathsep) if entry.strip()]
    if module in trusted:
        return False
    if module.endswith(".py"):
        path = Path(module).expanduser()
        path = (Path(spec.patch.root or Path.cwd()) / path if not path.is_absolute() else path).resolve()
        folders = [Path(entry).expanduser().resolve() for entry in trusted]
        return not any(path == folder or folder in path.parents for folder in folders)
    return True


def _job(folder: Path, checkpoint, spec: RuntimeSpec, inputs: ModelInputs, plan: StagePlan, base: Path) -> Path:
    from safetensors.numpy import save_file

    from driftscope.core.names import current_run_id
    from driftscope.run.inputcache import encode

    tensors, record = encode(inputs)
    save_file(tensors, str(folder / "inputs.safetensors"))
    job = {
        "checkpoint": str(checkpoint.path),
        "family": checkpoint.family,
        "runtime": spec.runtime,
        "policy": spec.policy,
        "patch": {"target": spec.patch.target, "kwargs": spec.patch.kwargs, "root": str(spec.patch.root or "")},
        "options": {**spec.options, "label": spec.display},
        "inputs": record,
        "plan": {"family": plan.family, "stages": [s.to_dict() for s in plan], "depth": plan.depth, "meta": plan.meta},
        "base": str(base),
        "run_id": current_run_id(),
    }
    (folder / "job.json").write_text(json.dumps(job, default=str))
    return folder / "job.json"


def capture_isolated(
    checkpoint,
    spec: RuntimeSpec,
    inputs: ModelInputs,
    plan: StagePlan,
    base: Path,
    log: Callable[[str], None],
    detail: Callable[[str], None],
) -> tuple[TapSet, dict]:
    """(the candidate's TapSet at ``base``, its weights' dtypes), captured in a child process (see the module)."""
    from driftscope.taps.tapset import TapSet

    log(f"  {spec.display}: its patch {spec.patch.target} runs outside driftscope: captured in a process of its own")
    base.parent.mkdir(parents=True, exist_ok=True)
    # beside the TapSet, in the run's own folder: a run killed meanwhile leaves nothing outside it
    with tempfile.TemporaryDirectory(prefix=".isolated-", dir=base.parent) as scratch:
        job = _job(Path(scratch), checkpoint, spec, inputs, plan, base)
        # the child imports what this process imports: this driftscope first, then this process's own path
        path = [str(PACKAGE_PARENT), *(p for p in sys.path if p and Path(p).exists())]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
        with open(Path(scratch) / "child.log", "w+", encoding="utf-8") as output:
            code = subprocess.run(
                [sys.executable, "-m", "driftscope.run.isolated", str(job)],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            ).returncode
            output.seek(0)
            said = output.read()
        result_path = Path(scratch) / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if said.strip():
        detail(f"{spec.display}'s capture process said:\n{said}")
    if code == 0 and "dtypes" in result:
        return TapSet(base), result["dtypes"]
    if "error" in result:
        detail(result["error"].get("traceback", ""))
        raise _error(result["error"])
    how = (
        f"signal {signal.Signals(-code).name}"
        if code < 0 and -code in signal.Signals._value2member_map_
        else f"exit {code}"
    )
    raise CaptureCrashed(
        f"{spec.display}'s capture crashed its process ({how}) while running its patch {spec.patch.target} or "
        "its engine: the other runtimes are judged without it",
        f"fix the patch (its process's output is in the run's investigation.log), or run {spec.display} without it",
    )


def _error(error: dict) -> Exception:
    """The child's error as this process raises it: driftscope's own type with its problem and fix, else a
    RuntimeError naming the type."""
    kind = getattr(errors, str(error.get("type")), None)
    if isinstance(kind, type) and issubclass(kind, DriftscopeError):
        return kind(error.get("problem", ""), error.get("fix"))
    return RuntimeError(f"{error.get('type')}: {error.get('message')}")


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the run that started it dies (nothing elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the run died before the request took hold
        os._exit(1)


def main(job_path: str) -> int:
    """The child: capture one candidate as ``job.json`` says, then write ``result.json`` next to it."""
    import traceback

    _die_with_parent()
    folder = Path(job_path).parent
    job = json.loads(Path(job_path).read_text())
    try:
        from safetensors.numpy import load_file

        from driftscope.capture.patches import HypothesisPatch
        from driftscope.capture.runtimes import get_runtime
        from driftscope.core.names import writing_for
        from driftscope.families.checkpoints import open_checkpoint
        from driftscope.run.inputcache import decode
        from driftscope.taps.stages import Stage, StagePlan

        inputs = decode(load_file(str(folder / "inputs.safetensors")), job["inputs"])
        plan = job["plan"]
        plan = StagePlan(plan["family"], [Stage.from_dict(s) for s in plan["stages"]], plan["depth"], plan["meta"])
        patch = job["patch"]
        patch = HypothesisPatch(patch["target"], patch["kwargs"], Path(patch["root"]) if patch["root"] else None)
        checkpoint = open_checkpoint(job["checkpoint"], job["family"])
        runtime = get_runtime(job["runtime"])(checkpoint, job["policy"], patch, job["options"])
        with writing_for(job["run_id"]) if job.get("run_id") else _nothing():
            runtime.capture(inputs, plan, Path(job["base"]), progress=lambda message: print(message, flush=True))
        result = {"dtypes": runtime.weight_dtypes()}
    except Exception as err:  # noqa: BLE001 - the run raises it again, as its own type where it is driftscope's
        result = {
            "error": {
                "type": type(err).__name__,
                "message": str(err),
                "problem": getattr(err, "problem", str(err)),
                "fix": getattr(err, "fix", None),
                "traceback": "".join(traceback.format_exception(err)),
            }
        }
    (folder / "result.json").write_text(json.dumps(result, default=str))
    return 0 if "dtypes" in result else 3


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
