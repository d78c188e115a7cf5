"""Single-stage functions of the tower, for same-input replay (one function per stage kind).

Each takes the stage's weights (block or merger prefix stripped, so every block shares one function,
one lowering and one compiled artifact, and so does every DeepStack merger) and its inputs, and
honours the contract. Kinds: ``patch_embed``, ``pos_embed`` (reads the table rows and weights the host
computed from the grid), ``positioned``, ``block`` and each block substage
(``norm1`` ... ``mlp.fc2``), ``merger.<sub>`` and ``deepstack.<sub>`` for ``norm``, ``fc1``, ``act``
and ``output``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..plan import parse_stage
from .config import VisionSpec
from .layers import (
    Contract,
    apply_rope,
    attention,
    gelu,
    interpolate_pos_embed,
    layer_norm,
    linear,
    patch_embed,
    segment_mask,
)
from .model import block


def _qkv(spec: VisionSpec, contract: Contract, w: dict, h):
    rows = h.shape[0]
    qkv = linear(contract, h, w["attn.qkv.weight"], w["attn.qkv.bias"])
    return [qkv.reshape(rows, 3, spec.num_heads, spec.head_dim)[:, i] for i in range(3)]


def _merger_functions(spec: VisionSpec, contract: Contract, prefix: str, postshuffle: bool) -> dict[str, Callable]:
    def norm(w, args, cos, sin, seg):
        x = args[0].reshape(-1, spec.merged_hidden) if postshuffle else args[0]
        return contract.round_state(layer_norm(x, w["norm.weight"], w["norm.bias"], spec.eps))

    def fc1(w, args, cos, sin, seg):
        return linear(contract, args[0].reshape(-1, spec.merged_hidden), w["linear_fc1.weight"], w["linear_fc1.bias"])

    return {
        f"{prefix}.norm": norm,
        f"{prefix}.fc1": fc1,
        f"{prefix}.act": lambda w, args, cos, sin, seg: gelu(args[0], tanh=False),
        f"{prefix}.output": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["linear_fc2.weight"], w["linear_fc2.bias"]
        ),
    }


def stage_function(kind: str, spec: VisionSpec, contract: Contract) -> Callable:
    """``f(weights, inputs: tuple, cos, sin, segments) -> array`` for one stage kind."""
    eps = spec.eps

    def whole_block(w, args, cos, sin, seg):
        return block(spec, contract, w, args[0], cos, sin, segment_mask(seg), lambda _, v: v, "", "", "out")

    def norm(name):
        return lambda w, args, cos, sin, seg: contract.round_state(
            layer_norm(args[0], w[f"{name}.weight"], w[f"{name}.bias"], eps)
        )

    def projected(index, rotate):
        def function(w, args, cos, sin, seg):
            value = _qkv(spec, contract, w, args[0])[index]
            return apply_rope(value, cos, sin) if rotate else value

        return function

    functions: dict[str, Callable] = {
        "patch_embed": lambda w, args, cos, sin, seg: patch_embed(
            contract, args[0], w["patch_embed.proj.weight"], w["patch_embed.proj.bias"]
        ),
        "pos_embed": lambda w, args, cos, sin, seg: interpolate_pos_embed(w["pos_embed.weight"], args[0], args[1]),
        "positioned": lambda w, args, cos, sin, seg: contract.round_state(args[0] + args[1]),
        "block": whole_block,
        "norm1": norm("norm1"),
        "attn.q": projected(0, True),
        "attn.k": projected(1, True),
        "attn.v": projected(2, False),
        "attn.context": lambda w, args, cos, sin, seg: attention(contract, *args, segment_mask(seg)),
        "attn.out": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["attn.proj.weight"], w["attn.proj.bias"]
        ),
        "residual1": lambda w, args, cos, sin, seg: contract.round_state(args[0] + args[1]),
        "norm2": norm("norm2"),
        "mlp.fc1": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.linear_fc1.weight"], w["mlp.linear_fc1.bias"]
        ),
        "mlp.act": lambda w, args, cos, sin, seg: gelu(args[0], spec.tanh_gelu),
        "mlp.fc2": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.linear_fc2.weight"], w["mlp.linear_fc2.bias"]
        ),
        **_merger_functions(spec, contract, "merger", postshuffle=False),
        **_merger_functions(spec, contract, "deepstack", postshuffle=True),
    }
    return functions[kind]


def stage_weights(weights: dict, stage_id: str) -> dict:
    """The weights one stage reads, keyed without the block/merger prefix."""
    block_index, branch, kind = parse_stage(stage_id)
    if block_index is not None:
        prefix = f"blocks.{block_index}."
    elif branch is not None:
        prefix = f"deepstack_merger_list.{branch}."
    elif kind.startswith("merger."):
        prefix = "merger."
    else:  # the stem's stages read the patch embedding or the position table
        return {name: value for name, value in weights.items() if name.startswith(("patch_embed.", "pos_embed."))}
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}
