"""Compile every registered CUDA kernel for sm_80 and sm_90 and print what ptxas reports.

    python scripts/kernel_report.py [--check] [--arch sm_80 sm_90] [--kernel NAME ...] [--json]
                                    [--jobs N]

No GPU needed: ``numba.cuda.compile_ptx`` and ``ptxas`` come from the CUDA toolkit wheels. Kernels
are found by importing every module of ``minilms.kernels``, so a new family is covered as soon as
its kernels use ``@cuda_kernel``.

Exit status: 1 if a kernel module fails to import or a kernel fails to compile or assemble; with
``--check`` (what CI runs), also if any kernel spills registers. With ``nvdisasm`` (``$NVDISASM``
or on PATH; ``scripts/get_nvdisasm.sh``), the last column is the share of FFMA among the SASS
instructions of each kernel's inner loop (``minilms.kernels.sass``). The offending kernels are named
on stderr. ``--json`` prints the results as JSON on stdout instead of the table.
"""
import os

# compile_ptx does not exist under the simulator, and this process never runs a kernel: drop the
# variable before numba is first imported (a test session's conftest sets it for its children).
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from minilms.kernels import ptx, sass  # noqa: E402

COLUMNS = (("kernel", "kernel", "<"), ("signature", "signature", "<"), ("arch", "arch", "<"),
           ("block", "threads_per_block", ">"), ("regs", "registers", ">"),
           ("spill B", "spills", ">"), ("stack B", "stack", ">"), ("smem B", "smem", ">"),
           ("occupancy", "occupancy", ">"), ("limited by", "limiter", "<"),
           ("loop FFMA", "loop", ">"))


def format_table(results) -> str:
    """The reports as a plain-text table, one row per kernel, signature and arch."""
    rows = []
    for result in results:
        row = result.as_dict()
        row["signature"] = row["signature_short"]
        if result.error:
            rows.append([row["kernel"], row["signature"], row["arch"],
                         str(row["threads_per_block"]), "FAILED", "", "", "", "", "", ""])
            continue
        row["occupancy"] = f"{100 * result.occupancy:.1f}%"
        row["loop"] = loop_column(result)
        rows.append([str(row[key]) for _, key, _ in COLUMNS])
    header = [title for title, _, _ in COLUMNS]
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]

    def line(cells):
        return "  ".join(f"{cell:{align}{width}}"
                         for cell, width, (_, _, align) in zip(cells, widths, COLUMNS)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def loop_column(result) -> str:
    """The inner loop's FFMA share from the SASS: ``71% (512/724)``; ``-`` where no loop has an
    FFMA; ``n/a`` where no nvdisasm read the SASS."""
    if result.loop_ffma is None:
        return "n/a"
    if not result.loop_ffma:
        return "-"
    return f"{100 * result.loop_ffma / result.loop_instructions:.0f}% " \
           f"({result.loop_ffma}/{result.loop_instructions})"


# the four plain GEMM kernels (not the split-K variant, nor the module's other kernels)
GEMMS = ("gemm.gemm_nn", "gemm.gemm_nt", "gemm.gemm_tn", "gemm.gemm_tt")


def write_gemm_sass(results, path) -> None:
    """The GEMM kernels' sm_90 registers and inner-loop mix, with the digest of the source they
    were compiled from (``gemm.source_digest``): tests/kernels/test_sass.py reads it."""
    from minilms.kernels import gemm
    rows = {r.kernel: {"registers": r.registers, "ffma": r.loop_ffma,
                       "instructions": r.loop_instructions}
            for r in results if r.kernel in GEMMS and r.arch == "sm_90"}
    if len(rows) != 4 or any(row["ffma"] is None for row in rows.values()):
        raise SystemExit("kernel_report: --write-gemm-sass needs nvdisasm and the four GEMM "
                         "kernels on sm_90")
    with open(path, "w") as file:
        json.dump({"source_digest": gemm.source_digest(), "arch": "sm_90",
                   "nvdisasm": sass.nvdisasm_version(), "kernels": rows}, file, indent=1)
        file.write("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="also fail (exit 1) when a kernel spills registers")
    parser.add_argument("--arch", nargs="+", default=list(ptx.ARCHS), choices=list(ptx.ARCHS))
    parser.add_argument("--kernel", nargs="+", metavar="NAME",
                        help="only these kernels (<module>.<function>)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    parser.add_argument("--write-gemm-sass", metavar="FILE",
                        help="write the GEMM kernels' sm_90 inner-loop mix as the golden record "
                             "the tests hold without nvdisasm (tests/golden/gemm_sass.json)")
    args = parser.parse_args(argv)

    began = time.perf_counter()
    kernels, _ = ptx.discover_kernels()
    if args.kernel and (unknown := set(args.kernel) - set(kernels)):
        print(f"kernel_report: unknown kernel(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    try:
        results, failures = ptx.report(args.arch, args.kernel, args.jobs)
    except (RuntimeError, FileNotFoundError) as error:  # simulator on, or no ptxas
        print(f"kernel_report: {error}", file=sys.stderr)
        return 1
    found = ptx.problems(results, failures, args.check)
    if args.write_gemm_sass:
        write_gemm_sass(results, args.write_gemm_sass)

    if args.json:
        json.dump({"ptxas": ptx.ptxas_path(), "arches": args.arch, "kernels": sorted(kernels),
                   "import_failures": failures, "results": [r.as_dict() for r in results],
                   "problems": found}, sys.stdout, indent=1)
        print()
    else:
        print(format_table(results))
        print(f"\n{len(kernels)} kernels, {len(results)} compilations in "
              f"{time.perf_counter() - began:.1f} s; ptxas: {ptx.ptxas_path()}; nvdisasm: "
              f"{sass.nvdisasm_path() or 'none (loop FFMA n/a: scripts/get_nvdisasm.sh)'}")
    if found:
        print(f"\nkernel_report: {len(found)} problem(s):", file=sys.stderr)
        for problem in found:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
