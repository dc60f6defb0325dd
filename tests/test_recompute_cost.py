"""What a recompute costs and what a swap costs (issue 21), by the cost model, against numbers
worked out by hand on a small net: a convolution with an in-place ReLU over its top, batch norm,
dropout, an inner product and the loss."""
import numpy as np
import pytest

from minilms.errors import ShapeError
from minilms.lms.cost import (
    CostModel,
    producers,
    recompute_seconds,
    recompute_step,
    swap_seconds,
)
from minilms.net import Net

LAYERS = [
    {"name": "conv", "type": "Convolution", "bottom": "data", "top": "c", "num_output": 4,
     "kernel_size": 3, "pad": 1, "engine": "reference"},
    {"name": "relu", "type": "ReLU", "bottom": "c", "top": "c"},
    {"name": "bn", "type": "BatchNorm", "bottom": "c", "top": "b"},
    {"name": "drop", "type": "Dropout", "bottom": "b", "top": "d"},
    {"name": "fc", "type": "InnerProduct", "bottom": "d", "top": "fc", "num_output": 5},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
]
# round numbers: 1 GFLOP/s, 100 MB/s memory, 10 MB/s link, 10 us a step, 2 us a copy
MODEL = CostModel(1e9, 1e8, 1e7, "by hand", step_seconds_fixed=1e-5, copy_seconds_fixed=2e-6)


@pytest.fixture
def net():
    net = Net(LAYERS, {"data": ((2, 3, 4, 4), np.float32), "label": ((2,), np.int32)})
    net.schedule()      # names the parameter, saved and workspace blobs
    return net


def test_recompute_of_a_convolution_and_its_in_place_relu(net):
    # conv: data 2*3*4*4 floats = 384 B, weight 4*3*3*3 = 432 B, bias 16 B, top c 2*4*4*4 = 512 B,
    # workspace col: 2 samples * (27 rows + 4 dy rows) * 16 positions = 992 floats = 3968 B;
    # 2 * N * out * OH * OW * K = 2 * 2 * 4 * 16 * 27 = 6912 FLOPs
    conv = 1e-5 + 6912 / 1e9 + (384 + 432 + 16 + 512 + 3968) / 1e8
    relu = 1e-5 + 512 / 1e8           # in place: c updated, nothing else
    assert [layer.name for layer in producers(net, "c")] == ["conv", "relu"]
    assert recompute_seconds(net, "c", MODEL) == pytest.approx(conv + relu, rel=1e-12)
    step = recompute_step(net, net.layer["relu"])
    assert (step.reads, step.writes, step.updates) == ((), (), ("c",))
    # the convolution's recompute is its forward step: the same blobs, the same cost
    forward = next(s for s in net.schedule() if s.name == "forward conv")
    assert MODEL.step_seconds(net, recompute_step(net, net.layer["conv"])) == \
        pytest.approx(MODEL.step_seconds(net, forward), rel=1e-12) == pytest.approx(conv)


def test_recompute_of_batch_norm_reads_its_saved_statistics_not_the_running_ones(net):
    # reads c 512 B, weight, bias, mean, invstd 16 B each; writes b 512 B; workspace dweight,
    # dbias 16 B each and the cuda sums' stats 192 B (float64, 2 x 4 channels x (2 samples' one
    # piece + the mean): the net is set up for either device); no FLOPs counted (memory-bound).
    # The forward step also updates the running mean and variance (32 B more): the recompute does
    # not touch them.
    step = recompute_step(net, net.layer["bn"])
    assert set(step.reads) == {"c", "bn.weight", "bn.bias", "bn.mean", "bn.invstd"}
    assert (step.writes, step.updates) == (("b",), ())
    assert recompute_seconds(net, "b", MODEL) == pytest.approx(1e-5 + 1312 / 1e8, rel=1e-12)
    forward = next(s for s in net.schedule() if s.name == "forward bn")
    assert MODEL.step_seconds(net, forward) == pytest.approx(1e-5 + 1344 / 1e8, rel=1e-12)


def test_recompute_of_dropout_reads_its_mask(net):
    # reads b 512 B and the uint8 mask 2*4*4*4 = 128 B, writes d 512 B
    step = recompute_step(net, net.layer["drop"])
    assert set(step.reads) == {"b", "drop.mask"} and step.writes == ("d",)
    assert recompute_seconds(net, "d", MODEL) == pytest.approx(1e-5 + 1152 / 1e8, rel=1e-12)


def test_swap_is_a_copy_out_and_a_copy_in(net):
    assert swap_seconds(net, "c", MODEL) == pytest.approx(2 * (2e-6 + 512 / 1e7), rel=1e-12)
    assert swap_seconds(net, "fc", MODEL) == pytest.approx(2 * (2e-6 + 40 / 1e7), rel=1e-12)
    # on this slow link rebuilding the convolution's top is cheaper than swapping it
    assert recompute_seconds(net, "c", MODEL) < swap_seconds(net, "c", MODEL)


def test_what_cannot_be_recomputed(net):
    with pytest.raises(ShapeError, match="layer loss \\(SoftmaxWithLoss\\): recompute: .*not "
                                         "recomputable"):
        recompute_seconds(net, "loss", MODEL)
    for blob in ("data", "conv.weight", "c.grad"):
        with pytest.raises(ValueError, match=f"blob {blob}: no forward makes it"):
            recompute_seconds(net, blob, MODEL)


def test_the_schedule_names_the_blobs_first():
    net = Net(LAYERS, {"data": ((2, 3, 4, 4), np.float32), "label": ((2,), np.int32)})
    with pytest.raises(ValueError, match="make the net.s schedule"):
        recompute_seconds(net, "c", MODEL)
