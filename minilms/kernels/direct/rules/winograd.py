"""Where Winograd's convolutions pay, their tiles, blocks and workers, and the workspace they take
(``direct.winograd`` runs them)."""
import numpy as np

__all__ = ["applies", "pays", "WINOGRAD_PLANE", "WINOGRAD_CHANNELS", "tile_size", "MIN_TILES_4",
           "kernel_untransposed", "MAX_SLOTS", "MAX_BLOCK", "GROUP_TILES", "SHARED_TILES",
           "SHARED_CHANNELS", "SHARED", "BAND_WORKER", "Layout", "layouts_of", "kernel_size",
           "workspace_elements", "slot_count", "work_units"]


def applies(weight_shape, geometry) -> bool:
    """3x3, stride 1, no dilation, the same padding of at most 2 on every side (``dx``'s is
    ``2 - pad``)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry
    return (len(weight_shape) == 4 and (kh, kw, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1)
            and ph == pw and 0 <= ph <= 2)


# Measured (scripts/bench_winograd.py; docs/benchmarks.md): faster than the row windows on
# output planes of at least WINOGRAD_PLANE with at least WINOGRAD_CHANNELS channels in and out.
WINOGRAD_PLANE = 14 * 14
WINOGRAD_CHANNELS = 48


def pays(weight_shape, geometry, out_plane: int) -> bool:
    """Where it measured faster than the other paths (above)."""
    return applies(weight_shape, geometry) and out_plane >= WINOGRAD_PLANE and \
        min(weight_shape[0], weight_shape[1]) >= WINOGRAD_CHANNELS


def tile_size(weight_shape, out_hw) -> int:
    """m: 4 where 4x4 tiles cover the plane as closely as 2x2 ones and there are at least
    ``MIN_TILES_4`` of them (56x56, 28x28), else 2 (14x14, 7x7): where each measured faster
    (docs/benchmarks.md, session 38)."""
    tiles4 = -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    cover4 = 16 * tiles4
    cover2 = (-(-out_hw[0] // 2) * 2) * (-(-out_hw[1] // 2) * 2)
    return 4 if cover4 <= cover2 and tiles4 >= MIN_TILES_4 else 2


MIN_TILES_4 = 32


def kernel_untransposed(m: int) -> bool:
    """Whether the forward keeps its transformed kernel ``U[k]`` ``[in, out]``, so that a
    block's products are ``V @ U`` (a copy of the weights with their channels swapped first),
    rather than ``[out, in]`` and ``V @ U^T``: where that measured faster in the nets, F(4,
    3)'s (docs/benchmarks.md, "Why the code chose", session 62)."""
    return m == 4


# At most this many workers, each with its buffers in the workspace: as windows.MAX_SLOTS, a
# fixed number, so that the workspace (and so a plan) does not depend on the machine's threads.
MAX_SLOTS = 4
MAX_BLOCK = 256     # tiles per block at most: a sample's tiles in equal blocks
GROUP_TILES = 128   # a plane of fewer tiles goes in a group of samples, about this many tiles
# F(2, 3) on such a plane with at least SHARED_CHANNELS channels in and out: the workers take a
# group at a time together (``Layout.shared``), of about SHARED_TILES tiles, each position's
# product whole on one worker; where it measured faster (docs/benchmarks.md, "Why the code
# chose", session 62: ResNet's 14x14 256 -> 256, not GoogLeNet's narrower 14x14s)
SHARED_TILES = 400
SHARED_CHANNELS = 256
SHARED = True      # False: a room a worker on every plane (the benchmark's A/B)
# A worker's buffers, float32 elements, above which it turns a sample in bands of tile rows
# rather than whole (the largest at 224x224, GoogLeNet's conv3, hold 2.6M; at 2240x2240 a whole
# plane's copies alone are 20M and more).
BAND_WORKER = 4 << 20


class Layout:
    """One direction's sizes (``x`` to ``y``, or ``dy`` to ``dx``) for a layer of ``batch``
    samples: tiles, blocks and a worker's buffers, channels last. A block is a part of a sample's
    tiles or, on a small plane, the tiles of a group of ``group`` samples (the rows of a missing
    sample's 0, so that a block's GEMMs always have the same shape, whatever the chunk). F(2,
    3)'s small planes are ``shared``: their groups are larger (``SHARED_TILES``) and the
    workers take one at a time together, each turning some of its samples, then running some
    of its positions' products (each whole), then untiling some samples, in one room; other
    layouts have a room a worker, each taking its own groups or samples. Per room: the inputs
    padded, ``xt [group, m th + 2, m tw + 2, C]``, a block's ``V [a^2, block, C]`` and ``M
    [a^2, block, O]``, the outputs ``yt [group, m th, m tw, O]``. On a plane whose
    worker would hold more than ``BAND_WORKER`` elements (2240x2240 images) a worker turns a
    sample in ``bands`` bands of ``band_rows`` tile rows (``th`` above; the last band may have
    fewer), each a unit of work of its own; its blocks are a band's tiles, evened."""

    def __init__(self, in_shape, out_shape, m, batch):
        self.m, self.alpha = m, m + 2
        self.channels, self.out = in_shape[1], out_shape[1]
        self.tiles_h, self.tiles_w = -(-out_shape[2] // m), -(-out_shape[3] // m)
        self.tiles = tiles = self.tiles_h * self.tiles_w
        self.group, self.shared = 1, (SHARED and m == 2 and tiles < GROUP_TILES and
                                      min(self.channels, self.out) >= SHARED_CHANNELS)
        most = 0            # samples a group at most: shared, or a group for each worker
        if self.shared:
            most = max(1, min(SHARED_TILES // tiles, batch))
        elif tiles < GROUP_TILES:
            most = max(1, min(GROUP_TILES // tiles, batch // MAX_SLOTS))
        if most:                    # evened out over the batch
            self.group = -(-batch // -(-batch // most))
        self.band_rows, self.bands = self.tiles_h, 1
        self._size(self.tiles_h)
        if self.group == 1 and not self.shared and self.worker > BAND_WORKER:
            self.band_rows = next((rows for rows in range(self.tiles_h - 1, 1, -1)
                                   if self._size(rows) <= BAND_WORKER), 1)
            self.bands = -(-self.tiles_h // self.band_rows)
            self._size(self.band_rows)

    def _size(self, band_rows: int) -> int:
        """The buffers for bands of ``band_rows`` tile rows (``shapes``, ``worker``)."""
        m, tw, k, g = self.m, self.tiles_w, self.alpha ** 2, self.group
        band = band_rows * tw                                       # a band's tiles
        self.sample_block = -(-band // -(-band // MAX_BLOCK))      # evened into blocks
        self.block = g * band if g > 1 else self.sample_block
        self.shapes = ((g, m * band_rows + 2, m * tw + 2, self.channels),
                       (k, self.block, self.channels), (k, self.block, self.out),
                       (g, m * band_rows, m * tw, self.out))
        self.worker = sum(int(np.prod(s)) for s in self.shapes)
        return self.worker

    def rooms(self, slots: int) -> int:
        """The rooms it takes with ``slots`` workers: one where they share it."""
        return 1 if self.shared else slots

    def buffers(self, room):
        """``room`` (``self.worker`` elements) as ``xt, V, M, yt``."""
        arrays, at = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            arrays.append(room[at:at + size].reshape(shape))
            at += size
        return arrays


def layouts_of(x_shape, weight_shape, pad, batch=None):
    """The forward's and the input gradient's layouts (``dx`` is the forward of ``dy``) for a
    layer of ``batch`` samples (default ``x_shape``'s: a chunk's layouts are its layer's)."""
    batch = x_shape[0] if batch is None else batch
    out = (x_shape[0], weight_shape[0], x_shape[2] + 2 * pad - 2, x_shape[3] + 2 * pad - 2)
    m = tile_size(weight_shape, out[2:])
    return Layout(x_shape, out, m, batch), Layout(out, x_shape, m, batch)


def kernel_size(weight_shape, m):
    return (m + 2) ** 2 * weight_shape[0] * weight_shape[1]


def workspace_elements(x_shape, weight_shape, pad, slots: int) -> int:
    """``U`` and the first worker's ``dW`` sums (``a^2 O C`` each), then each room's buffers
    (the larger of the forward's and ``dx``'s: ``Layout.rooms``)."""
    layouts = layouts_of(x_shape, weight_shape, pad)
    return 2 * kernel_size(weight_shape, layouts[0].m) + max(
        layout.rooms(slots) * layout.worker for layout in layouts)


def slot_count(x_shape, weight_shape, pad, elements: int) -> int:
    """The workers ``elements`` hold: at most ``MAX_SLOTS`` and the batch's groups, where each
    has a room; ``MAX_SLOTS`` where they share one and it fits (0: not even one)."""
    layouts = layouts_of(x_shape, weight_shape, pad)
    room = elements - 2 * kernel_size(weight_shape, layouts[0].m)
    counts = [(MAX_SLOTS if room >= layout.worker else 0) if layout.shared else
              min(MAX_SLOTS, work_units(x_shape[0], layout), room // layout.worker)
              for layout in layouts]
    return max(0, min(counts))


def work_units(samples: int, layout) -> int:
    """The units of work ``samples`` make: groups of samples, or bands of a sample's tiles."""
    return -(-samples // layout.group) * layout.bands
