"""1x1 convolutions (ResNet's bottlenecks and projections) as GEMMs over the whole batch.

A 1x1 convolution without padding is a matrix product per sample. With ``x[n]`` seen as
``[C, P]`` (its pixels; every ``stride``-th one when strided), ``dy[n]`` as ``[O, P]`` and the
weight as ``W [O, C]``::

    y[n]  = W @ x[n] (+ bias)             one batched matmul, written straight into y (on a
                                          short plane with a large weight: in ``slotted``
                                          products, ``slots`` samples each, as is dx)
    dx[n] = W^T @ dy[n]                   one batched matmul (strided: into the sub-grid,
                                          zeros elsewhere)
    dW    = sum over n of dy[n] @ x[n]^T  a batched call of one product per core (dealt out
                                          by samples, each whole on one thread), added in
                                          sample order; where a sample's P is short, one
                                          GEMM over a chunk's columns side by side
                                          (``[O, k * P] @ [C, k * P]^T``)
    dbias = sum over n, p of dy[n, :, p]  ``weight_grad.bias_grad``

``backward`` computes both gradients, and where a sample's plane is long and unstrided
(``by_sample``) it takes them sample by sample (``both_by_sample``): each core takes its run of
samples and, for each, ``dx[n]`` and then ``dy[n] @ x[n]^T`` while ``dy[n]`` is still in the
cache, where the two passes over the whole batch read ``dy`` from memory twice. The same products,
each whole on one thread, summed in the same order: the two passes' bits (where the batch is not
a multiple of the threads, the two passes cut the last sample's dW product in pieces, and a BLAS
that does not keep a product's bits in pieces gives it other roundings there).

Nothing is copied where the stride is 1 and P is long: the direct kernels and im2col + GEMM both
stream a copy of ``x`` or ``dy`` that a 1x1 convolution does not need. A strided input's sub-grid
is gathered into the workspace first, ``chunk`` samples at a time.

Deterministic: the same shapes take the same calls in the same order; equal to im2col + GEMM up
to float32 rounding (the tests compare them).
"""
import numba
import numpy as np
from numba import njit, prange

from .. import blas_threads, mkl, slotted
from ..blas_threads import matmul
from ..slotted import side_by_side
from .rules.pointwise import SHORT_PLANE, applies, columns_held, workspace_elements
from .weight_grad import bias_grad

__all__ = ["applies", "workspace_elements", "forward", "input_grad", "weight_grad", "backward",
           "by_sample", "both_by_sample", "by_columns", "sum_by_columns", "BY_SAMPLE"]

BY_SAMPLE = True    # False: ``backward`` always makes its two passes (the benchmark's A/B)


def _strided(geometry) -> bool:
    return tuple(geometry[1]) != (1, 1)


def _gather(x, work, geometry, n0, n1):
    """``x[n0:n1]``'s strided sub-grid as ``[k, C, P]``: ``x`` itself (a view) at stride 1."""
    (sh, sw) = geometry[1]
    if not _strided(geometry):
        return x[n0:n1].reshape(n1 - n0, x.shape[1], -1)
    sub = x[n0:n1, :, ::sh, ::sw]
    out = work[:sub.size].reshape(sub.shape)
    gather_strided(x[n0:n1], out, sh, sw)
    return out.reshape(n1 - n0, x.shape[1], -1)


def forward(x, weight, bias, y, work, chunk, geometry, slots: int = 1) -> None:
    """``y = conv(x, weight) + bias``, ``y`` overwritten. ``slots`` > 1 (a short plane's, from
    ``slotted.count``): a product per ``slots`` samples, their columns side by side."""
    samples, out = y.shape[0], y.shape[1]
    w = weight.reshape(out, -1)
    y3 = y.reshape(samples, out, -1)
    if slots > 1:
        plane = y3.shape[2]
        room, width = columns_held(chunk, plane, slots), slotted.width(slots, plane)
        for n0 in range(0, samples, slots):
            n1 = min(samples, n0 + slots)
            x_t, product = _columns(work, room, x.shape[1], out, width)
            _gather_side_by_side(x, x_t, geometry, n0, n1)
            slotted.clear_unused(x_t, n1 - n0, plane)
            slotted.product(w, x_t, product)
            slotted.from_side_by_side(product, y3[n0:n1])
    else:
        step = samples if not _strided(geometry) else chunk
        for n0 in range(0, samples, step):
            n1 = min(samples, n0 + step)
            matmul(w, _gather(x, work, geometry, n0, n1), out=y3[n0:n1])
    if bias is not None:
        y += bias.reshape(1, out, 1, 1)


def input_grad(dy, weight, dx, work, chunk, geometry, slots: int = 1, add: bool = False) -> None:
    """``dx`` (overwritten, or with ``add`` added into) from ``dy``; ``slots`` as for
    ``forward``."""
    samples, out, channels = dy.shape[0], dy.shape[1], dx.shape[1]
    wt = weight.reshape(out, channels).T
    dy3 = dy.reshape(samples, out, -1)
    (sh, sw), (out_h, out_w) = geometry[1], dy.shape[2:]
    strided = _strided(geometry)
    if not strided and slots == 1:
        matmul(wt, dy3, out=dx.reshape(samples, channels, -1), accumulate=add)
        return
    step = slots if slots > 1 else chunk
    room, width = columns_held(chunk, out_h * out_w, slots), slotted.width(slots, out_h * out_w)
    for n0 in range(0, samples, step):
        n1 = min(samples, n0 + step)
        if slots > 1:
            product, dy_t = _columns(work, room, channels, out, width)
            side_by_side(dy3[n0:n1], dy_t)
            slotted.clear_unused(dy_t, n1 - n0, out_h * out_w)
            slotted.product(wt, dy_t, product)
            if not strided:
                slotted.from_side_by_side(product, dx[n0:n1].reshape(n1 - n0, channels, -1), add)
                continue
            sub = product[:, :(n1 - n0) * out_h * out_w].reshape(
                channels, n1 - n0, out_h, out_w).transpose(1, 0, 2, 3)
        else:
            sub = work[:(n1 - n0) * channels * out_h * out_w].reshape(n1 - n0, channels, -1)
            matmul(wt, dy3[n0:n1], out=sub)
        scatter = scatter_add_strided if add else scatter_strided
        scatter(sub.reshape(n1 - n0, channels, out_h, out_w), dx[n0:n1], sh, sw)


def _columns(work, room, channels, out, width):
    """``[channels, width]`` and ``[out, width]`` from ``work``'s two parts
    (``workspace_elements``' short-plane layout: ``out`` rows of ``room`` columns first)."""
    return (work[room * out:][:channels * width].reshape(channels, width),
            work[:out * width].reshape(out, width))


def _gather_side_by_side(x, x_t, geometry, n0, n1):
    """``x[n0:n1]``'s (strided sub-grid's) columns side by side in ``x_t`` (its first ``n1 -
    n0`` samples' places, of however many it has): one copy."""
    (sh, sw) = geometry[1]
    if _strided(geometry):
        sub = x[n0:n1, :, ::sh, ::sw]
        samples, channels, out_h, out_w = sub.shape
        x_t[:, :samples * out_h * out_w].reshape(channels, samples, out_h, out_w)[...] = \
            sub.transpose(1, 0, 2, 3)
    else:
        side_by_side(x[n0:n1].reshape(n1 - n0, x.shape[1], -1), x_t)


def weight_grad(x, dy, dweight, dbias, work, chunk, geometry) -> None:
    """``dweight`` and ``dbias`` (each overwritten; either may be None)."""
    samples, out = dy.shape[0], dy.shape[1]
    dy3 = dy.reshape(samples, out, -1)
    if dbias is not None:
        bias_grad(dy3, dbias)
    if dweight is None:
        return
    dw, plane, channels = dweight.reshape(out, -1), dy3.shape[2], x.shape[1]
    if plane >= SHORT_PLANE:
        for n0 in range(0, samples, chunk):
            n1 = min(samples, n0 + chunk)
            xs = _gather(x, work, geometry, n0, n1)
            if by_columns(out, plane, channels):
                sum_by_columns(dy3[n0:n1], xs, dw, first=n0 == 0)
                continue
            # a product per core at a time, each whole on one thread: the temporary is
            # threads x [O, C], and each sample's bits are its product's, whatever the threads
            group = max(1, numba.get_num_threads())
            for g0 in range(n0, n1, group):
                g1 = min(n1, g0 + group)
                products = matmul(dy3[g0:g1], xs[g0 - n0:g1 - n0].transpose(0, 2, 1))
                for n in range(g0, g1):
                    if n == 0:
                        dw[...] = products[0]
                    else:
                        dw += products[n - g0]
        return
    for n0 in range(0, samples, chunk):
        n1 = min(samples, n0 + chunk)
        x_t, dy_t = _columns(work, chunk * plane, channels, out, (n1 - n0) * plane)
        side_by_side(dy3[n0:n1], dy_t)
        _gather_side_by_side(x, x_t, geometry, n0, n1)
        _accumulate(dy_t, x_t.T, dw, first=n0 == 0)


def by_columns(out: int, plane: int, channels: int) -> bool:
    """Where dW's per-sample products on a long plane are too small for a thread each
    (``blas_threads.MIN_FLOPS``: GoogLeNet's 1x1s of 32 outputs at 28x28), and the two-pass
    path would make them one after another on one thread: ``sum_by_columns`` instead."""
    threads = numba.get_num_threads()
    return (threads >= 2 and channels >= threads and bool(blas_threads.libraries())
            and 2.0 * out * plane * channels < blas_threads.MIN_FLOPS)


def sum_by_columns(dy3, xs, dw, first: bool) -> None:
    """``dw = sum_n dy3[n] @ xs[n]^T`` (``+=`` unless ``first``): each thread a block of dW's
    columns (input channels), its samples' products added by the GEMM itself (``beta = 1``) in
    sample order: every core busy, no temporaries, no adds."""
    threads, channels = numba.get_num_threads(), dw.shape[1]
    bounds = [channels * i // threads for i in range(threads + 1)]
    library = mkl.library_for(dy3[0], dw)

    def write(worker, ops):
        c0, c1 = bounds[worker], bounds[worker + 1]
        for n in range(dy3.shape[0]):
            if not ops.gemm(dy3[n], xs[n, c0:c1].T, dw[:, c0:c1], not (first and n == 0),
                            library):
                return False
        return True
    blas_threads.run_products(write, threads, library)


def backward(x, dy, weight, dx, dweight, dbias, work, chunk, geometry, slots: int = 1,
             add_dx: bool = False) -> None:
    """``dx``, ``dweight`` and ``dbias`` (each overwritten, but ``dx`` added into with ``add_dx``;
    any may be None): ``input_grad`` and ``weight_grad``, or both gradients sample by sample
    where ``by_sample`` holds. Adding is the GEMM's ``beta = 1`` where ``dx`` is a product's
    output (a blob that feeds two layers takes the second's gradient so, with no partial
    gradient to write and add: ``Layer.adds_bottom_grad``)."""
    if BY_SAMPLE and dx is not None and dweight is not None and \
            by_sample(dy, weight, geometry, slots):
        both_by_sample(x, dy, weight, dx, dweight, add_dx)
        dx = dweight = None
    if dx is not None:
        input_grad(dy, weight, dx, work, chunk, geometry, slots, add_dx)
    if dweight is not None or dbias is not None:
        weight_grad(x, dy, dweight, dbias, work, chunk, geometry)


def by_sample(dy, weight, geometry, slots: int) -> bool:
    """Where ``both_by_sample`` takes the two gradients: stride 1, a long plane, a product per
    sample (no slots), a sample per core at least, each product large enough for a thread of
    its own (``blas_threads.MIN_FLOPS``), and BLAS held to one thread meanwhile: the case where
    the two passes run each product whole on one thread too."""
    samples, out, plane = dy.shape[0], dy.shape[1], dy.shape[2] * dy.shape[3]
    threads = numba.get_num_threads()
    return (not _strided(geometry) and slots == 1 and plane >= SHORT_PLANE
            and threads >= 2 and samples >= threads and bool(blas_threads.libraries())
            and 2.0 * out * plane * weight.shape[1] >= blas_threads.MIN_FLOPS)


def both_by_sample(x, dy, weight, dx, dweight, add_dx: bool = False) -> None:
    """``dx`` (overwritten, or added into) and ``dweight`` (overwritten), a run of samples per
    core (``sample_runs``), each sample's two products one after the other on its thread. dW's
    products are added in sample order: the first run's into ``dweight`` as they come, the
    others' kept (a product each) and added once every thread is done."""
    samples, out, channels = dy.shape[0], dy.shape[1], x.shape[1]
    wt = weight.reshape(out, channels).T
    dy3, x3 = dy.reshape(samples, out, -1), x.reshape(samples, channels, -1)
    dx3, dw = dx.reshape(samples, channels, -1), dweight.reshape(out, channels)
    runs = blas_threads.sample_runs(samples, samples)
    later = np.empty((samples - runs[0][1], out, channels), dw.dtype)
    first_product = np.empty_like(dw)
    dx_library = mkl.library_for(wt, dx3[0])
    dw_library = mkl.library_for(dy3[0], dw)

    def write(worker, ops):
        begin, end = runs[worker]
        for n in range(begin, end):
            if not ops.gemm(wt, dy3[n], dx3[n], add_dx, dx_library):
                return False
            product = dw if n == 0 else first_product if worker == 0 else later[n - runs[0][1]]
            if not ops.gemm(dy3[n], x3[n].T, product, False, dw_library):
                return False
            if worker == 0 and n > 0:
                ops.add(dw, product)
        return True
    blas_threads.run_products(write, len(runs), dw_library)
    for product in later:
        dw += product


def _accumulate(a, b, c, first: bool) -> None:
    """``c = a @ b`` (first) or ``c += a @ b``: numpy has no beta, so a temporary the size of c."""
    if first:
        matmul(a, b, out=c)
    else:
        c += matmul(a, b)


@njit(parallel=True, cache=True, nogil=True)
def scatter_strided(sub, dx, sh, sw):
    """``dx[n, c]`` written whole: ``sub[n, c, i, j]`` at ``(i * sh, j * sw)``, 0 elsewhere. One
    pass over ``dx``, where zeroing it and then scattering into it took two (docs/benchmarks.md,
    session 37)."""
    samples, channels, out_h, out_w = sub.shape
    height, width = dx.shape[2], dx.shape[3]
    for task in prange(samples * channels):
        n, c = task // channels, task % channels
        src, img = sub[n, c], dx[n, c]
        for h in range(height):
            row = img[h]
            for w in range(width):      # zeros, then the values over them: in L1, and the
                row[w] = 0              # zeroing loop vectorises (one test per element did not)
            i = h // sh
            if h % sh == 0 and i < out_h:
                for j in range(out_w):
                    row[j * sw] = src[i, j]


@njit(parallel=True, cache=True, nogil=True)
def scatter_add_strided(sub, dx, sh, sw):
    """``dx[n, c, i * sh, j * sw] += sub[n, c, i, j]``: ``scatter_strided`` adding, the rest of
    ``dx`` left as it is."""
    samples, channels, out_h, out_w = sub.shape
    for task in prange(samples * channels):
        n, c = task // channels, task % channels
        src, img = sub[n, c], dx[n, c]
        for i in range(out_h):
            row = img[i * sh]
            for j in range(out_w):
                row[j * sw] += src[i, j]


@njit(parallel=True, cache=True, nogil=True)
def gather_strided(x, sub, sh, sw):
    """``sub[n, c, i, j] = x[n, c, i * sh, j * sw]``: ``scatter_strided``'s inverse, a task per
    ``(n, c)`` (numpy's strided copy runs on one thread)."""
    samples, channels, out_h, out_w = sub.shape
    for task in prange(samples * channels):
        n, c = task // channels, task % channels
        src, img = x[n, c], sub[n, c]
        for i in range(out_h):
            row, out = src[i * sh], img[i]
            for j in range(out_w):
                out[j] = row[j * sw]
