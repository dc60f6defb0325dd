"""Layers, one per file. Importing this package registers every layer type in ``LAYERS``.

Adding a layer touches three places: its file here, its import below, and its test.
``stacked_convolution`` is the one file not imported below: no config lists that layer, the net
makes it of sibling 1x1 convolutions (``minilms.fusion.stack_siblings``, which imports it).
"""
from . import (  # noqa: F401  (registration)
    accuracy,
    batch_norm,
    concat,
    convolution,
    dropout,
    eltwise,
    flatten,
    inner_product,
    pooling,
    relu,
    softmax_with_loss,
)
from .base import LAYERS, BufferSpec, Layer, ParamSpec, ShapeError, StepIO, register

__all__ = ["LAYERS", "Layer", "ParamSpec", "BufferSpec", "ShapeError", "StepIO", "register"]
