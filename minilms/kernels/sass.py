"""What a kernel executes on the GPU, read without one: the instruction mix of its SASS.

``ptx.compile_kernel`` assembles a kernel's PTX into a cubin with ``ptxas``; ``nvdisasm`` turns
the cubin into SASS, the GPU's own instructions. The share of FFMA (fused multiply-add) among the
instructions of a GEMM's inner loop is how much of the time its warps issue useful work: the
rest (shared loads, address arithmetic, the loop's counter, barriers) is overhead at best. It is
static evidence of speed: it says nothing of stalls, which only a GPU measures.

The *inner loop* is found as NVIDIA's disassembly prints it: a backward branch (``BRA`` to an
earlier label) closes a loop whose body runs from the label to the branch; the loop holding the
most FFMA instructions is the one reported (the smallest, of those with as many).

``nvdisasm`` is found as ``$NVDISASM`` or on ``PATH``. The CUDA toolkit wheels on PyPI do not
carry it; Debian's ``nvidia-cuda-toolkit`` package (in non-free) does, and its 11.8 reads the
sm_90 cubins of today's ``ptxas``: ``scripts/get_nvdisasm.sh`` unpacks it without installing.
"""
import hashlib
import inspect
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["LoopMix", "nvdisasm_path", "nvdisasm_version", "disassemble", "inner_loop",
           "source_digest"]

_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b[^`]*`?\(?(\.L_x_\d+)")


@dataclass(frozen=True)
class LoopMix:
    """The instructions of one loop's body: how many FFMA among how many, and by opcode."""
    ffma: int
    instructions: int
    opcodes: dict = field(default_factory=dict, compare=False)

    @property
    def share(self) -> float:
        return self.ffma / self.instructions if self.instructions else 0.0

    def describe(self) -> str:
        return f"{100 * self.share:.0f}% ({self.ffma}/{self.instructions})"


def nvdisasm_path() -> str | None:
    """``$NVDISASM`` if set, else ``nvdisasm`` on ``PATH``; None when there is none."""
    return os.environ.get("NVDISASM") or shutil.which("nvdisasm")


def nvdisasm_version(nvdisasm: str | None = None) -> str:
    """``nvdisasm --version``'s last line (its build), for the records made with it."""
    tool = nvdisasm or nvdisasm_path()
    run = subprocess.run([tool, "--version"], capture_output=True, text=True)
    return run.stdout.strip().splitlines()[-1]


def disassemble(cubin: str, nvdisasm: str | None = None) -> str:
    """The SASS listing of the cubin file ``cubin`` (``nvdisasm -c``: code sections only)."""
    tool = nvdisasm or nvdisasm_path()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found: set NVDISASM or run scripts/get_nvdisasm.sh")
    run = subprocess.run([tool, "-c", cubin], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {(run.stderr or run.stdout).strip()[:300]}")
    return run.stdout


def _opcode(instruction: str) -> str:
    words = instruction.split()
    if words[0].startswith("@"):       # a predicate guards it: @P0, @!P1
        words = words[1:]
    return words[0].split(".")[0]


def inner_loop(sass: str) -> LoopMix | None:
    """The loop of ``sass`` (a listing) with the most FFMA; None if no loop has any."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        if label := _LABEL.match(line):
            labels[label.group(1)] = len(instructions)
        elif found := _INSTRUCTION.match(line):
            instructions.append(found.group(2))
    best = None
    for end, instruction in enumerate(instructions):
        target = _BRANCH.search(instruction)
        start = labels.get(target.group(1)) if target else None
        if start is None or start > end:
            continue
        opcodes = Counter(_opcode(i) for i in instructions[start:end + 1])
        mix = LoopMix(opcodes["FFMA"], end + 1 - start, dict(opcodes.most_common()))
        if mix.ffma and (best is None or (mix.ffma, -mix.instructions)
                         > (best.ffma, -best.instructions)):
            best = mix
    return best


def source_digest(*objects) -> str:
    """A digest of the Python source of ``objects`` (functions, or values by their ``repr``):
    what a golden record of their compiled form was made from. A kernel's is its Python
    function's (``py_func``), whether numba.cuda has been loaded yet (``lazy_cuda.Deferred``) or
    not."""
    digest = hashlib.sha256()
    for item in objects:
        text = inspect.getsource(getattr(item, "py_func", item)) if callable(item) else repr(item)
        digest.update(text.encode())
    return digest.hexdigest()[:16]
