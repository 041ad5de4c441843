"""How a step fit scores on loaded replays, and the fit of isolated points and replays together.

A loaded replay (:mod:`calibration.loaded` runs them) brings back its requests' records and
streamed token times; the engine steps rebuilt from those (:mod:`calibration.steps`) are fitted
together with the isolated points, the two sources weighted by a share of the total whatever
their counts (:func:`joint_fit`). A fit is scored on a replay twice: on its rebuilt steps
(:func:`step_seconds`, :func:`step_ratios`) and by the simulator replaying its requests at their
real send times (:func:`simulated_errors`). :func:`held_out` leaves each replay out in turn, so
a profile says how well it predicts a load it did not see (leave-one-workload-out).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from calibration.fit import fit_steps, predict_seconds, usable_records
from calibration.observations import Observation
from calibration.records import at_send_times
from calibration.steps import RebuiltSteps
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.profile import FitReport
from sim.engine.request import Request
from sim.run import build
from sim.scenario import Scenario


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


def completed_rate(records: pd.DataFrame) -> float:
    """Completed requests per second over the makespan (first send to last finish); NaN when
    nothing completed."""
    ok = records[records["status"].astype(str) == "ok"]
    if ok.empty:
        return float("nan")
    span = float(ok["finish_s"].max() - records["arrival_s"].min())
    return len(ok) / span if span > 0 else float("nan")


def _weighted(observations: Sequence[Observation], total: float) -> list[Observation]:
    """``observations`` reweighted so that their weights sum to ``total``."""
    own = sum(obs.weight for obs in observations)
    if not observations or own <= 0:
        return list(observations)
    return [dataclasses.replace(obs, weight=obs.weight * total / own) for obs in observations]


def joint_fit(
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


#: A fit of the replays other than a left-out one: given those others and the left-out replay,
#: the coefficients fitted without it and the left-out replay as they see it (its steps rebuilt
#: for the front end they carry, or the replay itself).
FitOthers = Callable[
    [Sequence[LoadedReplay], LoadedReplay], tuple[CalibratedCoefficients, LoadedReplay]
]


def joint_fit_others(isolated: Sequence[Observation], loaded_share: float) -> FitOthers:
    """:func:`joint_fit` of the isolated points and the other replays, as a :data:`FitOthers`."""

    def fit(
        others: Sequence[LoadedReplay], left_out: LoadedReplay
    ) -> tuple[CalibratedCoefficients, LoadedReplay]:
        return joint_fit(isolated, others, loaded_share)[0], left_out

    return fit


def held_out(
    scenario: Scenario,
    replays: Sequence[LoadedReplay],
    loaded_share: float,
    fit_others: FitOthers,
) -> list[dict[str, float | str]]:
    """Each replay left out in turn: fitted on the others by ``fit_others`` (the isolated points
    and the others' steps at ``loaded_share``), its steps and its requests predicted."""
    scored: list[dict[str, float | str]] = []
    for replay in replays:
        others = [r for r in replays if r is not replay]
        fitted, left_out = fit_others(others, replay)
        ttft, e2e = request_errors(scenario, left_out, fitted)
        scored.append(
            {
                "workload": left_out.name,
                "loaded_share": loaded_share,
                "per_streamed_token_s": fitted.per_streamed_token_s,
                "step_relative_error_mean": _step_error(fitted, left_out.steps),
                "ttft_mean_error": ttft,
                "e2e_mean_error": e2e,
            }
        )
    return scored


def replays_score(
    scenario: Scenario, replays: Sequence[LoadedReplay], coefficients: CalibratedCoefficients
) -> float:
    """Mean |error| of the replays' simulated TTFT and E2E means (NaN counts as 100%)."""
    return _mean_abs_error(
        [error for replay in replays for error in request_errors(scenario, replay, coefficients)]
    )


def held_out_score(scored: Sequence[dict[str, float | str]]) -> float:
    """Mean |error| of the left-out replays' TTFT and E2E means (:func:`held_out`'s entries;
    NaN counts as 100%)."""
    return _mean_abs_error(
        [float(entry[key]) for entry in scored for key in ("ttft_mean_error", "e2e_mean_error")]
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


def request_errors(
    scenario: Scenario, replay: LoadedReplay, coefficients: CalibratedCoefficients
) -> tuple[float, float]:
    """The simulator's mean TTFT and E2E errors on ``replay`` (:func:`simulated_errors`)."""
    ttft, e2e, _ = simulated_errors(scenario, replay, coefficients)
    return ttft, e2e


def simulated_errors(
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


def step_seconds(
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
    (:func:`step_seconds`) over the rebuilt steps that carry no prompt (``decode``) and over
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


def relative_error(measured: np.ndarray, predicted: np.ndarray) -> float:
    """Mean |relative error| of the predicted step seconds; NaN when there are none."""
    if not measured.size:
        return float("nan")
    return float(np.mean(np.abs(predicted - measured) / measured))


def _step_error(coefficients: CalibratedCoefficients, steps: RebuiltSteps) -> float:
    """Mean |relative error| of ``coefficients`` on rebuilt steps; NaN when there are none."""
    return relative_error(*step_seconds(coefficients, steps))
