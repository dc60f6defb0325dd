"""``python -m minilms.trace RUN_DIR_OR_TRACE [--png F] [--chrome F] [--table [--top N]]``: read a
memory trace back, summarise it in words (with ``--table``, per layer: bytes moved, and where the
time goes), draw it, or export it for Perfetto."""
import argparse

from .record import load_trace


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count (0, 1, 2, ...), found {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minilms.trace",
                                description="Read a memory trace: its summary (with --table, "
                                            "bytes and time per layer), a picture, a "
                                            "Perfetto / chrome://tracing file.")
    p.add_argument("trace", help="a trace.json (Trace.save), or a run directory holding one")
    p.add_argument("--png", metavar="FILE", help="draw the pool over time, stacked by role")
    p.add_argument("--chrome", metavar="FILE", help="write the Trace Event Format JSON")
    p.add_argument("--table", action="store_true",
                   help="add the tables: per layer, bytes moved (in, out, dropped, pinned); "
                        "where the time goes, in ms per training iteration after the first (its "
                        "warm-up left out): per phase (forward, backward, update, stalled), per "
                        "layer and per layer type")
    p.add_argument("--top", type=_count, metavar="N",
                   help="with --table: the time per layer shows the N layers that take longest "
                        "(default 20; 0: all) and says what the rest hold")
    p.add_argument("--iteration", type=int, help="the picture shows this iteration (0 the "
                                                  "first kept, -1 the latest; default: the "
                                                  "latest training iteration)")
    p.add_argument("--axis", choices=("step", "time"), default="step",
                   help="the picture's x axis: steps of equal width, or time")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.top is not None and not args.table:
        p.error("--top goes with --table")
    trace = load_trace(args.trace)
    print(trace.summary(table=args.table, top=20 if args.top is None else args.top))
    if args.png:
        trace.plot(args.png, iteration=args.iteration, axis=args.axis)
        print(f"picture: {args.png}")
    if args.chrome:
        trace.to_chrome(args.chrome)
        print(f"chrome trace: {args.chrome} (open in https://ui.perfetto.dev)")
    return 0
