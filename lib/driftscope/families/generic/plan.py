"""The generic family's stage plan, derived from a checkpoint's structure: every aligned module that runs is a
stage, named by where it sits (``vision.block.3.mlp.fc1``, ``projector``, ``text.layer.1``, ``text.logits.last``),
with what each runtime taps for it and what its replay reads (the module whose output it takes, or its own
captured input)."""

from __future__ import annotations

from dataclasses import dataclass

from driftscope.taps.sink import decode_stages
from driftscope.taps.stages import Stage, StagePlan

from .align import SKIPPED_KINDS, Pair, is_conv, kind_of
from .entries import PROMPT
from .layout import channels_last_to_first, find_layout
from .probe import ModuleFacts, SideProbe
from .structure import Structure

NAME = "generic"

#: the suffix of the stage holding what a module takes, captured for its replay where no stage's output is it
INPUT = ".input"


@dataclass(frozen=True)
class Place:
    """Where a transformers module sits: its stage id and, inside a vision block, the block and the piece."""

    stage: str
    block: int | None = None
    substage: str | None = None
    text: bool = False  # a decoder stage: the batch axis dropped (one prompt), one row per position
    last: bool = False  # only the last position is kept (the final norm and the head, as the prefill computes)


def _rel(path: str, root: str) -> str:
    return path[len(root) + 1 :] if root else path


def _under(path: str, root: str | None) -> bool:
    return root is not None and (path == root or path.startswith(f"{root}."))


def block_list(probe: SideProbe, root: str | None) -> str | None:
    """The list of repeated blocks under ``root``: of the lists whose items run, the one holding most weights."""
    if root is None:
        return None
    counts: dict[str, float] = {}
    for facts in probe.modules.values():
        if not _under(facts.path, root) or facts.path == root or not facts.called:
            continue
        head, _, index = facts.path.rpartition(".")
        if index.isdigit() and _under(head, root) and head != root:
            counts[head] = counts.get(head, 0.0) + facts.subtree[0]
    return max(counts, key=counts.__getitem__) if counts else None


def places(structure: Structure) -> dict[str, Place]:
    """Each transformers module path -> its place (modules outside every region have none)."""
    probe, regions = structure.torch, structure.regions
    vision, decoder, head, base = (regions.get(k) for k in ("vision", "decoder", "lm_head", "base"))
    blocks, layers = block_list(probe, vision), block_list(probe, decoder)
    top = [
        facts.path
        for facts in probe.children(base or "")
        if not _under(facts.path, vision) and not _under(facts.path, decoder) and facts.has_weights
    ]
    found: dict[str, Place] = {}
    for path in probe.modules:
        if _under(path, blocks) and path != blocks:
            index, _, rest = _rel(path, blocks).partition(".")
            stage = f"vision.block.{index}" + (f".{rest}" if rest else "")
            found[path] = Place(stage, int(index), rest or None)
        elif _under(path, vision):
            found[path] = Place("vision.output" if path == vision else f"vision.{_rel(path, vision)}")
        elif _under(path, layers) and path != layers:
            index, _, rest = _rel(path, layers).partition(".")
            stage = f"text.layer.{index}" + (f".{rest}" if rest else "")
            found[path] = Place(stage, substage=rest or None, text=True)
        elif _under(path, decoder) and path != decoder:
            rel = _rel(path, decoder)
            found[path] = (
                Place(f"text.{rel}.last", text=True, last=True) if rel == "norm" else Place(f"text.{rel}", text=True)
            )
        elif path == head:
            found[path] = Place("text.logits.last", text=True, last=True)
        else:
            owner = next((t for t in top if _under(path, t)), None)
            if owner is not None:
                name = "projector" if len(top) == 1 else f"projector.{_rel(owner, base or '')}"
                found[path] = Place(name if path == owner else f"{name}.{_rel(path, owner)}")
    return found


def _axes(shape: list[int], kind: str, text: bool, last: bool) -> tuple[str, ...]:
    rank = len(shape) - (1 if text else 0) - (1 if last else 0)
    if text:
        names = {1: ("hidden",), 2: ("tokens", "hidden")}
    elif is_conv(kind) and rank >= 3:
        return ("batch", "channels", *(f"spatial{i}" for i in range(rank - 2)))
    else:
        names = {1: ("hidden",), 2: ("tokens", "hidden"), 3: ("batch", "tokens", "hidden")}
    return names.get(rank, tuple(f"axis{i}" for i in range(rank)))


def _compared_shape(facts: ModuleFacts, pair: Pair | None) -> list[int]:
    """The shape of the transformers module's output the stage compares (``Pair.torch_item``)."""
    if pair is None or pair.torch_item == facts.out_item or facts.first_shape is None:
        return facts.out_shape
    return facts.first_shape


def _wrapper(facts: ModuleFacts) -> bool:
    """A module handing one inner module its input and returning that module's output: nothing of its own."""
    return facts.output_of is not None and facts.output_of == facts.input_of


def _staged(facts: ModuleFacts, pair: Pair | None, structure: Structure) -> bool:
    """Whether a placed module is a stage: it ran, returned an array, computes something of its own, and has a
    partner on the other side (when mlx-vlm loaded at all; the others are listed as unaligned)."""
    if not facts.called or facts.out_shape is None or kind_of(facts.kind) in SKIPPED_KINDS or _wrapper(facts):
        return False
    return structure.mlx is None or pair is not None


def generic_plan(structure: Structure, max_new_tokens: int | None = None) -> StagePlan:
    """The whole plan: the processor's arrays, every aligned module that ran (in the reference's call order),
    their captured inputs where a replay needs them, and (``max_new_tokens`` given) the answer's stages."""
    probe = structure.torch
    by_torch = structure.alignment.by_torch()
    placed = places(structure)
    entries: dict[str, dict] = {}
    stages = [
        Stage(
            f"inputs.{name}",
            tuple(f"axis{i}" for i in range(facts["rank"])),
            integer=facts["integer"],
            description="processor output",
            data=True,
        )
        for name, facts in structure.inputs.items()
    ]
    stages.append(Stage("inputs.image_tokens", ("images",), integer=True, description="tokens per image", data=True))
    stages += [
        Stage(f"{PROMPT}{name}", ("tokens",), integer=True, description=f"the prompt's {name}", data=True)
        for name in structure.prompt
    ]
    body: list[tuple[int, Stage]] = []  # (when its value exists in the reference's forward, stage)
    staged = {
        path: place for path, place in placed.items() if _staged(probe.modules[path], by_torch.get(path), structure)
    }
    stage_of = {path: place.stage for path, place in staged.items()}
    for path, place in staged.items():
        facts = probe.modules[path]
        pair = by_torch.get(path)
        entry = _entry(path, place, pair, structure)
        input_refusal = entry.pop("input_refusal", None)
        axes = _axes(_compared_shape(facts, pair), facts.kind, place.text, place.last)
        described = f"{facts.kind} ({path})"
        own: list[Stage] = []
        source = stage_of.get(facts.input_from) if facts.input_from else None
        if path == structure.regions.get("lm_head"):
            source = "text.norm.last" if "text.norm.last" in stage_of.values() else None
        if facts.in_integer and place.text:  # token ids: the prompt's
            source = f"{PROMPT}input_ids"
        if source is None and entry["replayable"] and facts.in_shape is not None:
            source = place.stage + INPUT
            in_axes = _axes(facts.in_shape, "", place.text, False)
            piece = place.substage is not None  # a piece's input is a piece; a block's or layer's input is not
            integer = facts.in_integer  # indices (e.g. positions) are data, compared exactly
            own.insert(
                0,
                Stage(
                    source,
                    in_axes,
                    block=place.block if piece else None,
                    substage=place.substage + INPUT if piece else None,
                    side=not integer,
                    data=integer,
                    integer=integer,
                    description=f"what {path} takes (captured for its replay)",
                ),
            )
            # the candidate's input is put in the reference's layout, or refused with why
            entries[source] = {**entry, "capture": "input", "replayable": False, "refusal": input_refusal}
        entry["reads"] = source if entry["replayable"] else None
        entries[place.stage] = entry
        side = entry["reads"] is None  # computed from no array it takes (a table, positions): a side input
        own.append(
            Stage(place.stage, axes, block=place.block, substage=place.substage, side=side, description=described)
        )
        if place.stage.startswith("text.layer.") and place.substage is None:
            own.append(Stage(f"{place.stage}.last", ("hidden",), description=f"{described}, last position"))
            entries[f"{place.stage}.last"] = {**entry, "last": True}
        body += [(facts.order if stage.id.endswith(INPUT) else facts.done, stage) for stage in own]
    for _, stage in sorted(body, key=lambda item: item[0]):
        if max_new_tokens is not None or not stage.id.startswith("text."):
            stages.append(stage)
    if max_new_tokens is not None:
        stages.insert(
            len(structure.inputs) + 1 + len(structure.prompt),
            Stage("text.input_ids", ("tokens",), integer=True, description="prompt token ids", data=True),
        )
        if not any(stage.id == "text.logits.last" for stage in stages):  # a tied head: no module of its own
            stages.append(Stage("text.logits.last", ("vocab",), side=True, description="prefill logits, last position"))
        stages += decode_stages(max_new_tokens)
    depth = len({stage.block for stage in stages if stage.block is not None})
    meta = {
        "generic": {
            "stages": entries,
            "regions": structure.regions,
            "unaligned": structure.alignment.unaligned,
            "mlx_error": structure.mlx_error,
        },
        "landmarks": [s for s in ("vision.output", "projector") if any(st.id == s for st in stages)],
    }
    return StagePlan(NAME, stages, depth, meta)


def _entry(path: str, place: Place, pair: Pair | None, structure: Structure) -> dict:
    """What each runtime taps for a stage: the module on each side, the layouts, and whether it replays."""
    facts = structure.torch.modules[path]
    entry = {
        "torch": path,
        "mlx": pair.mlx if pair else None,
        "how": pair.how if pair else None,
        "layout": pair.layout.to_dict() if pair and pair.layout else None,
        "input_layout": pair.input_layout.to_dict() if pair and pair.input_layout else None,
        "input_back": None,
        "refusal": pair.refusal if pair else None,
        "scale": pair.scale if pair else None,  # the MLX output is compared times it (see align._layouts)
        "text": place.text,
        "last": place.last,
        "replayable": facts.in_shape is not None
        and (pair is None or (pair.input_layout is not None and pair.refusal is None)),
        "in_rank": len(facts.in_shape or ()),
        "torch_item": pair.torch_item if pair else facts.out_item,  # where transformers' module returns it
    }
    if pair is not None and structure.mlx is not None:
        theirs = structure.mlx.modules[pair.mlx]
        entry["mlx_item"] = pair.mlx_item  # where mlx-vlm's module returns its output, when not first
        if theirs.in_shape is not None and facts.in_shape is not None:
            conv = is_conv(facts.kind) and is_conv(theirs.kind)  # MLX's takes channels last, torch's first
            declared = channels_last_to_first(len(theirs.in_shape)) if conv else None
            back = find_layout(theirs.in_shape, facts.in_shape, declared)
            entry["input_back"] = None if isinstance(back, str) else back.to_dict()
            entry["input_refusal"] = back if isinstance(back, str) else None
        if place.text and pair.refusal and _other_length(theirs.out_shape, facts.out_shape):
            entry["refusal"] = None  # the decoders ran on different numbers of positions: a difference, not a layout
    return entry


def _other_length(theirs: list[int] | None, ours: list[int] | None) -> bool:
    """Whether two shapes differ in one axis alone (a decoder's positions)."""
    if theirs is None or ours is None or len(theirs) != len(ours):
        return False
    return sum(a != b for a, b in zip(theirs, ours, strict=True)) == 1
