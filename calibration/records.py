"""Calibration from per-request records a user already has: a ``servesim live run``, or a
``vllm bench serve`` / GuideLLM result brought in with ``servesim live import``.

The records' arrivals and lengths are replayed through the simulator of the scenario (its
engine knobs, model and GPU) and the calibrated model's coefficients are searched until the
replay's TTFT and end-to-end latency match the records (:func:`calibration.fit.fit_from_records`).

Which requests are replayed: when the records are the scenario's own requests (a live run of
that scenario: the same ids with the same prompt and output lengths), the scenario's requests
are replayed exactly, shared prefixes and multi-turn sessions included, each first turn at the
time the records say it was sent (a live record's ``arrival_s`` is its send time: a load
generator that fell behind offered a later load than the scenario planned, and the fit must see
the load the server saw). Otherwise each record
becomes one request arriving at its ``arrival_s`` with its lengths and a prompt of its own (the
records do not say what the prompts contained, so nothing is shared in the prefix cache).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.fit import (
    SEARCHED_NAMES,
    fit_from_records,
    fit_steps,
    relative_residuals,
    usable_records,
)
from calibration.observations import Observation
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import (
    BatchShape,
    RooflineModel,
    prefill_chunk_pairs,
)
from sim.engine.profile import FitReport
from sim.engine.request import Request
from sim.files import DocumentError, read_document
from sim.run import build, scenario_requests
from sim.scenario import RooflineLatencySpec, Scenario
from sim.workload.generate import requests_from_trace
from sim.workload.traces import Trace

#: The columns a records file must have (the rest of RECORD_COLUMNS is optional here).
REQUIRED_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s")
#: Front-end overhead the search starts from when the starting model has none (1 ms).
INITIAL_FRONTEND_S = 1e-3


def read_records(path: str | Path) -> pd.DataFrame:
    """Records from ``records.parquet``, ``records.jsonl`` or ``records.csv``, or from a run
    directory holding one of them. ValueError names the file and the missing columns.
    """
    path = Path(path)
    if path.is_dir():
        for name in ("records.parquet", "records.jsonl", "records.csv"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise ValueError(
                f"--records: {path} holds no records.parquet, records.jsonl or records.csv"
            )
    if not path.is_file():
        raise ValueError(f"--records: {path} does not exist")
    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif path.suffix == ".jsonl":
            frame = pd.read_json(path, lines=True)
        elif path.suffix == ".csv":
            frame = pd.read_csv(path)
        else:
            raise ValueError(f"--records: {path} is not .parquet, .jsonl or .csv")
    except (OSError, ValueError) as exc:
        if str(exc).startswith("--records"):
            raise
        raise ValueError(f"--records: cannot read {path}: {exc}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"--records: {path} lacks columns {', '.join(missing)}; expected servesim records "
            "(servesim live run, or servesim live import for vllm bench / GuideLLM results)"
        )
    return frame


def arrivals_unknown(path: str | Path) -> str | None:
    """Why the send times of the records at ``path`` are unknown, or None when they are known.

    ``live import`` writes the source's metadata beside the records; a ``vllm bench serve`` file
    without ``start_times`` leaves every ``arrival_s`` at 0 and says so there.
    """
    from live.importers import IMPORT_META_FILE

    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    try:
        meta = read_document(folder / IMPORT_META_FILE, format="json")
    except DocumentError:  # none (not an import), or unreadable: nothing says they are unknown
        return None
    if isinstance(meta, dict) and meta.get("arrival_known") is False:
        return (
            f"the records were imported from {meta.get('source', 'a file')} without send "
            "times (every arrival_s is 0)"
        )
    return None


def replay_requests(scenario: Scenario, records: pd.DataFrame) -> tuple[list[Request], str]:
    """The requests that reproduce ``records`` and a sentence saying which were chosen."""
    own = scenario_requests(scenario)
    recorded = dict(
        zip(
            records["request_id"].astype(int).tolist(),
            records["prompt_tokens"].astype(int).tolist(),
            strict=True,
        )
    )
    if len(own) == len(records) and all(recorded.get(r.request_id) == r.prompt_tokens for r in own):
        return at_send_times(own, records), (
            "the scenario's own requests (the records are a run of this scenario), first turns "
            "at their recorded send times"
        )
    ordered = records.sort_values(["arrival_s", "request_id"], kind="stable")
    ok = ordered[(ordered["prompt_tokens"] >= 1) & (ordered["output_tokens"] >= 1)]
    arrivals = ok["arrival_s"].to_numpy(dtype=np.float64)
    trace = Trace(
        path="records",
        format="records",
        arrival_s=None,
        prompt_tokens=ok["prompt_tokens"].to_numpy(dtype=np.int64),
        output_tokens=ok["output_tokens"].to_numpy(dtype=np.int64),
        segments=None,
        session_ids=None,
    )
    replayed = requests_from_trace(trace, arrival_times_s=arrivals)  # the records' own times
    # Keep the records' own ids so the fit compares each request with itself.
    ids = ok["request_id"].to_numpy()
    replayed = [
        dataclasses.replace(r, request_id=int(i)) for r, i in zip(replayed, ids, strict=True)
    ]
    return replayed, (
        "one request per record at its arrival time and lengths; prompts taken as unique (the "
        "records do not say what they shared)"
    )


def at_send_times(requests: list[Request], records: pd.DataFrame) -> list[Request]:
    """``requests`` with each first turn's arrival moved to its record's ``arrival_s`` (later
    turns arrive after their parent, as in the simulator); a record without a finite time keeps
    the planned one."""
    sent = dict(
        zip(
            records["request_id"].astype(int).tolist(),
            records["arrival_s"].astype(float).tolist(),
            strict=True,
        )
    )
    return [
        dataclasses.replace(r, arrival_s=sent[r.request_id])
        if r.parent_id < 0 and np.isfinite(sent[r.request_id])
        else r
        for r in requests
    ]


def roofline_coefficients(scenario: Scenario) -> CalibratedCoefficients:
    """The calibrated model closest to the scenario's roofline: a fit of its step times over
    prefills of 16..max_model_len tokens and decodes of 1..max_num_seqs sequences at contexts
    of 128..max_model_len, linear (no floor). A starting point for a search, not a calibration.
    """
    model = scenario.resolve_model()
    spec = scenario.latency if isinstance(scenario.latency, RooflineLatencySpec) else None
    roofline = RooflineModel(
        model,
        scenario.resolve_gpu(),
        dtype=scenario.dtype,
        kv_dtype=scenario.kv_dtype,
        tensor_parallel_size=scenario.engine.tensor_parallel_size,
        params=spec.params() if spec is not None else None,
    )
    top = scenario.engine.max_model_len or model.max_position_embeddings
    observations = []
    n = 16
    while n <= min(top, scenario.engine.max_num_batched_tokens):
        batch = BatchShape(
            num_prefill_tokens=n,
            num_prefill_seqs=1,
            prefill_attention_pairs=prefill_chunk_pairs(n, 0),
            num_sampled=1,
        )
        observations.append(Observation(batch, roofline.step_time(batch), kind="operator"))
        n *= 2
    seqs = 1
    while seqs <= scenario.engine.max_num_seqs:
        context = 128
        while context <= top:
            batch = BatchShape(
                num_decode_seqs=seqs, decode_context_tokens=seqs * context, num_sampled=seqs
            )
            observations.append(Observation(batch, roofline.step_time(batch), kind="operator"))
            context *= 4
        seqs *= 2
    # The linear model: per-request latencies cannot tell a floor from the step overhead, so a
    # search from here would trade one for the other instead of finding either.
    coefficients, _ = fit_steps(observations, floor=False)
    return coefficients


def fit_scenario_to_records(
    scenario: Scenario,
    records: pd.DataFrame,
    initial: CalibratedCoefficients,
    *,
    max_evaluations: int = 60,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CalibratedCoefficients, FitReport, str]:
    """Coefficients under which the scenario's simulator reproduces ``records`` (see the module
    docstring), the fit report, and which requests were replayed. ``progress(done, total)``
    counts the simulations against the most the fit may run (it may stop sooner)."""
    coefficients, report, hows = fit_scenario_to_replays(
        scenario, {"records": records}, initial, max_evaluations=max_evaluations, progress=progress
    )
    return coefficients, report, hows[0]


def fit_scenario_to_replays(
    scenario: Scenario,
    replays: dict[str, pd.DataFrame],
    initial: CalibratedCoefficients,
    *,
    max_evaluations: int = 60,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CalibratedCoefficients, FitReport, list[str]]:
    """One set of coefficients for several record sets at once (loaded replays of different
    workloads or rates, by name): every replay's TTFT and E2E errors are fitted together. With
    two or more, each is also left out in turn: fitted on the others, its own errors are the
    report's ``held_out`` entries (leave-one-workload-out), which tell how well the fit
    transfers to a workload it did not see. Returns the coefficients, the report and, per
    replay, which requests were replayed. Each fit runs at most ``max_evaluations`` simulations
    of every replay, after the scale grid."""
    if not replays:
        raise ValueError("records: give at least one record set")
    prepared = {name: _Replay.of(scenario, frame) for name, frame in replays.items()}
    names = list(prepared)
    fits = 1 + (len(names) if len(names) > 1 else 0)
    most = (len(SCALES) + max_evaluations) * fits
    done = 0

    def counted() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, most), most)

    coefficients, report = _fit_joint(
        scenario, [prepared[n] for n in names], initial, max_evaluations, counted
    )
    held_out: list[dict[str, float | str]] = []
    if len(names) > 1:
        for name in names:
            others = [prepared[n] for n in names if n != name]
            fitted, _ = _fit_joint(scenario, others, initial, max_evaluations, counted)
            replay = prepared[name]
            errors = relative_residuals(
                usable_records(replay.records), replay.simulate(scenario, fitted)
            )
            ttft, e2e = np.split(np.abs(errors), 2)
            held_out.append(
                {
                    "workload": name,
                    "ttft_relative_error_mean": float(ttft.mean()),
                    "e2e_relative_error_mean": float(e2e.mean()),
                }
            )
    report = report.model_copy(update={"held_out": held_out})
    return coefficients, report, [prepared[n].how for n in names]


@dataclasses.dataclass(frozen=True)
class _Replay:
    """One record set and the requests whose simulation reproduces it."""

    records: pd.DataFrame
    requests: list[Request]
    how: str

    @classmethod
    def of(cls, scenario: Scenario, records: pd.DataFrame) -> _Replay:
        requests, how = replay_requests(scenario, records)
        return cls(records, requests, how)

    def simulate(self, scenario: Scenario, coefficients: CalibratedCoefficients) -> pd.DataFrame:
        return build(scenario, requests=self.requests, coefficients=coefficients).run().records


def _fit_joint(
    scenario: Scenario,
    replays: list[_Replay],
    initial: CalibratedCoefficients,
    max_evaluations: int,
    counted: Callable[[], None],
) -> tuple[CalibratedCoefficients, FitReport]:
    """The scale grid, then the search, over the replays' records side by side (each replay's
    request ids moved past the ones before, so that no two requests share an id)."""
    initial = dataclasses.replace(
        initial,
        frontend_overhead_s=initial.frontend_overhead_s or INITIAL_FRONTEND_S,
        # A roofline's per-sequence cost is tiny (it only reads the KV cache); a real server
        # pays tens of µs per sequence for sampling and bookkeeping. Starting at a visible value
        # lets the search's finite differences see the term at all.
        per_decode_seq_s=max(initial.per_decode_seq_s, initial.step_overhead_s / 200),
    )
    offsets = [0]
    for replay in replays[:-1]:
        top = max(
            int(replay.records["request_id"].max()),
            max((r.request_id for r in replay.requests), default=0),
        )
        offsets.append(offsets[-1] + top + 1)

    def shifted(frame: pd.DataFrame, offset: int) -> pd.DataFrame:
        return frame.assign(request_id=frame["request_id"] + offset) if offset else frame

    records = pd.concat(
        [shifted(r.records, o) for r, o in zip(replays, offsets, strict=True)], ignore_index=True
    )

    def simulate(coefficients: CalibratedCoefficients) -> pd.DataFrame:
        frames = [
            shifted(r.simulate(scenario, coefficients), o)
            for r, o in zip(replays, offsets, strict=True)
        ]
        counted()
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    scale, scale_error = _best_scale(records, simulate, initial)
    coefficients, report = fit_from_records(
        records, simulate, _scaled(initial, scale), max_evaluations=max_evaluations
    )
    notes = [
        *(f"replayed: {r.how}" for r in replays),
        f"search started from the initial step coefficients × {scale:g} (mean |error| "
        f"{scale_error:.1%}, the best of {len(SCALES)} scales tried first)",
    ]
    report = report.model_copy(update={"notes": [*report.notes, *notes]})
    return coefficients, report


#: Factors tried on the starting step coefficients before the search (a server can be several
#: times slower than a roofline, or faster than a stale profile).
SCALES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _scaled(coefficients: CalibratedCoefficients, factor: float) -> CalibratedCoefficients:
    """Every step coefficient × ``factor``; the front-end overhead unchanged."""
    values = {
        name: getattr(coefficients, name) * (factor if name != "frontend_overhead_s" else 1.0)
        for name in SEARCHED_NAMES
    }
    return CalibratedCoefficients(**values)


def _best_scale(
    records: pd.DataFrame,
    simulate: Callable[[CalibratedCoefficients], pd.DataFrame],
    initial: CalibratedCoefficients,
) -> tuple[float, float]:
    """The factor of :data:`SCALES` whose replay is closest to the records, and its mean
    relative error. A grid, not a gradient: batching makes latency jump between factors."""
    measured = usable_records(records)
    best = (1.0, np.inf)
    for factor in SCALES:
        errors = np.abs(relative_residuals(measured, simulate(_scaled(initial, factor))))
        if float(errors.mean()) < best[1]:
            best = (factor, float(errors.mean()))
    return best
