"""The PTX report: compile every registered CUDA kernel for sm_80/sm_90, and read what ptxas says.

This is the check the simulator cannot make: that Numba can compile a kernel for a real GPU, and
how it fares there: registers per thread, spills, static shared memory, theoretical occupancy.
With ``nvdisasm`` at hand it also reads the SASS of each kernel's inner loop (``sass``).
It needs no GPU, only the CUDA toolkit wheels (NVVM for ``numba.cuda.compile_ptx``, ``ptxas``);
but it does need a process without the simulator (``NUMBA_ENABLE_CUDASIM=1`` replaces
``compile_ptx``), so the tests run it as a subprocess (``scripts/kernel_report.py``).

Parsing and the occupancy arithmetic are plain functions, usable (and tested) anywhere.
"""
import importlib
import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from math import prod

from . import sass

__all__ = ["ARCHS", "Arch", "FunctionResources", "Occupancy", "KernelReport", "parse_ptxas",
           "occupancy", "ptxas_path", "discover_kernels", "compile_kernel", "report",
           "problems", "short_signature"]


@dataclass(frozen=True)
class Arch:
    """The per-SM limits the occupancy calculation needs (CUDA occupancy calculator's values)."""
    name: str
    cc: tuple
    smem_per_sm: int                  # bytes, at the largest shared-memory carveout
    max_smem_per_block: int           # bytes, opt-in maximum
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_granularity: int = 256        # registers are allocated per warp, in units of this many
    sub_partitions: int = 4           # each holds a quarter of the register file
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    max_blocks_per_sm: int = 32
    smem_granularity: int = 128
    reserved_smem_per_block: int = 1024   # the driver's own share, from Ampere on
    warp_size: int = 32


ARCHS = {
    "sm_80": Arch("sm_80", (8, 0), smem_per_sm=164 * 1024, max_smem_per_block=163 * 1024),
    "sm_90": Arch("sm_90", (9, 0), smem_per_sm=228 * 1024, max_smem_per_block=227 * 1024),
}


@dataclass(frozen=True)
class FunctionResources:
    """What ``ptxas -v`` reports for one function (an entry, i.e. a kernel, or a called .func)."""
    name: str
    entry: bool = False
    registers: int = 0
    stack: int = 0            # bytes of stack frame (local memory) per thread
    spill_stores: int = 0     # bytes
    spill_loads: int = 0      # bytes
    smem: int = 0             # bytes of static shared memory per block
    barriers: int = 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(output: str) -> dict:
    """``{function name: FunctionResources}`` from the text of ``ptxas -v`` (its stderr).

    ptxas names an entry (``Compiling entry function 'f'``), then gives each function's
    ``Function properties`` (stack frame, spills) and, for entries, a ``Used N registers`` line with
    the shared memory; called non-inlined functions get a properties block of their own.
    """
    found, entries, current = {}, set(), None
    for line in output.splitlines():
        if match := _ENTRY.search(line):
            current = match.group(1)
            entries.add(current)
            found.setdefault(current, {})
        elif match := _PROPERTIES.search(line):
            current = match.group(1)
            found.setdefault(current, {})
        elif current is not None and (match := _FRAME.search(line)):
            found[current].update(stack=int(match.group(1)), spill_stores=int(match.group(2)),
                                  spill_loads=int(match.group(3)))
        elif current is not None and (match := _USED.search(line)):
            fields = {"registers": int(match.group(1))}
            if barriers := _BARRIERS.search(line):
                fields["barriers"] = int(barriers.group(1))
            if smem := _SMEM.search(line):
                fields["smem"] = int(smem.group(1))
            found[current].update(fields)
    return {name: FunctionResources(name, name in entries, **fields)
            for name, fields in found.items()}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limiter: str              # "warps", "blocks", "registers" or "shared memory"

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps_per_sm


def occupancy(threads_per_block: int, registers: int, smem_bytes: int, arch="sm_80") -> Occupancy:
    """Theoretical occupancy, as the CUDA occupancy calculator computes it (no dynamic smem).

    Registers: ``registers * 32`` per warp, rounded up to 256, allocated in each of the 4 SM
    sub-partitions (a quarter of the register file each). Shared memory: the static amount plus the
    driver's 1 KiB per block, rounded up to 128 bytes, against the largest carveout.
    """
    arch = ARCHS[arch] if isinstance(arch, str) else arch
    warps = -(-threads_per_block // arch.warp_size)
    max_warps = arch.max_threads_per_sm // arch.warp_size
    if threads_per_block < 1 or threads_per_block > arch.max_threads_per_block:
        return Occupancy(0, 0, max_warps, "warps")

    limits = {"warps": max_warps // warps, "blocks": arch.max_blocks_per_sm}

    regs_per_warp = -(-registers * arch.warp_size // arch.reg_granularity) * arch.reg_granularity
    # The hardware checks a block against the register file as if its warps filled whole rows of
    # sub-partitions.
    assumed = regs_per_warp * (-(-warps // arch.sub_partitions) * arch.sub_partitions)
    if registers > arch.max_regs_per_thread or assumed > arch.regs_per_block:
        limits["registers"] = 0
    elif regs_per_warp:
        per_partition = arch.regs_per_sm // arch.sub_partitions // regs_per_warp
        limits["registers"] = per_partition * arch.sub_partitions // warps

    smem = smem_bytes + arch.reserved_smem_per_block
    smem = -(-smem // arch.smem_granularity) * arch.smem_granularity
    limits["shared memory"] = 0 if smem > arch.max_smem_per_block + arch.reserved_smem_per_block \
        else arch.smem_per_sm // smem

    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps, max_warps, limiter)


def ptxas_path() -> str:
    """``ptxas`` from the ``nvidia-cuda-nvcc`` wheel if installed, else from ``PATH``."""
    name = "ptxas.exe" if os.name == "nt" else "ptxas"
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except (ImportError, ValueError):
        spec = None
    # A namespace package: its folder is in submodule_search_locations, not in origin.
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate
    if found := shutil.which(name):
        return found
    raise FileNotFoundError("ptxas not found: install the CUDA toolkit wheels "
                            "(pip install 'numba-cuda[cu12]', which brings nvidia-cuda-nvcc) "
                            "or put "
                            "a CUDA toolkit's bin/ on PATH")


KERNEL_PACKAGES = ("minilms.kernels", "minilms.layers")  # families, and layers' own kernels


def discover_kernels() -> tuple[dict, dict]:
    """Import every module of ``KERNEL_PACKAGES``; return ``(KERNELS, {module: import error})``.

    Modules are found with pkgutil (sub-packages included), so a new kernel family, or a layer with
    a kernel of its own, is covered without being listed here.
    """
    from .registry import KERNELS
    failures = {}
    for package in KERNEL_PACKAGES:
        path = importlib.import_module(package).__path__
        for module in pkgutil.walk_packages(path, prefix=f"{package}."):   # sub-packages too
            try:
                importlib.import_module(module.name)
            except Exception as error:  # reported, so one broken module does not hide the others
                failures[module.name] = f"{type(error).__name__}: {error}"
    return KERNELS, failures


@dataclass(frozen=True)
class KernelReport:
    kernel: str
    signature: str
    arch: str
    threads_per_block: int
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0
    occupancy: float = 0.0
    limiter: str = ""
    error: str = ""           # a compile or assembly failure; empty when it compiled
    # the SASS of its inner loop (``sass.inner_loop``): FFMA among instructions; None where no
    # nvdisasm read it, (0, 0) where no loop has an FFMA
    loop_ffma: int | None = None
    loop_instructions: int | None = None

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    @property
    def ok(self) -> bool:
        return not self.error and self.spills == 0

    def as_dict(self) -> dict:
        return dict(asdict(self), spills=self.spills, ok=self.ok,
                    signature_short=short_signature(self.signature))


def _require_compiler():
    import numba
    if numba.config.ENABLE_CUDASIM:
        raise RuntimeError(
            "the PTX report cannot run under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1 "
            "replaces numba.cuda.compile_ptx): run it in a process without that variable, e.g. "
            "`env -u NUMBA_ENABLE_CUDASIM python scripts/kernel_report.py`")


def compile_kernel(spec, signature: str, arch="sm_80", ptxas=None) -> KernelReport:
    """Compile one registered kernel (a ``KernelSpec``) for one signature and arch; never raises
    for a kernel's own failure: that is returned in ``KernelReport.error``."""
    _require_compiler()
    from ..lazy_cuda import load
    cuda = load()       # the kernels' globals bound to numba.cuda and real device functions
    arch = ARCHS[arch] if isinstance(arch, str) else arch
    threads = prod(spec.block)
    failed = dict(kernel=spec.name, signature=signature, arch=arch.name, threads_per_block=threads)
    try:
        ptx, _ = cuda.compile_ptx(spec.py_func, signature, cc=arch.cc)
    except Exception as error:
        return KernelReport(**failed, error=f"compile_ptx: {type(error).__name__}: "
                                            f"{_first_lines(str(error))}")
    loop = None
    with tempfile.TemporaryDirectory(prefix="minilms-ptx-") as folder:
        source, cubin = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
        with open(source, "w") as file:
            file.write(ptx)
        run = subprocess.run([ptxas or ptxas_path(), f"-arch={arch.name}", "-v", source,
                              "-o", cubin], capture_output=True, text=True)
        if run.returncode == 0 and sass.nvdisasm_path():
            found = sass.inner_loop(sass.disassemble(cubin))
            loop = (found.ffma, found.instructions) if found else (0, 0)
    if run.returncode != 0:
        return KernelReport(**failed, error=f"ptxas: {_first_lines(run.stderr or run.stdout)}")
    functions = parse_ptxas(run.stderr + run.stdout)
    entries = [f for f in functions.values() if f.entry]
    if len(entries) != 1:
        return KernelReport(**failed, error=f"expected one entry function in ptxas output, "
                                            f"found {len(entries)}")
    entry = entries[0]
    # Spills in a called (non-inlined) function are the kernel's spills too.
    stores = sum(f.spill_stores for f in functions.values())
    loads = sum(f.spill_loads for f in functions.values())
    occ = occupancy(threads, entry.registers, entry.smem, arch)
    return KernelReport(**failed, registers=entry.registers, stack=entry.stack,
                        spill_stores=stores, spill_loads=loads, smem=entry.smem,
                        occupancy=occ.fraction, limiter=occ.limiter,
                        loop_ffma=loop and loop[0], loop_instructions=loop and loop[1])


def report(arches=("sm_80", "sm_90"), names=None, jobs=1) -> tuple[list, dict]:
    """``(reports, import failures)`` for every registered kernel (or those in ``names``), every
    signature, every arch, in a stable order; ``jobs`` > 1 compiles in that many processes."""
    _require_compiler()
    kernels, failures = discover_kernels()
    ptxas = ptxas_path()
    tasks = [(name, signature, arch) for name in sorted(kernels) if not names or name in names
             for signature in kernels[name].signatures for arch in arches]
    if jobs <= 1:
        return [compile_kernel(kernels[n], s, a, ptxas) for n, s, a in tasks], failures
    # Spawned, not forked: each worker imports numba afresh rather than inheriting its locks.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_compile_task, tasks, [ptxas] * len(tasks))), failures


def _compile_task(task, ptxas):
    name, signature, arch = task
    return compile_kernel(discover_kernels()[0][name], signature, arch, ptxas)


def problems(results, failures, check=True) -> list:
    """One message per failure to import, compile or assemble (and per spilling kernel if
    ``check``), each naming the kernel, its signature and the arch."""
    found = [f"module minilms.kernels.{module} failed to import: {error}"
             for module, error in failures.items()]
    for result in results:
        where = f"{result.kernel} [{short_signature(result.signature)}] on {result.arch}"
        if result.error:
            found.append(f"{where} failed:\n    " + result.error.replace("\n", "\n    "))
        elif check and result.spills:
            found.append(f"{where} spills registers: {result.spill_stores} bytes stored, "
                         f"{result.spill_loads} bytes loaded per thread")
    return found


_SHORT = (("float32", "f32"), ("float64", "f64"), ("int64", "i64"), ("int32", "i32"),
          ("uint32", "u32"), ("boolean", "b"), ("uint8", "u8"), (" ", ""))


def short_signature(signature: str) -> str:
    """``void(float32[:, ::1], int64, int64)`` -> ``f32[:,::1],i64*2``: short enough for a table."""
    text = signature
    for long, short in _SHORT:
        text = text.replace(long, short)
    if text.startswith("void(") and text.endswith(")"):
        text = text[5:-1]
    args = re.split(r",(?![^\[]*\])", text)  # commas outside [...]
    runs = []
    for arg in args:
        if runs and runs[-1][0] == arg:
            runs[-1][1] += 1
        else:
            runs.append([arg, 1])
    return ",".join(arg if count == 1 else f"{arg}*{count}" for arg, count in runs)


def _first_lines(text: str, lines: int = 6) -> str:
    # Numba's messages carry ANSI colour codes; the report is read as plain text.
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
    return "\n".join(text.splitlines()[:lines])
