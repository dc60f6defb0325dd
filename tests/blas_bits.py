"""Bit for bit where the BLAS library keeps a product's bits whatever its shape, else to rounding:
what a split step's (or a slotted product's) outputs are held to against the whole's.

On an AVX-512 Xeon both libraries gave an element of a convolution's product the same bits in a
product cut into parts or set beside others; on AMD EPYCs (Zen 3, and Zen 4's float64) OpenBLAS
0.3.31 did not, and the promise there is rounding (``blas_threads.bits_fixed`` finds which, at run
time, per dtype; docs/lms.md).
"""
import numpy as np

from minilms.kernels import blas_threads

# of the largest magnitude, as tests/layers/test_split.py's regrouped outputs
ROUNDING = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-13}


def assert_bits_or_rounding(got, want, err_msg="", library=None, small=False):
    """``got == want`` bit for bit where ``blas_threads.bits_fixed(library, small, dtype)`` for
    ``want``'s dtype (``small`` None: products of any size, both kinds); within ``ROUNDING`` of
    ``want``'s largest magnitude otherwise."""
    kinds = (False, True) if small is None else (small,)
    if all(blas_threads.bits_fixed(library, kind, want.dtype) for kind in kinds):
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
    else:
        rounding = ROUNDING[want.dtype]
        np.testing.assert_allclose(got, want, rtol=rounding,
                                   atol=rounding * float(np.abs(want).max()),
                                   err_msg=f"{err_msg} (to rounding: this BLAS's bits move "
                                           f"with a product's shape)")
