"""The ``cpu`` device's copies between host copies and the arena, with streaming stores.

A swap-in or a swap-out copies megabytes that no core will read again soon from where they land:
a host copy waits there until the blob's next use, an iteration's working set is gigabytes, and
the consumer of a swap-in meets its bytes after other layers have run. ``memcpy`` below the C
library's own threshold (three quarters of the last-level cache) writes through the caches: each
destination line is first read from memory (a read for ownership), then written back when it is
evicted, and it evicts the kernels' data on its way. Non-temporal (streaming) stores write whole
lines around the caches, as a GPU's copy engine writes without touching the SMs' caches: a copy
moves two bytes of memory traffic a byte instead of three, and on the ``cpu`` device a copy's
time is the cores' time (docs/benchmarks.md, "LMS on's copies"). Where the last-level cache holds
a swap-in until its reader comes (a 300 MiB L3), that reader goes to memory instead: there the
gain was not seen (the same section). So ``copy(..., cached=True)`` writes whole lines in plain
stores, with the same loop: the device asks for it for swap-ins where its whole pool fits in the
last-level cache (``cpu.CACHED_SWAP_INS``; docs/benchmarks.md, session 67).

``copy(dst, src)`` takes contiguous arrays of equal bytes: at least ``STREAM_MIN`` bytes go in
64-byte streaming stores (the destination's unaligned head and tail byte by byte), anything
smaller through ``numpy.copyto``, which leaves it in cache. The stores are weakly ordered, so
the copy ends with a store fence: the thread that signals the copy's completion (a stream's
event) does so after every byte is visible to the thread that waits for it. The source is read
ahead with a prefetch (``PREFETCH_AHEAD`` bytes in front of the line being copied): a swap-in's
source is a home that has sat in memory since its swap-out, and one thread's loads, paced by the
stores, read it more slowly than a prefetch ahead of them does (copies from cold memory:
``docs/benchmarks.md``, session 56); a prefetch past the source's end is harmless (a prefetch
never faults). Which prefetch is the processor's call: on AMD's Zen a non-temporal one
(``prefetchnta``), which keeps the source out of the kernels' way and was faster than none; on
an Intel Xeon that one halved the copy (the line lands in the L1 alone), and a prefetch to the
outer caches (``prefetcht2``) doubled it, so on Intel's processors the prefetch is that one
(``PREFETCH_NEAR``, from ``/proc/cpuinfo``'s vendor; docs/benchmarks.md, sessions 56 and 66).

``copy(dst, src, parallel=True)`` shares a copy of ``PARALLEL_MIN`` bytes and more out to Numba's
threads, a contiguous part each: for a copy run where it is issued, on the thread that runs the
kernels, while the kernels' other threads would wait for it. One thread's copy is bound by the
lines one core keeps in flight, not by the memory: two threads copy nearly twice one's bytes a
second, and an LMS on iteration's copies, which run between its steps, take about half the time
(docs/benchmarks.md, session 66). A copy on a copy stream's own thread stays on that thread
(``cpu_streams``: there a waiting thread shares its pieces instead).

``ENABLED`` (module-wide) switches back to ``numpy.copyto`` for every size, ``PARALLEL`` to one
thread a copy and ``PREFETCH_NEAR`` between the prefetches, for the benchmarks' A/Bs. The bytes
are the source's either way.
"""
import platform

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["ENABLED", "LINE", "PARALLEL", "PARALLEL_MIN", "PREFETCH_AHEAD", "PREFETCH_NEAR",
           "STREAM_MIN", "copy", "streams", "intel_cpu"]

ENABLED = True
PARALLEL = True            # False: a copy on one thread, even where ``copy`` is told it may share
PARALLEL_MIN = 256 << 10   # bytes: from here two threads beat one (measured: docs/benchmarks.md,
#                            "Why the code chose"), the kernels' threads spinning between kernels
STREAM_MIN = 256 << 10     # bytes: a smaller copy's data may well be read from the cache again
LINE = 64                  # bytes a streaming store writes: one cache line, one AVX-512 vector
PREFETCH_AHEAD = 2048      # bytes: how far ahead of the copy the source is prefetched (measured:
#                            1-4 KiB alike, 8 KiB slower on 2 MiB copies)
_X86 = platform.machine().lower() in ("x86_64", "amd64")


def intel_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this host's processor is Intel's (its ``vendor_id``); False where that file is
    not there to say (another system) or names another vendor."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip() == "GenuineIntel"
    except OSError:
        pass
    return False


# Prefetch the source into the outer caches (``prefetcht2``) rather than non-temporally
# (``prefetchnta``) on Intel's processors: nta measured half the copy's speed there (the docstring)
PREFETCH_NEAR = _X86 and intel_cpu()


def streams(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether ``copy`` takes the streaming stores for this pair."""
    return ENABLED and dst.nbytes >= STREAM_MIN and dst.flags.c_contiguous and \
        src.flags.c_contiguous


def copy(dst: np.ndarray, src: np.ndarray, parallel: bool = False, cached: bool = False) -> None:
    """``dst[...] = src`` for arrays of one shape and dtype (the module docstring); ``parallel``:
    the caller is the thread that runs the kernels, and a large copy may use all their threads;
    ``cached``: a kernel reads ``dst`` soon and the last-level cache holds it till then (a
    swap-in into a pool that fits there): plain stores, which leave it in cache."""
    if streams(dst, src):
        dst_bytes, src_bytes = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        if parallel and PARALLEL and dst.nbytes >= PARALLEL_MIN:
            _stream_parallel(dst_bytes, src_bytes, PREFETCH_NEAR, get_num_threads(), not cached)
        else:
            _stream_bytes(dst_bytes, src_bytes, PREFETCH_NEAR, not cached)
    else:
        np.copyto(dst, src, casting="no")


def _store_intrinsic(nontemporal: bool, doc: str):
    """A store of the 64 bytes at a source address to the line at a destination address (64-byte
    aligned): with LLVM's ``!nontemporal`` (``vmovntdq`` on x86-64) where ``nontemporal``, else a
    plain one."""
    @intrinsic
    def store_line(typingctx, dst_address, src_address):
        signature = types.void(types.intp, types.intp)

        def codegen(context, builder, signature, args):
            dst, src = args
            line = ir.VectorType(ir.IntType(64), LINE // 8)
            value = builder.load(builder.inttoptr(src, line.as_pointer()), align=1)
            store = builder.store(value, builder.inttoptr(dst, line.as_pointer()), align=LINE)
            if nontemporal:
                store.set_metadata("nontemporal", builder.module.add_metadata(
                    [ir.Constant(ir.IntType(32), 1)]))
        return signature, codegen
    store_line.__doc__ = doc
    return store_line


_store_line = _store_intrinsic(True, "a streaming store: the line goes around the caches")
_store_line_cached = _store_intrinsic(False, "a plain store: the line stays in the cache")


def _prefetch_intrinsic(locality: int, doc: str):
    """A hint to load the line at an address for reading (LLVM's ``llvm.prefetch`` with
    ``locality``: 0 non-temporal, 1 the outer caches)."""
    @intrinsic
    def prefetch(typingctx, address):
        def codegen(context, builder, signature, args):
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
                "llvm.prefetch.p0i8")
            read, data = ir.Constant(i32, 0), ir.Constant(i32, 1)
            builder.call(function, [builder.inttoptr(args[0], byte_pointer), read,
                                    ir.Constant(i32, locality), data])
        return types.void(types.intp), codegen
    prefetch.__doc__ = doc
    return prefetch


_prefetch_far = _prefetch_intrinsic(0, "``prefetchnta`` on x86-64: kept out of the kernels' way")
_prefetch_near = _prefetch_intrinsic(1, "``prefetcht2`` on x86-64: into the outer caches")


@intrinsic
def _fence(typingctx):
    """Orders the streaming stores before what follows: ``sfence`` on x86-64, which the
    architecture names for weakly ordered stores (LLVM's ``fence seq_cst`` becomes a locked
    instruction there), a full fence elsewhere."""
    def codegen(context, builder, signature, args):
        if _X86:
            sfence = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
    return types.void(), codegen


@njit(nogil=True, cache=True)
def _stream_bytes(dst, src, near, around=True):
    """``dst[:] = src`` (bytes), whole lines in streaming stores (``around`` the caches; else in
    plain stores, which leave them in cache: ``copy``'s ``cached``), the source prefetched
    ahead: ``near`` (``PREFETCH_NEAR``) into the outer caches, else non-temporally."""
    n = dst.size
    dst_at, src_at = dst.ctypes.data, src.ctypes.data
    head = min(n, (LINE - dst_at % LINE) % LINE)
    for i in range(head):
        dst[i] = src[i]
    i = head
    while i + LINE <= n:
        if near:        # loop-invariant: the compiler takes the branches out of the loop
            _prefetch_near(src_at + i + PREFETCH_AHEAD)
        else:
            _prefetch_far(src_at + i + PREFETCH_AHEAD)
        if around:
            _store_line(dst_at + i, src_at + i)
        else:
            _store_line_cached(dst_at + i, src_at + i)
        i += LINE
    for j in range(i, n):
        dst[j] = src[j]
    _fence()


@njit(nogil=True, cache=True, parallel=True)
def _stream_parallel(dst, src, near, parts, around=True):
    """``_stream_bytes`` (``around`` as there) in ``parts`` contiguous parts (whole lines, but
    for the last), one a thread: each thread's stores are fenced before the loop ends, and so
    before the caller goes on. ``parts`` comes from the caller: ``numba.get_num_threads`` inside
    would keep the function out of Numba's cache (a ctypes pointer), to be compiled again in
    every process."""
    n = dst.size
    part = -(-n // (parts * LINE)) * LINE
    for p in prange(parts):
        start = min(n, p * part)
        stop = min(n, start + part)
        _stream_bytes(dst[start:stop], src[start:stop], near, around)
