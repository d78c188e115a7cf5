"""Explore a run in JupyterLab without editing a cell: pickers for the pair, the block, the stage and the channel,
and the views they drive (the pair's error curve, the stage's channel map, the chosen channel per token), each
interactive with the values under the cursor. A rendered page cannot run a kernel: it says so in words instead.
"""

from __future__ import annotations

import numpy as np

from driftscope.run.report import Report

from .curves import first_divergences, plotted_stages, stage_blocks
from .errormaps import stage_difference
from .interactive import WIDGET_MIME, Interactive, channel_map_figure, error_curves_figure

ALL = "every stage"
FADED = 0.25  # the opacity of the pairs the pickers did not choose
STATIC = (
    "In JupyterLab this cell shows pickers for the runtime pair, the block, the stage and the channel, with the "
    "error curve, the channel map and the chosen channel's error per token under them (hover for values). "
    "A rendered page has no kernel to compute them: open the notebook in the lab (`make lab`)."
)


class Explorer:
    """The pickers (``pair``, ``block``, ``stage``, ``channel``: ipywidgets) and the figures they show
    (``figures``: plotly figures named ``curve``, ``map``, ``channel``), recomputed on every change."""

    def __init__(self, report: Report, pair: str | None = None, stage: str | None = None):
        import ipywidgets as widgets

        self.report = report
        self._blocks = stage_blocks(report)
        self._stages = plotted_stages(report)
        diverged = first_divergences(report)
        pairs = report.pair_keys()
        pair = pair or next(iter(diverged), pairs[0] if pairs else None)
        stage = stage or diverged.get(pair) or (self._stages[0] if self._stages else None)
        blocks = sorted(set(self._blocks.values()))
        fit = {"style": {"description_width": "initial"}}  # the label as wide as its word, not a fixed 90 px
        self.pair = widgets.Dropdown(options=[(report.pair_title(k), k) for k in pairs], value=pair,
                                     description="pair", layout=widgets.Layout(width="22em"), **fit)  # fmt: skip
        self.block = widgets.Dropdown(options=[(ALL, None)] + [(f"block {b}", b) for b in blocks],
                                      value=self._blocks.get(stage), description="block",
                                      layout=widgets.Layout(width="11em"), **fit)  # fmt: skip
        self.stage = widgets.Dropdown(options=self._stage_options(), value=stage, description="stage",
                                      layout=widgets.Layout(width="24em"), **fit)  # fmt: skip
        self.channel = widgets.BoundedIntText(value=0, min=0, max=0, description="channel",
                                              layout=widgets.Layout(width="10em"), **fit)  # fmt: skip
        self.outputs = {name: widgets.Output() for name in ("curve", "map", "channel")}
        self.figures: dict[str, object] = {}
        self.note = widgets.HTML()
        self.pair.observe(lambda _: self.update(), names="value")
        self.block.observe(lambda _: self._block_changed(), names="value")
        self.stage.observe(lambda _: self.update(), names="value")
        self.channel.observe(lambda _: self.update(channel_only=True), names="value")
        pickers = widgets.HBox(  # a narrow page wraps the pickers onto a second row instead of scrolling sideways
            [self.pair, self.block, self.stage, self.channel],
            layout=widgets.Layout(flex_flow="row wrap", width="100%", max_width="100%"),
        )
        self.box = widgets.VBox([pickers, self.note, *self.outputs.values()], layout=widgets.Layout(max_width="100%"))
        self.update()

    def _stage_options(self) -> list[str]:
        block = getattr(self, "block", None)
        chosen = block.value if block is not None else None
        return [s for s in self._stages if chosen is None or self._blocks.get(s) == chosen]

    def _block_changed(self) -> None:
        options = self._stage_options()
        keep = self.stage.value if self.stage.value in options else (options[0] if options else None)
        self._quiet = True  # one update for the new block, not one per option change
        try:
            self.stage.options = options
            self.stage.value = keep
        finally:
            self._quiet = False
        self.update()

    def update(self, channel_only: bool = False) -> None:
        """Recompute the figures for the pickers' values and show them."""
        if getattr(self, "_quiet", False):
            return
        pair, stage = self.pair.value, self.stage.value
        if not channel_only:
            self.figures["curve"] = error_curves_figure(
                self.report, metrics=("tolerance_used",), height=300, static=False
            )
            self._highlight(self.figures["curve"].figure, stage, pair)
            self.difference = stage_difference(self.report, stage, pair) if pair and stage else None
            if self.difference is not None:
                self.figures["map"] = channel_map_figure(self.difference, fallback=False)
                self.channel.max = max(self.difference.diff.shape[1] - 1, 0)
                worst = np.nan_to_num(self.difference.diff, nan=np.inf).max(axis=0)
                with self.channel.hold_trait_notifications():
                    self.channel.value = int(np.argmax(worst))  # the worst channel first
        if self.difference is not None:
            self.figures["channel"] = channel_profile(self.difference, int(self.channel.value))
            failing = int(self.difference.failing.sum())
            self.note.value = (
                f"<b>{self.report.pair_title(pair)}</b>, stage <code>{stage}</code>: {failing} failing elements "
                f"of {self.difference.diff.size}; channel {self.channel.value} (0-{self.channel.max})."
            )
        self._show(channel_only)

    def _highlight(self, figure, stage: str | None, pair: str | None) -> None:
        """The chosen pair's curve drawn bold and the others faded (their hover stays); the chosen stage's line."""
        for trace in figure.data:
            chosen = trace.legendgroup == pair
            trace.opacity = 1.0 if chosen else FADED
            if chosen and trace.mode and "lines" in trace.mode:
                trace.line.width = 3
        if stage in self._stages:
            figure.add_vline(x=self._stages.index(stage), line={"color": "#444444", "width": 2, "dash": "dot"})

    def _show(self, channel_only: bool) -> None:
        """Each figure into its output as the widget's own state (``outputs``), not by capturing a display in a
        ``with output:`` block: papermill (nbclient) never has to route captured output, and a rendered run of
        the notebook cannot wait on it."""
        for name, output in self.outputs.items():
            if (channel_only and name != "channel") or name not in self.figures:
                continue
            data, metadata = _Plotly(self.figures[name])._repr_mimebundle_(), {}
            output.outputs = ({"output_type": "display_data", "data": data, "metadata": metadata},)

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = self.box._repr_mimebundle_(include=include, exclude=exclude) or {}
        bundle = {key: value for key, value in data.items() if key == WIDGET_MIME}
        bundle["text/plain"] = STATIC
        bundle["text/html"] = f"<p><em>{STATIC.replace('`make lab`', '<code>make lab</code>')}</em></p>"
        return bundle


class _Plotly:
    """A figure as the lab draws it (plotly's own mime type; the PNG when the lab lacks the extension)."""

    def __init__(self, shown: Interactive):
        self.shown = shown

    def _repr_mimebundle_(self, include=None, exclude=None):
        import json

        return {"application/vnd.plotly.v1+json": json.loads(self.shown.figure.to_json()), "text/plain": self.shown.alt}


def channel_profile(difference, channel: int) -> Interactive:
    """One channel of a stage along its tokens: expected, actual and |a - e| against the element's bound."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tokens = np.arange(difference.diff.shape[0])
    expected, actual = difference.expected[:, channel], difference.actual[:, channel]
    bound = difference.atol + difference.rtol * np.abs(expected.astype(np.float64))
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    figure.add_trace(go.Scatter(x=tokens, y=expected, name="expected", mode="lines"), row=1, col=1)
    figure.add_trace(go.Scatter(x=tokens, y=actual, name="actual", mode="lines"), row=1, col=1)
    figure.add_trace(go.Scatter(x=tokens, y=difference.diff[:, channel], name="|a - e|", mode="lines"), row=2, col=1)
    figure.add_trace(go.Scatter(x=tokens, y=bound, name="atol + rtol|e|", line={"dash": "dot"}), row=2, col=1)
    figure.update_xaxes(title_text="token", tickformat="d", row=2, col=1)
    figure.update_layout(height=420, template="simple_white", hovermode="x unified",
                         title={"text": f"{difference.stage}: channel {channel} per token"})  # fmt: skip
    return Interactive(figure, None, f"Channel {channel} of {difference.stage} per token.")


def explore(report: Report, pair: str | None = None, stage: str | None = None) -> Explorer:
    """The lab's explorer of ``report`` (default: the first divergent pair at its first divergence)."""
    return Explorer(report, pair, stage)
