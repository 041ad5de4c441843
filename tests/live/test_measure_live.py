"""A small measurement plan against the real vLLM server: every planned kind of observation
comes back, valid, and ordered as physics says (longer prefills take longer; a decode step is
shorter than the longest prefill).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calibration.measure_plan import MeasurementPlan
from calibration.measure_runner import measure
from calibration.observations import Observation
from live.tokens import PromptTokens
from tests.live.conftest import LIVE_ENGINE


def test_a_small_plan_measures_every_kind(vllm_server: Any, tiny_model_dir: Path) -> None:
    vocab = int(json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"])
    assert LIVE_ENGINE.max_model_len is not None
    plan = MeasurementPlan(
        prefill_lengths=(32, 512, 1536),
        decode_batches=(1, 8),
        decode_contexts=(64, 512),
        decode_tokens=24,
        mixed=True,
        repetitions=3,
        max_model_len=LIVE_ENGINE.max_model_len,
        max_num_seqs=LIVE_ENGINE.max_num_seqs,
        max_num_batched_tokens=LIVE_ENGINE.max_num_batched_tokens,
    )
    calls: list[tuple[int, int, str]] = []
    measurement = measure(
        vllm_server.url,
        vllm_server.model_name,
        PromptTokens(vocab),
        plan,
        block_size=LIVE_ENGINE.block_size,
        budget_s=60,
        progress=lambda done, total, label: calls.append((done, total, label)),
    )
    num_points = len(plan.points())
    assert measurement.complete, measurement.skipped
    assert measurement.duration_s < 90
    assert [done for done, _, _ in calls] == list(range(num_points + 1))
    assert len(measurement.raw) == num_points
    by_kind: dict[str, list[Observation]] = {}
    for observation in measurement.observations:
        assert isinstance(observation, Observation) and observation.seconds > 0
        by_kind.setdefault(observation.kind, []).append(observation)
    assert set(by_kind) == {"prefill", "decode", "mixed"}, measurement.raw

    lone = [o for o in by_kind["prefill"] if not o.batch.prefill_context_tokens]
    prefill_s = {o.batch.num_prefill_tokens: o.seconds for o in lone}
    assert set(prefill_s) == {32, 512, 1536}
    # Cached prefills: the new tokens after a 512-token prefix the server had computed (the
    # server's own count when it reports one, else the plan's).
    cached = [o for o in by_kind["prefill"] if o.batch.prefill_context_tokens]
    assert sorted(o.batch.num_prefill_tokens for o in cached) == [32, 512]
    assert all(o.batch.prefill_context_tokens == 512 for o in cached), measurement.raw
    assert prefill_s[32] < prefill_s[1536]
    assert all(o.includes_frontend for o in by_kind["prefill"])
    for decode in by_kind["decode"]:
        assert 0 < decode.seconds < prefill_s[1536]
        assert not decode.includes_frontend
        assert decode.batch.decode_context_tokens >= decode.batch.num_decode_seqs * 64
    for entry in measurement.raw:
        assert entry["statistic"] == "median"
        if entry["values_s"]:
            assert entry["iqr_s"] >= 0
