"""Start-up cost of the ``driftscope`` command: time to the first capture, and which ML frameworks each step imports.

    .venv/bin/python benchmarks/startup.py [PARAMS] [--repeats N]    # default: parameters/demo_shapes.yaml

Each repeat starts ``driftscope run PARAMS --force --out <temporary directory>`` in a fresh process, as a user
does, and stamps every line it prints with the seconds since the process was started (``time.perf_counter``
around ``subprocess.Popen``). "first capture" is the line ``capture <reference>: N stages``, printed right
before the reference runtime loads its model; "reference captured" its ``done in`` line. The run is stopped
there (its process group killed, notebook kernels included): later steps are timed by the run's own report.
Then ``driftscope --help`` and ``driftscope show`` of the finished run are timed the same way. Prints a
Markdown table (medians) for docs/benchmarks.md.

``python benchmarks/startup.py --probe -- ARGS...`` runs ``driftscope ARGS`` in this process and prints, after
every log line and at exit, which of :data:`FRAMEWORKS` are imported (``tests/run/test_lazy_imports.py`` reads it).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The machine-learning frameworks a command may import only when a runtime that needs them runs.
FRAMEWORKS = ("torch", "transformers", "mlx", "mlx_vlm", "jax", "jaxlib", "iree")
PROBE = "[probe]"


def imported() -> list[str]:
    """The frameworks of :data:`FRAMEWORKS` this process has imported."""
    return [name for name in FRAMEWORKS if name in sys.modules]


def probe(argv: list[str]) -> int:
    """``driftscope argv`` in this process; after each log line and at exit, the frameworks imported so far."""
    import driftscope.run.investigation as investigation
    from driftscope.cli import main

    plain = investigation.log

    def log(message: str) -> None:
        plain(message)
        print(f"{PROBE} {' '.join(imported()) or '-'} | {message}", flush=True)

    investigation.log = log
    try:
        code = main(argv)
    except SystemExit as done:  # --help
        code = done.code or 0
    print(f"{PROBE} {' '.join(imported()) or '-'} | exit {code}", flush=True)
    return int(code)


def probe_command(argv: list[str]) -> list[str]:
    """The command line that runs :func:`probe` on ``argv`` with this interpreter."""
    return [sys.executable, str(Path(__file__).resolve()), "--probe", "--", *argv]


def stamped(command: list[str], stop: str | None = None, env: dict | None = None) -> tuple[list, float]:
    """Run ``command``; its stdout lines with the seconds since start, stopping (killing its process group) after
    the first line containing ``stop``. Returns (lines, seconds until exit or stop)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))
            if stop and stop in line:
                break
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return lines, time.perf_counter() - start


def first(lines, text: str) -> float:
    """Seconds until the first line containing ``text``."""
    for at, line in lines:
        if text in line:
            return at
    raise SystemExit(f"no line contains {text!r}:\n" + "\n".join(line for _, line in lines[-20:]))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        sys.exit(probe(argv[2:] if argv[1:2] == ["--"] else argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default="parameters/demo_shapes.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from driftscope.run.params import load_parameters

    params = load_parameters(args.params)
    reference = params.reference_label
    cli = [sys.executable, "-m", "driftscope.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    samples: dict[str, list[float]] = {"first capture": [], "reference captured": [], "--help": [], "show": []}
    frameworks = ""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        for _ in range(args.repeats):
            lines, _ = stamped(
                probe_command(["run", args.params, "--force", "--out", str(out)]), f"{reference}: done in", env
            )
            samples["first capture"].append(first(lines, f"capture {reference}:"))
            samples["reference captured"].append(first(lines, f"{reference}: done in"))
            frameworks = next(line for _, line in lines if line.startswith(PROBE) and f"capture {reference}:" in line)
        # a finished run to show: the tiny demo's report is written at every step, a stopped one is enough
        for _ in range(args.repeats):
            samples["--help"].append(stamped([*cli, "--help"], env=env)[1])
            samples["show"].append(stamped([*cli, "show", str(out)], env=env)[1])
    print(f"`{' '.join(['driftscope', 'run', args.params])}`, median of {args.repeats} (seconds since process start)\n")
    print("| step | median s | samples |")
    print("|---|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print(f"\nframeworks imported at the first capture: {frameworks.split('|')[0].removeprefix(PROBE).strip()}")


if __name__ == "__main__":
    main()
