"""Engine steps rebuilt from streamed token times: thousands of loaded steps from one live run.

A streaming server sends the tokens a step produced as soon as the step ends, so the tokens of
many requests that arrive together close one step, and the time between two such bursts is the
step between them. What each step computed follows from whose tokens it carried: a request's
first token ends its prefill (its prompt less the tokens its prefix-cache hit skipped), any
later token *k* a decode over its prompt plus *k* tokens. Those steps are observations for the
same least-squares step fit as the isolated calibration points (:func:`calibration.fit.fit_steps`),
but measured under the load, the batch mix and the host contention the run really had.

A gap is a step's duration only when the engine was busy through it: every request that
decodes in a step must have decoded in the one before (else a step left no token, as a prompt
chunk that completes nothing does, and two steps merged), and some request must carry over (a
step after an idle engine has no start). Steps carrying a prompt longer than one chunk are
left out too: an earlier chunk of it was computed in a step the times cannot see.

The front end (HTTP, tokenisation, streaming) is not in a step: it is estimated from requests
that arrived at an idle engine, whose TTFT is the front end plus their prefill step alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.fit import predict_seconds
from calibration.observations import Observation
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import BatchShape, prefill_chunk_pairs

#: Tokens closer together than this end the same step when the run's own gaps do not show
#: where one step's tokens end and the next step's begin (see :func:`step_gap_s`).
DEFAULT_GAP_S = 0.002


def step_gap_s(times: np.ndarray) -> float:
    """The gap between consecutive streamed tokens above which a new step's tokens begin.

    The gaps have two modes on a log scale: tokens of one step leave the server one after
    another (tens of µs apart; a few ms when the API server is busy), steps follow each other
    tens of ms apart or more. The cut is the emptiest bin of the smoothed histogram of log10
    gaps between its two highest peaks, when they are at least a decade apart; otherwise (every
    token of a step at the same instant, as in a simulation) :data:`DEFAULT_GAP_S`.
    """
    gaps = np.diff(np.sort(times))
    gaps = gaps[gaps > 0]
    if gaps.size < 10:
        return DEFAULT_GAP_S
    edges = np.arange(-6.0, 2.05, 0.1)  # 1 µs to 100 s, ten bins a decade
    counts, _ = np.histogram(np.log10(gaps), bins=edges)
    smooth = np.convolve(counts, np.ones(3) / 3, mode="same")
    peaks = [
        i
        for i in range(len(smooth))
        if smooth[i] > 0
        and smooth[i] >= smooth[max(i - 1, 0)]
        and smooth[i] >= smooth[min(i + 1, len(smooth) - 1)]
    ]
    if len(peaks) < 2:
        return DEFAULT_GAP_S
    first, second = sorted(sorted(peaks, key=lambda i: smooth[i])[-2:])
    if second - first < 10:
        return DEFAULT_GAP_S
    valley = first + int(np.argmin(smooth[first : second + 1]))
    return float(10 ** edges[valley + 1])


@dataclass
class RebuiltSteps:
    """The steps a run's token times tell, and how many could not be used and why."""

    gap_s: float = DEFAULT_GAP_S  # tokens closer together than this ended one step
    arrival_delay_s: float = 0.0  # from a request's send to the engine's receiving it
    observations: list[Observation] = field(default_factory=list)
    num_bursts: int = 0  # token bursts: one per step that produced a token
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> steps left out

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def read_token_times(run_dir: str | Path) -> pd.DataFrame:
    """``token_times.parquet`` of a run directory (``servesim run`` or ``servesim live run``
    with ``output.record_token_times``); ValueError naming the fix when there is none."""
    path = Path(run_dir) / "token_times.parquet"
    if not path.is_file():
        raise ValueError(
            f"--records {run_dir}: no token_times.parquet to rebuild steps from; run it with "
            "output: {record_token_times: true}"
        )
    frame = pd.read_parquet(path)
    missing = {"request_id", "token_index", "time_s"} - set(frame.columns)
    if missing:
        raise ValueError(f"--records {path}: lacks columns {', '.join(sorted(missing))}")
    return frame


def rebuild_steps(
    records: pd.DataFrame,
    token_times: pd.DataFrame,
    *,
    max_num_batched_tokens: int,
    gap_s: float | None = None,
    streamed_token_s: float = 0.0,
    arrival_delay_s: float = 0.0,
) -> RebuiltSteps:
    """The engine steps between bursts of streamed tokens (see the module docstring).

    ``records`` give each request's prompt and cached tokens (servesim records); ``token_times``
    every streamed token as ``(request_id, token_index, time_s)``. Tokens less than ``gap_s``
    apart belong to one step (default: :func:`step_gap_s` of the run's own gaps).

    ``streamed_token_s``: the front end's host time per streamed token
    (:meth:`sim.engine.replica.Replica.delivered_s`). A burst of ``n`` tokens whose last left at
    ``d`` then ended its step at ``d - n * streamed_token_s`` if the front end was idle by then;
    if that is not after the previous burst had left (plus ``gap_s``), the front end was still
    busy and the step's end is unknown: the steps on either side of it are left out
    ("front end busy").

    Each step counts the requests the engine received while it ran (``Observation.arrivals``):
    those whose send time (the records' ``arrival_s``) plus ``arrival_delay_s`` falls in it.
    The simulator hands a request to the engine ``frontend_overhead_s`` after its send, so a
    calibration passes its front end.
    """
    rows = records.set_index("request_id")[["prompt_tokens", "cached_tokens"]]
    # When each request was sent: those sent while a step ran cost it host time.
    sends = (
        np.sort(records["arrival_s"].to_numpy(dtype=np.float64))
        if "arrival_s" in records.columns
        else np.zeros(0)
    )
    sends = sends[np.isfinite(sends)] + arrival_delay_s
    times = token_times.sort_values(["time_s", "request_id", "token_index"], kind="stable")
    time = times["time_s"].to_numpy(dtype=np.float64)
    gap_s = step_gap_s(time) if gap_s is None else gap_s
    if gap_s <= 0:
        raise ValueError(f"gap_s: must be > 0, got {gap_s}")
    result = RebuiltSteps(gap_s=gap_s, arrival_delay_s=arrival_delay_s)
    if time.size == 0:
        return result
    burst_of = np.concatenate([[0], np.cumsum(np.diff(time) > gap_s)])
    request = times["request_id"].to_numpy()
    index = times["token_index"].to_numpy()
    starts = np.flatnonzero(np.r_[True, burst_of[1:] != burst_of[:-1]])
    ends = np.r_[starts[1:], time.size]
    result.num_bursts = len(starts)
    ids = rows.index.astype(int).tolist()
    prompt = dict(zip(ids, rows["prompt_tokens"].astype(int).tolist(), strict=True))
    cached = dict(zip(ids, rows["cached_tokens"].astype(int).tolist(), strict=True))
    # The burst each request's latest token came in (to tell a step that left no token).
    last_burst: dict[int, int] = {}
    previous_end = np.nan
    previous_left = -np.inf  # when the previous burst's last token left the front end
    for burst, (start, end) in enumerate(zip(starts, ends, strict=True)):
        shape, reason = _shape(
            request[start:end],
            index[start:end],
            burst,
            last_burst,
            prompt,
            cached,
            max_num_batched_tokens,
        )
        began = time[start]
        if streamed_token_s:
            # The step ended when the front end began streaming its tokens, known only if the
            # front end had sent the previous burst's by then.
            began = time[end - 1] - (end - start) * streamed_token_s
            if not began > previous_left + gap_s:
                began = np.nan
                reason = reason or "front end busy"
            previous_left = time[end - 1]
        if reason:
            result.skip(reason)
        elif streamed_token_s and not np.isfinite(previous_end):
            result.skip("front end busy")  # the step before ended while it was
        else:
            assert shape is not None
            arrived = np.searchsorted(sends, began, side="right") - np.searchsorted(
                sends, previous_end, side="right"
            )
            result.observations.append(
                Observation(
                    shape, float(began - previous_end), kind=_kind(shape), arrivals=float(arrived)
                )
            )
        for r in request[start:end]:
            last_burst[int(r)] = burst
        previous_end = began
    return result


def _shape(
    requests: np.ndarray,
    indices: np.ndarray,
    burst: int,
    last_burst: dict[int, int],
    prompt: dict[int, int],
    cached: dict[int, int],
    budget: int,
) -> tuple[BatchShape | None, str]:
    """The step that ended in this burst, or why it cannot be told."""
    prefill_tokens = prefill_seqs = pairs = prefill_context = 0
    decode_seqs = decode_context = 0
    carried = False
    seen: set[int] = set()
    for request_id, k in zip(requests.tolist(), indices.tolist(), strict=True):
        if request_id in seen:
            return None, "several tokens of one request in one burst (steps merged)"
        seen.add(request_id)
        if request_id not in prompt:
            return None, "a token of a request the records do not have"
        if k == 0:
            hit = int(cached[request_id])
            new = int(prompt[request_id]) - hit
            if new > budget:
                return None, "a prompt longer than one chunk"
            prefill_seqs += 1
            prefill_tokens += new
            prefill_context += hit
            pairs += prefill_chunk_pairs(new, hit)
            continue
        if last_burst.get(request_id) != burst - 1:
            return None, "a step that left no token before it"
        carried = True
        decode_seqs += 1
        decode_context += int(prompt[request_id]) + int(k)
    if not carried:
        return None, "no request carried over: the engine may have idled before it"
    return (
        BatchShape(
            num_prefill_tokens=prefill_tokens,
            num_prefill_seqs=prefill_seqs,
            num_decode_seqs=decode_seqs,
            prefill_attention_pairs=pairs,
            prefill_context_tokens=prefill_context,
            decode_context_tokens=decode_context,
            num_sampled=prefill_seqs + decode_seqs,
        ),
        "",
    )


def _kind(shape: BatchShape) -> str:
    if shape.num_prefill_seqs and shape.num_decode_seqs:
        return "mixed"
    return "prefill" if shape.num_prefill_seqs else "decode"


def frontend_from_idle_arrivals(
    records: pd.DataFrame,
    token_times: pd.DataFrame,
    coefficients: CalibratedCoefficients,
    *,
    gap_s: float = DEFAULT_GAP_S,
) -> tuple[float, int]:
    """The front end's time per request, and from how many requests: the median of TTFT less
    the predicted prefill step over requests that found the engine idle (no token of another
    request between their arrival and their first token). NaN when no request did."""
    times = np.sort(token_times["time_s"].to_numpy(dtype=np.float64))
    ok = records["status"] == "ok" if "status" in records else np.ones(len(records), dtype=bool)
    rows = records[ok & np.isfinite(records["first_token_s"].to_numpy(dtype=np.float64))]
    arrivals = rows["arrival_s"].to_numpy(dtype=np.float64)
    firsts = rows["first_token_s"].to_numpy(dtype=np.float64)
    prompts = rows["prompt_tokens"].to_numpy(dtype=np.int64)
    hits = rows["cached_tokens"].to_numpy(dtype=np.int64)
    # Any token but its own first one from its arrival to the end of its first token's burst:
    # another request's step ran before it, or beside it.
    window = np.searchsorted(times, firsts + gap_s, side="right") - np.searchsorted(
        times, arrivals, side="right"
    )
    estimates = []
    for arrival, first_token, prompt, hit in zip(
        arrivals[window <= 1],
        firsts[window <= 1],
        prompts[window <= 1],
        hits[window <= 1],
        strict=True,
    ):
        new = int(prompt - hit)
        step = BatchShape(
            num_prefill_tokens=new,
            num_prefill_seqs=1,
            prefill_attention_pairs=prefill_chunk_pairs(new, int(hit)),
            prefill_context_tokens=int(hit),
            num_sampled=1,
        )
        predicted = float(predict_seconds(coefficients, [Observation(step, 1.0, "prefill")])[0])
        estimates.append(float(first_token - arrival) - predicted)
    if not estimates:
        return float("nan"), 0
    return max(0.0, float(np.median(estimates))), len(estimates)
