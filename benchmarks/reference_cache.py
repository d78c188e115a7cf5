"""``driftscope batch`` over commits with the reference cache against without it, measured side by side.

    .venv/bin/python benchmarks/reference_cache.py --commits A B C [--params parameters/demo_shapes.yaml]

For each commit in turn, one ``driftscope batch --commit C`` with ``--reference-cache off`` and one with a
fresh cache directory (shared by the commits of that series), alternating so both series see the same machine
load. Each batch writes to its own output root, so no finished run is reused; the IREE artifact cache
(``$DRIFTSCOPE_CACHE``) is shared and warmed by one batch first, so both series compile nothing. Prints each
batch's wall time, the reference cache's outcome in each report, and the ratio of the two series' sums.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def batch(commit: str, params: str, out_root: Path, cache: str) -> tuple[float, int]:
    command = [sys.executable, "-m", "driftscope", "batch", params, "--commit", commit, "--out-root", str(out_root)]
    start = time.perf_counter()
    done = subprocess.run([*command, "--reference-cache", cache], cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def outcome(out_root: Path) -> str:
    reports = sorted(out_root.glob("*/*/report.json"))
    if not reports:
        return "no report"
    data = json.loads(reports[-1].read_text())
    ref = data.get("reference_cache") or {}
    power = (data.get("power") or {}).get("reference_cache") or {}
    mutations = f"; mutations {power.get('hit', 0)}/{len(power.get('captures', []))} hit" if power else ""
    return f"{data.get('status')}, reference {ref.get('status', 'off')}{mutations}"


def _seconds(a: str, b: str) -> float:
    parse = lambda t: time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ"))  # noqa: E731
    return parse(b) - parse(a)


def steps(work: Path) -> None:
    """Where each batch's investigation spent its time, from its report's progress (whole seconds)."""
    print("\n| batch | investigation s | reference capture s | power s | rest of the batch (notebooks, HTML) s |")
    print("|---|---|---|---|---|")
    for report in sorted(work.glob("*/*/*/report.json")):
        data = json.loads(report.read_text())
        progress = data.get("progress") or []
        spans = {}
        for here, after in zip(progress, progress[1:], strict=False):
            spans[here["step"]] = spans.get(here["step"], 0.0) + _seconds(here["at"], after["at"])
        total = _seconds(data["created"], data["updated"])
        record = json.loads((report.parent / "run.json").read_text()) if (report.parent / "run.json").exists() else {}
        rest = float(record.get("seconds") or 0.0) - total
        reference = spans.get(f"capture:{data.get('reference')}", 0.0)
        name = report.parts[-4]
        print(f"| {name} | {total:.0f} | {reference:.0f} | {spans.get('power', 0.0):.0f} | {rest:.0f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", nargs="+", default=[])
    parser.add_argument("--params", default="parameters/demo_shapes.yaml")
    parser.add_argument("--work", help="scratch directory (default: a new temporary one)")
    parser.add_argument("--cache-first", action="store_true", help="per commit, the batch with the cache first")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-up batch (artifacts already cached)")
    parser.add_argument("--steps", action="store_true", help="only print where the batches in --work spent their time")
    args = parser.parse_args(argv)
    if args.steps:
        steps(Path(args.work))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="driftscope-refcache-bench-"))
    os.environ.setdefault("DRIFTSCOPE_CACHE", str(work / "cache"))
    cache = os.environ["DRIFTSCOPE_CACHE"]
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; DRIFTSCOPE_CACHE={cache}", flush=True)
    if not args.no_warm:
        seconds, code = batch(args.commits[0], args.params, work / "warm", "off")
        print(f"warm-up (IREE artifacts): {seconds:.1f}s exit {code}", flush=True)
    rows = []
    for index, commit in enumerate(args.commits):
        row = {"commit": commit}
        order = (("off", "off"), ("on", str(work / "refcache")))
        for series, cache in reversed(order) if args.cache_first else order:
            out_root = work / f"{series}-{index}"
            seconds, code = batch(commit, args.params, out_root, cache)
            row[series] = (seconds, code, outcome(out_root))
            print(f"{commit} {series}: {seconds:.1f}s exit {code} ({row[series][2]})", flush=True)
        rows.append(row)
    print("\n| commit | without the cache s | with the cache s | with / without | with: reference taps |")
    print("|---|---|---|---|---|")
    for row in rows:
        off, on = row["off"][0], row["on"][0]
        print(f"| {row['commit'][:10]} | {off:.1f} | {on:.1f} | {on / off:.2f}x | {row['on'][2]} |")
    total_off = sum(row["off"][0] for row in rows)
    total_on = sum(row["on"][0] for row in rows)
    print(
        f"\nbatch over {len(rows)} commits: {total_on:.1f}s with the cache, {total_off:.1f}s without: "
        f"{total_on / total_off:.2f}x; load at the end {os.getloadavg()[0]:.1f}"
    )
    steps(work)


if __name__ == "__main__":
    main()
