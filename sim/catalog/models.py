"""The model catalogue: the built-in architectures (sim.catalog.architecture.ModelArch), each
transcribed from the model's Hugging Face ``config.json`` and cited next to it, and how a name
(a Hugging Face id, an Instruct or quantized checkpoint) finds one.
:func:`sim.catalog.hf_config.load_hf_config` reads any other such config from disk.
"""

from __future__ import annotations

import difflib

from sim.catalog.architecture import ModelArch
from sim.catalog.model_names import normalise_model_name

MODEL_CATALOG: dict[str, ModelArch] = {
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama-3.1-8b": ModelArch(
        name="llama-3.1-8b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (multi-head
    # attention: 32 KV heads, so a token's KV is 4x Llama-3.1-8B's). The model of the real H100
    # runs in shared/data/real_gpu_runs.
    "llama-2-7b": ModelArch(
        name="llama-2-7b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json (multi-head
    # attention, like the 7B).
    "llama-2-13b": ModelArch(
        name="llama-2-13b",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=40,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json (grouped-query
    # attention: 8 KV heads; Llama-3-70B's layers with Llama-2's 32,000-token vocabulary).
    "llama-2-70b": ModelArch(
        name="llama-2-70b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # Code Llama (Meta, August 2023; arXiv 2308.12950): Llama 2's layers fine-tuned on code
    # with a 16,384-token context (rope_theta 1e6). Shapes from Meta's params.json as loaders
    # carry them (dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab_size) and
    # https://huggingface.co/codellama/CodeLlama-7b-hf/blob/main/config.json
    # (max_position_embeddings 16384, vocab_size 32016: 16 infilling tokens over Llama 2's
    # 32,000). The 7B and 13B base and Instruct models have the 32,016-token vocabulary (their
    # -Python variants 32,000: not these entries); every 34B has 32,000 and, unlike Llama-2-13B,
    # grouped-query attention (8 KV heads).
    "codellama-7b": ModelArch(
        name="codellama-7b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32016,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
    ),
    "codellama-13b": ModelArch(
        name="codellama-13b",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=40,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=32016,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
    ),
    "codellama-34b": ModelArch(
        name="codellama-34b",
        num_layers=48,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=22016,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
    ),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json: Llama-3.1-8B's
    # shapes with an 8,192-token context (no rope_scaling).
    "llama-3-8b": ModelArch(
        name="llama-3-8b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json: Llama-3.1-70B's
    # shapes with an 8,192-token context.
    "llama-3-70b": ModelArch(
        name="llama-3-70b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    "llama-3.1-70b": ModelArch(
        name="llama-3.1-70b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json (the bf16 weights;
    # the FP8 repo has the same architecture).
    "llama-3.1-405b": ModelArch(
        name="llama-3.1-405b",
        num_layers=126,
        hidden_size=16384,
        num_attention_heads=128,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=53248,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json: the LM head shares
    # the embedding's weights (tie_word_embeddings), and heads are 64 wide (2048 / 32).
    "llama-3.2-1b": ModelArch(
        name="llama-3.2-1b",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json (tied embeddings).
    "llama-3.2-3b": ModelArch(
        name="llama-3.2-3b",
        num_layers=28,
        hidden_size=3072,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json (3.3 was
    # released as Instruct only; same architecture as Llama-3.1-70B).
    "llama-3.3-70b": ModelArch(
        name="llama-3.3-70b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json — v0.3, not v0.1:
    # v0.3 has vocab 32768 and no sliding window, so full-context KV accounting is exact; v0.1
    # (vocab 32000) uses a 4096-token sliding window this model does not describe.
    "mistral-7b": ModelArch(
        name="mistral-7b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32768,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    # https://huggingface.co/mistralai/Mistral-Nemo-Instruct-2407/blob/main/config.json: head_dim
    # 128 although hidden_size / heads is 160; the 131,072-token Tekken vocabulary;
    # "sliding_window": null. max_position_embeddings 1024000 is the Instruct config's (the
    # Base-2407 config says 128000, which is why only the Instruct name resolves here).
    "mistral-nemo-12b": ModelArch(
        name="mistral-nemo-12b",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=131072,
        tie_word_embeddings=False,
        max_position_embeddings=1024000,
    ),
    # https://huggingface.co/mistralai/Mistral-Small-24B-Instruct-2501/blob/main/config.json
    # (Mistral Small 3): head_dim 128 (hidden_size / heads is 160), "sliding_window": null.
    "mistral-small-24b": ModelArch(
        name="mistral-small-24b",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=32768,
        vocab_size=131072,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json: tied embeddings (the
    # checkpoint stores no lm_head.weight), 64-wide heads (896 / 14), 32,768 positions.
    "qwen2.5-0.5b": ModelArch(
        name="qwen2.5-0.5b",
        num_layers=24,
        hidden_size=896,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json: tied embeddings; the base
    # config says 131072 positions, the -Instruct config 32768 (same weight shapes).
    "qwen2.5-1.5b": ModelArch(
        name="qwen2.5-1.5b",
        num_layers=28,
        hidden_size=1536,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json (q/k/v biases, tied
    # embeddings and the 151,936-token vocabulary of the smaller Qwen2.5 models; 32,768 positions).
    "qwen2.5-3b": ModelArch(
        name="qwen2.5-3b",
        num_layers=36,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json (model_type qwen2: q/k/v
    # biases). The base config says max_position_embeddings 131072; the -Instruct config says
    # 32768 (YaRN extends it), with identical weight shapes.
    "qwen2.5-7b": ModelArch(
        name="qwen2.5-7b",
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json
    "qwen2.5-14b": ModelArch(
        name="qwen2.5-14b",
        num_layers=48,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json
    "qwen2.5-32b": ModelArch(
        name="qwen2.5-32b",
        num_layers=64,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=27648,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json
    "qwen2.5-72b": ModelArch(
        name="qwen2.5-72b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json: tied embeddings, head_dim 128
    # (hidden_size / heads is 64). The published safetensors also store lm_head.weight, a copy of
    # the tied embedding, so the file holds 751,632,384 elements for these 596,049,920 parameters.
    "qwen3-0.6b": ModelArch(
        name="qwen3-0.6b",
        num_layers=28,
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json: tied embeddings (the safetensors
    # again store a copy as lm_head.weight: 2,031,739,904 elements for 1,720,574,976 parameters).
    "qwen3-1.7b": ModelArch(
        name="qwen3-1.7b",
        num_layers=28,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json (model_type qwen3): q/k RMSNorm
    # per head and no attention biases; head_dim 128 although hidden_size / heads is 80; tied
    # embeddings. max_position_embeddings 40960 (the model card's 32,768-token context plus
    # room for the output).
    "qwen3-4b": ModelArch(
        name="qwen3-4b",
        num_layers=36,
        hidden_size=2560,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (untied embeddings from 8B up).
    "qwen3-8b": ModelArch(
        name="qwen3-8b",
        num_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-14B/blob/main/config.json
    "qwen3-14b": ModelArch(
        name="qwen3-14b",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=17408,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (head_dim 128, not 5120 / 64).
    "qwen3-32b": ModelArch(
        name="qwen3-32b",
        num_layers=64,
        hidden_size=5120,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=25600,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        qk_norm=True,
    ),
    # https://huggingface.co/microsoft/phi-4/blob/main/config.json (model_type phi3): one fused
    # qkv_proj ((40 + 2 x 10) x 128 outputs) and one fused gate_up_proj (2 x 17,920), no biases
    # ("attention_bias": false), heads 128 wide (5120 / 40), untied 100,352-token vocabulary,
    # 16,384 positions, "sliding_window": null, no partial rotary factor.
    "phi-4": ModelArch(
        name="phi-4",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=10,
        head_dim=128,
        intermediate_size=17920,
        vocab_size=100352,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/blob/main/config.json:
    # Qwen2.5-1.5B's shapes but an untied LM head ("tie_word_embeddings": false), so not an alias
    # of qwen2.5-1.5b; 131,072 positions; "use_sliding_window": false (full attention). The
    # other R1 distills match catalogue entries field for field and resolve to them
    # (sim/catalog/model_names.py).
    "deepseek-r1-distill-qwen-1.5b": ModelArch(
        name="deepseek-r1-distill-qwen-1.5b",
        num_layers=28,
        hidden_size=1536,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json: 8 experts
    # ("num_local_experts") of Mistral-7B's MLP width, 2 per token; 46.7B parameters, 12.9B
    # active (tests/test_models.py). "sliding_window": null, so full-context KV is exact.
    "mixtral-8x7b": ModelArch(
        name="mixtral-8x7b",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        num_experts=8,
        num_experts_per_token=2,
        moe_intermediate_size=14336,
    ),
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (model_type qwen3_moe): 128
    # experts of width 768, 8 per token, in all 48 layers (decoder_sparse_step 1, no
    # mlp_only_layers); q/k RMSNorm per head; 30.5B parameters, 3.3B active.
    "qwen3-30b-a3b": ModelArch(
        name="qwen3-30b-a3b",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        qk_norm=True,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=768,
    ),
    # https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (model_type qwen3_moe): 128
    # experts of width 1536, 8 per token, in all 94 layers (decoder_sparse_step 1, no
    # mlp_only_layers); 64 query and 4 KV heads of 128; 40,960 positions; 235B parameters, 22B
    # active.
    "qwen3-235b-a22b": ModelArch(
        name="qwen3-235b-a22b",
        num_layers=94,
        hidden_size=4096,
        num_attention_heads=64,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        qk_norm=True,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=1536,
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json (model_type
    # deepseek_v2): multi-head latent attention (kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128, no q_lora_rank); 64 routed experts of width 1408, 6
    # per token, 2 shared, after one dense layer (first_k_dense_replace 1, intermediate 10944);
    # 15.7B parameters, 2.4B active (model card).
    "deepseek-v2-lite": ModelArch(
        name="deepseek-v2-lite",
        num_layers=27,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=128,
        intermediate_size=10944,
        vocab_size=102400,
        tie_word_embeddings=False,
        max_position_embeddings=163840,
        num_experts=64,
        num_experts_per_token=6,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=2 * 1408,
        num_dense_layers=1,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        v_head_dim=128,
    ),
    # The random-weight model `servesim live tiny-model` writes for CPU-only live runs
    # (live/tiny_model.py, TinyModelSpec defaults; tests/test_tiny_model.py keeps them equal).
    "servesim-tiny-llama": ModelArch(
        name="servesim-tiny-llama",
        num_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        vocab_size=1024,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
}
"""The built-in models, keyed by the names :func:`get_model` resolves to."""


def get_model(name: str) -> ModelArch:
    """The catalogue model called ``name``.

    Case-insensitive; Hugging Face ids work too (``'meta-llama/Llama-3.1-8B'``,
    ``'meta-llama/Meta-Llama-3.1-8B-Instruct'``, ``'meta-llama/Llama-2-70b-chat-hf'``,
    ``'Qwen/Qwen2.5-7B-Instruct'``, ``'Qwen/Qwen3-8B'``, ``'mistralai/Mistral-7B-Instruct-v0.3'``,
    ``'deepseek-ai/DeepSeek-R1-Distill-Qwen-7B'``); an Instruct or chat variant resolves to its base
    model's entry, a listed fine-tune whose config.json matches an entry's (the R1 distills in
    sim.catalog.model_names) to that entry, and so does a quantized checkpoint
    (``'Qwen/Qwen3-8B-FP8'``; sim.catalog.model_names.checkpoint_quantization
    says how it stores its weights). An unknown name raises ``ValueError`` with the closest
    catalogue names.
    """
    key = normalise_model_name(name)
    if key in MODEL_CATALOG:
        return MODEL_CATALOG[key]
    suggestions = difflib.get_close_matches(key, list(MODEL_CATALOG), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(s) for s in suggestions)}? " if suggestions else ""
    raise ValueError(
        f"unknown model {name!r}; {hint}known: {', '.join(MODEL_CATALOG)} "
        "(or load any Llama-style config.json with load_hf_config)"
    )


def model_names() -> list[str]:
    """The catalogue's model keys, in catalogue order."""
    return list(MODEL_CATALOG)
