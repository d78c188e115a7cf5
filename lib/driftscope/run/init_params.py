"""``driftscope init CHECKPOINT``: a commented parameter file for a user's own checkpoint.

The family is detected from the checkpoint's ``config.json`` as a run detects it (a model type no installed family
claims is named in the file); the runtimes are the ones installed here that the family runs (the others
stay in the file as comments naming the extra that installs them); the contract, stages and image are the ones a
first run should use: the default half-precision contract, every block output, the demo's multi-window image.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.core.atomic import write_text_atomic
from driftscope.core.names import safe_name
from driftscope.core.paths import DEMO_IMAGES
from driftscope.errors import CheckpointError, ParameterError

#: what each built-in runtime is for, and the policies a first run gives it (reference first)
PLAN = (
    ("transformers", "f32", "the reference: transformers' own model code in float32 on the CPU"),
    ("mlx", "f32", "eager MLX through mlx-vlm, float32: agrees to round-off unless the port has a defect"),
    ("mlx", "f16", "eager MLX in float16: what half precision costs, judged under the contract"),
    ("iree", "f16-contract", "driftscope's JAX emitter compiled by iree-compile: F16 matmul inputs, F32 elsewhere"),
    ("jax", "f32", "the same emitted graph on XLA: tells the emitter's error from the compiler's"),
)


@dataclass
class Draft:
    """What ``init`` found, and the parameter file it writes."""

    checkpoint: Path
    model_type: str | None
    family: str | None  # None: no installed family claims the model type
    families: list[str]
    claimed: bool = True  # whether the family lists the model type (else it is the fallback for any model type)
    runtimes: list[tuple[str, str, str]] = field(default_factory=list)  # (runtime, policy, why), run
    unavailable: list[tuple[str, str, str]] = field(default_factory=list)  # (runtime, policy, install hint)
    plugins: list[str] = field(default_factory=list)  # installed runtimes beyond the built-in ones

    @property
    def name(self) -> str:
        return safe_name(self.checkpoint.name or "my-model")

    def text(self, image: Path) -> str:
        from driftscope import __version__

        how = "detected from" if self.claimed else "no family folder claims"
        family = (
            f"# family: {self.family}  ({how} config.json model_type {self.model_type!r})"
            if self.family
            else f"# family: none of the installed families ({', '.join(self.families)}) claims model_type "
            f"{self.model_type!r}:\n#   install a family plugin (docs/plugins.md) and set `family:` here"
        )
        lines = [
            f"# driftscope parameter file for {self.checkpoint.name}, written by `driftscope init` "
            f"(driftscope {__version__}, {time.strftime('%Y-%m-%d')}).",
            "# Run it:   driftscope run THIS_FILE      (exit 0 pass, 1 fail, 2 could not run)",
            "# Outputs:  outputs/<commit>/<name>/ of this file's git repository, else ./outputs (--out DIR to choose)",
            "# Every key a parameter file may hold: docs/parameters.md",
            f"name: {self.name}",
            f"checkpoint: {json.dumps(str(self.checkpoint))}",
            family,
            "images:  # the demo's 448x448 image (16 attention windows), shipped with driftscope: put yours here",
            f"  - {json.dumps(str(image))}",
            "runtimes:  # the first one is the reference; every other is judged against it",
        ]
        lines += [f"  - {{runtime: {r}, policy: {p}}}  # {why}" for r, p, why in self.runtimes]
        lines += [f"  # - {{runtime: {r}, policy: {p}}}  # not installed: {hint}" for r, p, hint in self.unavailable]
        lines += [f"  # - {{runtime: {r}, policy: f32}}  # a plugin runtime installed here" for r in self.plugins]
        lines += [
            "stages: {blocks: true}  # every block's output; a failing block's substages are captured when it fails",
            "contract: default  # atol 0.08, rtol 0.08: half-precision ports; `strict` (1e-4) for float32 ones",
            "# text: {prompt: Describe the image., max_new_tokens: 16, expect: [a word the answer must say]}",
            "notebooks: [01_stage_parity]  # 02 is added when the verdict fails; 03-07 on request",
        ]
        return "\n".join(lines) + "\n"


def draft(checkpoint: str | Path) -> Draft:
    """Read the checkpoint's config and the installed families and runtimes (nothing is loaded)."""
    from driftscope.capture.runtimes import RUNTIMES
    from driftscope.families import FAMILIES, detect_family
    from driftscope.model.checkpoint import validate_checkpoint

    path, config = validate_checkpoint(checkpoint)
    families = FAMILIES.names()
    try:
        family = detect_family(config)
    except CheckpointError:  # no installed family claims the model type: the file says so
        family = None
    found = Draft(path, config.get("model_type"), family, families)
    found.claimed = family is not None and found.model_type in FAMILIES.get(family).model_types
    supports = FAMILIES.get(family).supports if family else (lambda runtime: True)
    for runtime, policy, why in PLAN:
        if runtime not in RUNTIMES or not supports(runtime):
            continue
        engine = RUNTIMES.get(runtime)
        missing = _missing(engine)
        if missing:
            found.unavailable.append((runtime, policy, missing))
        else:
            found.runtimes.append((runtime, policy, why))
    built_in = {runtime for runtime, _, _ in PLAN} | {"tapfile"}
    found.plugins = [name for name in RUNTIMES.names() if name not in built_in]
    return found


def _missing(engine) -> str:
    """How to install what ``engine`` lacks ("" when it is installed)."""
    from driftscope.capture.runtimes.base import install_hint
    from driftscope.core.extras import missing_modules

    missing = missing_modules(engine.REQUIRES)
    return install_hint(engine.EXTRA, missing) if missing else ""


def init_command(checkpoint: str | Path, out: str | Path | None = None, force: bool = False) -> int:
    """``driftscope init``: write the file, say what it holds and what to run next; 0 (errors raise, exit 2)."""
    import sys

    path, found = write_parameters(checkpoint, out, force)
    print(f"wrote {path}: family {found.family or 'none'}, runtimes {', '.join(r for r, _, _ in found.runtimes)}")
    if found.family is None:
        print(f"driftscope: no installed family claims model_type {found.model_type!r}; see the file", file=sys.stderr)
    print(f"next: driftscope run {path}")
    return 0


def write_parameters(checkpoint: str | Path, out: str | Path | None = None, force: bool = False) -> tuple[Path, Draft]:
    """Write the parameter file (default ``./<checkpoint folder>.yaml``); refuse to replace one unless ``force``."""
    found = draft(checkpoint)
    target = Path(out) if out else Path.cwd() / f"{found.name}.yaml"
    if target.exists() and not force:
        raise ParameterError(f"{target} exists", "pass --force to replace it, or --out another file")
    if len(found.runtimes) < 2:
        raise ParameterError(
            f"fewer than two runtimes for {found.family or found.model_type} are installed here "
            f"({', '.join(r for r, _, _ in found.runtimes) or 'none'})",
            "install driftscope's dependencies (pip install driftscope) or an extra: "
            + "; ".join(hint for _, _, hint in found.unavailable),
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, found.text(DEMO_IMAGES / "shapes_448.png"))
    return target, found
