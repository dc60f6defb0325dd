"""The vector IR helpers on their own: a loop built with ``open_loop``/``close_loop`` carries
LLVM's no-unroll metadata in a form LLVM accepts and keeps, and ``spaced_load`` picks the even
elements at step 2, reading nothing its bits leave out (run through LLVM's JIT)."""
import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from minilms.kernels.direct import vector_ir
from minilms.kernels.direct.vector_ir import F32, I64, VL, Vectors, host_vector_lanes


def _target():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)


def _compile(module):
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, _target())
    engine.finalize_object()
    return engine, parsed


def _function(name):
    """``void f(float *x, i64 n, float *out)`` in a module of its own: ``(module, builder,
    vectors, args)``, positioned in its entry block."""
    module = ir.Module(name=name)
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [F32.as_pointer(), I64,
                                                                   F32.as_pointer()]), "f")
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    return module, builder, Vectors(builder, VL), function.args


def _store_and_return(builder, v, value, out):
    builder.store(value, builder.bitcast(out, v.type.as_pointer()), align=4)
    builder.ret_void()


def _sum_kernel():
    """``out[0 .. VL]`` = the lane-wise sum of ``n`` consecutive vectors of ``x``, in a loop
    from ``open_loop``/``close_loop``."""
    module, builder, v, (x, vectors, out) = _function("loop")
    body, k, (total,) = v.open_loop("vectors", [v.zero])
    value = v.load(v.at(x, builder.mul(k, v.constant(VL))))
    v.close_loop(body, k, [total], [builder.fadd(total, value)], vectors, "done")
    _store_and_return(builder, v, builder.fadd(total, value), out)
    return module


def test_loops_carry_a_self_referencing_no_unroll_id_llvm_accepts():
    engine, parsed = _compile(_sum_kernel())
    text = str(parsed)
    assert "llvm.loop.unroll.disable" in text and "!llvm.loop" in text
    address = engine.get_function_address("f")
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(address)
    x = np.arange(5 * VL, dtype=np.float32)
    out = np.zeros(VL, np.float32)
    run(x.ctypes.data, 5, out.ctypes.data)
    np.testing.assert_array_equal(out, x.reshape(5, VL).sum(axis=0))


@pytest.mark.parametrize("step", [1, 2])
def test_spaced_load_picks_every_step_th_element_within_its_bits(step):
    module, builder, v, (x, bits, out) = _function("spaced")
    _store_and_return(builder, v, v.spaced_load(x, bits, step), out)
    engine, _ = _compile(module)
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(
        engine.get_function_address("f"))
    rng = np.random.default_rng(step)
    x = rng.standard_normal(step * VL).astype(np.float32)
    lanes = rng.random(VL) < 0.6
    bits = sum(1 << (lane * step) for lane in range(VL) if lanes[lane])
    padded = np.concatenate([x, np.full(VL, np.nan, np.float32)])   # past the end: NaN
    out = np.full(VL, np.nan, np.float32)
    run(padded.ctypes.data, bits, out.ctypes.data)
    np.testing.assert_array_equal(out, np.where(lanes, x[::step], 0))


def test_the_lanes_follow_the_feature_that_is_on_not_its_name_in_the_list():
    """16 lanes only where ``avx512f`` is on: LLVM's map lists the features that are off too
    (``-avx512f`` in its flattened string), and a substring test took 16 lanes on AVX2."""
    off, on = llvm.FeatureMap(), llvm.FeatureMap()
    off.update({"avx2": True, "avx512f": False})
    on.update({"avx2": True, "avx512f": True})
    assert "avx512f" in off.flatten()           # what fooled the substring test
    assert host_vector_lanes(off) == 8 and host_vector_lanes(on) == 16
    assert host_vector_lanes(llvm.FeatureMap({"avx2": True})) == 8
    host = llvm.get_host_cpu_features()
    assert VL == (16 if host.get("avx512f") else 8)


def _masked_load_kernel(mask_registers, monkeypatch):
    """``out = x`` in the lanes whose bit is set in ``n``, 0 elsewhere, its mask made the way
    ``mask_registers`` says."""
    monkeypatch.setattr(vector_ir, "MASK_REGISTERS", mask_registers)
    module, builder, v, (x, bits, out) = _function("masked")
    _store_and_return(builder, v, v.masked_load(x, v.mask_of_bits(bits)), out)
    return module


@pytest.mark.parametrize("mask_registers", [True, False])
def test_a_mask_of_bits_keeps_each_lane_s_own_bit_either_way(mask_registers, monkeypatch):
    """From an integer's bits (AVX-512's mask registers) or spread over the lanes by a
    broadcast, an AND and a compare (AVX2): the same lanes, the others reading nothing."""
    engine, _ = _compile(_masked_load_kernel(mask_registers, monkeypatch))
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(
        engine.get_function_address("f"))
    rng = np.random.default_rng(VL)
    x = rng.standard_normal(VL).astype(np.float32)
    for bits in [0, (1 << VL) - 1, 1, 1 << (VL - 1)] + list(rng.integers(0, 1 << VL, 20)):
        out = np.full(VL, np.nan, np.float32)
        run(x.ctypes.data, int(bits) | (1 << 40), out.ctypes.data)   # bits past the lanes: no say
        lanes = [(int(bits) >> lane) & 1 == 1 for lane in range(VL)]
        np.testing.assert_array_equal(out, np.where(lanes, x, 0))


def test_without_mask_registers_a_mask_of_bits_is_a_few_instructions(monkeypatch):
    """Static evidence of the AVX2 path's speed: the whole function (mask, masked load, store)
    in a dozen instructions, where LLVM, given an integer's bits as a mask on AVX2, moves them
    into the lanes one at a time (about 35 instructions for 8 lanes)."""
    parsed = llvm.parse_assembly(str(_masked_load_kernel(False, monkeypatch)))
    assembly = _target().emit_assembly(parsed)
    body = [line.split()[0] for line in assembly.splitlines()
            if line.startswith("\t") and not line.strip().startswith((".", "#"))]
    assert "vpinsrd" not in body and "pinsrb" not in body, body
    assert len(body) <= 12, body


def test_the_kernels_are_named_after_the_ir_helpers_source():
    """Numba's disk cache knows a kernel by its own file: the kernels built on these helpers
    carry a hash of ``vector_ir.py`` in their names, so an edit there alone compiles them anew
    rather than loading stale machine code."""
    import hashlib
    from pathlib import Path

    from minilms.kernels.direct import conv, input_grad, weight_grad, weight_grad_outer
    stamp = hashlib.sha1(Path(vector_ir.__file__).read_bytes()).hexdigest()[:8]
    assert vector_ir.IR_VERSION == stamp
    kernels = [conv._direct_kernel(9, VL, 1), conv._prepare_kernel(2, VL, False),
               weight_grad._weight_grad_kernel(3, 3, 1, 3, VL, False),
               weight_grad_outer._outer_kernel(VL), input_grad._lanes_kernel(4, 0, VL)]
    for kernel in kernels:
        assert kernel.py_func.__name__.endswith(f"_ir{stamp}"), kernel.py_func.__name__
