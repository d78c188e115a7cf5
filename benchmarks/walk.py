"""Follow one parameter file through ``investigate()``: which modules the run enters, which cross-module calls it
makes, and how many of those go up the layers (a lower layer calling back into a higher one).

    .venv/bin/python benchmarks/walk.py --trace walk.json            # trace this tree's package
    PYTHONPATH=/old/lib .venv/bin/python benchmarks/walk.py --trace old.json   # another checkout's
    .venv/bin/python benchmarks/walk.py --summarize old.json walk.json

The run: the tiny Qwen2.5-VL fixture on the 448x448 shapes image, transformers f32 (reference), MLX f32 and MLX
bf16 (which diverges, so narrowing and replay run), notebooks not rendered. Calls are counted on the main thread
(the investigation's own), from a driftscope function to a function of another driftscope module; a module of
the old flat package (before the layers) is mapped to its layer through ``MOVED``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ["transformers:f32", "mlx:f32", "mlx:bf16"]

#: Where each module of the old flat package lives in the layered one (to summarize a trace of an old checkout).
MOVED = {
    "registry": "core.registry",
    "atomic": "core.atomic",
    "markup": "core.markup",
    "names": "core.names",
    "storage": "core.storage",
    "worktree": "core.worktree",
    "checkpoint": "model.checkpoint",
    "checkpoint_storage": "model.checkpoint_storage",
    "weightfile": "model.weightfile",
    "precision": "model.precision",
    "tf32": "model.tf32",
    "blas": "model.blas",
    "synthetic": "model.synthetic",
    "quant": "model.quant",
    "quant.policy": "model.quant.policy",
    "quant.select": "model.quant.select",
    "quant.affine": "model.quant.affine",
    "quant.host": "model.quant.host",
    "quant.mlx_checkpoint": "model.quant.mlx_checkpoint",
    "quant.directory": "model.quant.directory",
    "quant.dense_checkpoint": "model.quant.dense_checkpoint",
    "quant.names": "model.quant.names",
    "quant.profiles": "model.quant.profiles",
    "engine_inputs": "inputs.engine_inputs",
    "text_inputs": "inputs.text_inputs",
    "stages": "taps.stages",
    "tapset": "taps.tapset",
    "sidecar": "taps.sidecar",
    "tapunion": "taps.tapunion",
    "compiled": "taps.jax",
    "compiled.graph": "taps.jax.graph",
    "compiled.layers": "taps.jax.layers",
    "hypotheses": "families.hypotheses",
    "runtimes": "capture.runtimes",
    "runtimes.base": "capture.runtimes.base",
    "runtimes.compiled": "capture.runtimes.compiled",
    "runtimes.mlx_runtime": "capture.runtimes.mlx_runtime",
    "runtimes.tapfile_runtime": "capture.runtimes.tapfile_runtime",
    "runtimes.transformers_runtime": "capture.runtimes.transformers_runtime",
    "compiled.iree": "capture.iree",
    "runtime_checks": "capture.runtime_checks",
    "patches": "capture.patches",
    "quant.loading": "capture.quantized",
    "quant.linear_replay": "capture.linear_replay",
    "quant.linear_controls": "capture.linear_controls",
    "stage_listing": "capture.stage_listing",
    "contract": "judge.contract",
    "compare": "judge.compare",
    "layout": "judge.layout",
    "traversal": "judge.traversal",
    "rows": "judge.rows",
    "relative": "judge.relative",
    "answer": "judge.answer",
    "lineage": "judge.lineage",
    "quant.attribution": "judge.attribution",
    "power": "replay.power",
    "params": "run.params",
    "preflight": "run.preflight",
    "investigation": "run.investigation",
    "report": "run.report",
    "runrecord": "run.runrecord",
    "runlock": "run.runlock",
    "outdirs": "run.outdirs",
    "environment": "run.environment",
    "candidates": "run.candidates",
    "recapture": "run.patch_trial",
    "executor": "batch.executor",
    "worker": "batch.worker",
    "views.evidence": "batch.evidence",
    "render": "views.render",
}


def trace(out: Path) -> None:
    import driftscope
    import yaml

    work = Path(tempfile.mkdtemp(prefix="driftscope-walk-"))
    params = work / "walk.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "walk",
                "checkpoint": str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"),
                "images": [str(ROOT / "fixtures" / "images" / "shapes_448.png")],
                "runtimes": RUNTIMES,
            }
        )
    )
    edges: Counter = Counter()
    main = threading.main_thread()

    def profile(frame, event, arg):
        if event != "call" or threading.current_thread() is not main:
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("driftscope") and caller.startswith("driftscope") and callee != caller:
            edges[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        report = driftscope.investigate(str(params), work / "out")
    finally:
        sys.setprofile(None)
    out.write_text(
        json.dumps(
            {
                "package": str(Path(driftscope.__file__).parent),
                "verdict": report.verdict,
                "edges": [[a, b, n] for (a, b), n in sorted(edges.items())],
            },
            indent=1,
        )
    )
    print(f"wrote {out}: {len(edges)} cross-module call edges, verdict {report.verdict}")


def layer_of(module: str) -> tuple[str, int]:
    """The module's name in today's layout and its layer's rank (0 the lowest; the root's modules rank top)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"][::-1]  # lowest first
    name = module.removeprefix("driftscope.")
    for old, new in sorted(MOVED.items(), key=lambda item: -len(item[0])):
        if name == old or name.startswith(old + "."):
            name = new + name[len(old) :]
            break
    top = f"driftscope.{name.split('.')[0]}"
    return name, layers.index(top) if top in layers else len(layers)


def summarize(paths: list[Path]) -> None:
    print("| trace | modules entered | cross-module call edges | calls | edges going up a layer |")
    print("|---|---|---|---|---|")
    for path in paths:
        data = json.loads(path.read_text())
        modules, up, calls = set(), [], 0
        for caller, callee, count in data["edges"]:
            (a, rank_a), (b, rank_b) = layer_of(caller), layer_of(callee)
            modules |= {a, b}
            calls += count
            if rank_b > rank_a:
                up.append(f"{a} -> {b}")
        print(f"| {path.name} | {len(modules)} | {len(data['edges'])} | {calls} | {len(up)} |")
        for edge in up:
            print(f"|   up: {edge} | | | | |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="trace investigate() into this JSON file")
    parser.add_argument("--summarize", type=Path, nargs="+", help="summarize trace files side by side")
    args = parser.parse_args(argv)
    if args.trace:
        trace(args.trace)
    if args.summarize:
        summarize(args.summarize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
