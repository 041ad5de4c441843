"""Reading a local Hugging Face ``config.json`` into a :class:`~sim.catalog.architecture.ModelArch`:
the dense Llama/Mistral/Qwen2 layouts, the mixtures of experts of Mixtral, Qwen2/Qwen3-MoE and
DeepSeek, and DeepSeek's multi-head latent attention. Every failure is a ``ValueError`` naming
the file and what to fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.catalog.architecture import ModelArch

_REQUIRED_CONFIG_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)

# transformers' documented default max_position_embeddings per config class (LlamaConfig 2048,
# MistralConfig 4096 * 32, Qwen2Config 32768); 2048 for anything else.
_DEFAULT_MAX_POSITION_EMBEDDINGS = {"llama": 2048, "mistral": 131072, "qwen2": 32768}

# Keys whose presence marks a mixture-of-experts model: Mixtral's, Qwen-MoE's, DeepSeek's.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _moe_fields(config: dict[str, Any], keys: _ConfigKeys, file: Path) -> dict[str, Any]:
    """ModelArch's expert fields from a mixture-of-experts config, in the layouts of Mixtral
    (``num_local_experts``, experts as wide as ``intermediate_size``), Qwen2/Qwen3-MoE
    (``num_experts``, ``moe_intermediate_size``, Qwen2's ``shared_expert_intermediate_size``)
    and DeepSeek-MoE (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``).
    Empty for a dense config; ValueError for a layout it would miscount."""
    key = next((k for k in _MOE_KEYS if config.get(k)), None)
    if key is None:
        return {}
    if keys.integer("decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
        raise ValueError(
            f"config.json at {file}: experts in only some layers (decoder_sparse_step, "
            "mlp_only_layers) are not modelled; only leading dense layers are"
        )
    if keys.integer("moe_layer_freq", 1) != 1:
        raise ValueError(f"config.json at {file}: moe_layer_freq other than 1 is not modelled")
    experts = keys.integer(key)
    if key == "num_local_experts":  # Mixtral: every expert is a full-width MLP
        width = keys.integer("intermediate_size")
    else:
        width = keys.integer("moe_intermediate_size")
    shared = 0
    if config.get("shared_expert_intermediate_size"):  # Qwen2-MoE
        shared = keys.integer("shared_expert_intermediate_size")
    if config.get("n_shared_experts"):  # DeepSeek: shared experts as wide as routed ones
        shared = keys.integer("n_shared_experts") * width
    dense = keys.integer("first_k_dense_replace") if config.get("first_k_dense_replace") else 0
    return {
        "num_experts": experts,
        "num_experts_per_token": keys.integer("num_experts_per_tok"),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": shared,
        "num_dense_layers": dense,
    }


def _latent_attention_fields(config: dict[str, Any], keys: _ConfigKeys) -> dict[str, Any]:
    """ModelArch's latent-attention fields from a DeepSeek-V2/V3 config (``kv_lora_rank``,
    ``qk_nope_head_dim`` as the head_dim, ``qk_rope_head_dim``, ``v_head_dim``,
    ``q_lora_rank`` or null); empty for standard attention."""
    if not config.get("kv_lora_rank"):
        return {}
    return {
        "kv_lora_rank": keys.integer("kv_lora_rank"),
        "q_lora_rank": keys.integer("q_lora_rank") if config.get("q_lora_rank") else 0,
        "qk_rope_head_dim": keys.integer("qk_rope_head_dim"),
        "v_head_dim": keys.integer("v_head_dim"),
        "head_dim": keys.integer("qk_nope_head_dim"),
    }


def load_hf_config(path: str | Path) -> ModelArch:
    """Read a local Hugging Face ``config.json`` (or a directory holding one) into a ModelArch.

    Required keys: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``intermediate_size``, ``vocab_size``. Defaults follow transformers: ``num_key_value_heads``
    = ``num_attention_heads``, ``head_dim`` = ``hidden_size / num_attention_heads``,
    ``tie_word_embeddings`` false, ``max_position_embeddings`` the config class's default (2048
    for Llama). ``attention_bias: true`` (Llama) biases q, k, v and o; ``model_type: qwen2``
    biases q, k and v. The name is ``_name_or_path`` if set, else the directory's name.

    Mixture-of-experts configs (Mixtral, Qwen2/Qwen3-MoE, DeepSeek-MoE without latent
    attention) fill the expert fields; ``model_type`` qwen3 and qwen3_moe add the per-head q/k
    norm. A missing file, invalid JSON, a missing or non-integer key, or a layout ModelArch would
    miscount (latent attention, experts in only some layers) raises ``ValueError`` naming the file
    and what to fix.
    """
    path = Path(path)
    try:
        file = path / "config.json" if path.is_dir() else path
    except OSError as error:  # a name longer than the file system takes, say
        raise ValueError(
            f"cannot read model config {path}: {error.strerror or error}; pass a config.json "
            "or the model directory that contains it"
        ) from None
    config = _read_config_json(file)
    keys = _ConfigKeys(config, file)
    integer, flag = keys.integer, keys.flag
    experts = _moe_fields(config, keys, file)
    latent = _latent_attention_fields(config, keys)

    model_type = config.get("model_type")
    hidden_size = integer("hidden_size")
    num_attention_heads = integer("num_attention_heads")
    if config.get("head_dim") is None and hidden_size % num_attention_heads != 0:
        raise ValueError(
            f"config.json at {file}: no 'head_dim' and hidden_size {hidden_size} is not a "
            f"multiple of num_attention_heads {num_attention_heads}; add 'head_dim'"
        )
    llama_attention_bias = flag("attention_bias")
    qwen2_bias = model_type in ("qwen2", "qwen2_moe")

    name_or_path = config.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip():
        name = name_or_path.strip()
    else:
        name = file.resolve().parent.name or str(file)

    return ModelArch(
        name=name,
        num_layers=integer("num_hidden_layers"),
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=integer("num_key_value_heads", num_attention_heads),
        head_dim=latent.pop("head_dim", None)
        or integer("head_dim", hidden_size // num_attention_heads),
        intermediate_size=integer("intermediate_size"),
        vocab_size=integer("vocab_size"),
        tie_word_embeddings=flag("tie_word_embeddings"),
        max_position_embeddings=integer(
            "max_position_embeddings",
            _DEFAULT_MAX_POSITION_EMBEDDINGS.get(str(model_type), 2048),
        ),
        attention_bias=llama_attention_bias or qwen2_bias,
        attention_output_bias=llama_attention_bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        **experts,
        **latent,
    )


def _read_config_json(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; ValueError naming the file and the fix otherwise."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(
            f"cannot read model config {file}: {error.strerror or error}; pass a config.json "
            "or the model directory that contains it"
        ) from error
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{file} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}; "
            "fix the file or re-download it from the model's repository"
        ) from error
    if not isinstance(config, dict):
        raise ValueError(
            f"{file}: expected a JSON object at top level, got {type(config).__name__}"
        )
    return config


class _ConfigKeys:
    """Typed reads of a config.json's keys, each failure naming the file and the key."""

    def __init__(self, config: dict[str, Any], file: Path) -> None:
        self.config = config
        self.file = file

    def integer(self, key: str, default: int | None = None) -> int:
        """A positive integer; ``default`` when absent (required when there is none)."""
        config, file = self.config, self.file
        value: Any = config.get(key)
        if value is None:
            if default is not None:
                return default
            hint = (
                "; this looks like a multimodal config, point at the text model's config instead"
                if "text_config" in config
                else ""
            )
            raise ValueError(
                f"config.json at {file}: missing {key!r}; a decoder config needs "
                f"{', '.join(_REQUIRED_CONFIG_KEYS)}{hint}"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"config.json at {file}: {key!r} must be a positive integer, got {value!r}"
            )
        return value

    def flag(self, key: str) -> bool:
        """A boolean; false when absent or null."""
        value: Any = self.config.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ValueError(
                f"config.json at {self.file}: {key!r} must be true or false, got {value!r}"
            )
        return value
