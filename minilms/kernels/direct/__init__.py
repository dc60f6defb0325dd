"""The ``cpu`` device's fast convolution: direct kernels in LLVM vector IR, behind one engine.

``engine`` (``DirectConvolution``: workspace, forward, backward; what ``layers.convolution``
asks), ``conv`` (the register-blocked direct convolution, forward and the stride-1 input gradient
as a transposed convolution), ``input_grad`` (the input gradient with samples in vector lanes),
``weight_grad`` (weight and bias gradients; ``weight_grad_outer``, the weight gradient by outer
products where vectors have no mask registers), ``pointwise`` (1x1 convolutions as batched GEMMs),
``windows`` (convolutions as GEMMs over row windows of a per-tap shifted copy), ``winograd``
(3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) and F(4x4, 3x3), channels last),
``bands`` (a stem's few channels: im2col + GEMM in bands of output rows, in a core's cache) and
``vector_ir`` (the LLVM vector operations the microkernels are written in). A reader who skips
this package misses nothing about how a convolution or LMS works: ``layers.convolution`` is the
reference, and every path here is tested against it.
"""
from .engine import DirectConvolution

__all__ = ["DirectConvolution"]
