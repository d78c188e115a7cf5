"""The generic family's planted defects (fixture power). A deep family names defects it knows in its geometry;
the generic family knows no module by meaning, only what every processor makes: the pixels.

- ``pixel_scale``: the processor's normalization off by 1% (a port that rescales with another constant), which
  every image token carries from the first stage on.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from driftscope.core.registry import Registry
from driftscope.inputs.processor_output import ModelInputs

from ..base import Mutation

MUTATIONS: Registry[Mutation] = Registry("mutation")


def _scaled_pixels(checkpoint, inputs: ModelInputs, settings: dict) -> ModelInputs:
    """The run's inputs with every floating processor array scaled by ``settings["factor"]``."""
    arrays = {
        name: (array * np.float32(settings["factor"]) if np.issubdtype(array.dtype, np.floating) else array)
        for name, array in inputs.arrays.items()
    }
    return replace(inputs, arrays=arrays)


def _pixel_stages(plan) -> list[str]:
    return [stage.id for stage in plan if stage.id.startswith("inputs.") and not stage.integer]


MUTATIONS.register(
    "pixel_scale",
    Mutation(
        name="pixel_scale",
        description="the processor's pixel normalization off by 1% (another rescale constant)",
        declared=_pixel_stages,
        inputs=_scaled_pixels,
        settings={"factor": 1.01},
    ),
)
