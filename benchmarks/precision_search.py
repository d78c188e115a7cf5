"""The precision search's cost on the layer-17 case (issue 36), measured against the run it starts from.

    .venv/bin/python benchmarks/precision_search.py [--out DIR] [--no-verify]

Runs ``parameters/case_layer17.yaml`` (without its notebooks, so the run is only the investigation) in a fresh
process, as ``driftscope run`` does, then ``driftscope precision`` for the manual-RMSNorm candidate in another
(search, then the real run of the policy it found). Each process's wall and CPU seconds come from the OS; the
search's own probes and seconds from the report it wrote. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CANDIDATE = "mlx:f16-manual-rmsnorm"


def _timed(command: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.perf_counter() - start, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the run's directory (default: a fresh temporary one)")
    parser.add_argument("--no-verify", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="precision-bench-")) / "case-layer17"
    data = yaml.safe_load((ROOT / "parameters" / "case_layer17.yaml").read_text())
    data["notebooks"] = []
    params = ROOT / "outputs" / "precision-bench.yaml"  # under the repository: its relative paths resolve there
    params.parent.mkdir(exist_ok=True)
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    driftscope = [sys.executable, "-m", "driftscope.cli"]
    run_wall, run_cpu = _timed([*driftscope, "run", str(params), "--out", str(out), "--force", "--no-gate"])
    search = [*driftscope, "precision", str(params), "--candidate", CANDIDATE, "--run", str(out)]
    search_wall, search_cpu = _timed(search + (["--no-verify"] if args.no_verify else []))
    entry = json.loads((out / "report.json").read_text())["precision"][CANDIDATE]
    verified = entry.get("verified") or {}
    probes = len(entry["probes"]) - 1
    print(f"case-layer17 (32 blocks, 2 images, 1600 patches), candidate {CANDIDATE}; run directory {out}\n")
    print("| | wall s | CPU s |")
    print("|---|---|---|")
    print(f"| the run (4 runtimes, text, narrowing, replay) | {run_wall:.1f} | {run_cpu:.1f} |")
    print(f"| `driftscope precision` process (search + verifying run) | {search_wall:.1f} | {search_cpu:.1f} |")
    print(f"| the search alone ({probes} probes, bound {entry['bound']}) | {entry['seconds']:.1f} | |")
    if verified:
        print(
            f"| the verifying run of the policy ({verified['label']}: {verified['verdict']}) | "
            f"{verified['seconds']:.1f} | |"
        )
    print(f"\nanswer: {entry['message']}")
    print(
        f"search / run (wall): {entry['seconds'] / run_wall:.2f}x; whole precision process / run: "
        f"{search_wall / run_wall:.2f}x (CPU {search_cpu / run_cpu:.2f}x)"
    )
    for probe in entry["probes"]:
        print(
            f"  probe {probe['index']:2d} {probe['phase']:11s} {', '.join(probe['f32'])[:60] or '-':60s} "
            f"{'pass' if probe['passed'] else 'fail'} {probe['tolerance_used']:8.3g} {probe['recaptured']:3d} "
            f"stages {probe['seconds']:6.1f}s"
        )


if __name__ == "__main__":
    main()
