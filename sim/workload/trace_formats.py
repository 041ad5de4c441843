"""One reader per trace format, each filling :class:`TraceColumns` from a trace's lines.

A reader takes the file's ``(line number, text)`` pairs (from
:func:`sim.workload.trace_text.text_lines`) and returns the lengths, arrival times, sessions and
prompt segments it found, in file order; :func:`sim.workload.traces.read_trace` sorts them and
makes the :class:`~sim.workload.traces.Trace`. The format rules are described in
:mod:`sim.workload.traces`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sim.engine.request import Segment, SourceNamespace, source_id
from sim.workload.trace_text import (
    TraceSource,
    csv_records,
    json_records,
    required_field,
)
from sim.workload.trace_values import (
    parse_count,
    parse_int_list,
    parse_priority,
    parse_session_id,
    parse_time,
    parse_timestamp_ns,
)

#: Tokens per entry of Mooncake's ``hash_ids``.
MOONCAKE_BLOCK_TOKENS = 512
#: Default tokens per block id in servesim JSONL files.
DEFAULT_BLOCK_TOKENS = 16
#: Token ids per segment when a trace carries exact token ids (vLLM's default block size).
TOKEN_ID_PIECE_TOKENS = 16

#: Formats read as CSV, whose errors name a "column" rather than a "field".
CSV_FORMATS = frozenset({"azure", "vidur", "servesim_csv"})

#: The columns or fields a format requires; ``detect_format`` recognises a format by them, so
#: detection and the "missing column" errors agree. CSV formats first, then JSONL formats.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("num_prefill_tokens", "num_decode_tokens"),
    "servesim_csv": ("prompt_tokens", "output_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "llmservingsim": ("input_toks", "output_toks", "arrival_time_ns", "input_tok_ids"),
    "servesim_jsonl": ("prompt_tokens", "output_tokens"),
}


# --------------------------------------------------------------------------------------------
# Accumulating columns in compact arrays


@dataclass(eq=False)
class TraceColumns:
    """A reader's output, in file order: growing columns of 8 bytes per value, so that a large
    file does not become Python objects. Which columns exist is fixed by the first request.
    """

    has_arrival: bool
    has_segments: bool = False
    has_sessions: bool = False
    has_priorities: bool = False
    arrival_s: array[float] | None = field(init=False)
    prompt_tokens: array[int] = field(init=False, default_factory=lambda: array("q"))
    output_tokens: array[int] = field(init=False, default_factory=lambda: array("q"))
    segments: list[tuple[Segment, ...]] | None = field(init=False)
    session_ids: array[int] | None = field(init=False)
    priorities: array[int] | None = field(init=False)
    any_session: bool = field(init=False, default=False)
    num_adjusted_block_rows: int = field(init=False, default=0)
    first_adjusted_line: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.arrival_s = array("d") if self.has_arrival else None
        self.segments = [] if self.has_segments else None
        self.session_ids = array("q") if self.has_sessions else None
        self.priorities = array("q") if self.has_priorities else None

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def is_full(self, max_requests: int | None) -> bool:
        """Whether ``max_requests`` requests have been read (never, for None)."""
        return max_requests is not None and len(self) >= max_requests

    def add_arrival(self, value_s: float) -> None:
        """Append one arrival time, in seconds (any origin: :func:`read_trace` shifts it)."""
        assert self.arrival_s is not None
        self.arrival_s.append(value_s)

    def add_lengths(self, prompt_tokens: int, output_tokens: int) -> None:
        """Append one request's prompt and output lengths."""
        self.prompt_tokens.append(prompt_tokens)
        self.output_tokens.append(output_tokens)

    def add_session(self, session_id: int) -> None:
        """Append one request's session id (-1: unknown)."""
        assert self.session_ids is not None
        self.session_ids.append(session_id)
        self.any_session = self.any_session or session_id != -1

    def add_priority(self, priority: int) -> None:
        """Append one request's priority (vLLM's: lower is served first)."""
        assert self.priorities is not None
        self.priorities.append(priority)

    def add_segments(self, segments: tuple[Segment, ...]) -> None:
        """Append one request's prompt segments, their lengths summing to its prompt length."""
        assert self.segments is not None
        self.segments.append(segments)

    def add_block_segments(
        self,
        source: TraceSource,
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


# --------------------------------------------------------------------------------------------
# Format readers: each fills TraceColumns from a stream of (line number, text) pairs.


def _read_azure(
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    columns = TraceColumns(has_arrival=True)
    first_ns: int | None = None
    for line, row in csv_records(source, lines, REQUIRED_FIELDS["azure"], ()):
        timestamp_ns = parse_timestamp_ns(source, line, "TIMESTAMP", row["TIMESTAMP"])
        if first_ns is None:
            first_ns = timestamp_ns
        # Differences of integer nanoseconds are exact; only the final division rounds.
        columns.add_arrival((timestamp_ns - first_ns) / 1e9)
        columns.add_lengths(
            parse_count(source, line, "ContextTokens", row["ContextTokens"]),
            parse_count(source, line, "GeneratedTokens", row["GeneratedTokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns


def _read_vidur(
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    records = csv_records(source, lines, REQUIRED_FIELDS["vidur"], ("arrived_at",))
    columns: TraceColumns | None = None
    for line, row in records:
        if columns is None:
            columns = TraceColumns(has_arrival="arrived_at" in row)
        if columns.arrival_s is not None:
            columns.add_arrival(parse_time(source, line, "arrived_at", row["arrived_at"]))
        columns.add_lengths(
            parse_count(source, line, "num_prefill_tokens", row["num_prefill_tokens"]),
            parse_count(source, line, "num_decode_tokens", row["num_decode_tokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns if columns is not None else TraceColumns(has_arrival=False)


def _read_servesim_csv(
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    records = csv_records(
        source, lines, REQUIRED_FIELDS["servesim_csv"], ("arrival_s", "session_id", "priority")
    )
    columns: TraceColumns | None = None
    for line, row in records:
        if columns is None:
            columns = TraceColumns(
                has_arrival="arrival_s" in row,
                has_sessions="session_id" in row,
                has_priorities="priority" in row,
            )
        if columns.priorities is not None:
            cell = row["priority"]
            columns.add_priority(
                0 if not cell.strip() else parse_priority(source, line, "priority", cell)
            )
        if columns.arrival_s is not None:
            columns.add_arrival(parse_time(source, line, "arrival_s", row["arrival_s"]))
        if columns.session_ids is not None:
            cell = row["session_id"]
            columns.add_session(
                -1 if not cell.strip() else parse_session_id(source, line, "session_id", cell)
            )
        columns.add_lengths(
            parse_count(source, line, "prompt_tokens", row["prompt_tokens"]),
            parse_count(source, line, "output_tokens", row["output_tokens"]),
        )
        if columns.is_full(max_requests):
            break
    return columns if columns is not None else TraceColumns(has_arrival=False)


def _read_mooncake(
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    columns = TraceColumns(has_arrival=True, has_segments=True)
    first_ms: int | float | None = None
    for line, record in json_records(source, lines):
        timestamp_ms = parse_time(
            source, line, "timestamp", required_field(source, line, record, "timestamp")
        )
        if first_ms is None:
            first_ms = timestamp_ms
        columns.add_arrival((timestamp_ms - first_ms) / 1000)
        prompt_tokens = parse_count(
            source, line, "input_length", required_field(source, line, record, "input_length")
        )
        columns.add_lengths(
            prompt_tokens,
            parse_count(
                source, line, "output_length", required_field(source, line, record, "output_length")
            ),
        )
        hash_ids = parse_int_list(
            source, line, "hash_ids", required_field(source, line, record, "hash_ids")
        )
        columns.add_block_segments(source, line, hash_ids, prompt_tokens, MOONCAKE_BLOCK_TOKENS)
        if columns.is_full(max_requests):
            break
    return columns


def _read_llmservingsim(
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    columns = TraceColumns(has_arrival=True, has_segments=True)
    first_ns: int | float | None = None
    for line, record in json_records(source, lines):
        arrival_ns = parse_time(
            source, line, "arrival_time_ns", required_field(source, line, record, "arrival_time_ns")
        )
        if first_ns is None:
            first_ns = arrival_ns
        columns.add_arrival((arrival_ns - first_ns) / 1e9)
        prompt_tokens = parse_count(
            source, line, "input_toks", required_field(source, line, record, "input_toks")
        )
        columns.add_lengths(
            prompt_tokens,
            parse_count(
                source, line, "output_toks", required_field(source, line, record, "output_toks")
            ),
        )
        token_ids = parse_int_list(
            source, line, "input_tok_ids", required_field(source, line, record, "input_tok_ids")
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
    source: TraceSource, lines: Iterator[tuple[int, str]], max_requests: int | None
) -> TraceColumns:
    columns: TraceColumns | None = None
    first_line = 0
    for line, record in json_records(source, lines):
        block_key = "hash_ids" if "hash_ids" in record else "block_keys"
        if "hash_ids" in record and "block_keys" in record:
            raise source.error(line, None, "has both 'hash_ids' and 'block_keys'; keep one")
        if columns is None:
            first_line = line
            columns = TraceColumns(
                has_arrival="arrival_s" in record,
                has_segments=block_key in record,
                has_sessions=True,
                has_priorities=True,
            )
        _check_all_or_none(
            source, line, record, "arrival_s", columns.arrival_s is not None, first_line
        )
        _check_all_or_none(
            source, line, record, block_key, columns.segments is not None, first_line
        )
        if columns.arrival_s is not None:
            columns.add_arrival(parse_time(source, line, "arrival_s", record["arrival_s"]))
        prompt_tokens = parse_count(
            source, line, "prompt_tokens", required_field(source, line, record, "prompt_tokens")
        )
        columns.add_lengths(
            prompt_tokens,
            parse_count(
                source, line, "output_tokens", required_field(source, line, record, "output_tokens")
            ),
        )
        session = record.get("session_id")
        columns.add_session(
            -1 if session is None else parse_session_id(source, line, "session_id", session)
        )
        priority = record.get("priority")
        columns.add_priority(
            0 if priority is None else parse_priority(source, line, "priority", priority)
        )
        if columns.segments is not None:
            block_tokens = parse_count(
                source, line, "block_tokens", record.get("block_tokens", DEFAULT_BLOCK_TOKENS)
            )
            block_ids = parse_int_list(source, line, block_key, record[block_key])
            columns.add_block_segments(source, line, block_ids, prompt_tokens, block_tokens)
        if columns.is_full(max_requests):
            break
    if columns is None:
        return TraceColumns(has_arrival=False)
    if columns.session_ids is not None and not columns.any_session:
        columns.session_ids = None
    if columns.priorities is not None and not any(columns.priorities):
        columns.priorities = None
    return columns


def _check_all_or_none(
    source: TraceSource,
    line: int,
    record: dict[str, object],
    key: str,
    expected: bool,
    first_line: int,
) -> None:
    """Refuse a line that has (or lacks) ``key`` when the first request lacked (or had) it."""
    if (key in record) != expected:
        state = "has" if expected else "lacks"
        raise source.error(
            line,
            key,
            f"the first request (line {first_line}) {state} it, so every line must "
            f"{'have' if expected else 'omit'} it",
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


#: A format's reader: (source, lines, max_requests) -> the columns of its requests.
FormatReader = Callable[[TraceSource, Iterator[tuple[int, str]], int | None], TraceColumns]

#: The reader of each trace format, in the order error messages list the formats.
FORMAT_READERS: dict[str, FormatReader] = {
    "azure": _read_azure,
    "mooncake": _read_mooncake,
    "vidur": _read_vidur,
    "servesim_jsonl": _read_servesim_jsonl,
    "servesim_csv": _read_servesim_csv,
    "llmservingsim": _read_llmservingsim,
}
