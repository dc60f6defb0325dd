"""The shared gradient checker: central differences against a layer's backward, on any device.

The objective is ``L = sum(R * top)`` with a fixed random ``R`` (seeded), so every output element
contributes. For each checked element ``x`` of a bottom or a parameter:

    numeric  = (L(x + eps) - L(x - eps)) / (2 eps)
    analytic = what backward gives for dL/dx

and they must agree to ``atol + rtol * max(|numeric|, |analytic|)``. Kink guard: where the one-sided
slopes (L(x+eps) - L(x)) / eps and (L(x) - L(x-eps)) / eps disagree, the step crossed a kink (ReLU
at 0, a max-pool tie) and the element is skipped; at most ``max_kink_fraction`` may be.
"""
from dataclasses import dataclass

import numpy as np

from .base import Layer
from .run import LayerRun


@dataclass
class GradientReport:
    checked: int
    kinks: int
    worst: float   # largest |numeric - analytic| / (atol + rtol * scale) seen: must be <= 1


def check_gradients(device, layer: Layer, inputs: list[np.ndarray], *, wrt=None,
                    dtype=np.float64, eps: float = 1e-4, rtol: float = 1e-4, atol: float = 1e-6,
                    samples: int = 40, seed: int = 0, params: dict | None = None,
                    max_kink_fraction: float = 0.1) -> GradientReport:
    """Check ``layer``'s backward for bottoms ``wrt`` (default: all floating inputs) and all
    learnable parameters, ``samples`` random elements of each. Raises AssertionError on mismatch."""
    rng = np.random.default_rng(seed)
    wrt = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)] \
        if wrt is None else list(wrt)
    run = LayerRun(device, layer, [x.shape for x in inputs], dtype=dtype, seed=seed,
                   bottom_dtypes=[x.dtype if i not in wrt else np.dtype(dtype)
                                  for i, x in enumerate(inputs)])
    for name, value in (params or {}).items():
        run.set_param(name, value)
    inputs = [x.astype(dtype) if i in wrt else x for i, x in enumerate(inputs)]
    tops = run.forward(inputs)
    weights = [rng.standard_normal(t.shape).astype(dtype) for t in tops]

    def objective() -> float:
        tops = run.forward(inputs)
        return float(sum(np.sum(w.astype(np.float64) * t) for w, t in zip(weights, tops)))

    base = objective()
    bottom_grads, param_grads = run.backward(weights, [i in wrt for i in range(len(inputs))])
    report = GradientReport(0, 0, 0.0)

    def check(label, values: np.ndarray, analytic: np.ndarray, write) -> None:
        flat = values.reshape(-1)
        for index in rng.choice(flat.size, size=min(samples, flat.size), replace=False):
            original = flat[index]
            flat[index] = original + eps
            write(values)
            plus = objective()
            flat[index] = original - eps
            write(values)
            minus = objective()
            flat[index] = original
            write(values)
            right, left = (plus - base) / eps, (base - minus) / eps
            numeric = (plus - minus) / (2 * eps)
            exact = float(analytic.reshape(-1)[index])
            if abs(right - left) > 10 * (atol + rtol * max(abs(right), abs(left), 1.0)):
                report.kinks += 1
                continue
            bound = atol + rtol * max(abs(numeric), abs(exact))
            report.worst = max(report.worst, abs(numeric - exact) / bound)
            report.checked += 1
            assert abs(numeric - exact) <= bound, (
                f"{layer.name} {label}{[int(i) for i in np.unravel_index(index, values.shape)]}: "
                f"numeric "
                f"{numeric:.6g}, analytic {exact:.6g}")

    for i in wrt:
        check(f"bottom {i}", inputs[i], bottom_grads[i], lambda v: None)
    for name, grad in param_grads.items():
        value = run.param(name)
        check(f"param {name}", value, grad, lambda v, name=name: run.set_param(name, v))
    total = report.checked + report.kinks
    assert total and report.kinks <= max_kink_fraction * total, (
        f"{layer.name}: {report.kinks} of {total} checked elements sat on a kink")
    return report
