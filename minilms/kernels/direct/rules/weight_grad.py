"""Where the direct weight gradient pays (``direct.weight_grad`` runs it)."""
__all__ = ["DW_GEMM_WEIGHTS", "DW_GEMM_PLANE", "weight_grad_pays"]

# Weights (output x input channels) from which im2col + GEMM makes a weight gradient faster than
# the direct kernel, where the output plane is at most DW_GEMM_PLANE positions: there the GEMM's
# long dimensions are the channels, and its columns are small (measured on ResNet-50's and
# GoogLeNet's 3x3 layers at 224x224, batch 2-16: docs/benchmarks.md, "Why the code chose").
DW_GEMM_WEIGHTS = 1 << 14
DW_GEMM_PLANE = 28 * 28


def weight_grad_pays(weight_shape, out_plane: int) -> bool:
    """Measured (layer backward in ``scripts/bench_kernels.py``'s way; the figures in
    docs/benchmarks.md): direct beats im2col + GEMM for 3x3 kernels, one input channel (LeNet
    conv1) and LeNet conv2 (20 channels, 5x5, now that its input gradient is no GEMM either:
    after one, OpenBLAS's spinning threads had made the direct kernel lose), except where many
    channels meet a small plane (``DW_GEMM_WEIGHTS``, ``DW_GEMM_PLANE``: ResNet-50's last two
    stages). A 1x1 convolution's col is its input, and its GEMM has nothing to save."""
    out, channels, kh, kw = weight_shape
    return kh * kw > 1 and not (out * channels >= DW_GEMM_WEIGHTS and out_plane <= DW_GEMM_PLANE)
