"""Loaded replays: the server measured under the load its workloads put on it.

The isolated calibration points (:mod:`calibration.measure_plan`) each run alone on an idle
server. Near saturation a server runs full batches of mixed prefill and decode, with the host
busy streaming tokens to many clients at once; those steps are extrapolated from the isolated
points, not measured. ``servesim calibrate`` therefore spends the rest of its budget on loaded
replays of the scenario's own requests (its lengths and prefix structure; its arrivals are
replaced):

1. a **burst**: requests all sent at once, sized from the capacity the isolated fit predicts
   (at most :data:`BURST_MAX_BATCHES` full batches). Completed requests over its makespan is
   the server's capacity, measured live;
2. **Poisson** replays at 50% and 85% of that measured capacity.

Each replay is sized to its share of the budget that is left when it starts, so a burst that
took longer than planned (an optimistic isolated fit) shortens the replays after it.

Every replay streams its token times, and the engine steps are rebuilt from them
(:mod:`calibration.steps`): hundreds of loaded steps per replay. They are fitted together with
the isolated points, the two sources weighted equally whatever their counts (the isolated
points span the envelope's corners; the loaded steps are what workloads run). Each replay is then
left out in turn: the fit to the isolated points and the other replays predicts its steps, and
the simulator replays its requests at their real send times with those coefficients, so the
profile says how well it predicts a load it did not see (leave-one-workload-out).

The replays are run by a :class:`Runner`: :func:`live_runner` sends them to a server; tests use
a simulated server whose coefficients are known.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from calibration.fit import fit_steps, predict_seconds, usable_records
from calibration.observations import Observation
from calibration.records import at_send_times
from calibration.steps import RebuiltSteps, rebuild_steps
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.profile import FitReport
from sim.engine.request import Request
from sim.run import build, scenario_requests
from sim.scenario import Scenario

if TYPE_CHECKING:
    from live.replay import Target

#: The loaded replays: name, offered load as a fraction of the measured capacity (None: the
#: burst that measures it) and share of the loaded budget. The last one drains longest.
LOADS: tuple[tuple[str, float | None, float], ...] = (
    ("burst", None, 0.3),
    ("poisson 50%", 0.5, 0.3),
    ("poisson 85%", 0.85, 0.4),
)

#: The weights the loaded steps may carry against the isolated points (their share of the
#: total); :func:`fit_loaded` picks one by leave-one-replay-out. The isolated points span the
#: envelope's corners and carry the front end; the loaded steps are what workloads run, and a
#: server under load is slower per step than alone (host contention, caches).
LOADED_SHARES = (0.5, 0.8, 0.95)

#: The front end's host time per streamed token (``per_streamed_token_s``) is searched on this
#: many evenly spaced points from 0 to the most the replays allow, then refined around the best.
STREAMING_GRID = 7
STREAMING_REFINE_STEPS = 6
#: A cost is kept only if it predicts the replays better by more than this (mean |error| of
#: their TTFT and E2E means) than none: a front end that keeps up shows no cost to find, and a
#: smaller gain is the fit's noise.
STREAMING_MIN_GAIN = 0.01

#: Below this many seconds left for them, no loaded replay runs (the profile says so).
MIN_LOADED_S = 30.0
#: Requests per replay: enough steps to fit, few enough for a laptop's CPU server.
MIN_REQUESTS = 12
MAX_REQUESTS = 2000
#: The burst holds at most this many full batches (``max_num_seqs`` each): enough to measure
#: the capacity of a full server, and a bound on the budget it takes when the isolated fit, which
#: sizes it, overestimates the capacity.
BURST_MAX_BATCHES = 8


@dataclass(frozen=True)
class ReplayOutcome:
    """What a runner brings back from one replay."""

    records: pd.DataFrame
    token_times: pd.DataFrame
    # The server's own count of engine steps and of the tokens they computed during the replay
    # (vLLM's iteration_tokens_total histogram), when its /metrics could be read.
    server_steps: float | None = None
    server_tokens: float | None = None
    # vLLM's mean TTFT and its parts, in seconds (live.scrape.MetricsDelta.ttft_parts); None
    # without its /metrics or their phase histograms.
    server_ttft: dict[str, float] | None = None


class Runner(Protocol):
    """Sends ``requests`` (the scenario's, re-timed) and returns their records and token times;
    writes what it measured under ``out_dir``."""

    def __call__(
        self, scenario: Scenario, requests: list[Request], out_dir: Path
    ) -> ReplayOutcome: ...


@dataclass
class LoadedReplay:
    """One loaded replay: what was offered, what it gave, and the steps rebuilt from it."""

    name: str
    directory: Path
    requests: list[Request]
    outcome: ReplayOutcome
    offered_rps: float  # inf for the burst
    steps: RebuiltSteps
    # The front end's cost per streamed token the steps were rebuilt for (see rebuild_steps).
    steps_streamed_token_s: float = 0.0

    @property
    def completed_rps(self) -> float:
        return completed_rate(self.outcome.records)


@dataclass
class LoadedFit:
    """The joint fit and how it was scored."""

    coefficients: CalibratedCoefficients
    report: FitReport
    replays: list[dict[str, Any]] = field(default_factory=list)  # per replay, for the profile


def completed_rate(records: pd.DataFrame) -> float:
    """Completed requests per second over the makespan (first send to last finish); NaN when
    nothing completed."""
    ok = records[records["status"].astype(str) == "ok"]
    if ok.empty:
        return float("nan")
    span = float(ok["finish_s"].max() - records["arrival_s"].min())
    return len(ok) / span if span > 0 else float("nan")


def retimed_requests(scenario: Scenario, rate: float, count: int, seed: int) -> list[Request]:
    """``count`` of the scenario's requests (its lengths, prefixes and sessions; drawn with
    ``seed``), whose first turns arrive as a Poisson process of ``rate`` requests per second
    counting every turn (``inf``: all at once). Later turns still follow their parent."""
    workload = scenario.workload.model_copy(
        update={"num_requests": count, "duration_s": None, "max_concurrency": None}
    )
    requests = scenario_requests(scenario.model_copy(update={"workload": workload, "seed": seed}))
    roots = sorted(
        (i for i, r in enumerate(requests) if r.parent_id < 0),
        key=lambda i: (requests[i].arrival_s, i),
    )
    if math.isinf(rate):
        times = np.zeros(len(roots))
    else:
        root_rate = rate * len(roots) / len(requests)
        gaps = np.random.default_rng([seed, 17]).exponential(1.0 / root_rate, len(roots))
        times = np.cumsum(gaps) - gaps[0]  # the first one at 0
    retimed = list(requests)
    for i, at in zip(roots, times.tolist(), strict=True):
        retimed[i] = dataclasses.replace(requests[i], arrival_s=at)
    return retimed


def _open_loop(scenario: Scenario) -> Scenario:
    """The scenario with its workload sent open loop (replays set their own arrivals)."""
    workload = scenario.workload.model_copy(update={"max_concurrency": None})
    return scenario.model_copy(update={"workload": workload})


def simulated_capacity(scenario: Scenario, coefficients: CalibratedCoefficients) -> float:
    """Requests per second the server completes under a burst, as ``coefficients`` predict."""
    count = int(np.clip(4 * scenario.engine.max_num_seqs, MIN_REQUESTS, 512))
    requests = retimed_requests(scenario, math.inf, count, seed=scenario.seed)
    result = build(_open_loop(scenario), requests=requests, coefficients=coefficients).run()
    return completed_rate(result.records)


def run_loaded(
    scenario: Scenario,
    coefficients: CalibratedCoefficients,
    runner: Runner,
    out_dir: Path,
    budget_s: float,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    notes: list[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[LoadedReplay]:
    """The loaded replays of :data:`LOADS` within ``budget_s`` (see the module docstring),
    each under ``out_dir/<name>``. ``coefficients`` (the isolated fit) size the burst; the burst
    sizes the rest. Each replay gets its share of what is left of ``budget_s``; one that would
    overrun what is left even at :data:`MIN_REQUESTS` is not run, and ``notes`` say so (and
    when a replay was shortened). ``clock`` tells the seconds spent (a simulated server's own
    clock in tests)."""
    notes = notes if notes is not None else []
    if budget_s < MIN_LOADED_S:
        notes.append(
            f"no loaded replays: {budget_s:.0f} s of budget left for them, under "
            f"{MIN_LOADED_S:.0f} s; raise --budget"
        )
        return []
    start = clock()
    scenario = _open_loop(scenario)
    capacity = simulated_capacity(scenario, coefficients)
    replays: list[LoadedReplay] = []
    for index, (name, fraction, share) in enumerate(LOADS):
        if not capacity > 0 or not math.isfinite(capacity):
            notes.append(f"{name}: not run, no capacity to size it from")
            break
        # Each replay gets its share of what is left, so one that overran (a burst sized from
        # an optimistic isolated fit) shortens those after it instead of crowding them out.
        left_s = budget_s - (clock() - start)
        seconds = left_s * share / sum(later for _, _, later in LOADS[index:])
        rate = math.inf if fraction is None else fraction * capacity
        served = capacity if fraction is None else rate  # requests per second it will take
        most = MAX_REQUESTS
        if fraction is None:
            most = min(most, BURST_MAX_BATCHES * scenario.engine.max_num_seqs)
        count = int(np.clip(round(served * seconds), MIN_REQUESTS, max(most, MIN_REQUESTS)))
        planned_s = count / served
        if index > 0 and seconds < 0.5 * share * budget_s and planned_s <= 1.5 * left_s:
            notes.append(
                f"{name}: {count} requests (~{planned_s:.0f} s), shortened: the replays "
                f"before it took more than their share of the budget"
            )
        if planned_s > 1.5 * left_s:
            notes.append(
                f"{name}: not run, {count} requests would take ~{planned_s:.0f} s and "
                f"{left_s:.0f} s of budget are left"
            )
            break
        if progress is not None:
            progress(index, len(LOADS), f"{name}: {count} requests")
        requests = retimed_requests(scenario, rate, count, seed=scenario.seed + 1 + index)
        directory = out_dir / name.replace(" ", "_").replace("%", "pct")
        outcome = runner(scenario, requests, directory)
        steps = rebuild_steps(
            outcome.records,
            outcome.token_times,
            max_num_batched_tokens=scenario.engine.max_num_batched_tokens,
            arrival_delay_s=coefficients.frontend_overhead_s,
        )
        replay = LoadedReplay(name, directory, requests, outcome, rate, steps)
        replays.append(replay)
        if fraction is None:
            capacity = replay.completed_rps  # measured: what the Poisson loads are sized from
    if progress is not None:
        progress(len(LOADS), len(LOADS), "done")
    return replays


def replays_from_summary(
    scenario: Scenario, entries: Sequence[dict[str, Any]], *, max_num_batched_tokens: int
) -> list[LoadedReplay]:
    """The loaded replays that a fit's summary entries (:attr:`LoadedFit.replays`, a profile's
    ``data_summary.loaded_replays``) describe, read back from their directories with the
    requests :func:`run_loaded` sent: to refit them without the server."""
    scenario = _open_loop(scenario)
    names = [name for name, _, _ in LOADS]
    replays = []
    for entry in entries:
        rate = math.inf if entry["offered_rps"] is None else float(entry["offered_rps"])
        seed = scenario.seed + 1 + names.index(entry["name"])
        requests = retimed_requests(scenario, rate, int(entry["requests"]), seed=seed)
        directory = Path(entry["directory"])
        outcome = ReplayOutcome(
            pd.read_parquet(directory / "records.parquet"),
            pd.read_parquet(directory / "token_times.parquet"),
            server_steps=entry.get("server_steps"),
            server_tokens=None
            if entry.get("server_tokens_per_step") is None or not entry.get("server_steps")
            else float(entry["server_tokens_per_step"]) * float(entry["server_steps"]),
        )
        steps = rebuild_steps(
            outcome.records,
            outcome.token_times,
            max_num_batched_tokens=max_num_batched_tokens,
            arrival_delay_s=float(entry.get("arrival_delay_s", 0.0)),
        )
        replays.append(LoadedReplay(entry["name"], directory, requests, outcome, rate, steps))
    return replays


def _weighted(observations: Sequence[Observation], total: float) -> list[Observation]:
    """``observations`` reweighted so that their weights sum to ``total``."""
    own = sum(obs.weight for obs in observations)
    if not observations or own <= 0:
        return list(observations)
    return [dataclasses.replace(obs, weight=obs.weight * total / own) for obs in observations]


def _joint(
    isolated: Sequence[Observation], replays: Sequence[LoadedReplay], loaded_share: float
) -> tuple[CalibratedCoefficients, FitReport]:
    """One step fit to the isolated points and the replays' steps, the steps carrying
    ``loaded_share`` of the total weight (all of it when there are no isolated points)."""
    steps = [obs for replay in replays for obs in replay.steps.observations]
    isolated_weight = sum(obs.weight for obs in isolated)
    if not isolated_weight:
        return fit_steps(steps, method_name="isolated_points_and_loaded_steps")
    total = isolated_weight * loaded_share / (1.0 - loaded_share)
    return fit_steps(
        [*isolated, *_weighted(steps, total)], method_name="isolated_points_and_loaded_steps"
    )


def _held_out(
    scenario: Scenario,
    isolated: Sequence[Observation],
    replays: Sequence[LoadedReplay],
    loaded_share: float,
    *,
    streaming: bool = False,
) -> list[dict[str, float | str]]:
    """Each replay left out in turn: fitted on the isolated points and the others (at
    ``loaded_share``; with ``streaming``, the front end's cost per streamed token searched on
    the others too), its steps and its requests predicted."""
    held_out: list[dict[str, float | str]] = []
    for replay in replays:
        others = [r for r in replays if r is not replay]
        if streaming:
            fitted, _, cost = _fit_with_streaming(scenario, isolated, others, loaded_share)
            replay = _at_streaming_cost(scenario, replay, cost)
        else:
            fitted, _ = _joint(isolated, others, loaded_share)
        ttft, e2e = _request_errors(scenario, replay, fitted)
        held_out.append(
            {
                "workload": replay.name,
                "loaded_share": loaded_share,
                "per_streamed_token_s": fitted.per_streamed_token_s,
                "step_relative_error_mean": _step_error(fitted, replay.steps),
                "ttft_mean_error": ttft,
                "e2e_mean_error": e2e,
            }
        )
    return held_out


def streaming_bound(replays: Sequence[LoadedReplay]) -> float:
    """The most host time per streamed token the replays allow: no replay's front end can
    have spent longer on its tokens than the replay took (first send to last token). 0 when
    no replay completed a token."""
    bounds = []
    for replay in replays:
        records = usable_records(replay.outcome.records)
        tokens = float(records["output_tokens"].sum()) if not records.empty else 0.0
        if tokens <= 0:
            continue
        span = float(records["finish_s"].max() - replay.outcome.records["arrival_s"].min())
        if span > 0:
            bounds.append(span / tokens)
    return min(bounds) if bounds else 0.0


def _replays_score(
    scenario: Scenario, replays: Sequence[LoadedReplay], coefficients: CalibratedCoefficients
) -> float:
    """Mean |error| of the replays' simulated TTFT and E2E means (NaN counts as 100%)."""
    return _mean_abs_error(
        [error for replay in replays for error in _request_errors(scenario, replay, coefficients)]
    )


def streaming_cost(
    scenario: Scenario, replays: Sequence[LoadedReplay], coefficients: CalibratedCoefficients
) -> tuple[float, float]:
    """The front end's host time per streamed token under which the simulator, stepping with
    ``coefficients``, predicts the replays' TTFT and E2E means best, and that score (see
    :func:`_replays_score`): a grid from 0 to :func:`streaming_bound`, refined by a bounded
    scalar search between the best point's neighbours; 0 unless that beats no cost by
    :data:`STREAMING_MIN_GAIN`. The engine's steps do not show it (it
    delays tokens after their step); only a loaded replay's latencies do, when the front end
    streams near its limit."""
    from scipy.optimize import minimize_scalar

    def score(cost: float) -> float:
        fitted = dataclasses.replace(coefficients, per_streamed_token_s=cost)
        return _replays_score(scenario, replays, fitted)

    bound = streaming_bound(replays)
    if bound <= 0:
        return 0.0, score(0.0)
    grid = np.linspace(0.0, bound, STREAMING_GRID)
    scores = [score(float(cost)) for cost in grid]
    best = int(np.argmin(scores))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    refined = minimize_scalar(
        score,
        bounds=(float(low), float(high)),
        method="bounded",
        options={"maxiter": STREAMING_REFINE_STEPS, "xatol": bound * 1e-3},
    )
    cost, found = float(grid[best]), float(scores[best])
    if float(refined.fun) < found:
        cost, found = float(refined.x), float(refined.fun)
    if scores[0] <= found + STREAMING_MIN_GAIN:
        return 0.0, scores[0]  # no cost predicts them about as well: what it gains is noise
    return cost, found


def _held_out_score(held_out: Sequence[dict[str, float | str]]) -> float:
    """Mean |error| of the left-out replays' TTFT and E2E means (NaN counts as 100%)."""
    return _mean_abs_error(
        [float(entry[key]) for entry in held_out for key in ("ttft_mean_error", "e2e_mean_error")]
    )


def _mean_abs_error(errors: Sequence[float]) -> float:
    """Mean |error|, a NaN counting as 100% (a replay the simulator did not complete); inf
    when there is none."""
    scored = [abs(error) if math.isfinite(error) else 1.0 for error in errors]
    return float(np.mean(scored)) if scored else math.inf


def ttft_parts(records: pd.DataFrame, frontend_s: float) -> dict[str, float]:
    """A simulated run's mean TTFT split as vLLM's metrics split it (scrape.MetricsDelta):
    ``outside_engine`` (the front end and the wait for the step in progress), ``queue`` and
    ``prefill`` (scheduled to first token). The simulator's queue holds the wait for the step
    in progress, which vLLM counts outside the engine (its queue starts when the engine core
    takes the request, between steps), so the comparable parts are ``prefill`` and the sum of
    the other two."""
    ok = usable_records(records)
    return {
        "ttft": float(ok["ttft_s"].mean()),
        "outside_engine": frontend_s,
        "queue": float((ok["queue_s"] - frontend_s).mean()),
        "prefill": float((ok["first_token_s"] - ok["scheduled_s"]).mean()),
    }


def _request_errors(
    scenario: Scenario, replay: LoadedReplay, coefficients: CalibratedCoefficients
) -> tuple[float, float]:
    """The simulator's mean TTFT and E2E errors on ``replay`` (:func:`_simulated_errors`)."""
    ttft, e2e, _ = _simulated_errors(scenario, replay, coefficients)
    return ttft, e2e


def _simulated_errors(
    scenario: Scenario, replay: LoadedReplay, coefficients: CalibratedCoefficients
) -> tuple[float, float, pd.DataFrame | None]:
    """The simulator replaying ``replay``'s requests at their real send times with
    ``coefficients``: its mean TTFT and mean E2E over the live ones, less 1 (+ when the
    simulator is slower), over the requests that completed in both, and its records (None
    when no live request is usable, and nothing was simulated). Means, not a mean of
    per-request ratios: in a burst the server may serve the queue in another order than the
    simulator, which moves single requests' TTFT by the whole queue but not its mean."""
    measured = usable_records(replay.outcome.records)
    if measured.empty:
        return float("nan"), float("nan"), None
    requests = at_send_times(replay.requests, replay.outcome.records)
    simulated = build(scenario, requests=requests, coefficients=coefficients).run().records
    both = measured.merge(
        simulated[simulated["status"].astype(str) == "ok"][["request_id", "ttft_s", "e2e_s"]],
        on="request_id",
        suffixes=("", "_sim"),
    )
    if both.empty:
        return float("nan"), float("nan"), simulated
    return (
        float(both["ttft_s_sim"].mean() / both["ttft_s"].mean() - 1.0),
        float(both["e2e_s_sim"].mean() / both["e2e_s"].mean() - 1.0),
        simulated,
    )


def _step_seconds(
    coefficients: CalibratedCoefficients, steps: RebuiltSteps
) -> tuple[np.ndarray, np.ndarray]:
    """The rebuilt steps' measured seconds, and what ``coefficients`` predict for them."""
    observations = steps.observations
    measured = np.array([obs.seconds for obs in observations], dtype=np.float64)
    if not observations:
        return measured, np.zeros(0)
    return measured, predict_seconds(coefficients, observations)


def step_ratios(steps: RebuiltSteps, measured: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Where a fit misses the loaded steps, by kind: the median of measured / predicted
    (:func:`_step_seconds`) over the rebuilt steps that carry no prompt (``decode``) and over
    those that carry one (``prompt``), None where there are none, and how many steps each
    median is over."""
    carries = np.array([obs.batch.num_prefill_seqs > 0 for obs in steps.observations], dtype=bool)
    ratios = measured / predicted if measured.size else np.zeros(0)

    def median(chosen: np.ndarray) -> float | None:
        values = ratios[chosen]
        return float(np.median(values)) if values.size else None

    return {
        "decode": median(~carries),
        "prompt": median(carries),
        "decode_steps": int((~carries).sum()),
        "prompt_steps": int(carries.sum()),
    }


def _relative_error(measured: np.ndarray, predicted: np.ndarray) -> float:
    """Mean |relative error| of the predicted step seconds; NaN when there are none."""
    if not measured.size:
        return float("nan")
    return float(np.mean(np.abs(predicted - measured) / measured))


def _step_error(coefficients: CalibratedCoefficients, steps: RebuiltSteps) -> float:
    """Mean |relative error| of ``coefficients`` on rebuilt steps; NaN when there are none."""
    return _relative_error(*_step_seconds(coefficients, steps))


#: Rounds of (fit the steps, search the streaming cost, rebuild the steps at that cost).
STREAMING_ROUNDS = 2


def _at_streaming_cost(scenario: Scenario, replay: LoadedReplay, cost: float) -> LoadedReplay:
    """``replay`` with its steps rebuilt for a front end that streams ``cost`` per token."""
    if cost == replay.steps_streamed_token_s:
        return replay
    outcome = replay.outcome
    steps = rebuild_steps(
        outcome.records,
        outcome.token_times,
        max_num_batched_tokens=scenario.engine.max_num_batched_tokens,
        gap_s=replay.steps.gap_s,
        streamed_token_s=cost,
        arrival_delay_s=replay.steps.arrival_delay_s,
    )
    return dataclasses.replace(replay, steps=steps, steps_streamed_token_s=cost)


def _fit_with_streaming(
    scenario: Scenario,
    isolated: Sequence[Observation],
    replays: Sequence[LoadedReplay],
    loaded_share: float,
) -> tuple[CalibratedCoefficients, FitReport, float]:
    """The joint step fit with the front end's cost per streamed token: fit the steps, search
    the cost on the replays' latencies, rebuild their steps without the time their tokens spent
    in the front end (:func:`calibration.steps.rebuild_steps`), and again
    (:data:`STREAMING_ROUNDS` rounds). Returns the coefficients (the cost among them), the step
    fit's report and the cost."""
    coefficients, report = _joint(isolated, replays, loaded_share)
    cost = 0.0
    for round_ in range(STREAMING_ROUNDS):
        cost = streaming_cost(scenario, replays, coefficients)[0]
        if round_ == STREAMING_ROUNDS - 1 or cost == 0.0:
            break
        replays = [_at_streaming_cost(scenario, replay, cost) for replay in replays]
        coefficients, report = _joint(isolated, replays, loaded_share)
    return dataclasses.replace(coefficients, per_streamed_token_s=cost), report, cost


def _with_streaming(
    scenario: Scenario,
    isolated: Sequence[Observation],
    replays: Sequence[LoadedReplay],
    usable: Sequence[LoadedReplay],
    loaded_share: float,
    plain: tuple[CalibratedCoefficients, FitReport],
    plain_held_out: list[dict[str, float | str]],
    notes: list[str],
) -> tuple[CalibratedCoefficients, FitReport, list[LoadedReplay], list[dict[str, float | str]]]:
    """The fit with the front end's cost per streamed token (:func:`_fit_with_streaming`) if
    it predicts the replays better, else ``plain`` (the fit without it) and its held-out
    errors; ``notes`` say which and why. With several replays "better" is judged on each one
    left out in turn, with the cost found on the others: a cost that only fits the replays it
    was found on is not kept."""
    coefficients, report = plain
    plain_score = _replays_score(scenario, usable, coefficients)
    streamed, streamed_report, cost = _fit_with_streaming(scenario, isolated, usable, loaded_share)
    if cost == 0.0:
        notes.append(
            "front end: no cost per streamed token (none predicts the replays' TTFT and E2E "
            f"means better than {STREAMING_MIN_GAIN:.0%} over none, {plain_score:.1%})"
        )
        return coefficients, report, list(replays), plain_held_out
    streamed_score = _replays_score(scenario, usable, streamed)
    found = (
        f"{cost * 1e6:.1f} us of host time per streamed token predicts the replays' TTFT and "
        f"E2E means to {streamed_score:.1%} mean |error| ({plain_score:.1%} without it; searched "
        f"up to {streaming_bound(usable) * 1e6:.1f} us, the replays' own time per token)"
    )
    held_out: list[dict[str, float | str]] = []
    if len(usable) > 1:
        held_out = _held_out(scenario, isolated, usable, loaded_share, streaming=True)
        left_out, without = _held_out_score(held_out), _held_out_score(plain_held_out)
        if not left_out < without - STREAMING_MIN_GAIN:
            notes.append(
                f"front end: not kept: {found}, but left out in turn each replay was predicted "
                f"to {left_out:.1%} with the cost found on the others and {without:.1%} without"
            )
            return coefficients, report, list(replays), plain_held_out
        found += f"; left out in turn {left_out:.1%}, {without:.1%} without"
    notes.append(f"front end: {found}")
    rebuilt = [_at_streaming_cost(scenario, replay, cost) for replay in replays]
    return streamed, streamed_report, rebuilt, held_out


def fit_loaded(
    scenario: Scenario,
    isolated: Sequence[Observation],
    isolated_coefficients: CalibratedCoefficients,
    replays: Sequence[LoadedReplay],
    *,
    search_streaming: bool = False,
) -> LoadedFit:
    """The joint fit of the isolated points and the replays' steps, each replay scored with it
    and with the isolated fit, and each left out in turn (the report's ``held_out``).

    ``search_streaming`` also searches the front end's cost per streamed token
    (:func:`_with_streaming`). Off by default: on the ~85M CPU model (2026-12-06) it found 5 ms a
    token, passed leave-one-replay-out (2.7% against 7.7%), and made the held-out fidelity
    shapes worse (Poisson 90% TTFT +34%): it absorbs the engine's slower steps under load,
    which it is not.

    How much the loaded steps weigh against the isolated points is chosen by that
    leave-one-out: of :data:`LOADED_SHARES`, the share under which the left-out replays' TTFT
    and E2E means are predicted best (with fewer than two replays, the first share). The
    report's notes give every share's score.
    """
    scenario = _open_loop(scenario)
    usable = [r for r in replays if r.steps.observations]
    loaded_share = LOADED_SHARES[0]
    held_out: list[dict[str, float | str]] = []
    notes: list[str] = []
    if len(usable) > 1:
        trials = {share: _held_out(scenario, isolated, usable, share) for share in LOADED_SHARES}
        scores = {share: _held_out_score(trial) for share, trial in trials.items()}
        loaded_share = min(scores, key=lambda share: scores[share])
        held_out = trials[loaded_share]
        notes.append(
            f"loaded steps weigh {loaded_share:.0%} against the isolated points: the share "
            "whose left-out replays were predicted best (mean |error| of TTFT and E2E means: "
            + ", ".join(f"{share:.0%} → {score:.1%}" for share, score in scores.items())
            + ")"
        )
    elif usable:
        notes.append(
            f"loaded steps weigh {loaded_share:.0%} against the isolated points: one replay "
            "only, nothing to choose the share by"
        )
    coefficients, report = _joint(isolated, usable, loaded_share)
    if usable and search_streaming:
        coefficients, report, replays, held_out = _with_streaming(
            scenario,
            isolated,
            replays,
            usable,
            loaded_share,
            (coefficients, report),
            held_out,
            notes,
        )
    report = report.model_copy(update={"notes": [*report.notes, *notes]})
    summaries = []
    for replay in replays:
        outcome = replay.outcome
        rebuilt_tokens = sum(
            obs.batch.num_prefill_tokens + obs.batch.num_decode_seqs
            for obs in replay.steps.observations
        )
        entry: dict[str, Any] = {
            "name": replay.name,
            "directory": str(replay.directory),
            "requests": len(replay.requests),
            "offered_rps": None if math.isinf(replay.offered_rps) else replay.offered_rps,
            "completed_rps": _finite_or_none(replay.completed_rps),
            "token_bursts": replay.steps.num_bursts,
            "steps_rebuilt": len(replay.steps.observations),
            "steps_left_out": dict(replay.steps.skipped),
            "gap_s": replay.steps.gap_s,
            "arrival_delay_s": replay.steps.arrival_delay_s,
            "rebuilt_tokens_per_step": rebuilt_tokens / len(replay.steps.observations)
            if replay.steps.observations
            else None,
            "server_steps": outcome.server_steps,
            "server_tokens_per_step": outcome.server_tokens / outcome.server_steps
            if outcome.server_steps and outcome.server_tokens is not None
            else None,
        }
        entry["server_ttft"] = outcome.server_ttft
        for label, fitted in (("isolated_fit", isolated_coefficients), ("joint_fit", coefficients)):
            ttft, e2e, simulated = _simulated_errors(scenario, replay, fitted)
            if label == "joint_fit" and simulated is not None:
                entry["simulated_ttft"] = ttft_parts(simulated, fitted.frontend_overhead_s)
            seconds = _step_seconds(fitted, replay.steps)  # measured, predicted
            entry[label] = {
                "step_relative_error_mean": _finite_or_none(_relative_error(*seconds)),
                "step_ratio_median": step_ratios(replay.steps, *seconds),
                "ttft_mean_error": _finite_or_none(ttft),
                "e2e_mean_error": _finite_or_none(e2e),
            }
        summaries.append(entry)
    report = report.model_copy(update={"held_out": held_out})
    return LoadedFit(coefficients, report, summaries)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def live_runner(target: Target, vocab_size: int, salt: int) -> Runner:
    """A runner that replays on the server at ``target`` with token times recorded; each
    replay's prompts carry their own salt so no replay hits another's cached prefixes."""
    from live.replay import ReplayOptions
    from live.run import run_live
    from live.tokens import PromptTokens
    from sim.report.summary import token_times_frame

    replays = 0

    def run(scenario: Scenario, requests: list[Request], out_dir: Path) -> ReplayOutcome:
        nonlocal replays
        replays += 1
        result = run_live(
            scenario,
            target,
            PromptTokens(vocab_size, salt=salt + replays),
            out_dir=out_dir,
            # The fit replays each request at its real send time: a burst's lag is no error.
            options=ReplayOptions(record_token_times=True, lag_warning_s=math.inf),
            requests=requests,
        )
        result.write(out_dir)
        token_times = token_times_frame(result.replay.records)
        iteration = result.metrics.iteration_tokens if result.metrics is not None else None
        return ReplayOutcome(
            result.records,
            token_times
            if token_times is not None
            else pd.DataFrame(columns=["request_id", "token_index", "time_s"]),
            server_steps=iteration.count if iteration is not None and iteration.count else None,
            server_tokens=iteration.sum if iteration is not None and iteration.count else None,
            server_ttft=result.metrics.ttft_parts() if result.metrics is not None else None,
        )

    return run
