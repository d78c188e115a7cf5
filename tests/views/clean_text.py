"""What a rendered page must not say (issue 34 item 6): raw Python values, sloppy plurals, snake_case headers and
pandas index columns. :func:`problems` reads one rendered ``.nocode.html`` page and lists each found, with its
context, so a failing test says where."""

from __future__ import annotations

import html
import re

NOUNS = (
    "failures|lines|stages|elements|patches|mutations|pairs|runtimes|images|tokens|blocks|entries|steps|crops|"
    "windows|errors|values|channels|rows|commits|layers|operators|experts|patch groups|differences|cells"
)
#: name -> pattern over the page's visible words (tags, styles, scripts and the progress log's body removed)
WORDS = {
    "a raw None": r"\bNone\b",
    "a raw nan": r"\b(?:nan|NaN)\b",
    "a bare True or False": r"\b(?:True|False)\b",
    "a list or dict repr": r"\[\s*['\"]|\{\s*['\"]|\[\d+(?:\.\d+)?(?:, \d+(?:\.\d+)?)+\]",
    "a plural after 1": rf"(?<![\d.,])\b1 (?:{NOUNS})\b",
    "'all 1'": r"\ball 1\b",
}
GENERIC = ("a raw None", "a raw nan", "a bare True or False", "a plural after 1", "'all 1'")


def visible_words(page: str) -> str:
    """The page's text as a reader sees it: markup gone, the progress log's body (a raw log) left out, entities
    decoded, whitespace collapsed."""
    page = re.sub(r"<style.*?</style>|<script.*?</script>", " ", page, flags=re.S)
    page = re.sub(r"(<summary>Progress log[^<]*</summary>)<pre.*?</pre>", r"\1", page, flags=re.S)
    page = re.sub(r"<details class='driftscope-traceback'>.*?</details>", " ", page, flags=re.S)
    words = html.unescape(re.sub(r"<[^>]+>", " ", page))
    return re.sub(r"\s+", " ", words)


def _snake(word: str) -> bool:
    """A code name as a header word (``top1_agree``, ``max_abs``); a runtime label such as
    ``mlx-without-tanh_gelu`` or ``mlx:bf16`` is the user's name for a runtime, not a header to reword."""
    return bool(re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", word))


def headers(page: str) -> list[str]:
    """Every table's column headers (``thead`` cells), as text."""
    cells = []
    for head in re.findall(r"<thead>(.*?)</thead>", page, flags=re.S):
        cells += [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<th[^>]*>(.*?)</th>", head, re.S)
        ]
    return cells


def index_columns(page: str) -> list[str]:
    """Row headers that are a pandas index (0, 1, 2, ...): a table shown without hiding its index."""
    found = []
    for body in re.findall(r"<tbody>(.*?)</tbody>", page, flags=re.S):
        rows = re.findall(r"<tr[^>]*>\s*<th[^>]*>\s*(\d+)\s*</th>", body, flags=re.S)
        if rows and rows[:2] == ["0", "1"][: len(rows[:2])]:
            found.append(", ".join(rows[:3]))
    return found


def problems(page: str, patterns: tuple[str, ...] | None = None, check_headers: bool = True) -> list[str]:
    """What is wrong on ``page`` (a rendered notebook's HTML): one entry per finding, with its context."""
    words = visible_words(page)
    found = []
    for name in patterns or tuple(WORDS):
        for match in re.finditer(WORDS[name], words):
            found.append(f"{name}: ...{words[max(0, match.start() - 60) : match.end() + 40]}...")
    if check_headers:
        found += [f"a snake_case header: {h!r}" for h in headers(page) if any(map(_snake, h.split()))]
        found += [f"a pandas index column: {rows}" for rows in index_columns(page)]
    return found
