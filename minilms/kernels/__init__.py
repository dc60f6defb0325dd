"""Numba kernels: each family keeps its CUDA kernels beside their CPU counterparts.

See ``registry`` for the conventions every family follows.
"""
from .registry import KERNELS, cuda_kernel, on_cpu, shared

__all__ = ["KERNELS", "cuda_kernel", "on_cpu", "shared"]
