"""The ``driftscope`` command: run an investigation, re-judge a report, print a report's summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import DriftscopeError


def _run(args: argparse.Namespace) -> int:
    from .investigation import default_out_dir, log
    from .params import load_parameters
    from .render import investigate_and_render
    from .report import Report

    params = load_parameters(args.params)
    out = Path(args.out).resolve() if args.out else default_out_dir(params)
    out.mkdir(parents=True, exist_ok=True)
    log(f"run {params.name} -> {out}")
    errors = investigate_and_render(params, Path(args.params).resolve(), out, not args.force, Path.cwd(), log)
    status = 2 if errors else 0
    report_path = out / "report.json"
    if not report_path.exists():
        log("no report.json was written")
        return 2
    report = Report.load(report_path)
    log(f"report: {report_path} (verdict {report.verdict})")
    if status:
        return status
    return 0 if report.verdict == "pass" or args.no_gate else 1


def _rejudge(args: argparse.Namespace) -> int:
    from .contract import load_contract
    from .report import rejudge
    from .views.tables import summary_markdown

    report = rejudge(args.report, load_contract(args.contract), args.out)
    print(summary_markdown(report))
    print(f"\nwritten: {report.path}")
    return 0 if report.verdict == "pass" else 1


def _show(args: argparse.Namespace) -> int:
    from .report import Report
    from .views.tables import summary_markdown

    report = Report.load(args.report)
    print(summary_markdown(report))
    return 0


def _geometry(args: argparse.Namespace) -> int:
    from .views.geometry import geometry_text

    options = {"window_size": args.window_size} if args.window_size else {}
    print(geometry_text(args.sizes, args.bucket, args.checkpoint, args.family, args.json, **options))
    return 0


def _batch(args: argparse.Namespace) -> int:
    from .batch import exit_code, run_batch
    from .investigation import log

    summaries, directory = run_batch(
        args.params, args.commit, args.jobs, args.scheduler, args.force, args.out_root, log=log
    )
    code = exit_code(summaries)
    log(f"index: {directory / 'index.html'}; junit: {directory / 'junit.xml'}; exit {code}")
    return code


def _diff(args: argparse.Namespace) -> int:
    import json

    from .batch import REPO_ROOT
    from .views.trend import diff_commits, format_diff, resolve_commit_dir

    root = Path(args.out_root or REPO_ROOT / "outputs")
    diff = diff_commits(resolve_commit_dir(root, args.rev_a), resolve_commit_dir(root, args.rev_b), args.factor)
    print(json.dumps(diff, indent=1) if args.json else format_diff(diff))
    return 0


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="driftscope", description="Where, and why, two runtimes of a VLM disagree.")
    sub = main.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an investigation from a parameter file and render its notebooks")
    run.add_argument("params", help="parameter YAML (see parameters/)")
    run.add_argument("--out", help="output directory (default: outputs/<commit>/<name>/)")
    run.add_argument("--force", action="store_true", help="re-run even if a finished report of these parameters exists")
    run.add_argument("--no-gate", action="store_true", help="exit 0 even when the verdict fails")
    run.set_defaults(func=_run)
    again = sub.add_parser("rejudge", help="re-apply another contract to a saved run (no runtime is re-run)")
    again.add_argument("report", help="report.json or its directory")
    again.add_argument("--contract", required=True, help="contract YAML")
    again.add_argument("--out", help="where to write the re-judged report (default: overwrite)")
    again.set_defaults(func=_rejudge)
    show = sub.add_parser("show", help="print a report's verdict and first divergences")
    show.add_argument("report", help="report.json or its directory")
    show.set_defaults(func=_show)
    batch = sub.add_parser("batch", help="run parameter sets for a commit; write the evidence index and JUnit XML")
    batch.add_argument("params", nargs="+", help="parameter YAML files")
    batch.add_argument("--commit", help="run a git revision of the parameters' repository (a temporary worktree)")
    batch.add_argument("--jobs", type=int, default=1, help="local worker processes (default 1)")
    batch.add_argument("--scheduler", help="Dask distributed scheduler address (e.g. tcp://10.0.0.5:8786)")
    batch.add_argument("--force", action="store_true", help="re-run finished runs of the same commit and parameters")
    batch.add_argument("--out-root", help="outputs root (default: outputs/ of this repository)")
    batch.set_defaults(func=_batch)
    diff = sub.add_parser("diff", help="compare the runs of two commits stage by stage")
    diff.add_argument("rev_a")
    diff.add_argument("rev_b")
    diff.add_argument("--out-root", help="outputs root (default: outputs/ of this repository)")
    diff.add_argument("--factor", type=float, default=1.5, help="a change beyond this ratio counts (default 1.5)")
    diff.add_argument("--json", action="store_true", help="print JSON")
    diff.set_defaults(func=_diff)
    geometry = sub.add_parser(
        "geometry", help="the model family's geometry facts (windows, packing, ...) for image sizes"
    )
    geometry.add_argument("sizes", nargs="+", metavar="HxW", help="image sizes, height x width (e.g. 448x672)")
    geometry.add_argument(
        "--bucket", type=int, help="pack the images into a bucket of N patch rows and audit its masks"
    )
    geometry.add_argument("--checkpoint", help="read resize settings from this checkpoint's preprocessor_config.json")
    geometry.add_argument("--family", help="model family (default: the checkpoint's, else the default family)")
    geometry.add_argument("--window-size", type=int, help="attention window side in pixels (families with windows)")
    geometry.add_argument("--json", action="store_true", help="print JSON instead of a table")
    geometry.set_defaults(func=_geometry)
    return main


def main(argv: list[str] | None = None) -> int:
    import logging

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)  # the notebook's own progress lines
    try:
        return int(args.func(args))
    except DriftscopeError as err:
        print(f"driftscope: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
