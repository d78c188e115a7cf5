"""Layer 7, same-input replay: run one stage of a candidate runtime on the reference's own stage inputs
(``drilldown``), narrow a divergent block to its operator (``narrowing``, ``recapture``), say what it found
(``conclusion``), and measure a fixture's power against known defects (``power``)."""

from .drilldown import Drilldown, drill_down

__all__ = ["Drilldown", "drill_down"]
