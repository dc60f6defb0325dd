"""Checkpoints: weights, optimizer state and trainer state on disk, without pickle, written so that
a process killed at any moment never leaves a broken checkpoint behind.

Layout of a run directory::

    <directory>/latest              the newest tag, one line (replaced atomically)
    <directory>/<tag>/weights.npz   parameters, ``<layer>.<param>`` in PyTorch layouts
    <directory>/<tag>/state.npz     optimizer state, ``<layer>.<param>.<state>`` (e.g. momentum)
    <directory>/<tag>/trainer.json  iteration, epoch, RNG states, solver scalars, config text

The arrays are plain ``np.savez`` archives read with ``allow_pickle=False``, so other tools (and
PyTorch, after ``torch.from_numpy``) read them and loading one never runs code.

API:

``save_checkpoint(directory, tag, weights, state, meta) -> Path``
    Write ``directory/<tag>`` and point ``directory/latest`` at it. ``weights`` and ``state`` map
    names to arrays; ``meta`` is a JSON-able dict that must hold what a resume reads:
    ``iteration``, ``epoch`` and ``batch`` (integers >= 0) and ``rng`` (name ->
    ``bit_generator.state``; a ``np.random.Generator`` is converted for you); by convention it
    also holds ``solver`` (scalar state such as Adam's ``step``, a dict) and ``config`` (the
    resolved config text). Tuples come back as lists, as JSON has only lists.
``load_checkpoint(path) -> Checkpoint``
    ``path`` is a checkpoint directory or a run directory (whose ``latest`` names the checkpoint).
    ``Checkpoint`` has ``path``, ``tag``, ``weights``, ``state`` and ``meta`` (as saved). Every
    field of ``meta`` listed above is checked (``check_meta``) where it is saved and where it is
    loaded, so a checkpoint that loads can be resumed from: ``<dir>/trainer.json: iteration:
    expected an integer >= 0, found '12'``, not a string epoch carried into ``summary.json``.
``load_weights(path) -> dict``
    The weights alone, for ``init_weights:``: an ``.npz`` file, a checkpoint or a run directory.
``apply_weights(blobs, weights, strict=True, source=None) -> AppliedWeights``
    Copy arrays into blobs' host copies, after checking every name, shape and dtype first, so a
    mismatch writes nothing. ``strict=False`` skips missing and unexpected names (and reports them)
    but never a wrong shape or dtype. On an ``LmsExecutor``, call ``executor.flush()`` first so
    that no pinned blob holds a device copy the plan still trusts.
``restore_rngs(generators, states, source=None)``
    Put each named generator back in the state ``meta["rng"]`` recorded; all are checked, against
    a scratch generator of the same kind, before any is changed.

Every failure is a ``CheckpointError`` (a ``MinilmsError``), one line: ``{path}: expected
{expected}, found {found}``; ``NoCheckpointError``, its subclass, means nothing was ever saved
there, which a trainer that resumes when it can treats as "start fresh".

Atomicity: everything is written into ``<tag>.tmp-<pid>`` beside the target, each file and then
the directory fsynced, and renamed into place. A checkpoint of the same tag is first renamed aside
to ``<tag>.old-<pid>`` (a directory cannot be renamed over a non-empty one) and deleted after the
new one is in. A process killed between those two renames leaves no ``<tag>`` but a complete
``<tag>.old-<pid>``: loading reads that one, and the next save renames it back before anything
else. Leftover ``.tmp-`` directories of dead processes are removed by the next save. Pruning
renames a checkpoint to such a ``.tmp-`` name before deleting it, so a process killed mid-delete
(``retention.py``) leaves no half-deleted ``iter-*`` directory that looks like a checkpoint, only a
leftover that the next save removes.
"""
import json
import os
import re
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import CheckpointError, NoCheckpointError, did_you_mean
from .durable import fsync_directory, move_into_place, process_alive, write_durably, write_npz

WEIGHTS, STATE, TRAINER, LATEST = "weights.npz", "state.npz", "trainer.json", "latest"
FORMAT = "minilms-checkpoint/1"
REQUIRED_META = ("iteration", "epoch", "batch", "rng")     # what Trainer.resume reads
COUNTERS = ("iteration", "epoch", "batch")
ITERATION_TAG = re.compile(r"iter-(?P<number>\d+)")         # the trainer's tags, pruned by number
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]*")
LEFTOVER = re.compile(r"(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)")
RESERVED_NAMES = ("file", "allow_pickle")     # np.savez's own keyword arguments


@dataclass
class Checkpoint:
    path: Path                   # the directory actually read
    tag: str
    weights: dict
    state: dict
    meta: dict


class AppliedWeights(NamedTuple):
    loaded: list
    missing: list                # blobs that got nothing (strict=False only)
    unexpected: list             # weights that fit no blob (strict=False only)


def one_line(value) -> str:
    return " ".join(str(value).split())


def shown(value, limit: int = 60) -> str:
    """``value`` as a message quotes it: its repr, on one line, cut at ``limit`` characters."""
    text = one_line(repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- saving ----------------------------------------------------------------------------------------
def save_checkpoint(directory, tag: str, weights: dict, state: dict, meta: dict) -> Path:
    """Write ``directory/<tag>`` (weights.npz, state.npz, trainer.json) atomically and make it
    ``latest``; returns its path. Everything is checked before anything is written."""
    directory = Path(directory)
    check_tag(tag, directory)
    weights = savable_arrays(weights, directory / tag / WEIGHTS)
    state = savable_arrays(state, directory / tag / STATE)
    trainer_text = trainer_json(meta, directory / tag / TRAINER)
    directory.mkdir(parents=True, exist_ok=True)
    clean_leftovers(directory)
    target = directory / tag
    scratch = directory / f"{tag}.tmp-{os.getpid()}"
    scratch.mkdir()
    try:
        write_npz(scratch / WEIGHTS, weights)
        write_npz(scratch / STATE, state)
        write_durably(scratch / TRAINER, trainer_text.encode())
        fsync_directory(scratch)
        move_into_place(scratch, target)
        write_latest(directory, tag)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def check_tag(tag, directory: Path) -> None:
    if not isinstance(tag, str) or not TAG.fullmatch(tag) or tag == LATEST \
            or LEFTOVER.fullmatch(tag):
        raise CheckpointError(directory, "a checkpoint tag of letters, digits and _.=+- (not "
                              f"'{LATEST}', not ending in .tmp-N or .old-N)", repr(tag))


def savable_arrays(arrays: dict, path: Path) -> dict:
    """The arrays as numpy arrays, refusing what ``np.savez`` would pickle or misread."""
    checked = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or name in RESERVED_NAMES:
            raise CheckpointError(path, f"array names that are non-empty strings other than "
                                  f"{', '.join(RESERVED_NAMES)}", repr(name))
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise CheckpointError(path, f"numeric arrays ({name!r} would need pickle)",
                                  f"dtype {array.dtype}")
        checked[name] = array
    return checked


def trainer_json(meta: dict, path: Path) -> str:
    if not isinstance(meta, dict):
        raise CheckpointError(path, "a dict of trainer state", type(meta).__name__)
    missing = [key for key in REQUIRED_META if key not in meta]
    if missing:
        raise CheckpointError(path, f"trainer state with {', '.join(REQUIRED_META)}",
                              f"no {', '.join(missing)}")
    if "format" in meta:
        raise CheckpointError(path, "trainer state without a 'format' key (it is the file's own)",
                              "one")
    try:
        text = json.dumps({"format": FORMAT, **meta}, indent=2, default=jsonable) + "\n"
    except (TypeError, ValueError) as error:
        raise CheckpointError(path, "JSON-able trainer state", error) from None
    check_meta(json.loads(text), path)     # as load_checkpoint will read it back
    return text


def check_meta(meta: dict, path) -> None:
    """The trainer state a resume reads, checked field by field; each failure names the file and
    the key: ``{path}: iteration: expected an integer >= 0, found '12'``."""
    missing = [key for key in REQUIRED_META if key not in meta]
    if missing:
        raise CheckpointError(path, f"trainer state with {', '.join(REQUIRED_META)}",
                              f"no {', '.join(missing)}")
    for key in COUNTERS:
        value = meta[key]
        if type(value) is not int or value < 0:       # a bool is not a count, nor is 12.0
            raise CheckpointError(f"{path}: {key}", "an integer >= 0", shown(value))
    states = meta["rng"]
    if not isinstance(states, dict):
        raise CheckpointError(f"{path}: rng", "generator states by name (a JSON object)",
                              shown(states))
    for name, state in states.items():
        check_generator_state(state, f"{path}: rng.{name}")
    if "config" in meta and not isinstance(meta["config"], str):
        raise CheckpointError(f"{path}: config", "the resolved config's text",
                              shown(meta["config"]))
    if "solver" in meta and not isinstance(meta["solver"], dict):
        raise CheckpointError(f"{path}: solver", "the solver's scalar state (a JSON object)",
                              shown(meta["solver"]))


def check_generator_state(state, where: str, kind: str | None = None) -> None:
    """``state`` must be a numpy bit generator's (``kind``'s, when given): it is tried on a
    scratch generator of its kind, which checks every field the way restoring will."""
    saved = state.get("bit_generator") if isinstance(state, dict) else None
    if kind is not None and saved != kind:
        raise CheckpointError(where, f"a {kind} state", shown(saved))
    bit_generator = getattr(np.random, saved, None) if isinstance(saved, str) else None
    if not (isinstance(bit_generator, type) and issubclass(bit_generator, np.random.BitGenerator)
            and bit_generator is not np.random.BitGenerator):
        raise CheckpointError(where, "a numpy bit generator's state ({\"bit_generator\": "
                              "\"PCG64\", \"state\": ...})", shown(state))
    try:
        bit_generator().state = state
    except Exception as error:      # numpy raises TypeError, KeyError, OverflowError, ...
        raise CheckpointError(where, f"a valid {saved} state", f"{shown(state)} "
                              f"({type(error).__name__}: {one_line(error)})") from None


def jsonable(value):
    """``json.dumps``'s fallback: generators become their states, numpy values plain ones."""
    if isinstance(value, np.random.Generator):
        value = value.bit_generator
    if isinstance(value, np.random.BitGenerator):
        return value.state          # MT19937's key array comes back here as an ndarray
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON data")


def write_latest(directory: Path, tag: str) -> None:
    scratch = directory / f"{LATEST}.tmp-{os.getpid()}"
    scratch.unlink(missing_ok=True)
    write_durably(scratch, f"{tag}\n".encode())
    os.replace(scratch, directory / LATEST)
    fsync_directory(directory)


def clean_leftovers(directory: Path) -> None:
    """Remove what interrupted saves left: scratch copies, and checkpoints set aside for a
    replacement that never came (those are renamed back, as they are the only copy)."""
    for entry in sorted(directory.iterdir()):
        match = LEFTOVER.fullmatch(entry.name)
        if match is None or process_alive(int(match["pid"])):
            continue
        original = directory / match["name"]
        if match["kind"] == "old" and not original.exists():
            os.replace(entry, original)
            fsync_directory(directory)
        elif entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# -- loading ---------------------------------------------------------------------------------------
def load_checkpoint(path) -> Checkpoint:
    """The checkpoint at ``path``: a checkpoint directory, or a run directory (its ``latest``)."""
    where, tag = locate(Path(path))
    return Checkpoint(where, tag, read_npz(where / WEIGHTS), read_npz(where / STATE),
                      read_trainer(where / TRAINER))


def load_weights(path) -> dict:
    """Weights for ``init_weights:``: an ``.npz`` file, or a checkpoint's (or run's latest)."""
    path = Path(path)
    if path.is_dir():
        return read_npz(locate(path)[0] / WEIGHTS)
    return read_npz(path)


def locate(path: Path) -> tuple:
    """The checkpoint directory ``path`` means, and its tag."""
    if not path.exists():
        raise NoCheckpointError(path, "a checkpoint or run directory", "no such file or directory")
    if not path.is_dir():
        raise CheckpointError(path, "a checkpoint or run directory", "a file")
    if any((path / name).exists() for name in (WEIGHTS, STATE, TRAINER)):
        return path, path.name
    latest = path / LATEST
    if not latest.exists():
        raise NoCheckpointError(path, f"a checkpoint ({WEIGHTS}, {STATE}, {TRAINER}) or a run "
                                f"directory with a '{LATEST}' file", "neither: no checkpoint "
                                "has been completed there")
    try:
        tag = latest.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(latest, "a checkpoint tag", error) from None
    if not TAG.fullmatch(tag) or tag == LATEST:
        raise CheckpointError(latest, "a checkpoint tag", repr(tag))
    if (path / tag).is_dir():
        return path / tag, tag
    # Killed between setting the old copy aside and moving the new one in: the old one is whole.
    aside = sorted(path.glob(f"{glob_escape(tag)}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside:
        return aside[-1], tag
    raise CheckpointError(path / tag, f"the checkpoint that '{LATEST}' names",
                          "no such directory")


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def read_npz(path: Path) -> dict:
    """Every array of an ``.npz`` archive, read now (so corruption shows here, not later)."""
    expected = "an .npz archive of numeric arrays"
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CheckpointError(path, expected, "no such file") from None
    except IsADirectoryError:
        raise CheckpointError(path, expected, "a directory") from None
    except ValueError:
        # np.load falls back to unpickling anything that is neither .npy nor .npz.
        raise CheckpointError(path, expected, "neither .npz nor .npy data (a pickle, or garbage; "
                              "checkpoints are never unpickled)") from None
    except (OSError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointError(path, expected, f"a file numpy cannot read ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise CheckpointError(path, expected, "a single .npy array")
    with archive:
        arrays = {}
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError as error:
                if "allow_pickle" in str(error):
                    raise CheckpointError(path, expected, f"an object array {name!r} (it would "
                                          "need pickle)") from None
                raise CheckpointError(path, expected, f"a corrupt array {name!r} ({error})") \
                    from None
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
                raise CheckpointError(path, expected, f"a corrupt array {name!r} ({error})") \
                    from None
    return arrays


def read_trainer(path: Path) -> dict:
    expected = f"trainer state as JSON ({FORMAT})"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(path, expected, "no such file") from None
    except UnicodeDecodeError:
        raise CheckpointError(path, expected, "bytes that are not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise CheckpointError(path, expected, f"invalid JSON ({error.msg} at line "
                              f"{error.lineno} column {error.colno})") from None
    except (ValueError, RecursionError) as error:     # an integer of over 4300 digits, nesting
        raise CheckpointError(path, expected, f"unreadable JSON ({one_line(error)})") from None
    except OSError as error:
        raise CheckpointError(path, expected, error) from None
    if not isinstance(data, dict):
        raise CheckpointError(path, expected, f"a JSON {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise CheckpointError(path, f"format {FORMAT!r}", repr(data.get("format")))
    del data["format"]
    check_meta(data, path)
    return data


def restore_rngs(generators: dict, states: dict, source=None) -> None:
    """Set each ``np.random.Generator`` in ``generators`` to ``states[name]`` (``meta["rng"]``);
    all are checked (on scratch generators of the same kind) before any is changed, so a garbage
    state is a CheckpointError and leaves every generator as it was. ``source`` (the file the
    states came from) only makes the messages say where."""
    prefix = f"{source}: " if source else ""
    if not isinstance(states, dict):
        raise CheckpointError(f"{prefix}rng", "generator states by name", shown(states))
    for name, generator in generators.items():
        if name not in states:
            raise CheckpointError(f"{prefix}rng.{name}", "a saved generator state",
                                  f"none (saved: {', '.join(map(str, states)) or 'none'})")
        check_generator_state(states[name], f"{prefix}rng.{name}",
                              type(generator.bit_generator).__name__)
    for name, generator in generators.items():
        generator.bit_generator.state = states[name]


# -- applying --------------------------------------------------------------------------------------
def apply_weights(blobs: dict, weights: dict, strict: bool = True,
                  source=None) -> AppliedWeights:
    """Copy ``weights[name]`` into ``blobs[name]``'s host copy for every name, after checking all
    of them (names, shapes, dtypes): a mismatch raises before anything is written. ``source`` (a
    path) only makes the messages say where the weights came from."""
    prefix = f"{source}: " if source else ""
    missing = [name for name in blobs if name not in weights]
    unexpected = [name for name in weights if name not in blobs]
    if strict and unexpected:
        name = unexpected[0]
        others = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(f"{prefix}{name}", "a name of this net's blobs",
                              f"no such blob{others}", did_you_mean(name, missing or list(blobs)))
    if strict and missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise CheckpointError(source or "weights", "an array for every blob",
                              f"none for {shown}")
    loaded = [name for name in blobs if name in weights]
    for name in loaded:
        blob, array = blobs[name], np.asarray(weights[name])
        if tuple(array.shape) != tuple(blob.shape) or array.dtype != np.dtype(blob.dtype):
            raise CheckpointError(f"{prefix}{name}", describe(blob.dtype, blob.shape),
                                  describe(array.dtype, array.shape))
    for name in loaded:
        blobs[name].mutable_host_data()[...] = weights[name]
    return AppliedWeights(loaded, missing, unexpected)


def describe(dtype, shape) -> str:
    return f"{np.dtype(dtype)} {list(shape)}"

