"""Peak RSS of `driftscope run` on the whole 3B-shaped checkpoint (``--scale 4`` by default: widths / 4), and
where it peaks: the child's own ``VmHWM``, its RSS every 50 ms with the investigation log's last line at that
moment, and the RSS when each capture starts.

    .venv/bin/python benchmarks/run_memory.py [--scale 4] [--runtimes transformers:f32,mlx:f32,iree:f32]

Prints the peak against the bound (the largest runtime's weights + 1.5 GiB), the RSS when the run's first
capture starts (imports and the processor: what does not scale with the model), and the five highest samples
with the phase they fell in. Runs cold (IREE compiles in its own ``iree-compile`` processes, outside this RSS).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


class Timeline:
    """(seconds, RSS, log line) of a child every 50 ms, and its ``VmHWM``."""

    def __init__(self, pid: int, log: Path):
        self.pid, self.log, self.samples, self.hwm = pid, log, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if "VmRSS" not in fields:
                return
            rss = int(fields["VmRSS"].split()[0]) * 1024
            self.hwm = max(self.hwm, int(fields["VmHWM"].split()[0]) * 1024)
            lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
            self.samples.append((time.perf_counter() - self._start, rss, lines[-1] if lines else "(start)"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--runtimes", default="transformers:f32,mlx:f32,iree:f32")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    import yaml
    from driftscope.model.synthetic import benchmark_cache_dir
    from make_3b_shaped import whole_name
    from whole_model import whole_params

    checkpoint = benchmark_cache_dir() / whole_name(args.scale)  # benchmarks/make_3b_shaped.py --whole --scale K
    weights = sum(p.stat().st_size for p in Path(checkpoint).glob("*.safetensors"))
    out = Path(args.out or tempfile.mkdtemp(prefix="driftscope-runmem-"))
    out.mkdir(parents=True, exist_ok=True)
    params = whole_params(checkpoint, ROOT / "fixtures" / "images" / "shapes_448.png", args.runtimes.split(","))
    params["notebooks"] = []
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump(params))
    target = out / "run"
    start = time.perf_counter()
    child = subprocess.Popen(  # the reference cache off: every runtime captures, as on a first run
        [sys.executable, "-m", "driftscope", "run", str(path), "--out", str(target), "--force", "--no-gate"],
        env={**os.environ, "DRIFTSCOPE_REFERENCE_CACHE": "off"},
    )
    timeline = Timeline(child.pid, target / "investigation.log")
    code = child.wait()
    seconds = time.perf_counter() - start
    timeline.stop()
    if code != 0:
        raise SystemExit(f"driftscope run failed ({code})")
    gib = 2**30
    first = next((rss for _, rss, line in timeline.samples if "] capture " in line), 0)
    print(
        f"driftscope run, {args.runtimes}, widths / {args.scale}: {seconds:.0f}s; VmHWM {timeline.hwm / gib:.2f} GiB; "
        f"largest runtime's weights {weights / gib:.2f} GiB (f32 checkpoint), + 1.5 = {weights / gib + 1.5:.2f} GiB; "
        f"above the weights {(timeline.hwm - weights) / gib:.2f} GiB; RSS at the first capture {first / gib:.2f} GiB"
    )
    seen = set()
    for _, rss, line in sorted(timeline.samples, key=lambda s: -s[1]):
        phase = line.split("] ", 1)[-1][:110]
        if phase in seen:
            continue
        seen.add(phase)
        print(f"  {rss / gib:.2f} GiB during: {phase}")
        if len(seen) == 6:
            break
    for label in args.runtimes.split(","):
        at = next((rss for _, rss, line in timeline.samples if f"capture {label}" in line), None)
        peak = max((rss for _, rss, line in timeline.samples if f"capture {label}" in line or label in line), default=0)
        print(
            f"  {label}: RSS at its capture's start {at / gib if at else float('nan'):.2f} GiB, peak {peak / gib:.2f}"
        )


if __name__ == "__main__":
    main()
