"""A hypothesis-patch file that plants a defect instead of fixing one: the tiny Qwen2.5-VL family's
``rank_scatter_unreorder`` mutation (the final un-reorder uses ``reverse[orig] = rank`` instead of argsort),
active on every call of the MLX vision tower. It only shows on images whose window permutation is not an
involution (e.g. 336x336 on the tiny fixture)."""

from __future__ import annotations


def rank_scatter_unreorder(model):
    """Plant the ``reverse[orig] = rank`` un-reorder in the loaded MLX model's vision tower."""
    from driftscope.families import get_family

    mutation = get_family("qwen2_5_vl").mutation_registry().get("rank_scatter_unreorder")
    tower = model.vision_tower
    base = type(tower)

    class Planted(base):
        def __call__(self, *args, **kwargs):
            with mutation.during(model, dict(mutation.settings)):
                return base.__call__(self, *args, **kwargs)

    tower.__class__ = Planted
    return model
