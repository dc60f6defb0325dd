"""Launches per training iteration on the cuda device do not grow with the batch (issue 19): the
convolution runs a chunk of samples per launch, every other layer one launch per kernel per step.
Counted by ``kernels.common.counting_launches`` around the second iteration (the first runs the
plan's prologue too)."""
from contextlib import nullcontext
from unittest import mock

import pytest

from minilms import zoo
from minilms.kernels.common import counting_launches
from minilms.layers.convolution import Convolution
from minilms.lms import LmsExecutor, Policy, least_pool
from minilms.net import Net
from minilms.solver import SGD

from .devices import new_device
from .layers.conftest import small_gemm_tile  # noqa: F401  (a fixture: small tiles in the simulator)
from .test_executor import RESIDUAL_INCEPTION, batch

pytestmark = pytest.mark.cuda

WITH_BATCH_NORM = ([dict(RESIDUAL_INCEPTION[0], top="c0"),
                    {"name": "bn1", "type": "BatchNorm", "bottom": "c0", "top": "c1"}]
                   + RESIDUAL_INCEPTION[1:])


def launches_per_iteration(layers, inputs, run=True, per_sample=False):
    """Kernel launches (a Counter by name) in the second training iteration of an LMS executor
    whose pool is 1.5x the least one (so blobs are swapped too). ``per_sample``: the convolution's
    path before issue 19, one sample at a time."""
    shapes = {k: (v.shape, v.dtype) for k, v in inputs.items()}
    net = Net(layers, shapes)
    pool = int(1.5 * least_pool(net, net.schedule(("momentum",))))
    forced = mock.patch.multiple(Convolution, _batch_chunk=lambda self, n: 0,
                                 pointwise_on_cuda=False) if per_sample else nullcontext()
    with new_device("cuda", pool) as device, forced:
        executor = LmsExecutor(Net(layers, shapes, device_kind="cuda"), device,
                               SGD(0.01, momentum=0.9), Policy(prefetch=1))
        with counting_launches(run=run):
            executor.iterate(inputs)
        with counting_launches(run=run) as launches:
            executor.iterate(inputs)
    return launches


@pytest.mark.usefixtures("small_gemm_tile")
def test_counted_launches_are_the_same_at_batch_2_and_batch_8():
    """The launches counted without running the kernels are the same at batch 2 and batch 8:
    the fast twin of the slow test below, which runs them (3 minutes in the simulator)."""
    two = launches_per_iteration(WITH_BATCH_NORM, batch(2, 2, 4, classes=3), run=False)
    eight = launches_per_iteration(WITH_BATCH_NORM, batch(8, 2, 4, classes=3), run=False)
    assert two == eight
    assert two["im2col_batch_kernel"] > 0 and two["col2im_batch_kernel"] > 0
    assert not {"im2col_kernel", "col2im_kernel"} & set(two)


@pytest.mark.simulator_slow
@pytest.mark.usefixtures("small_gemm_tile")
def test_counted_launches_are_those_that_run():
    """At batch 2 the launches counted without running the kernels are those that run (a
    minute in the simulator)."""
    two = launches_per_iteration(WITH_BATCH_NORM, batch(2, 2, 4, classes=3), run=False)
    assert launches_per_iteration(WITH_BATCH_NORM, batch(2, 2, 4, classes=3)) == two


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.usefixtures("small_gemm_tile")
def test_launches_per_iteration_are_the_same_at_batch_2_and_batch_8():
    """Kernels run (in the simulator without a GPU): the residual + inception net with batch
    norm, each kernel's count the same at both batch sizes, the batched convolution kernels
    among them; and counting without running them (``run=False``, which counts a full-size
    schedule in seconds) counts the same launches."""
    two = launches_per_iteration(WITH_BATCH_NORM, batch(2, 2, 4, classes=3))
    eight = launches_per_iteration(WITH_BATCH_NORM, batch(8, 2, 4, classes=3))
    assert two == eight
    assert two["im2col_batch_kernel"] > 0 and two["col2im_batch_kernel"] > 0
    assert not {"im2col_kernel", "col2im_kernel"} & set(two)
    assert launches_per_iteration(WITH_BATCH_NORM, batch(8, 2, 4, classes=3), run=False) == eight


def test_one_sample_at_a_time_grows_with_the_batch():
    """The counter sees the convolution's launches: the per-sample path (before issue 19) makes
    more at batch 8 than at 2, by the convolution kernels alone."""
    two = launches_per_iteration(WITH_BATCH_NORM, batch(2, 2, 4, classes=3), run=False,
                                 per_sample=True)
    eight = launches_per_iteration(WITH_BATCH_NORM, batch(8, 2, 4, classes=3), run=False,
                                   per_sample=True)
    grew = {name for name in eight if eight[name] != two[name]}
    assert "im2col_kernel" in grew and grew <= {"im2col_kernel", "col2im_kernel", "gemm_nn",
                                                "gemm_nt", "gemm_tn", "gemm_tt", "fill_cuda"}, grew
    assert sum(eight.values()) > sum(two.values())


def test_a_resnet_launches_as_many_kernels_at_batch_2_as_at_batch_8():
    """ResNet-18 at 1/16 width on 32x32 images, counted without running the kernels."""
    layers = zoo.resnet(18, num_classes=4, width=16)
    two = launches_per_iteration(layers, batch(2, 3, 32, classes=4), run=False)
    eight = launches_per_iteration(layers, batch(8, 3, 32, classes=4), run=False)
    assert two == eight and sum(two.values()) > 200
    assert sum(launches_per_iteration(layers, batch(8, 3, 32, classes=4), run=False,
                                      per_sample=True).values()) > sum(eight.values())
