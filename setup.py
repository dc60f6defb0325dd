"""minilms: a deep-learning framework with Numba CUDA kernels and Large Model Support built in."""
from setuptools import find_packages, setup

# The CUDA toolkit comes from PyPI wheels (NVVM for compile_ptx, ptxas for resource reports),
# so PTX compilation works on machines without a GPU or a system CUDA install.
CUDA = ["numba-cuda[cu12]>=0.30"]
# Data-parallel training (minilms.training.distributed): mpi4py, and MPICH from its PyPI wheel,
# which puts mpiexec beside the Python executable (no system MPI needed).
MPI = ["mpi4py>=4", "mpich"]
# Intel MKL's SGEMM for the cpu device's products (kernels/mkl.py), through ctypes: its wheel puts
# libmkl_rt in the environment's lib/. Linux on x86-64 only (where the loader looks).
MKL = ["mkl>=2023; platform_system == 'Linux' and platform_machine == 'x86_64'"]

setup(
    name="minilms",
    version="0.1.0",
    description="Deep learning with Large Model Support from first principles: "
                "host-resident blobs, one device pool, planned swapping.",
    packages=find_packages(include=["minilms", "minilms.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numba>=0.60",
        # numba-cuda 0.30's CUDA target still uses np.row_stack, which numpy 2.5 removed: with
        # numpy 2.5 every CUDA kernel (and the PTX report) fails to load (seen on a GPU machine)
        "numpy>=1.24,<2.5",
        "pillow>=10",
        "tqdm>=4.60",
        "pyyaml>=6",
        "matplotlib>=3.7",
        # holds BLAS to one thread while kernels.blas_threads deals a product out to the cores
        "threadpoolctl>=3",
    ],
    extras_require={
        "cuda": CUDA,
        # nbformat, nbclient, ipykernel: tests/test_notebooks.py runs the teaching notebooks
        # headless in a python3 kernel; MPI: tests/test_distributed.py runs mpiexec -n 2.
        # ruff: .ci/run lints before the tests (settings in pyproject.toml). pytest-xdist: the
        # README's test command runs a worker per core (-n auto; pytest.ini's --dist worksteal
        # needs 3.2). MKL: the suite runs the cpu device's products on it, as a user with the
        # extra does (tests/kernels/test_mkl.py compares it with numpy's OpenBLAS).
        "test": ["pytest>=7", "pytest-xdist>=3.2", "hypothesis>=6.80", "nbformat>=5.7",
                 "nbclient>=0.7", "ipykernel>=6", "ruff>=0.6"] + CUDA + MPI + MKL,
        # The independent reference for tests (compared where installed) and the benchmarks'
        # baseline. Not in "test": unpinned, it brings gigabytes of CUDA packages to a CPU machine.
        "torch": ["torch>=2.1"],
        "mpi": MPI,
        "mkl": MKL,
    },
)
