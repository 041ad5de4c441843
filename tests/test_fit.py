"""Fitting the calibrated model: exact recovery, noise, identifiability, fits through replays."""

from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from calibration.fit import (
    COEFFICIENT_NAMES,
    MAX_REPORTED_POINTS,
    fit_from_records,
    fit_steps,
    point_kind,
    predict_seconds,
)
from calibration.observations import Observation
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import (
    BatchShape,
    CalibratedModel,
    prefill_chunk_pairs,
)
from sim.engine.request import Request
from sim.engine.scheduler import ContinuousBatchScheduler, SchedulerConfig
from sim.report.summary import SLO
from sim.run import Simulation
from sim.workload.arrivals import GammaArrivals
from sim.workload.generate import generate_requests
from sim.workload.lengths import UniformLength

TRUTH = CalibratedCoefficients(
    step_overhead_s=0.004,
    per_prefill_token_s=6e-5,
    per_decode_seq_s=2e-4,
    per_context_token_s=3e-8,
    per_prefill_pair_s=1e-9,
    frontend_overhead_s=0.003,
    per_shared_context_token_s=4e-9,
)


def prefill(num_tokens: int, context: int = 0) -> BatchShape:
    """One prefill chunk of ``num_tokens`` after ``context`` computed tokens."""
    return BatchShape(
        num_prefill_tokens=num_tokens,
        num_prefill_seqs=1,
        prefill_attention_pairs=prefill_chunk_pairs(num_tokens, context),
        prefill_context_tokens=context,
        num_sampled=1,
    )


def decode(num_seqs: int, context: int) -> BatchShape:
    """``num_seqs`` decodes of ``context`` tokens each."""
    return BatchShape(
        num_decode_seqs=num_seqs, decode_context_tokens=num_seqs * context, num_sampled=num_seqs
    )


def shared_decode(num_seqs: int, context: int, prefix: int) -> BatchShape:
    """``num_seqs`` decodes of ``context`` tokens whose first ``prefix`` they all share."""
    return BatchShape(
        num_decode_seqs=num_seqs,
        decode_context_tokens=num_seqs * context,
        num_sampled=num_seqs,
        shared_context_tokens=(num_seqs - 1) * prefix,
    )


def mixed(num_tokens: int, num_seqs: int, context: int) -> BatchShape:
    """A chunk plus decodes in one step."""
    chunk, decodes = prefill(num_tokens), decode(num_seqs, context)
    return BatchShape(
        num_prefill_tokens=chunk.num_prefill_tokens,
        num_prefill_seqs=1,
        prefill_attention_pairs=chunk.prefill_attention_pairs,
        num_decode_seqs=decodes.num_decode_seqs,
        decode_context_tokens=decodes.decode_context_tokens,
        num_sampled=1 + num_seqs,
    )


def synthetic(
    coefficients: CalibratedCoefficients, noise: float = 0.0, seed: int = 0
) -> list[Observation]:
    """Prefills (some as client TTFT with the front end), chunks, decodes and mixed steps."""
    model = CalibratedModel(coefficients)
    rng = np.random.default_rng(seed)
    items: list[tuple[BatchShape, str, bool]] = []
    for n in (16, 64, 256, 1024, 2048, 4096, 8192):
        items.append((prefill(n), "prefill", False))
        items.append((prefill(n), "prefill", True))  # lone request's TTFT seen by a client
    for n, c in ((512, 2048), (1024, 8192), (256, 30000)):
        items.append((prefill(n, c), "prefill", False))
    for b in (1, 4, 16, 64, 256):
        for c in (128, 1024, 8192):
            items.append((decode(b, c), "decode", False))
    for n, b, c in ((256, 32, 1024), (1024, 8, 4096), (64, 128, 512)):
        items.append((mixed(n, b, c), "mixed", False))
    for b, c, p in ((16, 1024, 896), (64, 2048, 1920)):  # decodes sharing a prefix
        items.append((shared_decode(b, c, p), "decode", False))
    observations = []
    for batch, kind, frontend in items:
        seconds = model.step_time(batch) + (coefficients.frontend_overhead_s if frontend else 0.0)
        if noise:
            seconds *= 1.0 + noise * rng.standard_normal()
        observations.append(Observation(batch, seconds, kind, includes_frontend=frontend))
    return observations


def test_recovers_known_coefficients_exactly() -> None:
    fitted, report = fit_steps(synthetic(TRUTH))
    for name in COEFFICIENT_NAMES:
        assert getattr(fitted, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6), name
    assert report.relative_error_max < 1e-8
    assert report.num_points == len(report.points) == len(synthetic(TRUTH))
    assert report.notes == []


def test_recovers_coefficients_under_two_percent_noise() -> None:
    observations = [o for seed in range(4) for o in synthetic(TRUTH, noise=0.02, seed=seed)]
    fitted, report = fit_steps(observations)
    # The well-determined terms come back within a few per cent; the small ones within 25 %.
    for name, tolerance in (
        ("step_overhead_s", 0.1),
        ("per_prefill_token_s", 0.05),
        ("per_decode_seq_s", 0.1),
        ("per_context_token_s", 0.1),
        ("per_prefill_pair_s", 0.25),
        ("frontend_overhead_s", 0.25),
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUTH, name), rel=tolerance), name
    assert 0.01 < report.relative_error_mean < 0.04  # the noise, not a misfit
    assert report.relative_error_p90 <= report.relative_error_max


def test_report_points_describe_each_observation() -> None:
    observations = synthetic(TRUTH)
    fitted, report = fit_steps(observations, method_name="unit")
    assert report.method == "unit"
    predicted = predict_seconds(fitted, observations)
    for obs, point, pred in zip(observations, report.points, predicted, strict=True):
        assert point_kind(point) == obs.kind
        assert point["measured_s"] == obs.seconds
        assert point["predicted_s"] == pytest.approx(pred)
        assert point["relative_error"] == pytest.approx((pred - obs.seconds) / obs.seconds)
        assert point["num_prefill_tokens"] == obs.batch.num_prefill_tokens
        assert point["num_decode_seqs"] == obs.batch.num_decode_seqs
        assert point["pairs"] == obs.batch.prefill_attention_pairs
        assert point["includes_frontend"] == float(obs.includes_frontend)


def test_unidentified_terms_are_fixed_at_zero_and_reported() -> None:
    truth = CalibratedCoefficients(0.005, 0.0, 1e-4, 5e-8, 0.0)
    model = CalibratedModel(truth)
    batches = [decode(b, c) for b in (1, 8, 64, 256) for c in (256, 4096)]
    observations = [Observation(b, model.step_time(b), "decode") for b in batches]
    fitted, report = fit_steps(observations)
    assert fitted.per_prefill_token_s == 0.0
    assert fitted.per_prefill_pair_s == 0.0
    assert fitted.frontend_overhead_s == 0.0
    assert fitted.per_decode_seq_s == pytest.approx(1e-4, rel=1e-6)
    assert len(report.notes) == 4  # and the shared term priced as any context
    joined = " ".join(report.notes)
    for name in ("per_prefill_token_s", "per_prefill_pair_s", "frontend_overhead_s"):
        assert name in joined


def test_too_few_observations_raise() -> None:
    observations = [Observation(mixed(64 * k, k, 1000), 0.01 * k, "mixed") for k in (1, 2, 3)]
    with pytest.raises(ValueError, match=r"3 measured steps cannot determine 5 coefficients"):
        fit_steps(observations)
    with pytest.raises(ValueError, match="none"):
        fit_steps([])


def test_coefficients_stay_non_negative_when_data_want_a_negative_term() -> None:
    # Steps get *faster* with more decodes: the unconstrained slope is negative.
    batches = [decode(b, 1000) for b in (1, 2, 4, 8, 16, 32)]
    observations = [
        Observation(batch, 0.02 - 1e-4 * batch.num_decode_seqs, "decode") for batch in batches
    ]
    fitted, _ = fit_steps(observations)
    values = asdict(fitted)
    assert all(value >= 0 for value in values.values())
    assert fitted.per_decode_seq_s == 0.0 or fitted.per_context_token_s == 0.0


# -- fit_from_records -----------------------------------------------------------------------
RECORDS_TRUTH = CalibratedCoefficients(
    step_overhead_s=0.003,
    per_prefill_token_s=5e-5,
    per_decode_seq_s=1.5e-4,
    per_context_token_s=2e-8,
    per_prefill_pair_s=0.0,
    frontend_overhead_s=0.002,
)


def workload() -> list[Request]:
    """150 bursty requests (10 req/s, gaps with CV 3) with mixed prompt and output lengths.

    Bursts make batch sizes vary, which is what separates the per-step overhead from the
    per-sequence cost; under steady light load the two are nearly collinear.
    """
    return generate_requests(
        np.random.SeedSequence(11),
        GammaArrivals(rate=10.0, cv=3.0),
        UniformLength(64, 1024),
        UniformLength(8, 96),
        num_requests=150,
    )


def replay(requests: list[Request], coefficients: CalibratedCoefficients) -> pd.DataFrame:
    """The requests through one simulated replica whose steps follow ``coefficients``."""
    kv = KVCacheManager(num_blocks=4096, block_size=16, enable_prefix_caching=False)
    scheduler = ContinuousBatchScheduler(
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048), kv
    )
    simulation = Simulation(
        requests,
        scheduler,
        CalibratedModel(coefficients),
        max_model_len=4096,
        slo=SLO(ttft_s=1.0, tpot_s=0.1),
        kv_capacity_tokens=4096 * 16,
        frontend_overhead_s=coefficients.frontend_overhead_s,
    )
    return simulation.run().records


def test_fit_from_records_recovers_ttft_and_e2e() -> None:
    requests = workload()
    measured = replay(requests, RECORDS_TRUTH)
    assert (measured["status"] == "ok").all()
    initial = CalibratedCoefficients(
        step_overhead_s=0.005,
        per_prefill_token_s=3e-5,
        per_decode_seq_s=2.5e-4,
        per_context_token_s=4e-8,
        per_prefill_pair_s=0.0,
        frontend_overhead_s=0.001,
    )
    _, start_report = fit_from_records(
        measured, lambda c: replay(requests, c), initial, max_evaluations=1
    )
    started = time.perf_counter()
    fitted, report = fit_from_records(
        measured, lambda c: replay(requests, c), initial, max_evaluations=60
    )
    assert time.perf_counter() - started < 20
    assert start_report.relative_error_mean > 0.15  # the start is far off
    assert report.relative_error_mean < 0.05
    assert report.relative_error_p90 < 0.08
    assert report.num_points == 2 * len(measured)
    assert len(report.points) <= MAX_REPORTED_POINTS
    assert {point_kind(p) for p in report.points} == {"ttft", "e2e"}
    # The coefficients that dominate these latencies come back within 20 %; the context term
    # (a few per cent of a step here) is only loosely determined.
    for name in (
        "step_overhead_s",
        "per_prefill_token_s",
        "per_decode_seq_s",
        "frontend_overhead_s",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(RECORDS_TRUTH, name), rel=0.2), name
    assert fitted.per_prefill_pair_s == 0.0  # zero at the start, held there
    assert any("per_prefill_pair_s held at 0" in note for note in report.notes)


def test_fit_from_records_rejects_bad_input() -> None:
    empty = pd.DataFrame({"request_id": [0], "ttft_s": [0.1], "e2e_s": [0.5], "status": ["error"]})
    with pytest.raises(ValueError, match="no ok request"):
        fit_from_records(empty, lambda c: empty, RECORDS_TRUTH)
    with pytest.raises(ValueError, match="missing columns"):
        fit_from_records(pd.DataFrame({"request_id": [0]}), lambda c: empty, RECORDS_TRUTH)


def test_without_a_shared_prefix_measured_it_is_priced_as_any_context() -> None:
    plain = [o for o in synthetic(TRUTH) if o.batch.shared_context_tokens == 0]
    fitted, report = fit_steps(plain)
    assert fitted.per_shared_context_token_s == fitted.per_context_token_s
    assert any("no shared prefix measured" in note for note in report.notes)


def test_a_profile_without_the_shared_term_reads_as_before() -> None:
    old = CalibratedCoefficients(0.004, 6e-5, 2e-4, 3e-8, 1e-9)
    assert old.per_shared_context_token_s == old.per_context_token_s
    shape = shared_decode(16, 1024, 896)
    flat = BatchShape(num_decode_seqs=16, decode_context_tokens=16 * 1024, num_sampled=16)
    assert CalibratedModel(old).step_time(shape) == pytest.approx(
        CalibratedModel(old).step_time(flat), rel=1e-12
    )


# -- the linear layers' floor -----------------------------------------------------------------
#: A server whose linear layers take at least 2 ms a step (their weights read once): below 10
#: decodes or tokens of prefill, the per-token terms are under it.
FLOORED = CalibratedCoefficients(
    step_overhead_s=0.004,
    per_prefill_token_s=2e-4,
    per_decode_seq_s=2e-4,
    per_context_token_s=3e-8,
    per_prefill_pair_s=1e-9,
    frontend_overhead_s=0.003,
    linear_floor_s=0.002,
)


def test_the_floor_bounds_the_linear_part_from_below() -> None:
    model = CalibratedModel(FLOORED)
    small, large = decode(2, 512), decode(64, 512)
    context = 3e-8 * 2 * 512
    assert model.step_time(small) == pytest.approx(0.004 + 0.002 + context)
    assert model.step_time(large) == pytest.approx(0.004 + 64 * 2e-4 + 3e-8 * 64 * 512)
    # Fast-forward's decode runs take the same floats as step by step.
    for num_seqs in (1, 9, 10, 11, 40):
        run = model.decode_step_times(num_seqs, num_seqs * 300, 5, shared=0)
        assert run == [model.step_time(decode(num_seqs, 300 + i)) for i in range(5)], num_seqs


def test_the_fit_finds_a_floor_the_data_show() -> None:
    fitted, report = fit_steps(synthetic(FLOORED))
    assert fitted.linear_floor_s == pytest.approx(0.002, rel=1e-3)
    assert fitted.per_decode_seq_s == pytest.approx(2e-4, rel=1e-3)
    assert report.relative_error_max < 1e-3
    assert any(note.startswith("linear_floor_s") for note in report.notes)
    # The linear model alone misses the smallest steps by far more.
    linear = CalibratedModel(FLOORED.__class__(**{**asdict(FLOORED), "linear_floor_s": 0.0}))
    assert linear.step_time(decode(1, 128)) < 0.8 * CalibratedModel(FLOORED).step_time(
        decode(1, 128)
    )


def test_no_floor_where_the_linear_model_already_fits() -> None:
    fitted, report = fit_steps(synthetic(TRUTH))
    assert fitted.linear_floor_s == 0.0
    assert not any(note.startswith("linear_floor_s") for note in report.notes)
