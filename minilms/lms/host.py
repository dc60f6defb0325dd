"""How much host memory a plan needs, stated before anything runs.

"How much CPU memory do I need?" is the question asked most about offloading. The plan answers it:

* **homes**: a blob needs a host copy (its *home*) if the plan ever moves it across the link
  (``swap_in``, ``swap_out``, ``sync``, or a ``reduce`` of its host copy), if the host writes it
  (the inputs and the loss gradient seed, every iteration) or reads it (the outputs), or if it
  outlives the iteration (parameters and optimizer state: initialised on the host, checkpointed
  from there, sent there between plans). Every other blob, workspace always and with LMS off
  nearly everything, lives its whole life in the pool and has no home (``Blob.ensure_home``; the
  LMS executor gives exactly these blobs their homes before the first iteration).
* **pinned** bytes: on ``cuda`` the homes that cross the link every iteration (``crossing``:
  swapped, synced or reduced by a step, the inputs and the outputs) are page-locked, so their
  copies run asynchronously. Parameters and optimizer state that stay in the pool cross only
  when a program starts or ends: their homes are ordinary memory. Page-locked memory cannot be
  paged out, and pinning tens of GiB fails or starves the host. **Pageable** bytes: everything
  else the host holds for the run: those homes, the data loader's batches and, on ``cpu``, the
  pool itself, whose arena *is* host RAM there (the simulated device's memory is the host's).
* **one arena**: an executor's programs (training, evaluation, a smaller last batch) never run
  at once, and the homes of their per-iteration blobs hold nothing from one iteration to the
  next, so they share one page-locked arena (``HomeArena``), as large as the largest program's,
  allocated when the executor meets a program that needs more, never per program.
* **two of each**: the homes the host writes or reads every iteration (inputs, loss gradient
  seeds, outputs) come twice (``RING_SLOTS``), so that the host writes one iteration's inputs
  while the device still reads the last one's (``minilms.lms.ring``).
* **batches**: the data loader (``minilms.datasets.BatchLoader``) holds ``prefetch + 2`` batches
  at once (``loader_batches``): the one training, ``prefetch`` waiting, and one being made.

* **kernels** (``cpu``): what a run adds to the process once, whatever its net: numba imported
  (at the first kernel that runs: ``minilms.lazy``) and its JIT started (LLVM's code pages and
  its runtime module, which the first kernel of a process brings, even from the cache), the
  kernels the net loads from the cache with their tables, and the BLAS and OpenMP threads'
  buffers. It is nearly the same for a small net as for ResNet-152, so it is
  one measured constant (``CPU_KERNEL_BYTES``), not a sum over the plan; on ``cuda`` (the
  driver's context, the CUDA kernels) it is not measured and not counted.
* **compiling** (``cpu``, the first run only): where Numba's cache does not hold the kernels yet
  (a new machine, a new minilms), the first iteration compiles them, and the compiler's own memory
  raises that run's peak by about ``CPU_COMPILE_BYTES`` more; later runs load the kernels from the
  cache. Not in ``total``: it is no part of a run's steady need, and ``minilms.plan`` prints it
  apart.

What it does not count is the process as it stands after its imports: Python, numpy, minilms,
the net's Python objects. ``minilms.plan`` prints that as measured in its own process,
and ``scripts/bench_host_memory.py`` measures a run's peak resident memory over it, which the
figure here predicts.
"""
from dataclasses import dataclass, field

import numpy as np

from ..blob import State
from ..sizes import format_bytes
from .plan import Plan

RING_SLOTS = 2   # sets of homes for what the host writes and reads every iteration (lms.ring)
# What a run on the cpu device adds to the process once (the module's docstring: kernels):
# bench_host_memory's "kept", from a quarter-width ResNet-18 to ResNet-152 (benchmarks.md,
# "Why the code chose"; numba's import in it since session 51). A rounded middle, not a bound.
CPU_KERNEL_BYTES = 160 * 2**20
# What a first run adds on top while Numba compiles the kernels into an empty cache: ResNet-50 at
# 224x224, batch 8, LMS off, 221 MiB more peak than the same run from the cache; GoogLeNet 283
# MiB (benchmarks.md, session 56). A rounded middle, not a bound.
CPU_COMPILE_BYTES = 256 * 2**20


def ring_blobs(plan: Plan) -> list[str]:
    """The blobs of ``plan`` the host writes (inputs, loss gradient seeds) or reads (outputs)
    every iteration: each has ``RING_SLOTS`` homes, used in turn."""
    written_or_read = set(plan.host_inputs) | set(plan.outputs)
    return [name for name in plan.blobs if name in written_or_read]


def homes(plan: Plan) -> list[str]:
    """The blobs of ``plan`` that need a host copy, in the plan's order of its blobs."""
    moved = {a.blob for a in plan.prologue if a.copies}
    moved.update(a.blob for _, a in plan.actions() if a.copies or a.kind == "reduce")
    kept = set(plan.persistent) | set(plan.host_inputs) | set(plan.outputs)
    # a chunk of a split step's blob is rows of its parent's home: the parent gets the home
    kept.update(parent for name, (parent, _, _) in plan.chunks.items() if name in moved)
    return [name for name in plan.blobs if (name in moved or name in kept)
            and name not in plan.chunks]


def crossing(plan: Plan) -> list[str]:
    """The homes of ``plan`` that cross the link every iteration (page-locked on ``cuda``): moved,
    synced or reduced by a step or the epilogue, written by the host (the inputs, the loss
    gradient seed) or read by it (the outputs). A parameter only loaded by the prologue is not."""
    moved = {a.blob for _, a in plan.actions() if a.copies or a.kind == "reduce"}
    moved.update(plan.host_inputs, plan.outputs)
    moved.update(parent for name, (parent, _, _) in plan.chunks.items() if name in moved)
    return [name for name in homes(plan) if name in moved]


def batch_bytes(plan: Plan) -> int:
    """One batch of the net's inputs (``data``, ``label``) as the loader hands it over."""
    return sum(plan.blobs[n].nbytes for n in plan.host_inputs if plan.blobs[n].role == "input")


@dataclass(frozen=True)
class HostMemory:
    """The host memory a plan needs on a ``device_kind`` device, beyond the process itself."""
    device_kind: str
    homes: dict = field(repr=False)   # blob name -> bytes of its host copies (RING_SLOTS of some)
    crossing: frozenset = field(repr=False)   # the homes page-locked on cuda (``crossing``)
    pool: int                         # the pool's arena on ``cpu`` (host RAM); 0 on ``cuda``
    batches: int                      # the loader's batches
    batch_count: int                  # how many of them
    kernels: int = 0                  # the run's one-time cost on ``cpu`` (``CPU_KERNEL_BYTES``)

    @property
    def home_bytes(self) -> int:
        return sum(self.homes.values())

    @property
    def pinned(self) -> int:
        """Page-locked bytes: the homes that cross the link every iteration, on ``cuda``."""
        if self.device_kind != "cuda":
            return 0
        return sum(n for name, n in self.homes.items() if name in self.crossing)

    @property
    def pageable(self) -> int:
        return self.total - self.pinned

    @property
    def total(self) -> int:
        return self.home_bytes + self.pool + self.batches + self.kernels

    def breakdown(self) -> str:
        """Pinned and pageable, and what they are made of: ``pinned 0 B, pageable 1.09 GiB:
        682.12 MiB blob homes of 493 blobs, 256.00 MiB pool (host RAM on cpu), 18.38 MiB
        batches x4, 160.00 MiB kernels (Numba's JIT and the cpu kernels, once)``."""
        parts = [f"{format_bytes(self.home_bytes)} blob homes of {len(self.homes)} blobs"
                 + (f" ({format_bytes(self.pinned)} of them pinned)" if self.pinned else "")]
        if self.pool:
            parts.append(f"{format_bytes(self.pool)} pool (host RAM on cpu)")
        if self.batch_count:
            parts.append(f"{format_bytes(self.batches)} batches x{self.batch_count}")
        if self.kernels:
            parts.append(f"{format_bytes(self.kernels)} kernels (Numba's JIT and the cpu kernels, "
                         "once)")
        return (f"pinned {format_bytes(self.pinned)}, pageable {format_bytes(self.pageable)}: "
                + ", ".join(parts))

    def describe(self) -> str:
        """The total and its ``breakdown``: ``942.72 MiB (pinned 0 B, pageable ...)``."""
        return f"{format_bytes(self.total)} ({self.breakdown()})"


def process_resident() -> int | None:
    """Bytes this process holds resident now (``VmRSS``; None where /proc is not there): the
    baseline the figure comes on top of, measured, for people."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def loader_batches(prefetch: int) -> int:
    """The batches a ``BatchLoader`` with ``prefetch`` holds at once: the one training,
    ``prefetch`` waiting in its queue, and one its thread is making (or waiting to hand over).
    Without a thread (``prefetch=0``) the next is made while the last is still held: two."""
    return prefetch + 2


def host_memory(plan: Plan, device_kind: str, batches: int = 0) -> HostMemory:
    """The host memory ``plan`` needs on a ``device_kind`` (``"cpu"`` or ``"cuda"``) device:
    its blobs' homes, on ``cpu`` the pool and the kernels' one-time cost, and ``batches``
    batches of the net's inputs held beside them (a trainer's loader:
    ``loader_batches(data.prefetch)``). Add the process as it stands after its imports
    (``process_resident``) for what a run's resident memory peaks at."""
    if device_kind not in ("cpu", "cuda"):
        raise ValueError(f"device kind must be cpu or cuda, found {device_kind!r}")
    ring = set(ring_blobs(plan))
    return HostMemory(device_kind, {n: plan.blobs[n].nbytes * (RING_SLOTS if n in ring else 1)
                                    for n in homes(plan)},
                      frozenset(crossing(plan)), plan.capacity if device_kind == "cpu" else 0,
                      batches * batch_bytes(plan), batches,
                      CPU_KERNEL_BYTES if device_kind == "cpu" else 0)


class HomeArena:
    """One page-locked buffer that the per-iteration homes of every program of an executor are
    carved from (``share``): allocated again only when a program needs more than it holds."""

    ALIGN = 64    # bytes: every home starts on a cache line

    def __init__(self, device):
        self.device = device
        self.buffer = None
        self.sharing = None    # the program whose homes the buffer holds now
        self.homes: list = []  # theirs, in the order they were carved

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.nbytes

    def carve(self, owner, blobs: list) -> list:
        """Homes for ``blobs`` out of the arena, in order, for ``owner`` (the same ones again while
        ``owner`` holds the arena): allocated again only when they need more than it holds."""
        if owner is self.sharing:
            return self.homes
        offsets, end = [], 0
        for blob in blobs:
            offsets.append(end)
            end += -(-blob.nbytes // self.ALIGN) * self.ALIGN
        if end > self.nbytes:
            self.buffer = self.device.alloc_host((end,), np.uint8, page_locked=True)
        self.homes = [self.buffer[offset:offset + blob.nbytes].view(blob.dtype).reshape(blob.shape)
                      for blob, offset in zip(blobs, offsets)]
        self.sharing = owner
        return self.homes

    def share(self, owner, blobs: list) -> None:
        """Make ``blobs`` (never parameters or optimizer state: their homes outlive an
        iteration) the homes of ``owner`` carved from the arena. The blobs that held these bytes
        before lose them, so a switch leaves every blob of ``owner`` that is not placed
        ``uninitialized``: its home holds another program's bytes."""
        if owner is self.sharing:
            return
        for blob, home in zip(blobs, self.carve(owner, blobs)):
            blob.share_home(home, page_locked=True)
            if not blob.placed:
                blob.state = State.UNINITIALIZED
