"""What a plan read from the two models left out (notebook 01): the modules of either library with no partner on
the other side, and the stages whose layout no rule decides, each with why. A deep family declares its stages,
so its runs have nothing here."""

from __future__ import annotations

import pandas as pd

COLUMNS = ["side", "module or stage", "why"]


def unaligned_frame(report) -> pd.DataFrame:
    """One row per module without a partner (by side) and per stage a runtime declared it cannot compare."""
    read = (report.data.get("plan_meta") or {}).get("generic") or {}
    rows = [
        {"side": side, "module or stage": path, "why": why}
        for side, modules in (read.get("unaligned") or {}).items()
        for path, why in sorted(modules.items())
    ]
    for key, groups in (report.data.get("not_compared") or {}).items():
        for group in groups:
            if group.get("declared") and "not comparable" in str(group.get("why")):
                rows += [
                    {"side": f"{group['runtime']} ({key})", "module or stage": s, "why": group["why"]}
                    for s in group["stages"]
                ]
    return pd.DataFrame(rows, columns=COLUMNS)


def summary(report) -> str:
    """One line for the page: how many modules each side left without a partner, or that the family declares its
    stages."""
    read = (report.data.get("plan_meta") or {}).get("generic")
    if read is None:
        return f"The {report.data.get('family')} family declares its stages: every one is compared as declared."
    names = {"transformers": "transformers'", "mlx": "mlx-vlm's"}
    counts = {side: len(modules) for side, modules in (read.get("unaligned") or {}).items()}
    shown = " and ".join(f"{count} of {names.get(side, side)}" for side, count in counts.items())
    return (
        f"The stages were read from the two models: {shown} modules have no partner on the other side (listed "
        "below with why); they are not compared, and the stages around them are."
    )
