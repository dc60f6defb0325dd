"""NCHW pooling: max, average and global average; forward and backward.

Shapes: ``x``/``dx`` are ``[N, C, H, W]``, ``y``/``dy`` are ``[N, C, Ho, Wo]`` with, per spatial
axis (``pool_output_size``)::

    Ho = floor((H + 2*pad - kernel) / stride) + 1                 (ceil_mode=False, the default)
    Ho = ceil((H + 2*pad - kernel) / stride) + 1, minus 1 if the last window would start in the
         right padding                                            (ceil_mode=True, as PyTorch)

``kernel``, ``stride`` and ``pad`` are an int or an ``(h, w)`` pair; ``pad <= kernel // 2`` (as in
PyTorch), so every window holds at least one real element. The output size is not an argument of
the launchers: it is read from ``y``'s shape, so ceil mode is just a larger ``y``.

Max: padding never wins. ``argmax`` (shape of ``y``; int32, or uint16 on the cpu where the plane
has at most ``shapes.SHORT_ARGMAX`` pixels) records ``h*W + w`` of the maximum within its ``(n, c)``
plane (PyTorch's ``return_indices`` convention); ties go to the first maximum in row-major order;
NaN propagates, as in PyTorch.

Average: ``y = sum(window ∩ input) / divisor``. With ``count_include_pad=True`` (the default,
Caffe's and PyTorch's default) the divisor is the window clipped to the padded input, ``[-pad, H +
pad)``: zero padding counts, but the overhang of a ceil-mode window beyond the padding does not.
With
``count_include_pad=False`` it is the number of real elements.

Backward passes are gathers (each input element sums the outputs whose windows hold it), not
scatters, so overlapping windows need no float atomics and results are deterministic.

On the ``cpu`` device the max forward runs in two passes a plane (``pooling_planes``) where they
apply, else a row of outputs at a time (``pooling_rows``), else output by output here: the same
values and argmax from each.
"""
from numba import njit, prange

from ..lazy_cuda import cuda
from . import pooling_planes
from .common import block_sum, grid_1d, launch, view
from .pooling_planes import U, max_pool_forward_planes_cpu
from .pooling_rows import max_pool_forward_rows_cpu, max_pool_forward_stride2_cpu, stride2_rows_pay
from .registry import cpu_variant, cuda_kernel, on_cpu, shared
from .shapes import argmax_dtype, pool_output_size

__all__ = ["pool_output_size", "max_pool_forward", "max_pool_backward", "avg_pool_forward",
           "avg_pool_backward", "global_avg_pool_forward", "global_avg_pool_backward"]

GLOBAL_THREADS = 128   # global average pooling: one block per (n, c) plane


# The index math, written once for both targets. ``geom`` is (kh, kw, sh, sw, ph, pw).

@shared
def window(o, stride, pad, kernel, size, count_pad):
    """Input range ``[start, end)`` of output ``o`` clipped to the input, and its divisor length."""
    start = o * stride - pad
    end = min(start + kernel, size + pad)
    span = end - start
    start = max(start, 0)
    end = min(end, size)
    if not count_pad:
        span = end - start
    return start, end, span


@shared
def covering(i, stride, pad, kernel, out_size):
    """Outputs ``[first, last)`` whose windows hold input ``i``:
    ``o*stride - pad <= i < o*stride - pad + kernel``."""
    first = 0 if i + pad < kernel else (i + pad - kernel) // stride + 1
    last = min((i + pad) // stride + 1, out_size)
    return first, last


# Shared bodies call these inline njit versions: numba-cuda compiles a CPU dispatcher that device
# code calls as a device function (CUDATypingContext.resolve_value_type), so one name serves both.
_window, _covering = window.cpu, covering.cpu


@shared
def max_at(x, n, c, oh, ow, geom):
    """Max over output ``(oh, ow)``'s window and its ``h*W + w`` (first maximum wins; NaN wins)."""
    kh, kw, sh, sw, ph, pw = geom
    w_ = x.shape[3]
    h0, h1, _ = _window(oh, sh, ph, kh, x.shape[2], True)
    w0, w1, _ = _window(ow, sw, pw, kw, w_, True)
    best, arg = x[n, c, h0, w0], h0 * w_ + w0
    for h in range(h0, h1):
        for w in range(w0, w1):
            v = x[n, c, h, w]
            if v > best or v != v:
                best, arg = v, h * w_ + w
    return best, arg


@shared
def max_grad_at(dy, argmax, n, c, h, w, w_, geom):
    """Sum of ``dy`` over the outputs whose argmax is input ``(h, w)``, in (oh, ow) order."""
    kh, kw, sh, sw, ph, pw = geom
    oh0, oh1 = _covering(h, sh, ph, kh, dy.shape[2])
    ow0, ow1 = _covering(w, sw, pw, kw, dy.shape[3])
    acc = dy.dtype.type(0)
    for oh in range(oh0, oh1):
        for ow in range(ow0, ow1):
            if argmax[n, c, oh, ow] == h * w_ + w:
                acc += dy[n, c, oh, ow]
    return acc


@shared
def avg_at(x, n, c, oh, ow, geom, count_pad):
    """Average over output ``(oh, ow)``'s window."""
    kh, kw, sh, sw, ph, pw = geom
    h0, h1, dh = _window(oh, sh, ph, kh, x.shape[2], count_pad)
    w0, w1, dw = _window(ow, sw, pw, kw, x.shape[3], count_pad)
    acc = x.dtype.type(0)
    for h in range(h0, h1):
        for w in range(w0, w1):
            acc += x[n, c, h, w]
    return acc / x.dtype.type(dh * dw)


@shared
def avg_grad_at(dy, n, c, h, w, h_, w_, geom, count_pad):
    """Sum of ``dy / divisor`` over the outputs whose windows hold input ``(h, w)``."""
    kh, kw, sh, sw, ph, pw = geom
    oh0, oh1 = _covering(h, sh, ph, kh, dy.shape[2])
    ow0, ow1 = _covering(w, sw, pw, kw, dy.shape[3])
    acc = dy.dtype.type(0)
    for oh in range(oh0, oh1):
        _, _, dh = _window(oh, sh, ph, kh, h_, count_pad)
        for ow in range(ow0, ow1):
            _, _, dw = _window(ow, sw, pw, kw, w_, count_pad)
            acc += dy[n, c, oh, ow] / dy.dtype.type(dh * dw)
    return acc


@shared
def nchw(i, c_, h_, w_):
    """Flat row-major index -> (n, c, h, w)."""
    w = i % w_
    i //= w_
    h = i % h_
    i //= h_
    return i // c_, i % c_, h, w


# numba cannot type attribute access on a plain Python object: kernels call module-level names
max_at_cpu, max_at_cuda = max_at.cpu, max_at.cuda
max_grad_at_cpu, max_grad_at_cuda = max_grad_at.cpu, max_grad_at.cuda
avg_at_cpu, avg_at_cuda = avg_at.cpu, avg_at.cuda
avg_grad_at_cpu, avg_grad_at_cuda = avg_grad_at.cpu, avg_grad_at.cuda
nchw_cuda = nchw.cuda

_G = "UniTuple(int64, 6)"
_I4 = "int32[:, :, :, ::1]"


def _sigs(pattern):
    return [pattern.replace("X", x) for x in ("float32[:, :, :, ::1]", "float64[:, :, :, ::1]")]


def _argmax(argmax, y, plane: int):
    """``argmax`` checked against the output ``y`` and the input's ``plane`` pixels: int32, or
    uint16 on the cpu where the plane's indices fit (``shapes.argmax_dtype``)."""
    allowed = {"int32", argmax_dtype("cpu" if on_cpu(y) else "cuda", plane)}
    if argmax.dtype.name not in allowed or tuple(argmax.shape) != tuple(y.shape):
        raise ValueError(f"argmax must be {' or '.join(sorted(allowed))} {tuple(y.shape)}, "
                         f"got {argmax.dtype} {argmax.shape}")
    return view(argmax, *y.shape)


def _geometry(x, y, kernel, stride, pad):
    """(kh, kw, sh, sw, ph, pw) after checking ``x`` (input side) against ``y`` (output side)."""
    geom = []
    for v in (kernel, kernel if stride is None else stride, pad):
        a, b = (v, v) if isinstance(v, int) else v
        geom += [int(a), int(b)]
    kh, kw, sh, sw, ph, pw = geom
    if len(x.shape) != 4 or len(y.shape) != 4 or tuple(x.shape[:2]) != tuple(y.shape[:2]):
        raise ValueError(f"pooling needs NCHW arrays with equal N, C: {x.shape} -> {y.shape}")
    for size, out, k, s, p in ((x.shape[2], y.shape[2], kh, sh, ph),
                               (x.shape[3], y.shape[3], kw, sw, pw)):
        if out not in (pool_output_size(size, k, s, p), pool_output_size(size, k, s, p, True)):
            raise ValueError(f"pooled size {out} does not match input {size}, kernel {k}, "
                             f"stride {s}, pad {p}")
    return tuple(geom)


# ---------------------------------------------------------------- max

@cuda_kernel(*_sigs(f"void(X, X, {_I4}, {_G})"))
def max_pool_forward_cuda(x, y, argmax, geom):
    _, c_, ho, wo = y.shape
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        n, c, oh, ow = nchw_cuda(i, c_, ho, wo)
        y[n, c, oh, ow], argmax[n, c, oh, ow] = max_at_cuda(x, n, c, oh, ow, geom)


@njit(parallel=True, cache=True, nogil=True)
def max_pool_forward_cpu(x, y, argmax, geom):
    n_, c_, ho, wo = y.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        for oh in range(ho):
            for ow in range(wo):
                y[n, c, oh, ow], argmax[n, c, oh, ow] = max_at_cpu(x, n, c, oh, ow, geom)


@cuda_kernel(*_sigs(f"void(X, {_I4}, X, {_G})"))
def max_pool_backward_cuda(dy, argmax, dx, geom):
    _, c_, h_, w_ = dx.shape
    for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        n, c, h, w = nchw_cuda(i, c_, h_, w_)
        dx[n, c, h, w] = max_grad_at_cuda(dy, argmax, n, c, h, w, w_, geom)


@njit(parallel=True, cache=True, nogil=True)
def max_pool_backward_cpu(dy, argmax, dx, geom):
    # A scatter, one plane per thread: each dx element receives its dy values in (oh, ow) order,
    # as the CUDA gather adds them, so the sums are identical, at one pass over dy instead of a
    # search of every covering window per input (measured much faster than gathering on the CPU).
    # Planes as flat rows: the argmax is the flat index itself (no division per element), read
    # as unsigned (0.89-0.96x the time of a signed index, which numba tests for wrap-around:
    # docs/benchmarks.md, session 69).
    n_, c_, h_, w_ = dx.shape
    plane_out = dy.shape[2] * dy.shape[3]
    grads, sources = dx.reshape(n_ * c_, h_ * w_), dy.reshape(n_ * c_, plane_out)
    where = argmax.reshape(n_ * c_, plane_out)
    for plane in prange(n_ * c_):
        grad, source, at = grads[plane], sources[plane], where[plane]
        for i in range(h_ * w_):
            grad[i] = 0
        for i in range(plane_out):      # unsigned: no negative-index wrap-around test a store
            grad[U(at[i])] += source[i]


def max_pool_forward(x, y, argmax, kernel, stride=None, pad=0, stream=None):
    """``y[n,c,oh,ow] = max`` over the window; ``argmax`` (like ``y``: ``_argmax``) records where.
    ``stride`` defaults to ``kernel``."""
    geom = _geometry(x, y, kernel, stride, pad)
    args = (view(x, *x.shape), view(y, *y.shape), _argmax(argmax, y, x.shape[2] * x.shape[3]),
            geom)
    if on_cpu(x):
        kh, kw, sh, sw, ph, pw = geom
        if pooling_planes.applies(geom, x.shape[3], y.shape[3]):
            max_pool_forward_planes_cpu(*args, 0)   # ``per`` given: the tests' signature
        elif sw == 1:
            max_pool_forward_rows_cpu(*args)
        elif sw == 2 and stride2_rows_pay(x.shape[3], y.shape[3], kw, pw):
            max_pool_forward_stride2_cpu(*args)
        else:
            max_pool_forward_cpu(*args)
    else:
        launch(max_pool_forward_cuda, *grid_1d(y.size), stream)(*args)


def max_pool_backward(dy, argmax, dx, kernel, stride=None, pad=0, stream=None):
    """``dx[n,c,h,w] = sum of dy[n,c,oh,ow]`` over the outputs whose ``argmax`` is ``(h, w)``.
    ``dx`` is overwritten (not accumulated)."""
    args = (view(dy, *dy.shape), _argmax(argmax, dy, dx.shape[2] * dx.shape[3]),
            view(dx, *dx.shape),
            _geometry(dx, dy, kernel, stride, pad))
    if on_cpu(dx):
        max_pool_backward_cpu(*args)
    else:
        launch(max_pool_backward_cuda, *grid_1d(dx.size), stream)(*args)


# ---------------------------------------------------------------- average

@cuda_kernel(*_sigs(f"void(X, X, {_G}, boolean)"))
def avg_pool_forward_cuda(x, y, geom, count_pad):
    _, c_, ho, wo = y.shape
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        n, c, oh, ow = nchw_cuda(i, c_, ho, wo)
        y[n, c, oh, ow] = avg_at_cuda(x, n, c, oh, ow, geom, count_pad)


@njit(parallel=True, cache=True, nogil=True)
def avg_pool_forward_cpu(x, y, geom, count_pad):
    n_, c_, ho, wo = y.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        for oh in range(ho):
            for ow in range(wo):
                y[n, c, oh, ow] = avg_at_cpu(x, n, c, oh, ow, geom, count_pad)


@cuda_kernel(*_sigs(f"void(X, X, {_G}, boolean)"))
def avg_pool_backward_cuda(dy, dx, geom, count_pad):
    _, c_, h_, w_ = dx.shape
    for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        n, c, h, w = nchw_cuda(i, c_, h_, w_)
        dx[n, c, h, w] = avg_grad_at_cuda(dy, n, c, h, w, h_, w_, geom, count_pad)


@njit(parallel=True, cache=True, nogil=True)
def avg_pool_backward_cpu(dy, dx, geom, count_pad):
    n_, c_, h_, w_ = dx.shape
    for plane in prange(n_ * c_):
        n, c = plane // c_, plane % c_
        for h in range(h_):
            for w in range(w_):
                dx[n, c, h, w] = avg_grad_at_cpu(dy, n, c, h, w, h_, w_, geom, count_pad)


def avg_pool_forward(x, y, kernel, stride=None, pad=0, count_include_pad=True, stream=None):
    """``y[n,c,oh,ow] = sum(window) / divisor`` (divisor: see the module docstring)."""
    args = (view(x, *x.shape), view(y, *y.shape), _geometry(x, y, kernel, stride, pad),
            bool(count_include_pad))
    if on_cpu(x):
        avg_pool_forward_cpu(*args)
    else:
        launch(avg_pool_forward_cuda, *grid_1d(y.size), stream)(*args)


def avg_pool_backward(dy, dx, kernel, stride=None, pad=0, count_include_pad=True, stream=None):
    """``dx[n,c,h,w] = sum of dy[n,c,oh,ow] / divisor(oh, ow)`` over the windows holding ``(h, w)``;
    ``dx`` is overwritten."""
    args = (view(dy, *dy.shape), view(dx, *dx.shape), _geometry(dx, dy, kernel, stride, pad),
            bool(count_include_pad))
    if on_cpu(dx):
        avg_pool_backward_cpu(*args)
    else:
        launch(avg_pool_backward_cuda, *grid_1d(dx.size), stream)(*args)


# ---------------------------------------------------------------- global average

@cuda_kernel("void(float32[:, ::1], float32[::1])", "void(float64[:, ::1], float64[::1])",
             block=GLOBAL_THREADS)
def global_avg_pool_forward_cuda(x, y):
    buf = cuda.shared.array(GLOBAL_THREADS, dtype=x.dtype)
    t = cuda.threadIdx.x
    hw = x.shape[1]
    for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        acc = x.dtype.type(0)
        for j in range(t, hw, GLOBAL_THREADS):
            acc += x[row, j]
        buf[t] = acc
        total = block_sum(buf, t)
        if t == 0:
            y[row] = total / x.dtype.type(hw)


def _global_avg_pool_forward(x, y):
    for row in prange(x.shape[0]):
        acc = x.dtype.type(0)
        for j in range(x.shape[1]):
            acc += x[row, j]
        y[row] = acc / x.dtype.type(x.shape[1])


# Reassociation lets LLVM split each row's sum over vector lanes (a strict left-to-right sum is a
# chain of dependent adds, measured slower); the order then depends on the vector width only.
# Serial below GLOBAL_PARALLEL_MIN elements: waking the threads costs about the time a core sums a
# million floats in (measured: docs/benchmarks.md, "Why the code chose").
GLOBAL_PARALLEL_MIN = 1 << 20
global_avg_pool_forward_cpu = cpu_variant(_global_avg_pool_forward, "par", True,
                                          fastmath={"reassoc", "contract"})
_global_avg_pool_forward_serial = cpu_variant(_global_avg_pool_forward, "serial", False,
                                              fastmath={"reassoc", "contract"})


@cuda_kernel("void(float32[::1], float32[:, ::1])", "void(float64[::1], float64[:, ::1])")
def global_avg_pool_backward_cuda(dy, dx):
    hw = dx.shape[1]
    for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        dx[i // hw, i % hw] = dy[i // hw] / dx.dtype.type(hw)


@njit(parallel=True, cache=True, nogil=True)
def global_avg_pool_backward_cpu(dy, dx):
    for row in prange(dx.shape[0]):
        g = dy[row] / dx.dtype.type(dx.shape[1])
        for j in range(dx.shape[1]):
            dx[row, j] = g


def _planes(x, y):
    n, c = x.shape[:2]
    if y.size != n * c:
        raise ValueError(f"global pooling of {x.shape} needs N*C = {n * c} outputs, got {y.shape}")
    return view(x, n * c, x.size // (n * c)), view(y, n * c)


def global_avg_pool_forward(x, y, stream=None):
    """``y[n, c] = mean over h, w of x[n, c, h, w]``; ``y`` is ``[N, C]`` or ``[N, C, 1, 1]``."""
    x2, y1 = _planes(x, y)
    if on_cpu(x):
        (global_avg_pool_forward_cpu if x2.size >= GLOBAL_PARALLEL_MIN
         else _global_avg_pool_forward_serial)(x2, y1)
    else:
        blocks = min(y1.size, 65535)  # the kernel strides over planes beyond the grid
        launch(global_avg_pool_forward_cuda, blocks, GLOBAL_THREADS, stream)(x2, y1)


def global_avg_pool_backward(dy, dx, stream=None):
    """``dx[n, c, h, w] = dy[n, c] / (H*W)``; ``dx`` is overwritten."""
    dx2, dy1 = _planes(dx, dy)
    if on_cpu(dx):
        global_avg_pool_backward_cpu(dy1, dx2)
    else:
        launch(global_avg_pool_backward_cuda, *grid_1d(dx2.size), stream)(dy1, dx2)
