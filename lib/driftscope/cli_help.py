"""What ``driftscope --help`` and each ``driftscope COMMAND --help`` say: the command's purpose in one line a
newcomer understands, an example, and its exit codes (0 pass, 1 fail, 2 could not run, as for every command)."""

from __future__ import annotations

import argparse

JUDGES = "exit: 0 the verdict passes, 1 it fails, 2 something could not run"
FORMATS, FORMAT_HELP = ("auto", "text", "markdown"), "text (plain) or markdown; default auto: text in a terminal"
REFERENCE_CACHE_HELP = (
    "where the reference runtime's taps (and, in its inputs/ folder, the prepared inputs) are cached and reused "
    "across runs and commits, or off to compute them every run "
    "(default: $DRIFTSCOPE_REFERENCE_CACHE, else $DRIFTSCOPE_CACHE/reference, else the user cache folder's)"
)

#: command -> (purpose, examples, exit codes)
HELP: dict[str, tuple[str, tuple[str, ...], str]] = {
    "init": (
        "write a commented parameter file for your checkpoint: family detected, the runtimes installed here, "
        "a contract, stages and one image",
        ("driftscope init /models/my-vlm", "driftscope init ./my-model --out runs/my-model.yaml"),
        "exit: 0 written, 2 it could not be (no checkpoint there, the file exists, fewer than two runtimes)",
    ),
    "run": (
        "run a parameter file's runtimes on the same inputs, compare every stage under the contract, "
        "write report.json and render the notebooks",
        ("driftscope run my-model.yaml", "driftscope run my-model.yaml --out runs/today --no-gate"),
        JUDGES,
    ),
    "show": (
        "print a finished run's verdict: each pair's first divergence, worst element, suspected cause, "
        "ready patch and lineage (plain text in a terminal, Markdown when piped or with --format markdown)",
        ("driftscope show outputs/<commit>/my-model",),
        JUDGES + " (an unreadable or unfinished report)",
    ),
    "rejudge": (
        "judge a saved run again under another contract, re-running nothing; it OVERWRITES the run's "
        "report.json unless --out names another file",
        ("driftscope rejudge outputs/<commit>/my-model --contract strict --out strict.json",),
        JUDGES,
    ),
    "precision": (
        "find the fewest operators a failing half-precision candidate must keep in float32 to pass, and verify "
        "that policy with a real run (runs the investigation first when --out holds none)",
        ("driftscope precision my-model.yaml --candidate mlx:f16",),
        "exit: 0 a set of float32 operators closes the failure (and its verifying run passes), 1 none does, "
        "2 it could not run",
    ),
    "batch": (
        "run parameter files for one commit (or a past one in a temporary worktree) and write the evidence index "
        "and JUnit XML for CI",
        ("driftscope batch parameters/*.yaml", "driftscope batch parameters/demo_shapes.yaml --commit HEAD~1"),
        "exit: 0 every run passes, 1 a run fails, 2 a run could not run",
    ),
    "sweep": (
        "investigate the model testers' tiny checkpoint of every model type the generic family knows (transformers "
        "f32 against mlx f32, strict contract) and write one table of which pass",
        ("driftscope sweep", "driftscope sweep llava idefics3 --out runs/sweep"),
        "exit: 0 every model type passes, 1 one fails, 2 one could not run",
    ),
    "screen": (
        "run many inputs through the cheap path, rank them by how far the candidates drift, then investigate "
        "the worst few",
        ("driftscope screen my-model.yaml --images 'photos/*.png' --top 3",),
        "exit: 0 the inputs were ranked (whatever they scored), 2 it could not run, 130 interrupted (run it again "
        "to resume)",
    ),
    "diff": (
        "compare the runs of two commits stage by stage: better, worse, unchanged beyond a noise floor",
        ("driftscope diff abc123 def456 --fail-on worse",),
        "exit: 0 nothing got worse (always 0 without --fail-on), 1 with --fail-on worse: a run got worse, "
        "2 a report could not be read",
    ),
    "trend": (
        "render notebook 05: one run's stages across two commits, in git-history order (HTML)",
        ("driftscope trend my-model.yaml", "driftscope trend --run my-model --from abc123 --to def456"),
        "exit: 0 the notebook rendered, 2 it could not",
    ),
    "geometry": (
        "print the model family's index math (windows, packing, crops) for image sizes, with no model loaded",
        ("driftscope geometry 448x448 448x672 --bucket 2048",),
        "exit: 0 printed, 2 a size, checkpoint or family could not be used",
    ),
    "stages": (
        "list every stage of a checkpoint as an engine outside Python must write it to a tap file (docs/tapfile.md)",
        ("driftscope stages /models/my-model --images photo.png --write-inputs inputs.safetensors",),
        "exit: 0 listed, 2 the checkpoint or an image could not be used",
    ),
}

#: what the top-level ``driftscope --help`` adds below the command list
OVERVIEW = """\
first time:
  driftscope init /models/my-model      writes my-model.yaml (read it: every line is commented)
  driftscope run my-model.yaml          report.json, notebooks and HTML under outputs/<commit>/my-model/
  driftscope show outputs/<commit>/my-model

every command that judges exits 0 when the verdict passes, 1 when it fails, 2 when something could not run."""


def explain(main: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give ``main`` and each of its commands their purpose, examples and exit codes."""
    main.formatter_class = argparse.RawDescriptionHelpFormatter
    main.epilog = OVERVIEW
    commands = next(a for a in main._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        if name not in HELP:  # tests/run/test_cli_help.py asks every command for its entry
            continue
        purpose, examples, codes = HELP[name]
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.description = purpose[0].upper() + purpose[1:] + "."
        command.epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) + f"\n\n{codes}."
    return main
