"""Fitting the calibrated iteration-time model to measurements.

Two methods, for two kinds of data:

* :func:`fit_steps` — measured *steps* (:class:`~calibration.observations.Observation`: "a step
  computing this batch took this long"). Without its floor the model is linear in its
  coefficients, so this is first a sign-constrained linear least-squares problem on the
  regressors of :meth:`sim.engine.latency.CalibratedModel.features`, plus one indicator for
  measurements that include the server's front end; then the linear layers' floor (their
  weights read once per step) is fitted with the rest by a bounded nonlinear least squares
  started from that solution. Residuals are *relative* (each row divided by its measured
  time), so a 10 ms decode step and a 1 s prefill weigh the same.
* :func:`fit_from_records` — only per-request benchmark records (TTFT, end-to-end latency). The
  caller supplies ``simulate(coefficients) -> records`` (a replay of the same arrivals through the
  simulator), and the coefficients are moved, in log space so they stay positive, to minimise the
  relative TTFT and E2E errors.

Both return the coefficients and a :class:`~sim.engine.profile.FitReport`. ``FitReport.points``
holds numbers only (its schema is ``dict[str, float]``), so the point's kind is stored as
``kind_code``, an index into :data:`POINT_KINDS` (``-1`` for a kind not listed); use
:func:`point_kind` to read it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear

from calibration.observations import Observation
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import (
    CalibratedModel,
)
from sim.engine.profile import FitReport

#: Coefficient names in regressor order: CalibratedModel.features(), then the front-end indicator.
COEFFICIENT_NAMES: tuple[str, ...] = (
    "step_overhead_s",
    "per_prefill_token_s",
    "per_decode_seq_s",
    "per_context_token_s",
    "per_prefill_pair_s",
    "per_shared_context_token_s",
    "frontend_overhead_s",
    "per_arrival_s",
)

#: Every coefficient a fit to records searches: the regressors' (but the cost of an arrival,
#: which only steps tell) and the linear layers' floor (which a step fit sets where the data
#: show one).
SEARCHED_NAMES: tuple[str, ...] = (
    *(name for name in COEFFICIENT_NAMES if name != "per_arrival_s"),
    "linear_floor_s",
)

#: What ``kind_code`` in a report point refers to (observation kinds, then per-request metrics).
POINT_KINDS: tuple[str, ...] = ("prefill", "decode", "mixed", "operator", "ttft", "e2e")

#: Why a regressor can be all zero, for the report.
_UNIDENTIFIED_REASON = {
    "step_overhead_s": "no observations",
    "per_prefill_token_s": "no observation has prefill tokens",
    "per_decode_seq_s": "no observation has decode sequences",
    "per_context_token_s": "no observation attends to earlier context (decodes or later chunks)",
    "per_prefill_pair_s": "no observation has prefill attention pairs",
    "per_shared_context_token_s": "no observation reads a shared prefix",
    "frontend_overhead_s": "no observation includes the server front end (client-side TTFT)",
    "per_arrival_s": "no loaded step saw a request arrive",
}

#: At most this many per-request points go into a record fit's report (errors use all of them).
MAX_REPORTED_POINTS = 200


def kind_code(kind: str) -> float:
    """The number a report point stores for ``kind`` (``-1`` when it is not in POINT_KINDS)."""
    return float(POINT_KINDS.index(kind)) if kind in POINT_KINDS else -1.0


def point_kind(point: dict[str, float]) -> str:
    """The kind of a report point, from its ``kind_code`` (``"unknown"`` when not listed)."""
    code = int(point.get("kind_code", -1))
    return POINT_KINDS[code] if 0 <= code < len(POINT_KINDS) else "unknown"


def design_matrix(observations: Sequence[Observation]) -> np.ndarray:
    """One row per observation: the six step regressors, the front-end indicator and the
    requests that arrived during the step."""
    rows = [
        (
            *CalibratedModel.features(obs.batch),
            1.0 if obs.includes_frontend else 0.0,
            float(obs.arrivals),
        )
        for obs in observations
    ]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(COEFFICIENT_NAMES))


def predict_seconds(
    coefficients: CalibratedCoefficients, observations: Sequence[Observation]
) -> np.ndarray:
    """What the coefficients predict each observation took (front end included where measured)."""
    values = np.array([getattr(coefficients, name) for name in COEFFICIENT_NAMES])
    return _predict(design_matrix(observations), values, coefficients.linear_floor_s)


#: The most a fit with the linear layers' floor may leave of the linear fit's squared error
#: for the floor to be kept.
FLOOR_MIN_IMPROVEMENT = 0.9

#: Columns of the design matrix that the linear layers' floor bounds: prefill tokens and
#: decode sequences (CalibratedModel.features order).
_LINEAR_COLUMNS = (1, 2)


def _linear_part(design: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each row's linear-layer seconds: prefill tokens and decode sequences at their costs."""
    part: np.ndarray = design[:, _LINEAR_COLUMNS] @ values[list(_LINEAR_COLUMNS)]
    return part


def _predict(design: np.ndarray, values: np.ndarray, floor: float) -> np.ndarray:
    """The model's seconds per row: the linear terms, with the linear layers' part raised to
    ``floor`` where it is below it."""
    total: np.ndarray = design @ values
    if floor:
        linear = _linear_part(design, values)
        total = total - linear + np.maximum(floor, linear)
    return total


def _fit_floor(
    design: np.ndarray,
    seconds: np.ndarray,
    weights: np.ndarray,
    values: np.ndarray,
    free: np.ndarray,
) -> tuple[np.ndarray, float]:
    """The coefficients and linear-layer floor that best fit, started from the linear solution
    ``values`` and a few floors among the steps' linear parts; ``(values, 0.0)`` when no floor
    fits better (a server whose smallest steps already cost their per-token share)."""
    linear = _linear_part(design, values)
    positive = linear[linear > 0]
    if positive.size < 2:
        return values, 0.0
    scale = np.sqrt(weights) / seconds

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = values.copy()
        trial[free] = x[:-1]
        result: np.ndarray = (_predict(design, trial, x[-1]) - seconds) * scale
        return result

    linear_cost = float(np.sum(residuals(np.append(values[free], 0.0)) ** 2))
    best_x, best_cost = None, linear_cost
    for start_floor in np.quantile(positive, (0.1, 0.3, 0.5)):
        x0 = np.append(values[free], start_floor)
        typical = np.where(x0 > 0, x0, max(float(np.max(x0)), 1e-9) * 1e-3)
        solution = least_squares(residuals, x0, bounds=(0.0, np.inf), x_scale=typical)
        cost = float(np.sum(solution.fun**2))
        if cost < best_cost:
            best_x, best_cost = solution.x, cost
    # A floor earns its place by explaining the data (a tenth less squared error), not by
    # rounding: on data the linear model already fits, it stays 0.
    if best_x is None or best_cost > FLOOR_MIN_IMPROVEMENT * linear_cost:
        return values, 0.0
    fitted = values.copy()
    fitted[free] = np.maximum(best_x[:-1], 0.0)
    floor = float(max(best_x[-1], 0.0))
    smallest = float(np.min(_linear_part(design, fitted)))
    if floor <= smallest:  # below every step's linear part: it changes nothing
        return values, 0.0
    return fitted, floor


def _error_summary(relative_errors: np.ndarray) -> tuple[float, float, float]:
    """Mean, 90th percentile and maximum of the absolute relative errors."""
    absolute = np.abs(relative_errors)
    if absolute.size == 0:
        return 0.0, 0.0, 0.0
    return float(absolute.mean()), float(np.percentile(absolute, 90)), float(absolute.max())


def fit_steps(
    observations: Sequence[Observation],
    *,
    method_name: str = "step_least_squares",
    floor: bool = True,
) -> tuple[CalibratedCoefficients, FitReport]:
    """Coefficients that best reproduce measured steps, all >= 0, minimising relative error.

    Each row and its target are divided by the measured seconds and multiplied by
    ``sqrt(weight)``; the solve is a bounded least squares (BVLS) on column-scaled regressors. A
    regressor that is zero in every observation cannot be estimated: its coefficient is fixed at
    0 and the report's ``notes`` say so (for example no client-side TTFT → no front-end term).
    ``floor`` False keeps the model linear (no linear-layer floor). Raises ValueError when there
    are fewer observations than coefficients left to estimate.
    """
    if not observations:
        raise ValueError("observations: need at least one measured step to fit, got none")
    design = design_matrix(observations)
    seconds = np.array([obs.seconds for obs in observations])
    weights = np.array([obs.weight for obs in observations])
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("observations: every weight must be a finite number >= 0")
    free = np.flatnonzero(np.any(design != 0.0, axis=0))
    notes = [
        f"{name} fixed at 0: {_UNIDENTIFIED_REASON[name]}"
        for index, name in enumerate(COEFFICIENT_NAMES)
        if index not in free and name != "per_arrival_s"  # isolated points see no arrival
    ]
    if len(observations) < free.size:
        names = ", ".join(COEFFICIENT_NAMES[i] for i in free)
        raise ValueError(
            f"observations: {len(observations)} measured steps cannot determine {free.size} "
            f"coefficients ({names}); measure at least {free.size} different steps"
        )
    row_scale = np.sqrt(weights) / seconds
    system = design[:, free] * row_scale[:, None]
    target = np.sqrt(weights)
    # Column scaling keeps the solve well conditioned (pairs run to 1e6, the constant is 1);
    # positive scaling leaves the bounds x >= 0 unchanged.
    column_norm = np.linalg.norm(system, axis=0)
    column_norm[column_norm == 0] = 1.0
    solution = lsq_linear(system / column_norm, target, bounds=(0.0, np.inf), method="bvls")
    values = np.zeros(len(COEFFICIENT_NAMES))
    values[free] = np.maximum(solution.x / column_norm, 0.0)
    values, floor_s = _fit_floor(design, seconds, weights, values, free) if floor else (values, 0.0)
    if floor_s:
        notes.append(
            f"linear_floor_s = {floor_s * 1e3:.3g} ms: the linear layers' least time per step "
            "(their weights read once), above the per-token terms for the smallest steps"
        )
    shared = COEFFICIENT_NAMES.index("per_shared_context_token_s")
    if shared not in free:
        # Nothing measured reads a shared prefix: price it as any context token.
        values[shared] = values[COEFFICIENT_NAMES.index("per_context_token_s")]
        notes = [n for n in notes if not n.startswith("per_shared_context_token_s")]
        notes.append("per_shared_context_token_s = per_context_token_s: no shared prefix measured")
    coefficients = CalibratedCoefficients(
        **{name: float(v) for name, v in zip(COEFFICIENT_NAMES, values, strict=True)},
        linear_floor_s=floor_s,
    )
    predicted = _predict(design, values, floor_s)
    relative = (predicted - seconds) / seconds
    mean, p90, worst = _error_summary(relative)
    points = [
        {
            "kind_code": kind_code(obs.kind),
            "measured_s": float(obs.seconds),
            "predicted_s": float(pred),
            "relative_error": float(rel),
            "num_prefill_tokens": float(obs.batch.num_prefill_tokens),
            "num_decode_seqs": float(obs.batch.num_decode_seqs),
            "context_tokens": float(
                obs.batch.decode_context_tokens + obs.batch.prefill_context_tokens
            ),
            "pairs": float(obs.batch.prefill_attention_pairs),
            "includes_frontend": 1.0 if obs.includes_frontend else 0.0,
        }
        for obs, pred, rel in zip(observations, predicted, relative, strict=True)
    ]
    report = FitReport(
        method=method_name,
        num_points=len(observations),
        relative_error_mean=mean,
        relative_error_p90=p90,
        relative_error_max=worst,
        points=points,
        notes=notes,
    )
    return coefficients, report


# -- fitting to per-request records through the simulator -----------------------------------
class _BudgetExhaustedError(Exception):
    """Raised inside the objective once the simulation budget is spent."""


@dataclass
class _Tracker:
    """Counts simulations and remembers the best log-coefficients seen."""

    max_evaluations: int
    num_evaluations: int = 0
    best_cost: float = math.inf
    best_x: np.ndarray | None = None


def _ok_rows(records: pd.DataFrame) -> pd.DataFrame:
    """Rows with status ``ok`` (all rows when there is no status column)."""
    if "status" in records.columns:
        records = records[records["status"].astype(str) == "ok"]
    return records


def usable_records(records: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` records with a positive TTFT and E2E: what a fit to records compares."""
    measured = _ok_rows(records)
    measured = measured[(measured["ttft_s"] > 0) & (measured["e2e_s"] > 0)]
    return measured.reset_index(drop=True)


def relative_residuals(measured: pd.DataFrame, simulated: pd.DataFrame) -> np.ndarray:
    """Relative TTFT errors then relative E2E errors, one per measured ok request.

    A request the simulation did not complete counts as a 100 % error, so the optimiser is
    pushed away from coefficients under which requests fail.
    """
    sim = _ok_rows(simulated)[["request_id", "ttft_s", "e2e_s"]]
    joined = measured[["request_id", "ttft_s", "e2e_s"]].merge(
        sim, on="request_id", how="left", suffixes=("", "_sim"), validate="one_to_one"
    )
    parts = []
    for column in ("ttft_s", "e2e_s"):
        truth = joined[column].to_numpy(dtype=np.float64)
        predicted = joined[f"{column}_sim"].to_numpy(dtype=np.float64)
        relative = (predicted - truth) / truth
        parts.append(np.where(np.isfinite(relative), relative, 1.0))
    return np.concatenate(parts)


def fit_from_records(
    records: pd.DataFrame,
    simulate: Callable[[CalibratedCoefficients], pd.DataFrame],
    initial: CalibratedCoefficients,
    *,
    max_evaluations: int = 60,
) -> tuple[CalibratedCoefficients, FitReport]:
    """Coefficients under which a replay of ``records`` reproduces their TTFT and E2E latency.

    ``simulate(coefficients)`` must replay the records' arrivals and lengths through the
    simulator and return its records (``request_id``, ``ttft_s``, ``e2e_s``, ``status``, as
    :data:`sim.engine.request.RECORD_COLUMNS`). Only ``ok`` measured requests with positive TTFT
    and E2E are fitted. The search is a trust-region least squares over the logs of the coefficients
    (so they stay positive) starting at ``initial``; coefficients that are 0 in ``initial``
    stay 0, and the shared-prefix term stays as ``initial`` has it. At most
    ``max_evaluations`` simulations run (finite-difference Jacobians included); the best
    coefficients seen are returned. Errors are reported over every request, points for
    at most :data:`MAX_REPORTED_POINTS` of them.
    """
    measured = _records_to_fit(records, max_evaluations)
    start = np.array([getattr(initial, name) for name in SEARCHED_NAMES], dtype=np.float64)
    # The shared-prefix term is measured by the step fit and held: most replays share little,
    # and searching a term the replay barely moves would spend simulations on nothing.
    held = SEARCHED_NAMES.index("per_shared_context_token_s")
    free = np.flatnonzero((start > 0) & (np.arange(len(SEARCHED_NAMES)) != held))
    if free.size == 0:
        raise ValueError("initial: every coefficient is 0; give positive starting values")
    notes = [
        f"{SEARCHED_NAMES[i]} held at 0: it is 0 in the initial coefficients"
        for i in range(len(COEFFICIENT_NAMES))  # an absent floor is no news
        if i not in free and i != held
    ]
    fitted, search_notes = _search_records(measured, simulate, start, free, max_evaluations)
    # The report, from one more replay of the fitted coefficients.
    report = _records_report(measured, simulate(fitted), [*notes, *search_notes])
    return fitted, report


def _records_to_fit(records: pd.DataFrame, max_evaluations: int) -> pd.DataFrame:
    """The usable records of a fit to records; ValueError for a bad budget, missing columns or
    no usable request."""
    if max_evaluations < 1:
        raise ValueError(f"max_evaluations: must be >= 1, got {max_evaluations}")
    missing = {"request_id", "ttft_s", "e2e_s"} - set(records.columns)
    if missing:
        raise ValueError(f"records: missing columns {sorted(missing)}; expected RECORD_COLUMNS")
    measured = usable_records(records)
    if measured.empty:
        raise ValueError("records: no ok request with a positive ttft_s and e2e_s to fit to")
    return measured


def _coefficients_at(
    start: np.ndarray, free: np.ndarray, log_values: np.ndarray
) -> CalibratedCoefficients:
    """``start`` with the ``free`` coefficients set to ``exp(log_values)``."""
    values = start.copy()
    values[free] = np.exp(log_values)
    return CalibratedCoefficients(
        **{name: float(v) for name, v in zip(SEARCHED_NAMES, values, strict=True)}
    )


def _search_records(
    measured: pd.DataFrame,
    simulate: Callable[[CalibratedCoefficients], pd.DataFrame],
    start: np.ndarray,
    free: np.ndarray,
    max_evaluations: int,
) -> tuple[CalibratedCoefficients, list[str]]:
    """The best coefficients a log-space least squares from ``start`` finds within
    ``max_evaluations`` simulations, and notes on how the search ended."""
    tracker = _Tracker(max_evaluations)

    def objective(log_values: np.ndarray) -> np.ndarray:
        if tracker.num_evaluations >= tracker.max_evaluations:
            raise _BudgetExhaustedError
        tracker.num_evaluations += 1
        residuals = relative_residuals(
            measured, simulate(_coefficients_at(start, free, log_values))
        )
        cost = float(residuals @ residuals)
        if cost < tracker.best_cost:
            tracker.best_cost, tracker.best_x = cost, log_values.copy()
        return residuals

    notes: list[str] = []
    x0 = np.log(start[free])
    try:
        # A 5 % finite-difference step in log space: batching makes a replay's latencies jump
        # when a request lands in another step, so small steps see the jumps, not the slope
        # (on simulated replays 5 % recovered the coefficients, 1 % and 10 % stalled early).
        least_squares(objective, x0, method="trf", diff_step=5e-2, max_nfev=max_evaluations)
    except _BudgetExhaustedError:
        notes.append(f"stopped after {max_evaluations} simulations (max_evaluations)")
    assert tracker.best_x is not None
    notes.append(f"{tracker.num_evaluations} simulations run")
    return _coefficients_at(start, free, tracker.best_x), notes


def _records_report(
    measured: pd.DataFrame, simulated_records: pd.DataFrame, notes: list[str]
) -> FitReport:
    """The report of a fit to records: relative TTFT then E2E errors of every measured request
    against a replay (a request the replay did not complete counts as a 100 % error), points for
    at most :data:`MAX_REPORTED_POINTS` of them, evenly spread."""
    simulated = _ok_rows(simulated_records).set_index("request_id")
    points: list[dict[str, float]] = []
    errors: list[float] = []
    for metric in ("ttft", "e2e"):
        metric_points, relative = _metric_points(measured, simulated, metric)
        errors.extend(relative.tolist())
        points.extend(metric_points)
    if len(points) > MAX_REPORTED_POINTS:
        keep = np.linspace(0, len(points) - 1, MAX_REPORTED_POINTS).round().astype(int)
        points = [points[i] for i in keep]
    mean, p90, worst = _error_summary(np.asarray(errors))
    return FitReport(
        method="records_least_squares",
        num_points=len(errors),
        relative_error_mean=mean,
        relative_error_p90=p90,
        relative_error_max=worst,
        points=points,
        notes=notes,
    )


def _metric_points(
    measured: pd.DataFrame, simulated: pd.DataFrame, metric: str
) -> tuple[list[dict[str, float]], np.ndarray]:
    """Report points and relative errors of one metric (``ttft`` or ``e2e``) per measured
    request, against ``simulated`` indexed by request id."""
    column = f"{metric}_s"
    truth = measured[column].to_numpy(dtype=np.float64)
    predicted = (
        measured["request_id"].map(simulated[column]).to_numpy(dtype=np.float64)
        if column in simulated.columns
        else np.full(truth.size, np.nan)
    )
    relative = np.where(np.isfinite(predicted), (predicted - truth) / truth, 1.0)
    points = [
        {
            "kind_code": kind_code(metric),
            "request_id": float(request_id),
            "measured_s": float(m),
            "predicted_s": float(p) if math.isfinite(p) else -1.0,
            "relative_error": float(r),
        }
        for request_id, m, p, r in zip(
            measured["request_id"], truth, predicted, relative, strict=True
        )
    ]
    return points, relative
