"""Fixtures shared by the layer tests."""
import numba
import pytest

import minilms.kernels.gemm as gemm_module
from minilms.kernels import shapes


@pytest.fixture
def small_gemm_tile(monkeypatch):
    """Under the simulator, a GEMM tile that covers the layer tests' small matrices in one block of
    32 threads: the simulator's cost is per block and per syncthreads. Tile edges are the GEMM
    tests' business. Never on a real GPU, which compiles the constants into the kernel at first
    launch. Modules that want it say ``pytestmark = pytest.mark.usefixtures("small_gemm_tile")``."""
    if numba.config.ENABLE_CUDASIM:
        shape = dict(BM=8, BN=32, BK=16, TM=2, TN=4)
        derived = dict(zip(gemm_module.DERIVED,
                           gemm_module.derived_constants(*shape.values())))
        for name, value in {**shape, **derived}.items():
            monkeypatch.setattr(gemm_module, name, value)
        monkeypatch.setattr(shapes, "GEMM_TILE", (shape["BM"], shape["BN"]))  # split-K's
