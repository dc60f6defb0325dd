"""A short demo of the memory core: activations four times the device's memory pass through it.

    python -m minilms.demo [--memory 1MiB] [--layers 8] [--activation 256KiB] [--link pcie3]

A chain of layers runs forward (each step reads the previous activation and writes its own), then
backward (each step reads its activation again, last layer first). Only the blobs a step works on
must be on the device; when the pool is full, the blob whose next use is furthest away goes home
(swap-out if it is dirty, otherwise it is dropped without a copy). The result is checked against
the same arithmetic done on the host alone. Until the training command exists (the engine issue),
this is the project's main demo; the planner will compute these decisions ahead of time.
"""
import argparse
import sys

import numpy as np

from . import events
from .blob import Blob
from .device import make_device
from .errors import MinilmsError, OutOfDeviceMemory
from .pool import align_up
from .sizes import format_bytes, parse_size


def schedule(layers: int) -> list[tuple[str, list[int], int | None]]:
    """Steps as (name, activations read, activation written); activation 0 is the input."""
    forward = [(f"forward {i}", [i - 1], i) for i in range(1, layers + 1)]
    backward = [(f"backward {i}", [i], None) for i in range(layers, 0, -1)]
    return forward + backward


def next_use(steps, after: int, blob: int) -> float:
    for index in range(after + 1, len(steps)):
        _, reads, writes = steps[index]
        if blob in reads or blob == writes:
            return index
    return float("inf")


def make_room(blobs, steps, now, needed, working) -> None:
    """Release resident blobs, furthest next use first, until ``needed`` bytes fit in one block."""
    pool = blobs[0].device.pool
    candidates = sorted((b for i, b in enumerate(blobs) if b.placed and i not in working),
                        key=lambda b: -next_use(steps, now, blobs.index(b)))
    while pool.stats().largest_free < needed and candidates:
        victim = candidates.pop(0)
        victim.release(needed_later=next_use(steps, now, blobs.index(victim)) != float("inf"))


def pool_bytes(blob) -> int:
    return align_up(blob.nbytes)


def run(memory: str, layers: int, activation: str, link) -> int:
    with make_device("cpu", memory, link=link) as device:
        return run_on(device, layers, activation)


def run_on(device, layers: int, activation: str) -> int:
    count = parse_size(activation, "--activation") // 4
    blobs = [Blob(device, f"act{i}", (count,), np.float32) for i in range(layers + 1)]
    blobs[0].mutable_host_data()[...] = np.linspace(0, 1, count, dtype=np.float32)
    reference = [blobs[0].host_data().copy()]
    for _ in range(layers):
        reference.append(np.sqrt(reference[-1] * 0.5 + 1.0))
    steps = schedule(layers)
    moved = {"h2d": 0, "d2h": 0, "drop": 0}

    def count_moves(event):
        if event.kind in moved:
            moved[event.kind] += event.nbytes

    print(f"{layers + 1} activations of {format_bytes(blobs[0].nbytes)} "
          f"({format_bytes(sum(b.nbytes for b in blobs))}) through {device.name}")
    print(f"{'step':<12} {'in pool':>10} {'H2D':>10} {'D2H':>10}  resident")
    ok = True
    with events.listen(count_moves):
        for now, (name, reads, writes) in enumerate(steps):
            before = dict(moved)
            working = set(reads) | ({writes} if writes is not None else set())
            try:
                for index in working:
                    if not blobs[index].placed:
                        make_room(blobs, steps, now, blobs[index].nbytes, working)
                        blobs[index].place()
            except OutOfDeviceMemory:
                need = sum(pool_bytes(blobs[i]) for i in working)
                raise OutOfDeviceMemory(
                    f"step '{name}' needs {format_bytes(need)} on the device at once "
                    f"({', '.join(blobs[i].name for i in sorted(working))}) but the pool holds "
                    f"{format_bytes(device.pool.capacity)}: give --memory at least "
                    f"{format_bytes(need)}") from None
            source = blobs[reads[0]].device_data()
            if writes is not None:  # a layer: out = sqrt(in / 2 + 1), done in the arena
                out = blobs[writes].mutable_device_data(overwrite=True)
                np.multiply(source, 0.5, out=out)
                np.add(out, 1.0, out=out)
                np.sqrt(out, out=out)
            else:  # backward reads the activation it kept: it must be exactly what forward wrote
                ok &= bool(np.array_equal(device.to_host(source), reference[reads[0]]))
            resident = " ".join(b.name for b in blobs if b.placed)
            print(f"{name:<12} {format_bytes(device.pool.in_use):>10} "
                  f"{format_bytes(moved['h2d'] - before['h2d']):>10} "
                  f"{format_bytes(moved['d2h'] - before['d2h']):>10}  {resident}")
    stats = device.pool.stats()
    print(f"moved {format_bytes(moved['h2d'])} in, {format_bytes(moved['d2h'])} out, dropped "
          f"{format_bytes(moved['drop'])} without a copy; peak pool use {format_bytes(stats.peak)} "
          f"of {format_bytes(stats.capacity)}")
    print("every activation read back equals the host-only computation:", "yes" if ok else "NO")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minilms.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", default="1MiB", help="device pool size (default 1MiB)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--activation", default="256KiB", help="bytes per activation")
    parser.add_argument("--link", default=None, help="link model: pcie3, pcie4, pcie5, nvlink2, GB/s")
    args = parser.parse_args(argv)
    try:
        return run(args.memory, args.layers, args.activation, args.link)
    except MinilmsError as error:
        print(f"minilms.demo: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
