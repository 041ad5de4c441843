"""Readers for public LLM-inference trace files, producing a columnar :class:`Trace`.

A trace gives, per request in arrival order, the prompt and output lengths, the arrival time when
the file has one, and, when the file carries it, the identity of the prompt's content as
segments (see :mod:`sim.engine.request`) so that the prefix cache hits where the real system's
did. The workload builder turns a :class:`Trace` into requests; nothing here assigns request ids.

Formats (``read_trace(path, format)``; ``"auto"`` detects them from the first line):

``azure``
    Azure LLM inference trace 2023 CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
    timestamps like ``2023-11-16 18:15:46.6805900`` (up to 9 fractional digits, parsed exactly
    in integer nanoseconds).
``mooncake``
    Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
    (one id per 512-token prompt block). Segment *i* is ``(source_id(TRACE_BLOCK, hash_ids[i]),
    512)``; the last one is shortened so that the segments sum to ``input_length``.
``vidur``
    Vidur/Splitwise processed CSV: ``num_prefill_tokens,num_decode_tokens`` and optionally
    ``arrived_at`` (seconds). Without ``arrived_at`` the trace is length-only; other columns
    (``num_total_tokens``, ``pd_ratio``) are ignored.
``llmservingsim``
    LLMServingSim JSONL: ``input_toks``, ``output_toks``, ``arrival_time_ns``, ``input_tok_ids``
    (``output_tok_ids`` is ignored). The token ids are cut into pieces of 16; piece *i* becomes
    the segment ``(source_id(TOKEN_IDS, h_i), len(piece))`` where ``h_i`` is a chained hash of
    every token id up to the end of piece *i*, so equal leading pieces mean an equal prefix.
``servesim_jsonl``
    Our own JSONL, one object per line::

        {"arrival_s": 0.25, "prompt_tokens": 700, "output_tokens": 120,
         "session_id": 3, "hash_ids": [11, 12], "block_tokens": 512}

    ``prompt_tokens`` and ``output_tokens`` (integers >= 1) are required. ``arrival_s``
    (seconds, any finite number) is optional, but all lines have it or none do (none: a
    length-only trace). ``session_id`` (integer >= -1) is optional per line; absent or ``null``
    means unknown (-1), and ``Trace.session_ids`` is None when no line has one. ``hash_ids``
    (alias ``block_keys``) is a list of integer content ids, one per ``block_tokens``-token block
    of the prompt (``block_tokens`` defaults to 16), read like Mooncake's; all lines have it or
    none do.
``servesim_csv``
    Our own CSV with a header: ``prompt_tokens,output_tokens`` required, ``arrival_s`` and
    ``session_id`` optional columns (an empty ``session_id`` cell means -1). No block ids.

Rules common to all formats:

* Files are read as a stream of lines (UTF-8, an optional BOM is skipped) into compact arrays,
  so memory stays near the size of the result; ``max_requests`` stops after that many requests
  in file order, without reading further (so arrivals are sorted among those only). Blank lines
  are skipped. Unknown columns and fields are ignored.
* Bad input raises :class:`TraceFormatError` naming the file, the 1-based line (as an editor
  shows it) and the column or field: missing required columns or fields, lengths that are not
  integers >= 1 (zero lengths are rejected too, since every request needs a prompt token and an
  output token), timestamps that are not finite numbers within the int64 range or that span
  more than a float can hold, malformed JSON or CSV lines, bytes that are not UTF-8 (UTF-16 and
  compressed or binary files such as gzip, zip/xlsx or Parquet are recognised and named, with
  how to convert them), NUL bytes, lines over :data:`MAX_LINE_BYTES`, and a file with no
  requests (empty, blank or header only).
* Arrival times are shifted so that the first request arrives at 0.0. Timestamps that go
  backwards are sorted (stably, so simultaneous arrivals keep file order) with a
  :class:`TraceWarning` saying how many requests arrived earlier than the one on the line before:
  a replay needs arrival order, and real traces merged from several frontends are sometimes
  slightly out of order. Duplicate timestamps are simultaneous arrivals and are kept.
* Block ids that do not match the prompt length (``len(hash_ids) != ceil(prompt / block)``)
  trust the length: extra ids are dropped, and prompt tokens not covered by any id become one
  segment of content private to that request. A :class:`TraceWarning` reports how many rows
  were adjusted. (The shipped Mooncake traces have no such rows.)
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import re
import warnings
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from sim.engine.request import Segment, SourceNamespace, source_id

TRACE_FORMATS: tuple[str, ...] = (
    "azure",
    "mooncake",
    "vidur",
    "servesim_jsonl",
    "servesim_csv",
    "llmservingsim",
)

#: Tokens per entry of Mooncake's ``hash_ids``.
MOONCAKE_BLOCK_TOKENS = 512
#: Default tokens per block id in servesim JSONL files.
DEFAULT_BLOCK_TOKENS = 16
#: Token ids per segment when a trace carries exact token ids (vLLM's default block size).
TOKEN_ID_PIECE_TOKENS = 16

_CSV_FORMATS = frozenset({"azure", "vidur", "servesim_csv"})
_JSON_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
_CSV_SUFFIXES = frozenset({".csv"})
_INT64_MAX = 2**63 - 1

#: The longest line read; a longer one is not a trace line (a binary file without newlines)
#: and would otherwise be read whole into memory. A 128k-token prompt of token ids is ~1 MiB.
MAX_LINE_BYTES = 64 * 2**20

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

#: The columns or fields a format requires; ``detect_format`` recognises a format by them, so
#: detection and the "missing column" errors agree. CSV formats first, then JSONL formats.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("num_prefill_tokens", "num_decode_tokens"),
    "servesim_csv": ("prompt_tokens", "output_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "llmservingsim": ("input_toks", "output_toks", "arrival_time_ns", "input_tok_ids"),
    "servesim_jsonl": ("prompt_tokens", "output_tokens"),
}

_TIMESTAMP_PATTERN = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
)
_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file, line and column."""


class TraceWarning(UserWarning):
    """A trace was readable but had to be adjusted (reordered arrivals, block ids trimmed)."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests read from a trace file, in arrival order, before ids are assigned.

    ``arrival_s`` is in seconds from the first request (which arrives at 0.0) and never
    decreases; it is None for length-only files. ``segments[i]`` describes request *i*'s prompt
    content, its lengths summing to ``prompt_tokens[i]``; None when the file does not say what
    the prompts contain. ``session_ids`` is -1 where unknown and None if the format has none.
    The arrays are read-only.
    """

    path: str
    format: str
    arrival_s: npt.NDArray[np.float64] | None
    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    segments: list[tuple[Segment, ...]] | None
    session_ids: npt.NDArray[np.int64] | None

    def __post_init__(self) -> None:
        num_requests = len(self.prompt_tokens)
        assert len(self.output_tokens) == num_requests
        assert self.arrival_s is None or len(self.arrival_s) == num_requests
        assert self.segments is None or len(self.segments) == num_requests
        assert self.session_ids is None or len(self.session_ids) == num_requests

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# --------------------------------------------------------------------------------------------
# Public entry points


def read_trace(path: str | Path, format: str = "auto", *, max_requests: int | None = None) -> Trace:
    """Read a trace file of one of :data:`TRACE_FORMATS` (``"auto"``: :func:`detect_format`).

    Reads at most ``max_requests`` requests, the first ones in file order. Raises
    :class:`TraceFormatError` for unreadable content and warns with :class:`TraceWarning` when
    arrivals had to be sorted or block ids trimmed (see the module docstring for every rule).
    """
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be >= 1 or None, got {max_requests}")
    path = Path(path)
    trace_format = detect_format(path) if format == "auto" else format
    if trace_format not in TRACE_FORMATS:
        raise ValueError(
            f"unknown trace format {format!r}; use 'auto' or one of {', '.join(TRACE_FORMATS)}"
        )
    source = _Source(path, "column" if trace_format in _CSV_FORMATS else "field")
    with path.open("rb") as handle:
        lines = _text_lines(source, handle)
        match trace_format:
            case "azure":
                columns = _read_azure(source, lines, max_requests)
            case "vidur":
                columns = _read_vidur(source, lines, max_requests)
            case "servesim_csv":
                columns = _read_servesim_csv(source, lines, max_requests)
            case "mooncake":
                columns = _read_mooncake(source, lines, max_requests)
            case "llmservingsim":
                columns = _read_llmservingsim(source, lines, max_requests)
            case "servesim_jsonl":
                columns = _read_servesim_jsonl(source, lines, max_requests)
            case _:
                raise AssertionError(trace_format)
    return _finish(source, trace_format, columns)


def detect_format(path: str | Path) -> str:
    """The trace format of ``path``, from its extension and its header or first JSON object.

    A ``.jsonl``/``.ndjson``/``.json`` file, or any file whose first line starts with ``{``, is
    matched on the first object's keys; anything else on its CSV header. Raises
    :class:`TraceFormatError` listing the known formats when nothing matches.
    """
    path = Path(path)
    source = _Source(path, "column")
    with path.open("rb") as handle:
        first = next(
            ((line, text) for line, text in _text_lines(source, handle) if text.strip()), None
        )
    if first is None:
        raise source.error(None, None, "empty file: no requests")
    line, text = first
    is_json = path.suffix.lower() in _JSON_SUFFIXES or (
        path.suffix.lower() not in _CSV_SUFFIXES and text.lstrip().startswith("{")
    )
    if is_json:
        record = _parse_json_line(source, line, text)
        found = list(record)
        candidates = ("mooncake", "llmservingsim", "servesim_jsonl")
        found_word = "keys"
    else:
        found = _csv_header(source, line, text)
        candidates = ("azure", "vidur", "servesim_csv")
        found_word = "columns"
    for candidate in candidates:
        if set(_REQUIRED[candidate]) <= set(found):
            return candidate
    known = "; ".join(f"{name} ({', '.join(_REQUIRED[name])})" for name in _REQUIRED)
    raise source.error(
        line,
        None,
        f"cannot detect the trace format from the {found_word} {', '.join(map(repr, found))}; "
        f"known formats and what they need: {known}. Pass format= explicitly if the file is one "
        "of these.",
    )


# --------------------------------------------------------------------------------------------
# Format readers: each fills _Columns from a stream of (line number, text) pairs.


def _read_azure(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    columns = _Columns(has_arrival=True)
    first_ns: int | None = None
    for line, row in _csv_records(source, lines, _REQUIRED["azure"], ()):
        timestamp_ns = _timestamp_ns(source, line, "TIMESTAMP", row["TIMESTAMP"])
        if first_ns is None:
            first_ns = timestamp_ns
        # Differences of integer nanoseconds are exact; only the final division rounds.
        columns.add_arrival((timestamp_ns - first_ns) / 1e9)
        columns.add_lengths(
            _count(source, line, "ContextTokens", row["ContextTokens"]),
            _count(source, line, "GeneratedTokens", row["GeneratedTokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns


def _read_vidur(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    records = _csv_records(source, lines, _REQUIRED["vidur"], ("arrived_at",))
    columns: _Columns | None = None
    for line, row in records:
        if columns is None:
            columns = _Columns(has_arrival="arrived_at" in row)
        if columns.arrival_s is not None:
            columns.add_arrival(_time_value(source, line, "arrived_at", row["arrived_at"]))
        columns.add_lengths(
            _count(source, line, "num_prefill_tokens", row["num_prefill_tokens"]),
            _count(source, line, "num_decode_tokens", row["num_decode_tokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns if columns is not None else _Columns(has_arrival=False)


def _read_servesim_csv(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    records = _csv_records(source, lines, _REQUIRED["servesim_csv"], ("arrival_s", "session_id"))
    columns: _Columns | None = None
    for line, row in records:
        if columns is None:
            columns = _Columns(has_arrival="arrival_s" in row, has_sessions="session_id" in row)
        if columns.arrival_s is not None:
            columns.add_arrival(_time_value(source, line, "arrival_s", row["arrival_s"]))
        if columns.session_ids is not None:
            cell = row["session_id"]
            columns.add_session(
                -1 if not cell.strip() else _session(source, line, "session_id", cell)
            )
        columns.add_lengths(
            _count(source, line, "prompt_tokens", row["prompt_tokens"]),
            _count(source, line, "output_tokens", row["output_tokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns if columns is not None else _Columns(has_arrival=False)


def _read_mooncake(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    columns = _Columns(has_arrival=True, has_segments=True)
    first_ms: int | float | None = None
    for line, record in _json_records(source, lines):
        timestamp_ms = _time_value(
            source, line, "timestamp", _get(source, line, record, "timestamp")
        )
        if first_ms is None:
            first_ms = timestamp_ms
        columns.add_arrival((timestamp_ms - first_ms) / 1000)
        prompt_tokens = _count(
            source, line, "input_length", _get(source, line, record, "input_length")
        )
        columns.add_lengths(
            prompt_tokens,
            _count(source, line, "output_length", _get(source, line, record, "output_length")),
        )
        hash_ids = _int_list(source, line, "hash_ids", _get(source, line, record, "hash_ids"))
        columns.add_block_segments(source, line, hash_ids, prompt_tokens, MOONCAKE_BLOCK_TOKENS)
        if columns.is_full(max_requests):
            break
    return columns


def _read_llmservingsim(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    columns = _Columns(has_arrival=True, has_segments=True)
    first_ns: int | float | None = None
    for line, record in _json_records(source, lines):
        arrival_ns = _time_value(
            source, line, "arrival_time_ns", _get(source, line, record, "arrival_time_ns")
        )
        if first_ns is None:
            first_ns = arrival_ns
        columns.add_arrival((arrival_ns - first_ns) / 1e9)
        prompt_tokens = _count(source, line, "input_toks", _get(source, line, record, "input_toks"))
        columns.add_lengths(
            prompt_tokens,
            _count(source, line, "output_toks", _get(source, line, record, "output_toks")),
        )
        token_ids = _int_list(
            source, line, "input_tok_ids", _get(source, line, record, "input_tok_ids")
        )
        if len(token_ids) != prompt_tokens:
            # The ids are the prompt; a count that disagrees means a corrupt row, not a rule
            # we could guess (the shipped file has no such rows).
            raise source.error(
                line,
                "input_tok_ids",
                f"has {len(token_ids)} token ids but 'input_toks' is {prompt_tokens}",
            )
        columns.add_segments(_token_id_segments(token_ids))
        if columns.is_full(max_requests):
            break
    return columns


def _read_servesim_jsonl(
    source: _Source, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> _Columns:
    columns: _Columns | None = None
    first_line = 0
    for line, record in _json_records(source, lines):
        block_key = "hash_ids" if "hash_ids" in record else "block_keys"
        if "hash_ids" in record and "block_keys" in record:
            raise source.error(line, None, "has both 'hash_ids' and 'block_keys'; keep one")
        if columns is None:
            first_line = line
            columns = _Columns(
                has_arrival="arrival_s" in record,
                has_segments=block_key in record,
                has_sessions=True,
            )
        _check_all_or_none(
            source, line, record, "arrival_s", columns.arrival_s is not None, first_line
        )
        _check_all_or_none(
            source, line, record, block_key, columns.segments is not None, first_line
        )
        if columns.arrival_s is not None:
            columns.add_arrival(_time_value(source, line, "arrival_s", record["arrival_s"]))
        prompt_tokens = _count(
            source, line, "prompt_tokens", _get(source, line, record, "prompt_tokens")
        )
        columns.add_lengths(
            prompt_tokens,
            _count(source, line, "output_tokens", _get(source, line, record, "output_tokens")),
        )
        session = record.get("session_id")
        columns.add_session(
            -1 if session is None else _session(source, line, "session_id", session)
        )
        if columns.segments is not None:
            block_tokens = _count(
                source, line, "block_tokens", record.get("block_tokens", DEFAULT_BLOCK_TOKENS)
            )
            block_ids = _int_list(source, line, block_key, record[block_key])
            columns.add_block_segments(source, line, block_ids, prompt_tokens, block_tokens)
        if columns.is_full(max_requests):
            break
    if columns is None:
        return _Columns(has_arrival=False)
    if columns.session_ids is not None and not columns.any_session:
        columns.session_ids = None
    return columns


def _check_all_or_none(
    source: _Source,
    line: int,
    record: dict[str, object],
    key: str,
    expected: bool,
    first_line: int,
) -> None:
    if (key in record) != expected:
        state = "has" if expected else "lacks"
        raise source.error(
            line,
            key,
            f"the first request (line {first_line}) {state} it, so every line must "
            f"{'have' if expected else 'omit'} it",
        )


# --------------------------------------------------------------------------------------------
# Accumulating columns in compact arrays, and turning them into a Trace.


@dataclass(eq=False)
class _Columns:
    """Growing columns: 8 bytes per value, so a large file does not become Python objects."""

    has_arrival: bool
    has_segments: bool = False
    has_sessions: bool = False
    arrival_s: array[float] | None = field(init=False)
    prompt_tokens: array[int] = field(init=False, default_factory=lambda: array("q"))
    output_tokens: array[int] = field(init=False, default_factory=lambda: array("q"))
    segments: list[tuple[Segment, ...]] | None = field(init=False)
    session_ids: array[int] | None = field(init=False)
    any_session: bool = field(init=False, default=False)
    num_adjusted_block_rows: int = field(init=False, default=0)
    first_adjusted_line: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.arrival_s = array("d") if self.has_arrival else None
        self.segments = [] if self.has_segments else None
        self.session_ids = array("q") if self.has_sessions else None

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def is_full(self, max_requests: int | None) -> bool:
        return max_requests is not None and len(self) >= max_requests

    def add_arrival(self, value_s: float) -> None:
        assert self.arrival_s is not None
        self.arrival_s.append(value_s)

    def add_lengths(self, prompt_tokens: int, output_tokens: int) -> None:
        self.prompt_tokens.append(prompt_tokens)
        self.output_tokens.append(output_tokens)

    def add_session(self, session_id: int) -> None:
        assert self.session_ids is not None
        self.session_ids.append(session_id)
        self.any_session = self.any_session or session_id != -1

    def add_segments(self, segments: tuple[Segment, ...]) -> None:
        assert self.segments is not None
        self.segments.append(segments)

    def add_block_segments(
        self,
        source: _Source,
        line: int,
        block_ids: list[int],
        prompt_tokens: int,
        block_tokens: int,
    ) -> None:
        """One segment per block id; the prompt length wins when the two disagree."""
        num_blocks = -(-prompt_tokens // block_tokens)
        used = block_ids[:num_blocks]
        segments = [
            (source_id(SourceNamespace.TRACE_BLOCK, block_id), block_tokens) for block_id in used
        ]
        covered = len(used) * block_tokens
        if covered >= prompt_tokens:
            last_id, _ = segments[-1]
            segments[-1] = (last_id, prompt_tokens - block_tokens * (len(used) - 1))
        else:
            # Tokens no block id describes: content private to this request, so they can never
            # produce a prefix hit the trace did not record.
            private_id = source_id(SourceNamespace.UNIQUE, source.salt, line)
            segments.append((private_id, prompt_tokens - covered))
        if len(block_ids) != num_blocks:
            if self.num_adjusted_block_rows == 0:
                self.first_adjusted_line = line
            self.num_adjusted_block_rows += 1
        self.add_segments(tuple(segments))


def _finish(source: _Source, trace_format: str, columns: _Columns) -> Trace:
    if len(columns) == 0:
        raise source.error(None, None, "no requests (the file is empty or has only a header)")
    prompt_tokens = np.frombuffer(columns.prompt_tokens, dtype=np.int64)
    output_tokens = np.frombuffer(columns.output_tokens, dtype=np.int64)
    session_ids = (
        None if columns.session_ids is None else np.frombuffer(columns.session_ids, dtype=np.int64)
    )
    segments = columns.segments
    arrival_s: npt.NDArray[np.float64] | None = None
    if columns.num_adjusted_block_rows:
        warnings.warn(
            f"{source.name}: {columns.num_adjusted_block_rows} request(s) have a number of block "
            f"ids that does not match their prompt length (first on line "
            f"{columns.first_adjusted_line}); kept the prompt length, dropped extra ids and gave "
            "uncovered tokens private content",
            TraceWarning,
            stacklevel=3,
        )
    if columns.arrival_s is not None:
        arrival_s = np.frombuffer(columns.arrival_s, dtype=np.float64)
        num_out_of_order = int(np.count_nonzero(arrival_s[1:] < arrival_s[:-1]))
        if num_out_of_order:
            order = np.argsort(arrival_s, kind="stable")
            arrival_s = arrival_s[order]
            prompt_tokens = prompt_tokens[order]
            output_tokens = output_tokens[order]
            session_ids = None if session_ids is None else session_ids[order]
            segments = None if segments is None else [segments[i] for i in order]
            warnings.warn(
                f"{source.name}: {num_out_of_order} request(s) arrive earlier than the request "
                "on the line before; sorted all requests by arrival time (stable: equal "
                "timestamps keep file order)",
                TraceWarning,
                stacklevel=3,
            )
        with np.errstate(over="ignore"):
            arrival_s = arrival_s - arrival_s[0]
        if not np.isfinite(arrival_s[-1]):
            raise source.error(
                None,
                None,
                f"the arrival times span more than {np.finfo(np.float64).max:.3g} seconds (the "
                "largest float); check the unit of the arrival column",
            )
    for values in (arrival_s, prompt_tokens, output_tokens, session_ids):
        if values is not None:
            values.flags.writeable = False
    return Trace(
        path=str(source.path),
        format=trace_format,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        segments=segments,
        session_ids=session_ids,
    )


def _token_id_segments(token_ids: list[int]) -> tuple[Segment, ...]:
    """Pieces of 16 token ids, each named by a chained hash of all ids up to its end."""
    segments: list[Segment] = []
    chained = 0
    for start in range(0, len(token_ids), TOKEN_ID_PIECE_TOKENS):
        piece = token_ids[start : start + TOKEN_ID_PIECE_TOKENS]
        # hash() of a tuple of ints is the same in every process (only str hashing is salted).
        chained = hash((chained, *piece))
        segments.append((source_id(SourceNamespace.TOKEN_IDS, chained), len(piece)))
    return tuple(segments)


# --------------------------------------------------------------------------------------------
# Reading lines, CSV rows and JSON objects with positions for error messages.


class _Source:
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
        where = self.name if line is None else f"{self.name}:{line}"
        what = "" if column is None else f"{self.field_word} {column!r}: "
        return TraceFormatError(f"{where}: {what}{message}")


def _text_lines(source: _Source, handle: BinaryIO) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) pairs; bad UTF-8 names the line and byte offset.

    Binary files are refused on their first line, by signature (none of them contains a newline
    byte, so the first line holds it) or by NUL bytes, which no text trace contains.
    """
    offset = 0
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise source.error(
                number,
                None,
                f"line longer than {MAX_LINE_BYTES // 2**20} MiB; a trace has one request per "
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


def _csv_header(source: _Source, line: int, text: str) -> list[str]:
    try:
        row = next(csv.reader([text]), [])
    except csv.Error as error:
        raise source.error(line, None, f"malformed CSV header: {error}") from None
    return [name.strip() for name in row]


def _csv_records(
    source: _Source,
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
                        f"columns found: {', '.join(map(repr, names))}",
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


def _parse_json_line(source: _Source, line: int, text: str) -> dict[str, object]:
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


def _json_records(
    source: _Source, lines: Iterable[tuple[int, str]]
) -> Iterator[tuple[int, dict[str, object]]]:
    for line, text in lines:
        if text.strip():
            yield line, _parse_json_line(source, line, text)


def _get(source: _Source, line: int, record: dict[str, object], key: str) -> object:
    try:
        return record[key]
    except KeyError:
        raise source.error(
            line,
            None,
            f"missing required field {key!r}; fields found: {', '.join(map(repr, record))}",
        ) from None


# --------------------------------------------------------------------------------------------
# Values: each accepts a CSV cell (str) or a JSON value, and names the line and column on error.


def _integer(
    source: _Source, line: int, column: str, value: object, minimum: int, what: str
) -> int:
    number: int | None = None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            # Tools that wrote the column through a float dtype give "12.0".
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            if math.isfinite(as_float) and as_float.is_integer():
                number = int(as_float)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None or number < minimum or number > _INT64_MAX:
        raise source.error(line, column, f"expected {what}, got {value!r}")
    return number


def _count(source: _Source, line: int, column: str, value: object) -> int:
    """A token count: an integer >= 1."""
    return _integer(source, line, column, value, 1, "a positive integer")


def _session(source: _Source, line: int, column: str, value: object) -> int:
    return _integer(source, line, column, value, -1, "an integer >= -1 (-1 = unknown)")


def _time_value(source: _Source, line: int, column: str, value: object) -> int | float:
    """A finite number; ints stay ints so that differences of large timestamps are exact."""
    number: int | float | None = None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                number = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    if number is None or (isinstance(number, float) and not math.isfinite(number)):
        raise source.error(line, column, f"expected a finite number, got {_short(value)}")
    if isinstance(number, int) and abs(number) > _INT64_MAX:
        # Beyond any real clock; and differences of such ints overflow a float.
        raise source.error(
            line, column, f"expected a number within ±{_INT64_MAX}, got {_short(value)}"
        )
    return number


def _int_list(source: _Source, line: int, column: str, value: object) -> list[int]:
    if not isinstance(value, list) or not all(
        type(item) is int and abs(item) <= _INT64_MAX for item in value
    ):
        raise source.error(line, column, f"expected a list of integers, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=1024)
def _days_since_epoch(year: int, month: int, day: int) -> int:
    return date(year, month, day).toordinal() - _UNIX_EPOCH_ORDINAL


def _timestamp_ns(source: _Source, line: int, column: str, value: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fffffffff]`` as integer nanoseconds since 1970 (exact)."""
    match = _TIMESTAMP_PATTERN.fullmatch(value.strip())
    if match is None:
        raise source.error(
            line, column, f"expected a timestamp like '2023-11-16 18:15:46.6805900', got {value!r}"
        )
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        days = _days_since_epoch(int(year), int(month), int(day))
    except ValueError:
        raise source.error(line, column, f"not a valid date: {value!r}") from None
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:
        raise source.error(line, column, f"not a valid time of day: {value!r}")
    seconds = ((days * 24 + int(hour)) * 60 + int(minute)) * 60 + int(second)
    nanoseconds = int((fraction or "0").ljust(9, "0"))
    return seconds * 1_000_000_000 + nanoseconds
