"""Batching policies: continuous vs static vs dynamic, and chunked prefill.

Under a constant step time ``D`` every latency of an isolated request is exact: its prompt needs
``ceil(prompt / max_num_batched_tokens)`` steps before the first token (the last prefill step
emits it), then one step per further token. Those identities pin down the engine loop; the
roofline comparisons check that the policies differ the way the literature says they do
(Orca/vLLM: continuous batching keeps the GPU busy where static batching pads and waits).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from sim.run import SimResult, build
from sim.scenario import ScenarioError, parse_scenario

STEP_S = 0.01


def scenario(
    *,
    engine: dict[str, Any] | None = None,
    arrival: dict[str, Any] | None = None,
    prompt_tokens: dict[str, Any] | int = 64,
    output_tokens: dict[str, Any] | int = 16,
    num_requests: int = 1,
    latency: dict[str, Any] | None = None,
    seed: int = 2,
) -> dict[str, Any]:
    """A Llama-3.1-8B / H100 scenario dict; ints stand for constant lengths."""

    def length(spec: dict[str, Any] | int) -> dict[str, Any]:
        return {"type": "constant", "value": spec} if isinstance(spec, int) else spec

    return {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "seed": seed,
        "engine": {"max_model_len": 8192, **(engine or {})},
        "workload": {
            "arrival": arrival or {"type": "poisson", "rate": 1.0},
            "prompt_tokens": length(prompt_tokens),
            "output_tokens": length(output_tokens),
            "num_requests": num_requests,
        },
        "latency": latency or {"type": "constant", "step_s": STEP_S},
    }


def simulate(data: dict[str, Any]) -> SimResult:
    return build(parse_scenario(data)).run()


# --- continuous vs static under load ---------------------------------------------------------


def loaded(batching: str) -> SimResult:
    """Roofline Llama-3.1-8B on an H100 at 30 req/s: enough to saturate static batching."""
    return simulate(
        scenario(
            engine={"batching": batching},
            arrival={"type": "poisson", "rate": 30.0},
            prompt_tokens={"type": "uniform", "low": 400, "high": 600},
            output_tokens={"type": "uniform", "low": 50, "high": 500},
            num_requests=1500,
            latency={"type": "roofline"},
        )
    )


@pytest.fixture(scope="module")
def continuous_loaded() -> SimResult:
    return loaded("continuous")


@pytest.fixture(scope="module")
def static_loaded() -> SimResult:
    return loaded("static")


def test_continuous_batching_sustains_more_throughput_than_static(
    continuous_loaded: SimResult, static_loaded: SimResult
) -> None:
    continuous = continuous_loaded.summary
    static = static_loaded.summary
    assert continuous["requests"]["ok"] == static["requests"]["ok"] == 1500
    # Static batching is saturated: its queue grows (mean wait of seconds, not milliseconds) …
    assert static["queue_s"]["mean"] > 1.0
    assert continuous["queue_s"]["mean"] < 0.1
    # … so it delivers clearly fewer output tokens per second (measured ≈ 7.7k vs 6.1k).
    continuous_rate = continuous["throughput"]["output_tokens_per_s"]
    static_rate = static["throughput"]["output_tokens_per_s"]
    assert continuous_rate > 1.15 * static_rate
    # Both runs served the same requests, so the faster one also finished sooner.
    assert continuous["sim"]["simulated_s"] < static["sim"]["simulated_s"]


def test_continuous_batching_has_lower_ttft_than_static(
    continuous_loaded: SimResult, static_loaded: SimResult
) -> None:
    continuous_p90 = continuous_loaded.summary["ttft_s"]["p90"]
    static_p90 = static_loaded.summary["ttft_s"]["p90"]
    # Measured ≈ 0.04 s vs ≈ 12.6 s: new requests join the running batch at the next step
    # instead of waiting for the longest member of the current batch.
    assert continuous_p90 < 0.1 * static_p90
    assert continuous_p90 < 0.5


# --- joining a running batch -----------------------------------------------------------------


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_a_new_request_joins_a_running_batch_only_under_continuous_batching(
    batching: str,
) -> None:
    # Arrivals every 0.5 s (at 0.5, 1.0, 1.5, 2.0); each request decodes 200 tokens = 2 s.
    result = simulate(
        scenario(
            engine={"batching": batching},
            arrival={"type": "constant", "rate": 2.0},
            prompt_tokens=64,
            output_tokens=200,
            num_requests=4,
        )
    )
    records = result.records
    first = records.iloc[0]
    assert first["queue_s"] == 0.0
    assert first["e2e_s"] == pytest.approx(200 * STEP_S, rel=1e-9)
    later = records.iloc[1:]
    if batching == "continuous":
        # Each joins at the next step boundary: it waits less than one step.
        assert (later["queue_s"] < STEP_S).all()
    else:
        # Requests 1–3 all wait for request 0 to finish, then run as one batch.
        assert (later["scheduled_s"] == first["finish_s"]).all()
        assert later["queue_s"].to_list() == pytest.approx([1.5, 1.0, 0.5], rel=1e-9)


def test_static_batches_run_until_their_longest_member_finishes() -> None:
    # Six requests at once (1 ms apart), four per batch, outputs 5..60 tokens: the second batch
    # starts exactly when the first batch's longest member emits its last token.
    result = simulate(
        scenario(
            engine={"batching": "static", "max_num_seqs": 4},
            arrival={"type": "constant", "rate": 1000.0},
            prompt_tokens=32,
            output_tokens={"type": "uniform", "low": 5, "high": 60},
            num_requests=6,
            seed=5,
        )
    )
    records = result.records
    assert (records["status"] == "ok").all()
    batches = records.groupby("scheduled_s")
    assert list(batches.size()) == [1, 4, 1]  # first arrival starts alone; then 4, then the rest
    starts = sorted(batches.groups)
    ends = batches["finish_s"].max().sort_index().to_list()
    assert starts[1] == ends[0] and starts[2] == ends[1]
    # Inside a batch every member gets its first token at the same step (one prefill step).
    for _, batch in batches:
        assert batch["first_token_s"].nunique() == 1


# --- dynamic batching ------------------------------------------------------------------------


def low_load(batching: str, batch_window_s: float = 0.0) -> SimResult:
    """1 req/s of short requests (~0.13 s each on roofline): the engine is mostly idle."""
    return simulate(
        scenario(
            engine={"batching": batching, "batch_window_s": batch_window_s},
            arrival={"type": "poisson", "rate": 1.0},
            prompt_tokens=500,
            output_tokens=16,
            num_requests=300,
            # No front end: queue_s is then the engine's own wait.
            latency={"type": "roofline", "frontend_overhead_s": 0.0},
        )
    )


def test_dynamic_batching_waits_for_its_window_at_low_load() -> None:
    window_s = 0.2
    dynamic = low_load("dynamic", window_s).records
    continuous = low_load("continuous").records
    static = low_load("static").records
    # The oldest waiting request waits out the whole window, later ones join it: the mean wait
    # is close to the window (measured ≈ 0.185 s), never longer.
    assert 0.1 < dynamic["queue_s"].mean() <= window_s
    assert dynamic["queue_s"].max() == pytest.approx(window_s, rel=1e-9)
    assert dynamic.loc[0, "queue_s"] == pytest.approx(window_s, rel=1e-9)
    # Without a window, both continuous and static batching start an idle engine at once.
    assert continuous["queue_s"].mean() < 0.01
    assert static["queue_s"].mean() < 0.02
    assert continuous.loc[0, "queue_s"] == static.loc[0, "queue_s"] == 0.0
    assert dynamic["queue_s"].mean() > 5 * static["queue_s"].mean()


def test_dynamic_batching_starts_early_when_the_batch_is_full() -> None:
    # Arrivals every 1 ms, batches of 4, a 1 s window: each batch starts as soon as its 4th
    # member arrives (or the previous batch ends), long before the window closes.
    result = simulate(
        scenario(
            engine={"batching": "dynamic", "batch_window_s": 1.0, "max_num_seqs": 4},
            arrival={"type": "constant", "rate": 1000.0},
            prompt_tokens=32,
            output_tokens=1,
            num_requests=8,
        )
    )
    records = result.records
    assert records["scheduled_s"].to_list()[:4] == [records.loc[3, "arrival_s"]] * 4
    assert records.loc[4:, "scheduled_s"].nunique() == 1
    assert records["queue_s"].max() < 0.1
    # With 6 requests the second batch never fills: its oldest member waits out the window.
    tail = simulate(
        scenario(
            engine={"batching": "dynamic", "batch_window_s": 1.0, "max_num_seqs": 4},
            arrival={"type": "constant", "rate": 1000.0},
            prompt_tokens=32,
            output_tokens=1,
            num_requests=6,
        )
    ).records
    assert tail.loc[4, "queue_s"] == pytest.approx(1.0, rel=1e-9)
    assert tail.loc[4, "scheduled_s"] == tail.loc[5, "scheduled_s"]


# --- chunked prefill -------------------------------------------------------------------------


def test_chunked_prefill_off_with_a_budget_of_max_model_len_completes_everything() -> None:
    result = simulate(
        scenario(
            engine={
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": 2048,
                "max_model_len": 2048,
            },
            arrival={"type": "poisson", "rate": 20.0},
            prompt_tokens={"type": "uniform", "low": 100, "high": 1900},
            output_tokens={"type": "uniform", "low": 1, "high": 100},
            num_requests=200,
            latency={"type": "roofline"},
        )
    )
    records = result.records
    assert (records["status"] == "ok").all()
    assert len(records) == 200


def test_chunked_prefill_off_prefills_a_whole_prompt_in_one_step() -> None:
    records = simulate(
        scenario(
            engine={
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": 4096,
                "max_model_len": 4096,
            },
            prompt_tokens=4000,
            output_tokens=3,
        )
    ).records
    assert records.loc[0, "ttft_s"] == pytest.approx(STEP_S, rel=1e-9)
    assert records.loc[0, "e2e_s"] == pytest.approx(3 * STEP_S, rel=1e-9)


def test_chunked_prefill_off_with_a_small_budget_is_rejected() -> None:
    data = scenario(
        engine={
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 1024,
            "max_model_len": 2048,
        }
    )
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    problems = caught.value.problems
    assert any("max_num_batched_tokens" in problem for problem in problems)
    assert any("max_model_len=2048" in problem for problem in problems)
    # The same knobs with chunked prefill on are fine.
    data["engine"]["enable_chunked_prefill"] = True
    parse_scenario(data)


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    # 4000 tokens with a 512-token budget: 7 full chunks and one of 416, so the first token
    # comes at the end of the 8th step.
    records = simulate(
        scenario(
            engine={"max_num_batched_tokens": 512, "enable_chunked_prefill": True},
            prompt_tokens=4000,
            output_tokens=1,
        )
    ).records
    assert math.ceil(4000 / 512) == 8
    assert records.loc[0, "queue_s"] == 0.0
    assert records.loc[0, "ttft_s"] == pytest.approx(8 * STEP_S, rel=1e-9)


@pytest.mark.parametrize("batching", ["continuous", "static", "dynamic"])
@pytest.mark.parametrize(
    ("prompt", "budget", "output"),
    [
        (1, 16, 1),
        (16, 16, 2),
        (17, 16, 5),
        (511, 512, 40),
        (512, 512, 3),
        (513, 512, 3),
        (3000, 256, 17),
        (1000, 64, 1),
    ],
)
def test_isolated_request_latency_is_prefill_steps_then_one_step_per_token(
    batching: str, prompt: int, budget: int, output: int
) -> None:
    # Requests 100 s apart never overlap. Dynamic batching adds exactly its window of waiting.
    window_s = 0.05 if batching == "dynamic" else 0.0
    records = simulate(
        scenario(
            engine={
                "batching": batching,
                "batch_window_s": window_s,
                "max_num_batched_tokens": budget,
                "max_num_seqs": min(budget, 256),
            },
            arrival={"type": "constant", "rate": 0.01},
            prompt_tokens=prompt,
            output_tokens=output,
            num_requests=3,
        )
    ).records
    prefill_steps = math.ceil(prompt / budget)
    expected_ttft = window_s + prefill_steps * STEP_S
    for _, record in records.iterrows():
        assert record["status"] == "ok"
        assert record["cached_tokens"] == 0
        assert record["queue_s"] == pytest.approx(window_s, abs=1e-9)
        assert record["ttft_s"] == pytest.approx(expected_ttft, rel=1e-9)
        assert record["e2e_s"] == pytest.approx(expected_ttft + (output - 1) * STEP_S, rel=1e-9)
        if output > 1:
            assert record["tpot_s"] == pytest.approx(STEP_S, rel=1e-9)
