"""``LazyModule``: a module imported the first time one of its names is used.

Importing numba costs more than the rest of minilms together, and every kernel family compiles
with it, so importing a family imports numba. Planning builds nets and runs no kernel: ``python -m
minilms.plan`` need not pay for it. So the layers and the ``cpu`` device name the modules that
compile (``minilms.kernels``'s families, the device's streaming copies) through a ``LazyModule``
and call through it (``elementwise.fill(...)``), and numba is imported with the first kernel that
runs. What planning asks of a family (a workspace's size, which path a convolution takes) lives in
modules that do not compile (``kernels.shapes``, ``kernels.direct.rules``). ``minilms.lazy_cuda``
does the same one level down, for numba's CUDA target.

The import itself is Python's (``importlib.import_module``), with its per-module lock: two threads
that use a family first at the same moment import it once.
"""
import importlib

__all__ = ["LazyModule"]


class LazyModule:
    """Stands for the module ``name``: any attribute imports it (once) and is read from it."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):       # probes (copy, inspect, pytest) import nothing
            raise AttributeError(attribute)
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self):
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name} ({state})>"
