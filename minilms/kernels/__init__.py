"""Numba kernels: each family keeps its CUDA kernels beside their CPU counterparts.

See ``registry`` for the conventions every family follows. ``families(...)`` names families for a
module that calls them but compiles nothing itself (a layer, an executor): a ``minilms.lazy``
``LazyModule`` each, which imports the family at the first name used, so numba, which every
family compiles with, is imported with the first kernel that runs, not with the layers (planning
runs none: what it asks of the families is ``shapes`` and ``direct.rules``).
"""
from ..lazy import LazyModule
from . import shapes  # numba-free: what planning asks (its docstring)
from .registry import KERNELS, cuda_kernel, on_cpu, shared

__all__ = ["KERNELS", "cuda_kernel", "families", "on_cpu", "shared", "shapes"]


def families(*names: str) -> tuple:
    """A ``LazyModule`` for each family of this package named."""
    return tuple(LazyModule(f"{__name__}.{name}") for name in names)
