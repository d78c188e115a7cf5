"""Which transformers module is which mlx-vlm module: the ones owning the same tensors are the same operator.

Tensors are known by their moments (``probe``), which a loader's transposition, reshape or dtype-exact copy leaves
as they are, and which add up: a module that owns a fused ``qkv`` matches the parent of three separate projections
at the parent. Modules of equal moments on both sides (a wrapper and the layer it wraps) pair in call order.
Parameter-free modules (activations, attention cores, weightless norms, poolers) pair by kind and call order under
aligned parents. Each pair's output layout is found from the probe's shapes (``layout``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import Layout, channels_last_to_first, find_layout
from .probe import ModuleFacts, SideProbe, same_moments

#: words in a class name that say what a parameter-free module does (its kind), first match wins
KINDS = (
    ("dropout", "dropout"),
    ("identity", "identity"),
    ("rotary", "rotary"),
    ("rope", "rotary"),
    ("attention", "attention"),
    ("attn", "attention"),
    ("sdpa", "attention"),
    ("norm", "norm"),
    ("pool", "pool"),
    ("gelu", "activation"),
    ("silu", "activation"),
    ("swish", "activation"),
    ("relu", "activation"),
    ("tanh", "activation"),
    ("sigmoid", "activation"),
    ("activation", "activation"),
    ("act", "activation"),
)

#: kinds that compute nothing worth a stage (dropout is the identity in evaluation)
SKIPPED_KINDS = ("dropout", "identity")


def kind_of(class_name: str) -> str:
    lowered = class_name.lower()
    return next((kind for word, kind in KINDS if word in lowered), lowered)


def is_conv(class_name: str) -> bool:
    return "conv" in class_name.lower()


@dataclass
class Pair:
    """One transformers module and the mlx-vlm module found to be the same operator."""

    torch: str
    mlx: str
    how: str  # "weights" (the same tensors) or "place" (parameter-free, by kind and order under aligned parents)
    layout: Layout | None = None  # how the MLX output becomes the reference's layout
    input_layout: Layout | None = None  # how the reference's input becomes the MLX module's input layout
    refusal: str | None = None  # why the outputs cannot be compared (e.g. the layout is not decided)
    torch_item: list | None = None  # where each side's compared output sits in what it returns (None: first)
    mlx_item: list | None = None
    scale: float | None = None  # the constant transformers' module multiplies its output by and mlx-vlm's does not

    def to_dict(self) -> dict:
        return {
            "torch": self.torch,
            "mlx": self.mlx,
            "how": self.how,
            "layout": self.layout.to_dict() if self.layout else None,
            "input_layout": self.input_layout.to_dict() if self.input_layout else None,
            "refusal": self.refusal,
            "torch_item": self.torch_item,
            "mlx_item": self.mlx_item,
            "scale": self.scale,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Pair:
        layout = Layout.from_dict(data["layout"]) if data.get("layout") else None
        input_layout = Layout.from_dict(data["input_layout"]) if data.get("input_layout") else None
        found = cls(data["torch"], data["mlx"], data["how"], layout, input_layout, data.get("refusal"))
        found.torch_item, found.mlx_item = data.get("torch_item"), data.get("mlx_item")
        found.scale = data.get("scale")
        return found


@dataclass
class Alignment:
    """Every pair, and the modules of either side left without a partner (with why)."""

    pairs: list[Pair] = field(default_factory=list)
    unaligned: dict[str, dict[str, str]] = field(default_factory=lambda: {"transformers": {}, "mlx": {}})

    def by_torch(self) -> dict[str, Pair]:
        return {pair.torch: pair for pair in self.pairs}

    def to_dict(self) -> dict:
        return {"pairs": [pair.to_dict() for pair in self.pairs], "unaligned": self.unaligned}

    @classmethod
    def from_dict(cls, data: dict) -> Alignment:
        return cls([Pair.from_dict(entry) for entry in data["pairs"]], dict(data["unaligned"]))


def _sort_key(facts: ModuleFacts) -> tuple:
    return (facts.order if facts.called else 1 << 30, facts.path.count("."), facts.path)


def _weight_groups(torch: SideProbe, mlx: SideProbe) -> list[tuple[list[ModuleFacts], list[ModuleFacts]]]:
    """Groups of modules, each side's members owning the same tensors (equal subtree moments)."""
    buckets: dict[float, tuple[list[ModuleFacts], list[ModuleFacts]]] = {}
    for index, probe in enumerate((torch, mlx)):
        for facts in probe.modules.values():
            if facts.has_weights:
                buckets.setdefault(facts.subtree[0], ([], []))[index].append(facts)
    groups = []
    for ours, theirs in buckets.values():
        clusters: list[tuple[list[ModuleFacts], list[ModuleFacts]]] = []
        for index, members in enumerate((ours, theirs)):
            for facts in members:
                home = next((c for c in clusters if same_moments((c[0] or c[1])[0].subtree, facts.subtree)), None)
                if home is None:
                    if index == 1:
                        continue  # an MLX module no transformers module matches: left unaligned below
                    home = ([], [])
                    clusters.append(home)
                home[index].append(facts)
        groups += [(sorted(t, key=_sort_key), sorted(m, key=_sort_key)) for t, m in clusters if t and m]
    return groups


def _chain(members: list[ModuleFacts]) -> bool:
    """Whether ``members`` (sorted outermost first) are nested each inside the one before."""
    return all(b.path.startswith(f"{a.path}." if a.path else "") for a, b in zip(members, members[1:], strict=False))


def _pair_group(torch_side: list[ModuleFacts], mlx_side: list[ModuleFacts]) -> list[tuple[str, str]]:
    if len(torch_side) == len(mlx_side):
        return [(t.path, m.path) for t, m in zip(torch_side, mlx_side, strict=True)]
    if _chain(torch_side) and _chain(mlx_side):  # wrappers of one layer: the outermost and the innermost pair
        return [(torch_side[0].path, mlx_side[0].path), (torch_side[-1].path, mlx_side[-1].path)]
    if min(len(torch_side), len(mlx_side)) == 1 and all(f.called for f in (*torch_side, *mlx_side)):
        # one tensor in one module here, in several there (a head tied to the embedding, kept as a module of its
        # own on one side): the one module pairs with the first the other side calls (the embedding)
        return [(torch_side[0].path, mlx_side[0].path)]
    return []


def _same_place(torch: SideProbe, mlx: SideProbe, pairs: dict[str, str]) -> list[tuple[str, str]]:
    """Parameter-free called modules at the same path under aligned ancestors (``mlp.1`` under a merger on both
    sides, whatever holds it in between), of the same kind."""
    found = []
    for facts in torch.modules.values():
        if facts.has_weights or not facts.called or kind_of(facts.kind) in SKIPPED_KINDS:
            continue
        parts = facts.path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            ancestor = ".".join(parts[:cut])
            if ancestor in pairs:
                rest = ".".join(parts[cut:])
                theirs = mlx.modules.get(f"{pairs[ancestor]}.{rest}" if pairs[ancestor] else rest)
                if theirs is not None and theirs.called and not theirs.has_weights:
                    if kind_of(theirs.kind) == kind_of(facts.kind):
                        found.append((facts.path, theirs.path))
                break
    return found


def _place_pairs(torch: SideProbe, mlx: SideProbe, parents: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Parameter-free called children of aligned parents, paired by kind in call order."""
    found = []
    for torch_parent, mlx_parent in parents:
        torch_kids = [f for f in torch.children(torch_parent) if not f.has_weights and f.called]
        mlx_kids = [f for f in mlx.children(mlx_parent) if not f.has_weights and f.called]
        for kind in {kind_of(f.kind) for f in torch_kids} - set(SKIPPED_KINDS):
            ours = sorted((f for f in torch_kids if kind_of(f.kind) == kind), key=_sort_key)
            theirs = sorted((f for f in mlx_kids if kind_of(f.kind) == kind), key=_sort_key)
            if ours and len(ours) == len(theirs):
                found += [(t.path, m.path) for t, m in zip(ours, theirs, strict=True)]
    return found


def _output_layout(source: list[int], target: list[int], conv: bool) -> Layout | str:
    rank = len(source)
    return _sliced(source, target) or find_layout(source, target, channels_last_to_first(rank) if conv else None)


def _layouts(pair: Pair, torch: SideProbe, mlx: SideProbe) -> None:
    """The output layout (MLX -> reference) and the input layout (reference -> MLX) of a pair, from the probe.

    Each side's output is what the module computed last (``probe.output_choice``); where those two cannot be
    compared but the first arrays the modules return can (a transformers tower whose pooling head mlx-vlm's does
    not return), the first arrays are. A module that multiplies its output by a constant of its own (transformers'
    scaled embeddings) where its partner does not (mlx-vlm applies it after the module) keeps the ratio as the
    pair's ``scale``: the MLX output is compared times it."""
    ours, theirs = torch.modules[pair.torch], mlx.modules[pair.mlx]
    conv = is_conv(ours.kind) and is_conv(theirs.kind)
    if not theirs.called:  # e.g. an encoder whose owner runs its list of layers itself, or a head nothing reads
        pair.refusal = f"not comparable: mlx-vlm's forward never calls {theirs.path}"
        return
    if ours.out_shape is None or theirs.out_shape is None:
        pair.refusal = "not comparable: the module returned no array on one side"
        return
    found = _output_layout(theirs.out_shape, ours.out_shape, conv)
    pair.torch_item, pair.mlx_item = ours.out_item, theirs.out_item
    if isinstance(found, str) and (ours.out_item or theirs.out_item):
        first = _output_layout(theirs.first_shape or theirs.out_shape, ours.first_shape or ours.out_shape, conv)
        if not isinstance(first, str):
            found, pair.torch_item, pair.mlx_item = first, None, None
    if isinstance(found, str):
        pair.refusal = found
    else:
        pair.layout = found
    if (ours.out_scale or 1.0) != (theirs.out_scale or 1.0):  # one side scales inside the module, one after it
        pair.scale = (ours.out_scale or 1.0) / (theirs.out_scale or 1.0)
    if ours.in_shape is not None and theirs.in_shape is not None:
        rank = len(ours.in_shape)
        to_last = tuple(channels_last_to_first(rank).index(i) for i in range(rank)) if conv else None
        found = _sliced(ours.in_shape, theirs.in_shape) or find_layout(ours.in_shape, theirs.in_shape, to_last)
        pair.input_layout = None if isinstance(found, str) else found


def _sliced(source: list[int], target: list[int]) -> Layout | None:
    """The same layout where the shapes differ only in axes one side holds a single row of (a head applied to the
    last position alone on one side, to every position on the other): the stage keeps that one row."""
    if len(source) != len(target) or source == target:
        return None
    differ = [(a, b) for a, b in zip(source, target, strict=True) if a != b]
    if len(differ) == 1 and 1 in differ[0]:
        rank = len(source)
        return Layout(tuple(range(rank)), tuple((i,) for i in range(rank)), "one side computed one position")
    return None


def align(torch: SideProbe, mlx: SideProbe) -> Alignment:
    """Pair the two probes' modules (see the module docstring)."""
    pairs: list[Pair] = []
    unaligned: dict[str, dict[str, str]] = {"transformers": {}, "mlx": {}}
    for torch_side, mlx_side in _weight_groups(torch, mlx):
        matched = _pair_group(torch_side, mlx_side)
        pairs += [Pair(t, m, "weights") for t, m in matched]
        taken_t, taken_m = {t for t, _ in matched}, {m for _, m in matched}
        reason = f"{len(torch_side)} transformers and {len(mlx_side)} mlx-vlm modules own these same tensors"
        unaligned["transformers"].update({f.path: reason for f in torch_side if f.path not in taken_t})
        unaligned["mlx"].update({f.path: reason for f in mlx_side if f.path not in taken_m})
    aligned = {p.torch: p.mlx for p in pairs}
    placed = _same_place(torch, mlx, aligned)
    placed_t, placed_m = {t for t, _ in placed}, {m for _, m in placed}
    placed += [
        (t, m) for t, m in _place_pairs(torch, mlx, list(aligned.items())) if t not in placed_t and m not in placed_m
    ]
    pairs += [Pair(t, m, "place") for t, m in placed]
    paired_t, paired_m = {p.torch for p in pairs}, {p.mlx for p in pairs}
    for side, probe, paired in (("transformers", torch, paired_t), ("mlx", mlx, paired_m)):
        for facts in probe.modules.values():
            if facts.path in paired or facts.path in unaligned[side] or not facts.called:
                continue
            if kind_of(facts.kind) in SKIPPED_KINDS:
                continue
            unaligned[side][facts.path] = (
                "owns tensors no module of the other side owns"
                if facts.has_weights
                else "parameter-free, with no module of its kind at its place on the other side"
            )
    for side, paired in (("transformers", {p.torch for p in pairs}), ("mlx", {p.mlx for p in pairs})):
        for path in [p for p in unaligned[side] if any(q.startswith(f"{p}." if p else "") for q in paired)]:
            del unaligned[side][path]  # a container whose pieces align (its own boundary differs): nothing lost
    for pair in pairs:
        _layouts(pair, torch, mlx)
    pairs.sort(key=lambda p: _sort_key(torch.modules[p.torch]))
    return Alignment(pairs, unaligned)
