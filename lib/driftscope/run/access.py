"""Read a finished run by name, the way TransformerLens' and nnsight's users read activations.

::

    import driftscope

    run = driftscope.open_run("outputs/<commit>/demo-shapes")
    run["mlx:f32"]["vision.block.5"]            # numpy, memory-mapped from the run's TapSet (read when used)
    run.rows                                    # every comparison row (pandas DataFrame)
    diff = run.pair("mlx:bf16").diff("vision.block.5")
    diff.max_abs, diff.worst, diff.delta        # candidate - reference, rows aligned as the comparison aligned them
    run["mlx:f32"].sel("vision.block.5", tokens=12)   # by the stage's declared axis names; diff.sel(...) too
    run["mlx:f32"].view("vision.block.5"), diff.view()  # treescope's array view, where treescope is installed
    run.report                                  # the run's Report (report.json)

Nothing here runs a model or imports an ML framework: the arrays come from the TapSets on disk
(``taps/*.safetensors``), stages that narrowing added later included. In a notebook, a run, a runtime's taps
and a difference render as HTML tables.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from driftscope.core.markup import html_text as escape
from driftscope.errors import ReportError, TapFileError, did_you_mean, some
from driftscope.judge.contract import Contract
from driftscope.judge.layout import align
from driftscope.judge.rows import ComparisonRow
from driftscope.run.report import Report
from driftscope.run.tap_views import axes_of, html_table, number, select, treescope_view
from driftscope.taps.stages import orders_of
from driftscope.taps.tapset import TapSet
from driftscope.taps.tapunion import with_extras

__all__ = ["Diff", "Pair", "Run", "StageError", "Taps", "open_run"]


def open_run(path: str | Path) -> Run:
    """The run in ``path`` (its output directory, or its ``report.json``), opened for reading.

    Raises :class:`~driftscope.errors.ReportError` when ``path`` holds no readable driftscope report."""
    return Run(Report.load(path))


class StageError(TapFileError, KeyError):
    """A stage a pair cannot give two comparable arrays for (not captured by one side, or unalignable)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return TapFileError.__str__(self)


class Taps(Mapping):
    """One runtime's captured stages: ``taps[stage_id]`` is a read-only numpy array memory-mapped from disk
    (F16/BF16 stages widened to float32 into memory). Iterating gives the stage ids in execution order."""

    def __init__(self, label: str, tapset: TapSet):
        self.label = label
        self.tapset = tapset

    def __getitem__(self, stage_id: str) -> np.ndarray:
        if stage_id not in self.tapset:
            raise StageError(
                f"{self.label} captured no stage {stage_id!r}",
                f"{did_you_mean(stage_id, list(self))}use one of its {len(self)} stages: {some(list(self), 8)} "
                f"(`list(run[{self.label!r}])` lists them)",
            )
        return self.tapset.mapped(stage_id)

    def axes(self, stage_id: str) -> tuple[str, ...]:
        """The names of ``stage_id``'s axes, as its sidecar declares them (e.g. ``("tokens", "hidden")``)."""
        return axes_of(self.declaration(stage_id), len(self[stage_id].shape))

    def sel(self, stage_id: str, **index) -> np.ndarray:
        """``stage_id`` indexed by axis name, e.g. ``sel("vision.block.0", crops=0, patches=slice(0, 8))``."""
        return select(self[stage_id], self.axes(stage_id), index, f"{self.label}'s {stage_id}")[0]

    def view(self, stage_id: str):
        """treescope's interactive view of the tap, its axes named (where treescope is installed)."""
        return treescope_view(self[stage_id], self.axes(stage_id))

    def __iter__(self) -> Iterator[str]:
        return iter(self.tapset.stage_ids())

    def __len__(self) -> int:
        return len(self.tapset.stage_ids())

    def __contains__(self, stage_id: object) -> bool:
        return stage_id in self.tapset

    @property
    def meta(self) -> dict:
        """The TapSet's sidecar metadata (runtime, policy, versions, inputs digest)."""
        return self.tapset.meta

    def shape(self, stage_id: str) -> tuple[int, ...]:
        return self.tapset.shape(stage_id)

    def declaration(self, stage_id: str) -> dict:
        """What the stage declares: layout (axes), token order, active rows."""
        return self.tapset.declaration(stage_id)

    def __repr__(self) -> str:
        return f"<Taps {self.label}: {len(self)} stages>"

    def _repr_html_(self) -> str:
        rows = [
            [stage, "x".join(map(str, self.shape(stage))) or "scalar", self.tapset.stored_dtype(stage)]
            for stage in self
        ]
        return html_table(["stage", "shape", "stored"], rows, f"{self.label}: {len(self)} stages")


@dataclass
class Diff:
    """One stage of a runtime pair: both sides' arrays (active rows, in raster order where a side was permuted,
    exactly as the comparison aligned them), ``delta = candidate - reference`` and the report's row."""

    stage: str
    pair: str
    reference: np.ndarray
    candidate: np.ndarray
    atol: float
    rtol: float
    row: ComparisonRow | None = None
    note: str = ""
    axes: tuple[str, ...] = ()  # the stage's declared axis names (``sel`` and ``view`` use them)

    @cached_property
    def delta(self) -> np.ndarray:
        """``candidate - reference`` in float64."""
        return self.candidate.astype(np.float64) - self.reference.astype(np.float64)

    @cached_property
    def used(self) -> np.ndarray:
        """Per element, ``|delta| / (atol + rtol * |reference|)``: the share of its own tolerance it uses (above 1
        it fails the contract)."""
        bound = self.atol + self.rtol * np.abs(self.reference.astype(np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(bound > 0, np.abs(self.delta) / bound, np.where(self.delta == 0, 0.0, np.inf))

    @property
    def max_abs(self) -> float:
        return float(np.nanmax(np.abs(self.delta))) if self.delta.size else 0.0

    @property
    def failures(self) -> int:
        """Elements over their tolerance (a non-finite difference counts)."""
        return int(np.count_nonzero(~(self.used <= 1)))

    @property
    def worst(self) -> dict:
        """The element furthest past its tolerance: its coordinates, both values and the share used."""
        if not self.delta.size:
            return {}
        flat = int(np.nanargmax(np.where(np.isnan(self.used), np.inf, self.used)))
        coords = [int(c) for c in np.unravel_index(flat, self.delta.shape)]
        at = tuple(coords)
        return {
            "coords": coords,
            "reference": float(self.reference[at]),
            "candidate": float(self.candidate[at]),
            "used": float(self.used[at]),
        }

    def sel(self, **index) -> Diff:
        """The difference at a part of the stage, by axis name: ``diff.sel(tokens=12)`` (both sides alike)."""
        axes = self.axes or axes_of({}, self.delta.ndim)
        what = f"{self.pair}'s {self.stage}"
        reference, kept = select(self.reference, axes, index, what)
        candidate, _ = select(self.candidate, axes, index, what)
        return Diff(self.stage, self.pair, reference, candidate, self.atol, self.rtol, None, self.note, kept)

    def view(self):
        """treescope's interactive view of ``delta`` (coloured around zero, axes named), where it is installed."""
        return treescope_view(self.delta, self.axes or axes_of({}, self.delta.ndim), around_zero=True)

    def __repr__(self) -> str:
        return f"<Diff {self.pair} at {self.stage}: max_abs {self.max_abs:.4g}, {self.failures} failures>"

    def _repr_html_(self) -> str:
        worst = self.worst
        rows = [
            ["shape", "x".join(map(str, self.delta.shape)) or "scalar"],
            ["max |candidate - reference|", number(self.max_abs)],
            ["failures (over atol + rtol·|reference|)", f"{self.failures} of {self.delta.size}"],
            ["tolerance", f"atol {self.atol:g}, rtol {self.rtol:g}"],
            [
                "worst element",
                f"{worst.get('coords')}: {number(worst.get('reference'))} -> "
                f"{number(worst.get('candidate'))} ({number(worst.get('used'))} of its tolerance)",
            ],
        ]
        if self.row is not None:
            rows.append(["the run's row", f"{self.row.status}, max_abs {number(self.row.max_abs)}"])
        if self.note:
            rows.append(["alignment", self.note])
        table = html_table(["", self.stage], rows, f"{self.pair}: {self.stage}")
        if self.delta.ndim < 1 or not self.delta.size:
            return table
        return f"<div style='display:flex;gap:1em;align-items:flex-start'>{table}{self.heatmap_html()}</div>"

    def figure(self):
        """The share of its tolerance each element uses, rows x the last axis (other axes folded into rows), on a
        log colour scale: a matplotlib Figure (what the notebook shows beside the table)."""
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure

        used = self.used.reshape(-1, self.used.shape[-1]) if self.used.ndim > 1 else self.used.reshape(1, -1)
        shown = np.where(np.isfinite(used), used, np.nanmax(np.where(np.isfinite(used), used, 0)) * 10 or 1.0)
        figure = Figure(figsize=(4.2, 3.2), layout="constrained")
        axes = figure.subplots()
        floor = max(float(np.nanmax(shown)) * 1e-4, 1e-6)
        image = axes.imshow(np.maximum(shown, floor), aspect="auto", interpolation="nearest", norm=LogNorm(vmin=floor))
        figure.colorbar(image, ax=axes, label="share of tolerance used (>1 fails)")
        axes.set_xlabel("last axis (channel)")
        axes.set_ylabel("row (token)")
        axes.set_title(f"{self.stage}: {self.failures} over tolerance", fontsize=9)
        return figure

    def heatmap_html(self) -> str:
        """:meth:`figure` as an inline PNG (the page needs no file and no network)."""
        import base64
        import io

        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png", dpi=80)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        return f"<img alt='share of tolerance per element of {escape(self.stage)}' src='data:image/png;base64,{data}'>"


@dataclass
class Pair:
    """A judged runtime pair of a run: its two sides' taps (narrowing's added stages included) and its rows."""

    run: Run
    key: str
    reference: Taps
    candidate: Taps
    _rows: list[ComparisonRow] = field(default_factory=list, repr=False)

    @property
    def stages(self) -> list[str]:
        """The stages this pair compared, in execution order."""
        return [row.stage for row in self._rows]

    def row(self, stage_id: str) -> ComparisonRow | None:
        """The run's comparison row for ``stage_id`` (None when the pair did not compare it)."""
        return next((row for row in self._rows if row.stage == stage_id), None)

    @property
    def rows(self):
        """This pair's comparison rows (pandas DataFrame)."""
        from driftscope.judge.rows import rows_frame

        return rows_frame(self._rows)

    def diff(self, stage_id: str) -> Diff:
        """Both sides of ``stage_id``, aligned the way the comparison aligned them, and their difference."""
        missing = [t.label for t in (self.reference, self.candidate) if stage_id not in t]
        if missing:
            raise StageError(
                f"{' and '.join(missing)} captured no stage {stage_id!r}, so pair {self.key} has no difference there",
                f"{did_you_mean(stage_id, self.stages)}use a stage both sides captured, e.g. {some(self.stages, 6)}",
            )
        alignment = align(stage_id, self.reference.tapset, self.candidate.tapset, orders_of(self.run.report.plan))
        if alignment.refusal:
            raise StageError(f"{self.key} at {stage_id}: {alignment.refusal}", "the run's row says the same")
        reference, candidate = alignment.arrays(self.reference.tapset, self.candidate.tapset, stage_id)
        if reference.shape != candidate.shape:
            raise StageError(
                f"{self.key} at {stage_id}: shapes differ ({reference.shape} vs {candidate.shape})",
                "compare the two sides' arrays yourself: pair.reference[stage] and pair.candidate[stage]",
            )
        tolerance = self.run.contract.tolerance(stage_id)
        axes = axes_of(self.reference.declaration(stage_id), reference.ndim)
        row, note = self.row(stage_id), alignment.note
        return Diff(stage_id, self.key, reference, candidate, tolerance.atol, tolerance.rtol, row, note, axes)

    def __repr__(self) -> str:
        return f"<Pair {self.candidate.label} vs {self.reference.label}: {len(self._rows)} stages>"


class Run:
    """A finished (or stopped) run read from its output directory; see :func:`open_run`."""

    def __init__(self, report: Report):
        self.report = report

    @property
    def path(self) -> Path:
        return self.report.directory

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def labels(self) -> list[str]:
        """The runtime labels that captured (the reference first)."""
        return [runtime["label"] for runtime in self.report.data.get("runtimes", [])]

    @property
    def pairs(self) -> list[str]:
        """The judged pairs' keys (a candidate's label, or ``"a vs b"`` for an extra pair)."""
        return self.report.pair_keys()

    @cached_property
    def contract(self) -> Contract:
        """The contract the run was judged under (as its report recorded it)."""
        recorded = dict(self.report.data.get("contract") or {})
        source = recorded.pop("source", None)
        return Contract.from_dict(recorded, source)

    @property
    def rows(self):
        """Every comparison row of the run (pandas DataFrame: one row per stage and pair)."""
        return self.report.frame()

    def _check_label(self, label: str) -> None:
        if label not in self.labels:
            raise TapFileError(
                f"run {self.report.data.get('name')} has no runtime {label!r}",
                f"{did_you_mean(label, self.labels)}use one of {self.labels}",
            )

    def __getitem__(self, label: str) -> Taps:
        """The taps of runtime ``label`` (e.g. ``"mlx:f32"``), with every stage narrowing added for it."""
        self._check_label(label)
        extras = []
        for key, narrowed in (self.report.data.get("narrowing") or {}).items():
            sides = self._sides(key)
            for side, name in zip(sides, ("reference", "candidate"), strict=True):
                if side == label:
                    paths = ((narrowed or {}).get("tapsets") or {}).get(name, [])
                    extras += [TapSet(self.path / path) for path in paths]
        return Taps(label, with_extras(self.report.tapset(label), extras))

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def _sides(self, key: str) -> tuple[str, str]:
        pair = next((p for p in self.report.data.get("pairs", []) if p["key"] == key), None)
        return (pair["reference"], pair["candidate"]) if pair else (self.report.data.get("reference"), key)

    def pair(self, key: str) -> Pair:
        """The judged pair ``key``: a candidate's label (against the reference) or an extra pair's key."""
        if key not in self.pairs:
            raise ReportError(
                f"run {self.report.data.get('name')} judged no pair {key!r}",
                f"{did_you_mean(key, self.pairs)}use one of {self.pairs}",
            )
        reference, candidate = self.report.pair_tapsets(key)
        names = self._sides(key)
        rows = [row for row in self.report.rows if (row.pair or row.candidate) == key]
        return Pair(self, key, Taps(names[0], reference), Taps(names[1], candidate), rows)

    def replayed(self, label: str) -> Taps:
        """Runtime ``label``'s op-local outputs: each replayed operator fed the reference's own input."""
        replay = (self.report.data.get("replay") or {}).get(label)
        if not replay or not replay.get("tapset"):
            raise ReportError(
                f"runtime {label!r} was not replayed in this run",
                f"replayed: {sorted(self.report.data.get('replay') or {})}",
            )
        return Taps(f"{label} (replay)", TapSet(self.path / replay["tapset"]))

    def __repr__(self) -> str:
        return f"<Run {self.report.data.get('name')}: {self.verdict}, {len(self.labels)} runtimes, {self.path}>"

    def _repr_html_(self) -> str:
        first = {(d.get("pair") or d.get("candidate")): d.get("stage") for d in self._first_divergences()}
        rows = [[key, first.get(key, "-")] for key in self.pairs]
        caption = f"{self.report.data.get('name')}: verdict {self.verdict} ({self.path})"
        return html_table(["pair", "first divergence"], rows, caption)

    def _first_divergences(self) -> list[dict]:
        found = self.report.data.get("first_divergence") or {}
        if isinstance(found, dict):
            return [{"pair": key, **(value or {})} for key, value in found.items() if isinstance(value, dict)]
        return []
