"""Reading a JSON or YAML file, with one line that names the path and the problem on failure.

:func:`read_document` is what every command uses to read a small data file (a sweep, a
metadata stamp, a model's ``config.json``): it raises :class:`DocumentError`, a ValueError whose
message is ``PATH: PROBLEM`` — the file is missing or not a file, cannot be read, is not UTF-8,
is not valid JSON/YAML (with the parser's line and column), or its top level is not the type
asked for. YAML is read with ``yaml.safe_load`` only. Scenario files are not read here:
:mod:`sim.scenario` reports their problems with its own ``file:line:column`` messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import yaml

T = TypeVar("T")

#: How a document is parsed: by name (``auto``: ``.json`` files as JSON, others as YAML).
Format = Literal["auto", "json", "yaml"]

#: The most bytes of YAML any reader takes (scenario, sweep, upload): these are hand-written
#: configuration files of a few kilobytes; traces are CSV or JSONL and never read as YAML.
MAX_YAML_BYTES = 16 * 1024 * 1024
#: How deep mappings and lists may nest. A scenario nests five levels; PyYAML composes nodes
#: recursively, so 100,000 nested ``[`` end in a RecursionError instead of an error message.
MAX_YAML_DEPTH = 64
#: The most aliases (``*name``) a document may use: each stands for a whole subtree, so a few
#: dozen nested ones expand to billions of nodes for whatever walks the result ("billion
#: laughs").
MAX_YAML_ALIASES = 256
#: How deep a JSON document may nest before the reader gives up with a message.
MAX_JSON_DEPTH = 512


def yaml_limit_problem(text: str) -> str | None:
    """What makes ``text`` too large, too deep or too aliased to parse safely, or None.

    Reads the document as a stream of events (PyYAML's parser keeps its own stack, so this
    never recurses) and stops at the first limit crossed; a syntax error is left to the loader.
    """
    size = len(text.encode("utf-8"))
    if size > MAX_YAML_BYTES:
        return f"{size:,} bytes is more than the {MAX_YAML_BYTES:,} a YAML document may hold"
    depth = aliases = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    return (
                        f"nested more than {MAX_YAML_DEPTH} levels deep (line {line}); a "
                        "scenario needs about five"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    return f"more than {MAX_YAML_ALIASES} aliases (*name); write the values out"
    except yaml.YAMLError:
        return None  # the loader reports it with its line and column
    return None


def safe_load_limited(text: str) -> Any:
    """``yaml.safe_load`` of ``text`` within the size, depth and alias limits; ValueError
    naming the limit crossed, ``yaml.YAMLError`` for a syntax error."""
    problem = yaml_limit_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return yaml.safe_load(text)


class DocumentError(ValueError):
    """A file could not be read as a document; ``str()`` is ``PATH: PROBLEM`` on one line.

    ``path`` and ``problem`` are kept apart so a caller can word its own message, and
    ``missing`` says the file does not exist (a caller may treat that case differently).
    """

    def __init__(self, path: Path, problem: str, *, missing: bool = False) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
        self.missing = missing


def read_text(path: str | Path) -> str:
    """The file's text decoded as UTF-8 (a byte-order mark is dropped).

    Raises :class:`DocumentError` when it does not exist, is a directory or other non-file,
    cannot be read, or is not UTF-8 (naming the first bad byte and its line).
    """
    path = Path(path)
    if path.is_dir():
        raise DocumentError(path, "is a directory, not a file")
    if path.exists() and not path.is_file():
        raise DocumentError(path, "not a regular file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DocumentError(path, "file not found", missing=True) from None
    except OSError as exc:
        raise DocumentError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DocumentError(
            path,
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte offset {exc.start}, line {line})",
        ) from None


@overload
def read_document(path: str | Path, *, format: Format = "auto", expect: None = None) -> Any: ...


@overload
def read_document(path: str | Path, *, format: Format = "auto", expect: type[T]) -> T: ...


def read_document(
    path: str | Path, *, format: Format = "auto", expect: type[Any] | None = None
) -> Any:
    """The parsed contents of a JSON or YAML file.

    ``format`` picks the parser (``auto``: JSON for a ``.json`` name, YAML otherwise). With
    ``expect`` (``dict`` or ``list``, say) the top level must be of that type. Every failure is
    a :class:`DocumentError` (a ValueError) with a one-line ``PATH: PROBLEM`` message; a syntax
    error carries the parser's line and column.
    """
    path = Path(path)
    text = read_text(path)
    as_json = format == "json" or (format == "auto" and path.suffix.lower() == ".json")
    data = _parse_json(path, text) if as_json else _parse_yaml(path, text)
    if expect is not None and not isinstance(data, expect):
        raise DocumentError(
            path,
            f"expected {_describe(expect, as_json)} at the top level, "
            f"got {_describe(type(data), as_json) if data is not None else 'nothing'}",
        )
    return data


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(
            path, f"not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})"
        ) from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise DocumentError(path, "nested too deeply to read as JSON") from None


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        return safe_load_limited(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(str(exc.problem or exc.context or "syntax error").split())
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise DocumentError(path, f"not valid YAML{where} ({what})") from None
    except yaml.YAMLError as exc:
        raise DocumentError(path, f"not valid YAML ({' '.join(str(exc).split())})") from None
    except ValueError as exc:  # a limit of safe_load_limited
        raise DocumentError(path, f"not read as YAML: {exc}") from None


_NAMES: dict[type[Any], tuple[str, str]] = {
    dict: ("a JSON object", "a mapping"),
    list: ("a JSON array", "a list"),
    str: ("a JSON string", "a string"),
    bool: ("a JSON boolean", "a boolean"),
    int: ("a JSON number", "an integer"),
    float: ("a JSON number", "a number"),
}


def _describe(kind: type[Any], as_json: bool) -> str:
    names = _NAMES.get(kind)
    if names is None:
        return f"a {kind.__name__}"
    return names[0] if as_json else names[1]
