"""Calibration from operator timing tables: step times without a serving engine.

The public tables below, and the ones :mod:`calibration.operators` profiles on a GPU node
(:func:`profiled_profile`), read with the same code.

The tables in ``shared/data`` (see its SOURCES.md) are summed into step-time
:class:`~calibration.observations.Observation` s and fitted with :func:`calibration.fit.fit_steps`.
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

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fit import fit_steps
from calibration.observations import Observation
from calibration.operators import OperatorTables
from calibration.profile import now_iso
from sim.catalog.hardware import get_gpu
from sim.catalog.models import get_model
from sim.engine.latency import (
    BatchShape,
    CalibratedModel,
    IterationTimeModel,
    RooflineModel,
    prefill_chunk_pairs,
)
from sim.engine.profile import SCHEMA_VERSION, EngineInfo, Profile

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

#: Prefill lengths taken from the LLMServingSim sweep: 16..2048 tokens on a 1-2-3 geometric
#: grid, so every octave weighs the same in the fit (tiny "prefills" are decode-like and rare).
PREFILL_LENGTHS: tuple[int, ...] = tuple(
    sorted({n for k in range(4, 12) for n in (2**k, 3 * 2 ** (k - 1))} | {2048})
)
#: Largest decode context taken from the kernel benchmark's decode table.
MAX_DECODE_KV_LEN = 32_768

#: The LLMServingSim modules that run once per decoder layer (its ``block_components``).
_LAYER_MODULES = (
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
_VIDUR_MODELS: dict[str, tuple[int, str]] = {
    "Llama-2-7b-hf": (32, "32-32-128"),
    "Llama-2-70b-hf": (80, "64-8-128"),
    "Meta-Llama-3-8B": (32, "32-8-128"),
    "Meta-Llama-3-70B": (80, "64-8-128"),
}


#: Hidden sizes of the Vidur-profiled models (config.json ``hidden_size``): the all-reduced
#: activation is ``tokens × hidden`` elements.
_VIDUR_HIDDEN = {
    "Llama-2-7b-hf": 4096,
    "Llama-2-70b-hf": 8192,
    "Meta-Llama-3-8B": 4096,
    "Meta-Llama-3-70B": 8192,
}


def _key(name: str) -> str:
    """A model name compared loosely: no org, no ``Meta-`` prefix, lower case."""
    name = name.strip().split("/")[-1].lower()
    return name.removeprefix("meta-")


def _gpu_folder(hardware: str) -> str:
    """Vidur's folder for a catalogue GPU ('h100' or 'a100')."""
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
            if source == "llmservingsim" or _decode_table(data_dir, _llama31_heads(model), tp):
                combos.append((model, tp))
    elif source.startswith("vidur"):
        folder = _gpu_folder(hardware)
        for path in sorted((data_dir / _VIDUR_DIR / folder / "meta-llama").glob("*/mlp.csv")):
            model = path.parent.name
            if model not in _VIDUR_MODELS:
                continue
            tps = pd.read_csv(path, usecols=["num_tensor_parallel_workers"]).iloc[:, 0].unique()
            for tp in sorted(int(t) for t in tps):
                if source == "vidur" or (
                    _kernel_shape_matches(model, folder)
                    and _decode_table(data_dir, _VIDUR_MODELS[model][1], tp) is not None
                ):
                    combos.append((model, tp))
    else:
        raise ValueError(f"source: must be one of {', '.join(SOURCES)}; got {source!r}")
    return combos


def _llama31_heads(model: str) -> str:
    arch = get_model(model)
    return f"{arch.num_attention_heads}-{arch.num_key_value_heads}-{arch.head_dim}"


def _kernel_shape_matches(model: str, folder: str) -> bool:
    # On H100 only the Llama-2 profiles: Vidur has no H100 profile of the Llama-3 models. On
    # A100 every Vidur model pairs with the (H100) kernel table of its head layout, scaled.
    return folder == "a100" or model.startswith("Llama-2")


#: Models whose decoder layers are shaped exactly like another's (their config.json files agree
#: on layers, hidden size, heads, KV heads, intermediate size and vocabulary; Llama 3.1 changed
#: only the RoPE scaling and context length), so that one's operator tables serve the other.
_SAME_LAYER_SHAPES = {"llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b"}


def _decode_table(data_dir: Path, heads: str, tp: int) -> Path | None:
    path = data_dir / _KERNEL_DIR / "decode" / "h100" / f"{heads}-tp{tp}.csv"
    return path if path.is_file() else None


def _resolve(source: str, model: str, tp: int, data_dir: Path, hardware: str) -> str:
    """The table's own model name for ``model``, or ValueError listing what exists."""
    combos = available(source, data_dir, hardware)
    for wanted in (_key(model), _SAME_LAYER_SHAPES.get(_key(model))):
        for name, combo_tp in combos:
            if _key(name) == wanted and combo_tp == tp:
                return name
    listing = ", ".join(f"{name} tp{combo_tp}" for name, combo_tp in combos) or "none"
    raise ValueError(
        f"model/tensor_parallel_size: {source} has no table for {model!r} at TP={tp} on "
        f"{hardware}; available: {listing}"
    )


# -- table readers -----------------------------------------------------------------------------
def _llmservingsim_table(path: Path) -> pd.DataFrame:
    """Seconds per module (columns) for each ``input`` token count (index); kv_cache = 0 only."""
    return _layer_table(pd.read_csv(path))


def _layer_table(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[frame["kv_cache"] == 0]
    table = frame.pivot_table(
        index="input", columns="layer_name", values="latency(ns)", aggfunc="mean"
    )
    return table / 1e9


def _vidur_table(path: Path, tp: int) -> pd.Series:
    """Seconds of one step's non-attention operators, indexed by num_tokens."""
    frame = pd.read_csv(path)
    frame = frame[frame["num_tensor_parallel_workers"] == tp]
    per_tokens = frame.groupby("num_tokens").mean(numeric_only=True)
    layers = _VIDUR_MODELS[path.parent.name][0]
    layer_ms = sum(
        count * per_tokens[f"time_stats.{op}.median"] for op, count in _VIDUR_LAYER_OPS.items()
    )
    step_ms = per_tokens["time_stats.emb.median"] + layers * layer_ms
    return step_ms / 1e3


def _decode_attention(path: Path, max_batch: int) -> list[tuple[int, int, float]]:
    """Per-layer decode attention as (batch_size, kv_len, seconds), within the usable range."""
    return _decode_rows(pd.read_csv(path), max_batch)


def _decode_rows(frame: pd.DataFrame, max_batch: int) -> list[tuple[int, int, float]]:
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


def _prefill_batch(num_tokens: int) -> BatchShape:
    return BatchShape(
        num_prefill_tokens=num_tokens,
        num_prefill_seqs=1,
        prefill_attention_pairs=prefill_chunk_pairs(num_tokens, 0),
        num_sampled=1,
    )


def _decode_batch(num_seqs: int, context_tokens: int) -> BatchShape:
    return BatchShape(
        num_decode_seqs=num_seqs,
        decode_context_tokens=num_seqs * context_tokens,
        num_sampled=num_seqs,
    )


# -- observations ------------------------------------------------------------------------------
def _layer_sum_observations(
    table: pd.DataFrame,
    num_layers: int,
    prefill_lengths: Iterable[int],
    decode_attention: Iterable[tuple[int, int, float]],
) -> list[Observation]:
    """Step times summed from a per-module layer table (seconds; modules as columns, ``input``
    tokens as index, LLMServingSim's module names) and per-layer decode attention times.

    A prefill of ``n`` tokens is ``embedding + layers × Σ modules + final norm + lm_head(1)``; a
    decode step of ``b`` sequences is the non-attention modules at ``b`` tokens, ``lm_head`` at
    ``b`` rows, plus ``layers ×`` the decode attention of ``b`` sequences at their context.
    """
    lm_head = table["lm_head"]
    once = table["embedding"] + table["final_layernorm"]
    per_layer = table[list(_LAYER_MODULES)].sum(axis=1)
    observations = [
        Observation(
            _prefill_batch(n),
            float(once[n] + num_layers * per_layer[n] + lm_head[1]),
            kind="operator",
        )
        for n in prefill_lengths
        if n in table.index
    ]
    non_attention = once + num_layers * (per_layer - table["attn"]) + lm_head
    for batch, kv_len, attention_s in decode_attention:
        if batch in non_attention.index:
            seconds = float(non_attention[batch] + num_layers * attention_s)
            observations.append(Observation(_decode_batch(batch, kv_len), seconds, kind="operator"))
    return observations


def _llmservingsim_observations(
    data_dir: Path, model: str, tp: int, with_kernel_bench: bool
) -> tuple[list[Observation], list[Path]]:
    layers_csv = data_dir / _LLMSERVINGSIM_DIR / model / f"tp{tp}" / "layers.csv"
    table = _llmservingsim_table(layers_csv)
    num_layers = get_model(model).num_layers
    files = [layers_csv]
    decode: list[tuple[int, int, float]] = []
    if with_kernel_bench:
        decode_csv = _decode_table(data_dir, _llama31_heads(model), tp)
        assert decode_csv is not None
        files.append(decode_csv)
        decode = _decode_attention(decode_csv, int(table.index.max()))
    return _layer_sum_observations(table, num_layers, PREFILL_LENGTHS, decode), files


def _vidur_observations(
    data_dir: Path, model: str, tp: int, folder: str, with_kernel_bench: bool
) -> tuple[list[Observation], list[Path]]:
    mlp_csv = data_dir / _VIDUR_DIR / folder / "meta-llama" / model / "mlp.csv"
    step = _vidur_table(mlp_csv, tp)
    tokens = step.index.to_numpy(dtype=np.float64)
    values = step.to_numpy(dtype=np.float64)

    def non_attention(num_tokens: int) -> float:
        return float(np.interp(num_tokens, tokens, values))

    files = [mlp_csv]
    if not with_kernel_bench:
        # Attention-free batches: the measured time has no attention in it (see module doc).
        measured = [int(n) for n in tokens]
        observations = [
            Observation(
                BatchShape(num_prefill_tokens=n, num_prefill_seqs=1, num_sampled=1),
                non_attention(n),
                kind="operator",
            )
            for n in measured
            if n >= PREFILL_LENGTHS[0]
        ]
        observations += [
            Observation(
                BatchShape(num_decode_seqs=n, num_sampled=n), non_attention(n), kind="operator"
            )
            for n in measured
            if n <= 1024
        ]
        return observations, files
    num_layers, heads = _VIDUR_MODELS[model]
    prefill_csv = data_dir / _KERNEL_DIR / "prefill" / "h100" / f"{heads}.csv"
    # The kernel tables were measured on an H100; on an A100 decode attention (memory-bound)
    # scales with the datasheets' bandwidth and prefill attention (compute-bound) with their
    # bf16 tensor rate (sim/hardware.py cites both).
    h100, here = get_gpu("h100-sxm"), get_gpu(f"{folder}-sxm" if folder == "a100" else "h100-sxm")
    bandwidth_ratio = h100.memory_bandwidth_bytes_per_s / here.memory_bandwidth_bytes_per_s
    flops_ratio = h100.bf16_flops / here.bf16_flops
    decode_csv = _decode_table(data_dir, heads, tp)
    assert decode_csv is not None
    files += [prefill_csv, decode_csv]
    prefill = pd.read_csv(prefill_csv)
    observations = [
        Observation(
            _prefill_batch(int(seq_len)),
            non_attention(int(seq_len)) + num_layers * float(latency_us) / 1e6 / tp * flops_ratio,
            kind="operator",
        )
        for seq_len, latency_us in zip(
            prefill["seq_len"].to_numpy(), prefill["latency_us"].to_numpy(), strict=True
        )
        if seq_len <= tokens.max()
    ]
    for batch, kv_len, attention_s in _decode_attention(decode_csv, int(tokens.max())):
        seconds = non_attention(batch) + num_layers * attention_s * bandwidth_ratio
        observations.append(Observation(_decode_batch(batch, kv_len), seconds, kind="operator"))
    return observations, files


def _observations_and_files(
    source: str, model: str, tp: int, data_dir: Path, hardware: str
) -> tuple[list[Observation], list[Path]]:
    data_dir = Path(data_dir)
    name = _resolve(source, model, tp, data_dir, hardware)
    folder = _gpu_folder(hardware)
    match source:
        case "llmservingsim" | "llmservingsim+kernel_bench":
            if folder != "h100":
                raise ValueError(f"hardware: {source} was measured on an H100, not {hardware!r}")
            observations, files = _llmservingsim_observations(
                data_dir, name, tp, source.endswith("kernel_bench")
            )
            num_layers, hidden = get_model(name).num_layers, get_model(name).hidden_size
        case "vidur" | "vidur+kernel_bench":
            observations, files = _vidur_observations(
                data_dir, name, tp, folder, source.endswith("kernel_bench")
            )
            num_layers, hidden = _VIDUR_MODELS[name][0], _VIDUR_HIDDEN[name]
        case _:
            raise AssertionError(source)
    if tp > 1:
        network_csv = data_dir / _NETWORK_DIR / f"{folder}_dgx" / "all_reduce.csv"
        all_reduce = _all_reduce_seconds(network_csv, tp)
        files.append(network_csv)
        observations = [
            Observation(
                obs.batch,
                obs.seconds
                + 2
                * num_layers
                * all_reduce((obs.batch.num_prefill_tokens + obs.batch.num_decode_seqs) * hidden),
                kind=obs.kind,
            )
            for obs in observations
        ]
    return observations, files


def _all_reduce_seconds(path: Path, tp: int) -> Callable[[int], float]:
    """Seconds of one NCCL all-reduce of ``size`` 16-bit elements among ``tp`` GPUs of a node.

    Vidur's table (``size`` in elements, as its profiler allocates fp16 tensors of that many
    elements; times in ms) is noisy at small sizes, where launch latency dominates: per size
    the median of the repeated medians is taken, then the lower non-decreasing envelope (each
    size's time is the least measured at that size or above: a larger message is never faster,
    and the slow small-size outliers are launch jitter that vLLM's custom all-reduce avoids),
    and sizes between measured ones are interpolated linearly.
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


def operator_observations(
    source: str,
    *,
    model: str,
    tensor_parallel_size: int = 1,
    data_dir: Path,
    hardware: str = "h100",
) -> list[Observation]:
    """Step-time observations summed from one source's operator tables (see module docstring).

    ``model`` is matched loosely (``meta-llama/Llama-3.1-8B``, ``llama-3.1-8b``); ``hardware``
    picks Vidur's A100 or H100 folder (the other sources are H100 only). Raises ValueError
    listing the (model, TP) combinations the source has when the request is not among them.
    """
    observations, _ = _observations_and_files(
        source, model, tensor_parallel_size, data_dir, hardware
    )
    return observations


_SOURCE_NOTES = {
    "llmservingsim": [
        "prefill steps only (the H100 tables hold the prefill sweep, kv_cache = 0)",
        "Hugging Face eager kernels (unfused norms and rope), not vLLM's",
        "TP>1 tables time one GPU's shard; two all-reduces per layer are added from Vidur's "
        "NCCL table (vidur/profiling/network/h100_dgx)",
    ],
    "llmservingsim+kernel_bench": [
        "prefill: LLMServingSim layer sums; decode: LLMServingSim non-attention modules + "
        "kernel-bench decode attention × layers",
        "Hugging Face eager kernels (unfused norms and rope), not vLLM's",
        "TP>1 tables time one GPU's shard; two all-reduces per layer are added from Vidur's "
        "NCCL table (vidur/profiling/network/h100_dgx)",
    ],
    "vidur": [
        "non-attention operators only: attention, LM head and final norm are absent",
        "TP>1: two all-reduces per layer added from Vidur's NCCL table of the same GPU's DGX",
    ],
    "vidur+kernel_bench": [
        "Vidur non-attention operators + kernel-bench attention of the same head layout",
        "prefill points only at 1,024 and 4,096 tokens; prefill attention divided by TP",
        "LM head and final norm are absent",
        "TP>1: two all-reduces per layer added from Vidur's NCCL table of the same GPU's DGX",
    ],
}


def operator_profile(
    source: str,
    *,
    model: str,
    hardware: str,
    tensor_parallel_size: int = 1,
    data_dir: Path,
    dtype: str = "bf16",
) -> Profile:
    """A calibration profile fitted to one source's operator tables.

    The profile names the catalogue model and GPU where they exist (so ``check_profile``
    matches scenarios), the source as its engine, and in ``data_summary`` the files read, the
    number of prefill and decode points, and the source's limitations.
    """
    observations, files = _observations_and_files(
        source, model, tensor_parallel_size, data_dir, hardware
    )
    try:
        model_name = get_model(model).name
    except ValueError:
        model_name = _key(model)
    notes = list(_SOURCE_NOTES[source])
    table_model = _resolve(source, model, tensor_parallel_size, Path(data_dir), hardware)
    if _key(table_model) != _key(model):
        notes.append(
            f"tables of {table_model} used for {model_name}: the same layer shapes (config.json)"
        )
    if source == "vidur+kernel_bench" and _gpu_folder(hardware) == "a100":
        notes.append(
            "attention from the H100 kernel tables scaled to the A100 by the datasheets: decode "
            "by memory bandwidth (3.35/2.039 TB/s), prefill by bf16 tensor rate (989/312 TFLOPS)"
        )
    return _fitted(
        observations,
        method=f"step_least_squares:{source}",
        notes=notes,
        model=model_name,
        hardware=get_gpu(hardware).name,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        engine=EngineInfo(name=source, version=""),
        summary={
            "source": source,
            "files": [str(path.relative_to(Path(data_dir))) for path in files],
        },
    )


_PROFILED_NOTES = [
    "one GPU's operators timed with torch (calibration/operators.py): no all-reduce between "
    "TP shards, no sampler, no CPU-side scheduling",
    "attention is torch's scaled_dot_product_attention on dense tensors, not vLLM's paged kernel",
]


def profiled_observations(tables: OperatorTables) -> list[Observation]:
    """Step-time observations summed from tables written by the operator profiler."""
    table = _layer_table(tables.layers)
    num_layers = int(tables.meta["shapes"]["num_layers"])
    prefill = [int(n) for n in table.index if n >= PREFILL_LENGTHS[0]]
    decode = _decode_rows(tables.decode_attention, int(table.index.max()))
    return _layer_sum_observations(table, num_layers, prefill, decode)


def profiled_profile(tables: OperatorTables, *, hardware: str, source: str = "") -> Profile:
    """A calibration profile fitted to the operator profiler's tables (``source``: where they
    are, for the summary). ``hardware`` is the scenario's GPU; the device torch ran on is in
    the summary."""
    meta = tables.meta
    return _fitted(
        profiled_observations(tables),
        method="step_least_squares:torch_operators",
        notes=_PROFILED_NOTES,
        model=str(meta["model"]),
        hardware=hardware,
        tensor_parallel_size=int(meta["tensor_parallel_size"]),
        dtype=str(meta["dtype"]),
        engine=EngineInfo(name="torch-operators", version=str(meta.get("torch_version", ""))),
        summary={
            "source": "torch operator profiler",
            "tables": source,
            "device": meta.get("device"),
            "device_name": meta.get("device_name"),
            "threads": meta.get("threads"),
            "profiled": meta.get("created"),
        },
    )


def _fitted(
    observations: list[Observation],
    *,
    method: str,
    notes: list[str],
    model: str,
    hardware: str,
    tensor_parallel_size: int,
    dtype: str,
    engine: EngineInfo,
    summary: dict[str, Any],
) -> Profile:
    coefficients, report = fit_steps(observations, method_name=method)
    report = report.model_copy(update={"notes": [*report.notes, *notes]})
    num_decode = sum(1 for obs in observations if obs.batch.num_decode_seqs)
    return Profile(
        schema_version=SCHEMA_VERSION,
        model=model,
        hardware=hardware,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        engine=engine,
        created=now_iso(),
        coefficients=coefficients,
        fit=report,
        data_summary={
            **summary,
            "num_points": len(observations),
            "num_prefill_points": len(observations) - num_decode,
            "num_decode_points": num_decode,
            "limitations": notes,
        },
    )


# -- comparison with the roofline model --------------------------------------------------------
def canonical_batches(context_tokens: int = 1024) -> dict[str, BatchShape]:
    """Decodes of 1, 32 and 128 sequences at ``context_tokens`` each; prefills of 512 and 2,048."""
    batches = {
        f"decode {b} @ {context_tokens} ctx": _decode_batch(b, context_tokens) for b in (1, 32, 128)
    }
    batches.update({f"prefill {n}": _prefill_batch(n) for n in (512, 2048)})
    return batches


def compare_with_roofline(
    profile: Profile,
    roofline: IterationTimeModel,
    batches: Mapping[str, BatchShape] | Iterable[tuple[str, BatchShape]],
) -> list[dict[str, Any]]:
    """Step times of ``profile`` and ``roofline`` side by side: one row per batch with
    ``batch``, ``profile_ms``, ``roofline_ms`` and ``ratio`` (profile / roofline).
    """
    items = batches.items() if isinstance(batches, Mapping) else batches
    measured = CalibratedModel(profile.coefficients)
    rows = []
    for label, batch in items:
        profile_s = measured.step_time(batch)
        roofline_s = roofline.step_time(batch)
        rows.append(
            {
                "batch": label,
                "profile_ms": profile_s * 1e3,
                "roofline_ms": roofline_s * 1e3,
                "ratio": profile_s / roofline_s,
            }
        )
    return rows


# -- the profiles shipped in profiles/ ---------------------------------------------------------
#: (catalogue GPU, catalogue model, TP, source) of every profile in ``profiles/``.
SHIPPED: tuple[tuple[str, str, int, str], ...] = (
    ("h100-sxm", "llama-3.1-8b", 1, "llmservingsim+kernel_bench"),
    ("h100-sxm", "llama-3.1-8b", 2, "llmservingsim+kernel_bench"),
    ("h100-sxm", "llama-3.1-70b", 4, "llmservingsim+kernel_bench"),
    ("a100-80gb-sxm", "llama-3.1-8b", 1, "vidur+kernel_bench"),
    ("a100-80gb-sxm", "llama-3.1-8b", 2, "vidur+kernel_bench"),
    ("a100-80gb-sxm", "llama-3.1-70b", 4, "vidur+kernel_bench"),
)


def shipped_profile_name(gpu: str, model: str, tp: int) -> str:
    return f"{gpu}_{model}_tp{tp}.json"


def shipped_profile(gpu: str, model: str, tp: int, source: str, data_dir: Path) -> Profile:
    """One of :data:`SHIPPED`, with its step times beside the roofline's in ``data_summary``."""
    profile = operator_profile(
        source, model=model, hardware=gpu, tensor_parallel_size=tp, data_dir=data_dir
    )
    roofline = RooflineModel(get_model(model), get_gpu(gpu), tensor_parallel_size=tp)
    comparison = compare_with_roofline(profile, roofline, canonical_batches())
    summary = {**profile.data_summary, "roofline_comparison": comparison}
    return profile.model_copy(update={"data_summary": summary})


def write_shipped_profiles(data_dir: Path, out_dir: Path) -> list[Path]:
    """Fit and write every profile of :data:`SHIPPED` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        shipped_profile(gpu, model, tp, source, data_dir).save(
            out_dir / shipped_profile_name(gpu, model, tp)
        )
        for gpu, model, tp, source in SHIPPED
    ]


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("profiles")
    shared = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("../shared/data")
    for written in write_shipped_profiles(shared, target):
        print(written)
