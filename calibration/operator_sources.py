"""The public operator timing tables in ``shared/data``: which exist, and how they are read.

The tables (see shared/data's SOURCES.md) are read here, summed into step-time
:class:`~calibration.observations.Observation` s by :mod:`calibration.operator_steps` and fitted
into profiles by :mod:`calibration.operator_tables`. The tables :mod:`calibration.operators`
profiles on a GPU node have LLMServingSim's and the kernel benchmark's columns, so the same
readers serve them.

What the tables turned out to mean, and what each source therefore can and cannot say:

``llmservingsim`` — ``llmservingsim_profiles/H100/meta-llama/<model>/tp<N>/layers.csv``
    LLMServingSim v0's PyTorch-profiler sweep (``profiler/v0``, casys-kaist/LLMServingSim) of a
    Hugging Face transformers model in eager mode on an H100. Each row is the average device time
    (ns) of one named module per forward pass of *one* decoder layer: ``input`` is the number of
    tokens of a single sequence fed at once (``input_ids`` of shape ``(1, input)``) and
    ``kv_cache`` the length of a pre-filled KV cache. The shipped H100 files hold only the
    *prefill sweep* (``input`` 1..2048, ``kv_cache`` always 0); the decode sweep (input 1,
    growing cache) is absent. ``attn`` is ``F.scaled_dot_product_attention`` (causal, the whole
    sequence); ``lm_head`` runs over all ``input`` positions, as transformers computes logits for
    every position; ``embedding``, ``final_layernorm`` and ``lm_head`` run once per forward, the
    other twelve modules once per layer. There are no communication rows: the TP>1 files time
    one GPU's shard (q_proj, gate/up/down halve with TP) and leave the all-reduces out. A step
    here is ``embedding + num_layers × Σ per-layer modules + final_layernorm + lm_head(rows that
    sample)``, with ``lm_head`` read at the number of sampled rows (1 for a prefill, as vLLM
    computes logits only for the last token). This source gives prefill steps only, so its fit
    cannot identify the decode terms.

``llmservingsim+kernel_bench`` — the above plus ``inference_sim_kernel_bench/mha/decode/h100``
    The kernel benchmark times one layer's decode attention for ``batch_size`` sequences each
    with ``kv_len`` cached tokens, for a head layout ``<q heads>-<kv heads>-<head dim>-tp<N>``
    (heads per GPU = heads / N); ``latency_us`` per layer call (batch 128 × 1k context of
    Llama-3-8B's 32-8-128 reads 537 MB in 199 µs, ~80 % of H100 bandwidth, so it is one layer).
    A decode step of ``b`` sequences is the LLMServingSim non-attention modules at ``input = b``
    (the linear layers see a ``(b, hidden)`` activation either way), ``lm_head`` at ``b`` rows,
    plus ``num_layers ×`` the kernel table's decode attention at ``(b, kv_len)``. Points with
    ``b`` up to 2,048 (the layer table's range) and ``kv_len`` up to 32,768 are used.

``vidur`` — ``vidur/profiling/compute/{a100,h100}/meta-llama/<model>/mlp.csv``
    Vidur's per-operator profiles (vLLM/Sarathi kernels) of one layer vs ``num_tokens`` and
    ``num_tensor_parallel_workers``, times in ms (median used; duplicate token counts averaged):
    embedding, the two RMSNorms, QKV projection (``attn_pre_proj``), rotary, output projection
    (``attn_post_proj``), fused gate/up projection, activation, down projection and the residual
    ``add``. Attention, the LM head, the final norm and TP all-reduces are *not* in these files
    (Vidur keeps attention in attention.csv, which is not in shared/data, and communication in
    network/). A step is ``emb + num_layers × (norms + projections + rope + mlp + 2 × add)``.
    The observations' batches therefore carry no attention work (no pairs, no context), so the
    attention coefficients are reported as unidentified: the profile is the non-attention part
    of a step only.

``vidur+kernel_bench`` — Vidur H100 non-attention ops plus the kernel benchmark's attention
    Only where the attention shape matches exactly: Llama-2-7B (32-32-128) and Llama-2-70B
    (64-8-128) on H100 (Vidur has no H100 Llama-3 profile; pairing Llama-2-7B's MLP with
    Llama-3-8B's attention would describe a model that does not exist — use
    ``llmservingsim+kernel_bench`` for Llama-3.1-8B on H100). Prefill steps exist only at the
    sequence lengths both tables cover (1,024 and 4,096 tokens; the prefill attention table is
    for a single sequence at full heads, so for TP>1 it is divided by TP, assuming the heads
    split evenly). Decode steps: Vidur ops at ``b`` tokens (interpolated between measured token
    counts) plus ``num_layers ×`` decode attention at ``(b, kv_len)``. The LM head is missing.

All sources measured 16-bit weights (LLMServingSim v0 loads fp16, the kernel benchmark is bf16);
fp16 and bf16 run at the same tensor-core rate. None includes the CPU-side scheduler, sampler
or input preparation, so a fitted ``step_overhead_s`` is GPU-only and lower than a live server's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from sim.catalog.hardware import get_gpu
from sim.catalog.model_names import normalise_model_name
from sim.catalog.models import get_model

SOURCES: tuple[str, ...] = (
    "llmservingsim",
    "llmservingsim+kernel_bench",
    "vidur",
    "vidur+kernel_bench",
)

_LLMSERVINGSIM_DIR = Path("llmservingsim_profiles/H100/meta-llama")
_VIDUR_DIR = Path("vidur/profiling/compute")
_KERNEL_DIR = Path("inference_sim_kernel_bench/mha")
_NETWORK_DIR = Path("vidur/profiling/network")

#: Largest decode context taken from the kernel benchmark's decode table.
MAX_DECODE_KV_LEN = 32_768

#: The LLMServingSim modules that run once per decoder layer (its ``block_components``).
LAYER_MODULES = (
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "rope",
    "attn",
    "o_proj",
    "post_layernorm",
    "gate_proj",
    "up_proj",
    "act_fn",
    "down_proj",
)
#: Vidur's per-layer operators (each once per layer, ``add`` twice: two residual adds).
_VIDUR_LAYER_OPS = {
    "input_layernorm": 1,
    "attn_pre_proj": 1,
    "attn_rope": 1,
    "attn_post_proj": 1,
    "post_attention_layernorm": 1,
    "mlp_up_proj": 1,
    "mlp_act": 1,
    "mlp_down_proj": 1,
    "add": 2,
}
#: Layers and attention heads of the Vidur-profiled models (their Hugging Face config.json:
#: num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / heads).
VIDUR_MODELS: dict[str, tuple[int, str]] = {
    "Llama-2-7b-hf": (32, "32-32-128"),
    "Llama-2-70b-hf": (80, "64-8-128"),
    "Meta-Llama-3-8B": (32, "32-8-128"),
    "Meta-Llama-3-70B": (80, "64-8-128"),
}


#: Hidden sizes of the Vidur-profiled models (config.json ``hidden_size``): the all-reduced
#: activation is ``tokens × hidden`` elements.
VIDUR_HIDDEN = {
    "Llama-2-7b-hf": 4096,
    "Llama-2-70b-hf": 8192,
    "Meta-Llama-3-8B": 4096,
    "Meta-Llama-3-70B": 8192,
}

#: Models whose decoder layers are shaped exactly like another's (their config.json files agree
#: on layers, hidden size, heads, KV heads, intermediate size and vocabulary; Llama 3.1 changed
#: only the RoPE scaling and context length), so that one's operator tables serve the other.
_SAME_LAYER_SHAPES = {"llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b"}


def gpu_folder(hardware: str) -> str:
    """Vidur's folder for a catalogue GPU ('h100' or 'a100'); ValueError for any other GPU."""
    name = get_gpu(hardware).name.lower()
    for folder in ("h100", "a100"):
        if folder in name:
            return folder
    raise ValueError(f"hardware: operator tables exist for H100 and A100 only, not {hardware!r}")


def available(source: str, data_dir: Path, hardware: str = "h100") -> list[tuple[str, int]]:
    """The (model, tensor parallel size) combinations ``source`` has tables for."""
    data_dir = Path(data_dir)
    combos: list[tuple[str, int]] = []
    if source.startswith("llmservingsim"):
        for path in sorted((data_dir / _LLMSERVINGSIM_DIR).glob("*/tp*/layers.csv")):
            model, tp = path.parent.parent.name, int(path.parent.name.removeprefix("tp"))
            if source == "llmservingsim" or decode_table(data_dir, kernel_heads(model), tp):
                combos.append((model, tp))
    elif source.startswith("vidur"):
        folder = gpu_folder(hardware)
        for path in sorted((data_dir / _VIDUR_DIR / folder / "meta-llama").glob("*/mlp.csv")):
            model = path.parent.name
            if model not in VIDUR_MODELS:
                continue
            tps = pd.read_csv(path, usecols=["num_tensor_parallel_workers"]).iloc[:, 0].unique()
            for tp in sorted(int(t) for t in tps):
                if source == "vidur" or (
                    _kernel_shape_matches(model, folder)
                    and decode_table(data_dir, VIDUR_MODELS[model][1], tp) is not None
                ):
                    combos.append((model, tp))
    else:
        raise ValueError(f"source: must be one of {', '.join(SOURCES)}; got {source!r}")
    return combos


def kernel_heads(model: str) -> str:
    """The kernel benchmark's head layout ``<q heads>-<kv heads>-<head dim>`` of a catalogue
    model (the file name of its attention tables, before ``-tp<N>``)."""
    arch = get_model(model)
    return f"{arch.num_attention_heads}-{arch.num_key_value_heads}-{arch.head_dim}"


def _kernel_shape_matches(model: str, folder: str) -> bool:
    # On H100 only the Llama-2 profiles: Vidur has no H100 profile of the Llama-3 models. On
    # A100 every Vidur model pairs with the (H100) kernel table of its head layout, scaled.
    return folder == "a100" or model.startswith("Llama-2")


def resolve_table_model(source: str, model: str, tp: int, data_dir: Path, hardware: str) -> str:
    """The table's own model name for ``model``, or ValueError listing what exists."""
    combos = available(source, data_dir, hardware)
    for wanted in (
        normalise_model_name(model),
        _SAME_LAYER_SHAPES.get(normalise_model_name(model)),
    ):
        for name, combo_tp in combos:
            if normalise_model_name(name) == wanted and combo_tp == tp:
                return name
    listing = ", ".join(f"{name} tp{combo_tp}" for name, combo_tp in combos) or "none"
    raise ValueError(
        f"model/tensor_parallel_size: {source} has no table for {model!r} at TP={tp} on "
        f"{hardware}; available: {listing}"
    )


# -- where the tables are ----------------------------------------------------------------------
def llmservingsim_layers_csv(data_dir: Path, model: str, tp: int) -> Path:
    """LLMServingSim's per-module layer table of ``model`` (its folder name) at TP ``tp``."""
    return data_dir / _LLMSERVINGSIM_DIR / model / f"tp{tp}" / "layers.csv"


def vidur_mlp_csv(data_dir: Path, folder: str, model: str) -> Path:
    """Vidur's non-attention operator table of ``model`` (its folder name) on GPU ``folder``."""
    return data_dir / _VIDUR_DIR / folder / "meta-llama" / model / "mlp.csv"


def decode_table(data_dir: Path, heads: str, tp: int) -> Path | None:
    """The kernel benchmark's H100 decode attention table of a head layout at TP ``tp``, or
    None when there is none."""
    path = data_dir / _KERNEL_DIR / "decode" / "h100" / f"{heads}-tp{tp}.csv"
    return path if path.is_file() else None


def prefill_attention_csv(data_dir: Path, heads: str) -> Path:
    """The kernel benchmark's H100 prefill attention table of a head layout (all heads)."""
    return data_dir / _KERNEL_DIR / "prefill" / "h100" / f"{heads}.csv"


def all_reduce_csv(data_dir: Path, folder: str) -> Path:
    """Vidur's NCCL all-reduce table of a DGX node of GPU ``folder``."""
    return data_dir / _NETWORK_DIR / f"{folder}_dgx" / "all_reduce.csv"


# -- table readers -----------------------------------------------------------------------------
def read_layer_csv(path: Path) -> pd.DataFrame:
    """Seconds per module (columns) for each ``input`` token count (index); kv_cache = 0 only."""
    return layer_table(pd.read_csv(path))


def layer_table(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame of LLMServingSim's ``layers.csv`` columns as seconds per module (columns) for each
    ``input`` token count (index), rows with a pre-filled KV cache left out; repeated rows are
    averaged."""
    frame = frame[frame["kv_cache"] == 0]
    table = frame.pivot_table(
        index="input", columns="layer_name", values="latency(ns)", aggfunc="mean"
    )
    return table / 1e9


def read_vidur_steps(path: Path, tp: int) -> pd.Series:
    """Seconds of one step's non-attention operators, indexed by num_tokens."""
    frame = pd.read_csv(path)
    frame = frame[frame["num_tensor_parallel_workers"] == tp]
    per_tokens = frame.groupby("num_tokens").mean(numeric_only=True)
    layers = VIDUR_MODELS[path.parent.name][0]
    layer_ms = sum(
        count * per_tokens[f"time_stats.{op}.median"] for op, count in _VIDUR_LAYER_OPS.items()
    )
    step_ms = per_tokens["time_stats.emb.median"] + layers * layer_ms
    return step_ms / 1e3


def read_decode_attention(path: Path, max_batch: int) -> list[tuple[int, int, float]]:
    """Per-layer decode attention as (batch_size, kv_len, seconds), within the usable range."""
    return decode_rows(pd.read_csv(path), max_batch)


def decode_rows(frame: pd.DataFrame, max_batch: int) -> list[tuple[int, int, float]]:
    """The rows of a frame of the kernel benchmark's decode columns as (batch_size, kv_len,
    seconds), keeping batches up to ``max_batch`` and contexts up to :data:`MAX_DECODE_KV_LEN`."""
    frame = frame[(frame["batch_size"] <= max_batch) & (frame["kv_len"] <= MAX_DECODE_KV_LEN)]
    return [
        (int(batch), int(kv_len), float(latency_us) / 1e6)
        for batch, kv_len, latency_us in zip(
            frame["batch_size"].to_numpy(),
            frame["kv_len"].to_numpy(),
            frame["latency_us"].to_numpy(),
            strict=True,
        )
    ]


def read_prefill_attention(path: Path) -> list[tuple[int, float]]:
    """One layer's prefill attention of a single sequence as (seq_len, latency in µs) rows."""
    prefill = pd.read_csv(path)
    return [
        (int(seq_len), float(latency_us))
        for seq_len, latency_us in zip(
            prefill["seq_len"].to_numpy(), prefill["latency_us"].to_numpy(), strict=True
        )
    ]


def all_reduce_seconds(path: Path, tp: int) -> Callable[[int], float]:
    """Seconds of one NCCL all-reduce of ``size`` 16-bit elements among ``tp`` GPUs of a node.

    Vidur's table (``size`` in elements, as its profiler allocates fp16 tensors of that many
    elements; times in ms) is noisy at small sizes, where launch latency dominates: per size
    the median of the repeated medians is taken, then the lower non-decreasing envelope (each
    size's time is the least measured at that size or above: a larger message is never faster,
    and the slow small-size outliers are launch jitter that vLLM's custom all-reduce avoids),
    and sizes between measured ones are interpolated linearly. Raises ValueError when the table
    has no all-reduce among ``tp`` GPUs of one node.
    """
    frame = pd.read_csv(path)
    # All ``tp`` GPUs in one node (devices_per_node == num_workers), as TP is deployed.
    frame = frame[(frame["num_workers"] == tp) & (frame["devices_per_node"] == tp)]
    if frame.empty:
        raise ValueError(f"tensor_parallel_size: {path} has no all-reduce among {tp} GPUs")
    per_size = frame.groupby("size")["time_stats.all_reduce.median"].median().sort_index()
    sizes = per_size.index.to_numpy(dtype=np.float64)
    seconds = np.minimum.accumulate(per_size.to_numpy(dtype=np.float64)[::-1])[::-1] / 1e3

    def lookup(size: int) -> float:
        return float(np.interp(size, sizes, seconds))

    return lookup
