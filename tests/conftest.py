"""Test-suite set-up: CUDA tests run on a real GPU when there is one, else under the Numba
simulator.

The choice has to be made before numba.cuda is first imported, which is why it lives here, at the
top of the root conftest, and never in library code.
"""
import ctypes
import os


def _real_gpu_present() -> bool:
    """Ask the CUDA driver directly (no numba import) whether a GPU is usable."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _real_gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# ``pytest -n auto`` runs a worker process per core, so a worker's OpenMP threads spinning between
# kernels (minilms' ``GOMP_SPINCOUNT``) would hold a core another worker's kernel needs: they sleep
# at once here, as a shared machine's should (README). No result depends on it; the tests of the
# spin itself start processes of their own without it.
os.environ.setdefault("GOMP_SPINCOUNT", "0")

import numba  # noqa: E402  (after the simulator choice, on purpose)
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

CUDA_SIMULATED = bool(numba.config.ENABLE_CUDASIM)

# @pytest.mark.limit_device_memory("64 MiB"): fails a test whose traced device peak exceeds it.
pytest_plugins = ["tests.trace_fixture"]

# The same examples on every run (derandomize), so CI's verdict depends on the code alone: a
# tolerance flake hypothesis found once in ~2,000 runs failed a CI run that had changed nothing
# near it. `pytest --hypothesis-profile explore` draws new examples, as a search for such cases.
settings.register_profile("default", deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")


def pytest_report_header(config):
    return f"minilms CUDA tests: {'Numba CUDA simulator' if CUDA_SIMULATED else 'real GPU'}"


def pytest_collection_modifyitems(config, items):
    """Name the slow tests in the run's summary so nothing is skipped silently: ``slow`` ones
    everywhere, ``simulator_slow`` ones where the CUDA tests run under the simulator."""
    if config.getoption("-m") or config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (kept outside CI, see README)")
    simulated = pytest.mark.skip(reason="half a minute or more under the Numba CUDA simulator: run "
                                 "with --runslow (kept outside CI; a real GPU runs it always)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
        elif "simulator_slow" in item.keywords and CUDA_SIMULATED:
            item.add_marker(simulated)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")
