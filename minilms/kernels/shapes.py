"""What planning asks of the kernel families, in a module that compiles nothing: a convolution's
and a pooling's output extent, how many samples share one product (``slotted``), how many partial
sums a CUDA weight gradient gets (``split_k``), the shapes of batch norm's sums.

A layer sizes its outputs and workspace from these when it is set up, and planning sets up every
layer of a net and runs none: so ``python -m minilms.plan`` never imports numba, which every
family compiles with (``minilms.lazy``). The families import them from here, and name them as
their own (``im2col.conv_out_size``, ``slotted.count``, ``split_k.split_k``, ``gemm.BM``,
``batchnorm_sums.stats_shape``); the direct convolutions' rules are ``direct.rules``.
"""
__all__ = ["conv_out_size", "pool_output_size", "SHORT_PLANE", "MIN_PLANE", "MIN_WEIGHT",
           "SLOT_COLUMNS", "ALIGN", "count", "width", "GEMM_TILE", "INNER_LOOP_FFMA_SHARE",
           "SPLIT_K_BLOCKS", "MIN_K_SPAN", "split_k", "PIECE", "pieces", "stats_shape",
           "cpu_stats_shape", "argmax_dtype", "SHORT_ARGMAX"]


# -- im2col ----------------------------------------------------------------------------------------
def conv_out_size(size, kernel, stride=1, padding=0, dilation=1) -> int:
    """Output extent along one axis:
    ``(size + 2 padding - dilation (kernel - 1) - 1) // stride + 1``."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


# -- pooling ---------------------------------------------------------------------------------------
def pool_output_size(size: int, kernel: int, stride: int, pad: int, ceil_mode=False) -> int:
    """Output length of one spatial axis (``kernels.pooling``'s docstring)."""
    if kernel < 1 or stride < 1 or pad < 0 or pad > kernel // 2:
        raise ValueError(f"bad pooling kernel={kernel} stride={stride} pad={pad} "
                         "(need kernel, stride >= 1 and 0 <= pad <= kernel // 2)")
    span = size + 2 * pad - kernel
    if span < 0:
        raise ValueError(f"pooling kernel {kernel} larger than padded input {size + 2 * pad}")
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


# The cpu's max pooling keeps a plane's flat index in 16 bits where the plane has at most this many
# inputs: the argmax is half the bytes to write in forward and to read in backward (GoogLeNet's
# inception pools 0.75x the time forward, 0.87x backward: docs/benchmarks.md, session 69). CUDA's
# kernels are compiled for int32 (``kernels.pooling``), and so is a layer set up for either device.
SHORT_ARGMAX = 2**16


def argmax_dtype(device_kind, plane: int) -> str:
    """The dtype of max pooling's saved argmax for a layer set up for ``device_kind`` whose input
    planes have ``plane`` pixels: ``uint16`` on the cpu up to ``SHORT_ARGMAX``, else ``int32``."""
    return "uint16" if device_kind == "cpu" and plane <= SHORT_ARGMAX else "int32"


# -- split-K: a summed product's partial sums (``kernels.split_k``) -------------------------------
GEMM_TILE = (128, 128)   # the CUDA GEMM's block tile, BM x BN (``kernels.gemm``, which reads it)
# The least share of FFMA among the sm_90 SASS instructions of the GEMM's four variants' inner
# loops (scripts/kernel_report.py; tests/kernels/test_sass.py holds it to
# tests/golden/gemm_sass.json). FFMA issue is the GEMM's ceiling: the share of peak it can reach
# at most. The ``cuda`` cost model builds on it.
INNER_LOOP_FFMA_SHARE = 0.75
SPLIT_K_BLOCKS = 264     # two blocks per SM of an H100 (132 SMs): what a summed product should fill
MIN_K_SPAN = 512         # a part of K at least 64 slices deep: its first load and its store small


def split_k(m: int, n: int, samples: int, depth: int, most: int | None = None) \
        -> tuple[int, int]:
    """``(groups, k_parts)``: partial sums enough (``groups * k_parts``, the batch of ``c`` in
    ``gemm_batched``) to give a product of ``[m, n]`` summed over ``samples`` products of depth
    ``depth`` (each sample's K) the blocks to fill a GPU, at most ``most`` of them. ``groups``
    divides ``samples`` (a block sums ``samples / groups`` of them); where that is too few, each
    sample's K is split into ``k_parts`` spans of at least ``MIN_K_SPAN``. ``(1, 1)`` where the
    tiles alone fill the GPU."""
    bm, bn = GEMM_TILE           # read at the call: the simulator's tests shrink the tile
    tiles = -(-m // bm) * -(-n // bn)
    want = min(-(-SPLIT_K_BLOCKS // tiles), most or SPLIT_K_BLOCKS)
    if tiles >= SPLIT_K_BLOCKS // 2 or want < 2:
        return 1, 1
    groups = max(d for d in range(1, min(samples, want) + 1) if samples % d == 0)
    return groups, max(1, min(want // groups, depth // MIN_K_SPAN))


# -- slotted: samples side by side in one product --------------------------------------------------
# Planes below SHORT_PLANE go into slots, enough of them for about SLOT_COLUMNS columns (8 on a
# 7x7 plane). What slots save is reading the weight once per sample, so a weight below
# MIN_WEIGHT elements (2 MiB, a core's L2 on the machines measured) stays per sample, as do
# planes below MIN_PLANE pixels (rounding the width up to ALIGN columns would be most of the
# product); both keep small nets' products, and workspaces, as they were. The measurements behind
# each bound: docs/benchmarks.md, session 37 and "Why the code chose".
SHORT_PLANE = 128
MIN_PLANE = 16
MIN_WEIGHT = 2**19
SLOT_COLUMNS = 384
ALIGN = 16


def count(plane: int, batch: int, chunk: int, weight: int) -> int:
    """Samples per product for a layer of ``batch`` samples whose workspace holds ``chunk``
    samples' columns, with a ``weight`` of that many elements (``[O, K]``): 1 (a product per
    sample) on planes of ``SHORT_PLANE`` and more, or of fewer than ``MIN_PLANE``, or with a
    weight below ``MIN_WEIGHT``; otherwise enough for about ``SLOT_COLUMNS`` columns, at most
    ``chunk``, evened out over the batch (10 samples take two products of 5, not 8 and 2 with 6
    slots empty)."""
    if not MIN_PLANE <= plane < SHORT_PLANE or weight < MIN_WEIGHT or chunk < 2 or batch < 2:
        return 1
    want = min(chunk, batch, -(-SLOT_COLUMNS // plane))
    products = -(-batch // want)
    return -(-batch // products)


def width(slots: int, plane: int) -> int:
    """The columns of a product over ``slots`` samples' planes: rounded up to ``ALIGN``."""
    return -(-slots * plane // ALIGN) * ALIGN


# -- batch norm's sums -----------------------------------------------------------------------------
PIECE = 2048         # values of a row one warp adds: 64 a lane


def pieces(hw: int) -> int:
    """``P``: the pieces a row of ``hw`` values is cut into (at least one)."""
    return max(1, -(-hw // PIECE))


def stats_shape(channels: int, samples: int, hw: int) -> tuple:
    """The float64 ``stats`` of a batch of ``samples`` with ``hw`` values a row."""
    return (2, channels, samples * pieces(hw) + 1)


def cpu_stats_shape(channels: int) -> tuple:
    """The float64 carry of a split step's sums on the ``cpu`` device: two per channel."""
    return (2, channels, 1)
