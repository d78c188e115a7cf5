"""The ``driftscope`` command: run an investigation, re-judge a report, print a report's summary.

``screen``: 0 the screen ranked its inputs (whatever they scored), 2 it could not run, 130 interrupted (run it
again to resume).

Exit codes, for every command that judges (run, rejudge, show, diff, batch): 0 the verdict passes, 1 it
fails (for diff: a run got worse), 2 something could not run (bad parameters, checkpoint, image,
contract, runtime, policy or patch; an unreadable or unfinished report; a notebook error). ``trend``: 0 its
notebook rendered, 2 it could not. ``precision``: 0 a set of float32 operators closes the candidate's failure (and
the real run of its policy passes), 1 none does (or that run fails), 2 it could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import DriftscopeError


def _exit_code(report) -> int:
    """The one exit-code contract: 0 the verdict passes, 1 it fails, 2 the run could not execute or finish."""
    if report.status != "complete" or report.verdict not in ("pass", "fail"):
        return 2
    return 0 if report.verdict == "pass" else 1


def _run(args: argparse.Namespace) -> int:
    from driftscope.run.investigation import default_out_dir, log
    from driftscope.run.params import load_parameters
    from driftscope.run.preflight import check_parameters
    from driftscope.run.report import Report
    from driftscope.views.failure import pages_beside_the_verdict
    from driftscope.views.render_process import investigate_and_render
    from driftscope.views.run_state import rendered_current

    _reference_cache(args)
    params = load_parameters(args.params)
    check_parameters(params)  # every parameter error before a kernel starts or a model loads
    out = Path(args.out).resolve() if args.out else default_out_dir(params)
    _output_directory(out)
    if not (args.force or args.render) and rendered_current(out, params):
        report = Report.load(out / "report.json")
        log(f"reusing the finished run in {out} and its rendered notebooks (--render renders them again)")
        log(f"report: {report.path} (verdict {report.verdict})")
        return 0 if args.no_gate else _exit_code(report)
    log(f"run {params.name} -> {out}")
    errors = investigate_and_render(params, Path(params.source).resolve(), out, not args.force, Path.cwd(), log)
    report = Report.load(out / "report.json")
    log(f"report: {report.path} (verdict {report.verdict})")
    code, stopped = _exit_code(report), report.status != "complete"
    if errors and not stopped and "investigation" not in errors and code != 2:  # a failed page: the verdict stands
        pages_beside_the_verdict(report, errors, log)
        return 0 if args.no_gate else code
    if errors or code == 2:
        from driftscope.views.failure import summary_lines

        error_type = (report.data.get("error") or {}).get("type")
        for line in summary_lines(errors, report.data.get("stopped_at") if stopped else None, error_type):
            log(line)
        if stopped and "investigation" not in errors:
            log(f"the investigation {report.stopped()}")
        return 2
    return 0 if args.no_gate else code


def _reference_cache(args: argparse.Namespace) -> None:
    from driftscope.run.refcache import set_cache_option

    set_cache_option(args.reference_cache)


def _output_directory(out: Path) -> None:
    """Make the output directory, or say why it cannot be one."""
    from .errors import ParameterError

    if out.exists() and not out.is_dir():
        raise ParameterError(f"--out {out} is a file, not a directory", "pass a directory (it is made if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ParameterError(f"cannot make the output directory {out}: {err.strerror}", "pass another --out") from None


def _rejudge(args: argparse.Namespace) -> int:
    from driftscope.core.paths import contract_file
    from driftscope.judge.contract import load_contract
    from driftscope.run.rejudge import rejudge

    from .views.terminal import summary

    report = rejudge(args.report, load_contract(contract_file(args.contract)), args.out)
    print(summary(report, args.format))
    print(f"\nwritten: {report.path}")
    return _exit_code(report)


def _precision(args: argparse.Namespace) -> int:
    from driftscope.run.investigation import default_out_dir, log
    from driftscope.run.params import load_parameters
    from driftscope.run.precision_run import precision_exit_code, precision_search, run_of

    params = load_parameters(args.params)
    out = Path(args.run).resolve() if args.run else default_out_dir(params)
    entry = precision_search(run_of(params, args.params, out, log), args.candidate, not args.no_verify, log)
    if not args.no_render:
        from driftscope.views import execution, pages

        parameters = {"params_path": args.params, "out_dir": str(out), "candidate": args.candidate}
        html, _ = pages.to_html(execution.execute("07_precision_search", out, parameters, Path.cwd(), log_output=False))
        log(f"rendered {html}")
    return precision_exit_code(entry, log)


def _show(args: argparse.Namespace) -> int:
    from driftscope.run.report import Report

    from .views.terminal import summary

    report = Report.load(args.report)
    print(summary(report, args.format))
    return _exit_code(report)


def _geometry(args: argparse.Namespace) -> int:
    from .views.geometry import geometry_text

    options = {"window_size": args.window_size} if args.window_size else {}
    print(geometry_text(args.sizes, args.bucket, args.checkpoint, args.family, args.json, **options))
    return 0


def _stages(args: argparse.Namespace) -> int:
    from driftscope.capture.stage_listing import list_stages

    print(list_stages(args.checkpoint, args.images, args.json, args.write_inputs, args.videos))
    return 0


def _batch(args: argparse.Namespace) -> int:
    from driftscope.batch.runner import run_batch
    from driftscope.run.investigation import log

    _reference_cache(args)
    result = run_batch(args.params, args.commit, args.jobs, args.scheduler, args.force, args.out_root, log=log)
    log(f"index: {result.index}; junit: {result.junit}; exit {result.code}")
    return result.code


def _sweep(args: argparse.Namespace) -> int:
    from driftscope.batch.sweep import run_sweep
    from driftscope.run.investigation import log

    rows = run_sweep(args.model_types, Path(args.out) if args.out else None, args.docs, log)
    failed = [row for row in rows if row.verdict != "pass"]
    log(f"{len(rows) - len(failed)} of {len(rows)} model types pass; the table: sweep.md beside sweep.json")
    return 2 if any(row.verdict == "could not run" for row in rows) else (1 if failed else 0)


def _screen(args: argparse.Namespace) -> int:
    from driftscope.run.investigation import log
    from driftscope.screen.runner import screen

    if args.top < 0:
        from .errors import ParameterError

        raise ParameterError(f"--top {args.top} is negative", "pass --top 0 or more (0: investigate none)")
    try:
        result = screen(
            args.params,
            args.images,
            args.prompts,
            top=args.top,
            investigate=not args.no_investigate,
            scheduler=args.scheduler,
            out=args.out,
            log=log,
        )
    except KeyboardInterrupt:
        log("screen interrupted: every finished capture is kept; run the same command again to resume")
        return 130
    for entry in result.ranking[: max(args.top, 5)]:
        score = "could not run" if entry.get("score") is None else f"{entry['score']:.3f}"
        log(f"  {score:>13}  {entry['label']}  ({entry.get('worst') or '-'})")
    return 0


def _diff(args: argparse.Namespace) -> int:
    import json

    from driftscope.core.paths import outputs_root

    from .views.trend import diff_commits, diff_exit_code, format_diff, resolve_commit_dir

    root = Path(args.out_root or outputs_root())
    diff = diff_commits(resolve_commit_dir(root, args.rev_a), resolve_commit_dir(root, args.rev_b), args.factor)
    print(json.dumps(diff, indent=1) if args.json else format_diff(diff))
    return diff_exit_code(diff, args.fail_on, args.allow_missing)


def _trend(args: argparse.Namespace) -> int:
    from driftscope.core.paths import outputs_root
    from driftscope.run.investigation import log
    from driftscope.views import execution, pages

    from .views.history import from_parameters

    root = Path(args.out_root or outputs_root(args.params))
    choice = from_parameters(
        args.params, None, root, None, args.run, args.rev_a, args.rev_b, args.factor, names=("--from", "--to")
    )
    out = Path(args.out) if args.out else choice.root / "trend" / f"{choice.before.name}..{choice.after.name}"
    _output_directory(out)
    parameters = {
        "params_path": args.params,
        "out_root": str(choice.root),
        "run": choice.run,
        "rev_a": choice.before.name,
        "rev_b": choice.after.name,
        "factor": args.factor,
    }
    log(f"trend of {choice.run}: {choice.before.name} -> {choice.after.name} -> {out}")
    try:
        executed = execution.execute("05_commit_trend", out, parameters, cwd=Path.cwd(), log_output=False)
    except Exception as err:  # noqa: BLE001 - papermill raises PapermillExecutionError with the cell's error
        name = getattr(err, "ename", type(err).__name__)
        log(f"could not run: 05_commit_trend: {name}: {getattr(err, 'evalue', err)}")
        executed, failed = out / "05_commit_trend.ipynb", True
    else:
        failed = False
    if executed.exists():
        html, nocode = pages.to_html(executed)
        log(f"rendered {html} and {nocode.name}")
    return 2 if failed else 0


def parser() -> argparse.ArgumentParser:
    from .cli_help import FORMAT_HELP, FORMATS, REFERENCE_CACHE_HELP, explain
    from .run.init_params import init_command  # light: no framework, no model

    main = argparse.ArgumentParser(prog="driftscope", description="Where, and why, two runtimes of a VLM disagree.")
    main.add_argument(
        "-v", "--verbose", action="store_true", help="also print papermill's and nbconvert's own progress messages"
    )
    sub = main.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an investigation from a parameter file and render its notebooks")
    run.add_argument("params", help="parameter YAML (see parameters/)")
    run.add_argument("--out", help="output directory (default: outputs/<commit>/<name>/)")
    run.add_argument("--force", action="store_true", help="re-run even if a finished report of these parameters exists")
    run.add_argument(
        "--render", action="store_true", help="execute and render the notebooks again even when they are current"
    )
    run.add_argument("--no-gate", action="store_true", help="exit 0 even when the verdict fails")
    run.add_argument("--reference-cache", metavar="DIR|off", help=REFERENCE_CACHE_HELP)
    run.set_defaults(func=_run)
    again = sub.add_parser("rejudge", help="re-apply another contract to a saved run (no runtime is re-run)")
    again.add_argument("report", help="report.json or its directory")
    again.add_argument("--contract", required=True, help="contract YAML, or a shipped one by name (default, strict)")
    again.add_argument("--out", help="where to write the re-judged report (default: overwrite the run's report.json)")
    again.add_argument("--format", choices=FORMATS, default="auto", help=FORMAT_HELP)
    again.set_defaults(func=_rejudge)
    precision = sub.add_parser(
        "precision", help="search a failing half-precision candidate for the fewest operators to keep in float32"
    )
    precision.add_argument("params", help="the run's parameter YAML")
    precision.add_argument("--candidate", required=True, help="the candidate's runtime label in the run")
    precision.add_argument("--out", "--run", dest="run", help="the run's directory, made first if missing")
    precision.add_argument("--no-verify", action="store_true", help="do not run the found policy for real")
    precision.add_argument(
        "--no-render", action="store_true", help="do not render notebook 07 into the run's directory"
    )
    precision.set_defaults(func=_precision)
    show = sub.add_parser("show", help="print a report's verdict and first divergences")
    show.add_argument("report", help="report.json or its directory")
    show.add_argument("--format", choices=FORMATS, default="auto", help=FORMAT_HELP)
    show.set_defaults(func=_show)
    batch = sub.add_parser("batch", help="run parameter sets for a commit; write the evidence index and JUnit XML")
    batch.add_argument("params", nargs="+", help="parameter YAML files")
    batch.add_argument("--commit", help="run a git revision of the parameters' repository (a temporary worktree)")
    batch.add_argument(
        "--jobs", type=int, default=1, help="runs at a time on this machine, each its own process (default 1)"
    )
    batch.add_argument("--scheduler", help="Dask distributed scheduler address (e.g. tcp://10.0.0.5:8786)")
    batch.add_argument("--force", action="store_true", help="re-run finished runs of the same commit and parameters")
    batch.add_argument("--reference-cache", metavar="DIR|off", help=REFERENCE_CACHE_HELP)
    batch.add_argument(
        "--out-root", help="outputs root: a directory or a URL such as s3://bucket/runs (default: outputs/)"
    )
    batch.set_defaults(func=_batch)
    sweep = sub.add_parser(
        "sweep",
        help="investigate the model testers' tiny checkpoint of every model type the generic family knows "
        "(transformers f32 vs mlx f32, strict contract) and write one table",
    )
    sweep.add_argument("model_types", nargs="*", help="model types to sweep (default: every one it knows)")
    sweep.add_argument("--out", help="sweep directory (default: outputs/<commit>/sweep/)")
    sweep.add_argument(
        "--docs", action="store_true", help="also keep the result as docs/sweep.json (the README's table)"
    )
    sweep.set_defaults(func=_sweep)
    screen = sub.add_parser(
        "screen", help="screen many inputs on the cheap path, rank them, then investigate the top deviating ones"
    )
    screen.add_argument("params", help="parameter YAML: its runtimes, contract and text settings")
    screen.add_argument("--images", help="a glob of images, one input each (quote it: 'fixtures/images/screen/*.png')")
    screen.add_argument("--prompts", help="JSON lines or CSV rows {images: [...], prompt, expect}")
    screen.add_argument("--top", type=int, default=3, help="investigate this many top-ranked inputs (default 3)")
    screen.add_argument("--no-investigate", action="store_true", help="stop after the ranking")
    screen.add_argument("--scheduler", help="Dask scheduler address: the inputs are spread across its workers")
    screen.add_argument("--out", help="screen directory (default: outputs/<commit>/screen-<name>/)")
    screen.set_defaults(func=_screen)
    diff = sub.add_parser("diff", help="compare the runs of two commits stage by stage")
    diff.add_argument("rev_a", metavar="BEFORE", help="older commit: its folder name under the outputs root (a prefix)")
    diff.add_argument("rev_b", metavar="AFTER", help="newer commit, the same way")
    diff.add_argument("--out-root", help="outputs root (default: outputs/ of this repository)")
    diff.add_argument("--factor", type=float, default=1.5, help="a change beyond this ratio counts (default 1.5)")
    diff.add_argument("--json", action="store_true", help="print JSON")
    diff.add_argument(
        "--fail-on", choices=["worse"], help="exit 1 when a stage got worse, or a run or stage is missing"
    )
    diff.add_argument("--allow-missing", action="store_true", help="with --fail-on worse: a missing run is no failure")
    diff.set_defaults(func=_diff)
    trend = sub.add_parser(
        "trend", help="render notebook 05: one run's stages across commits, in git-history order (HTML)"
    )
    trend.add_argument("params", nargs="?", help="a parameter file whose run to follow (default: the run that changed)")
    trend.add_argument("--run", help="run name to follow (instead of a parameter file)")
    trend.add_argument("--from", dest="rev_a", help="older commit (default: the one before --to in git history)")
    trend.add_argument("--to", dest="rev_b", help="newer commit (default: the newest with runs)")
    trend.add_argument("--out-root", help="outputs root (default: outputs/ of this repository)")
    trend.add_argument("--out", help="where to write the notebook and its HTML (default: <out-root>/trend/<a>..<b>/)")
    trend.add_argument("--factor", type=float, default=1.5, help="a change beyond this ratio counts (default 1.5)")
    trend.set_defaults(func=_trend)
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
    stages = sub.add_parser("stages", help="every stage of a checkpoint as a TapSet writer needs it (docs/tapfile.md)")
    stages.add_argument("checkpoint", help="checkpoint directory")
    stages.add_argument("--images", nargs="+", default=[], help="images whose processor output fixes the shapes")
    stages.add_argument(
        "--videos", nargs="+", default=[], help="videos (animated GIF or folder of frames) packed after the images"
    )
    stages.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stages.add_argument(
        "--write-inputs", metavar="PATH", help="also write the processor output the engine must run on (safetensors)"
    )
    stages.set_defaults(func=_stages)
    init = sub.add_parser("init", help="write a commented parameter file for your checkpoint")
    init.add_argument("checkpoint", help="checkpoint directory (config.json and *.safetensors)")
    init.add_argument("--out", help="the parameter file to write (default: ./<checkpoint folder>.yaml)")
    init.add_argument("--force", action="store_true", help="replace the file when it exists")
    init.set_defaults(func=lambda args: init_command(args.checkpoint, args.out, args.force))
    return explain(main)


def main(argv: list[str] | None = None) -> int:
    from .core.pipes import guarded_stdout

    with guarded_stdout():  # `driftscope show RUN | head -1`: the rest is dropped, the exit code stays the verdict's
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    import logging

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # papermill's and nbconvert's chatter (notebook paths, kernel name) only when asked for
    for name in ("papermill", "traitlets", "nbconvert"):
        logging.getLogger(name).setLevel(logging.INFO if args.verbose else logging.ERROR)
    try:
        return int(args.func(args))
    except DriftscopeError as err:
        print(f"driftscope: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - exit 2 with one line, never a traceback (unless asked for)
        if os.environ.get("DRIFTSCOPE_TRACEBACK"):
            raise
        print(
            f"driftscope: internal error: {type(err).__name__}: {err}\n"
            "  fix: this is a driftscope bug; rerun with DRIFTSCOPE_TRACEBACK=1 and report the traceback",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
