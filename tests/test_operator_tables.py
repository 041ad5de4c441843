"""Calibration from the public operator tables in shared/data, checked against the roofline."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from calibration import operator_sources, operator_steps, operator_tables
from calibration.fit import point_kind
from calibration.operator_tables import (
    SHIPPED,
    SOURCES,
    available,
    canonical_batches,
    compare_with_roofline,
    operator_observations,
    operator_profile,
    shipped_profile,
    shipped_profile_name,
)
from sim.catalog.hardware import get_gpu
from sim.catalog.models import get_model
from sim.engine.latency import DEFAULT_FRONTEND_OVERHEAD_S, RooflineModel
from sim.engine.profile import SCHEMA_VERSION, Profile, load_profile
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict


def test_llmservingsim_observations_sum_the_layer_table(shared_data: Path) -> None:
    observations = operator_observations(
        "llmservingsim", model="meta-llama/Llama-3.1-8B", data_dir=shared_data
    )
    assert all(obs.batch.num_decode_seqs == 0 for obs in observations)  # prefill sweep only
    by_tokens = {obs.batch.num_prefill_tokens: obs for obs in observations}
    # input=2048 row of tp1/layers.csv: 32 × Σ per-layer modules + embedding + final norm, plus
    # lm_head for the one sampled row (input=1): 32 × 1,929.9 µs + 61.4 + 148.0 + 366.3 µs.
    assert by_tokens[2048].seconds == pytest.approx(0.062333, rel=1e-4)
    assert by_tokens[2048].batch.prefill_attention_pairs == 2048 * 2049 // 2
    # Below ~128 tokens the weights dominate and the times wobble by a few per cent; above,
    # longer prefills always take longer.
    seconds = [by_tokens[n].seconds for n in sorted(by_tokens) if n >= 128]
    assert seconds == sorted(seconds)


def test_kernel_bench_adds_decode_steps(shared_data: Path) -> None:
    observations = operator_observations(
        "llmservingsim+kernel_bench", model="llama-3.1-8b", data_dir=shared_data
    )
    decodes = [obs for obs in observations if obs.batch.num_decode_seqs]
    assert len(decodes) >= 20
    step = {
        (obs.batch.num_decode_seqs, obs.batch.decode_context_tokens // obs.batch.num_decode_seqs): (
            obs.seconds
        )
        for obs in decodes
    }
    # More context or more sequences never makes a decode step faster (beyond kernel noise).
    assert step[(128, 8192)] > step[(128, 1024)]
    assert step[(128, 1024)] > step[(16, 1024)]
    # One 8B decode step on an H100 takes milliseconds, not microseconds or seconds.
    assert 0.004 < step[(1, 1024)] < 0.02


def test_unknown_combination_lists_what_exists(shared_data: Path) -> None:
    with pytest.raises(ValueError, match=r"Llama-3\.1-8B tp1.*Llama-3\.1-8B tp2"):
        operator_observations(
            "llmservingsim", model="llama-3.1-8b", tensor_parallel_size=8, data_dir=shared_data
        )
    with pytest.raises(ValueError, match="source: must be one of"):
        operator_observations("splitwise", model="llama-3.1-8b", data_dir=shared_data)
    with pytest.raises(ValueError, match="H100"):
        operator_observations(
            "llmservingsim", model="llama-3.1-8b", data_dir=shared_data, hardware="a100"
        )


@pytest.mark.parametrize("source", SOURCES)
def test_every_available_table_fits(source: str, shared_data: Path) -> None:
    hardware = "a100" if source == "vidur" else "h100"
    combos = available(source, shared_data, hardware)
    assert combos
    for model, tp in combos:
        profile = operator_profile(
            source, model=model, hardware=hardware, tensor_parallel_size=tp, data_dir=shared_data
        )
        # Measured: mean 2–6 %, p90 4–11 %, worst 6–36 % (vidur's tiny-batch points).
        assert profile.fit.relative_error_mean < 0.08, (source, model, tp)
        assert profile.fit.relative_error_p90 < 0.15, (source, model, tp)
        assert {point_kind(p) for p in profile.fit.points} == {"operator"}


def test_operator_profile_is_a_valid_profile(shared_data: Path, tmp_path: Path) -> None:
    profile = operator_profile(
        "llmservingsim+kernel_bench",
        model="meta-llama/Llama-3.1-8B",
        hardware="h100-sxm",
        tensor_parallel_size=1,
        data_dir=shared_data,
    )
    assert profile.schema_version == SCHEMA_VERSION
    assert (profile.model, profile.hardware) == ("llama-3.1-8b", "H100 SXM")
    assert profile.engine.name == "llmservingsim+kernel_bench"
    assert profile.data_summary["num_prefill_points"] == 15
    assert profile.data_summary["num_decode_points"] >= 20
    assert profile.data_summary["files"][0].endswith("Llama-3.1-8B/tp1/layers.csv")
    # Operator tables time no server: the front end is the roofline's measured default.
    assert profile.coefficients.frontend_overhead_s == DEFAULT_FRONTEND_OVERHEAD_S > 0
    assert not any("frontend_overhead_s fixed at 0" in note for note in profile.fit.notes)
    assert any("front end" in note for note in profile.data_summary["limitations"])
    reloaded = Profile.model_validate_json(profile.save(tmp_path / "p.json").read_text())
    assert reloaded == profile


def test_llama_2_finds_vidurs_tables_under_their_hf_names(shared_data: Path) -> None:
    # Vidur's folders are the checkpoints' repository names, Llama-2-7b-hf and Llama-2-70b-hf.
    # A name resolves as the catalogue resolves it: a chat checkpoint is its base model.
    for model, tp in (
        ("llama-2-7b", 1),
        ("meta-llama/Llama-2-70b-hf", 4),
        ("meta-llama/Llama-2-7b-chat-hf", 1),
    ):
        name = operator_sources.resolve_table_model(
            "vidur+kernel_bench", model, tp, shared_data, "h100-sxm"
        )
        assert name in ("Llama-2-7b-hf", "Llama-2-70b-hf")
    profile = operator_profile(
        "vidur+kernel_bench", model="llama-2-7b", hardware="h100-sxm", data_dir=shared_data
    )
    assert profile.model == "llama-2-7b"


def test_vidur_alone_cannot_identify_attention(shared_data: Path) -> None:
    profile = operator_profile(
        "vidur", model="Meta-Llama-3-8B", hardware="a100", data_dir=shared_data
    )
    assert profile.coefficients.per_context_token_s == 0.0
    assert profile.coefficients.per_prefill_pair_s == 0.0
    notes = " ".join(profile.fit.notes)
    assert "per_context_token_s fixed at 0" in notes
    assert "per_prefill_pair_s fixed at 0" in notes


def test_operator_profile_agrees_with_roofline_within_2x(shared_data: Path) -> None:
    roofline = RooflineModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))
    profile = operator_profile(
        "llmservingsim+kernel_bench",
        model="llama-3.1-8b",
        hardware="h100-sxm",
        data_dir=shared_data,
    )
    rows = compare_with_roofline(profile, roofline, canonical_batches())
    print(f"\n{'batch':<22}{'profile ms':>12}{'roofline ms':>13}{'ratio':>8}")
    for row in rows:
        print(
            f"{row['batch']:<22}{row['profile_ms']:>12.2f}{row['roofline_ms']:>13.2f}"
            f"{row['ratio']:>8.2f}"
        )
    assert [row["batch"] for row in rows] == list(canonical_batches())
    for row in rows:
        assert 0.5 < row["ratio"] < 2.0, row


# -- the shipped profiles ----------------------------------------------------------------------
PROFILES = Path(__file__).parents[1] / "profiles"


@pytest.mark.parametrize(("gpu", "model", "tp", "source"), SHIPPED)
def test_shipped_profiles_are_reproducible_and_usable(
    gpu: str, model: str, tp: int, source: str, shared_data: Path
) -> None:
    shipped = load_profile(PROFILES / shipped_profile_name(gpu, model, tp))
    refit = shipped_profile(gpu, model, tp, source, shared_data)
    # The shipped file is exactly what the public tables give (run `make profiles` to rebuild).
    for name, value in asdict(refit.coefficients).items():
        assert getattr(shipped.coefficients, name) == pytest.approx(value, rel=1e-6), name
    assert shipped.data_summary["source"] == source
    assert shipped.data_summary["files"]
    if tp > 1:
        assert any("all_reduce" in f for f in shipped.data_summary["files"])
    rows = shipped.data_summary["roofline_comparison"]
    assert {row["batch"] for row in rows} == set(canonical_batches())
    # A scenario on that GPU, model and TP simulates with the profile.
    scenario = parse_scenario(
        scenario_dict(
            model=model,
            gpu=gpu,
            engine={"tensor_parallel_size": tp, "max_model_len": 4096},
            latency={"profile": str(PROFILES / shipped_profile_name(gpu, model, tp))},
            workload={
                "arrival": {"type": "poisson", "rate": 2},
                "prompt_tokens": {"type": "constant", "value": 512},
                "output_tokens": {"type": "constant", "value": 32},
                "num_requests": 20,
            },
        )
    )
    summary = build(scenario).run().summary
    assert summary["requests"]["ok"] == 20


def test_a100_profiles_scale_the_h100_attention_kernels(shared_data: Path) -> None:
    a100 = shipped_profile("a100-80gb-sxm", "llama-3.1-8b", 1, "vidur+kernel_bench", shared_data)
    notes = " ".join(a100.fit.notes)
    assert "Meta-Llama-3-8B used for llama-3.1-8b" in notes
    assert "scaled to the A100" in notes
    # Decode attention reads the KV cache: the A100's is slower per context token than the H100's
    # by about the bandwidth ratio (the fits differ a little in how they split the terms).
    h100 = shipped_profile("h100-sxm", "llama-3.1-8b", 1, "llmservingsim+kernel_bench", shared_data)
    ratio = a100.coefficients.per_context_token_s / h100.coefficients.per_context_token_s
    assert 1.2 < ratio < 2.5


def test_make_profiles_entry_point_writes_every_shipped_profile(
    tmp_path: Path, shared_data: Path
) -> None:
    # `make profiles` runs `python -m calibration.operator_tables profiles ../shared/data`.
    done = subprocess.run(
        [sys.executable, "-m", "calibration.operator_tables", str(tmp_path), str(shared_data)],
        cwd=PROFILES.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names = [shipped_profile_name(gpu, model, tp) for gpu, model, tp, _ in SHIPPED]
    assert done.stdout.splitlines() == [str(tmp_path / name) for name in names]
    for name in names:
        written, shipped = load_profile(tmp_path / name), load_profile(PROFILES / name)
        for field, value in asdict(shipped.coefficients).items():
            assert getattr(written.coefficients, field) == pytest.approx(value, rel=1e-6), field


def test_operator_tables_keeps_the_names_of_the_split_modules() -> None:
    # The readers and step sums moved to operator_sources and operator_steps; importers of the
    # single old module get the same objects.
    for name in ("SOURCES", "MAX_DECODE_KV_LEN", "available"):
        assert getattr(operator_tables, name) is getattr(operator_sources, name)
    for name in ("PREFILL_LENGTHS", "operator_observations", "profiled_observations"):
        assert getattr(operator_tables, name) is getattr(operator_steps, name)
    assert operator_tables._LAYER_MODULES is operator_sources.LAYER_MODULES
    assert set(operator_tables.__all__) <= set(dir(operator_tables))
