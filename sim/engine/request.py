"""Requests, their final status, and the record schema shared by sim/ and live/.

A prompt is described by *segments*: ``(source_id, num_tokens)`` pairs, each taking the first
``num_tokens`` tokens of an infinite, deterministic token stream named ``source_id``. Two prompts
share a prefix exactly when their segment lists agree up to that point, which is all the prefix
cache needs to know. From segments we derive chained KV-block keys at any block size (the key of
block *i* covers every token before it, as vLLM's block hashes do), and live/ derives exact token
ids from the same segments so the server's prefix cache hits where the simulator's does.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum

Segment = tuple[int, int]
"""``(source_id, num_tokens)``: the first ``num_tokens`` tokens of stream ``source_id``."""


class RequestStatus(StrEnum):
    """How a request ended. Every request ends with exactly one of these."""

    OK = "ok"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload, identical for the simulator and the live executor.

    ``segments`` describe the prompt (their lengths sum to ``prompt_tokens``);
    ``output_source_id`` names the stream the generated tokens come from, so that a later turn of
    a multi-turn session whose prompt contains this output shares its KV blocks.

    A request with a ``parent_id`` (a later turn of a session) has no fixed arrival time
    (``arrival_s`` is NaN): it arrives ``think_time_s`` after its parent finishes, as a user
    replies to the answer they received (closed loop within a session).
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    segments: tuple[Segment, ...]
    output_source_id: int
    session_id: int = -1
    prefix_group: int = -1
    priority: int = 0
    parent_id: int = -1
    think_time_s: float = 0.0

    def __post_init__(self) -> None:
        assert self.prompt_tokens >= 1, self
        assert self.output_tokens >= 1, self
        assert sum(n for _, n in self.segments) == self.prompt_tokens, self
        assert (self.parent_id >= 0) == math.isnan(self.arrival_s), self

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the sequence length when the request finishes."""
        return self.prompt_tokens + self.output_tokens


def block_keys(
    segments: tuple[Segment, ...] | list[Segment], block_size: int, num_tokens: int
) -> list[int]:
    """Chained keys of the full blocks among the first ``num_tokens`` tokens of ``segments``.

    The key of block *i* is a hash of block *i-1*'s key and the pieces of streams that block *i*
    holds, so equal keys mean equal token content from the start of the sequence. A trailing
    partial block has no key (vLLM caches full blocks only).
    """
    assert block_size > 0
    keys: list[int] = []
    num_blocks = num_tokens // block_size
    if num_blocks == 0:
        return keys
    parent = 0
    seg_index = 0
    seg_offset = 0  # tokens already consumed from segments[seg_index]
    for _ in range(num_blocks):
        source_id, length = segments[seg_index]
        if length - seg_offset > block_size:
            # The block lies inside one segment (most do): one piece, the segment goes on.
            parent = hash((parent, (source_id, seg_offset, block_size)))
            keys.append(parent)
            seg_offset += block_size
            continue
        need = block_size
        pieces: list[tuple[int, int, int]] = []
        while need > 0:
            source_id, length = segments[seg_index]
            take = min(need, length - seg_offset)
            pieces.append((source_id, seg_offset, take))
            need -= take
            seg_offset += take
            if seg_offset == length:
                seg_index += 1
                seg_offset = 0
        parent = hash((parent, *pieces))
        keys.append(parent)
    return keys


def record_of(request: Request, arrival_s: float | None = None) -> Record:
    """A fresh record of ``request``, with no status yet, arriving at ``arrival_s`` (default:
    the request's own arrival time)."""
    return Record(
        request.request_id,
        request.arrival_s if arrival_s is None else arrival_s,
        request.prompt_tokens,
        request.output_tokens,
        priority=request.priority,
    )


def shared_first_sources(requests: Iterable[Request]) -> frozenset[int]:
    """The streams more than one request's prompt starts with: only such requests can share
    KV blocks with another."""
    counts = Counter(r.segments[0][0] for r in requests if r.segments)
    return frozenset(source for source, n in counts.items() if n > 1)


#: For :meth:`sim.fleet.pool.Fleet.set_shared_sources`: every request whose first stream is
#: shared can share nothing after its first segment (a synthetic workload's system prompts).
ALL_SHARED_FIRST: frozenset[int] = frozenset({-1})


def keyed_prefix_requests(requests: Sequence[Request]) -> frozenset[int]:
    """The requests whose first segment other requests start with too, and whose blocks
    after it no other request can share: every later stream of their sequence (prompt and
    output) is in no other request's sequence. A later turn of a session is never one: its
    prompt holds its parent's answer; nor is a turn whose answer a later turn holds."""
    counts = Counter(
        source for r in requests for source in (*(s for s, _ in r.segments), r.output_source_id)
    )
    shared = shared_first_sources(requests)
    return frozenset(
        r.request_id
        for r in requests
        if len(r.segments) > 1
        and r.segments[0][0] in shared
        and all(counts[source] == 1 for source, _ in r.segments[1:])
        and counts[r.output_source_id] == 1
    )


def later_turns(requests: Sequence[Request]) -> dict[int, list[Request]]:
    """Parent request id → the requests released when it finishes (later session turns).

    Raises ValueError for duplicate ids or a parent missing from ``requests``: such a request
    would never be released, and a run waiting for every request to end would never end.
    """
    ids = {r.request_id for r in requests}
    if len(ids) != len(requests):
        raise ValueError("requests: request ids must be unique")
    children: dict[int, list[Request]] = {}
    for request in requests:
        if request.parent_id < 0:
            continue
        if request.parent_id not in ids:
            raise ValueError(
                f"requests: request {request.request_id} follows request "
                f"{request.parent_id}, which is not in the list"
            )
        children.setdefault(request.parent_id, []).append(request)
    return children


def sequence_segments(request: Request) -> list[Segment]:
    """The segments of the whole sequence: the prompt followed by the generated output."""
    return [*request.segments, (request.output_source_id, request.output_tokens)]


# The record schema: sim/ and live/ write exactly these columns, in this order.
RECORD_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "num_preemptions",
    "replica_id",
    "priority",
    "status",
    "error",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
)


@dataclass(slots=True)
class LatencyMetrics:
    """Per-request latencies derived from timestamps, computed the same way for sim and live."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    queue_s: float


def latency_metrics(
    arrival_s: float,
    scheduled_s: float,
    first_token_s: float,
    finish_s: float,
    output_tokens: int,
) -> LatencyMetrics:
    """TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1).

    TPOT is undefined (NaN) for a single output token; any missing timestamp (NaN) gives NaN for
    the metrics that need it.
    """
    ttft = first_token_s - arrival_s
    tpot = (finish_s - first_token_s) / (output_tokens - 1) if output_tokens > 1 else math.nan
    return LatencyMetrics(
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=finish_s - arrival_s,
        queue_s=scheduled_s - arrival_s,
    )


@dataclass(slots=True)
class Record:
    """What happened to one request (mutable while the request is in flight)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    cached_tokens: int = 0
    num_preemptions: int = 0
    replica_id: int = -1
    status: RequestStatus | None = None
    priority: int = 0  # the request's (lower is served first under the priority policy)
    error: str = ""
    # Every output token's time, when the run records them (None otherwise: a big run has a
    # record per request, and an empty list each would cost tens of bytes apiece).
    token_times_s: list[float] | None = None

    def as_row(self) -> dict[str, object]:
        """The record as a dict with exactly :data:`RECORD_COLUMNS` as keys."""
        assert self.status is not None, f"request {self.request_id} has no status"
        metrics = latency_metrics(
            self.arrival_s, self.scheduled_s, self.first_token_s, self.finish_s, self.output_tokens
        )
        return {
            "request_id": self.request_id,
            "arrival_s": self.arrival_s,
            "scheduled_s": self.scheduled_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "num_preemptions": self.num_preemptions,
            "replica_id": self.replica_id,
            "priority": self.priority,
            "status": str(self.status),
            "error": self.error,
            "ttft_s": metrics.ttft_s,
            "tpot_s": metrics.tpot_s,
            "e2e_s": metrics.e2e_s,
            "queue_s": metrics.queue_s,
        }


class SourceNamespace(IntEnum):
    """Namespaces that keep token-stream ids from different origins apart."""

    UNIQUE = 1  # content private to one request (user text, generated output)
    SYSTEM_PROMPT = 2  # a shared system prompt, one stream per prefix group
    TRACE_BLOCK = 3  # a block hash read from a trace (e.g. Mooncake hash_ids)
    TOKEN_IDS = 4  # a run of exact token ids read from a trace
    SESSION = 5  # a multi-turn session's user turns and answers


_MASK_64 = (1 << 64) - 1


def source_id(namespace: SourceNamespace, *values: int) -> int:
    """A deterministic 64-bit stream id from a digest of the values.

    A digest, not Python's ``hash``: ``hash(-1) == hash(-2)`` in CPython, which once gave two
    sessions the same content.
    """
    # The values' 8-byte little-endian forms one after another: one integer's bytes.
    packed = int(namespace) & _MASK_64
    shift = 64
    for value in values:
        packed |= (value & _MASK_64) << shift
        shift += 64
    digest = hashlib.blake2b(packed.to_bytes(shift // 8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)
