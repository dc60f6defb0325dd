"""The vector IR helpers on their own: a loop built with ``open_loop``/``close_loop`` carries
LLVM's no-unroll metadata in a form LLVM accepts and keeps, and ``spaced_load`` picks the even
elements at step 2, reading nothing its bits leave out (run through LLVM's JIT)."""
import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from minilms.kernels.direct.vector_ir import F32, I64, VL, Vectors, host_vector_lanes


def _compile(module):
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    target = llvm.Target.from_default_triple().create_target_machine(
        features=llvm.get_host_cpu_features().flatten())
    engine = llvm.create_mcjit_compiler(parsed, target)
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
