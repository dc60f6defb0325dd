"""Optimizer updates, in place on flat parameter, gradient and state arrays (float32; float64 too).

All arrays of one call have the same size; any C-contiguous shape is viewed flat. ``grad`` is only
read: weight decay is added to a private copy of each element, as PyTorch does.

SGD (``torch.optim.SGD`` with ``dampening=0``, ``maximize=False``), with ``g = grad + wd * param``::

    buf   = momentum * buf + g                      (when momentum != 0)
    g     = g + momentum * buf   if nesterov  else  buf
    param = param - lr * g

PyTorch starts ``buf`` as a copy of the first ``g``; starting it at ZERO gives exactly that
(``momentum * 0 + g == g``), so callers just zero-fill the buffer and no first-step flag is needed.

Adam (``torch.optim.Adam``, ``amsgrad=False``; ``weight_decay`` is the L2 form, added to the
gradient, not AdamW's decoupled form), ``step`` counting from 1, ``g = grad + wd * param``::

    m     = m + (1 - beta1) * (g - m)               (``lerp``, as PyTorch writes it)
    v     = beta2 * v + (1 - beta2) * g * g
    denom = sqrt(v) / sqrt(1 - beta2**step) + eps
    param = param - lr / (1 - beta1**step) * m / denom

The bias corrections are computed on the host in double precision, then cast to the array dtype.
"""
import math

from numba import njit, prange

from ..lazy_cuda import cuda
from .common import flat, grid_1d, launch
from .registry import cpu_variant, cuda_kernel, on_cpu

__all__ = ["sgd_step", "adam_step", "SERIAL_BELOW"]

# Updates of fewer elements run on the calling thread: a parallel kernel first wakes Numba's
# workers, asleep while BLAS ran, and below this size that wake costs more than the update does
# on one core (measured: docs/benchmarks.md, "Why the code chose"). Element by element, the
# same expression either way: the same bits.
SERIAL_BELOW = 1 << 18

_T = (("float32[::1]", "float32"), ("float64[::1]", "float64"))


def _sigs(pattern):
    return [pattern.replace("A", a).replace("S", s) for a, s in _T]


@cuda_kernel(*_sigs("void(A, A, S, S)"))
def sgd_cuda(param, grad, lr, weight_decay):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * param[i]
        param[i] -= lr * g


@njit(parallel=True, cache=True, nogil=True)
def sgd_cpu(param, grad, lr, weight_decay):
    for i in prange(param.size):
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * param[i]
        param[i] -= lr * g


sgd_serial = cpu_variant(sgd_cpu.py_func, "serial", False)


@cuda_kernel(*_sigs("void(A, A, A, S, S, S, boolean)"))
def sgd_momentum_cuda(param, grad, buf, lr, momentum, weight_decay, nesterov):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * param[i]
        b = momentum * buf[i] + g
        buf[i] = b
        if nesterov:
            g += momentum * b
        else:
            g = b
        param[i] -= lr * g


@njit(parallel=True, cache=True, nogil=True)
def sgd_momentum_cpu(param, grad, buf, lr, momentum, weight_decay, nesterov):
    for i in prange(param.size):
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * param[i]
        b = momentum * buf[i] + g
        buf[i] = b
        if nesterov:
            g += momentum * b
        else:
            g = b
        param[i] -= lr * g


sgd_momentum_serial = cpu_variant(sgd_momentum_cpu.py_func, "serial", False)


def _on_cpu(parallel, serial, size: int):
    """The kernel for an update of ``size`` elements on the cpu (``SERIAL_BELOW``)."""
    return serial if size < SERIAL_BELOW else parallel


def sgd_step(param, grad, lr, momentum_buf=None, momentum=0.0, weight_decay=0.0,
             nesterov=False, stream=None):
    """One SGD step in place on ``param`` (and ``momentum_buf``, zeroed before the first step,
    needed when ``momentum != 0``)."""
    if nesterov and momentum <= 0:
        raise ValueError("Nesterov momentum requires a momentum > 0")
    t = param.dtype.type
    if momentum == 0:
        args = (*flat(param, grad), t(lr), t(weight_decay))
        kernel_cpu, kernel_cuda = _on_cpu(sgd_cpu, sgd_serial, param.size), sgd_cuda
    else:
        if momentum_buf is None:
            raise ValueError("SGD with momentum needs a momentum buffer")
        args = (*flat(param, grad, momentum_buf), t(lr), t(momentum), t(weight_decay),
                bool(nesterov))
        kernel_cpu = _on_cpu(sgd_momentum_cpu, sgd_momentum_serial, param.size)
        kernel_cuda = sgd_momentum_cuda
    if on_cpu(param):
        kernel_cpu(*args)
    else:
        launch(kernel_cuda, *grid_1d(param.size), stream)(*args)


@cuda_kernel(*_sigs("void(A, A, A, A, S, S, S, S, S, S, S)"))
def adam_cuda(param, grad, m, v, w1, beta2, w2, step_size, bc2_sqrt, eps, weight_decay):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        p = param[i]
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * p
        mi = m[i] + w1 * (g - m[i])
        vi = beta2 * v[i] + w2 * (g * g)
        m[i] = mi
        v[i] = vi
        param[i] = p - step_size * mi / (math.sqrt(vi) / bc2_sqrt + eps)


@njit(parallel=True, cache=True, nogil=True)
def adam_cpu(param, grad, m, v, w1, beta2, w2, step_size, bc2_sqrt, eps, weight_decay):
    for i in prange(param.size):
        p = param[i]
        g = grad[i]
        if weight_decay != 0:
            g += weight_decay * p
        mi = m[i] + w1 * (g - m[i])
        vi = beta2 * v[i] + w2 * (g * g)
        m[i] = mi
        v[i] = vi
        param[i] = p - step_size * mi / (math.sqrt(vi) / bc2_sqrt + eps)


adam_serial = cpu_variant(adam_cpu.py_func, "serial", False)


def adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999,
              eps=1e-8, weight_decay=0.0, stream=None):
    """One Adam step in place on ``param``, ``exp_avg`` (m) and ``exp_avg_sq`` (v), both zeroed
    before step 1; ``step`` is this step's number, 1 for the first."""
    if step < 1:
        raise ValueError(f"Adam steps count from 1, got {step}")
    t = param.dtype.type
    step_size = lr / (1.0 - beta1 ** step)
    bc2_sqrt = math.sqrt(1.0 - beta2 ** step)
    args = (*flat(param, grad, exp_avg, exp_avg_sq), t(1.0 - beta1), t(beta2), t(1.0 - beta2),
            t(step_size), t(bc2_sqrt), t(eps), t(weight_decay))
    if on_cpu(param):
        _on_cpu(adam_cpu, adam_serial, param.size)(*args)
    else:
        launch(adam_cuda, *grid_1d(param.size), stream)(*args)
