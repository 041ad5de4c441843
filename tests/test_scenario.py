"""Scenario validation: one clear line per problem, naming the field; defaults that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.build.engines import pool_scenario
from sim.scenario import (
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
    scenario_to_yaml,
)
from sim.scenario.sections import PoolSpec
from tests.factories import scenario_dict


def problems(data: object) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    return info.value.problems


def test_default_scenario_is_valid_and_as_documented() -> None:
    scenario = default_scenario()
    assert scenario.model == "llama-3.1-8b"
    assert scenario.gpu == "h100-sxm"
    assert scenario.dtype == "bf16"
    assert scenario.engine.enable_prefix_caching and scenario.engine.enable_chunked_prefill


def test_negative_rate_names_the_field_and_value() -> None:
    data = scenario_dict()
    data["workload"]["arrival"]["rate"] = -3
    assert problems(data) == ["workload.arrival.rate: must be > 0, got -3"]


def test_unknown_keys_get_a_did_you_mean_hint() -> None:
    data = scenario_dict(engine={"max_num_seq": 12})
    data["workload"]["prompt_tokens"] = {"type": "constant", "valeu": 5}
    found = problems(data)
    assert "engine.max_num_seq: unknown key; did you mean 'max_num_seqs'?" in found
    assert "workload.prompt_tokens.valeu: unknown key; did you mean 'value'?" in found
    assert "workload.prompt_tokens.value: required field is missing" in found


def test_top_level_typo() -> None:
    data = scenario_dict()
    data["worklaod"] = data.pop("workload")
    found = problems(data)
    assert "worklaod: unknown key; did you mean 'workload'?" in found
    assert "workload: required field is missing" in found


def test_every_problem_is_reported_once() -> None:
    data = scenario_dict(engine={"gpu_memory_utilization": 1.5, "block_size": 7})
    data["workload"]["arrival"] = {"type": "poison", "rate": 2}
    found = problems(data)
    assert len(found) == len(set(found)) == 3
    assert "engine.gpu_memory_utilization: must be <= 1, got 1.5" in found
    assert any(p.startswith("engine.block_size: must be one of") for p in found)
    assert any(p.startswith("workload.arrival: unknown type 'poison'") for p in found)


def test_wrong_types_are_named() -> None:
    data = scenario_dict()
    data["workload"]["num_requests"] = "many"
    assert problems(data) == [
        "workload.num_requests: input should be a valid integer, "
        "unable to parse string as an integer, got 'many'"
    ]


def test_absurd_request_counts_are_refused() -> None:
    data = scenario_dict()
    data["workload"]["num_requests"] = 10**9
    assert problems(data) == ["workload.num_requests: must be <= 10000000, got 1000000000"]


def test_workload_needs_a_size() -> None:
    data = scenario_dict()
    del data["workload"]["num_requests"]
    assert problems(data) == [
        "workload: give num_requests or duration_s (or both: whichever ends first)"
    ]


def test_contradictory_knobs() -> None:
    data = scenario_dict(
        engine={
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": 2048,
            "max_model_len": 8192,
        }
    )
    found = problems(data)
    assert len(found) == 1 and found[0].startswith("engine.max_num_batched_tokens: 2048")
    assert "enable_chunked_prefill" in found[0]


def test_tp_must_divide_the_heads() -> None:
    data = scenario_dict(model="qwen2.5-7b", engine={"tensor_parallel_size": 8})
    assert problems(data) == [
        "engine.tensor_parallel_size: 8 does not divide the model's 28 attention heads; "
        "use a divisor"
    ]


def test_unknown_model_and_gpu_suggest_names() -> None:
    assert "did you mean 'llama-3.1-8b'" in problems(scenario_dict(model="llama-3.1-8"))[0]
    assert "did you mean 'h100-sxm'" in problems(scenario_dict(gpu="h10-sxm"))[0]


def test_a_quantized_checkpoint_sets_its_weights_and_contradicting_them_is_refused() -> None:
    fp8 = parse_scenario(scenario_dict(model="Qwen/Qwen3-8B-FP8"))
    assert (fp8.dtype, fp8.quantization) == ("fp8", "auto")
    gptq = parse_scenario(scenario_dict(model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8"))
    assert (gptq.dtype, gptq.quantization) == ("int8", "weight_only")  # not W8A8's int8 rate
    nf4 = parse_scenario(scenario_dict(model="unsloth/Llama-3.2-1B-bnb-4bit", quantization="auto"))
    assert (nf4.dtype, nf4.quantization) == ("int4", "bitsandbytes")
    # An fp8 checkpoint runs either way, by the GPU.
    weight_only = scenario_dict(model="Qwen/Qwen3-8B-FP8", quantization="weight_only")
    assert parse_scenario(weight_only).quantization == "weight_only"
    assert problems(scenario_dict(model="Qwen/Qwen2.5-7B-Instruct-AWQ", dtype="bf16")) == [
        "dtype: model 'Qwen/Qwen2.5-7B-Instruct-AWQ' is an int4 checkpoint but dtype is 'bf16'; "
        "set dtype: int4 or auto (vLLM's --dtype is the activations' type), or name the 16-bit "
        "model"
    ]
    awq_as_nf4 = scenario_dict(model="Qwen/Qwen2.5-7B-Instruct-AWQ", quantization="bitsandbytes")
    assert problems(awq_as_nf4) == [
        "quantization: model 'Qwen/Qwen2.5-7B-Instruct-AWQ' is a weight-only int4 checkpoint, "
        "which vLLM does not serve as 'bitsandbytes'; leave quantization out"
    ]


def test_dtypes_read_as_vllm_and_hugging_face_spell_them() -> None:
    # As copied from a vLLM command line (--dtype bfloat16, --kv-cache-dtype fp8_e4m3) or a
    # config.json (torch_dtype: float16).
    spelled = parse_scenario(scenario_dict(dtype="bfloat16", kv_cache_dtype="fp8_e4m3"))
    assert (spelled.dtype, spelled.kv_cache_dtype) == ("bf16", "fp8")
    assert parse_scenario(scenario_dict(dtype="Float16")).dtype == "fp16"
    # --dtype auto: the checkpoint's own weights, 16-bit or quantized.
    assert parse_scenario(scenario_dict(dtype="auto")).dtype == "bf16"
    fp8 = parse_scenario(scenario_dict(model="Qwen/Qwen3-8B-FP8", dtype="auto"))
    assert (fp8.dtype, fp8.quantization) == ("fp8", "auto")
    found = problems(scenario_dict(dtype="float32"))  # quoted as written
    assert len(found) == 1 and found[0].startswith("dtype:") and "'float32'" in found[0]


def test_batch_limits_left_out_are_the_ones_vllm_picks_for_the_gpu() -> None:
    def limits(**engine: object) -> tuple[int, int]:
        gpu = engine.pop("gpu", "h100-sxm")
        parsed = parse_scenario(scenario_dict(gpu=gpu, engine={"max_model_len": 8192, **engine}))
        return parsed.engine.max_num_seqs, parsed.engine.max_num_batched_tokens

    assert limits() == (1024, 8192)  # 70 GiB or more
    assert limits(gpu="h200") == (1024, 8192)
    assert limits(gpu="a100-80gb-sxm") == (256, 2048)  # large, but vLLM excludes the A100
    assert limits(gpu="l40s") == (256, 2048)
    assert limits(max_num_seqs=64) == (64, 8192)  # what a scenario sets stays
    assert limits(max_num_batched_tokens=512) == (512, 512)  # seqs never above tokens
    # Chunked prefill off: a step must hold the whole context.
    assert limits(gpu="l40s", enable_chunked_prefill=False) == (256, 8192)


def test_w8a8_fp8_on_a100_is_refused() -> None:
    # An A100 has no fp8 tensor cores: fp8 weights can only run weight-only there.
    found = problems(scenario_dict(gpu="a100-80gb-sxm", dtype="fp8", quantization="w8a8"))
    assert len(found) == 1 and found[0].startswith("quantization:") and "fp8" in found[0]
    parse_scenario(scenario_dict(gpu="a100-80gb-sxm", dtype="fp8"))  # weight-only: accepted


def test_custom_gpu_and_hf_config_model(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
                "max_position_embeddings": 2048,
            }
        )
    )
    data = scenario_dict(
        model={"hf_config": str(config)},
        gpu={"name": "lab", "memory_gb": 24, "memory_bandwidth_tb_s": 1, "bf16_tflops": 100},
        engine={"max_model_len": 2048},
    )
    scenario = parse_scenario(data)
    assert scenario.resolve_model().hidden_size == 256
    assert scenario.resolve_gpu().memory_bytes == 24e9


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(scenario_to_yaml(default_scenario()))
    assert load_scenario(path) == default_scenario()


def test_broken_yaml_and_missing_files_are_clean_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model: llama-3.1-8b\nworkload: [\n")
    with pytest.raises(ScenarioError, match=r"line 3, column 1: invalid YAML"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="file not found"):
        load_scenario(tmp_path / "nope.yaml")
    path.write_text("- just\n- a list\n")
    with pytest.raises(ScenarioError, match="expected a mapping"):
        load_scenario(path)


def test_infinite_values_are_refused() -> None:
    data = scenario_dict(latency={"type": "constant", "step_s": float("inf")})
    assert problems(data) == ["latency.step_s: input should be a finite number, got inf"]


def test_a_trace_refuses_synthetic_lengths_and_missing_files(shared_data: Path) -> None:
    data = scenario_dict()
    data["workload"] = {
        "trace": {"path": str(shared_data / "azure_llm_2023/AzureLLMInferenceTrace_code.csv")},
        "prompt_tokens": {"type": "constant", "value": 5},
        "num_requests": 10,
    }
    assert problems(data) == [
        "workload: a trace brings its own lengths and prefixes; remove prompt_tokens"
    ]
    data["workload"] = {"trace": {"path": "no/such/trace.csv"}, "num_requests": 10}
    assert problems(data) == ["workload.trace.path: file not found: no/such/trace.csv"]
    # An empty path is not the current directory (found by benchmarks/fuzz.py).
    data["workload"]["trace"]["path"] = " "
    assert problems(data) == ["workload.trace.path: empty; give the file's path"]


def test_max_model_len_beyond_the_models_positions_is_refused() -> None:
    found = problems(scenario_dict(model="mistral-7b", engine={"max_model_len": 10**6}))
    assert len(found) == 1 and found[0].startswith("engine.max_model_len: 1000000 exceeds")


def test_the_schema_stays_one_import_away() -> None:
    import sim.scenario
    from sim.scenario import errors, load, model, sections, workload

    exported = set(sim.scenario.__all__)
    assert {"Scenario", "ScenarioError", "EngineSpec", "WorkloadSpec", "parse_scenario"} <= exported
    assert all(hasattr(sim.scenario, name) for name in exported)
    assert sim.scenario.Scenario is model.Scenario
    assert sim.scenario.ScenarioError is errors.ScenarioError
    assert sim.scenario.load_scenario is load.load_scenario
    assert sim.scenario.FleetSpec is sections.FleetSpec
    assert sim.scenario.WorkloadSpec is workload.WorkloadSpec
    assert load.DEFAULT_SCENARIO_FILE in {p.name for p in Path(sim.__file__).parent.glob("*.yaml")}


def test_vllm_bench_burstiness_is_a_gamma_shape() -> None:
    # vllm bench serve --burstiness B: gamma gaps of shape B, so cv = 1/sqrt(B); 1 is Poisson.
    data = scenario_dict()
    data["workload"]["arrival"] = {"type": "gamma", "rate": 4, "burstiness": 0.25}
    arrival = parse_scenario(data).workload.arrival
    assert arrival is not None and arrival.type == "gamma"
    assert arrival.cv == pytest.approx(2.0)
    data["workload"]["arrival"] = {"type": "gamma", "rate": 4, "burstiness": 0.25, "cv": 2}
    assert any("cv or burstiness" in p for p in problems(data))
    data["workload"]["arrival"] = {"type": "gamma", "rate": 4, "burstiness": 0}
    assert any("burstiness" in p and "got 0" in p for p in problems(data))


def test_a_custom_gpu_with_an_nvlink_bridge_needs_its_bandwidth() -> None:
    bridged = {"name": "lab", "memory_gb": 94, "memory_bandwidth_tb_s": 3.9, "bf16_tflops": 835}
    bridged["bridge_size"] = 2
    assert problems(scenario_dict(gpu=bridged)) == [
        "gpu.bridge_bandwidth_gb_s: a GPU with bridge_size needs its NVLink bridge's bandwidth "
        "per GPU, one direction, in GB/s (H100 NVL: 300)"
    ]
    unbridged = {**bridged, "bridge_size": 0, "bridge_bandwidth_gb_s": 300}
    assert problems(scenario_dict(gpu=unbridged))[0].startswith("gpu.bridge_size: ")
    gpu = parse_scenario(scenario_dict(gpu={**bridged, "bridge_bandwidth_gb_s": 300}))
    assert gpu.resolve_gpu().link(2) == ("nvlink", 300e9)
    assert gpu.resolve_gpu().link(4) == ("pcie", 32e9)


def test_a_pool_on_another_gpu_takes_vllms_batch_limits_for_its_own_gpu() -> None:
    on_h100 = parse_scenario(scenario_dict(gpu="h100-sxm"))
    on_l40s = pool_scenario(on_h100, PoolSpec(replicas=1, gpu="l40s"))
    assert (on_l40s.engine.max_num_seqs, on_l40s.engine.max_num_batched_tokens) == (256, 2048)
    engine = {"max_model_len": 8192, "max_num_seqs": 100, "max_num_batched_tokens": 4096}
    pinned = parse_scenario(scenario_dict(gpu="h100-sxm", engine=engine))
    kept = pool_scenario(pinned, PoolSpec(replicas=1, gpu="l40s")).engine
    assert (kept.max_num_seqs, kept.max_num_batched_tokens) == (100, 4096)


def test_limits_left_out_stay_out_of_a_dump_and_refill_on_reading_it_back() -> None:
    on_h100 = parse_scenario(scenario_dict(gpu="h100-sxm"))
    dumped = on_h100.model_dump(mode="json")
    assert "max_num_seqs" not in dumped["engine"]
    assert parse_scenario(dumped) == on_h100  # scenario_to_yaml round-trips
    on_l40s = parse_scenario({**dumped, "gpu": "l40s"})  # as a plan's other candidate
    assert on_l40s.engine.max_num_seqs == 256
    # The CPU backend scales its defaults by every rank (TP × PP).
    cpu = {"name": "cpu-core", "memory_gb": 64, "memory_bandwidth_tb_s": 0.1, "bf16_tflops": 1}
    engine = {"max_model_len": 8192, "tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    ranks = parse_scenario(scenario_dict(gpu=cpu, engine=engine)).engine
    assert (ranks.max_num_seqs, ranks.max_num_batched_tokens) == (512, 8192)


def test_the_moe_overlap_exponent_reaches_the_roofline_and_below_one_is_refused() -> None:
    data = scenario_dict(latency={"type": "roofline", "moe_overlap_exponent": 2.0})
    assert parse_scenario(data).latency.params().moe_overlap_exponent == 2.0
    data = scenario_dict(latency={"type": "roofline", "moe_overlap_exponent": 0.5})
    assert problems(data) == ["latency.moe_overlap_exponent: must be >= 1, got 0.5"]
