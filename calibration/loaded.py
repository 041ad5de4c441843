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
the isolated points, the loaded steps carrying a share of the total weight whatever their
counts (the isolated points span the envelope's corners; the loaded steps are what workloads
run). Each replay is then left out in turn: the fit to the isolated points and the other
replays predicts its steps, and the simulator replays its requests at their real send times
with those coefficients, so the profile says how well it predicts a load it did not see
(leave-one-workload-out); the share of :data:`LOADED_SHARES` under which it does best is kept.

The replays are run by a :class:`Runner`: :func:`live_runner` sends them to a server; tests use
a simulated server whose coefficients are known. How a fit is scored on a replay, and the joint
fit itself, are :mod:`calibration.replay_fit`'s; the front end's cost per streamed token, which
:func:`fit_loaded` searches only when asked, is :mod:`calibration.streaming`'s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from calibration.observations import Observation
from calibration.replay_fit import (
    LoadedReplay,
    ReplayOutcome,
    Runner,
    completed_rate,
    held_out,
    held_out_score,
    joint_fit,
    joint_fit_others,
    relative_error,
    simulated_errors,
    step_ratios,
    step_seconds,
    ttft_parts,
)
from calibration.steps import rebuild_steps
from calibration.streaming import with_streaming
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

#: Below this many seconds left for them, no loaded replay runs (the profile says so).
MIN_LOADED_S = 30.0
#: Requests per replay: enough steps to fit, few enough for a laptop's CPU server.
MIN_REQUESTS = 12
MAX_REQUESTS = 2000
#: The burst holds at most this many full batches (``max_num_seqs`` each): enough to measure
#: the capacity of a full server, and a bound on the budget it takes when the isolated fit, which
#: sizes it, overestimates the capacity.
BURST_MAX_BATCHES = 8


@dataclass
class LoadedFit:
    """The joint fit and how it was scored."""

    coefficients: CalibratedCoefficients
    report: FitReport
    replays: list[dict[str, Any]] = field(default_factory=list)  # per replay, for the profile


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
    (:func:`with_streaming`). Off by default: on the ~85M CPU model (2026-12-06) it found 5 ms a
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
    scored: list[dict[str, float | str]] = []
    notes: list[str] = []
    if len(usable) > 1:
        trials = {
            share: held_out(scenario, usable, share, joint_fit_others(isolated, share))
            for share in LOADED_SHARES
        }
        scores = {share: held_out_score(trial) for share, trial in trials.items()}
        loaded_share = min(scores, key=lambda share: scores[share])
        scored = trials[loaded_share]
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
    coefficients, report = joint_fit(isolated, usable, loaded_share)
    if usable and search_streaming:
        coefficients, report, replays, scored = with_streaming(
            scenario,
            isolated,
            replays,
            usable,
            loaded_share,
            (coefficients, report),
            scored,
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
            ttft, e2e, simulated = simulated_errors(scenario, replay, fitted)
            if label == "joint_fit" and simulated is not None:
                entry["simulated_ttft"] = ttft_parts(simulated, fitted.frontend_overhead_s)
            seconds = step_seconds(fitted, replay.steps)  # measured, predicted
            entry[label] = {
                "step_relative_error_mean": _finite_or_none(relative_error(*seconds)),
                "step_ratio_median": step_ratios(replay.steps, *seconds),
                "ttft_mean_error": _finite_or_none(ttft),
                "e2e_mean_error": _finite_or_none(e2e),
            }
        summaries.append(entry)
    report = report.model_copy(update={"held_out": scored})
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
