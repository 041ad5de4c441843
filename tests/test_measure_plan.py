"""The measurement plan and budget parsing of calibration/measure_plan.py, without a server."""

from __future__ import annotations

import pytest

from calibration.measure_plan import MeasurementPlan, parse_budget

LIMITS = {"max_model_len": 2048, "max_num_seqs": 32, "max_num_batched_tokens": 2048}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("90s", 90), ("1h", 3600), ("2m30s", 150), ("1h5s", 3605), ("45", 45),
     (" 1.5m ", 90), ("2M", 120)],
)  # fmt: skip
def test_parse_budget_accepts_durations(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "5x", "30s2m", "1m1m", "0s", "-5", "m", "inf"])
def test_parse_budget_rejects_other_text_naming_the_format(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration like"):
        parse_budget(text)


def test_for_budget_keeps_every_point_within_the_engine_limits() -> None:
    plan = MeasurementPlan.for_budget(
        3600, max_model_len=1000, max_num_seqs=6, max_num_batched_tokens=512
    )
    assert max(plan.prefill_lengths) == 512  # one step takes at most max_num_batched_tokens
    assert min(plan.prefill_lengths) == 32
    assert max(plan.decode_batches) == 6
    assert all(c + plan.decode_tokens <= 1000 for c in plan.decode_contexts)
    for point in plan.points():
        assert point.batch_size <= 6
        assert point.context_tokens + point.max_tokens <= 1000
        if point.kind == "mixed":
            assert point.batch_size <= 5  # a free seat for the arriving prefill
            assert point.prompt_tokens + point.batch_size <= 512
    long_model = MeasurementPlan.for_budget(
        3600, max_model_len=300, max_num_seqs=256, max_num_batched_tokens=8192
    )
    assert max(long_model.prefill_lengths) == 298  # prompt + 2 output tokens fit the model


def test_for_budget_scales_down_with_a_small_budget() -> None:
    large = MeasurementPlan.for_budget(3600, **LIMITS)
    small = MeasurementPlan.for_budget(30, **LIMITS)
    tiny = MeasurementPlan.for_budget(1, **LIMITS)
    assert large.repetitions == 5 and large.mixed
    assert large.estimated_duration_s() <= 3600
    assert small.estimated_duration_s() <= 30
    assert len(small.points()) < len(large.points())
    assert small.repetitions <= large.repetitions
    # Below the smallest useful plan the smallest one comes back; measure() stops at the budget.
    assert tiny.repetitions == 1 and not tiny.mixed
    assert len(tiny.prefill_lengths) == 3
    assert len(tiny.decode_batches) == 2 and len(tiny.decode_contexts) == 2
    assert tiny.estimated_duration_s() > 1


def test_plan_rejects_prefills_that_would_be_chunked() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        MeasurementPlan((32, 4096), (1,), (64,), max_num_batched_tokens=2048)
    with pytest.raises(ValueError, match="decode_tokens"):
        MeasurementPlan((32,), (1,), (64,), decode_tokens=1)


def test_decode_batches_above_max_num_seqs_are_capped() -> None:
    plan = MeasurementPlan((32,), (1, 16, 64), (64,), max_num_seqs=16, mixed=False)
    assert plan.capped_batches() == (1, 16)
    assert {p.batch_size for p in plan.points() if p.kind == "decode"} == {1, 16}


def test_points_measure_extremes_first() -> None:
    plan = MeasurementPlan((32, 128, 512), (1, 4, 8), (64, 512), mixed=False)
    points = plan.points()
    assert [p.prompt_tokens for p in points[:3]] == [32, 512, 128]
    decodes = [
        (p.batch_size, p.context_tokens)
        for p in points
        if p.kind == "decode" and not p.shared_prefix_tokens
    ]
    assert decodes[:4] == [(1, 64), (8, 512), (8, 64), (1, 512)]
    assert len(decodes) == 6


def test_shared_decode_points_share_whole_blocks_of_the_largest_batchs_prompts() -> None:
    plan = MeasurementPlan((32,), (1, 16, 32), (64, 256, 1024), max_num_seqs=32, mixed=False)
    shared = [p for p in plan.points() if p.shared_prefix_tokens]
    assert [(p.batch_size, p.context_tokens, p.shared_prefix_tokens) for p in shared] == [
        (32, 1024, 896),
        (32, 256, 128),
    ]
    assert all(p.kind == "decode" and "P=" in p.label for p in shared)
    assert shared[0].params()["shared_prefix_tokens"] == 896
    # Too small a batch for GPUs to read a prefix once, or turned off: none.
    assert not MeasurementPlan((32,), (1, 4), (1024,), mixed=False).shared_points()
    off = MeasurementPlan((32,), (32,), (1024,), mixed=False, shared_prefix=False)
    assert not off.shared_points()


def test_cached_prefill_points_compute_prompts_after_a_cached_prefix() -> None:
    plan = MeasurementPlan((32, 128, 512), (1, 8), (64, 1008), mixed=False, **LIMITS)
    cached = [p for p in plan.points() if p.cached_tokens]
    # The shortest and the middle length after the largest context's whole blocks.
    assert [(p.prompt_tokens, p.cached_tokens) for p in cached] == [(928, 896), (1024, 896)]
    assert all(p.kind == "prefill" and "cached=896" in p.label for p in cached)
    assert cached[0].params() == {"prompt_tokens": 928, "cached_tokens": 896}
    # Within max_model_len: the new part shrinks to fit.
    tight = MeasurementPlan(
        (32, 512, 1024), (1,), (64, 1008), mixed=False, max_model_len=1100
    ).cached_prefill_points()
    assert all(p.prompt_tokens + 2 <= 1100 for p in tight)
    assert [p.prompt_tokens - p.cached_tokens for p in tight] == [32, 202]
    # Turned off, or no context long enough for a whole aligned prefix: none.
    assert not MeasurementPlan((32,), (1,), (1008,), cached_prefill=False).cached_prefill_points()
    assert not MeasurementPlan((32,), (1,), (100,)).cached_prefill_points()
    # The smallest plan leaves them out with the shared decode points.
    assert not MeasurementPlan.for_budget(1, **LIMITS).cached_prefill_points()


def test_a_slow_server_gets_fewer_repetitions_of_every_point_not_fewer_points() -> None:
    from calibration.measure_runner import repetitions_within

    # Points left: 10 s per repetition in all. 35 s left → 3 of each; 12 s → 1; 100 s → capped.
    per_rep = [4.0, 3.0, 2.0, 1.0]
    assert repetitions_within(35.0, per_rep, 5) == 3
    assert repetitions_within(12.0, per_rep, 5) == 1
    assert repetitions_within(100.0, per_rep, 5) == 5
    # Not even one of each fits: one repetition each, the budget check then skips what is left.
    assert repetitions_within(5.0, per_rep, 5) == 1
    assert repetitions_within(-1.0, per_rep, 5) == 1
    assert repetitions_within(10.0, [], 3) == 3
