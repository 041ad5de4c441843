"""The front end's host time per streamed token, searched on loaded replays' latencies.

The engine's steps do not show this cost (it delays tokens after their step); only a loaded
replay's TTFT and E2E do, when the API server streams near its limit. ``servesim calibrate``
searches it only when asked (:func:`calibration.loaded.fit_loaded`'s ``search_streaming``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from calibration.fit import usable_records
from calibration.observations import Observation
from calibration.replay_fit import (
    FitOthers,
    LoadedReplay,
    held_out,
    held_out_score,
    joint_fit,
    replays_score,
)
from calibration.steps import rebuild_steps
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.profile import FitReport
from sim.scenario import Scenario

#: The front end's host time per streamed token (``per_streamed_token_s``) is searched on this
#: many evenly spaced points from 0 to the most the replays allow, then refined around the best.
STREAMING_GRID = 7
STREAMING_REFINE_STEPS = 6
#: A cost is kept only if it predicts the replays better by more than this (mean |error| of
#: their TTFT and E2E means) than none: a front end that keeps up shows no cost to find, and a
#: smaller gain is the fit's noise.
STREAMING_MIN_GAIN = 0.01
#: Rounds of (fit the steps, search the streaming cost, rebuild the steps at that cost).
STREAMING_ROUNDS = 2


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


def streaming_cost(
    scenario: Scenario, replays: Sequence[LoadedReplay], coefficients: CalibratedCoefficients
) -> tuple[float, float]:
    """The front end's host time per streamed token under which the simulator, stepping with
    ``coefficients``, predicts the replays' TTFT and E2E means best, and that score (see
    :func:`replays_score`): a grid from 0 to :func:`streaming_bound`, refined by a bounded
    scalar search between the best point's neighbours; 0 unless that beats no cost by
    :data:`STREAMING_MIN_GAIN`. The engine's steps do not show it (it
    delays tokens after their step); only a loaded replay's latencies do, when the front end
    streams near its limit."""
    from scipy.optimize import minimize_scalar

    def score(cost: float) -> float:
        fitted = dataclasses.replace(coefficients, per_streamed_token_s=cost)
        return replays_score(scenario, replays, fitted)

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


def at_streaming_cost(scenario: Scenario, replay: LoadedReplay, cost: float) -> LoadedReplay:
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


def fit_with_streaming(
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
    coefficients, report = joint_fit(isolated, replays, loaded_share)
    cost = 0.0
    for round_ in range(STREAMING_ROUNDS):
        cost = streaming_cost(scenario, replays, coefficients)[0]
        if round_ == STREAMING_ROUNDS - 1 or cost == 0.0:
            break
        replays = [at_streaming_cost(scenario, replay, cost) for replay in replays]
        coefficients, report = joint_fit(isolated, replays, loaded_share)
    return dataclasses.replace(coefficients, per_streamed_token_s=cost), report, cost


def with_streaming(
    scenario: Scenario,
    isolated: Sequence[Observation],
    replays: Sequence[LoadedReplay],
    usable: Sequence[LoadedReplay],
    loaded_share: float,
    plain: tuple[CalibratedCoefficients, FitReport],
    plain_held_out: list[dict[str, float | str]],
    notes: list[str],
) -> tuple[CalibratedCoefficients, FitReport, list[LoadedReplay], list[dict[str, float | str]]]:
    """The fit with the front end's cost per streamed token (:func:`fit_with_streaming`) if
    it predicts the replays better, else ``plain`` (the fit without it) and its held-out
    errors; ``notes`` say which and why. With several replays "better" is judged on each one
    left out in turn, with the cost found on the others: a cost that only fits the replays it
    was found on is not kept."""
    coefficients, report = plain
    plain_score = replays_score(scenario, usable, coefficients)
    streamed, streamed_report, cost = fit_with_streaming(scenario, isolated, usable, loaded_share)
    if cost == 0.0:
        notes.append(
            "front end: no cost per streamed token (none predicts the replays' TTFT and E2E "
            f"means better than {STREAMING_MIN_GAIN:.0%} over none, {plain_score:.1%})"
        )
        return coefficients, report, list(replays), plain_held_out
    streamed_score = replays_score(scenario, usable, streamed)
    found = (
        f"{cost * 1e6:.1f} us of host time per streamed token predicts the replays' TTFT and "
        f"E2E means to {streamed_score:.1%} mean |error| ({plain_score:.1%} without it; searched "
        f"up to {streaming_bound(usable) * 1e6:.1f} us, the replays' own time per token)"
    )
    scored: list[dict[str, float | str]] = []
    if len(usable) > 1:
        scored = held_out(
            scenario, usable, loaded_share, _streaming_fit_others(scenario, isolated, loaded_share)
        )
        left_out, without = held_out_score(scored), held_out_score(plain_held_out)
        if not left_out < without - STREAMING_MIN_GAIN:
            notes.append(
                f"front end: not kept: {found}, but left out in turn each replay was predicted "
                f"to {left_out:.1%} with the cost found on the others and {without:.1%} without"
            )
            return coefficients, report, list(replays), plain_held_out
        found += f"; left out in turn {left_out:.1%}, {without:.1%} without"
    notes.append(f"front end: {found}")
    rebuilt = [at_streaming_cost(scenario, replay, cost) for replay in replays]
    return streamed, streamed_report, rebuilt, scored


def _streaming_fit_others(
    scenario: Scenario, isolated: Sequence[Observation], loaded_share: float
) -> FitOthers:
    """:func:`fit_with_streaming` on the other replays, as a :data:`FitOthers`: the left-out
    replay's steps are rebuilt for the cost found on the others."""

    def fit(
        others: Sequence[LoadedReplay], left_out: LoadedReplay
    ) -> tuple[CalibratedCoefficients, LoadedReplay]:
        fitted, _, cost = fit_with_streaming(scenario, isolated, others, loaded_share)
        return fitted, at_streaming_cost(scenario, left_out, cost)

    return fit
