"""Parameter files: one investigation each, validated with errors that list the valid keys.

Relative paths in a parameter file (checkpoint, images, contract, a patch's ``file.py``, a runtime's
``options.path``) resolve against one root: the repository holding the file (the nearest folder above it
with a ``.git``), or the file's own folder outside a repository. The same file then works from the
repository root, from ``notebooks/`` (where JupyterLab's kernel runs) and from anywhere else.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from driftscope.capture.patches import HypothesisPatch, parse_patch
from driftscope.core.names import safe_name
from driftscope.core.paths import contract_file, repository_of
from driftscope.core.storage import is_url, localize
from driftscope.core.yamlfile import load_yaml
from driftscope.errors import ParameterError
from driftscope.model.mixed import parse_policy_entry
from driftscope.run.param_sections import (
    attribution_section,
    checked,
    family_name,
    power_section,
    refuse_unknown,
    relative_section,
    stage_selection,
    text_section,
    video_section,
)
from driftscope.taps.stages import StageSelection

TOP_KEYS = {
    "name": "run name (default: the file's stem)",
    "description": "one line saying what this investigation asks",
    "family": "model family (default: detected from the checkpoint's config.json)",
    "checkpoint": "checkpoint directory (safetensors): a path or a URL (s3://, gs://, file://)",
    "images": "list of image paths or URLs shared by every runtime (may be empty when videos are given)",
    "videos": "list of videos (an animated GIF/WebP/PNG, or a folder of frame PNGs) packed after the images, each "
    "one grid with t = frames / temporal_patch_size; with `text`, its tokens follow the images' in the prompt ("
    "M-RoPE time positions placed as transformers places them)",
    "runtimes": "list of {runtime, policy, patch, label, options}; the first is the reference",
    "reference": "label of the reference runtime (default: the first)",
    "replay": "same-input replay for introduced/inherited labels: true (every candidate that can), false, or labels",
    "narrow": "when a pair first diverges at a block whose substages were not captured, capture them for that pair "
    "and judge again, down to the finest declared stage (default true)",
    "relative": "{high: transformers:f64, oracle: transformers:f32, factor: 4, floor: 1e-6}: judge every "
    "other runtime relative to the oracle's own error against the float64 run; {peer: mlx:f32}: judge every other "
    "candidate relative to a trusted peer's error against the reference (peer_factor, peer_floor per stage "
    "pattern in the contract); both forms may be given together",
    "power": "fixture power audit: true, or {mutations: [names] | all, policy: f32, require: [names]} "
    "(required mutations the fixture cannot detect fail the run)",
    "text": "follow the prompt past the vision tower: true, or {prompt: ..., max_new_tokens: 16, expect: [words]}",
    "pairs": "extra runtime pairs to judge besides reference-vs-each, e.g. [[mlx:f32, iree:f32]] (reference first)",
    "stages": "{blocks: bool, substages: [block indices] | all, include: [globs], exclude: [globs]}",
    "contract": "tolerance contract: one driftscope ships by name (default, strict, q4_f16) or a YAML path or URL "
    "(default: atol 0.08, rtol 0.08)",
    "notebooks": "notebooks to render for this run (default: [01_stage_parity]; a failing run adds 02_layer_drilldown)",
    "attribution": "{candidate: iree:q4-dequant, references: [mlx:q4, mlx:q4-dequant]}: per stage, which reference "
    "the candidate is closer to (relative RMS), and a verdict over the blocks",
}
REQUIRED_KEYS = ("checkpoint", "images", "runtimes")
REQUIRED_OR = {"images": "videos"}  # a required key another key may stand in for
RUNTIME_KEYS = {
    "runtime": "the engine: one of the registered runtimes (below); a string `runtime:policy` is the short form",
    "policy": "precision policy (default f32); each runtime offers its own (below); or a mixed one, "
    "{base: f16, f32: [vision.block.17-31.norm2]}: those operators in float32 (what driftscope precision writes)",
    "patch": "a hypothesis patch: `module:callable`, `file.py:callable`, or {callable: ..., kwargs: {...}}",
    "label": "the runtime's name in the report and the pages (default `runtime:policy`)",
    "options": "the runtime's own options (below); an option it does not read is refused",
}
PATH_RULE = (
    "relative paths in a parameter file resolve against the repository holding it "
    "(or its own folder outside a repository)"
)


@dataclass(frozen=True)
class RuntimeSpec:
    runtime: str
    policy: str = "f32"
    patch: HypothesisPatch | None = None
    label: str | None = None
    options: dict = field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.label or f"{self.runtime}:{self.policy}"

    def to_dict(self) -> dict:
        return {
            "runtime": self.runtime,
            "policy": self.policy,
            "patch": None if self.patch is None else {"callable": self.patch.target, "kwargs": self.patch.kwargs},
            "label": self.display,
            "options": self.options,
        }


@dataclass(frozen=True)
class Parameters:
    name: str
    checkpoint: Path
    images: list[Path]
    runtimes: list[RuntimeSpec]
    stages: StageSelection
    family: str | None = None
    contract: Path | None = None
    reference: str | None = None
    description: str = ""
    notebooks: tuple[str, ...] = ("01_stage_parity",)
    source: str | None = None
    pairs: tuple[tuple[str, str], ...] = ()
    replay: bool | tuple[str, ...] = True
    narrow: bool = True
    relative: dict | None = None
    power: dict | None = None
    text: dict | None = None  # the prompt's settings (``text_section`` less ``forced``)
    forced: str = "auto"  # ``text.forced``: teacher forcing where the answer is in question, or always
    attribution: dict | None = None
    videos: list[Path] = field(default_factory=list)
    #: checkpoint, images and contract as the file wrote them (repository-relative paths, URLs): the run's
    #: identity in ``to_dict`` and ``digest``, so a checkout's location never changes it
    written: dict = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            "checkpoint": self.written.get("checkpoint", str(self.checkpoint)),
            "images": self.written.get("images", [str(p) for p in self.images]),
            "runtimes": [spec.to_dict() for spec in self.runtimes],
            "reference": self.reference_label,
            "stages": self.stages.to_dict(),
            "contract": self.written.get("contract", None if self.contract is None else str(self.contract)),
            "notebooks": list(self.notebooks),
            "pairs": [list(pair) for pair in self.pairs],
            "replay": self.replay if isinstance(self.replay, bool) else list(self.replay),
            "narrow": self.narrow,
            "relative": self.relative,
            "power": self.power,
            "text": self.text if self.forced == "auto" or not self.text else {**self.text, "forced": self.forced},
            **({"attribution": self.attribution} if self.attribution else {}),
            **({"videos": self.written.get("videos", [str(p) for p in self.videos])} if self.videos else {}),
        }

    def replays(self, label: str) -> bool:
        """Whether the candidate ``label`` is replayed on the reference's inputs."""
        return self.replay if isinstance(self.replay, bool) else label in self.replay

    @property
    def reference_label(self) -> str:
        return self.reference or self.runtimes[0].display

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


ROOT_VARIABLE = "DRIFTSCOPE_PARAMETER_ROOT"


def parameter_root(path: str | Path) -> Path:
    """What relative paths in the parameter file ``path`` resolve against: the nearest folder above it
    holding a ``.git`` (its repository), or the file's own folder outside a repository."""
    folder = Path(path).resolve().parent
    return repository_of(folder) or folder


def _resolve(value: str | Path, base: Path) -> Path:
    candidate = Path(value).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def _patch_file(patch: HypothesisPatch | None, base: Path) -> HypothesisPatch | None:
    """A patch whose relative ``file.py`` is found under the parameter file's root (recorded as written)."""
    return None if patch is None else HypothesisPatch(patch.target, patch.kwargs, base)


def _runtime(entry: Any, position: int, base: Path) -> RuntimeSpec:
    where = f"runtimes[{position}]"
    if isinstance(entry, str):
        runtime, _, policy = entry.partition(":")
        return RuntimeSpec(runtime, policy or "f32")
    checked(entry, dict, where, "{runtime: mlx, policy: f16}")
    refuse_unknown(entry, RUNTIME_KEYS, where)
    if "runtime" not in entry:
        raise ParameterError(f"{where} has no 'runtime'", "write e.g. {runtime: mlx, policy: f16}")
    options = checked(entry.get("options", {}) or {}, dict, f"{where}.options", "{threads: 2}")
    label = entry.get("label")
    if label is not None:
        checked(label, str, f"{where}.label", "mlx-f16-norm2-f32")
    options = dict(options)
    if isinstance(options.get("path"), str):  # e.g. the tapfile runtime's TapSet
        options["path"] = str(_resolve(options["path"], base))
    policy, f32 = parse_policy_entry(entry.get("policy", "f32"), f"{where}.policy")  # {base, f32}: model.mixed
    if f32:
        options["f32"] = [*options.get("f32", []), *f32]
    return RuntimeSpec(
        checked(entry["runtime"], str, f"{where}.runtime", "mlx"),
        policy,
        _patch_file(parse_patch(entry.get("patch")), base),
        label,
        options,
    )


#: What a path-valued key looks like, for the error that names a wrong type.
PATH_EXAMPLES = {
    "checkpoint": "path/to/a/local/checkpoint/directory",
    "images entries": "fixtures/images/shapes_448.png",
    "videos entries": "fixtures/videos/shapes_4f.gif (or a folder of frame PNGs)",
    "contract": "parameters/contracts/strict.yaml (a contract file; its rules are written there)",
}


def parse_parameters(data: Any, source: str | None = None, base: Path | None = None) -> Parameters:
    """Validate a parameter mapping; relative paths resolve against ``base`` (default: the root of the
    parameter file ``source`` when it is one, see :func:`parameter_root`; else the cwd)."""
    where = source or "parameters"
    if base is None:
        base = parameter_root(source) if source and Path(source).is_file() else Path.cwd()
    base = Path(base)
    checked(data, dict, where, "a YAML mapping with checkpoint, images and runtimes")
    refuse_unknown(data, TOP_KEYS, where)
    for key in REQUIRED_KEYS:
        if key not in data and REQUIRED_OR.get(key) not in data:
            raise ParameterError(f"{where} has no {key!r} ({TOP_KEYS[key]})", f"add {key}: ...")

    def path(value: Any, key: str) -> Path:
        checked(value, str, key, PATH_EXAMPLES[key])
        if is_url(value):  # s3://, gs://, file://...: a local copy, fetched once
            return localize(value)
        if key == "contract" and contract_file(value).is_absolute():  # a contract driftscope ships, by name
            return contract_file(value)
        return _resolve(value, base)

    images = checked(data.get("images", []), list, "images", "[fixtures/images/shapes_448.png]")
    videos = video_section(data.get("videos"))
    runtimes = checked(data["runtimes"], list, "runtimes", "[{runtime: transformers}, {runtime: mlx, policy: f16}]")
    if len(runtimes) < 2:
        raise ParameterError(
            "runtimes lists fewer than two runtimes; nothing to compare", "list a reference and at least one candidate"
        )
    specs = [_runtime(entry, i, base) for i, entry in enumerate(runtimes)]
    labels = [spec.display for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ParameterError(f"runtime labels repeat: {duplicates}", "give repeated runtimes distinct 'label's")
    files = [safe_name(label) for label in labels]
    clashes = sorted({label for label, file in zip(labels, files, strict=True) if files.count(file) > 1})
    if clashes:
        raise ParameterError(
            f"runtime labels {clashes} name the same TapSet file ({safe_name(clashes[0])})",
            "give them labels that differ in more than ':' versus '-'",
        )
    reference = data.get("reference")
    if reference is not None and reference not in labels:
        raise ParameterError(f"reference {reference!r} is not one of the runtimes {labels}", "name one of them")
    pairs = checked(data.get("pairs", []) or [], list, "pairs", "[[mlx:f32, iree:f32]]")
    for pair in pairs:
        checked(pair, list, "pairs entries", "[mlx:f32, iree:f32]")
        if len(pair) != 2 or any(label not in labels for label in pair) or pair[0] == pair[1]:
            raise ParameterError(
                f"pair {pair} must name two different runtimes of {labels}",
                "write [reference label, candidate label], e.g. [mlx:f32, iree:f32]",
            )
    replay = data.get("replay", True)
    if not isinstance(replay, bool):
        checked(replay, list, "replay", "true, false or [mlx:f16]")
        unknown = [label for label in replay if label not in labels]
        if unknown:
            raise ParameterError(f"replay names unknown runtimes {unknown}", f"use labels from {labels}")
        replay = tuple(replay)
    relative = relative_section(data.get("relative"), labels, reference or labels[0])
    power = power_section(data.get("power"))
    text = text_section(data.get("text"))
    forced = text.pop("forced") if text else "auto"
    attribution = attribution_section(data.get("attribution"), labels)
    notebooks = data.get("notebooks", ["01_stage_parity"])
    checked(notebooks, list, "notebooks", "[01_stage_parity]")
    from driftscope.core.paths import NOTEBOOKS

    shipped = sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    for name in notebooks:
        checked(name, str, "notebooks entries", "01_stage_parity (a notebook's name in notebooks/)")
        if name.removesuffix(".ipynb") not in shipped:  # refused before anything runs, not after the verdict
            raise ParameterError(
                f"notebooks: {name!r} is no notebook of driftscope's", f"use some of: {', '.join(shipped)}"
            )
    name = data.get("name") or (Path(source).stem if source else "run")
    return Parameters(
        name=checked(name, str, "name", "shapes-mlx-f16"),
        description=checked(data.get("description", ""), str, "description", "'one line'"),
        family=data.get("family") and family_name(data["family"]),
        checkpoint=path(data["checkpoint"], "checkpoint"),
        images=[path(image, "images entries") for image in images],
        videos=[path(video, "videos entries") for video in videos],
        runtimes=specs,
        reference=reference,
        stages=stage_selection(data.get("stages")),
        contract=None if data.get("contract") is None else path(data["contract"], "contract"),
        notebooks=tuple(notebooks),
        source=source,
        pairs=tuple((str(a), str(b)) for a, b in pairs),
        replay=replay,
        narrow=checked(data.get("narrow", True), bool, "narrow", "true"),
        relative=relative,
        power=power,
        text=text,
        forced=forced,
        attribution=attribution,
        written={
            "checkpoint": data["checkpoint"],
            "images": list(images),
            "videos": list(videos),
            "contract": data.get("contract"),
        },
    )


def find_path(path: str | Path) -> Path:
    """``path``, or a relative path not found from the cwd looked up at the cwd's repository root
    (a notebook opened in JupyterLab runs in ``notebooks/`` and names ``parameters/x.yaml``)."""
    path = Path(path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    in_repository = parameter_root(Path.cwd() / "_") / path
    return in_repository if in_repository.exists() else path


find_parameter_file = find_path


def load_parameters(path: str | Path, base: Path | None = None) -> Parameters:
    """Read and validate a parameter YAML file; relative paths in it resolve against ``base`` (default:
    :func:`parameter_root` of the file)."""
    given = path
    path = find_parameter_file(path)
    if not path.exists():
        root = parameter_root(Path.cwd() / "_")
        examples = ", ".join(sorted(str(p.relative_to(root)) for p in (root / "parameters").glob("*.yaml"))[:4])
        raise ParameterError(
            f"parameter file {given} does not exist (looked in {Path.cwd()} and in the repository root {root})",
            "pass an absolute path or one relative to either of them"
            + (f", e.g. {examples}" if examples else "")
            + " (paths inside the file resolve against the repository holding it)",
        )
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise ParameterError(f"parameter file {path} is not valid YAML: {err}", "fix the YAML syntax") from err
    if base is None:
        base = Path(os.environ[ROOT_VARIABLE]) if os.environ.get(ROOT_VARIABLE) else parameter_root(path)
    return parse_parameters(data, str(path), base)
