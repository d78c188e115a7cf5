"""Rendering after the verdict: a cold notebook kernel (papermill starts it once the report exists) against the
render process's warm one (issue 38, item 3).

    .venv/bin/python benchmarks/render.py RUN_DIR [--notebook 01_stage_parity] [--repeats 3] [--hold 20]

``RUN_DIR`` is a finished ``driftscope run`` (its ``report.json`` and parameter file). Each repeat copies it twice
(without its pages) and renders the notebook both ways, alternating:

- before: the notebook in a thread of this process, as ``driftscope run`` rendered before the render process
  (papermill starts the kernel at once; it waits for the report, then runs every cell, imports included);
- after: the render process (the kernel warmed, the exporters made, before the report exists).

Both start while this process holds the run's result lock (as the investigation does); the lock is released
after ``--hold`` seconds (the report is written: the verdict), and the time from there to the last HTML page is
what is left after the verdict.

Then the two renders' executed notebooks and pages are compared as text, cell by cell (:func:`notebook_text`,
:func:`page_text`: timings, ids and the run's own directory aside), and with ``--against DIR`` each "after" render
with the pages another checkout rendered into ``DIR`` (give ``--params`` as that run was given it: papermill's
parameters cell holds the path); then a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What differs between two renders of one run and says nothing about its content.
VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<clock>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\bT_[0-9a-f]{5}(?=_|\b)"), "<styler>"),  # pandas Styler's table id
    (re.compile(r"\b\d+(\.\d+)? ?s\b"), "<seconds>"),
]


def _plain(text: str, out_dir: Path) -> str:
    text = text.replace(str(out_dir), "<run>")
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def notebook_text(path: Path) -> list[dict]:
    """Each cell of an executed notebook as text: its type, source and outputs (timings and ids aside)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for cell in notebook["cells"]:
        outputs = []
        for output in cell.get("outputs", []):
            kept = {k: v for k, v in output.items() if k not in ("metadata", "execution_count")}
            outputs.append(_plain(json.dumps(kept, sort_keys=True), path.parent))
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        cells.append(
            {
                "type": cell["cell_type"],
                "source": _plain(source, path.parent),
                "count": cell.get("execution_count"),
                "outputs": outputs,
            }
        )
    return cells


def page_text(path: Path) -> list[str]:
    """A rendered page's text, one entry per cell (``jp-Cell`` division), timings and ids aside."""
    html = path.read_text(encoding="utf-8")
    html = re.sub(r'\sid="[^"]*"', "", html)
    parts = re.split(r'<div\s+class="jp-Cell ', html)
    return [_plain(part, path.parent) for part in parts]


def differences(a: Path, b: Path, notebook: str) -> list[str]:
    """Where the two renders of ``notebook`` in run directories ``a`` and ``b`` differ (empty: identical)."""
    found = []
    cells_a, cells_b = notebook_text(a / f"{notebook}.ipynb"), notebook_text(b / f"{notebook}.ipynb")
    if len(cells_a) != len(cells_b):
        found.append(f"{notebook}.ipynb: {len(cells_a)} cells vs {len(cells_b)}")
    for index, (left, right) in enumerate(zip(cells_a, cells_b, strict=False)):
        if left != right:
            found.append(f"{notebook}.ipynb cell {index}: {str(left)[:300]} != {str(right)[:300]}")
    for suffix in (".html", ".nocode.html"):
        pages_a, pages_b = page_text(a / f"{notebook}{suffix}"), page_text(b / f"{notebook}{suffix}")
        if len(pages_a) != len(pages_b):
            found.append(f"{notebook}{suffix}: {len(pages_a)} cells vs {len(pages_b)}")
        for index, (left, right) in enumerate(zip(pages_a, pages_b, strict=False)):
            if left != right:
                at = next(i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y) if left else 0
                found.append(
                    f"{notebook}{suffix} cell {index}: ...{left[at - 80 : at + 120]!r} != {right[at - 80 : at + 120]!r}"
                )
    return found


def copy_run(run: Path, base: Path, name: str) -> Path:
    target = base / name
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("*.ipynb", "*.html", ".*lock*"))
    return target


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every live descendant, with the children they reaped
    (a kernel shut down before the pages are written counts in its parent's): a figure the machine's load from
    other processes changes little, unlike the wall time."""
    import os

    parents, times = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


CPU: dict[str, list[float]] = {"before": [], "after": []}


def render(run: Path, params: Path, notebook: str, hold: float, kind: str) -> float:
    """Seconds from releasing the run's result lock (the report exists: the verdict) to the notebook's last page.

    ``before``: the notebook runs in a thread of this process, as ``driftscope run`` did before the render
    process: papermill starts its kernel at once, the kernel waits for the lock, then runs every cell (the
    imports included) and the HTML is exported by two new exporters. ``after``: the render process."""
    import threading

    from driftscope.run.runlock import result_lock, run_lock
    from driftscope.views.render import run_notebooks
    from driftscope.views.render_process import RenderProcess

    errors: dict = {}
    with run_lock(run):
        with result_lock(run):
            if kind == "after":
                process = RenderProcess.start([notebook], run, params, ROOT, lambda message: None)
            else:
                thread = threading.Thread(
                    target=lambda: errors.update(run_notebooks([notebook], run, params, True, ROOT, echo=False))
                )
                thread.start()
            time.sleep(hold)
            released, cpu = time.perf_counter(), tree_cpu(os.getpid())
        pages = [run / f"{notebook}.html", run / f"{notebook}.nocode.html"]  # written in either order
        while not all(page.exists() for page in pages):
            time.sleep(0.02)
        seconds = time.perf_counter() - released
        CPU[kind].append(tree_cpu(os.getpid()) - cpu)
        if kind == "after":
            errors.update(process.wait())
        else:
            thread.join()
    assert not errors, errors
    return seconds


def cell_seconds(path: Path) -> str:
    """Each code cell's seconds after the one that waited for the report (papermill's own timings)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    durations = [c["metadata"].get("papermill", {}).get("duration") or 0.0 for c in cells]
    waited = max(range(len(durations)), key=durations.__getitem__)
    return " + ".join(f"{d:.2f}" for d in durations[waited + 1 :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished run's directory")
    parser.add_argument("--params", type=Path, help="its parameter file (default: the one its notebooks were given)")
    parser.add_argument("--notebook", default="01_stage_parity")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the lock is held (the investigation)")
    parser.add_argument(
        "--against",
        type=Path,
        help="a run directory this notebook was rendered in by another checkout (RUN_DIR itself, rendered by its "
        "`driftscope run`): each render is compared with it too (this change's pages against the ones before it)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "lib"))
    params = args.params or ROOT / "parameters" / "demo_shapes.yaml"
    times: dict[str, list[float]] = {"before": [], "after": []}
    found: list[str] = []
    with tempfile.TemporaryDirectory(prefix="driftscope-render-") as base:
        for repeat in range(args.repeats):
            runs = {kind: copy_run(args.run, Path(base), f"{kind}{repeat}") for kind in ("before", "after")}
            order = ["before", "after"] if repeat % 2 == 0 else ["after", "before"]
            for kind in order:
                seconds = render(runs[kind], params, args.notebook, args.hold, kind)
                times[kind].append(seconds)
                cells = cell_seconds(runs[kind] / f"{args.notebook}.ipynb")
                print(
                    f"repeat {repeat} {kind}: {seconds:.2f}s after the verdict, {CPU[kind][-1]:.2f} CPU s "
                    f"(cells after it: {cells})",
                    flush=True,
                )
            found += differences(runs["before"], runs["after"], args.notebook)
            if args.against:
                found += [
                    f"against {args.against}: {d}" for d in differences(args.against, runs["after"], args.notebook)
                ]
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print()
    print("| notebook | before: every cell and page after the verdict s | after s | after / before |")
    print("|---|---|---|---|")
    print(
        f"| {args.notebook} | {before:.2f} ({', '.join(f'{t:.2f}' for t in times['before'])}) | "
        f"{after:.2f} ({', '.join(f'{t:.2f}' for t in times['after'])}) | {after / before:.2f}x |"
    )
    cpu_before, cpu_after = statistics.median(CPU["before"]), statistics.median(CPU["after"])
    print(
        f"| CPU seconds after the verdict (this process and its descendants) | {cpu_before:.2f} | {cpu_after:.2f} "
        f"| {cpu_after / cpu_before:.2f}x |"
    )
    print()
    print("content: identical" if not found else "content differs:\n" + "\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
