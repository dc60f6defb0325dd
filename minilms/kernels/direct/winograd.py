"""3x3 stride-1 convolutions by Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray,
Fast Algorithms for Convolutional Neural Networks, 2016), m = 2 or 4.

An ``m x m`` tile of the output is ``A^T [(G g G^T) * (B^T d B)] A``, with ``d`` the ``a x a``
input patch under it (``a = m + 2``), ``g`` a 3x3 kernel and ``*`` the product element by
element. Summed over the input channels, each of the ``a^2`` positions ``k`` of a transformed
tile is a GEMM over channels, for a block of tiles at once::

    U[k] = (G g G^T)[k]     [O, C]          once per step
    V[k] = (B^T d B)[k]     [tiles, C]      per block of tiles
    M[k] = V[k] @ U[k]^T    [tiles, O]      a^2 GEMMs
    y    = A^T M A          per tile

(F(4, 3)'s forward keeps ``U[k]`` ``[C, O]`` and runs ``V[k] @ U[k]``, where that measured
faster: ``kernel_untransposed``.)

``a^2 / m^2`` multiplications per output and channel pair instead of 9: 2.25x fewer FLOPs for
F(2, 3), 4x for F(4, 3).

The gradients are the same steps with the roles moved:

* ``dx`` is the forward's convolution of ``dy`` with the kernel turned half round and its
  channels swapped, padded by ``2 - pad``: the forward itself.
* ``dW``: ``sum dy . y`` is ``sum over tiles t, positions k of (A dy_t A^T)[k] (G g G^T)[k] (B^T
  d_t B)[k]``, so ``dW = G^T [sum_t (A dy_t A^T) (B^T d_t B)] G``: per ``k`` a GEMM summed
  over tiles, ``Mw[k] = Y[k]^T @ V[k]`` (``[O, C]``), with ``Y[k]`` ``dy``'s ``m x m`` tiles
  turned by ``A`` (``a x m``) as the input's are by ``B^T``.

Channels last (``winograd_tiles``, the kernels): a worker copies its sample, or on a small
plane a group of samples, to ``[H, W, C]`` (padded), so that every loop of the transforms runs
along the channels at unit stride, turns a block of its tiles, runs the ``a^2`` GEMMs and turns
them back into an ``[OH, OW, O]`` copy of the output, all in its own core's cache, then copies
that into ``y``. The whole sample is one call of a Numba kernel (``nogil``) that calls
``cblas_sgemm`` itself (``kernels.cblas``): through Python, the GEMMs' calls held the GIL longer
than the GEMMs ran. This module lays out the workspace, transforms the kernel (a GEMM with ``K
[a^2, 9]``) and deals the samples out to workers. On F(2, 3)'s small planes (14x14) of 256
channels and more the workers share instead one group of the batch's samples at a time
(``Layout.shared``: the samples turned one a worker, then the positions' products of all their
tiles, one a worker, then the samples untiled), where a group a worker made products of a
quarter the height, slower a row.

Deterministic: a block's GEMMs always have the same shape (a sample's tiles are cut into the same
blocks; a group short of samples has zero rows), a GEMM is one thread's, and a sample's rows sit
at the same place of it whatever the chunk (the groups are the layer's: a chunk that starts
inside one leaves its first places empty). A row's bits depend only on its own data, the shape
and its place (MKL's not even on the place; OpenBLAS's small products do), so the forward and
``dx`` of a sample are its own: a split step's equal the whole step's.
``dW`` sums blocks in sample order per worker, then the workers' sums: its bits depend on the
thread count and are regrouped when a step is split, as the row windows' are (where the workers
share the groups, a position's sum is one worker's, group after group, and depends on the
threads no more). Against the direct
product the result differs by the transforms' float32 rounding (the tests bound it against a
float64 loop: F(4, 3)'s is about ten times F(2, 3)'s).
"""
import numba
import numpy as np

from .. import blas_threads, cblas, mkl
from ..blas_threads import run_products, run_workers
from ..slotted import ALIGN
from .rules.winograd import (  # noqa: F401  (its rules, named as its own)
    BAND_WORKER,
    GROUP_TILES,
    MAX_BLOCK,
    MAX_SLOTS,
    MIN_TILES_4,
    SHARED_TILES,
    WINOGRAD_CHANNELS,
    WINOGRAD_PLANE,
    Layout,
    applies,
    kernel_size,
    kernel_untransposed,
    layouts_of,
    pays,
    slot_count,
    tile_size,
    workspace_elements,
)
from .weight_grad import bias_grad
from .winograd_tiles import (
    convolve_runs,
    convolve_samples,
    convolve_shared,
    matrices,
    weight_sums,
    weight_sums_runs,
    weight_sums_shared,
)

__all__ = ["applies", "pays", "tile_size", "MAX_SLOTS", "kernel_matrix", "workspace_elements",
           "slot_count", "forward", "backward"]


GROUPS = True       # False: a sample a block on every library (``bench_winograd.py --groups``)


def kernel_matrix(m: int, turned: bool = False):
    """``K [a^2, 9]``, ``K[i * a + j, 3 t + s] = G[i, t] G[j, s]``: ``(G g G^T)[k] = sum over
    taps of K[k, tap] g[tap]``, so the whole kernel's transform is one GEMM. ``turned``: of the
    kernel turned half round (its taps in reverse order)."""
    g = matrices(m, np.float64)[1]
    k = np.einsum("it,js->ijts", g, g).reshape((m + 2) ** 2, 9)
    return np.ascontiguousarray((k[:, ::-1] if turned else k).astype(np.float32))


def transform_weights(weight, u, m: int, turned: bool, workers: int,
                      swapped: bool = False) -> None:
    """``u[k, o, c] = (G w[o, c] G^T)[k]`` (turned half round where ``turned``: ``dx``'s, the
    forward of ``dy`` with the channels' roles swapped): ``K @ w^T``, ``[a^2, 9] @ [9, O C]``;
    ``swapped``: ``u[k, c, o]``, from a copy of ``w`` with its channels swapped."""
    taps = np.ascontiguousarray(weight.transpose(1, 0, 2, 3)) if swapped else weight
    _in_parts(kernel_matrix(m, turned), taps.reshape(-1, 9).T, u.reshape(u.shape[0], -1),
              workers, by_rows=False)


def restore_weights(mw, dweight, m: int, workers: int) -> None:
    """``dweight[o, c] = G^T Mw[:, o, c] G``: ``Mw^T @ K``, ``[O C, a^2] @ [a^2, 9]``."""
    _in_parts(mw.reshape(mw.shape[0], -1).T, kernel_matrix(m), dweight.reshape(-1, 9),
              workers, by_rows=True)


def _in_parts(a, b, out, workers: int, by_rows: bool) -> None:
    """``out = a @ b``, ``out``'s rows (or columns) cut into ``MAX_SLOTS`` parts, each a whole
    multiple of ``ALIGN`` (``kernels.slotted``), dealt in runs to ``workers`` with one BLAS thread
    each (``run_products``): left to BLAS's own threads, OpenBLAS's would spin after the call, on
    the cores the workers that come next run on. The parts are the same whatever the workers: a
    BLAS may give a column other bits in a product of another width (OpenBLAS's Haswell kernels
    and MKL on a Zen 3 did, in a third of the columns), so the kernel's transform, and with it a
    sample's outputs, would depend on the threads, and a split step on them too."""
    n = out.shape[0 if by_rows else 1]
    per = -(-n // MAX_SLOTS)
    step = -(-per // ALIGN) * ALIGN
    cuts = [slice(first, min(n, first + step)) for first in range(0, n, step)]
    workers = max(1, min(workers, len(cuts)))
    library = mkl.library_for(a, out)

    def write(t, ops):
        for cut in cuts[len(cuts) * t // workers:len(cuts) * (t + 1) // workers]:
            if not (ops.gemm(a[cut], b, out[cut]) if by_rows else
                    ops.gemm(a, b[:, cut], out[:, cut])):
                return False
        return True
    run_products(write, workers, library)


def _deal(samples: int, slots: int, group: int, bands: int = 1, lead: int = 0):
    """Each worker's units, a contiguous run ``(first, stop)``: of samples in whole groups (the
    first group starting ``lead`` places before sample 0) or, where a sample goes in ``bands``
    bands, of ``sample * bands + band``; a worker per thread, at most one per slot."""
    if bands > 1:
        samples, group, lead = samples * bands, 1, 0
    groups = -(-(samples + lead) // group)
    workers = max(1, min(numba.get_num_threads(), slots, groups))
    return [(max(0, group * (groups * t // workers) - lead),
             min(samples, group * (groups * (t + 1) // workers) - lead))
            for t in range(workers)]


def _workers(batch: int, slots: int, layout) -> int:
    """The workers of the kernel's transforms (``_in_parts``): the layer's, or where they share
    the groups, a thread each up to ``slots``."""
    if layout.shared:
        return max(1, min(numba.get_num_threads(), slots))
    return len(_deal(batch, slots, layout.group, layout.bands))


def _room_rows(work, kernel, workers, layout):
    """Each worker's room, after ``U`` and ``dW``'s sums: the rows of one array (the workers on
    Numba's threads cut their buffers from theirs)."""
    return work[2 * kernel:2 * kernel + workers * layout.worker].reshape(workers, layout.worker)


def _rooms(work, workers, kernel, layout):
    """Each worker's buffers (``Layout.buffers`` of its room)."""
    return [layout.buffers(row) for row in _room_rows(work, kernel, workers, layout)]


def _gemm(layout):
    """``(cblas_sgemm, group, block)`` the blocks' products run on: the chosen library's
    (``mkl.chosen``; the other where that one has none) whatever their size (``mkl.MIN_FLOPS``
    does not apply: called from Numba, a product costs no Python; and from two workers at once
    OpenBLAS's small products measured slower than MKL's and did not scale). A small plane's
    samples go in groups where that measured faster: on MKL, and on OpenBLAS with F(2, 3), where
    F(4, 3)'s taller products ran the backward slower (docs/benchmarks.md, "Why the code
    chose"); and always where the workers share the groups (``Layout.shared``)."""
    gemm, library = cblas.chosen_sgemm()
    if layout.shared or (GROUPS and (library == "mkl" or layout.m == 2)):
        return gemm, layout.group, layout.block
    return gemm, 1, layout.sample_block


def _places(first: int, group: int, bands: int) -> int:
    """Where the first group of a chunk starting at the layer's sample ``first`` starts: the
    layer's groups, ``group`` samples from sample 0 on, whatever the chunk. So a sample's rows
    sit at the same place of a product of the same shape whether its step is split or not:
    OpenBLAS's small products give a row other bits at another place (MKL's never did)."""
    return 0 if bands > 1 else first % group


def _convolve(x, u, u_trans, bias, y, work, slots, pad, layout, first):
    """``y = conv(x) + bias`` with the transformed kernel ``u`` (``convolve_samples``): a run of
    samples per worker; ``x[0]`` is the layer's sample ``first``."""
    gemm, group, block = _gemm(layout)
    lead = _places(first, group, layout.bands)
    shift = bias if bias is not None else np.zeros(y.shape[1], np.float32)
    if layout.shared:
        with blas_threads.one_blas_thread():
            convolve_shared(gemm, x, lead, u, u_trans, shift, y, pad, group, layout.tiles_w,
                            layout.m, *_rooms(work, 1, u.size, layout)[0])
        return
    runs = _deal(x.shape[0], slots, group, layout.bands, lead)
    if blas_threads.NUMBA_THREADS:
        with blas_threads.one_blas_thread():
            convolve_runs(gemm, x, np.array(runs, np.int64), lead, u, u_trans, shift, y, pad,
                          group, block, layout.tiles_w, layout.m, layout.bands,
                          layout.band_rows, _room_rows(work, u.size, len(runs), layout),
                          *layout.shapes)
        return
    rooms = _rooms(work, len(runs), u.size, layout)

    def worker(t):
        convolve_samples(gemm, x, *runs[t], (runs[t][0] + lead) % group, u, u_trans, shift, y,
                         pad, group, block, layout.tiles_w, layout.m, layout.bands,
                         layout.band_rows, *rooms[t])

    run_workers(worker, len(runs))


def _kernel(work, weight, m, swapped: bool = False):
    """The transformed kernel's room in ``work``: ``[a^2, O, C]``, or ``[a^2, C, O]`` where
    ``swapped`` (``transform_weights``)."""
    out, channels = weight.shape[:2]
    return work[:kernel_size(weight.shape, m)].reshape(
        (m + 2) ** 2, *((channels, out) if swapped else (out, channels)))


def forward(x, weight, bias, y, work, slots, geometry, batch, first: int = 0) -> None:
    """``y = conv(x, weight) + bias`` (bias may be None) through ``work``
    (``workspace_elements`` for ``slots``); ``x`` is all or a chunk of a layer of ``batch``
    samples, from its sample ``first`` on."""
    pad = geometry[2][0]
    layout = layouts_of(x.shape, weight.shape, pad, batch)[0]
    swapped = kernel_untransposed(layout.m)         # u[k] [C, O]: V @ U
    u = _kernel(work, weight, layout.m, swapped)
    transform_weights(weight, u, layout.m, False,
                      _workers(batch, slots, layout), swapped)
    _convolve(x, u, not swapped, bias, y, work, slots, pad, layout, first)


def backward(x, dy, weight, dx, dweight, dbias, work, slots, geometry, batch,
             first: int = 0) -> None:
    """The gradients (each overwritten; None where not wanted) through ``work``
    (``workspace_elements`` for ``slots``); ``x`` as in ``forward``."""
    samples, out = dy.shape[0], dy.shape[1]
    pad = geometry[2][0]
    if dbias is not None:
        bias_grad(dy.reshape(samples, out, -1), dbias)
    layout, turned = layouts_of(x.shape, weight.shape, pad, batch)
    workers = _workers(batch, slots, layout)
    if dweight is not None:
        kernel = kernel_size(weight.shape, layout.m)
        mw = work[kernel:2 * kernel].reshape(layout.alpha ** 2, out, weight.shape[1])
        _weight_sums(x, dy, mw, work, slots, pad, layout, first)
        restore_weights(mw, dweight, layout.m, workers)
    if dx is not None:      # the forward of dy, the kernel turned round: u[k] is [in, out]
        u = _kernel(work, weight, layout.m)
        transform_weights(weight, u, layout.m, True, workers)
        _convolve(dy, u, False, None, dx, work, slots, 2 - pad, turned, first)


def _weight_sums(x, dy, mw, work, slots, pad, layout, first):
    """``mw[k] = sum over tiles of V[k]^T @ Y[k]``: per worker (the first's in the workspace,
    the others' temporaries, as the row windows'), then the workers' sums in worker order."""
    gemm, group, block = _gemm(layout)
    lead = _places(first, group, layout.bands)
    if layout.shared:
        with blas_threads.one_blas_thread():
            weight_sums_shared(gemm, x, dy, lead, mw, pad, group, layout.tiles_w, layout.m,
                               *_rooms(work, 1, mw.size, layout)[0])
        return
    runs = _deal(x.shape[0], slots, group, layout.bands, lead)
    others = np.empty((len(runs) - 1,) + mw.shape, mw.dtype)
    sums = [mw] + list(others)
    if blas_threads.NUMBA_THREADS:
        with blas_threads.one_blas_thread():
            weight_sums_runs(gemm, x, dy, np.array(runs, np.int64), lead, mw, others, pad,
                             group, block, layout.tiles_w, layout.m, layout.bands,
                             layout.band_rows, _room_rows(work, mw.size, len(runs), layout),
                             *layout.shapes)
    else:
        rooms = _rooms(work, len(runs), mw.size, layout)

        def worker(t):
            weight_sums(gemm, x, dy, *runs[t], (runs[t][0] + lead) % group, sums[t], pad,
                        group, block, layout.tiles_w, layout.m, layout.bands, layout.band_rows,
                        *rooms[t])
        run_workers(worker, len(runs))
    for other in sums[1:]:
        mw += other
