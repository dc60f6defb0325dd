"""LLVM vector IR for the ``cpu`` device's register-blocked microkernels (``conv``,
``weight_grad``), emitted from Numba ``intrinsic`` lowerings.

Numba's own loops neither keep a block of accumulators in registers nor vectorise a loop nest
whose inner dimension is a handful of taps; these helpers spell out the vector operations
instead. ``VL`` is the host's float32 vector width: 16 lanes with AVX-512, else 8.
"""
import hashlib
from pathlib import Path

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba.core import cgutils

from .rules import SIZE_LANES

__all__ = ["VL", "SIZE_LANES", "MASK_REGISTERS", "REGISTERS", "BLOCK", "F32", "I32", "I64",
           "Vectors", "host_vector_lanes", "IR_VERSION", "variant"]


def host_vector_lanes(features=None) -> int:
    """float32 lanes of the host's vectors: 16 where LLVM's feature map has ``avx512f`` on, else
    8. The map's ``flatten()`` string lists every feature LLVM knows, ``+`` on and ``-`` off, so
    a substring test finds ``avx512f`` in ``-avx512f`` too: the kernels then took 16 lanes on
    AVX2 machines, and their blocks of accumulators spilled."""
    features = llvm_binding.get_host_cpu_features() if features is None else features
    return 16 if features.get("avx512f", False) else 8


VL = host_vector_lanes()
# AVX-512 has mask registers: a mask of lanes is an integer's bits, moved in one instruction.
# AVX2 has none: its masked loads take a vector of lane masks, and LLVM builds one from bits lane
# by lane, a long scalar sequence per mask. There the bits are spread by a broadcast, an AND and a
# compare (docs/benchmarks.md, "Why the code chose").
MASK_REGISTERS = VL == 16
# The vector registers a microkernel's block of accumulators has: AVX-512's 32, AVX2's 16.
REGISTERS = 32 if VL == 16 else 16
# The most accumulators a microkernel that adds one input vector times a broadcast weight keeps
# (``conv``'s forward, ``input_grad``'s lanes): with those two and two to spare, 16 of AVX-512's
# registers and 12 of AVX2's, where 16 spilled (docs/benchmarks.md, "Why the code chose").
BLOCK = min(16, REGISTERS - 4)

F32, I64, I32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)

# Numba's disk cache knows a kernel by the file that defines it, not by the files its
# intrinsics' code comes from: edited here alone, the helpers left every kernel's old machine
# code in __pycache__. A kernel named with this file's hash (``variant``) compiles anew.
IR_VERSION = hashlib.sha1(Path(__file__).read_bytes()).hexdigest()[:8]


def variant(name: str) -> str:
    """A kernel variant's name (``registry.cpu_variant``'s) that changes with these helpers."""
    return f"{name}_ir{IR_VERSION}"


class _LoopID(ir.values.MDValue):
    """A loop's metadata node, which names itself as LLVM requires: hashed and compared by
    identity, where ``MDValue``'s hash of its operands would recurse."""
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


def _no_unroll(module):
    """``llvm.loop`` metadata that keeps LLVM from unrolling a loop: unrolled by 2, the
    microkernels' loops of 20-27 accumulators spilled them, and the spills cost more than the
    FMAs."""
    disable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    loop = _LoopID(module, [disable], name=str(len(module.metadata)))
    loop.operands = (loop,) + loop.operands
    return loop


class Vectors:
    """The vector operations on ``vl`` float32 lanes, for one lowering's ``builder``."""

    def __init__(self, builder, vl: int):
        self.builder, self.vl = builder, vl
        self.type = ir.VectorType(F32, vl)
        self.mask_type = ir.VectorType(ir.IntType(1), vl)
        module = builder.module
        vector, pointer = self.type, self.type.as_pointer()
        self._fma = cgutils.get_or_insert_function(
            module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{vl}f32")
        self._store = cgutils.get_or_insert_function(
            module, ir.FunctionType(ir.VoidType(), [vector, pointer, I32, self.mask_type]),
            f"llvm.masked.store.v{vl}f32.p0")
        self._load = cgutils.get_or_insert_function(
            module, ir.FunctionType(vector, [pointer, I32, self.mask_type, vector]),
            f"llvm.masked.load.v{vl}f32.p0")
        pointers = ir.VectorType(F32.as_pointer(), vl)
        self._gather = cgutils.get_or_insert_function(
            module, ir.FunctionType(vector, [pointers, I32, self.mask_type, vector]),
            f"llvm.masked.gather.v{vl}f32.v{vl}p0")
        self.zero = ir.Constant(vector, [0.0] * vl)

    @staticmethod
    def constant(n: int):
        return ir.Constant(I64, n)

    def pointer(self, address, kind=F32):
        """An integer address (what the drivers pass) as a pointer to ``kind``."""
        return self.builder.inttoptr(address, kind.as_pointer())

    def at(self, base, index):
        """``&base[index]`` for an element pointer and an ``i64`` index."""
        return self.builder.gep(base, [index])

    def splat(self, value, kind=None):
        """``value`` in every lane."""
        kind = kind or self.type
        b = self.builder
        one = b.insert_element(ir.Constant(kind, ir.Undefined), value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(kind, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def load(self, element_pointer):
        """``vl`` consecutive floats from an element pointer (unaligned)."""
        b = self.builder
        return b.load(b.bitcast(element_pointer, self.type.as_pointer()), align=4)

    def store(self, value, element_pointer):
        """``vl`` consecutive floats to an element pointer (unaligned)."""
        b = self.builder
        b.store(value, b.bitcast(element_pointer, self.type.as_pointer()), align=4)

    def lanes_below(self, count):
        """The mask of lanes ``0 .. count - 1`` (``count`` an ``i64``)."""
        index = ir.Constant(ir.VectorType(I64, self.vl), list(range(self.vl)))
        return self.builder.icmp_signed("<", index, self.splat(count, ir.VectorType(I64, self.vl)))

    def lanes_in_range(self, at, size):
        """The mask of lanes ``l`` with ``0 <= at + l < size`` (``i64`` scalars): a range of
        lanes, made from bits in a scalar register (vector compares of 64-bit lane indices cost
        more than the short rows they guard)."""
        b, zero, full, one = self.builder, self.constant(0), self.constant(self.vl), \
            self.constant(1)

        def clamp(value):
            low = b.select(b.icmp_signed("<", value, zero), zero, value)
            return b.select(b.icmp_signed(">", low, full), full, low)
        low, high = clamp(b.neg(at)), clamp(b.sub(size, at))
        high = b.select(b.icmp_signed("<", high, low), low, high)
        return self.mask_of_bits(b.xor(b.sub(b.shl(one, high), one), b.sub(b.shl(one, low), one)))

    def mask_of_bits(self, bits):
        """The mask whose lane ``i`` is bit ``i`` of the ``i64`` ``bits``: a mask register
        loaded from an integer, where ``lanes_below`` needs two vectors of lane indices; without
        mask registers (``MASK_REGISTERS``), the bits in every lane, each lane's own kept."""
        b = self.builder
        if MASK_REGISTERS:
            return b.bitcast(b.trunc(bits, ir.IntType(self.vl)), self.mask_type)
        wide = ir.VectorType(I32, self.vl)
        lane_bits = ir.Constant(wide, [1 << lane for lane in range(self.vl)])
        spread = b.and_(self.splat(b.trunc(bits, I32), wide), lane_bits)
        return b.icmp_unsigned("==", spread, lane_bits)

    def masked_load(self, element_pointer, mask):
        """A load whose lanes outside ``mask`` are 0 and read nothing."""
        b = self.builder
        return b.call(self._load, [b.bitcast(element_pointer, self.type.as_pointer()),
                                   ir.Constant(I32, 4), mask, self.zero])

    def spaced_load(self, element_pointer, bits, step: int):
        """Lane ``l`` = ``element_pointer[l * step]`` (``step`` 1 or 2) where bit ``l * step`` of
        the ``i64`` ``bits`` is set, else 0, reading nothing else: step 2 loads two vectors and
        keeps the even lanes (one permute), where a gather costs a load per lane."""
        b = self.builder
        if step == 1:
            return self.masked_load(element_pointer, self.mask_of_bits(bits))
        assert step == 2, step
        low = self.masked_load(element_pointer, self.mask_of_bits(bits))
        high = self.masked_load(self.at(element_pointer, self.constant(self.vl)),
                                self.mask_of_bits(b.lshr(bits, self.constant(self.vl))))
        return b.shuffle_vector(low, high, ir.Constant(ir.VectorType(I32, self.vl),
                                                       list(range(0, 2 * self.vl, 2))))

    def masked_gather(self, base, index, mask):
        """``base[index[i]]`` in lane ``i`` (``index`` a vector of ``i64``) where ``mask`` is
        set, else 0; masked lanes read nothing."""
        b, wide = self.builder, ir.VectorType(I64, self.vl)
        address = self.splat(b.ptrtoint(base, I64), wide)
        pointers = b.inttoptr(b.add(address, b.mul(index, ir.Constant(wide, [4] * self.vl))),
                              ir.VectorType(F32.as_pointer(), self.vl))
        return b.call(self._gather, [pointers, ir.Constant(I32, 4), mask, self.zero])

    def masked_store(self, value, element_pointer, mask):
        b = self.builder
        b.call(self._store, [value, b.bitcast(element_pointer, self.type.as_pointer()),
                             ir.Constant(I32, 4), mask])

    def open_loop(self, name, starts):
        """A loop from the current block, counting from 0, its carried values (accumulators,
        pointers, indices) starting at ``starts``: ``(body, counter, phis)``, positioned inside
        the body."""
        b = self.builder
        before = b.block
        body = b.append_basic_block(name)
        b.branch(body)
        b.position_at_end(body)
        counter = b.phi(I64)
        counter.add_incoming(self.constant(0), before)
        phis = []
        for start in starts:
            phis.append(b.phi(start.type))
            phis[-1].add_incoming(start, before)
        return body, counter, phis

    def close_loop(self, body, counter, phis, values, limit, name):
        """Back to ``body`` with ``values`` while ``counter + 1 < limit``; positioned after."""
        b = self.builder
        following = b.add(counter, self.constant(1))
        counter.add_incoming(following, b.block)
        for phi, value in zip(phis, values):
            phi.add_incoming(value, b.block)
        after = b.append_basic_block(name)
        branch = b.cbranch(b.icmp_signed("<", following, limit), body, after)
        branch.set_metadata("llvm.loop", _no_unroll(b.module))
        b.position_at_end(after)

    def fma(self, a, b, c):
        """``a * b + c`` lane by lane, one rounding."""
        return self.builder.call(self._fma, [a, b, c])

    def horizontal_sum(self, value):
        """The sum of the lanes, as a fixed tree (halves added until one lane is left): the
        same order every call."""
        b, width = self.builder, self.vl
        while width > 1:
            width //= 2
            low = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(I32, width),
                                                             list(range(width))))
            high = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(I32, width),
                                                              list(range(width, 2 * width))))
            value = b.fadd(low, high)
        return b.extract_element(value, ir.Constant(I32, 0))
