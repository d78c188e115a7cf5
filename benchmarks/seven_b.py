"""The 7B shape on one 24 GiB machine: the transformers f32 reference streamed from the memory-mapped checkpoint
(``options: {stream: true}``), an MLX bf16 and an IREE f16-contract candidate resident, investigated end to end;
and the streamed reference against the resident one where both fit.

    .venv/bin/python benchmarks/seven_b.py --check [CHECKPOINT]        # streamed vs resident taps, time, memory
    .venv/bin/python benchmarks/seven_b.py --investigate [CHECKPOINT]  # the 7B investigation and its plain forwards

``--check`` captures the whole model (every vision block, the text layers, 8 greedy tokens) with the resident
and with the streamed reference, each in a fresh process: the largest difference of any tap (target <= 1e-6),
each one's seconds, peak RSS (the child's own ``VmHWM``) and the bytes the streamed one read. Default checkpoint:
the 3B shape at widths / 4 (``make_3b_shaped.py --whole --scale 4``); ``--scale 1`` the real 3B widths (~15 GB of
float32, resident in the first child: a quiet 24 GiB machine).

``--investigate`` runs ``driftscope run`` of the three runtimes in a fresh process (every block, the text layers,
8 tokens, the answer teacher-forced: ``text: {forced: always}``; no replay, no notebooks) and samples its memory;
then each runtime's plain forward (tower, prefill, the greedy decode; the streamed reference's own plain pass),
each in a fresh process. Default checkpoint: the 7B shape in bfloat16 (``make_3b_shaped.py --7b``, ~16.6 GB;
``--scale 4`` for the ~1.4 GB variant). Check ``free -g`` first: the run needs most of the machine's memory.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_size import gib  # noqa: E402
from whole_model import ChildMemory, plain_whole, whole_plan, with_text  # noqa: E402

TOKENS = 8
IMAGE = ROOT / "fixtures" / "images" / "shapes_224.png"
#: the investigation's runtimes: the streamed reference first
RUNTIMES = (
    {"runtime": "transformers", "policy": "f32", "options": {"stream": True}, "label": "transformers:f32"},
    "mlx:bf16",
    "iree:f16-contract",
)


def vm_hwm() -> int:
    """This process's resident high-water mark in bytes (``VmHWM``)."""
    text = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("VmHWM:"))) * 1024


def child(args) -> None:
    """In a fresh process: one capture into ``--capture``, or else one plain forward; its figures as JSON on stdout."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.model.blas import mlx_blas

    mlx_blas()
    checkpoint = open_checkpoint(args.checkpoint)
    inputs = with_text(checkpoint, [Path(args.image)], tokens=TOKENS)
    name, policy, stream = args.runtime.split(":")
    runtime = get_runtime(name)(checkpoint, policy, options={"stream": True} if stream == "stream" else {})
    start = time.perf_counter()
    runtime.load()
    load_s = time.perf_counter() - start
    if args.capture:
        tapset = runtime.capture(inputs, whole_plan(checkpoint, TOKENS), Path(args.capture))
        seconds, record = runtime.timings["capture_s"], tapset.meta.get("streamed")
    else:
        with tempfile.TemporaryDirectory(prefix="driftscope-plain-") as scratch:  # the final taps, not kept
            seconds = plain_whole(runtime, inputs, Path(scratch))
        streamer = getattr(runtime, "_streamer", None)
        record = streamer.record() if streamer is not None else None
    print(json.dumps({"load_s": load_s, "seconds": seconds, "hwm": vm_hwm(), "streamed": record}))


def run_child(checkpoint: Path, runtime: str, image: Path, capture: Path | None = None) -> dict:
    command = [sys.executable, __file__, str(checkpoint), "--child", "--runtime", runtime]
    command += ["--image", str(image)] + (["--capture", str(capture)] if capture else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(checkpoint: Path, image: Path, out: Path) -> None:
    """The streamed reference against the resident one: taps, time, memory, bytes read."""
    import numpy as np
    from driftscope.taps.tapset import TapSet

    measured = {}
    for kind in ("resident", "stream"):
        measured[kind] = run_child(checkpoint, f"transformers:f32:{kind}", image, out / kind)
    resident, streamed = TapSet(out / "resident.safetensors"), TapSet(out / "stream.safetensors")
    if resident.stage_ids() != streamed.stage_ids():
        raise RuntimeError(
            f"the two references tapped different stages: {resident.stage_ids()} against {streamed.stage_ids()}"
        )
    worst, where = 0.0, "every tap equal"
    for stage in resident.stage_ids():
        a, b = np.asarray(resident[stage], np.float64), np.asarray(streamed[stage], np.float64)
        if a.shape != b.shape:
            raise RuntimeError(f"{stage}: resident {a.shape}, streamed {b.shape}")
        same = (a == b) | (np.isnan(a) & np.isnan(b))  # a non-finite value on one side only is an infinite difference
        difference = float(np.nan_to_num(np.where(same, 0.0, np.abs(a - b)), nan=np.inf).max()) if a.size else 0.0
        if difference > worst:
            worst, where = difference, stage
    record = measured["stream"]["streamed"]
    size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    print(f"checkpoint {checkpoint} ({gib(size)} GiB), image {image.name}, {TOKENS} tokens")
    print("| reference | load s | capture s | peak RSS GiB |")
    print("|---|---|---|---|")
    for kind, row in measured.items():
        print(f"| {kind} | {row['load_s']:.2f} | {row['seconds']:.2f} | {gib(row['hwm'])} |")
    print(
        f"\nlargest difference of any of {len(resident.stage_ids())} taps: {worst:.3g} ({where}; target <= 1e-6); "
        f"streamed: {record['passes']} passes, {gib(record['mapped_bytes_read'])} GiB read from the mapping, "
        f"{gib(record['disk_bytes_read'])} GiB from the disk, at most {gib(record['peak_resident_weight_bytes'])} "
        "GiB of weights resident"
    )


def investigate(checkpoint: Path, image: Path, out: Path) -> None:
    """The investigation in a fresh process, then each runtime's plain forward in one of its own."""
    import yaml
    from driftscope.run.report import Report

    params = {
        "name": "seven-b",
        "checkpoint": str(checkpoint),
        "images": [str(image)],
        "runtimes": list(RUNTIMES),
        "stages": {"blocks": True},
        "text": {"max_new_tokens": TOKENS, "forced": "always"},
        "replay": False,
        "narrow": False,
        "notebooks": [],
    }
    path = out / "seven-b.yaml"
    path.write_text(yaml.safe_dump(params))
    target = out / "run"
    env = {**os.environ, "DRIFTSCOPE_REFERENCE_CACHE": "off"}
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "driftscope", "run", str(path), "--out", str(target), "--force", "--no-gate"], env=env
    )
    memory = ChildMemory(process.pid, target / "investigation.log")
    io_path = Path(f"/proc/{process.pid}/io")
    disk = 0
    while process.poll() is None:
        try:
            disk = max(disk, int(next(x.split()[1] for x in io_path.read_text().splitlines() if "read_bytes" in x)))
        except (OSError, StopIteration):
            pass
        time.sleep(0.5)
    seconds = time.perf_counter() - start
    memory.stop()
    if process.returncode not in (0, 1):  # 0 pass, 1 fail: both are a finished investigation
        log = target / "investigation.log"
        at = ", ".join(f"{label} {gib(rss)}" for label, rss in memory.at_capture.items())
        raise RuntimeError(
            f"driftscope run exited {process.returncode} after {seconds:.0f} s (peak RSS {gib(memory.hwm)} GiB; "
            f"RSS GiB when each capture started: {at}); see {log}"
        )
    report = Report.load(target / "report.json")
    #: each runtime's plain forward, in a fresh process each: (the run's label, the child's runtime spec)
    plain_specs = {
        "transformers:f32": "transformers:f32:stream",
        "mlx:bf16": "mlx:bf16:",
        "iree:f16-contract": "iree:f16-contract:",
    }
    plains = {label: run_child(checkpoint, spec, image) for label, spec in plain_specs.items()}
    run = {"seconds": seconds, "hwm": memory.hwm, "at_capture": memory.at_capture, "disk": disk}
    (out / "seven-b.json").write_text(json.dumps({"run": run, "plains": plains}, indent=1))
    summarize(checkpoint, image, report.data, run, plains)


def summarize(checkpoint: Path, image: Path, data: dict, run: dict, plains: dict) -> None:
    """The investigation's figures as a Markdown table and lines (``run``: its seconds, VmHWM, RSS when each
    capture started and bytes read from the disk; ``plains``: each runtime's plain forward, by the run's label)."""
    seconds, disk = run["seconds"], run["disk"]
    captures = {r["label"]: r for r in data["runtimes"]}
    size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    print(f"checkpoint {checkpoint} ({gib(size)} GiB), image {image.name}, {TOKENS} tokens, forced: always")
    print("| runtime | plain forward s | plain peak RSS GiB | load + capture in the run s | answer evidence |")
    print("|---|---|---|---|---|")
    for label, plain in plains.items():
        entry = captures[label]
        timings, evidence = entry.get("timings", {}), entry.get("answer_evidence") or {}
        taken = [kind for kind in ("teacher_forcing", "topk_maps", "kv_cache") if evidence.get(kind)]
        print(
            f"| {label}{' (streamed)' if label == 'transformers:f32' else ''} | {plain['seconds']:.1f} | "
            f"{gib(plain['hwm'])} | {timings.get('load_s', 0):.1f} + {timings.get('capture_s', 0):.1f} | "
            f"{', '.join(taken) or '-'} |"
        )
    total = sum(p["seconds"] for p in plains.values())
    print(
        f"\ninvestigation: {seconds:.1f} s = {seconds / total:.2f}x the three plain forwards ({total:.1f} s); "
        f"verdict {data['verdict']['status']}; peak RSS (VmHWM) {gib(run['hwm'])} GiB (target <= 20); RSS when "
        "each capture started: " + ", ".join(f"{k} {gib(v)}" for k, v in run["at_capture"].items())
    )
    streamed = plains["transformers:f32"]["streamed"] or {}
    print(
        f"read from the disk by the run: {gib(disk)} GiB; the streamed reference's plain pass: "
        f"{streamed.get('passes')} passes, {gib(streamed.get('mapped_bytes_read', 0))} GiB from the mapping, "
        f"{gib(streamed.get('disk_bytes_read', 0))} GiB from the disk, at most "
        f"{gib(streamed.get('peak_resident_weight_bytes', 0))} GiB of weights resident"
    )
    depths = compared_depths(data["rows"])
    config = json.loads((checkpoint / "config.json").read_text())
    depth, layers_of = config["vision_config"]["depth"], config["text_config"]["num_hidden_layers"]
    for candidate, pair in ((p["candidate"], p) for p in (data.get("answer") or {}).get("pairs", [])):
        blocks, layers = depths.get(candidate, (set(), set()))
        print(
            f"{candidate}: {len(blocks)}/{depth} vision blocks and {len(layers)}/{layers_of} text layers compared; "
            "teacher-forced steps "
            f"{(pair.get('forced') or {}).get('steps_compared')}; tokens identical: {pair.get('identical')}"
        )


def compared_depths(rows: list[dict]) -> dict[str, tuple[set[int], set[int]]]:
    """Per candidate, the vision blocks and text layers whose outputs have a row."""
    found: dict[str, tuple[set[int], set[int]]] = {}
    for row in rows:
        kind, _, rest = row["stage"].partition(".")
        parts = rest.split(".")
        if len(parts) >= 2 and parts[1].isdigit() and (kind, parts[0]) in (("vision", "block"), ("text", "layer")):
            blocks, layers = found.setdefault(row["candidate"], (set(), set()))
            (blocks if kind == "vision" else layers).add(int(parts[1]))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", help="a whole Qwen2.5-VL checkpoint (default: see above)")
    parser.add_argument("--check", action="store_true", help="the streamed reference against the resident one")
    parser.add_argument("--investigate", action="store_true", help="the 7B investigation and its plain forwards")
    parser.add_argument(
        "--scale",
        type=int,
        help="the default checkpoint's width divisor (default: 4 with --check, 1 with --investigate)",
    )
    parser.add_argument("--image", default=str(IMAGE))
    parser.add_argument("--out", help="keep outputs here (default: a temporary folder)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runtime", help=argparse.SUPPRESS)
    parser.add_argument("--capture", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.check == args.investigate:
        parser.error("say --check or --investigate")
    from make_3b_shaped import ensure_7b, ensure_whole

    out = Path(args.out or tempfile.mkdtemp(prefix="driftscope-7b-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"outputs in {out}", flush=True)
    if args.check:
        checkpoint = Path(args.checkpoint) if args.checkpoint else ensure_whole(args.scale or 4)[0]
        return check(checkpoint, Path(args.image), out)
    checkpoint = Path(args.checkpoint) if args.checkpoint else ensure_7b(args.scale or 1)
    return investigate(checkpoint, Path(args.image), out)


if __name__ == "__main__":
    main()
