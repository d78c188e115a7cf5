"""Same-input replay: run one stage of a candidate runtime on the reference's own stage inputs."""

from .drilldown import Drilldown, drill_down

__all__ = ["Drilldown", "drill_down"]
