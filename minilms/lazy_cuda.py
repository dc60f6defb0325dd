"""``cuda``: numba.cuda, imported the first time something needs it.

Importing numba's CUDA target costs about a third of a second (its typing context and the CUDA
Python bindings): more than the rest of minilms. A run on the ``cpu`` device and
``python -m minilms.plan`` never touch CUDA, yet every kernel family declares its CUDA kernels
when it is imported. So the families import ``cuda`` from here, a stand-in for the module:

- ``cuda.jit(fn, **options)`` and ``cuda.jit(**options)(fn)`` return a ``Deferred``: ``fn`` and
  its options, kept until CUDA is needed;
- ``load()``, any other attribute of ``cuda`` (``cuda.to_device``, ``cuda.compile_ptx``) and any
  use of a ``Deferred`` (a launch, an attribute) import numba.cuda, make every deferred function
  numba's own dispatcher (``numba.cuda.jit(fn, **options)``, which still compiles at its first
  launch), and bind the real objects in place of the stand-ins among the globals and closure
  cells of the functions declared. Numba types a kernel's globals when it compiles it, and it can
  type the real ``cuda`` module and a real device function, not a stand-in.

Once loaded, ``cuda.jit`` makes numba's dispatcher at once (and binds its function's globals).
"""
import importlib
import threading

__all__ = ["cuda", "Deferred", "load", "loaded"]

_module = None              # numba.cuda, once loaded
_deferred: list = []        # the Deferreds made before that, in the order they were declared
_lock = threading.Lock()


class Deferred:
    """What ``cuda.jit`` returns before numba.cuda is loaded: the function and its options. Using
    it in any way loads numba.cuda and forwards to numba's dispatcher (``resolve()``)."""

    def __init__(self, fn, options: dict):
        self.real = None
        self.py_func = fn
        self.options = options
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def resolve(self):
        """numba's dispatcher for this function (loading numba.cuda first if need be)."""
        if self.real is None:
            load()
        return self.real

    def __getitem__(self, config):          # a launch: kernel[blocks, threads(, stream)]
        return self.resolve()[config]

    def __call__(self, *args, **kwargs):    # a device function run as Python (the simulator)
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name):            # anything else numba's dispatcher has
        if name.startswith("__"):           # probes (copy, inspect, pytest) load nothing
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self):
        return f"<deferred CUDA function {self.__name__}{'' if self.real is None else ' (loaded)'}>"


class _StandIn:
    """``cuda`` before numba.cuda is imported; see the module's docstring."""

    def jit(self, fn=None, **options):
        if fn is None:                          # @cuda.jit(device=True, ...)
            return lambda function: self.jit(function, **options)
        if not callable(fn):                    # a signature: numba compiles it now
            return load().jit(fn, **options)
        if _module is not None:
            real = _dispatcher(fn, options)
            _bind(fn)
            return real
        deferred = Deferred(fn, options)
        _deferred.append(deferred)
        return deferred

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(load(), name)

    def __repr__(self):
        return f"<numba.cuda, {'loaded' if _module is not None else 'not imported yet'}>"


cuda = _StandIn()


def loaded() -> bool:
    """Whether numba.cuda has been loaded here."""
    return _module is not None


def load():
    """Import numba.cuda, turn every Deferred into numba's dispatcher and bind the real objects
    where the stand-ins were; return numba.cuda."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            module = importlib.import_module("numba.cuda")
            for deferred in _deferred:
                if deferred.real is None:
                    deferred.real = _dispatcher(deferred.py_func, deferred.options, module)
            _module = module
            for deferred in _deferred:
                _bind(deferred.py_func)
            _deferred.clear()
    return _module


def _dispatcher(fn, options: dict, module=None):
    module = module or _module
    try:
        return module.jit(fn, **options)
    except RuntimeError:
        if not options.get("cache"):
            raise
        # numba's disk cache needs a source file beside the function: a notebook cell or
        # ``python -c`` has none, so such a kernel compiles without it
        return module.jit(fn, **{k: v for k, v in options.items() if k != "cache"})


def _real(value):
    if value is cuda:
        return _module
    if type(value) is Deferred:
        return value.resolve()
    return value


def _bind(fn):
    """Put the real objects where ``fn``'s globals and closure cells hold stand-ins."""
    names = fn.__globals__
    for name, value in list(names.items()):
        real = _real(value)
        if real is not value:
            names[name] = real
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:              # a cell not filled yet
            continue
        real = _real(value)
        if real is not value:
            cell.cell_contents = real
