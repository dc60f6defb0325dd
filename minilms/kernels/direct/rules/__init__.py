"""What the ``cpu`` device's convolution engine decides before anything runs, and compiles
nothing for: where each path pays (the ``pays`` rules, measured) and the workspace it takes. A
layer's engine is chosen as the layer is set up (``direct.engine``), and planning sets up every
layer and runs none: with the rules here, ``python -m minilms.plan`` never imports numba
(``minilms.lazy``). A module per path, each beside the one that runs it (``rules.winograd`` and
``direct.winograd``), which imports its rules from here and names them as its own.

``host_lanes()`` is the host's float32 vector width, which one rule reads (a batch's samples in
lanes pay on more layers with 8 lanes): LLVM's answer (``vector_ir.VL``) once the kernels are
imported, and before, the same answer read from the processor's flags without loading LLVM.
"""
import sys
from functools import lru_cache

__all__ = ["SIZE_LANES", "host_lanes", "bands", "conv", "input_grad", "pointwise",
           "weight_grad", "windows", "winograd"]

# The lanes workspaces are sized for, whatever the host takes: the widest (AVX-512's), which
# needs the most room, so that a layer's workspace, and so a plan, is the same on every host.
SIZE_LANES = 16


def host_lanes() -> int:
    """float32 lanes of the host's vectors: 16 with AVX-512 (``avx512f``), else 8 (the module
    docstring)."""
    vector_ir = sys.modules.get("minilms.kernels.direct.vector_ir")
    if vector_ir is not None:
        return vector_ir.VL
    flags = _cpu_flags()
    if flags is None:        # not Linux: ask LLVM
        from ..vector_ir import VL
        return VL
    return 16 if "avx512f" in flags else 8


@lru_cache(maxsize=1)     # read once: a net's setup asks for each layer
def _cpu_flags() -> frozenset | None:
    """The first processor's feature flags in /proc/cpuinfo, or None where there is none. The
    kernel lists a feature only where the processor has it and the kernel saves its registers,
    as LLVM's host feature map has it on only then."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


from . import bands, conv, input_grad, pointwise, weight_grad, windows, winograd  # noqa: E402
