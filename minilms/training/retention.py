"""Retention: which of a run's checkpoints to keep (the newest few, the best, the one ``latest``
names), and deleting the rest without ever leaving a half-deleted checkpoint behind."""
import os
import shutil
from pathlib import Path

from ..errors import CheckpointError
from .checkpoint import ITERATION_TAG, LATEST, STATE, TAG, TRAINER, WEIGHTS, one_line
from .durable import fsync_directory


def prune_checkpoints(run_dir, keep: int, best: str | None) -> list[Path]:
    """Delete the ``iter-<number>`` checkpoints of ``run_dir`` except the newest ``keep`` (by
    iteration number, not file time), the one tagged ``best`` (such as ``"iter-0000050"``; None
    for none) and, whatever ``keep`` says, the one ``latest`` names. Returns the directories
    removed, oldest first.

    Safe against what crashes leave:

    - Only complete checkpoints (all of weights.npz, state.npz, trainer.json) count toward
      ``keep``, so an incomplete ``iter-*`` directory (not something ``save_checkpoint`` makes:
      it renames whole directories into place) never displaces a good one; it is removed.
    - Other names are never touched: tags that are not ``iter-<number>``, ``latest``, and the
      ``.tmp-``/``.old-`` leftovers of an interrupted save (an ``.old-`` one may be the only copy
      of what ``latest`` names; ``clean_leftovers`` deals with them at the next save).
    - If ``latest`` exists but cannot be read as a tag, nothing is removed: which checkpoint a
      resume would take is then unknown.
    - Each victim is renamed to ``<tag>.tmp-<pid>`` (atomic), the renames made durable, and only
      then deleted: a process killed mid-delete leaves a leftover the next save removes, never a
      half-deleted directory under a checkpoint's name.

    A directory that cannot be renamed is a CheckpointError naming it, raised once those before
    it are deleted. ``keep`` must be an integer >= 0.
    """
    if type(keep) is not int or keep < 0:
        raise ValueError(f"keep must be an integer >= 0, not {keep!r}")
    run_dir = Path(run_dir)
    protected = {best} if best else set()
    latest = run_dir / LATEST
    if latest.exists():
        try:
            tag = latest.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return []
        if not TAG.fullmatch(tag) or tag == LATEST:
            return []
        protected.add(tag)
    checkpoints = []
    for entry in run_dir.iterdir() if run_dir.is_dir() else ():
        match = ITERATION_TAG.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            checkpoints.append((int(match["number"]), entry.name, entry))
    checkpoints.sort()
    complete = [c for c in checkpoints
                if all((c[2] / name).is_file() for name in (WEIGHTS, STATE, TRAINER))]
    kept = {entry for _, _, entry in complete[max(len(complete) - keep, 0):]} if keep else set()
    doomed = [entry for _, name, entry in checkpoints
              if entry not in kept and name not in protected]
    aside, failure = [], None
    for entry in doomed:
        scratch = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
        try:
            shutil.rmtree(scratch, ignore_errors=True)   # a failed prune's, in this process
            os.replace(entry, scratch)
        except OSError as error:
            failure = CheckpointError(entry, "a checkpoint directory that can be removed",
                                      one_line(error))
            break
        aside.append(scratch)
    if aside:
        fsync_directory(run_dir)
    for scratch in aside:
        shutil.rmtree(scratch, ignore_errors=True)   # what stays is a leftover the next save takes
    if failure is not None:
        raise failure
    return doomed
