"""Bit for bit where the BLAS library keeps a product's bits whatever its shape, else to float32
rounding: what a split step's (or a slotted product's) outputs are held to against the whole's.

On an AVX-512 Xeon both libraries gave an element of a convolution's product the same bits in a
product cut into parts or set beside others; on an AMD EPYC (Zen 3) OpenBLAS 0.3.31 did not, and
the promise there is float32 rounding (``blas_threads.bits_fixed`` finds which, at run time;
docs/lms.md).
"""
import numpy as np

from minilms.kernels import blas_threads

ROUNDING = 1e-5     # of the largest magnitude, as tests/layers/test_split.py's regrouped outputs


def assert_bits_or_rounding(got, want, err_msg="", library=None, small=False):
    """``got == want`` bit for bit where ``blas_threads.bits_fixed(library, small)`` (``small``
    None: products of any size, both kinds); within ``ROUNDING`` of ``want``'s largest magnitude
    otherwise."""
    kinds = (False, True) if small is None else (small,)
    if all(blas_threads.bits_fixed(library, kind) for kind in kinds):
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
    else:
        np.testing.assert_allclose(got, want, rtol=ROUNDING,
                                   atol=ROUNDING * float(np.abs(want).max()),
                                   err_msg=f"{err_msg} (to rounding: this BLAS's bits move "
                                           f"with a product's shape)")
