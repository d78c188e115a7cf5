"""Notebook 07: the precision search's answer (``report.json``'s ``precision``, written by ``driftscope precision``):
the fewest operators to keep in float32, what each kind alone buys, the probes (a table and a curve), the cost and
the verified run of the policy."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from driftscope.core.markup import code

if TYPE_CHECKING:
    from .interactive import Interactive


def load_run(params_path: str | None, out_dir: str | None = None):
    """The finished run's report (its directory, else the parameter file's default one); nothing is run."""
    from pathlib import Path

    from driftscope.errors import ParameterError
    from driftscope.run.investigation import default_out_dir
    from driftscope.run.params import load_parameters
    from driftscope.run.report import Report

    from .notebook import setup

    setup()
    if out_dir is None and params_path is None:
        raise ParameterError("notebook 07 needs a run", "set params_path (or out_dir) in its parameters cell")
    directory = Path(out_dir) if out_dir else default_out_dir(load_parameters(params_path))
    if not (directory / "report.json").exists():
        raise ParameterError(f"no finished run in {directory}", f"run it first: driftscope run {params_path}")
    return Report.load(directory / "report.json")


def entries(report, candidate: str | None = None) -> dict[str, dict]:
    """The report's precision searches by candidate label (only ``candidate``'s when given)."""
    found = dict(report.data.get("precision") or {})
    return {candidate: found[candidate]} if candidate and candidate in found else found


def missing_note(report) -> str:
    failing = [
        label
        for label, verdict in (report.data.get("verdict") or {}).get("per_candidate", {}).items()
        if verdict == "fail"
    ]
    if not failing:
        return "No candidate fails, so there is nothing to search: every runtime passes as it is."
    name = report.data.get("parameters_file") or "PARAMS"
    return "No precision search in this run yet. For a failing half-precision candidate run: " + " or ".join(
        code(f"driftscope precision {name} --candidate {label}") for label in failing
    )


def answer_markdown(entry: dict) -> str:
    """The answer in one paragraph: the set, the tolerance before and after, the cost, the verified run."""
    lines = [f"**{code(entry['candidate'])}** ({entry['policy']}, {entry.get('verdict_before')} in the run): "]
    if not entry["closes"]:
        lines.append(f"{entry['message']}.")
    elif not entry.get("answer"):
        lines.append("passes as it is.")
    else:
        kept = ", ".join(code(pattern) for pattern in entry["answer"])
        lines.append(
            f"keep {kept} in float32 ({entry['operators']} operators), everything else {entry['policy']}. "
            f"Tolerance used over the image-path stages: {entry['probes'][0]['tolerance_used']:.3g} -> "
            f"{_final(entry)['tolerance_used']:.3g}."
        )
    probes = len(entry["probes"]) - 1  # the baseline is the run's own rows
    ratio = (
        f", {entry['ratio']:.2f}x the run it starts from ({entry['run_seconds']:.0f} s)" if entry.get("ratio") else ""
    )
    lines.append(
        f" Cost: {probes} probes (at most {entry['bound']}) in {entry['seconds']:.1f} s{ratio}; each probe "
        f"{entry['way']}."
    )
    if entry.get("text"):  # the family's precision module: why the text side has no operator kinds
        lines.append(f" Text side: {entry['text']}.")
    verified = entry.get("verified")
    if verified:
        lines.append(
            f" Verified by a real run of the policy file {code(entry['policy_file'])}: {code(verified['label'])} "
            f"**{verified['verdict']}** over {verified['stages']} compared stages, text included "
            f"({code(verified['report'])}, {verified['seconds']:.0f} s)."
        )
    elif entry.get("policy_file"):
        lines.append(f" Policy file {code(entry['policy_file'])} (not verified by a run yet).")
    return "".join(lines)


def _final(entry: dict) -> dict:
    from driftscope.model.mixed import expand

    wanted = set(expand(entry["answer"] or []))
    return next(
        (p for p in reversed(entry["probes"]) if p["passed"] and set(expand(p["f32"])) == wanted), entry["probes"][-1]
    )


def kinds_frame(entry: dict):
    """What each operator kind alone, in float32 across the model, buys: passes or not, tolerance used."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "operator kind": kind["kind"].replace("{b}", "*"),
                "status": "pass" if kind["passed"] else "fail",
                "tolerance used before": kind["before"],
                "tolerance used alone in f32": kind["tolerance_used"],
                "first failing stage": kind["first_failure"] or "",
            }
            for kind in entry.get("kinds", [])
        ]
    )


def probes_frame(entry: dict):
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "probe": probe["index"],
                "phase": probe["phase"],
                "status": "pass" if probe["passed"] else "fail",
                "tolerance used": probe["tolerance_used"],
                "in float32": ", ".join(probe["f32"]) or "(nothing: the run as it was)",
                "operators": probe["operators"],
                "worst stage": probe["worst_stage"] or "",
                "stages re-run": probe["recaptured"],
                "seconds": probe["seconds"],
            }
            for probe in entry["probes"]
        ]
    )


def probe_curve(entry: dict):
    """Tolerance used (log) per probe, passing probes green, failing red; the line at 1 is the contract."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .notebook import describe

    probes = entry["probes"]
    figure, axis = plt.subplots(figsize=(9, 3.2))
    x = [p["index"] for p in probes]
    y = [max(p["tolerance_used"], 1e-3) for p in probes]
    axis.plot(x, y, color="#999", linewidth=1)
    axis.scatter(x, y, c=["#2a8a3a" if p["passed"] else "#c0392b" for p in probes], zorder=3)
    axis.axhline(1.0, color="#333", linestyle="--", linewidth=1)
    axis.set_yscale("log")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # probes are counted
    axis.set_xlabel("probe")
    axis.set_ylabel("tolerance used (worst stage)")
    axis.set_title(f"{entry['candidate']}: probes of the precision search")
    passed = sum(p["passed"] for p in probes)
    return describe(
        figure,
        f"{len(probes)} probes of {entry['candidate']}'s precision search, {passed} passing; the worst stage's "
        "share of its tolerance per probe on a log scale, the contract at 1",
    )


def show_probes(entry: dict) -> None:
    """The probe curve, then the probes' table (displayed, the figure closed so it shows once)."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    from .notebook import table

    shown = probes_figure(entry)  # hover a probe for what it kept in float32
    display(shown)
    plt.close(shown.fallback)
    display(table(probes_frame(entry), wrap=("in float32", "worst stage"), fit=True))  # fits 1400 px, status in view


def probes_figure(entry: dict) -> Interactive:
    """The precision search's probes in order: the worst stage's share of its tolerance (log), passing green,
    failing red, the contract at 1; hover for the probe's phase, what it kept in float32 and its worst stage."""
    import plotly.graph_objects as go

    from .interactive import Interactive
    from .notebook import alt_text

    probes = entry["probes"]
    x = [p["index"] for p in probes]
    y = [p["tolerance_used"] if p["tolerance_used"] and math.isfinite(p["tolerance_used"]) else None for p in probes]
    custom = [[p["phase"], ", ".join(p["f32"]) or "nothing", p["worst_stage"] or "", "pass" if p["passed"] else "fail"]
              for p in probes]  # fmt: skip
    figure = go.Figure(
        go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            customdata=custom,
            name="probes",
            line={"color": "#999999", "width": 1},
            marker={"size": 10, "color": ["#2a8a3a" if p["passed"] else "#c0392b" for p in probes]},
            hovertemplate="probe %{x} (%{customdata[0]}): %{customdata[3]}<br>tolerance used %{y:.3g} at "
            "%{customdata[2]}<br>in float32: %{customdata[1]}<extra></extra>",
        )  # fmt: skip
    )
    figure.add_hline(y=1.0, line={"color": "#333333", "dash": "dash", "width": 1})
    figure.update_xaxes(title_text="probe", dtick=1, tickformat="d")
    figure.update_yaxes(title_text="tolerance used (worst stage)", type="log", exponentformat="power")
    title = {"text": f"{entry['candidate']}: probes of the precision search", "font": {"size": 12}}
    figure.update_layout(height=340, template="simple_white", showlegend=False, title=title)
    fallback = probe_curve(entry)
    return Interactive(figure, fallback, "Interactive: " + alt_text(fallback))
