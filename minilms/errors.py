"""The errors minilms raises on purpose, every layer's: each renders as one line a user can act on.
And the one did-you-mean hint those lines end with."""
import difflib


class MinilmsError(Exception):
    """Base class: errors that the command-line front ends print as one line and exit 2."""

    exit_code = 2


class ConfigError(MinilmsError, ValueError):
    """A bad setting: names where it came from, the key, what was expected and what was found."""

    def __init__(self, key: str, expected: str, found, source: str | None = None, hint: str = ""):
        self.key, self.expected, self.found, self.source = key, expected, found, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: expected {expected}, found {found!r}{hint}")


class OutOfDeviceMemory(MinilmsError, MemoryError):
    """The pool cannot satisfy a request; the message says who asked, how much, and who holds it."""


class DatasetError(MinilmsError, ValueError):
    """A data file that cannot be read as its format: names the file, what was expected and what
    was found (``path: expected ..., found ...``)."""

    def __init__(self, path, expected: str, found):
        self.path, self.expected, self.found = str(path), expected, found
        super().__init__(f"{path}: expected {expected}, found {found}")


class PlanError(MinilmsError, MemoryError):
    """No plan fits: names the step, the bytes it needs and the capacity, and what to change."""


class ShapeError(MinilmsError):
    """An impossible shape or option of a layer: names the layer, the input or option, what was
    expected and what was found."""

    def __init__(self, layer, what: str, expected: str, found):
        # kept apart too, so the net builder can say where in the config ``what`` was written
        self.what, self.expected, self.found = what, expected, found
        super().__init__(f"layer {layer.name} ({layer.type}): {what}: expected {expected}, "
                         f"found {found}")


class CheckpointError(MinilmsError, ValueError):
    """A checkpoint that cannot be written or read as one: ``{path}: expected ..., found ...``."""

    def __init__(self, path, expected: str, found, hint: str = ""):
        self.path, self.expected, self.found = str(path), expected, found
        super().__init__(f"{path}: expected {expected}, found {' '.join(str(found).split())}"
                         f"{hint}")


class NoCheckpointError(CheckpointError):
    """Nothing was ever saved at the path (as opposed to something broken being there)."""


class DistributedError(MinilmsError):
    """MPI was asked for but cannot be used (not installed, no thread support)."""


class DivergedError(MinilmsError):
    """Training produced a loss that is NaN or infinite: names the iteration and what to change."""


class TraceError(MinilmsError):
    """A trace file that cannot be read: names the file and what is wrong, in one line."""


def did_you_mean(word, choices) -> str:
    """``"; did you mean 'ReLU'?"`` for ``"Relu"``: the closest choice, ignoring case ("" if none
    is close)."""
    by_lower = {str(c).lower(): c for c in choices if c != word}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""
