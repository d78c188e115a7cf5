"""The screen's page, ``index.html``: the ranked inputs with thumbnails (embedded as data URIs), the score, the
worst candidate's tower error and first differing token, and a link to each investigated run; sortable by any
column (a few lines of inline script), self-contained (nothing is fetched). Every value is escaped (Jinja2
autoescape)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from driftscope.core.atomic import write_text_atomic
from driftscope.core.markup import format_number
from driftscope.core.names import url_path
from driftscope.screen.score import NEAR_TIE_WEIGHT

THUMB_PX = 96


#: what stands for a thumbnail of an image that cannot be read (truncated, not an image, gone): a grey square
UNREADABLE = "data:image/svg+xml;base64," + base64.b64encode(
    b'<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96"><rect width="96" height="96" fill="#ddd"/>'
    b'<text x="48" y="52" font-size="11" text-anchor="middle">unreadable</text></svg>'
).decode("ascii")


def thumbnail(path: Path) -> str:
    """``path`` as a small PNG data URI (at most :data:`THUMB_PX` on its longer side); :data:`UNREADABLE` for an
    image that cannot be read (the ranking says why that input could not run)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
            image.thumbnail((THUMB_PX, THUMB_PX))
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
    except Exception:  # noqa: BLE001 - PIL raises OSError, ValueError, DecompressionBombError... for a bad file
        return UNREADABLE
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _run_link(out: Path, investigation: dict | None) -> tuple[str | None, str]:
    if investigation is None:
        return None, ""
    run_dir = out / investigation["dir"]
    pages = investigation.get("pages") or []
    target = next((p for p in ("01_stage_parity.nocode.html", "01_stage_parity.html") if p in pages), None)
    verdict = investigation.get("verdict") or "could not run"
    firsts = [(pair, stage) for pair, stage in (investigation.get("first_divergence") or {}).items() if stage]
    counts = (investigation.get("first_failures") or {}).get(firsts[0][0]) if firsts else None
    elements = f" ({counts[0]:,} of {counts[1]:,} elements)" if counts else ""
    text = verdict + (f" at {firsts[0][1]}{elements}" if firsts else "")
    parts = investigation["dir"].split("/") + ([target] if target else ["report.json"])
    return (url_path(*parts) if (run_dir / parts[-1]).exists() or target else None), text


def page_rows(out: Path, data: dict, items: dict) -> list[dict]:
    investigations = {entry["key"]: entry for entry in data.get("investigations") or []}
    rows = []
    for position, result in enumerate(data["inputs"], 1):
        worst = (result.get("candidates") or {}).get(result.get("worst") or "") or {}
        item = items.get(result["key"])
        href, run_text = _run_link(out, investigations.get(result["key"]))
        first = worst.get("first_difference")
        agree = worst.get("prefill_top1_agree")
        rows.append(
            {
                "rank": position,
                "key": result["key"],
                "label": result["label"],
                "prompt": result.get("prompt"),
                "thumbs": [thumbnail(path) for path in item.images] if item else [],
                "score": f"{result['score']:.3f}" if result.get("score") is not None else result.get("status"),
                "score_value": result.get("score") if result.get("score") is not None else -1,
                "deviates": bool(result.get("score")) and result["score"] >= 0.5,
                "worst": result.get("worst") or "",
                "rel": format_number(worst.get("tower_relative_error"), missing=""),
                "rel_value": worst.get("tower_relative_error") or 0,
                "failures": "" if not worst else f"{worst.get('tower_failures', 0)} / {worst.get('tower_elements', 0)}",
                "failures_value": worst.get("tower_failure_fraction") or 0,
                "prefill": "" if agree is None else ("agree" if agree else "differs"),
                "first": "identical"
                if worst and first is None
                else ("" if first is None else f"step {first}")
                + (
                    f" ({worst['first_difference_label']})"
                    if first is not None and worst.get("first_difference_label")
                    else ""
                ),
                "first_value": 1e9 if first is None else first,
                "dropped": " ".join(worst.get("dropped_words") or []),
                "run_href": href,
                "run_text": run_text,
            }
        )
    return rows


def render_page(out: Path, data: dict, items: dict) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(
        loader=FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=select_autoescape(["j2", "html"])
    )
    template = env.get_template("screen.html.j2")
    return template.render(
        name=data.get("name"),
        inputs=data["inputs"],
        reference=data.get("reference"),
        candidates=data.get("candidates") or [],
        stages=data.get("stages") or [],
        commit=data.get("commit"),
        rows=page_rows(out, data, items),
        near_tie_share=f"{NEAR_TIE_WEIGHT:.0%}",
    )


def write_page(out: Path, data: dict, items) -> Path:
    by_key = items if isinstance(items, dict) else {item.key: item for item in items}
    return write_text_atomic(Path(out) / "index.html", render_page(Path(out), data, by_key))
