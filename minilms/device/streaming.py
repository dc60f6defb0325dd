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
gain was not seen (the same section).

``copy(dst, src)`` takes contiguous arrays of equal bytes: at least ``STREAM_MIN`` bytes go in
64-byte streaming stores (the destination's unaligned head and tail byte by byte), anything
smaller through ``numpy.copyto``, which leaves it in cache. The stores are weakly ordered, so
the copy ends with a store fence: the thread that signals the copy's completion (a stream's
event) does so after every byte is visible to the thread that waits for it. The source is read
ahead with a non-temporal prefetch (``PREFETCH_AHEAD`` bytes in front of the line being copied,
``prefetchnta`` on x86-64): a swap-in's source is a home that has sat in memory since its
swap-out, and one thread's loads, paced by the stores, read it more slowly than a prefetch ahead
of them does (copies from cold memory: ``docs/benchmarks.md``, session 56); a prefetch past the
source's end is harmless (a prefetch never faults). ``ENABLED``
(module-wide) switches back to ``numpy.copyto`` for every size, for the benchmark's A/B. The
bytes are the source's either way.
"""
import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["ENABLED", "LINE", "PREFETCH_AHEAD", "STREAM_MIN", "copy", "streams"]

ENABLED = True
STREAM_MIN = 256 << 10     # bytes: a smaller copy's data may well be read from the cache again
LINE = 64                  # bytes a streaming store writes: one cache line, one AVX-512 vector
PREFETCH_AHEAD = 2048      # bytes: how far ahead of the copy the source is prefetched (measured:
#                            1-4 KiB alike, 8 KiB slower on 2 MiB copies)
_X86 = platform.machine().lower() in ("x86_64", "amd64")


def streams(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether ``copy`` takes the streaming stores for this pair."""
    return ENABLED and dst.nbytes >= STREAM_MIN and dst.flags.c_contiguous and \
        src.flags.c_contiguous


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for arrays of one shape and dtype (the module docstring)."""
    if streams(dst, src):
        _stream_bytes(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
    else:
        np.copyto(dst, src, casting="no")


@intrinsic
def _store_line(typingctx, dst_address, src_address):
    """The 64 bytes at ``src_address`` to the line at ``dst_address`` (64-byte aligned), with a
    non-temporal store: LLVM's ``!nontemporal`` (``vmovntdq`` on x86-64)."""
    signature = types.void(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        dst, src = args
        line = ir.VectorType(ir.IntType(64), LINE // 8)
        value = builder.load(builder.inttoptr(src, line.as_pointer()), align=1)
        store = builder.store(value, builder.inttoptr(dst, line.as_pointer()), align=LINE)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
    return signature, codegen


@intrinsic
def _prefetch(typingctx, address):
    """A hint to load the line at ``address`` for reading, non-temporal (LLVM's ``llvm.prefetch``,
    locality 0: ``prefetchnta`` on x86-64), so that it does not displace the kernels' data."""
    def codegen(context, builder, signature, args):
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        read, no_locality, data = ir.Constant(i32, 0), ir.Constant(i32, 0), ir.Constant(i32, 1)
        builder.call(prefetch, [builder.inttoptr(args[0], byte_pointer), read, no_locality, data])
    return types.void(types.intp), codegen


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
def _stream_bytes(dst, src):
    n = dst.size
    dst_at, src_at = dst.ctypes.data, src.ctypes.data
    head = min(n, (LINE - dst_at % LINE) % LINE)
    for i in range(head):
        dst[i] = src[i]
    i = head
    while i + LINE <= n:
        _prefetch(src_at + i + PREFETCH_AHEAD)
        _store_line(dst_at + i, src_at + i)
        i += LINE
    for j in range(i, n):
        dst[j] = src[j]
    _fence()
