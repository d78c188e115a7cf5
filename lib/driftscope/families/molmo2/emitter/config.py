"""The settings the emitter needs: the config facts plus the resolved layers and the execution depth."""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import CheckpointError
from ..config import AdapterFacts, TextFacts, VitFacts, read_facts


@dataclass(frozen=True)
class Molmo2Spec:
    """Hashable (a static argument of the jitted functions)."""

    vit: VitFacts
    adapter: AdapterFacts
    text: TextFacts
    selected_layers: tuple[int, ...]  # resolved against the declared depth, configured order
    execution_depth: int
    image_patch_id: int

    @property
    def pool_dim(self) -> int:
        return self.vit.hidden_size * len(self.selected_layers)

    @classmethod
    def from_config(cls, config: dict) -> Molmo2Spec:
        facts = read_facts(config)
        if facts.text.norm_after or facts.text.qk_norm_type not in ("qwen3", "olmo"):
            raise CheckpointError(
                "the emitter follows pre-norm Molmo2 decoders with qwen3/olmo q/k norms",
                "use a Molmo2 checkpoint with norm_after: false",
            )
        if facts.text.rope_type != "default":
            raise CheckpointError(
                f"the emitter's RoPE is the default one, the config asks for {facts.text.rope_type!r}",
                "use a Molmo2 checkpoint with default rope_parameters",
            )
        if facts.vit.num_heads != facts.vit.num_kv_heads or facts.adapter.num_heads != facts.adapter.num_kv_heads:
            raise CheckpointError(
                "the emitter's ViT and pooler expect as many key/value heads as query heads",
                "use a Molmo2 checkpoint (its ViT and pooler are multi-head, not grouped)",
            )
        return cls(
            vit=facts.vit,
            adapter=facts.adapter,
            text=facts.text,
            selected_layers=facts.selected_layers,
            execution_depth=facts.execution_depth,
            image_patch_id=facts.image_patch_id,
        )
