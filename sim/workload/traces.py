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

This module is the public face of trace reading; the work is shared out by layer:
:mod:`sim.workload.trace_text` decodes the file into lines, CSV rows and JSON objects,
:mod:`sim.workload.trace_values` checks each value, and :mod:`sim.workload.trace_formats` holds
one reader per format.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sim.engine.request import Segment
from sim.workload.trace_formats import (
    CSV_FORMATS,
    DEFAULT_BLOCK_TOKENS,
    FORMAT_READERS,
    MOONCAKE_BLOCK_TOKENS,
    REQUIRED_FIELDS,
    TOKEN_ID_PIECE_TOKENS,
    TraceColumns,
)
from sim.workload.trace_text import (
    TraceFormatError,
    TraceSource,
    csv_header,
    listed_names,
    parse_json_line,
    text_lines,
)

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "MAX_LINE_BYTES",
    "MOONCAKE_BLOCK_TOKENS",
    "TOKEN_ID_PIECE_TOKENS",
    "TRACE_FORMATS",
    "Trace",
    "TraceFormatError",
    "TraceWarning",
    "detect_format",
    "read_trace",
]

#: The formats :func:`read_trace` reads, in the order error messages list them.
TRACE_FORMATS: tuple[str, ...] = tuple(FORMAT_READERS)

_JSON_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
_CSV_SUFFIXES = frozenset({".csv"})

#: The longest line read; a longer one is not a trace line (a binary file without newlines)
#: and would otherwise be read whole into memory. A 128k-token prompt of token ids is ~1 MiB.
#: Read at each call (tests lower it), and passed down to :func:`text_lines`.
MAX_LINE_BYTES = 64 * 2**20


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
    priorities: npt.NDArray[np.int64] | None = None  # None: the file has no priority column

    def __post_init__(self) -> None:
        num_requests = len(self.prompt_tokens)
        assert len(self.output_tokens) == num_requests
        assert self.arrival_s is None or len(self.arrival_s) == num_requests
        assert self.segments is None or len(self.segments) == num_requests
        assert self.session_ids is None or len(self.session_ids) == num_requests
        assert self.priorities is None or len(self.priorities) == num_requests

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# --------------------------------------------------------------------------------------------
# Public entry points, and turning a reader's columns into a Trace


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
    source = TraceSource(path, "column" if trace_format in CSV_FORMATS else "field")
    with path.open("rb") as handle:
        lines = text_lines(source, handle, MAX_LINE_BYTES)
        columns = FORMAT_READERS[trace_format](source, lines, max_requests)
    return _finish(source, trace_format, columns)


def detect_format(path: str | Path) -> str:
    """The trace format of ``path``, from its extension and its header or first JSON object.

    A ``.jsonl``/``.ndjson``/``.json`` file, or any file whose first line starts with ``{``, is
    matched on the first object's keys; anything else on its CSV header. Raises
    :class:`TraceFormatError` listing the known formats when nothing matches.
    """
    path = Path(path)
    source = TraceSource(path, "column")
    with path.open("rb") as handle:
        first = next(
            (
                (line, text)
                for line, text in text_lines(source, handle, MAX_LINE_BYTES)
                if text.strip()
            ),
            None,
        )
    if first is None:
        raise source.error(None, None, "empty file: no requests")
    line, text = first
    is_json = path.suffix.lower() in _JSON_SUFFIXES or (
        path.suffix.lower() not in _CSV_SUFFIXES and text.lstrip().startswith("{")
    )
    if is_json:
        record = parse_json_line(source, line, text)
        found = list(record)
        candidates = ("mooncake", "llmservingsim", "servesim_jsonl")
        found_word = "keys"
    else:
        found = csv_header(source, line, text)
        candidates = ("azure", "vidur", "servesim_csv")
        found_word = "columns"
    for candidate in candidates:
        if set(REQUIRED_FIELDS[candidate]) <= set(found):
            return candidate
    known = "; ".join(f"{name} ({', '.join(REQUIRED_FIELDS[name])})" for name in REQUIRED_FIELDS)
    raise source.error(
        line,
        None,
        f"cannot detect the trace format from the {found_word} {listed_names(found)}; "
        f"known formats and what they need: {known}. Pass format= explicitly if the file is one "
        "of these.",
    )


def _finish(source: TraceSource, trace_format: str, columns: TraceColumns) -> Trace:
    """The :class:`Trace` of a reader's columns: arrivals sorted and shifted to start at 0.

    Warns (on behalf of :func:`read_trace`'s caller) when block ids were trimmed or arrivals
    had to be sorted, and refuses an empty file or arrival times that span more than a float.
    """
    if len(columns) == 0:
        raise source.error(None, None, "no requests (the file is empty or has only a header)")
    prompt_tokens = np.frombuffer(columns.prompt_tokens, dtype=np.int64)
    output_tokens = np.frombuffer(columns.output_tokens, dtype=np.int64)
    session_ids = (
        None if columns.session_ids is None else np.frombuffer(columns.session_ids, dtype=np.int64)
    )
    priorities = (
        None if columns.priorities is None else np.frombuffer(columns.priorities, dtype=np.int64)
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
            priorities = None if priorities is None else priorities[order]
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
    for values in (arrival_s, prompt_tokens, output_tokens, session_ids, priorities):
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
        priorities=priorities,
    )
