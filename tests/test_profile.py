"""Calibration profiles: versioned files, setup checks, and simulation with fitted coefficients."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import (
    BatchShape,
    CalibratedModel,
    prefill_chunk_pairs,
)
from sim.engine.profile import (
    SCHEMA_VERSION,
    EngineInfo,
    FitReport,
    Profile,
    ProfileError,
    ProfileMismatchWarning,
    load_profile,
)
from sim.run import build, run
from sim.scenario import ScenarioError, parse_scenario
from tests.factories import scenario_dict

COEFFICIENTS = CalibratedCoefficients(
    step_overhead_s=0.002,
    per_prefill_token_s=2e-5,
    per_decode_seq_s=1e-4,
    per_context_token_s=1e-7,
    per_prefill_pair_s=1e-9,
    frontend_overhead_s=0.004,
)


def make_profile(**overrides: object) -> Profile:
    fields: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "model": "llama-3.1-8b",
        "hardware": "H100 SXM",
        "engine": EngineInfo(name="vllm", version="0.32.0"),
        "coefficients": COEFFICIENTS,
        "fit": FitReport(
            method="test",
            num_points=0,
            relative_error_mean=0.0,
            relative_error_p90=0.0,
            relative_error_max=0.0,
        ),
    }
    fields.update(overrides)
    return Profile(**fields)  # type: ignore[arg-type]


def test_calibrated_model_is_linear_in_what_a_step_computes() -> None:
    model = CalibratedModel(COEFFICIENTS)
    prefill = BatchShape(
        num_prefill_tokens=1000,
        num_prefill_seqs=1,
        prefill_attention_pairs=prefill_chunk_pairs(1000, 0),
    )
    expected = 0.002 + 1000 * 2e-5 + prefill_chunk_pairs(1000, 0) * 1e-9
    assert model.step_time(prefill) == pytest.approx(expected, rel=1e-12)
    decode = BatchShape(num_decode_seqs=8, decode_context_tokens=8000, num_sampled=8)
    assert model.step_time(decode) == pytest.approx(0.002 + 8e-4 + 8000 * 1e-7, rel=1e-12)
    with pytest.raises(ValueError, match="per_decode_seq_s"):
        CalibratedCoefficients(0.0, 0.0, -1.0, 0.0, 0.0)


def test_profile_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = make_profile().save(tmp_path / "p.json")
    assert load_profile(path) == make_profile()
    path.write_text(path.read_text()[:80])
    with pytest.raises(ProfileError, match="truncated"):
        load_profile(path)
    path.write_text(make_profile(schema_version=99).model_dump_json())
    with pytest.raises(ProfileError, match="schema_version 99"):
        load_profile(path)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def profile_scenario(path: Path, **overrides: object) -> dict[str, object]:
    data = scenario_dict(latency={"profile": str(path)}, **overrides)
    data["workload"] = {
        "arrival": {"type": "poisson", "rate": 0.05},
        "prompt_tokens": {"type": "constant", "value": 1000},
        "output_tokens": {"type": "constant", "value": 11},
        "num_requests": 5,
    }
    return data


def test_a_profile_drives_the_simulation_with_its_front_end_overhead(tmp_path: Path) -> None:
    path = make_profile().save(tmp_path / "p.json")
    records = run(parse_scenario(profile_scenario(path))).records
    # Requests are far apart: each sees the front end, one prefill step, then 10 decodes.
    prefill = 0.002 + 1000 * 2e-5 + prefill_chunk_pairs(1000, 0) * 1e-9
    assert records["ttft_s"].to_numpy() == pytest.approx(0.004 + prefill, rel=1e-9)
    decode_first = 0.002 + 1e-4 + 1001 * 1e-7
    assert records["tpot_s"].iloc[0] == pytest.approx(decode_first + 4.5 * 1e-7, rel=1e-9)


def test_a_profile_for_another_setup_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = make_profile(model="llama-3.1-70b").save(tmp_path / "p.json")
    with pytest.raises(ProfileError, match=r"model='llama-3\.1-70b'"):
        build(parse_scenario(profile_scenario(path)))
    path = make_profile(tensor_parallel_size=2).save(tmp_path / "p.json")
    with pytest.raises(ProfileError, match="tensor_parallel_size"):
        build(parse_scenario(profile_scenario(path)))


def test_an_older_engine_version_warns(tmp_path: Path) -> None:
    path = make_profile().save(tmp_path / "p.json")
    data = profile_scenario(path, engine={"vllm_version": "0.33.1"})
    with pytest.warns(ProfileMismatchWarning, match="0.32.0"):
        build(parse_scenario(data))


def test_a_missing_profile_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"latency\.path: profile not found"):
        parse_scenario(profile_scenario(tmp_path / "nope.json"))


def envelope_profile(tmp_path: Path) -> Path:
    """A profile whose measurements reached 8 decodes over 8,192 context tokens in all."""
    points = [
        {"num_decode_seqs": 8.0, "context_tokens": 8192.0, "num_prefill_tokens": 0.0},
        {"num_decode_seqs": 0.0, "context_tokens": 0.0, "num_prefill_tokens": 2048.0},
    ]
    fit = FitReport(
        method="test",
        num_points=2,
        relative_error_mean=0.0,
        relative_error_p90=0.0,
        relative_error_max=0.0,
        points=points,
    )
    return make_profile(fit=fit).save(tmp_path / "envelope.json")


def test_a_run_beyond_the_calibrated_envelope_says_so(tmp_path: Path) -> None:
    path = envelope_profile(tmp_path)
    busy = scenario_dict(latency={"profile": str(path)})
    busy["workload"] = {
        "arrival": {"type": "poisson", "rate": 200},
        "prompt_tokens": {"type": "constant", "value": 1024},
        "output_tokens": {"type": "constant", "value": 64},
        "num_requests": 64,
    }
    with pytest.warns(UserWarning, match="calibrated envelope: num_decode_seqs up to"):
        summary = build(parse_scenario(busy)).run().summary
    section = summary["calibration_envelope"]
    assert not section["inside"]
    assert section["outside"]["num_decode_seqs"]["measured"] == 8.0
    assert section["outside"]["num_decode_seqs"]["simulated"] > 8.8


def test_a_run_inside_the_calibrated_envelope_is_quiet(tmp_path: Path) -> None:
    path = envelope_profile(tmp_path)
    light = scenario_dict(latency={"profile": str(path)})
    light["workload"] = {
        "arrival": {"type": "poisson", "rate": 0.5},
        "prompt_tokens": {"type": "constant", "value": 256},
        "output_tokens": {"type": "constant", "value": 8},
        "num_requests": 10,
    }
    summary = build(parse_scenario(light)).run().summary
    assert summary["calibration_envelope"] == {"inside": True, "outside": {}}
    roofline = build(parse_scenario(scenario_dict())).run().summary
    assert "calibration_envelope" not in roofline
