"""Shared fixtures: the tiny checkpoint, the shapes image, and one capture per runtime (session-wide).

What is computed once per test run, whichever xdist worker asks first (``make test`` runs two workers, each
with its own pytest session, so a session fixture alone computes once per *worker*):

- ``DRIFTSCOPE_CACHE`` (compiled IREE artifacts, dense copies of quantized checkpoints, fetched inputs) is one
  folder for the whole run (``shared_root() / "driftscope-cache"``); ``compile_graph`` locks each artifact key,
  so the second worker waits for the first one's compile and loads it.
- :func:`shared_tapset` (``key``, a function that captures into the folder it is given) captures a TapSet the
  first time any worker asks for ``key`` and opens the stored one afterwards (a file lock per key). The fixtures
  ``runs`` and ``captures`` below use it, and so do ``qwen3_vl_support.capture`` and ``molmo2_support.capture``:
  a new test that needs a family's whole-plan f32 TapSet asks ``runs(family, runtime)``; one that needs another
  capture shared between files wraps it in ``shared_tapset("<file or support module>/<what>", capture)``.
  The key names everything the capture depends on; the folder is read-only for the tests (copy before changing).
- :func:`computed_once` is the same for any other result on disk (``compute(folder)`` then ``load(folder)``);
  ``rendered`` (a whole ``driftscope run`` with three notebooks) uses it: tests read that run, and one that
  writes into it (re-runs it, recaptures, touches its files) takes ``rendered_copy`` instead.

Run-wide results live under ``shared_root()``: ``<basetemp>/../shared`` under xdist (in the run's ``pytest-N``,
shared by its workers), ``<basetemp>/shared`` otherwise, or ``$DRIFTSCOPE_TEST_SHARED`` where that is set before
the run (deliberate sharing between pytest processes, e.g. to measure; nothing there is invalidated when the code
changes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))

TINY = ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"
SHAPES = ROOT / "fixtures" / "images" / "shapes_448.png"
#: the run-wide folder, set by the session fixture below (so the ``*_support`` modules find it too)
SHARED_ENV = "DRIFTSCOPE_TEST_SHARED"
T = TypeVar("T")

# Each xdist worker gets its share of the cores for torch's (OpenMP) and BLAS's thread pools, set before anything
# imports torch: two workers of two threads each on the 2-core CI machine oversubscribe it (OpenMP's spinning
# threads then wait on each other; one file measured 17% less wall time with one thread per worker). A value set
# by the caller is kept.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _share)


def _jsonschema_without_iri_grammar() -> None:
    """Test modules import nbformat, which imports jsonschema: first imported through driftscope's own door,
    without the optional IRI grammar that costs each worker 2-4 s of its collection (core/validation.py)."""
    from driftscope.core.validation import draft_2020_12

    draft_2020_12()


_jsonschema_without_iri_grammar()


def _mlx_on_openblas() -> None:
    """MLX's CPU matmuls on the OpenBLAS driftscope loads before ``mlx.core``, as in every driftscope process,
    whichever test module imports ``mlx.core`` first (a test that imports it directly would otherwise leave the
    wheel's reference BLAS to every later test of its worker)."""
    from driftscope.model.blas import mlx_blas

    mlx_blas()


_mlx_on_openblas()


def shared_root() -> Path:
    """The folder every worker of this test run shares (set up before the first test; a fresh temporary
    folder when called outside a test run)."""
    if SHARED_ENV not in os.environ:
        import tempfile

        os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="driftscope-tests-")
    return Path(os.environ[SHARED_ENV])


def family_run_key(name: str, runtime: str) -> str:
    """The :func:`shared_tapset` key of ``runs(name, runtime)``: the family's tiny checkpoint on its tiny images,
    the whole plan with four text tokens, f32, no patch and default options. A support module capturing exactly
    that uses this key, so the capture is made once for both."""
    return f"runs/{name}/{runtime}"


def family_power_capture(name: str, policy: str = "f32"):
    """``fixture_power``'s ``capture`` for ``runs(name, ...)``'s inputs and plan (the family's tiny images, the whole
    plan, four text tokens): each mutation's capture made once per test run, whichever file asks first (the
    shared family tests judge them under the default contract, a family's own power tests under its f32 one)."""

    def capture(runtime, inputs, plan, base, mutation):
        return shared_tapset(f"power/{name}/{policy}/{mutation.name}", lambda out: runtime.capture(inputs, plan, out))

    return capture


def computed_once(key: str, compute: Callable[[Path], T], load: Callable[[Path], T]) -> T:
    """``compute(folder)`` the first time any worker of this run asks for ``key``, ``load(folder)`` after that
    (in every worker: keep the result in a session-scoped dict or ``functools.cache`` too). ``key`` is a relative
    path naming everything the result depends on; a computation that raised is tried again by the next caller."""
    import shutil

    from filelock import FileLock

    folder = shared_root() / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    done = folder / ".done"
    with FileLock(str(folder) + ".lock"):
        if done.exists():
            return load(folder)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        result = compute(folder)
        done.touch()
        return result


def shared_tapset(key: str, capture: Callable[[Path], object]):
    """The TapSet ``capture(out_base)`` writes, captured once per test run (see the module's docstring)."""
    from driftscope.taps.tapset import TapSet

    return computed_once(key, lambda folder: capture(folder / "taps"), lambda folder: TapSet(folder / "taps"))


#: each test file's measured seconds (scripts/test_seconds.py writes it from a whole run's JUnit XML)
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_collection_modifyitems(session, config, items):
    """Under xdist, the test files slowest first (``FILE_SECONDS``; files it does not name after them, in their
    usual order). ``make test`` hands files to the two workers in collection order (``--dist loadfile
    --no-loadscope-reorder``), so the long files start early and the short ones fill in at the end: neither
    worker idles while the other finishes a long file. Only the order changes, and only of whole files."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not FILE_SECONDS.exists():
        return
    import json

    seconds = json.loads(FILE_SECONDS.read_text())
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable: a file stays in one piece


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test file (its fixtures torn down), what is still alive is frozen out of the garbage collector's
    walks (``gc.freeze``, after one collection so that no garbage is frozen): the imported frameworks, session
    fixtures and caches live as long as the worker, and every later full collection (an automatic one, or a
    runtime's release that has a cycle to free) walks only what the tests made since. A worker's full collection
    took ~0.45 s, ~300 of them ~140 worker-seconds of a run (docs/benchmarks.md, "The default suite's time",
    session 8)."""
    if nextitem is not None and nextitem.path != item.path:  # not after the last: nothing runs after it
        import gc

        gc.collect()
        gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def private_artifact_cache(tmp_path_factory):
    """One run-wide folder (``shared_root()``) and, in it, the artifact cache of the whole run: compiled IREE
    modules are compiled once per run, not once per worker (notebook kernels and batch workers inherit it). The
    reference cache is off (every test captures its reference; tests/run/test_refcache.py turns it on in its own
    folder). The caches' seal key (``core.seal``) is the run's too: no test writes into the user's configuration."""
    base = tmp_path_factory.getbasetemp()
    names = (
        "DRIFTSCOPE_CACHE",
        "DRIFTSCOPE_REFERENCE_CACHE",
        "DRIFTSCOPE_SEAL_KEY",
        "DRIFTSCOPE_TRUSTED_PATCHES",
        SHARED_ENV,
    )
    previous = {name: os.environ.get(name) for name in names}
    # set beforehand, it is used as it is (e.g. to compare one file's time with and without another's results);
    # nothing in it is invalidated when the code changes
    given = previous[SHARED_ENV]
    root = Path(given) if given else (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    os.environ[SHARED_ENV] = str(root)
    os.environ["DRIFTSCOPE_CACHE"] = str(root / "driftscope-cache")
    os.environ["DRIFTSCOPE_REFERENCE_CACHE"] = "off"
    os.environ["DRIFTSCOPE_SEAL_KEY"] = str(root / "seal.key")
    # the planted defects are the suite's own patches: captured in the run's process (run.isolated); the hostile
    # patches (a segfault, a hang) are not, so a crash costs their candidate only
    os.environ["DRIFTSCOPE_TRUSTED_PATCHES"] = str(ROOT / "tests" / "planted_patches.py")
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_checkpoint_dir() -> Path:
    if not (TINY / "model.safetensors").exists():
        from make_tiny_qwen25vl import main

        main([str(TINY)])
    return TINY


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoint_dir):
    from driftscope.families.checkpoints import open_checkpoint

    return open_checkpoint(tiny_checkpoint_dir)


@pytest.fixture(scope="session")
def shapes_inputs(tiny_checkpoint):
    from driftscope.families.checkpoints import prepare_inputs

    return prepare_inputs(tiny_checkpoint, [SHAPES])


@pytest.fixture(scope="session")
def full_plan(tiny_checkpoint):
    from driftscope.families import stage_plan
    from driftscope.taps.stages import StageSelection

    return stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection.everything())


@pytest.fixture(scope="session")
def captures(tiny_checkpoint, shapes_inputs, full_plan):
    """TapSets of every stage: transformers f32, MLX f32 and MLX f16 on the 448x448 shapes image (once per run)."""
    from driftscope.capture.runtimes import get_runtime

    def capture(name: str, policy: str):
        def into(out: Path):
            return get_runtime(name)(tiny_checkpoint, policy).capture(shapes_inputs, full_plan, out)

        return shared_tapset(f"captures/{name}-{policy}", into)

    return {f"{name}:{policy}": capture(name, policy) for name, policy in CAPTURED}


#: the ``captures`` fixture's runtimes and policies
CAPTURED = (("transformers", "f32"), ("mlx", "f32"), ("mlx", "f16"))


def write_params(path: Path, name: str, runtimes: list, **extra) -> Path:
    """A parameter file for the tiny checkpoint on the checkerboard image."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "checkpoint": str(TINY),
                "images": [str(ROOT / "fixtures" / "images" / "checkerboard_140.png")],
                "runtimes": runtimes,
                **extra,
            }
        )
    )
    return path


@pytest.fixture(scope="session")
def rendered(tiny_checkpoint_dir):
    """``driftscope run`` of four runtimes (MLX bf16 diverges; IREE runs with ``decode: false``, so one side
    lacks ``text.generate.*``) with notebooks 01, 02, 04: (exit code, output directory), run once per test run
    and shared by every worker: read it, and take ``rendered_copy`` to write into a run."""
    from driftscope.cli import main

    def run(base: Path):
        params = write_params(
            base / "p.yaml",
            "cli-check",
            [
                "transformers:f32",
                "mlx:f32",
                "mlx:bf16",
                {"runtime": "iree", "policy": "f32", "options": {"decode": False}},
            ],
            pairs=[["mlx:f32", "iree:f32"]],
            replay=["mlx:bf16"],
            notebooks=["01_stage_parity", "02_layer_drilldown", "04_negative_controls"],
            power={
                "mutations": [
                    "identity_window_permutation",
                    "cross_image_leak",
                    "manual_f16_rmsnorm",
                    "drop_rotary_block_1",
                ],
                "require": ["identity_window_permutation"],
            },
            text={"max_new_tokens": 4},
        )
        code = main(["run", str(params), "--out", str(base / "out")])
        (base / "exit_code").write_text(str(code))
        return code, base / "out"

    return computed_once("rendered", run, lambda base: (int((base / "exit_code").read_text()), base / "out"))


@pytest.fixture(scope="session")
def answer_page(rendered):
    """Notebook 06 (answer parity: ``rendered`` renders 01, 02 and 04) executed on a copy of ``rendered``'s run and
    rendered: its no-code page, made once per test run."""

    def render(base: Path):
        import shutil

        from driftscope.views.execution import execute
        from driftscope.views.pages import to_html

        _, out = rendered
        shutil.copytree(out.parent, base / "run", ignore=shutil.ignore_patterns(".done"))
        parameters = {"params_path": str(base / "run" / "p.yaml"), "out_dir": str(base / "run" / "out")}
        to_html(execute("06_answer_parity", base / "pages", parameters, cwd=ROOT, log_output=False))
        return base / "pages" / "06_answer_parity.nocode.html"

    return computed_once("answer_page", render, lambda base: base / "pages" / "06_answer_parity.nocode.html")


@pytest.fixture(scope="session")
def crashed(tiny_checkpoint_dir):
    """``driftscope run`` of a run whose MLX candidate's patch raises while it loads, with notebooks 01 and 02:
    (exit code, everything it printed, output directory), run once per test run and shared by every worker."""

    def load(base: Path):
        return int((base / "exit_code").read_text()), (base / "printed.txt").read_text(), base / "out"

    def run(base: Path):
        import contextlib
        import io

        from driftscope.cli import main

        patch = f"{ROOT / 'tests' / 'hostile_patches.py'}:boom"
        params = write_params(
            base / "crash.yaml",
            "crash",
            ["transformers:f32", {"runtime": "mlx", "policy": "f32", "patch": patch}],
            notebooks=["01_stage_parity", "02_layer_drilldown"],
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = main(["run", str(params), "--out", str(base / "out")])
        (base / "printed.txt").write_text(printed.getvalue())
        (base / "exit_code").write_text(str(code))
        return load(base)

    return computed_once("crashed", run, load)


@pytest.fixture
def rendered_copy(rendered, tmp_path):
    """``rendered`` copied into the test's own folder, its parameter file beside it (``out.parent / "p.yaml"``),
    file times kept: for a test that writes into the run, re-runs it or changes its files' times. The copied
    report still names the shared run's TapSets (read them, do not write them)."""
    import shutil

    code, out = rendered
    shutil.copytree(out.parent, tmp_path / "rendered", ignore=shutil.ignore_patterns(".done"))
    return code, tmp_path / "rendered" / "out"


@pytest.fixture(scope="session")
def tiny(request):
    """name -> (checkpoint, inputs with the prompt, full plan with the text stages)."""
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.taps.stages import StagePlan, StageSelection

    built = {}

    def get(name: str):
        if name not in built:
            family = get_family(name)
            checkpoint = open_checkpoint(family.tiny.ensure())
            inputs = family.prepare_inputs(checkpoint, list(family.tiny.images))
            inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=4)
            plan = family.plan_for(checkpoint).select(StageSelection.everything())
            text = family.text_stages_for(checkpoint, 4)
            plan = StagePlan(plan.family, plan.stages + text, plan.depth, plan.meta)
            built[name] = (checkpoint, inputs, plan)
        return built[name]

    return get


@pytest.fixture(scope="session")
def runs(tiny):
    """(family, runtime) -> (runtime object, TapSet of the whole plan in f32), captured once per test run (the
    runtime object is a fresh, unloaded one where another worker captured)."""
    from driftscope.capture.runtimes import get_runtime

    captured = {}

    def get(name: str, runtime_name: str):
        if (name, runtime_name) not in captured:
            checkpoint, inputs, plan = tiny(name)
            runtime = get_runtime(runtime_name)(checkpoint, "f32")

            def capture(out: Path):
                tapset = runtime.capture(inputs, plan, out)
                runtime.release()
                return tapset

            captured[(name, runtime_name)] = (runtime, shared_tapset(family_run_key(name, runtime_name), capture))
        return captured[(name, runtime_name)]

    return get
