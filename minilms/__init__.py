"""minilms: deep learning with Large Model Support from first principles.

Every blob lives on the host; the device holds one fixed pool; each step stages its working set
into the pool. See docs/design.md for the vocabulary and the architecture.
"""
import os

# Numba's OpenMP threads and the BLAS threads take turns on the same cores; by default each pool
# spins while the other works, and a convolution (im2col, then GEMM, per sample) ran many times
# slower on two cores (docs/benchmarks.md, "Why the code chose"). Passive waiting removes that. It
# must be set before the OpenMP runtime starts; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
