"""``common.view`` / ``common.span``: views that never copy, made once per CUDA array and shape
(``derived``) because each numba device-array view costs tens of microseconds of host time."""
import gc

import numpy as np
import pytest
from numba import cuda

from minilms.kernels import common


def test_numpy_views_alias_and_refuse_what_would_copy():
    a = np.arange(12, dtype=np.float32)
    v = common.view(a, 3, 4)
    v[1, 2] = -1
    assert a[6] == -1 and common.span(v, 0, 3) is v and common.span(v, 1, 2).shape == (1, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        common.view(v.T, 12)


@pytest.mark.cuda
def test_cuda_views_are_made_once_and_alias_the_array():
    a = cuda.to_device(np.arange(24, dtype=np.float32))
    v = common.view(a, 2, 3, 4)
    assert common.view(a, 2, 3, 4) is v and common.view(a, 6, 4) is not v
    part = common.span(v, 1, 2)
    assert common.span(v, 1, 2) is part and common.span(v, 0, 2) is v
    common.view(part, 12).copy_to_device(np.full(12, 7, np.float32))   # writes through
    np.testing.assert_array_equal(a.copy_to_host()[12:], 7)
    np.testing.assert_array_equal(a.copy_to_host()[:12], np.arange(12))


@pytest.mark.cuda
def test_a_collected_array_takes_its_views_with_it():
    a = cuda.to_device(np.zeros(8, np.float32))
    common.view(a, 2, 4)
    key = id(a)
    assert key in common._DERIVED
    del a
    gc.collect()
    assert key not in common._DERIVED
