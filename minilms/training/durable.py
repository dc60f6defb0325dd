"""Files a process killed at any moment never leaves half-made: each is written and fsynced
before it is renamed into place, and the rename made durable by an fsync of its directory.
Checkpoints (``checkpoint.py``) are written through these."""
import os
import shutil
from pathlib import Path

import numpy as np


def write_npz(path: Path, arrays: dict) -> None:
    with open(path, "xb") as file:
        np.savez(file, **arrays)
        file.flush()
        os.fsync(file.fileno())


def write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def fsync_directory(path: Path) -> None:
    """Make renames and new entries in ``path`` durable (a no-op where directories cannot be
    opened, as on Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def move_into_place(scratch: Path, target: Path) -> None:
    aside = None
    if target.exists():
        aside = target.with_name(f"{target.name}.old-{os.getpid()}")
        os.replace(target, aside)
    os.replace(scratch, target)
    fsync_directory(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether another live process could still be writing ``pid``'s scratch files; this
    process's own leftovers come from saves that failed and are always stale."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True
