"""What a notebook kernel's warm-up costs, with the views' image conversion from driftscope and from transformers.

    .venv/bin/python benchmarks/kernel_warm_up.py [--notebook 01_stage_parity] [--repeats 3]

Each repeat runs, in a fresh interpreter each and alternating, the warm-up a kernel runs before the report exists
(``views.warm.warm_up_code`` of the notebook: its imports, the views' imports, a first figure, table and plotly
figure) two ways: as it is (``from driftscope.inputs.rgb import to_rgb``) and with the views' former image
conversion import (``from transformers.image_transforms import convert_to_rgb``, which imports torch and
transformers). Prints each way's median CPU seconds (user + system) and wall seconds, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMER = "from transformers.image_transforms import convert_to_rgb"
CHILD = """
import json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
from driftscope.views.warm import VIEW_IMPORTS, warm_up_code
former = sys.argv[2]  # the import that replaces driftscope.inputs.rgb's, or "" for the warm-up as it is
extra = tuple(s for s in VIEW_IMPORTS if "driftscope.inputs.rgb" not in s) + (former,) if former else VIEW_IMPORTS
exec(warm_up_code(Path(sys.argv[1]), extra))
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "wall": time.perf_counter() - start,
                  "torch": "torch" in sys.modules}))
"""


def measure(notebook: Path, former: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(notebook), FORMER if former else ""],
        capture_output=True,
        text=True,
        cwd=ROOT / "notebooks",
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", default="01_stage_parity")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    notebook = ROOT / "notebooks" / f"{args.notebook}.ipynb"
    runs: dict[str, list[dict]] = {"now": [], "former": []}
    for _ in range(args.repeats):
        runs["former"].append(measure(notebook, True))
        runs["now"].append(measure(notebook, False))
    median = {way: {k: statistics.median(r[k] for r in rs) for k in ("cpu", "wall")} for way, rs in runs.items()}
    print(f"| warm-up of {args.notebook} ({args.repeats} repeats, median) | CPU s | wall s | imports torch |")
    print("|---|---|---|---|")
    for way, label in (("former", f"with `{FORMER}`"), ("now", "with `driftscope.inputs.rgb`")):
        torch = all(r["torch"] for r in runs[way])
        print(f"| {label} | {median[way]['cpu']:.2f} | {median[way]['wall']:.2f} | {'yes' if torch else 'no'} |")
    ratio = median["now"]["cpu"] / median["former"]["cpu"]
    print(f"\nCPU ratio now / former: {ratio:.2f}x; wall: {median['now']['wall'] / median['former']['wall']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
