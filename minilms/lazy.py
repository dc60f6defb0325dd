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
that use a family first at the same moment import it once. Once imported, the stand-in shares the
module's own namespace (its ``__dict__`` is the module's), so a name is read as fast as from the
module itself, and what is rebound in the module (a test's monkeypatch) is seen through it.
"""
import importlib

__all__ = ["LazyModule"]


class LazyModule:
    """Stands for the module ``name``: its first attribute read imports it; then its namespace is
    this object's."""

    __slots__ = ("_name", "__dict__")

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):     # a name not (yet) in the shared namespace
        if attribute.startswith("__"):       # probes (copy, inspect, pytest) import nothing
            raise AttributeError(attribute)
        module = importlib.import_module(self._name)
        self.__dict__ = module.__dict__
        return getattr(module, attribute)

    def __repr__(self):
        state = "imported" if self.__dict__ else "not imported yet"
        return f"<lazy module {self._name} ({state})>"
