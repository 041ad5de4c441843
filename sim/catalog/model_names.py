"""Model names: how a Hugging Face id (``meta-llama/Meta-Llama-3.1-8B-Instruct``,
``Qwen/Qwen3-8B-FP8``) resolves to a catalogue key, and what a quantized checkpoint's name says
about its weights. :func:`sim.catalog.models.get_model` looks the key up.
"""

from __future__ import annotations

from dataclasses import dataclass

# Normalised Hugging Face repo names that the generic rules in normalise_model_name miss.
_MODEL_ALIASES: dict[str, str] = {
    "mistral-7b-v0.3": "mistral-7b",
    "mistral-7b-instruct-v0.3": "mistral-7b",
    "llama-2-7b-hf": "llama-2-7b",
    "llama-2-7b-chat-hf": "llama-2-7b",
    "llama-2-13b-hf": "llama-2-13b",
    "llama-2-13b-chat-hf": "llama-2-13b",
    "llama-2-70b-hf": "llama-2-70b",
    "llama-2-70b-chat-hf": "llama-2-70b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "mistral-nemo-instruct-2407": "mistral-nemo-12b",
    # Every Code Llama 34B has the 32,000-token vocabulary, the Python one too (the 7B and 13B
    # Python models differ from their base entries in it, so they have no alias).
    "codellama-34b-python": "codellama-34b",
    "mistral-small-24b-instruct-2501": "mistral-small-24b",
    # DeepSeek-R1 distills whose config.json equals the entry's in every field the catalogue
    # reads (layers, widths, heads, vocabulary, tied or not, max_position_embeddings 131072):
    # fine-tunes of Llama-3.1-8B, Llama-3.3-70B-Instruct and Qwen2.5-7B/14B/32B shapes. Any
    # difference is in fields it ignores (Distill-Qwen-7B's rope_theta 10000, and its
    # "sliding_window": 4096 unused with "use_sliding_window": false). DeepSeek-R1-Distill-Qwen-1.5B
    # unties Qwen2.5-1.5B's LM head, so it has its own entry.
    "deepseek-r1-distill-llama-8b": "llama-3.1-8b",
    "deepseek-r1-distill-llama-70b": "llama-3.3-70b",
    "deepseek-r1-distill-qwen-7b": "qwen2.5-7b",
    "deepseek-r1-distill-qwen-14b": "qwen2.5-14b",
    "deepseek-r1-distill-qwen-32b": "qwen2.5-32b",
}


@dataclass(frozen=True)
class CheckpointQuantization:
    """How a quantized checkpoint stores and computes its weights: the scenario's ``dtype`` and
    ``quantization`` method (sim/engine/quantization.py) its name implies."""

    dtype: str
    quantization: str


_FP8 = CheckpointQuantization("fp8", "auto")  # W8A8 where the GPU has fp8 tensor cores
_INT4_WEIGHT_ONLY = CheckpointQuantization("int4", "weight_only")
_INT8_WEIGHT_ONLY = CheckpointQuantization("int8", "weight_only")

#: Name suffixes of quantized checkpoints (the architecture of the model they quantize, fewer
#: bytes per weight) and how each stores and computes its weights, as the common publishers
#: name them: "-FP8" and "-FP8-dynamic" (Neural Magic / Red Hat, Qwen); Red Hat's integer
#: "-quantized.w4a16" / "w8a16" (weight-only) and "w8a8" (int8 activations too); "-AWQ",
#: "-AWQ-INT4" (AutoAWQ, hugging-quants) and "-GPTQ-Int4" / "-Int8" (Qwen; a bare "-GPTQ" is
#: 4-bit), all weight-only; "-bnb-4bit" (bitsandbytes NF4). The longest match wins.
_SUFFIX_TO_QUANTIZATION: dict[str, CheckpointQuantization] = {
    "-fp8": _FP8,
    "-fp8-dynamic": _FP8,
    "-awq": _INT4_WEIGHT_ONLY,
    "-awq-int4": _INT4_WEIGHT_ONLY,
    "-gptq": _INT4_WEIGHT_ONLY,
    "-gptq-int4": _INT4_WEIGHT_ONLY,
    "-gptq-int8": _INT8_WEIGHT_ONLY,
    "-quantized.w4a16": _INT4_WEIGHT_ONLY,
    "-quantized.w8a16": _INT8_WEIGHT_ONLY,
    "-quantized.w8a8": CheckpointQuantization("int8", "w8a8"),
    "-w4a16": _INT4_WEIGHT_ONLY,
    "-w8a16": _INT8_WEIGHT_ONLY,
    "-w8a8": CheckpointQuantization("int8", "w8a8"),
    "-int4": _INT4_WEIGHT_ONLY,
    "-int8": _INT8_WEIGHT_ONLY,
    "-bnb-4bit": CheckpointQuantization("int4", "bitsandbytes"),
}


def _repo_key(name: str) -> str:
    """Lower-case repo name without the org or the ``Meta-`` prefix."""
    return name.strip().lower().rsplit("/", 1)[-1].replace("_", "-").removeprefix("meta-")


def _split_quantization(key: str) -> tuple[str, CheckpointQuantization | None]:
    """``key`` without a quantized checkpoint's suffix, and what that suffix says."""
    matches = [suffix for suffix in _SUFFIX_TO_QUANTIZATION if key.endswith(suffix)]
    if not matches:
        return key, None
    suffix = max(matches, key=len)
    return key[: -len(suffix)], _SUFFIX_TO_QUANTIZATION[suffix]


def checkpoint_quantization(name: str) -> CheckpointQuantization | None:
    """How a quantized checkpoint's name says it stores and computes its weights
    (``'Qwen/Qwen3-8B-FP8'`` → fp8, ``'Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8'`` → int8
    weight-only); None for any other name."""
    key = _repo_key(name)
    if key in _MODEL_ALIASES:
        return None
    return _split_quantization(key)[1]


def normalise_model_name(name: str) -> str:
    """The catalogue key ``name`` resolves to: its repo name without the org, the ``Meta-``
    prefix, a quantized checkpoint's suffix, an ``-hf`` suffix or an ``-Instruct`` / ``-Chat``
    suffix."""
    key = _repo_key(name)
    if key not in _MODEL_ALIASES:
        key = _split_quantization(key)[0]
    if key not in _MODEL_ALIASES:
        # Instruct and chat variants share the base model's architecture (Qwen2.5's differ
        # only in max_position_embeddings), so they resolve to the base entry.
        # Meta's checkpoints converted to Hugging Face's format end in "-hf"
        # (codellama/CodeLlama-34b-Instruct-hf); the suffix names a file format, not a model.
        key = key.removesuffix("-hf").removesuffix("-instruct").removesuffix("-chat")
    return _MODEL_ALIASES.get(key, key)
