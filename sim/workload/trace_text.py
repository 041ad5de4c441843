"""Reading a trace file as text: decoding, line limits, CSV rows and JSON objects.

Every trace format is a stream of lines. This module turns an open binary file into
``(1-based line number, text)`` pairs, refusing binary and wrongly encoded files with a message
that says what the file is and how to convert it, and turns those lines into CSV rows or JSON
objects. Errors are :class:`TraceFormatError` naming the file, the line and the column or field,
built by :meth:`TraceSource.error`. The formats themselves live in
:mod:`sim.workload.trace_formats`; :mod:`sim.workload.traces` is the public entry point.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

#: Leading bytes of files people give as traces by mistake, and what to do instead.
_BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "a gzip-compressed file; decompress it first (gunzip FILE)"),
    (b"PK\x03\x04", "a ZIP archive (or .xlsx workbook); extract it or export the sheet as CSV"),
    (b"PAR1", "a Parquet file; convert it to CSV, e.g. pandas.read_parquet(p).to_csv(c)"),
    (b"BZh", "a bzip2-compressed file; decompress it first (bunzip2 FILE)"),
    (b"\xfd7zXZ\x00", "an xz-compressed file; decompress it first (unxz FILE)"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file; decompress it first (unzstd FILE)"),
    (b"\xff\xfe", "UTF-16 text; re-encode it as UTF-8 (iconv -f utf-16 -t utf-8)"),
    (b"\xfe\xff", "UTF-16 text; re-encode it as UTF-8 (iconv -f utf-16 -t utf-8)"),
)


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file, line and column."""


#: How many column or field names an error lists, and how long each may be: a JSON line read
#: as a CSV header is hundreds of "columns", and the message stays one readable line.
MAX_LISTED_NAMES = 12
MAX_LISTED_NAME_CHARS = 40


def listed_names(names: Iterable[object]) -> str:
    """``'a', 'b', 'c'`` for an error message: at most :data:`MAX_LISTED_NAMES` names, each
    cut to :data:`MAX_LISTED_NAME_CHARS` characters, then how many more there are."""
    names = list(names)
    shown = []
    for name in names[:MAX_LISTED_NAMES]:
        text = repr(name)
        if len(text) > MAX_LISTED_NAME_CHARS:
            text = text[: MAX_LISTED_NAME_CHARS - 4] + "...'"
        shown.append(text)
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more else "")


class TraceSource:
    """The file being read: its name as the caller gave it, for error messages."""

    def __init__(self, path: Path, field_word: str) -> None:
        self.path = path
        self.name = str(path)
        self.field_word = field_word

    @property
    def salt(self) -> int:
        """A stable number for this file's name, to keep its private content ids apart."""
        digest = hashlib.blake2b(self.path.name.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1

    def error(self, line: int | None, column: str | None, message: str) -> TraceFormatError:
        """The error to raise for ``message`` at ``line`` (1-based) and ``column``, if known."""
        where = self.name if line is None else f"{self.name}:{line}"
        what = "" if column is None else f"{self.field_word} {column!r}: "
        return TraceFormatError(f"{where}: {what}{message}")


def text_lines(
    source: TraceSource, handle: BinaryIO, max_line_bytes: int
) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) pairs; bad UTF-8 names the line and byte offset.

    Binary files are refused on their first line, by signature (none of them contains a newline
    byte, so the first line holds it) or by NUL bytes, which no text trace contains. A line
    longer than ``max_line_bytes`` is refused before it is read whole into memory.
    """
    offset = 0
    number = 0
    while raw := handle.readline(max_line_bytes + 1):
        number += 1
        if len(raw) > max_line_bytes:
            raise source.error(
                number,
                None,
                f"line longer than {max_line_bytes // 2**20} MiB; a trace has one request per "
                "line: is this a binary file?",
            )
        if number == 1:
            for signature, what in _BINARY_SIGNATURES:
                if raw.startswith(signature):
                    raise source.error(None, None, f"not a text trace: this is {what}")
        nul = raw.find(b"\x00")
        if nul >= 0:
            raise source.error(
                number,
                None,
                f"NUL byte at byte offset {offset + nul}: a binary file or "
                "UTF-16 text without a byte-order mark; give a UTF-8 CSV or JSONL file "
                "(iconv -f utf-16le -t utf-8 for UTF-16)",
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            bad_offset = offset + error.start
            raise source.error(
                number,
                None,
                f"byte 0x{raw[error.start]:02x} at byte offset {bad_offset} is not valid UTF-8; "
                "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
            ) from None
        if number == 1 and text.startswith("\ufeff"):
            text = text[1:]
        offset += len(raw)
        yield number, text


def csv_header(source: TraceSource, line: int, text: str) -> list[str]:
    """The column names of a CSV header line, stripped of surrounding spaces."""
    try:
        row = next(csv.reader([text]), [])
    except csv.Error as error:
        raise source.error(line, None, f"malformed CSV header: {error}") from None
    return [name.strip() for name in row]


def csv_records(
    source: TraceSource,
    lines: Iterable[tuple[int, str]],
    required: tuple[str, ...],
    optional: tuple[str, ...],
) -> Iterator[tuple[int, dict[str, str]]]:
    """Data rows as {column: cell} for the named columns present, with their line numbers."""
    reader = csv.reader(text for _, text in lines)
    wanted: list[tuple[str, int]] | None = None
    width = 0
    try:
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if wanted is None:
                names = [name.strip() for name in row]
                missing = [name for name in required if name not in names]
                if missing:
                    raise source.error(
                        line,
                        None,
                        f"missing required column(s) {', '.join(map(repr, missing))}; "
                        f"columns found: {listed_names(names)}",
                    )
                wanted = [
                    (name, names.index(name)) for name in (*required, *optional) if name in names
                ]
                width = len(names)
                continue
            if len(row) != width:
                raise source.error(
                    line,
                    None,
                    f"expected {width} comma-separated values as in the header, got {len(row)}",
                )
            yield line, {name: row[index] for name, index in wanted}
    except csv.Error as error:
        raise source.error(reader.line_num, None, f"malformed CSV: {error}") from None


def parse_json_line(source: TraceSource, line: int, text: str) -> dict[str, object]:
    """The JSON object on one line; anything else (malformed JSON, a list) is refused."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise source.error(
            line, None, f"malformed JSON at character {error.colno}: {error.msg}"
        ) from None
    if not isinstance(record, dict):
        raise source.error(
            line, None, f"expected one JSON object per line, got {type(record).__name__}"
        )
    return record


def json_records(
    source: TraceSource, lines: Iterable[tuple[int, str]]
) -> Iterator[tuple[int, dict[str, object]]]:
    """One JSON object per non-blank line, with its line number."""
    for line, text in lines:
        if text.strip():
            yield line, parse_json_line(source, line, text)


def required_field(source: TraceSource, line: int, record: dict[str, object], key: str) -> object:
    """``record[key]``, or an error listing the fields the line does have."""
    try:
        return record[key]
    except KeyError:
        raise source.error(
            line,
            None,
            f"missing required field {key!r}; fields found: {listed_names(record)}",
        ) from None
