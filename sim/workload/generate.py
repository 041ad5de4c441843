"""Workloads: arrival process × length distributions × prefix structure → a list of requests.

The same seed always gives the same requests. Prefix structure decides which requests share
KV blocks:

* :class:`SharedPrefix` — K system prompts; a share of requests starts with one of them
  (chosen uniformly), followed by the request's own user tokens.
* :class:`MultiTurn` — sessions of several turns; each turn's prompt is the whole conversation so
  far (earlier prompts and outputs) plus new user tokens, so it extends the previous turn's KV.
  Sessions start at the arrival process's times; each later turn is sent an exponential think
  time after the previous answer *finished* (closed loop within a session, as a person or an
  agent replies), so its prompt really does contain an answer the server has produced.
* Traces carry their own structure (Mooncake block hashes, exact token ids).

Requests too long for the engine are kept: the replica rejects them with a status, as vLLM does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from sim.engine.request import Request, Segment, SourceNamespace, source_id
from sim.workload.arrival_sampling import FloatArray
from sim.workload.arrivals import ArrivalProcess
from sim.workload.lengths import IntArray, LengthDistribution
from sim.workload.traces import Trace


@dataclass(frozen=True)
class SharedPrefix:
    """``num_groups`` system prompts of ``prefix_tokens`` tokens; ``share`` of requests use one."""

    num_groups: int
    prefix_tokens: int
    share: float = 1.0


@dataclass(frozen=True)
class MultiTurn:
    """Multi-turn sessions: turns per session, mean think time, optional shared system prompt."""

    turns: LengthDistribution
    think_time_s: float
    system_prompt_tokens: int = 0


PrefixStructure = SharedPrefix | MultiTurn | None


#: The most requests one workload may hold (a run keeps one record per request).
MAX_REQUESTS = 10_000_000
#: The most prompt segments a multi-turn workload may hold (each turn repeats its history).
MAX_SESSION_SEGMENTS = 200_000_000
#: The most tokens a length may hold: workloads keep lengths as 32-bit integers
#: (SyntheticRequests); no model's context comes near it.
MAX_TOKENS = int(np.iinfo(np.int32).max)


def _unique(salt: int, request_id: int, part: int) -> int:
    return source_id(SourceNamespace.UNIQUE, salt, request_id, part)


def content_salt(seed_sequence: np.random.SeedSequence) -> int:
    """A number that makes one workload's token content differ from another's.

    Without it, request 0 of every workload would carry the same tokens, and a long-lived server
    would hit blocks cached by an earlier, unrelated run. Two workloads with the same seed share
    content, as they should.
    """
    return int(seed_sequence.generate_state(1, np.uint64)[0])


def generate_requests(
    seed_sequence: np.random.SeedSequence,
    arrivals: ArrivalProcess,
    prompt_tokens: LengthDistribution,
    output_tokens: LengthDistribution,
    prefix: PrefixStructure = None,
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> list[Request]:
    """Draw a synthetic workload, as a list (:func:`synthetic_requests`)."""
    return list(
        synthetic_requests(
            seed_sequence,
            arrivals,
            prompt_tokens,
            output_tokens,
            prefix,
            num_requests=num_requests,
            duration_s=duration_s,
        )
    )


def synthetic_requests(
    seed_sequence: np.random.SeedSequence,
    arrivals: ArrivalProcess,
    prompt_tokens: LengthDistribution,
    output_tokens: LengthDistribution,
    prefix: PrefixStructure = None,
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> Sequence[Request]:
    """Draw a synthetic workload. Each component gets its own child generator of ``seed_sequence``.

    With :class:`SharedPrefix`, ``prompt_tokens`` is the user part after the system prompt. With
    :class:`MultiTurn`, it is the new user text of each turn, and the sessions come as a list;
    without sessions, as columns (:class:`SyntheticRequests`), each request built when read.
    """
    arrival_seq, prompt_seq, output_seq, prefix_seq = seed_sequence.spawn(4)
    arrival_rng = np.random.default_rng(arrival_seq)
    if isinstance(prefix, MultiTurn):
        return _multi_turn(
            arrival_rng,
            np.random.default_rng(prompt_seq),
            np.random.default_rng(output_seq),
            np.random.default_rng(prefix_seq),
            arrivals,
            prompt_tokens,
            output_tokens,
            prefix,
            salt=content_salt(seed_sequence),
            num_requests=num_requests,
            duration_s=duration_s,
        )
    times = arrivals.times(arrival_rng, num_requests=num_requests, duration_s=duration_s)
    n = len(times)
    prompts = prompt_tokens.sample(np.random.default_rng(prompt_seq), n)
    outputs = output_tokens.sample(np.random.default_rng(output_seq), n)
    groups = np.full(n, -1, dtype=np.int64)
    if prefix is not None:
        prefix_rng = np.random.default_rng(prefix_seq)
        in_group = prefix_rng.random(n) < prefix.share
        chosen = prefix_rng.integers(0, prefix.num_groups, n)
        groups = np.where(in_group, chosen, -1)
    return SyntheticRequests(
        times, prompts, outputs, groups, prefix, salt=content_salt(seed_sequence)
    )


class SyntheticRequests(Sequence[Request]):
    """A synthetic workload without sessions held as columns (20 bytes a request), its
    :class:`Request` objects built when read: a run of ten million requests holds the few in
    flight, not all of them. Request ``i`` has id ``i``; arrivals are in id order."""

    def __init__(
        self,
        times: FloatArray,
        prompts: IntArray,
        outputs: IntArray,
        groups: IntArray,
        prefix: SharedPrefix | None,
        *,
        salt: int,
    ) -> None:
        self.times = np.asarray(times, dtype=np.float64)
        # A sampled tail past 32 bits (an unclipped lognormal) is held at the most an int32
        # holds: longer than any context, it is rejected all the same.
        self.prompts = np.minimum(prompts, MAX_TOKENS).astype(np.int32)
        self.outputs = np.minimum(outputs, MAX_TOKENS).astype(np.int32)
        self.groups = np.asarray(groups, dtype=np.int32)
        self.prefix = prefix
        self.salt = salt
        self._system_ids: dict[int, int] = {}  # group -> its system prompt's stream id
        assert self.times.size < 2 or bool(np.all(self.times[1:] >= self.times[:-1]))

    def __len__(self) -> int:
        return int(self.times.size)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return [self._request(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._request(index)

    def __iter__(self) -> Iterator[Request]:
        return map(self._request, range(len(self)))

    def _request(self, i: int) -> Request:
        salt, prefix = self.salt, self.prefix
        user = int(self.prompts[i])
        group = int(self.groups[i])
        segments: tuple[Segment, ...]
        if group >= 0 and prefix is not None:
            system_id = self._system_ids.get(group)
            if system_id is None:
                system_id = source_id(SourceNamespace.SYSTEM_PROMPT, salt, group)
                self._system_ids[group] = system_id
            system = (system_id, prefix.prefix_tokens)
            segments = (system, (_unique(salt, i, 0), user))
            total = prefix.prefix_tokens + user
        else:
            segments = ((_unique(salt, i, 0), user),)
            total = user
        return Request(
            request_id=i,
            arrival_s=float(self.times[i]),
            prompt_tokens=total,
            output_tokens=int(self.outputs[i]),
            segments=segments,
            output_source_id=_unique(salt, i, 1),
            prefix_group=group,
        )

    @property
    def last_arrival_s(self) -> float:
        """When the last request arrives (0 without requests)."""
        return float(self.times[-1]) if self.times.size else 0.0

    def shared_first_sources(self) -> frozenset[int]:
        """The first streams more than one request starts with (:func:`shared_first_sources`):
        the system prompts of groups with two requests or more; a request's own text is its
        alone."""
        if self.prefix is None:
            return frozenset()
        groups, counts = np.unique(self.groups[self.groups >= 0], return_counts=True)
        return frozenset(
            source_id(SourceNamespace.SYSTEM_PROMPT, self.salt, int(g))
            for g, c in zip(groups, counts, strict=True)
            if c > 1
        )


@dataclass
class _TurnDraft:
    """One turn of a session before ids are given: its prompt and earliest possible arrival."""

    earliest_s: float
    session: int
    turn: int
    think_s: float
    segments: tuple[Segment, ...]
    output_tokens: int
    output_source: int


def _multi_turn(
    arrival_rng: np.random.Generator,
    prompt_rng: np.random.Generator,
    output_rng: np.random.Generator,
    session_rng: np.random.Generator,
    arrivals: ArrivalProcess,
    prompt_tokens: LengthDistribution,
    output_tokens: LengthDistribution,
    spec: MultiTurn,
    *,
    salt: int,
    num_requests: int | None,
    duration_s: float | None,
) -> list[Request]:
    """Sessions as chains of requests; later turns wait for their parent (see module doc).

    ``num_requests`` and ``duration_s`` cut the workload by each turn's *earliest possible*
    arrival (session start plus think times, as if answers were instant), which keeps every
    session a prefix of its turns.
    """
    starts = arrivals.times(arrival_rng, num_requests=num_requests, duration_s=duration_s)
    turns = spec.turns.sample(session_rng, len(starts))
    _check_session_size(len(starts), turns)
    system: tuple[Segment, ...] = ()
    if spec.system_prompt_tokens:
        system = ((source_id(SourceNamespace.SYSTEM_PROMPT, salt, 0), spec.system_prompt_tokens),)
    drafts = _draft_turns(
        starts,
        turns,
        system,
        (prompt_rng, output_rng, session_rng),
        prompt_tokens,
        output_tokens,
        spec.think_time_s,
        salt=salt,
        duration_s=duration_s,
    )
    drafts.sort(key=lambda d: (d.earliest_s, d.session, d.turn))
    if num_requests is not None:
        drafts = drafts[:num_requests]
    return _session_requests(drafts, has_system_prompt=bool(system))


def _check_session_size(num_sessions: int, turns: IntArray) -> None:
    """Refuse sessions whose requests, or prompt segments, exceed what one workload may hold."""
    # Each turn's prompt repeats the whole history: segments held grow with turns squared.
    num_turns = float(turns.sum())
    num_segments = float((turns.astype(np.float64) ** 2).sum())
    if num_turns > MAX_REQUESTS or num_segments > MAX_SESSION_SEGMENTS:
        raise ValueError(
            f"workload.prefix.turns: {num_sessions:,} sessions of up to {int(turns.max()):,} turns "
            f"are {num_turns:,.0f} requests whose prompts repeat their history "
            f"({num_segments:,.0f} segments; the limits are {MAX_REQUESTS:,} requests and "
            f"{MAX_SESSION_SEGMENTS:,} segments); lower prefix.turns, num_requests or duration_s"
        )


def _draft_turns(
    starts: FloatArray,
    turns: IntArray,
    system: tuple[Segment, ...],
    rngs: tuple[np.random.Generator, np.random.Generator, np.random.Generator],
    prompt_tokens: LengthDistribution,
    output_tokens: LengthDistribution,
    think_time_s: float,
    *,
    salt: int,
    duration_s: float | None,
) -> list[_TurnDraft]:
    """Every session's turns in session order, each prompt the whole conversation so far.

    ``rngs`` are the prompt, output and session (think time) generators; each turn draws from
    them in that order, session by session. A session stops at its first turn whose earliest
    arrival is not before ``duration_s``.
    """
    prompt_rng, output_rng, session_rng = rngs
    drafts: list[_TurnDraft] = []
    for session, (start, num_turns) in enumerate(zip(starts, turns, strict=True)):
        history: list[Segment] = list(system)
        earliest = float(start)
        for turn in range(int(num_turns)):
            think = float(session_rng.exponential(think_time_s)) if turn else 0.0
            earliest += think
            if duration_s is not None and earliest >= duration_s:
                break
            user = int(prompt_tokens.sample(prompt_rng, 1)[0])
            output = int(output_tokens.sample(output_rng, 1)[0])
            output_source = source_id(SourceNamespace.SESSION, salt, session, turn, 1)
            history.append((source_id(SourceNamespace.SESSION, salt, session, turn, 0), user))
            drafts.append(
                _TurnDraft(earliest, session, turn, think, tuple(history), output, output_source)
            )
            history.append((output_source, output))
    return drafts


def _session_requests(drafts: list[_TurnDraft], *, has_system_prompt: bool) -> list[Request]:
    """Requests numbered in draft order; a later turn has no arrival time, only its parent."""
    id_of = {(d.session, d.turn): i for i, d in enumerate(drafts)}
    requests = []
    for i, d in enumerate(drafts):
        parent = id_of[(d.session, d.turn - 1)] if d.turn else -1
        requests.append(
            Request(
                request_id=i,
                arrival_s=math.nan if d.turn else d.earliest_s,
                prompt_tokens=sum(n for _, n in d.segments),
                output_tokens=d.output_tokens,
                segments=d.segments,
                output_source_id=d.output_source,
                session_id=d.session,
                prefix_group=0 if has_system_prompt else -1,
                parent_id=parent,
                think_time_s=d.think_s,
            )
        )
    return requests


#: The child of a workload's seed sequence that draws priority classes: far past the children
#: :func:`generate_requests` spawns, so adding priorities leaves every other draw as it was.
PRIORITY_STREAM = 1 << 20


def with_priorities(
    requests: list[Request],
    priorities: tuple[int, ...],
    shares: tuple[float, ...],
    seed_sequence: np.random.SeedSequence,
) -> list[Request]:
    """Each request's priority drawn from ``priorities`` with probabilities ``shares``; a later
    turn of a session keeps its first turn's (one user, one class)."""
    stream = np.random.SeedSequence(
        seed_sequence.entropy, spawn_key=(*seed_sequence.spawn_key, PRIORITY_STREAM)
    )
    rng = np.random.default_rng(stream)
    p = np.asarray(shares, dtype=np.float64)
    drawn = rng.choice(np.asarray(priorities, dtype=np.int64), size=len(requests), p=p / p.sum())
    own = {r.request_id: int(p) for r, p in zip(requests, drawn, strict=True)}
    parent = {r.request_id: r.parent_id for r in requests}

    def root(request_id: int) -> int:
        while parent.get(request_id, -1) >= 0:
            request_id = parent[request_id]
        return request_id

    return [dataclasses.replace(r, priority=own[root(r.request_id)]) for r in requests]


def requests_from_trace(
    trace: Trace,
    *,
    time_scale: float = 1.0,
    arrival_times_s: np.ndarray | None = None,
    salt: int = 0,
) -> list[Request]:
    """Requests replaying a trace: its arrivals × ``time_scale`` (or ``arrival_times_s`` for a
    length-only trace), its lengths, and its prefix structure where it has one.
    """
    if arrival_times_s is None:
        assert trace.arrival_s is not None, "a length-only trace needs arrival_times_s"
        arrival_times_s = trace.arrival_s * time_scale
    n = min(len(trace), len(arrival_times_s))
    requests = []
    for i in range(n):
        prompt = int(trace.prompt_tokens[i])
        if trace.segments is not None:
            segments = trace.segments[i]
        else:
            segments = ((_unique(salt, i, 0), prompt),)
        session = int(trace.session_ids[i]) if trace.session_ids is not None else -1
        priority = int(trace.priorities[i]) if trace.priorities is not None else 0
        requests.append(
            Request(
                request_id=i,
                arrival_s=float(arrival_times_s[i]),
                prompt_tokens=prompt,
                output_tokens=int(trace.output_tokens[i]),
                segments=tuple(segments),
                output_source_id=_unique(salt, i, 1),
                session_id=session,
                priority=priority,
            )
        )
    return requests
