"""``python -m minilms.plan CONFIG.yaml [key=value ...]``: what LMS will do, before anything runs.

Prints the plan for one training iteration of the config's model at its batch size in its
``device.memory``: a table per layer (output shape, parameters, the largest working set of its
steps, bytes brought in and sent out per iteration for the blobs it owns, bytes pinned), then the
totals: whether it fits without LMS, the least pool LMS needs, the plan's peak, bytes moved per
iteration, the predicted step time and stall with this plan's prefetch and without, and the host
memory the run needs (``minilms.lms.host``: the blobs' host copies, pinned on ``cuda``; the pool,
which is host RAM on ``cpu``; the loader's batches), beside what this process holds now.

Planning allocates no device memory: a 16 GiB device plans on a laptop, and so does GoogLeNet at
2240x2240. A blob *belongs* to the layer whose step touches it first (its parameters, its output,
the gradients its backward makes).
"""
import argparse
from dataclasses import replace

from ..config.build import (
    build_net,
    cost_model,
    device_kind,
    fusions,
    lms_policy,
    load,
    planned_capacity,
    planned_net,
)
from ..device import parse_link
from ..device.cpu import host_memory_info
from ..errors import PlanError
from ..lms.bounds import (
    SUMMARY_PRECISION,
    least_pool,
    least_split_pool,
    resident_bytes,
    split_floor,
    working_set_bytes,
)
from ..lms.cost import plan_for, simulate
from ..lms.forked import started
from ..lms.host import CPU_COMPILE_BYTES, host_memory, loader_batches, process_resident
from ..lms.plan import Plan
from ..lms.planner import make_plan
from ..lms.recompute import RECOMPUTE, recomputed
from ..sizes import format_bytes
from .common import run

COLUMNS = ("layer", "type", "output", "params", "working set", "in/iter", "out/iter", "pinned")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minilms.plan", description=__doc__.split("\n")[0])
    p.add_argument("config", help="a YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="settings that replace the file's, e.g. data.batch_size=64")
    p.add_argument("--link", help="link model for the predicted times (pcie3, pcie4, pcie5, "
                                  "nvlink2, or GB/s); default: device.link")
    p.add_argument("--summary", action="store_true", help="totals only, no per-layer table")
    p.add_argument("--least-split", action="store_true",
                   help="search for the least pool with steps split along the batch (plans "
                        "many times: minutes for a deep net at a large batch); without it, the "
                        "floor under it is printed")
    return p


def owners(plan: Plan) -> dict:
    """Blob name -> the layer whose step touches it first."""
    owner = {}
    for step_plan in plan.steps:
        for name in step_plan.step.blobs:
            owner.setdefault(name, step_plan.step.layer)
    return owner


def layer_rows(net, plan: Plan) -> list[tuple]:
    """One row per layer; with a ``split`` column (how many chunks its forward and backward
    steps run in) when the plan splits any step along the batch."""
    owner = owners(plan)
    split, rerun = {}, {}
    for step_plan in plan.steps:
        part = step_plan.step.part
        if part is not None:
            split.setdefault(step_plan.step.layer, {})[step_plan.step.kind[0]] = part.chunks
        if step_plan.step.kind == RECOMPUTE:
            layer = net.layer[step_plan.step.layer]
            rerun[layer.name] = rerun.get(layer.name, 0) + layer.flops()
    moved = {layer.name: {"h2d": 0, "d2h": 0, "pinned": 0, "ws": 0} for layer in net.layers}
    for _, action in plan.actions():
        if action.copies:
            moved[owner[action.blob]][action.copies] += action.nbytes
    for name in plan.pinned:
        moved[owner[name]]["pinned"] += plan.blobs[name].nbytes
    for step_plan in plan.steps:
        row = moved[step_plan.step.layer]
        row["ws"] = max(row["ws"], working_set_bytes(net, step_plan.step))
    rows = []
    for layer in net.layers:
        m = moved[layer.name]
        count = sum(int(_prod(p.shape)) for p in layer.params())
        rows.append((layer.name, layer.type, "x".join(map(str, layer.top_shapes[0])),
                     _count(count), format_bytes(m["ws"]), format_bytes(m["h2d"]),
                     format_bytes(m["d2h"]), format_bytes(m["pinned"]))
                    + ((" ".join(f"{k}x{n}" for k, n in split.get(layer.name, {}).items()),)
                       if split else ())
                    + ((f"{rerun[layer.name] / 1e6:.1f}M" if layer.name in rerun else "",)
                       if rerun else ()))
    return rows


def _prod(shape) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _count(n: int) -> str:
    for unit, size in (("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def table(rows: list[tuple], split: bool = False, rerun: bool = False) -> str:
    columns = COLUMNS + (("split",) if split else ()) + (("rerun FLOPs",) if rerun else ())
    widths = [max(len(str(r[i])) for r in rows + [columns]) for i in range(len(columns))]
    lines = ["  ".join(f"{c:<{w}}" if i < 3 else f"{c:>{w}}" for i, (c, w) in
                       enumerate(zip(row, widths))).rstrip() for row in [columns] + rows]
    return "\n".join(lines)


def report(config, link=None, summary: bool = False, least_split: bool = False) -> str:
    states = ("momentum",) if config.solver.type == "sgd" and config.solver.momentum else \
        ("exp_avg", "exp_avg_sq") if config.solver.type == "adam" else ()
    fused = fusions(config)
    least_net = build_net(config, fuse=fused[-1])     # the fusion whose least pool is least
    least_steps = least_net.schedule(states)
    everything = resident_bytes(least_net, least_steps)
    capacity = planned_capacity(config, need=everything)
    link = parse_link(link, "--link") if link is not None else parse_link(config.device.link)
    model = cost_model(config, link)
    policy = lms_policy(config)
    least = started(lambda: least_pool(least_net, least_steps, replace(policy, split="off"),
                                       SUMMARY_PRECISION))     # beside auto's planning
    splits = policy.enabled and policy.max_chunks != 1
    floor, floor_step = split_floor(least_net, least_steps, policy)
    searched = least_split_pool(least_net, least_steps, policy, SUMMARY_PRECISION) \
        if splits and least_split else None
    try:
        net, plan = planned_net(config, lambda net, tried: plan_for(
            net, net.schedule(states), capacity, tried, model), policy, built=least_net)
    except PlanError as error:
        split = "" if not splits else f", {format_bytes(searched)} with steps split" \
            if searched else f", at least {format_bytes(floor)} with steps split"
        raise PlanError(f"{error} (LMS needs at least {format_bytes(least())}{split}; LMS off "
                        f"{format_bytes(everything)})") from None
    least = least()
    steps = net.schedule(states)
    inputs = ", ".join(f"{k} {list(v[0])}" for k, v in net.inputs.items())
    out = [f"minilms plan: {config.name}: {len(net.layers)} layers, {len(steps)} steps, "
           f"inputs {inputs}",
           f"device {device_kind(config)}, pool {format_bytes(capacity)}; cost model "
           f"{model.describe()}"]
    chosen = plan.policy.describe()
    if plan.candidates:
        cut = f"; {len(plan.cut_short)} more cut short, slower already" if plan.cut_short else ""
        chosen += f" (auto: the fastest of {sum(s is not None for _, s in plan.candidates)} " \
                  f"plans that fit, of {len(plan.candidates)} weighed{cut})"
    out.append(chosen)
    out += [f"note: {note}" for note in plan.notes]
    if net.fuse != fused[0]:
        siblings = ", and sibling 1x1 convolutions apart" if device_kind(config) == "cpu" else ""
        out.append(f"note: model.fuse {config.model.fuse}: the ReLUs after the adds stay layers "
                   f"of their own{siblings} (no plan of the net so fused fits this pool)")
    if not summary:
        kinds = {s.step.kind for s in plan.steps}
        out += ["", table(layer_rows(net, plan), any(s.step.part for s in plan.steps),
                          RECOMPUTE in kinds), ""]
    timeline = simulate(plan, net, model)
    planned = [step_plan.step for step_plan in plan.steps]     # split steps as sub-steps
    no_prefetch = timeline
    if plan.policy.enabled and plan.policy.prefetch:
        without = replace(plan.policy, prefetch=0, policy="manual")
        no_prefetch = simulate(make_plan(net, planned, capacity, without), net, model)
    fits = "fits" if everything <= capacity else "does not fit"
    out += [f"LMS off needs        {format_bytes(everything):>12}  ({fits} in "
            f"{format_bytes(capacity)})",
            f"least pool for LMS   {format_bytes(least):>12}  (within "
            f"{SUMMARY_PRECISION:.1%}; largest working set "
            f"{format_bytes(max(working_set_bytes(least_net, s) for s in least_steps))})"]
    if splits:
        if searched:
            found = f"{format_bytes(searched):>12}  (searched, within {SUMMARY_PRECISION:.1%}; " \
                f"floor {format_bytes(floor)}, "
        else:
            found = f"{'>= ' + format_bytes(floor):>12}  (a floor: --least-split searches; "
        out.append(f"least pool, split    {found}set by one chunk of {floor_step.name}; "
                   f"lms.split {policy.split})")
    out += [f"this plan's peak     {format_bytes(plan.peak):>12}  (pinned "
            f"{format_bytes(plan.pinned_bytes)})",
            f"moved per iteration  {format_bytes(plan.bytes_moved('h2d')):>12} H2D, "
            f"{format_bytes(plan.bytes_moved('d2h'))} D2H",
            f"predicted iteration  {timeline.seconds * 1e3:>9.2f} ms  (compute "
            f"{timeline.compute_seconds * 1e3:.2f} ms, stall {timeline.stall_seconds * 1e3:.2f} "
            f"ms with prefetch {plan.policy.prefetch}; stall "
            f"{no_prefetch.stall_seconds * 1e3:.2f} ms with prefetch 0)"]
    out += recompute_lines(net, steps, plan, capacity, model)
    out += host_lines(plan, device_kind(config), config.data.prefetch)
    return "\n".join(out)


def recompute_lines(net, steps, plan: Plan, capacity: int, model) -> list[str]:
    """What recomputing costs and saves: the forwards run again and their FLOPs, and the bytes
    moved against the same policy's plan without recompute (none where nothing is rebuilt)."""
    reruns = [s.step for s in plan.steps if s.step.kind == RECOMPUTE]
    if not reruns:
        return []
    flops = sum(net.layer[step.layer].flops() for step in reruns)
    seconds = sum(model.step_seconds(net, step) for step in reruns)
    lines = [f"recompute            {len(recomputed(net, plan)):>12}  blobs rebuilt by "
             f"{len(reruns)} forwards run again: {flops / 1e9:.3f} GFLOP, "
             f"{seconds * 1e3:.2f} ms of compute added per iteration (predicted)"]
    try:
        without = plan_for(net, steps, capacity, replace(plan.policy, recompute="off"), model)
    except PlanError:
        return lines + ["  without recompute  no plan fits this pool"]
    saved = sum(without.bytes_moved(d) - plan.bytes_moved(d) for d in ("h2d", "d2h"))
    return lines + [f"  against none       {format_bytes(saved):>12}  fewer bytes moved per "
                    f"iteration; predicted {simulate(without, net, model).seconds * 1e3:.2f} ms "
                    "without"]


def host_lines(plan: Plan, kind: str, prefetch: int) -> list[str]:
    """What the host needs: the blobs' homes, the pool and the kernels on ``cpu``, the loader's
    batches; then the process itself, measured as it stands."""
    host = host_memory(plan, kind, loader_batches(prefetch))
    lines = [f"host memory          {format_bytes(host.total):>12}  ({host.breakdown()})"]
    resident = process_resident()
    if resident is not None:
        lines.append(f"  + the process      {format_bytes(resident):>12}  (resident in this one "
                     "now: Python, numpy, minilms, the net)")
    if kind == "cpu":
        compiling = format_bytes(CPU_COMPILE_BYTES)
        lines.append(f"  + a first run      {compiling:>12}  (about this much more at its peak "
                     "while Numba compiles the kernels into an empty cache: once on a machine)")
    available, _ = host_memory_info()
    if host.total + (resident or 0) > available:
        lines.append(f"note: the host needs more than the {format_bytes(available)} this machine "
                     "has available")
    return lines


def main(argv=None) -> int:
    args = parser().parse_intermixed_args(argv)
    config = load(args.config, args.overrides)
    try:
        print(report(config, args.link, args.summary, args.least_split))
    except Exception as error:
        error.config = config
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
