"""Elementwise kernels: ReLU, axpby / weighted sums, scale, fill, dropout, accumulate, and the
copy of a slice of channels (``slice_copy``: Concat's parts, Convolution's bands, the stacked
1x1s' members). Two of them fuse a ReLU into the pass before or after it (an Eltwise with
``relu: true``): ``axpby_relu`` and ``relu_backward_scale``, each bit for bit the two kernels it
replaces, one pass over memory fewer.

Every launcher works on C-contiguous arrays of any shape (they are viewed flat) and of float32 or
float64; scalars are cast to the array's dtype before the call, so float32 data is never computed
in float64 (on a GPU that would be slow, and it is not what the PTX report checks). Outputs may
alias inputs (``out is x`` is fine): each element is read before it is written, by the same thread.
"""
import numpy as np
from numba import njit, prange

from ..lazy_cuda import cuda
from .common import flat, grid_1d, launch, view
from .registry import cuda_kernel, on_cpu

__all__ = ["relu_forward", "relu_backward", "axpby", "axpby_relu", "eltwise_sum", "scale",
           "relu_backward_scale", "fill",
           "dropout_mask", "dropout_forward", "dropout_backward", "accumulate", "slice_copy"]

_F1 = ("float32[::1]", "float64[::1]")
_SCALAR = {"float32[::1]": "float32", "float64[::1]": "float64"}


def _sigs(pattern: str) -> list[str]:
    """One signature per float dtype: ``A`` stands for the 1-d array type, ``S`` for its scalar."""
    return [pattern.replace("A", a).replace("S", _SCALAR[a]) for a in _F1]


# ---------------------------------------------------------------- ReLU

@cuda_kernel(*_sigs("void(A, A)"))
def relu_forward_cuda(x, y):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        if v <= 0:   # written as a branch so NaN passes through, as in PyTorch
            y[i] = 0
        else:
            y[i] = v


@njit(parallel=True, cache=True, nogil=True)
def relu_forward_cpu(x, y):
    for i in prange(x.size):
        v = x[i]
        if v <= 0:
            y[i] = 0
        else:
            y[i] = v


@cuda_kernel(*_sigs("void(A, A, A)"))
def relu_backward_cuda(y, dy, dx):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        if y[i] <= 0:
            dx[i] = 0
        else:
            dx[i] = dy[i]


@njit(parallel=True, cache=True, nogil=True)
def relu_backward_cpu(y, dy, dx):
    for i in prange(y.size):
        if y[i] <= 0:
            dx[i] = 0
        else:
            dx[i] = dy[i]


def relu_forward(x, y, stream=None):
    """``y = max(x, 0)`` elementwise (NaN stays NaN); ``y`` may be ``x`` (in place)."""
    x, y = flat(x, y)
    if on_cpu(x):
        relu_forward_cpu(x, y)
    else:
        launch(relu_forward_cuda, *grid_1d(x.size), stream)(x, y)


def relu_backward(y, dy, dx, stream=None):
    """``dx = dy * (y > 0)`` from the forward OUTPUT ``y`` (the input ``x`` works as well: ``y > 0``
    exactly when ``x > 0``), so an in-place forward can drop ``x``. The gradient at exactly 0 is 0.
    ``dx`` may be ``dy``."""
    y, dy, dx = flat(y, dy, dx)
    if on_cpu(y):
        relu_backward_cpu(y, dy, dx)
    else:
        launch(relu_backward_cuda, *grid_1d(y.size), stream)(y, dy, dx)


# ---------------------------------------------------------------- axpby, scale, fill

@cuda_kernel(*_sigs("void(S, A, S, A, A)"))
def axpby_cuda(a, x, b, y, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = a * x[i] + b * y[i]


@njit(parallel=True, cache=True, nogil=True)
def axpby_cpu(a, x, b, y, out):
    for i in prange(x.size):
        out[i] = a * x[i] + b * y[i]


def axpby(a, x, b, y, out, stream=None):
    """``out = a*x + b*y`` elementwise; ``out`` may be ``x`` or ``y``. IEEE throughout: ``b = 0``
    still reads ``y`` (0 * NaN is NaN); to overwrite, use ``scale``."""
    x, y, out = flat(x, y, out)
    t = x.dtype.type
    if on_cpu(x):
        axpby_cpu(t(a), x, t(b), y, out)
    else:
        launch(axpby_cuda, *grid_1d(x.size), stream)(t(a), x, t(b), y, out)


@cuda_kernel(*_sigs("void(S, A, S, A, A)"))
def axpby_relu_cuda(a, x, b, y, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = a * x[i] + b * y[i]          # axpby's expression, then relu_forward's branch
        if v <= 0:
            out[i] = 0
        else:
            out[i] = v


@njit(parallel=True, cache=True, nogil=True)
def axpby_relu_cpu(a, x, b, y, out):
    for i in prange(x.size):
        v = a * x[i] + b * y[i]
        if v <= 0:
            out[i] = 0
        else:
            out[i] = v


def axpby_relu(a, x, b, y, out, stream=None):
    """``out = max(a*x + b*y, 0)`` (NaN stays NaN): ``axpby`` then ``relu_forward``, bit for bit,
    in one pass. ``out`` may be ``x`` or ``y``."""
    x, y, out = flat(x, y, out)
    t = x.dtype.type
    if on_cpu(x):
        axpby_relu_cpu(t(a), x, t(b), y, out)
    else:
        launch(axpby_relu_cuda, *grid_1d(x.size), stream)(t(a), x, t(b), y, out)


def eltwise_sum(xs, out, coeffs=None, stream=None, relu=False):
    """``out = sum_i coeffs[i] * xs[i]`` (coefficients default to 1), as a chain of ``axpby``:
    ``((c0*x0 + c1*x1) + c2*x2) + ...``, a fixed order, so the result is deterministic.
    ``out`` may be ``xs[0]`` or ``xs[1]`` but no later input (it is overwritten first).
    ``relu``: ``max(sum, 0)``, fused into the chain's last pass."""
    if not xs:
        raise ValueError("eltwise_sum needs at least one input")
    coeffs = [1.0] * len(xs) if coeffs is None else list(coeffs)
    if len(coeffs) != len(xs):
        raise ValueError(f"{len(xs)} inputs but {len(coeffs)} coefficients")
    if len(xs) == 1:
        scale(xs[0], coeffs[0], out, stream)
        if relu:
            relu_forward(out, out, stream)
        return
    last = len(xs) - 2                    # the index of the last axpby of the chain
    (axpby_relu if relu and last == 0 else axpby)(coeffs[0], xs[0], coeffs[1], xs[1], out,
                                                  stream)
    for k, (x, c) in enumerate(zip(xs[2:], coeffs[2:]), 1):
        (axpby_relu if relu and k == last else axpby)(1.0, out, c, x, out, stream)


@cuda_kernel(*_sigs("void(A, S, A)"))
def scale_cuda(x, alpha, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = alpha * x[i]


@njit(parallel=True, cache=True, nogil=True)
def scale_cpu(x, alpha, out):
    for i in prange(x.size):
        out[i] = alpha * x[i]


def scale(x, alpha, out, stream=None):
    """``out = alpha * x``; ``out`` may be ``x``."""
    x, out = flat(x, out)
    if on_cpu(x):
        scale_cpu(x, x.dtype.type(alpha), out)
    else:
        launch(scale_cuda, *grid_1d(x.size), stream)(x, x.dtype.type(alpha), out)


@cuda_kernel(*_sigs("void(A, A, S, A, S, A)"))
def relu_backward_scale_cuda(y, dy, a, out_a, b, out_b):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        g = dy[i]
        if y[i] <= 0:                    # relu_backward's branch, then scale's product
            g = dy.dtype.type(0)
        out_a[i] = a * g
        if out_b.size:
            out_b[i] = b * g


@njit(parallel=True, cache=True, nogil=True)
def relu_backward_scale_cpu(y, dy, a, out_a, b, out_b):
    zero = dy.dtype.type(0)
    if out_b.size:
        for i in prange(y.size):
            g = dy[i]
            if y[i] <= 0:                # NaN passes dy, as relu_backward_cpu
                g = zero
            out_a[i] = a * g
            out_b[i] = b * g
    else:
        for i in prange(y.size):
            g = dy[i]
            if y[i] <= 0:
                g = zero
            out_a[i] = a * g


def relu_backward_scale(y, dy, a, out_a, b=0.0, out_b=None, stream=None):
    """``out_a = a * relu_backward(y, dy)`` and, if given, ``out_b = b * relu_backward(y, dy)``:
    ``relu_backward`` then ``scale`` (once or twice), bit for bit, reading ``y`` and ``dy`` once.
    The input gradients of an Eltwise with a fused ReLU. Outputs may be ``dy``."""
    y, dy, out_a = flat(y, dy, out_a)
    out_b = flat(out_b)[0] if out_b is not None else out_a[:0]
    t = y.dtype.type
    if on_cpu(y):
        relu_backward_scale_cpu(y, dy, t(a), out_a, t(b), out_b)
    else:
        launch(relu_backward_scale_cuda, *grid_1d(y.size), stream)(y, dy, t(a), out_a, t(b),
                                                                   out_b)


@cuda_kernel(*_sigs("void(A, S)"))
def fill_cuda(out, value):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = value


@njit(parallel=True, cache=True, nogil=True)
def fill_cpu(out, value):
    for i in prange(out.size):
        out[i] = value


def fill(out, value, stream=None):
    """``out[...] = value``."""
    (out,) = flat(out)
    if on_cpu(out):
        fill_cpu(out, out.dtype.type(value))
    else:
        launch(fill_cuda, *grid_1d(out.size), stream)(out, out.dtype.type(value))


# ---------------------------------------------------------------- dropout

def dropout_mask(rng: np.random.Generator, shape, p: float, out=None) -> np.ndarray:
    """Host-side keep mask (uint8, 1 = keep with probability ``1 - p``) from a seeded numpy
    Generator, so the ``cpu`` and ``cuda`` devices drop exactly the same elements. uint8 rather than
    the uniforms themselves: the mask is kept for backward, and is a quarter of a float32's size."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if out is None:
        out = np.empty(shape, np.uint8)
    np.greater_equal(rng.random(out.shape), p, out=out, casting="unsafe")
    return out


def _dropout_scale(p: float, dtype):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return dtype.type(0.0 if p == 1.0 else 1.0 / (1.0 - p))  # p = 1: every mask entry is 0


@cuda_kernel("void(float32[::1], uint8[::1], float32, float32[::1])",
             "void(float64[::1], uint8[::1], float64, float64[::1])")
def dropout_cuda(x, mask, s, out):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        if mask[i] != 0:
            out[i] = x[i] * s
        else:
            out[i] = 0


@njit(parallel=True, cache=True, nogil=True)
def dropout_cpu(x, mask, s, out):
    for i in prange(x.size):
        if mask[i] != 0:
            out[i] = x[i] * s
        else:
            out[i] = 0


def dropout_forward(x, mask, p, out, stream=None):
    """``out = x * mask / (1 - p)`` (inverted dropout: inference is the identity). ``mask`` is the
    uint8 keep mask from ``dropout_mask``, same size as ``x``; ``out`` may be ``x``. ``p = 1`` gives
    zeros."""
    x, mask, out = flat(x, mask, out)
    s = _dropout_scale(p, x.dtype)
    if on_cpu(x):
        dropout_cpu(x, mask, s, out)
    else:
        launch(dropout_cuda, *grid_1d(x.size), stream)(x, mask, s, out)


def dropout_backward(dy, mask, p, dx, stream=None):
    """``dx = dy * mask / (1 - p)``: the forward map is linear, so backward is the same kernel."""
    dropout_forward(dy, mask, p, dx, stream)


# ---------------------------------------------------------------- accumulate

@cuda_kernel(*_sigs("void(A, A)"), "void(int32[::1], int32[::1])")
def accumulate_cuda(dst, src):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] += src[i]


@njit(parallel=True, cache=True, nogil=True)
def accumulate_cpu(dst, src):
    for i in prange(dst.size):
        dst[i] += src[i]


def accumulate(dst, src, stream=None):
    """``dst += src``: gradient accumulation where a blob feeds several layers of a DAG, and the
    sums of a step split along the batch (int32 too: counts). The order of the calls fixes the
    order of the sums, so the result is deterministic."""
    dst, src = flat(dst, src)
    if on_cpu(dst):
        accumulate_cpu(dst, src)
    else:
        launch(accumulate_cuda, *grid_1d(dst.size), stream)(dst, src)


# ---------------------------------------------------------------- slice copy

SLICE_PIECE = 16384    # elements a task of ``slice_copy_cpu`` copies, at most (64 KiB)

_SLICE_SIGS = [f"void({t}[:, :, ::1], {t}[:, :, ::1], int64, boolean)"
               for t in ("float32", "float64")]


@cuda_kernel(*_SLICE_SIGS)
def slice_copy_cuda(part, whole, offset, into_whole):
    """Grid-stride over ``part``'s elements; consecutive threads take consecutive elements of a
    row, so both sides move in coalesced runs."""
    n, c, inner = part.shape
    for i in range(cuda.grid(1), n * c * inner, cuda.gridsize(1)):
        s, rest = i // (c * inner), i % (c * inner)
        ch, k = rest // inner, rest % inner
        if into_whole:
            whole[s, offset + ch, k] = part[s, ch, k]
        else:
            part[s, ch, k] = whole[s, offset + ch, k]


@njit(parallel=True, cache=True, nogil=True)
def slice_copy_cpu(part, whole, offset, into_whole):
    """A sample's block is ``c * inner`` consecutive elements on both sides: a task copies one
    as a flat loop, which vectorises, in pieces of ``SLICE_PIECE`` so both cores share a batch of
    one. A numba 2-D slice assignment per sample took 1.35x as long (docs/benchmarks.md,
    session 69)."""
    n, c, inner = part.shape
    run = c * inner
    pieces = (run + SLICE_PIECE - 1) // SLICE_PIECE
    for task in prange(n * pieces):
        s, k0 = task // pieces, (task % pieces) * SLICE_PIECE
        k1 = min(run, k0 + SLICE_PIECE)
        mine = part[s].reshape(run)
        theirs = whole[s].reshape(whole.shape[1] * inner)[offset * inner:offset * inner + run]
        src, dst = (mine, theirs) if into_whole else (theirs, mine)
        src, dst = src[k0:k1], dst[k0:k1]   # indexed from 0: a loop from k0 did not vectorise
        for k in range(k1 - k0):
            dst[k] = src[k]


def slice_copy(part, whole, offset: int, into_whole: bool, stream=None) -> None:
    """Copy ``part [N, C_p, ...]`` into axis-1 positions ``offset:offset + C_p`` of ``whole
    [N, C, ...]`` (``into_whole``), or out of them. Concat joins channels with it; Convolution's
    banded path moves a band of columns ``[M, L]`` of an ``[M, P]`` matrix; StackedConvolution
    its members' weights, tops and gradients in and out of its stacked ones."""
    n, c = part.shape[:2]
    part3 = view(part, n, c, -1)
    whole3 = view(whole, n, whole.shape[1], -1)
    if on_cpu(part):
        slice_copy_cpu(part3, whole3, offset, into_whole)
    else:
        launch(slice_copy_cuda, *grid_1d(part3.size), stream)(part3, whole3, offset, into_whole)
