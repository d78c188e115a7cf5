"""Start-up cost of the ``driftscope`` command: time to the first capture, and which ML frameworks each step imports.

    .venv/bin/python benchmarks/startup.py [PARAMS] [--repeats N]    # default: parameters/demo_shapes.yaml
    .venv/bin/python benchmarks/startup.py --lib OTHER/lib --lib lib   # two checkouts' code, alternating

Each repeat starts ``driftscope run PARAMS --force --out <temporary directory>`` in a fresh process, as a user
does, and stamps every line it prints with the seconds since the process was started (``time.perf_counter``
around ``subprocess.Popen``). "first capture" is the line ``capture <reference>: N stages``, printed right
before the reference runtime loads its model; "reference captured" its ``done in`` line (or, when its taps come
from the reference cache, the ``reused the cached reference taps`` line). The run is stopped there (its process
group killed, notebook kernels included): later steps are timed by the run's own report. Then ``driftscope
--help`` and ``driftscope show`` of the finished run are timed the same way. Prints a Markdown table for
docs/benchmarks.md: the first repeat ("cold") and the median of the later ones ("warm").

Each checkout gets an empty cache of its own (``$DRIFTSCOPE_REFERENCE_CACHE``, which holds the reference's taps
and the prepared inputs, ``run.refcache`` and ``run.inputcache``), so its first repeat is cold and the later
ones find what the first stored; ``--cache off`` runs every repeat without the caches.

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


def stamped(command: list[str], stop: str | tuple = (), env: dict | None = None) -> tuple[list, float]:
    """Run ``command``; its stdout lines with the seconds since start, stopping (killing its process group) after
    the first line containing ``stop`` (or one of them). Returns (lines, seconds until exit or stop)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))
            if any(text in line for text in stops):
                break
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return lines, time.perf_counter() - start


def first(lines, text: str | tuple) -> float:
    """Seconds until the first line containing ``text`` (or one of them)."""
    texts = (text,) if isinstance(text, str) else tuple(text)
    for at, line in lines:
        if any(t in line for t in texts):
            return at
    raise SystemExit(f"no line contains {texts!r}:\n" + "\n".join(line for _, line in lines[-20:]))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        sys.exit(probe(argv[2:] if argv[1:2] == ["--"] else argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default="parameters/demo_shapes.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--lib", action="append", help="the driftscope package to time (a checkout's lib/; repeat to compare)"
    )
    parser.add_argument(
        "--cache",
        choices=("fresh", "off"),
        default="fresh",
        help="fresh (default): an empty cache per checkout, so the first repeat is cold and the later ones warm; "
        "off: no reference or inputs cache",
    )
    args = parser.parse_args(argv)

    from driftscope.run.params import load_parameters

    reference = load_parameters(args.params).reference_label
    libs = [str(Path(lib).resolve()) for lib in args.lib or [ROOT / "lib"]]
    samples = {lib: {"first capture": [], "reference captured": [], "--help": [], "show": []} for lib in libs}
    frameworks: dict[str, list[str]] = {lib: [] for lib in libs}
    captured = (f"{reference}: done in", f"{reference}: reused the cached reference taps")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for lib in libs:  # alternating, so a busy moment of the machine falls on both
                cache = "off" if args.cache == "off" else str(Path(tmp) / f"cache-{libs.index(lib)}")
                env = {**os.environ, "PYTHONPATH": lib, "DRIFTSCOPE_REFERENCE_CACHE": cache}
                out = Path(tmp) / f"run-{libs.index(lib)}"
                command = probe_command(["run", args.params, "--force", "--out", str(out)])
                lines, _ = stamped(command, captured, env)
                samples[lib]["first capture"].append(first(lines, f"capture {reference}:"))
                samples[lib]["reference captured"].append(first(lines, captured))
                at = next(line for _, line in lines if line.startswith(PROBE) and f"capture {reference}:" in line)
                frameworks[lib].append(at.split("|")[0].removeprefix(PROBE).strip())
                cli = [sys.executable, "-m", "driftscope.cli"]
                samples[lib]["--help"].append(stamped([*cli, "--help"], env=env)[1])
                samples[lib]["show"].append(stamped([*cli, "show", str(out)], env=env)[1])  # the stopped run's report
    print(f"`driftscope run {args.params}`, {args.repeats} repeats, cache {args.cache} (seconds since process start)")
    print("cold: the first repeat; warm: the median of the later ones (their caches hold what the first stored)\n")
    print("| driftscope | step | cold s | warm s | samples |")
    print("|---|---|---|---|---|")
    for lib in libs:
        for name, values in samples[lib].items():
            cells = ", ".join(f"{v:.2f}" for v in values)
            warm = f"{statistics.median(values[1:]):.2f}" if values[1:] else "-"
            print(f"| {lib} | {name} | {values[0]:.2f} | {warm} | {cells} |")
    for lib in libs:
        print(f"\n{lib}: frameworks imported at the first capture, by repeat: {frameworks[lib]}")


if __name__ == "__main__":
    main()
