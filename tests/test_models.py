"""Model architectures: parameter counts against published sizes, KV bytes, config loading."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sim.catalog.architecture import ModelArch
from sim.catalog.hf_config import load_hf_config
from sim.catalog.model_names import checkpoint_quantization
from sim.catalog.models import MODEL_CATALOG, get_model, model_names
from tests.factories import make_arch


def _hf_config(arch: ModelArch) -> dict[str, Any]:
    """The Hugging Face config.json a checkpoint with ``arch`` would ship."""
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch.attention_bias else "LlamaForCausalLM"],
        "model_type": "qwen2" if arch.attention_bias else "llama",
        "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": arch.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    if arch.uses_latent_attention:  # DeepSeek-V2's layout
        config |= {
            "model_type": "deepseek_v2",
            "n_routed_experts": arch.num_experts,
            "n_shared_experts": arch.shared_expert_intermediate_size // arch.moe_intermediate_size,
            "num_experts_per_tok": arch.num_experts_per_token,
            "moe_intermediate_size": arch.moe_intermediate_size,
            "first_k_dense_replace": arch.num_dense_layers,
            "kv_lora_rank": arch.kv_lora_rank,
            "q_lora_rank": arch.q_lora_rank or None,
            "qk_nope_head_dim": arch.head_dim,
            "qk_rope_head_dim": arch.qk_rope_head_dim,
            "v_head_dim": arch.v_head_dim,
        }
        del config["head_dim"]  # DeepSeek's configs name it qk_nope_head_dim
    elif arch.qk_norm and not arch.is_moe:  # dense Qwen3's layout
        config |= {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    elif arch.qk_norm:  # Qwen3-MoE's layout
        config |= {
            "model_type": "qwen3_moe",
            "num_experts": arch.num_experts,
            "num_experts_per_tok": arch.num_experts_per_token,
            "moe_intermediate_size": arch.moe_intermediate_size,
        }
    elif arch.is_moe:  # Mixtral's: full-width experts
        assert arch.moe_intermediate_size == arch.intermediate_size
        config |= {
            "model_type": "mixtral",
            "num_local_experts": arch.num_experts,
            "num_experts_per_tok": arch.num_experts_per_token,
        }
    return config


def _write(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / "config.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    return file


def test_catalogue_keys() -> None:
    assert model_names() == [
        "llama-3.1-8b",
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "codellama-7b",
        "codellama-13b",
        "codellama-34b",
        "llama-3-8b",
        "llama-3-70b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "llama-3.3-70b",
        "mistral-7b",
        "mistral-nemo-12b",
        "mistral-small-24b",
        "qwen2.5-0.5b",
        "qwen2.5-1.5b",
        "qwen2.5-3b",
        "qwen2.5-7b",
        "qwen2.5-14b",
        "qwen2.5-32b",
        "qwen2.5-72b",
        "qwen3-0.6b",
        "qwen3-1.7b",
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "phi-4",
        "deepseek-r1-distill-qwen-1.5b",
        "mixtral-8x7b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v2-lite",
        "servesim-tiny-llama",
    ]
    assert all(arch.name == key for key, arch in MODEL_CATALOG.items())


@pytest.mark.parametrize(
    ("key", "published", "tolerance"),
    [
        ("llama-3.1-8b", 8.03e9, 0.005),
        ("llama-3.1-70b", 70.55e9, 0.005),
        ("llama-3.1-405b", 405.85e9, 0.005),
        ("llama-3.3-70b", 70.55e9, 0.005),
        ("qwen2.5-7b", 7.62e9, 0.01),
        ("qwen2.5-32b", 32.8e9, 0.01),
        ("qwen2.5-72b", 72.7e9, 0.01),
        ("mistral-7b", 7.24e9, 0.01),
        # Llama 2's and Llama 3's model cards round to 13B, 70B, 8B and 70B; these are their
        # checkpoints' sizes (Llama-2-70B is 69.0B: Llama-3-70B's layers, a 32,000 vocabulary).
        ("llama-2-13b", 13.0e9, 0.005),
        ("llama-2-70b", 69.0e9, 0.005),
        ("llama-3-8b", 8.03e9, 0.005),
        ("llama-3-70b", 70.55e9, 0.005),
        # Llama 3.2's model card: "1B (1.23B)", "3B (3.21B)".
        ("llama-3.2-1b", 1.23e9, 0.01),
        ("llama-3.2-3b", 3.21e9, 0.01),
        # Qwen3's model cards, "Number of Parameters": 4.0B, 8.2B, 14.8B, 32.8B.
        ("qwen3-4b", 4.0e9, 0.01),
        ("qwen3-8b", 8.2e9, 0.01),
        ("qwen3-14b", 14.8e9, 0.01),
        ("qwen3-32b", 32.8e9, 0.01),
        # Qwen2.5's model cards: 14.7B and 3.09B.
        ("qwen2.5-14b", 14.7e9, 0.01),
        ("qwen2.5-3b", 3.09e9, 0.01),
    ],
)
def test_num_params_match_published_sizes(key: str, published: float, tolerance: float) -> None:
    assert get_model(key).num_params == pytest.approx(published, rel=tolerance)


def test_exact_parameter_counts() -> None:
    # Tensor-element totals of the published safetensors checkpoints.
    assert get_model("llama-3.1-8b").num_params == 8_030_261_248
    assert get_model("qwen2.5-7b").num_params == 7_615_616_512
    assert get_model("mistral-7b").num_params == 7_248_023_552
    assert get_model("meta-llama/Llama-2-7b-hf").num_params == 6_738_415_616


@pytest.mark.parametrize(
    ("key", "tensor_elements"),
    [
        # Tensor-element totals of the published checkpoints as loaders report them: keras-hub's
        # presets ("params" in keras_hub/src/models/{llama3,qwen,qwen3}/*_presets.py: Llama-3-8B,
        # Qwen2.5-3B, Qwen3-4B/8B/14B/32B) and, for the rest, llama.cpp's n_params or a
        # transformers numel() sum quoted in public repositories. Only a count whose every shape
        # field is right matches to the element (max_position_embeddings is not a weight).
        ("llama-2-13b", 13_015_864_320),
        ("llama-2-70b", 68_976_648_192),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3-70b", 70_553_706_496),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.2-3b", 3_212_749_824),
        ("qwen3-4b", 4_022_468_096),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-14b", 14_768_307_200),
        ("qwen3-32b", 32_762_123_264),
        ("qwen2.5-14b", 14_770_033_664),
        ("qwen2.5-3b", 3_085_938_688),
        # keras-hub: keras_hub/src/models/qwen/qwen_presets.py "qwen2.5_0.5b_en"; and
        # "qwen2.5_math_1.5b_en" for 1.5B (Qwen2.5-Math-1.5B has Qwen2.5-1.5B's weight shapes;
        # the Qwen2.5-1.5B-Instruct safetensors total quoted in public repositories is the same
        # 1,543,714,304 in 338 tensors, no lm_head.weight).
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-1.5b", 1_543_714_304),
        # keras-hub: keras_hub/src/models/qwen3/qwen3_presets.py "qwen3_0.6b_en", "qwen3_1.7b_en"
        # (also transformers' num_parameters() for Qwen/Qwen3-0.6B). Their safetensors hold more
        # elements: see test_qwen3_small_checkpoints_store_the_tied_head_twice.
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-1.7b", 1_720_574_976),
        # llama.cpp's n_params for Mistral-Nemo-Instruct-2407 (n_ctx_train 1024000), as quoted in
        # public tests of llama-server's /v1/models.
        ("mistral-nemo-12b", 12_247_782_400),
        # Mistral-Small-24B-Instruct-2501's model.safetensors.index.json (a copy is in
        # github.com/OpenMOSE/RWKV-LM-RLHF, main/tokenizer/mistralsmall3/): total_size
        # 47,144,806,400 bytes of bf16; keras-hub's Magistral/Devstral Small presets (the same
        # text model) give the same count.
        ("mistral-small-24b", 23_572_403_200),
        # llama.cpp's general.parameter_count of microsoft/phi-4, as Ollama's phi4 reports it
        # (github.com/padiazg/ollama-tools README.md).
        ("phi-4", 14_659_507_200),
        # llama.cpp's model_n_params and transformers numel() totals quoted in public
        # repositories (339 tensors: the untied lm_head.weight among them).
        ("deepseek-r1-distill-qwen-1.5b", 1_777_088_000),
        # keras-hub: keras_hub/src/models/qwen3_moe/qwen3_moe_presets.py "qwen3_moe_235b_a22b_en"
        # (the Hugging Face API's safetensors total for Qwen/Qwen3-235B-A22B is the same).
        ("qwen3-235b-a22b", 235_093_634_560),
        # Together's parameter counts (together-python, model_param_count: CodeLlama-7b and -13b,
        # base, Python and Instruct alike) and llama.cpp's n_params for CodeLlama-7B; Together's
        # catalogue gives Phind-CodeLlama-34B-v2, a full fine-tune of CodeLlama-34B, 33,743,970,304.
        ("codellama-7b", 6_738_546_688),
        ("codellama-13b", 13_016_028_160),
        ("codellama-34b", 33_743_970_304),
    ],
)
def test_exact_parameter_counts_of_added_models(key: str, tensor_elements: int) -> None:
    assert get_model(key).num_params == tensor_elements


def test_qwen3_small_checkpoints_store_the_tied_head_twice() -> None:
    # Qwen3-0.6B and -1.7B tie the LM head to the embedding (tie_word_embeddings: true), so the
    # model has no separate head, but their safetensors also store lm_head.weight: the Hugging
    # Face API's safetensors totals (751,632,384 and 2,031,739,904, also llama.cpp's n_params)
    # count the embedding twice. Memory holds it once, as vLLM loads a tied head.
    for key, safetensors_total in (("qwen3-0.6b", 751_632_384), ("qwen3-1.7b", 2_031_739_904)):
        arch = get_model(key)
        assert arch.tie_word_embeddings and arch.lm_head_params == 0
        assert arch.num_params + arch.embedding_params == safetensors_total
    # Qwen2.5's small checkpoints store no copy: their totals are the parameter counts.
    assert get_model("qwen2.5-0.5b").lm_head_params == get_model("qwen2.5-1.5b").lm_head_params == 0


def test_r1_distills_are_their_base_architectures_but_the_1_5b() -> None:
    # Each alias target matches the distill's config.json in every field the catalogue reads.
    assert get_model("deepseek-ai/DeepSeek-R1-Distill-Llama-8B") is get_model("llama-3.1-8b")
    assert get_model("deepseek-ai/DeepSeek-R1-Distill-Llama-70B") is get_model("llama-3.3-70b")
    for size in ("7b", "14b", "32b"):
        distill = get_model(f"deepseek-ai/DeepSeek-R1-Distill-Qwen-{size.upper()}")
        assert distill is get_model(f"qwen2.5-{size}")
        assert distill.max_position_embeddings == 131072 and distill.vocab_size == 152064
    # The 1.5B distill (tuned from Qwen2.5-Math-1.5B) is Qwen2.5-1.5B with an untied LM head.
    distill_1_5b = get_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    qwen_1_5b = get_model("Qwen/Qwen2.5-1.5B")
    assert distill_1_5b is not qwen_1_5b and not distill_1_5b.tie_word_embeddings
    assert (
        dataclasses.replace(distill_1_5b, name=qwen_1_5b.name, tie_word_embeddings=True)
        == qwen_1_5b
    )
    assert distill_1_5b.num_params - qwen_1_5b.num_params == 151936 * 1536


def test_head_dim_is_the_configs_not_hidden_over_heads() -> None:
    # Mistral-Nemo and Mistral-Small 3: 5120 / 32 = 160, but config.json says head_dim 128.
    for key in ("mistral-nemo-12b", "mistral-small-24b"):
        arch = get_model(key)
        assert arch.head_dim == 128 != arch.hidden_size // arch.num_attention_heads
        assert arch.kv_bytes_per_token("bf16") == 40 * 2 * 8 * 128 * 2


def test_phi_4_fused_projections_count_as_separate_ones() -> None:
    arch = get_model("microsoft/phi-4")
    # Phi3's qkv_proj: 5120 -> (40 + 2 x 10) x 128; o_proj 5120 -> 5120; no biases.
    assert arch.attention_params_per_layer == 5120 * (40 + 2 * 10) * 128 + 5120 * 5120
    # gate_up_proj: 5120 -> 2 x 17920; down_proj: 17920 -> 5120.
    assert arch.mlp_params_per_layer == 5120 * 2 * 17920 + 17920 * 5120


def test_llama_3_is_llama_3_1_with_an_8k_context() -> None:
    for size in ("8b", "70b"):
        llama_3, llama_3_1 = get_model(f"llama-3-{size}"), get_model(f"llama-3.1-{size}")
        assert llama_3.max_position_embeddings == 8192
        assert (
            dataclasses.replace(llama_3, name=llama_3_1.name, max_position_embeddings=131072)
            == llama_3_1
        )


def test_small_models_share_the_embedding_and_qwen3_norms_q_and_k() -> None:
    llama_1b = get_model("llama-3.2-1b")
    assert llama_1b.lm_head_params == 0
    # 64-wide heads: 2 (K and V) x 8 KV heads x 64 x 16 layers x 2 bytes.
    assert llama_1b.kv_bytes_per_token("bf16") == 2 * 8 * 64 * 16 * 2
    assert get_model("qwen3-4b").lm_head_params == 0 and get_model("qwen2.5-3b").lm_head_params == 0
    qwen3_8b = get_model("qwen3-8b")
    assert qwen3_8b.qk_norm and not qwen3_8b.attention_bias and qwen3_8b.lm_head_params > 0
    without_norm = dataclasses.replace(qwen3_8b, qk_norm=False)
    assert qwen3_8b.num_params - without_norm.num_params == 36 * 2 * 128


def test_llama_8b_parameter_breakdown() -> None:
    arch = get_model("llama-3.1-8b")
    assert arch.attention_params_per_layer == 4096 * 4096 * 2 + 4096 * 1024 * 2
    assert arch.mlp_params_per_layer == 3 * 4096 * 14336
    assert arch.linear_params_per_layer == 41_943_040 + 176_160_768
    assert arch.embedding_params == arch.lm_head_params == 128256 * 4096


def test_qwen_attention_counts_qkv_biases() -> None:
    arch = get_model("qwen2.5-7b")
    weights = 3584 * 3584 * 2 + 3584 * 512 * 2
    assert arch.attention_params_per_layer == weights + 3584 + 2 * 512
    without_bias = dataclasses.replace(arch, attention_bias=False)
    assert arch.num_params - without_bias.num_params == 28 * (3584 + 2 * 512)


def test_output_bias_adds_hidden_size_per_layer() -> None:
    plain = make_arch(attention_bias=True)
    assert make_arch(attention_bias=True, attention_output_bias=True).num_params == (
        plain.num_params + 2 * 64
    )


def test_tied_embeddings_have_no_lm_head() -> None:
    untied, tied = make_arch(), make_arch(tie_word_embeddings=True)
    assert tied.lm_head_params == 0
    assert untied.num_params - tied.num_params == 1000 * 64


def test_kv_bytes_per_token() -> None:
    arch = get_model("llama-3.1-8b")
    assert arch.kv_bytes_per_token("bf16") == 131072
    assert arch.kv_bytes_per_token("fp8") == 65536
    assert get_model("llama-3.1-70b").kv_bytes_per_token("bf16") == 2 * 80 * 8 * 128 * 2


def test_weight_bytes() -> None:
    arch = get_model("llama-3.1-8b")
    assert arch.weight_bytes("bf16") == 2 * 8_030_261_248
    assert arch.weight_bytes("int4") == 8_030_261_248 / 2
    with pytest.raises(ValueError, match="unknown dtype"):
        arch.weight_bytes("q4_k_m")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3.1-405B", "llama-3.1-405b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("mistralai/Mistral-7B-v0.3", "mistral-7b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
        ("QWEN2.5_32B", "qwen2.5-32b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
        ("meta-llama/Llama-2-13b-hf", "llama-2-13b"),
        ("meta-llama/Llama-2-13b-chat-hf", "llama-2-13b"),
        ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
        ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
        ("codellama/CodeLlama-7b-hf", "codellama-7b"),
        ("codellama/CodeLlama-13b-Instruct-hf", "codellama-13b"),
        ("codellama/CodeLlama-34b-hf", "codellama-34b"),
        ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
        ("codellama/CodeLlama-34b-Python-hf", "codellama-34b"),
        ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b"),
        ("Qwen/Qwen3-4B", "qwen3-4b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Qwen/Qwen3-14B", "qwen3-14b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("Qwen/Qwen2.5-14B-Instruct", "qwen2.5-14b"),
        ("Qwen/Qwen2.5-3B", "qwen2.5-3b"),
        ("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b"),
        ("Qwen/Qwen2.5-1.5B", "qwen2.5-1.5b"),
        ("Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5-1.5b"),
        ("Qwen/Qwen3-0.6B", "qwen3-0.6b"),
        ("Qwen/Qwen3-1.7B", "qwen3-1.7b"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo-12b"),
        ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b"),
        ("microsoft/phi-4", "phi-4"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-r1-distill-qwen-1.5b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-7b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2.5-14b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama-3.3-70b"),
    ],
)
def test_get_model_aliases(name: str, key: str) -> None:
    assert get_model(name) is MODEL_CATALOG[key]


WEIGHT_ONLY = "weight_only"


@pytest.mark.parametrize(
    ("name", "key", "dtype", "quantization"),
    [
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", "fp8", "auto"),
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", "llama-3.1-8b", "fp8", "auto"),
        ("Qwen/Qwen3-32B-FP8", "qwen3-32b", "fp8", "auto"),
        (
            "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
            "llama-3.1-70b",
            "int4",
            WEIGHT_ONLY,
        ),
        ("Qwen/Qwen2.5-72B-Instruct-AWQ", "qwen2.5-72b", "int4", WEIGHT_ONLY),
        ("TheBloke/Llama-2-7B-Chat-GPTQ", "llama-2-7b", "int4", WEIGHT_ONLY),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "qwen2.5-7b", "int8", WEIGHT_ONLY),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "llama-3.1-8b", "int8", "w8a8"),
        (
            "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a16",
            "llama-3.1-8b",
            "int8",
            WEIGHT_ONLY,
        ),
        (
            "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16",
            "llama-3.1-8b",
            "int4",
            WEIGHT_ONLY,
        ),
        ("unsloth/Llama-3.2-1B-Instruct-bnb-4bit", "llama-3.2-1b", "int4", "bitsandbytes"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", None, None),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b", None, None),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b", None, None),
    ],
)
def test_a_quantized_checkpoint_is_its_base_model_stored_as_its_name_says(
    name: str, key: str, dtype: str | None, quantization: str | None
) -> None:
    assert get_model(name).name == key
    found = checkpoint_quantization(name)
    stored = (found.dtype, found.quantization) if found is not None else (None, None)
    assert stored == (dtype, quantization)


def test_get_model_unknown_suggests_closest() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'llama-3.1-80b'; did you mean 'llama-3.1"):
        get_model("llama-3.1-80b")
    with pytest.raises(ValueError, match=r"unknown model 'gpt-2'; known: llama-3\.1-8b"):
        get_model("gpt-2")
    # v0.1 has a different vocabulary and a sliding window: it must not resolve to v0.3.
    with pytest.raises(ValueError, match="unknown model"):
        get_model("mistralai/Mistral-7B-v0.1")
    # The 7B and 13B Python models keep Llama 2's 32,000 tokens, not Code Llama's 32,016.
    with pytest.raises(ValueError, match="unknown model"):
        get_model("codellama/CodeLlama-7b-Python-hf")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_layers", 0),
        ("hidden_size", -1),
        ("head_dim", 1.5),
        ("vocab_size", True),
        ("max_position_embeddings", None),
    ],
)
def test_invalid_arch_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"ModelArch 'tiny': {field} must be a positive integer"):
        make_arch(**{field: value})


def test_heads_must_be_multiple_of_kv_heads() -> None:
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be a multiple"):
        make_arch(num_key_value_heads=3)


def test_flags_must_be_bool() -> None:
    with pytest.raises(ValueError, match="tie_word_embeddings must be true or false"):
        make_arch(tie_word_embeddings="false")


@pytest.mark.parametrize("key", list(MODEL_CATALOG))
def test_load_hf_config_round_trips_catalogue(tmp_path: Path, key: str) -> None:
    arch = MODEL_CATALOG[key]
    _write(tmp_path / "model", _hf_config(arch))
    loaded = load_hf_config(tmp_path / "model")
    assert loaded.name == "model"
    assert dataclasses.replace(loaded, name=arch.name) == arch


def test_load_hf_config_llama_8b_file_path_and_name(tmp_path: Path) -> None:
    arch = get_model("llama-3.1-8b")
    config = _hf_config(arch) | {"_name_or_path": "meta-llama/Llama-3.1-8B"}
    file = _write(tmp_path / "whatever", config)
    loaded = load_hf_config(str(file))
    assert loaded.name == "meta-llama/Llama-3.1-8B"
    assert dataclasses.replace(loaded, name=arch.name) == arch


def test_load_hf_config_defaults(tmp_path: Path) -> None:
    # Original Llama-3.1 configs have no head_dim; old configs omit num_key_value_heads.
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    loaded = load_hf_config(_write(tmp_path / "tiny", config))
    assert loaded == make_arch(
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=2048,
    )
    qwen = load_hf_config(_write(tmp_path / "qwen", config | {"model_type": "qwen2"}))
    assert (qwen.attention_bias, qwen.attention_output_bias) == (True, False)
    assert qwen.max_position_embeddings == 32768


def test_load_hf_config_llama_attention_bias_covers_output(tmp_path: Path) -> None:
    config = _hf_config(make_arch()) | {"attention_bias": True}
    loaded = load_hf_config(_write(tmp_path / "biased", config))
    assert (loaded.attention_bias, loaded.attention_output_bias) == (True, True)


def test_load_hf_config_missing_key(tmp_path: Path) -> None:
    config = _hf_config(get_model("llama-3.1-8b"))
    del config["hidden_size"]
    file = _write(tmp_path / "broken", config)
    with pytest.raises(ValueError, match=r"config.json at .*broken.*missing 'hidden_size'"):
        load_hf_config(file)


def test_load_hf_config_malformed_json(tmp_path: Path) -> None:
    file = tmp_path / "bad" / "config.json"
    file.parent.mkdir()
    file.write_text('{"hidden_size": 4096,\n "vocab_size": }', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.config\.json is not valid JSON: .* line 2 column"):
        load_hf_config(file.parent)


def test_load_hf_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read model config .*nowhere"):
        load_hf_config(tmp_path / "nowhere" / "config.json")
    # Longer than a file name may be (found by benchmarks/fuzz.py: an OSError traceback).
    with pytest.raises(ValueError, match=r"cannot read model config .*xxx"):
        load_hf_config(tmp_path / ("x" * 300))


def test_load_hf_config_rejects_non_integer_and_unmodelled_moe(tmp_path: Path) -> None:
    base = _hf_config(make_arch())
    with pytest.raises(ValueError, match="'vocab_size' must be a positive integer, got '1000'"):
        load_hf_config(_write(tmp_path / "str", base | {"vocab_size": "1000"}))
    latent = base | {"kv_lora_rank": 512, "qk_nope_head_dim": 16}
    with pytest.raises(ValueError, match="missing 'qk_rope_head_dim'"):
        load_hf_config(_write(tmp_path / "mla", latent))
    sparse = base | {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    with pytest.raises(ValueError, match="experts in only some layers"):
        load_hf_config(_write(tmp_path / "sparse", sparse | {"decoder_sparse_step": 2}))
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_hf_config(_write(tmp_path / "list", [1, 2]))  # type: ignore[arg-type]


# -- mixtures of experts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        # Mistral AI's model card: 46.7B parameters, 12.9B used per token; the exact total is
        # the checkpoint's tensor count.
        ("mixtral-8x7b", 46_702_792_704, 12.9e9),
        # Qwen3's model card: 30.5B in total, 3.3B activated.
        ("qwen3-30b-a3b", 30.5e9, 3.3e9),
        # Qwen3's model card (and keras-hub's preset description): 235B in total, 22B activated.
        ("qwen3-235b-a22b", 235e9, 22e9),
        # DeepSeek-V2's paper: 15.7B in total, 2.4B activated, which leaves out the embedding
        # table (a lookup, not a multiply; 102,400 × 2,048 = 0.21B).
        ("deepseek-v2-lite", 15.7e9, 2.4e9 + 102_400 * 2_048),
    ],
)
def test_moe_parameter_counts_match_the_model_cards(name: str, total: float, active: float) -> None:
    arch = get_model(name)
    assert arch.is_moe
    assert arch.num_params == pytest.approx(total, rel=0.005)
    assert arch.num_active_params == pytest.approx(active, rel=0.02)


def test_a_dense_model_is_its_own_active_part() -> None:
    arch = get_model("llama-3.1-8b")
    assert not arch.is_moe and arch.num_moe_layers == 0
    assert arch.num_active_params == arch.num_params
    assert arch.active_linear_params == arch.total_linear_params == arch.dense_linear_params
    assert arch.dense_linear_params == arch.num_layers * arch.linear_params_per_layer
    assert arch.expected_distinct_experts(100) == 0.0


def test_distinct_experts_grow_from_k_to_all() -> None:
    arch = get_model("qwen3-30b-a3b")
    counts = [arch.expected_distinct_experts(t) for t in (1, 2, 8, 64, 1024)]
    assert counts[0] == pytest.approx(8.0)
    assert counts == sorted(counts) and counts[-1] == pytest.approx(128.0)
    # Two tokens: 8 each, overlapping by 8 * 8/128 = 0.5 on average.
    assert counts[1] == pytest.approx(16 - 0.5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_experts": 4, "num_experts_per_token": 5, "moe_intermediate_size": 8}, "1..num_"),
        ({"num_experts": 4, "num_experts_per_token": 2}, "moe_intermediate_size"),
        ({"num_experts_per_token": 2}, "expert fields without num_experts"),
        ({"num_experts": -1}, "num_experts must be an integer >= 0"),
        (
            {
                "num_experts": 4,
                "num_experts_per_token": 2,
                "moe_intermediate_size": 8,
                "num_dense_layers": 2,
            },
            "num_dense_layers",
        ),
    ],
)
def test_bad_expert_fields_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_arch(**fields)


def test_moe_configs_load_in_each_layout(tmp_path: Path) -> None:
    base = _hf_config(make_arch())
    mixtral = load_hf_config(
        _write(
            tmp_path / "mixtral",
            base | {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2},
        )
    )
    assert (mixtral.num_experts, mixtral.num_experts_per_token) == (8, 2)
    assert mixtral.moe_intermediate_size == mixtral.intermediate_size
    qwen3 = load_hf_config(
        _write(
            tmp_path / "qwen3",
            base
            | {
                "model_type": "qwen3_moe",
                "num_experts": 16,
                "num_experts_per_tok": 4,
                "moe_intermediate_size": 32,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
        )
    )
    assert qwen3.qk_norm and qwen3.moe_intermediate_size == 32 and qwen3.num_dense_layers == 0
    deepseek = load_hf_config(
        _write(
            tmp_path / "deepseek",
            base
            | {
                "model_type": "deepseek",
                "n_routed_experts": 16,
                "n_shared_experts": 2,
                "num_experts_per_tok": 4,
                "moe_intermediate_size": 32,
                "first_k_dense_replace": 1,
            },
        )
    )
    assert deepseek.shared_expert_intermediate_size == 64 and deepseek.num_dense_layers == 1
    assert deepseek.num_moe_layers == deepseek.num_layers - 1


def test_latent_attention_caches_one_vector_per_token_that_tp_does_not_split() -> None:
    arch = get_model("deepseek-v2-lite")
    assert arch.uses_latent_attention
    # 576 elements (512 latent + 64 rotary) per layer instead of 2 × 16 heads × 128.
    assert arch.kv_bytes_per_token("bf16") == 27 * 576 * 2
    assert arch.kv_shards(4) == 1
    assert get_model("llama-3.1-8b").kv_shards(4) == 4
    assert get_model("llama-3.1-8b").kv_shards(16) == 8  # replicated beyond its 8 KV heads


def test_latent_attention_fields_come_together() -> None:
    with pytest.raises(ValueError, match="needs qk_rope_head_dim and v_head_dim"):
        make_arch(kv_lora_rank=32)
    with pytest.raises(ValueError, match="set kv_lora_rank too"):
        make_arch(v_head_dim=16)
