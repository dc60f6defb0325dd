"""minilms: deep learning with Large Model Support from first principles.

Every blob lives on the host; the device holds one fixed pool; each step stages its working set
into the pool. See docs/design.md for the vocabulary and the architecture.
"""
import os
import sys

# Numba's OpenMP threads and the BLAS threads take turns on the same cores; by default each pool
# spins while the other works, and a convolution (im2col, then GEMM, per sample) ran many times
# slower on two cores (docs/benchmarks.md, "Why the code chose"). Passive waiting removes that. It
# must be set before the OpenMP runtime starts; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ...but a thread that sleeps the moment a kernel ends is woken for the next, and on a VM whose idle
# vCPUs halt at once a wake-up cost 50-130 us: GoogLeNet's ~850 an iteration were a tenth of it.
# Since the BLAS pieces run on Numba's threads too (``kernels.blas_calls``), the OpenMP workers may
# spin between kernels without starving another pool: 50000 spins, about 2 ms here, before they
# sleep (docs/benchmarks.md, session 57). A value the user set wins (0: sleep at once, as before).
os.environ.setdefault("GOMP_SPINCOUNT", "50000")
# OpenBLAS's own (pthreads) workers spin for 2**28 cycles after each call by default, on the
# cores Numba's threads need next: a direct convolution kernel run after a GEMM took twice its
# time. 2**4 cycles makes them sleep at once. OpenBLAS reads this when it loads, so it holds only
# where minilms is imported before numpy (``python -m minilms.*`` always is); ``BLAS_SPIN_FIXED``
# says whether it did.
BLAS_SPIN_FIXED = "numpy" not in sys.modules or "OPENBLAS_THREAD_TIMEOUT" in os.environ
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# Numba picks TBB over OpenMP for its parallel loops wherever the ``tbb`` package is installed, and
# the ``mkl`` extra brings it: the cpu kernels were tuned, and the passive waiting above set, for
# OpenMP, which stays first where it loads (TBB, then Numba's own pool, where it does not).
os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")
# MKL (kernels/mkl.py) keeps the buffers its GEMMs pack into in pools of its own, per thread,
# which no plan can see: host memory beyond the plan's figure (ResNet-50's run 4 MiB more than
# on OpenBLAS). Without them it allocates per call, at no cost measured (docs/benchmarks.md).
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

__version__ = "0.1.0"
