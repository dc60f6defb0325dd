"""The YAML side of run configs (``minilms.config``): a loader that composes nodes and builds only
plain values, each key and list item keeping its line and column (``Origin``); a dumper whose output
loads back the same; and the one-line errors, located in the file, for everything YAML can get
wrong (syntax, tags, self-reference, duplicate keys, too many values).
"""
import re

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..errors import ConfigError, did_you_mean

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_TAG = "tag:yaml.org,2002:"
_PLAIN_SCALARS = {_TAG + name for name in ("str", "int", "float", "bool", "null")}
_COLLECTIONS = {_TAG + "map", _TAG + "seq"}
MAX_VALUES = 100_000        # a few aliases can expand to billions of values ("billion laughs")


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3``, ``5e4``, ``-2E-5`` as floats."""


class ConfigDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings ConfigLoader reads as floats, and never writes aliases."""

    def ignore_aliases(self, data):
        return True


def _represent_list(dumper, data):
    # short lists of numbers read best on one line ([0.9, 0.999]); lists of layers do not
    flow = all(not isinstance(item, (list, dict)) for item in data)
    return dumper.represent_sequence(_TAG + "seq", data, flow_style=flow)


def _represent_str(dumper, data):
    # YAML counts NEL and the Unicode line/paragraph separators as line breaks: in a plain or
    # single-quoted scalar PyYAML folds them away, so such strings go double-quoted (escaped).
    style = '"' if any(c in data for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar(_TAG + "str", data, style=style)


class LayerMap(dict):
    """A layer mapping, written on one line like the configs in the docs."""


ConfigDumper.add_representer(list, _represent_list)
ConfigDumper.add_representer(str, _represent_str)
ConfigDumper.add_representer(
    LayerMap, lambda dumper, data: dumper.represent_mapping(_TAG + "map", data, flow_style=True))
for _cls in (ConfigLoader, ConfigDumper):   # on these classes only: yaml's own stay YAML 1.1
    _cls.add_implicit_resolver(_TAG + "float", _EXPONENT_FLOAT, list("-+0123456789."))


def printable(text: str) -> str:
    """``text`` with each character that would not show as itself escaped the way ``repr`` does
    (``lr\\u200b``, ``\\xa0``, ``\\t``): a key with a zero-width or no-break space then looks
    different from the key it imitates, and a line break in a name cannot split a one-line
    message. Idempotent: what it writes is printable."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def config_error(where: str, key: str, expected: str, found, hint: str = "", found_text: str = ""):
    """A ConfigError; ``found_text`` words a finding that is a description, not a value."""
    error = ConfigError(key, expected, found, where or None, hint)
    if found_text or not key:
        parts = [part for part in (where, key) if part]
        error.args = (": ".join(parts + [f"expected {expected}, found "
                                         f"{found_text or repr(found)}{hint}"]),)
    error.args = (printable(str(error)),)
    return error


def unknown_key(where: str, key: str, known, name_key: bool = True):
    word = key.rsplit(".", 1)[-1]
    hint = did_you_mean(word, known) or f"; known keys: {', '.join(known)}"
    error = ConfigError(key, "a known key", word, where, hint)
    error.args = (printable(f"{where}: {key + ': ' if name_key else ''}unknown key{hint}"),)
    return error


def join_key(path: str, segment) -> str:
    if isinstance(segment, int):
        return f"{path}[{segment}]"
    return f"{path}.{segment}" if path else segment


def _parent(path: str) -> str:
    return path[:max(path.rfind("."), path.rfind("["), 0)]


_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\[\d+\])*(?:\.[A-Za-z_][\w-]*(?:\[\d+\])*)*")
_SEGMENT = re.compile(r"([A-Za-z_][\w-]*)|\[(\d+)\]")


def split_key(path: str) -> list | None:
    """``"model.layers[3].type"`` -> ``["model", "layers", 3, "type"]``; None if malformed."""
    if not _PATH.fullmatch(path):
        return None
    return [name or int(index) for name, index in _SEGMENT.findall(path)]


class Origin:
    """Where each value came from. ``marks`` maps the path of every key and list item written in
    the file to its 1-based (line, column); ``value_marks`` does the same for scalar values, which
    is where an error about the value points; ``overrides`` maps a path to the override that set it,
    and ``written`` each scalar an override set to ``(text as written, value YAML read)``: an error
    shows the text where YAML changed it (``yes`` read as true), there being no line to look at.
    """

    def __init__(self, file: str):
        self.file, self.marks, self.value_marks, self.overrides = file, {}, {}, {}
        self.written: dict = {}
        self.values: dict = {}      # the resolved config, once there is one

    def locate(self, path: str, at_value: bool = True, overrides: bool = True) -> str:
        """``FILE:LINE:COL`` of ``path`` or, if it was not written, of the nearest key above it."""
        node = path
        while True:
            if node in self.overrides:
                return self.overrides[node] if overrides else self.file
            if node in self.marks:
                pointed = self.value_marks if at_value and node == path else self.marks
                line, column = pointed.get(node, self.marks[node])
                return f"{self.file}:{line}:{column}"
            if not node:
                return self.file
            node = _parent(node)

    def overridden(self, path: str, source: str, written: dict) -> None:
        """``path`` was set by the override ``source``; ``written``: its scalars' texts."""
        self.overrides[path] = source
        below = (path + ".", path + "[")
        for mark in [p for p in self.marks if p == path or p.startswith(below)]:
            del self.marks[mark]
            self.value_marks.pop(mark, None)
        for earlier in [p for p in self.written if p == path or p.startswith(below)]:
            del self.written[earlier]
        self.written.update(written)


class _Converter:
    """Plain Python values from a composed node, recording marks in ``origin`` (for a file), or
    in ``written`` each scalar's text and value (for an override)."""

    def __init__(self, loader, label: str, origin: Origin | None, written: dict | None = None):
        self.loader, self.label, self.origin, self.budget = loader, label, origin, MAX_VALUES
        self.written = written
        self.inside: set = set()      # ids of the collections being converted: an alias cycle

    def where(self, node) -> str:
        if self.origin is None:
            return self.label
        return f"{self.label}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def value(self, node, path: str):
        self.budget -= 1
        if self.budget < 0:
            raise config_error(self.label, path, f"at most {MAX_VALUES} values", None,
                         found_text="more (aliases that expand without end?)")
        if id(node) in self.inside:
            raise config_error(self.where(node), path, "a value that does not contain itself", None,
                         found_text="an alias to a collection around it")
        if isinstance(node, (MappingNode, SequenceNode)) and node.tag in _COLLECTIONS:
            self.inside.add(id(node))
            try:
                if isinstance(node, MappingNode):
                    return self.mapping(node, path)
                return [self.item(item, join_key(path, i)) for i, item in enumerate(node.value)]
            finally:
                self.inside.discard(id(node))
        if isinstance(node, ScalarNode) and node.tag == _TAG + "timestamp":
            return node.value       # a date is just text to a config (a run name, say)
        if isinstance(node, ScalarNode) and node.tag in _PLAIN_SCALARS:
            try:
                value = self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError):      # e.g. !!int abc
                pass
            else:
                if self.written is not None:
                    start, end = node.start_mark, node.end_mark
                    self.written[path] = (start.buffer[start.pointer:end.pointer], value)
                return value
        raise config_error(self.where(node), path, "a plain YAML value (no tags)", None,
                     found_text=f"{node.tag.replace(_TAG, '!!')} {node.value!r}"
                     if isinstance(node, ScalarNode) else node.tag.replace(_TAG, "!!"))

    def item(self, node, path: str):
        if self.origin is not None:
            self.origin.marks[path] = _position(node)
        return self.value(node, path)

    def mapping(self, node, path: str) -> dict:
        written_here = {id(key) for key, _ in node.value}
        try:
            self.loader.flatten_mapping(node)     # merge keys (<<: *defaults) come first
        except yaml.YAMLError as error:
            raise config_error(self.where(node), path, "a valid merge (<<)", None,
                         found_text=getattr(error, "problem", "") or "something else") from None
        result, line_of = {}, {}     # line_of: keys spelt out here (a merged key may be replaced)
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str":
                raise config_error(self.where(key_node), path or "(top level)", "text keys (quote "
                             "keys like on, no, 1 or null)", None, found_text=f"the key {key!r}")
            here = join_key(path, key)
            if id(key_node) in written_here:
                if key in line_of:
                    raise config_error(self.where(key_node), here, "each key once", None,
                                 found_text=f"it again (first at line {line_of[key]})")
                line_of[key] = key_node.start_mark.line + 1
            if self.origin is not None:
                self.origin.marks[here] = _position(key_node)
                if isinstance(value_node, ScalarNode):
                    self.origin.value_marks[here] = _position(value_node)
            result[key] = self.value(value_node, here)
        return result


_BUT_FOUND = re.compile(r"expected (.*), but (?:found|got) (.*)", re.S)


def _position(node) -> tuple:
    return node.start_mark.line + 1, node.start_mark.column + 1


def compose(text: str, label: str, origin: Origin | None, path: str = "",
            written: dict | None = None):
    """The value in ``text`` (at key ``path``), or ``...`` (Ellipsis) when there is none.
    ``written`` (for an override) receives each scalar's text and value by key path."""
    loader = None
    try:
        loader = ConfigLoader(text)     # already reads: a NUL byte fails here
        node = loader.get_single_node()
        return Ellipsis if node is None else \
            _Converter(loader, label, origin, written).value(node, path)
    except yaml.YAMLError as error:
        raise _syntax_error(error, text, label, origin is not None) from None
    except RecursionError:
        raise config_error(label, "", "valid YAML nested a few hundred levels at most", None,
                     found_text="deeper nesting") from None
    finally:
        if loader is not None:
            loader.dispose()


def _syntax_error(error: yaml.YAMLError, text: str, label: str, with_lines: bool) -> ConfigError:
    """PyYAML's problem and position, reworded into one ``expected ..., found ...`` line. The
    position is where the problem was found, unless that is the end of the text: an unclosed
    quote or bracket runs to the end, so the cause is where it opened (PyYAML's context mark)."""
    mark = getattr(error, "problem_mark", None)
    context_mark = getattr(error, "context_mark", None)
    at_end = mark is not None and not text[mark.index:].strip()
    if at_end and context_mark is not None:
        mark = context_mark
    if isinstance(error, yaml.reader.ReaderError):
        line = text.count("\n", 0, error.position)
        column = error.position - (text.rfind("\n", 0, error.position) + 1)
        mark = yaml.Mark(label, error.position, line, column, None, None)
        found = (f"character #x{error.character:04x} ({error.reason})"
                 if isinstance(error.character, int) else f"{error.character!r} ({error.reason})")
    else:
        found = getattr(error, "problem", None) or str(error)
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark and with_lines else label
    expected, context = "valid YAML", getattr(error, "context", None) or ""
    # PyYAML words some problems as "expected X, but found Y", sometimes split over two fields
    if found.startswith("but found ") and context.startswith("expected "):
        expected, found = f"valid YAML ({context[9:]})", found[10:]
    elif match := _BUT_FOUND.fullmatch(found):
        expected, found = f"valid YAML ({match.group(1)})", match.group(2)
    elif at_end and "quoted scalar" in context:
        expected = "valid YAML (a closing quote" + (
            " for the quoted text that starts here)" if with_lines else ")")
        found = f"the end of the {'file' if with_lines else 'value'}"
    found = found.removeprefix("found ")
    return config_error(where, "", expected, None, found_text=" ".join(found.split()))
