"""What to measure on a live vLLM server for calibration, and how much of it fits a time budget.

A :class:`MeasurementPlan` lists points of three kinds, which :mod:`calibration.measure_runner`
sends to a server and :mod:`calibration.measure_extract` turns into observations:

* **prefill** — one lone request with an ``L``-token prompt and ``max_tokens=2``; the plan keeps
  ``L`` within ``max_num_batched_tokens``, so the prompt is not chunked and its TTFT is one
  engine step (plus the front end).
* **cached prefill** — a prefill point whose prompt's first ``C`` tokens were computed by an
  earlier request (a system prompt, an earlier turn): the step computes ``L − C`` new tokens that
  attend to all ``L``, the case that ``prefill`` points (``C = 0``) leave to extrapolation.
* **decode** — ``B`` requests sent at once, each with a ``C``-token prompt. Each request asks for
  ``decode_tokens`` plus the number of steps the batch's prompts take to prefill (early requests
  decode while later prompts are still being prefilled), so the window where all ``B`` decode
  holds about ``decode_tokens`` pure decode steps. ``B`` is capped at ``max_num_seqs``.
* **shared decode** — a decode point whose ``B`` prompts start with the same ``P`` tokens (a
  system prompt): the backend may read that KV once for all of them (the CPU's caches keep it;
  on GPUs cascade attention reads a common prefix once), which the fit prices apart.
* **mixed** — a decode batch of ``B`` at context ``C`` running, into which a fresh ``L``-token
  prompt arrives; the decodes ask for :data:`MIXED_EXTRA_TOKENS` more tokens, so none finishes
  before the prefill lands.

:meth:`MeasurementPlan.points` orders the points so that each kind's extremes are measured
first, so a run stopped early by its budget still spans the ranges; prefill points run first,
shortest length first (the runner's stall floor is a fraction of the shortest lone-prefill
TTFT). :meth:`MeasurementPlan.for_budget` sizes a plan to a budget with rough per-repetition
costs (:class:`PointCost`), and :func:`parse_budget` reads a budget such as ``"10m"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sim.engine.scheduler import CASCADE_MIN_REQUESTS

#: Output tokens of a lone prefill request: the first comes from the prefill step itself.
PREFILL_MAX_TOKENS = 2
#: Extra output tokens of a mixed point's decodes, so none finishes before the prefill lands.
MIXED_EXTRA_TOKENS = 16

_PREFILL_LADDER = (32, 128, 512, 1024, 2048, 4096, 8192, 16384)
_BATCH_LADDER = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_MIN_CONTEXT = 64
#: A shared prefix is a multiple of this many tokens: whole blocks for every block size vLLM
#: allows up to 128.
SHARED_PREFIX_ALIGN = 128


@dataclass(frozen=True, slots=True)
class PointCost:
    """Rough seconds per repetition of each kind of point, used only to fit a plan to a budget.

    The defaults are those of the tiny test model on one CPU core (vLLM's CPU backend), which
    is slower than any GPU server: on a GPU a plan sized with them finishes well within its
    budget, which is the safe side. :func:`measure` rescales them by what the points it has
    already run actually took.
    """

    request_s: float = 0.02  # front end + scheduling of one request
    per_prefill_token_s: float = 6e-5
    step_s: float = 2e-3  # a decode step of one short sequence
    per_decode_seq_s: float = 5e-5
    per_context_token_s: float = 8e-7

    def decode_step_s(self, num_seqs: int, context_tokens: int) -> float:
        """One decode step of ``num_seqs`` sequences attending to ``context_tokens`` in all."""
        return (
            self.step_s
            + self.per_decode_seq_s * num_seqs
            + self.per_context_token_s * context_tokens
        )

    def prefill_s(self, num_tokens: int) -> float:
        """One lone prefill request of ``num_tokens`` tokens (TTFT plus its one decode step)."""
        return self.request_s + self.per_prefill_token_s * num_tokens + self.step_s

    def decode_s(self, num_seqs: int, context: int, num_steps: int) -> float:
        """A decode batch: prefilling every prompt, then ``num_steps`` decode steps."""
        prefill = self.request_s + self.per_prefill_token_s * num_seqs * context
        return prefill + num_steps * self.decode_step_s(num_seqs, num_seqs * context)


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement point: what to send, and how it was ordered in the plan."""

    kind: str  # "prefill" | "decode" | "mixed"
    prompt_tokens: int = 0  # L of a prefill or of the prefill arriving in a mixed point
    batch_size: int = 0  # B of a decode or mixed point
    context_tokens: int = 0  # C of a decode or mixed point
    max_tokens: int = PREFILL_MAX_TOKENS  # output tokens per decode request
    shared_prefix_tokens: int = 0  # P of a shared decode point: leading tokens all prompts share
    cached_tokens: int = 0  # C of a cached prefill point: leading tokens computed beforehand

    @property
    def label(self) -> str:
        """A short description for progress bars and logs."""
        match self.kind:
            case "prefill":
                cached = f" cached={self.cached_tokens}" if self.cached_tokens else ""
                return f"prefill L={self.prompt_tokens}{cached}"
            case "decode":
                shared = f" P={self.shared_prefix_tokens}" if self.shared_prefix_tokens else ""
                return f"decode B={self.batch_size} C={self.context_tokens}{shared}"
            case _:
                return f"mixed B={self.batch_size} C={self.context_tokens} L={self.prompt_tokens}"

    def params(self) -> dict[str, int]:
        """The point's parameters, as recorded in ``Measurement.raw``."""
        match self.kind:
            case "prefill":
                if self.cached_tokens:
                    return {
                        "prompt_tokens": self.prompt_tokens,
                        "cached_tokens": self.cached_tokens,
                    }
                return {"prompt_tokens": self.prompt_tokens}
            case "decode":
                params = {
                    "batch_size": self.batch_size,
                    "context_tokens": self.context_tokens,
                    "max_tokens": self.max_tokens,
                }
                if self.shared_prefix_tokens:
                    params["shared_prefix_tokens"] = self.shared_prefix_tokens
                return params
            case _:
                return {
                    "batch_size": self.batch_size,
                    "context_tokens": self.context_tokens,
                    "prompt_tokens": self.prompt_tokens,
                    "max_tokens": self.max_tokens,
                }


@dataclass(frozen=True)
class MeasurementPlan:
    """What to measure on a live server, and the engine limits the plan was sized for.

    ``max_model_len``, ``max_num_seqs`` and ``max_num_batched_tokens`` are the server's limits
    when known (:meth:`for_budget` sets them): prefill lengths must then fit in one step
    (``L ≤ max_num_batched_tokens``, else the prompt is chunked and its TTFT is several steps),
    decode batches above ``max_num_seqs`` are capped to it, and a decode batch's requests ask for
    extra tokens covering the steps their prompts take to prefill. ``None``: unknown, no checks.

    Mixed points: a prefill of the middle prefill length arriving into a decode batch at the
    smallest context, for the smallest and the largest decode batch (at most ``max_num_seqs − 1``,
    or the scheduler would not admit the prefill until a decode finished).
    """

    prefill_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_tokens: int = 32
    mixed: bool = True
    shared_prefix: bool = True
    cached_prefill: bool = True
    repetitions: int = 3
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("prefill_lengths", "decode_batches", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"MeasurementPlan.{name}: must be positive ints, got {values!r}")
        if self.decode_tokens < 2:
            raise ValueError(
                f"MeasurementPlan.decode_tokens: must be >= 2 (one gap between two tokens), "
                f"got {self.decode_tokens}"
            )
        if self.repetitions < 1:
            raise ValueError(f"MeasurementPlan.repetitions: must be >= 1, got {self.repetitions}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"MeasurementPlan.{name}: must be >= 1 or None, got {value}")
        limit = self.max_num_batched_tokens
        if limit is not None and max(self.prefill_lengths) > limit:
            raise ValueError(
                f"MeasurementPlan.prefill_lengths: {max(self.prefill_lengths)} exceeds "
                f"max_num_batched_tokens={limit}, so its prefill would be chunked over several "
                "steps; keep lengths <= max_num_batched_tokens"
            )
        if self.max_model_len is not None:
            if max(self.prefill_lengths) + PREFILL_MAX_TOKENS > self.max_model_len:
                raise ValueError(
                    f"MeasurementPlan.prefill_lengths: {max(self.prefill_lengths)} + "
                    f"{PREFILL_MAX_TOKENS} output tokens exceeds max_model_len="
                    f"{self.max_model_len}; shorten the prompts"
                )
            if max(self.decode_contexts) + self.decode_tokens > self.max_model_len:
                raise ValueError(
                    f"MeasurementPlan.decode_contexts: {max(self.decode_contexts)} + "
                    f"decode_tokens {self.decode_tokens} exceeds max_model_len="
                    f"{self.max_model_len}; shorten the contexts"
                )

    @classmethod
    def for_budget(
        cls,
        budget_s: float,
        *,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        decode_tokens: int = 32,
        cost: PointCost | None = None,
    ) -> MeasurementPlan:
        """The richest plan whose estimated duration fits ``budget_s``, within the engine limits.

        Ranges: prefill lengths climb ``32, 128, 512, 1024, 2048, …`` up to the longest prompt one
        step can take (``min(max_num_batched_tokens, max_model_len − 2)``), which is always
        included; decode batches climb ``1, 4, 8, 16, 32, …`` up to ``max_num_seqs`` (included);
        decode contexts are 64, the largest (``(max_model_len − decode_tokens) / 2``, leaving room
        for the tokens generated while the batch's prompts prefill) and their geometric middle.

        Size: candidates from richest to poorest, the first whose estimated duration (the plan's
        points × repetitions, each costed with ``cost``, default :class:`PointCost`, plus the
        warm-up) fits is returned: 5 repetitions of everything; 3; at most 4 prefill lengths and
        4 decode batches; 2 contexts; 2 repetitions; no mixed points; and finally the smallest
        plan the fit can still separate its terms with (3 prefill lengths, 2 batches × 2
        contexts, 1 repetition), returned even when it does not fit — :func:`measure` then stops
        at the budget.
        """
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise ValueError(f"budget_s: must be a positive number of seconds, got {budget_s}")
        for name, value in (
            ("max_model_len", max_model_len),
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        if max_model_len < decode_tokens + 2 * PREFILL_MAX_TOKENS:
            raise ValueError(
                f"max_model_len: {max_model_len} leaves no room for decode_tokens="
                f"{decode_tokens}; lower decode_tokens"
            )
        cost = cost or PointCost()
        longest = min(max_num_batched_tokens, max_model_len - PREFILL_MAX_TOKENS)
        lengths = _ladder(_PREFILL_LADDER, longest)
        batches = _ladder(_BATCH_LADDER, max_num_seqs)
        largest_context = max(1, (max_model_len - decode_tokens) // 2)
        smallest_context = min(_MIN_CONTEXT, largest_context)
        middle = 2 ** round(math.log2(smallest_context * largest_context) / 2)
        contexts = tuple(sorted({smallest_context, middle, largest_context}))
        base = cls(
            prefill_lengths=lengths,
            decode_batches=batches,
            decode_contexts=contexts,
            decode_tokens=decode_tokens,
            mixed=True,
            repetitions=5,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        candidates = [base, replace(base, repetitions=3)]
        thinner = replace(
            candidates[-1],
            prefill_lengths=_thin(lengths, 4),
            decode_batches=_thin(batches, 4),
        )
        candidates.append(thinner)
        candidates.append(replace(thinner, decode_contexts=_thin(contexts, 2)))
        candidates.append(replace(candidates[-1], repetitions=2))
        candidates.append(replace(candidates[-1], mixed=False))
        candidates.append(replace(candidates[-1], shared_prefix=False, cached_prefill=False))
        smallest = replace(
            candidates[-1],
            prefill_lengths=_thin(lengths, 3),
            decode_batches=_thin(batches, 2),
            repetitions=1,
        )
        candidates.append(smallest)
        for plan in candidates:
            if plan.estimated_duration_s(cost) <= budget_s:
                return plan
        return smallest

    def points(self) -> list[Point]:
        """The plan's points in run order: each kind's extremes first, then the rest."""
        points = [
            Point("prefill", prompt_tokens=length)
            for length in _extremes_first(self.prefill_lengths)
        ]
        batches = self.capped_batches()
        for batch, context in _corners_first(batches, tuple(sorted(set(self.decode_contexts)))):
            points.append(
                Point(
                    "decode",
                    batch_size=batch,
                    context_tokens=context,
                    max_tokens=self.decode_tokens + self.ramp_steps(batch, context),
                )
            )
        points.extend(self.cached_prefill_points())
        points.extend(self.shared_points())
        if self.mixed:
            length = sorted(self.prefill_lengths)[len(self.prefill_lengths) // 2]
            context = min(self.decode_contexts)
            # At max_num_seqs running, the scheduler admits no new request: leave a seat free.
            seats = self.max_num_seqs - 1 if self.max_num_seqs is not None else max(batches)
            for batch in sorted({min(min(batches), seats), min(max(batches), seats)}):
                if batch < 1:
                    continue
                if self.max_num_batched_tokens is not None:
                    # The prefill shares its step with the batch's decodes and must fit in it.
                    length = min(length, self.max_num_batched_tokens - batch)
                if length < 1:
                    continue
                max_tokens = self.decode_tokens + self.ramp_steps(batch, context)
                points.append(
                    Point(
                        "mixed",
                        prompt_tokens=length,
                        batch_size=batch,
                        context_tokens=context,
                        max_tokens=max_tokens + MIXED_EXTRA_TOKENS,
                    )
                )
        return points

    def cached_prefill_points(self) -> list[Point]:
        """Cached prefill points: the shortest and the middle prefill length computed after a
        cached prefix of the largest decode context (aligned down to whole blocks, see
        :data:`SHARED_PREFIX_ALIGN`), kept within one step and ``max_model_len``."""
        if not self.cached_prefill:
            return []
        cached = max(self.decode_contexts) // SHARED_PREFIX_ALIGN * SHARED_PREFIX_ALIGN
        if cached < SHARED_PREFIX_ALIGN:
            return []
        lengths = sorted(set(self.prefill_lengths))
        points = []
        for new in dict.fromkeys([lengths[0], lengths[len(lengths) // 2]]):
            if self.max_model_len is not None:
                new = min(new, self.max_model_len - PREFILL_MAX_TOKENS - cached)
            if new < 1:
                continue
            points.append(Point("prefill", prompt_tokens=cached + new, cached_tokens=cached))
        return list(dict.fromkeys(points))

    def shared_points(self) -> list[Point]:
        """Shared decode points: the largest batch (of at least 8) at the largest context,
        all but its last :data:`_MIN_CONTEXT` tokens a prefix the batch shares (a multiple of
        :data:`SHARED_PREFIX_ALIGN`, so whole KV blocks are shared), and at the middle context
        when there is one."""
        if not self.shared_prefix:
            return []
        batch = max(self.capped_batches())
        if batch < CASCADE_MIN_REQUESTS:
            return []  # GPUs read a common prefix once only from 8 requests on
        points = []
        contexts = sorted(set(self.decode_contexts))
        for context in dict.fromkeys([contexts[-1], contexts[len(contexts) // 2]]):
            prefix = (context - _MIN_CONTEXT) // SHARED_PREFIX_ALIGN * SHARED_PREFIX_ALIGN
            if prefix < SHARED_PREFIX_ALIGN:
                continue
            points.append(
                Point(
                    "decode",
                    batch_size=batch,
                    context_tokens=context,
                    max_tokens=self.decode_tokens + self.ramp_steps(batch, context),
                    shared_prefix_tokens=prefix,
                )
            )
        return points

    def capped_batches(self) -> tuple[int, ...]:
        """Decode batch sizes, capped at ``max_num_seqs`` when it is known (duplicates merged)."""
        cap = self.max_num_seqs
        return tuple(sorted({min(b, cap) if cap is not None else b for b in self.decode_batches}))

    def ramp_steps(self, batch_size: int, context_tokens: int) -> int:
        """Steps a decode batch's prompts take to prefill: extra tokens each request asks for.

        Limited so that prompt plus output stays within ``max_model_len``.
        """
        if self.max_num_batched_tokens is None:
            return 1
        steps = -(-batch_size * context_tokens // self.max_num_batched_tokens)
        if self.max_model_len is not None:
            steps = min(steps, self.max_model_len - context_tokens - self.decode_tokens)
        return max(0, steps)

    def estimated_duration_s(self, cost: PointCost | None = None) -> float:
        """Estimated seconds to run the plan (warm-up included), with ``cost`` per repetition."""
        cost = cost or PointCost()
        warmup = Point("prefill", prompt_tokens=max(self.prefill_lengths))
        total = estimate_point_s(warmup, cost) + 4 * cost.prefill_s(64)
        for point in self.points():
            total += self.repetitions * estimate_point_s(point, cost)
        return total


def estimate_point_s(point: Point, cost: PointCost) -> float:
    """Estimated seconds for one repetition of ``point``."""
    match point.kind:
        case "prefill" if point.cached_tokens:
            # The prefix is computed first (once), then the remaining tokens.
            return cost.prefill_s(point.cached_tokens) + cost.prefill_s(
                point.prompt_tokens - point.cached_tokens
            )
        case "prefill":
            return cost.prefill_s(point.prompt_tokens)
        case "decode":
            return cost.decode_s(point.batch_size, point.context_tokens, point.max_tokens)
        case _:
            return cost.decode_s(
                point.batch_size, point.context_tokens, point.max_tokens
            ) + cost.prefill_s(point.prompt_tokens)


def _ladder(ladder: Sequence[int], cap: int) -> tuple[int, ...]:
    """Ladder values below ``cap``, then ``cap`` itself."""
    return (*[v for v in ladder if v < cap], cap)


def _thin(values: Sequence[int], count: int) -> tuple[int, ...]:
    """At most ``count`` of ``values`` (sorted), keeping both ends and spreading the rest."""
    ordered = sorted(set(values))
    if len(ordered) <= count:
        return tuple(ordered)
    if count == 1:
        return (ordered[-1],)
    indices = {round(i * (len(ordered) - 1) / (count - 1)) for i in range(count)}
    return tuple(ordered[i] for i in sorted(indices))


def _extremes_first(values: Sequence[int]) -> list[int]:
    ordered = sorted(set(values))
    if len(ordered) <= 2:
        return ordered
    return [ordered[0], ordered[-1], *ordered[1:-1]]


def _corners_first(batches: Sequence[int], contexts: Sequence[int]) -> list[tuple[int, int]]:
    grid = [(b, c) for b in batches for c in contexts]
    corners = [
        (batches[0], contexts[0]),
        (batches[-1], contexts[-1]),
        (batches[-1], contexts[0]),
        (batches[0], contexts[-1]),
    ]
    first = list(dict.fromkeys(corners))
    return first + [p for p in grid if p not in first]


_BUDGET_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_budget(text: str) -> float:
    """Seconds from a duration such as ``"10m"``, ``"90s"``, ``"1h"``, ``"2m30s"`` or ``"45"``.

    Units ``h``, ``m``, ``s`` in that order, each at most once; a bare number is seconds.
    Raises ValueError naming the expected format.
    """
    cleaned = text.strip().lower().replace(" ", "")
    expected = (
        f"budget {text!r}: expected a duration like '90s', '10m', '1h' or '2m30s' "
        "(hours h, minutes m, seconds s, largest first; a bare number is seconds)"
    )
    if not cleaned:
        raise ValueError(expected)
    try:
        seconds = float(cleaned)
    except ValueError:
        pass
    else:
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(expected)
        return seconds
    position = 0
    total = 0.0
    units_seen = ""
    for match in _BUDGET_PART.finditer(cleaned):
        if match.start() != position:
            raise ValueError(expected)
        unit = match.group(2)
        if unit in units_seen or (units_seen and "hms".index(unit) <= "hms".index(units_seen[-1])):
            raise ValueError(expected)
        units_seen += unit
        total += float(match.group(1)) * _UNIT_S[unit]
        position = match.end()
    if position != len(cleaned) or not total > 0:
        raise ValueError(expected)
    return total
