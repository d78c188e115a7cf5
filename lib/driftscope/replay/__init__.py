"""Same-input replay: run one stage of a candidate runtime on the reference's own stage inputs."""

from .context import ReplayContext
from .drilldown import Drilldown, drill_down

__all__ = ["Drilldown", "ReplayContext", "drill_down"]
