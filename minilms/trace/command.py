"""``python -m minilms.trace RUN_DIR_OR_TRACE [--png F] [--chrome F] [--table]``: read a memory
trace back, summarise it in words, draw it, or export it for Perfetto."""
import argparse

from .record import load_trace


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minilms.trace",
                                description="Read a memory trace: its summary, a picture, a "
                                            "Perfetto / chrome://tracing file.")
    p.add_argument("trace", help="a trace.json (Trace.save), or a run directory holding one")
    p.add_argument("--png", metavar="FILE", help="draw the pool over time, stacked by role")
    p.add_argument("--chrome", metavar="FILE", help="write the Trace Event Format JSON")
    p.add_argument("--table", action="store_true", help="add the per-layer table")
    p.add_argument("--iteration", type=int, help="the picture shows this iteration (0 the "
                                                  "first kept, -1 the latest; default: the "
                                                  "latest training iteration)")
    p.add_argument("--axis", choices=("step", "time"), default="step",
                   help="the picture's x axis: steps of equal width, or time")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    trace = load_trace(args.trace)
    print(trace.summary(table=args.table))
    if args.png:
        trace.plot(args.png, iteration=args.iteration, axis=args.axis)
        print(f"picture: {args.png}")
    if args.chrome:
        trace.to_chrome(args.chrome)
        print(f"chrome trace: {args.chrome} (open in https://ui.perfetto.dev)")
    return 0

