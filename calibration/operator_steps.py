"""Step times summed from operator tables: the observations a profile is fitted to.

Each source's tables (read by :mod:`calibration.operator_sources`, whose docstring says what
they mean) become :class:`~calibration.observations.Observation` s of whole steps: a prefill of
``n`` tokens is the embedding, ``num_layers ×`` one layer's modules, the final norm and the LM
head at the rows that sample; a decode step of ``b`` sequences is the non-attention modules at
``b`` tokens plus ``num_layers ×`` the decode attention of ``b`` sequences at their context. At
TP>1 two all-reduces per layer are added from Vidur's NCCL table. The tables the torch profiler
(:mod:`calibration.operators`) writes are summed by the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.observations import Observation
from calibration.operator_sources import (
    LAYER_MODULES,
    VIDUR_HIDDEN,
    VIDUR_MODELS,
    all_reduce_csv,
    all_reduce_seconds,
    decode_rows,
    decode_table,
    gpu_folder,
    kernel_heads,
    layer_table,
    llmservingsim_layers_csv,
    prefill_attention_csv,
    read_decode_attention,
    read_layer_csv,
    read_prefill_attention,
    read_vidur_steps,
    resolve_table_model,
    vidur_mlp_csv,
)
from calibration.operators import OperatorTables
from sim.catalog.hardware import get_gpu
from sim.catalog.models import get_model
from sim.engine.latency import BatchShape, prefill_chunk_pairs

#: Prefill lengths taken from the LLMServingSim sweep: 16..2048 tokens on a 1-2-3 geometric
#: grid, so every octave weighs the same in the fit (tiny "prefills" are decode-like and rare).
PREFILL_LENGTHS: tuple[int, ...] = tuple(
    sorted({n for k in range(4, 12) for n in (2**k, 3 * 2 ** (k - 1))} | {2048})
)


def prefill_batch(num_tokens: int) -> BatchShape:
    """A lone prefill of ``num_tokens`` tokens (no earlier context) that samples one token."""
    return BatchShape(
        num_prefill_tokens=num_tokens,
        num_prefill_seqs=1,
        prefill_attention_pairs=prefill_chunk_pairs(num_tokens, 0),
        num_sampled=1,
    )


def decode_batch(num_seqs: int, context_tokens: int) -> BatchShape:
    """A decode step of ``num_seqs`` sequences with ``context_tokens`` cached tokens each."""
    return BatchShape(
        num_decode_seqs=num_seqs,
        decode_context_tokens=num_seqs * context_tokens,
        num_sampled=num_seqs,
    )


def layer_sum_observations(
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
    per_layer = table[list(LAYER_MODULES)].sum(axis=1)
    observations = [
        Observation(
            prefill_batch(n),
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
            observations.append(Observation(decode_batch(batch, kv_len), seconds, kind="operator"))
    return observations


def _llmservingsim_observations(
    data_dir: Path, model: str, tp: int, with_kernel_bench: bool
) -> tuple[list[Observation], list[Path]]:
    layers_csv = llmservingsim_layers_csv(data_dir, model, tp)
    table = read_layer_csv(layers_csv)
    num_layers = get_model(model).num_layers
    files = [layers_csv]
    decode: list[tuple[int, int, float]] = []
    if with_kernel_bench:
        decode_csv = decode_table(data_dir, kernel_heads(model), tp)
        assert decode_csv is not None
        files.append(decode_csv)
        decode = read_decode_attention(decode_csv, int(table.index.max()))
    return layer_sum_observations(table, num_layers, PREFILL_LENGTHS, decode), files


def _vidur_observations(
    data_dir: Path, model: str, tp: int, folder: str, with_kernel_bench: bool
) -> tuple[list[Observation], list[Path]]:
    mlp_csv = vidur_mlp_csv(data_dir, folder, model)
    step = read_vidur_steps(mlp_csv, tp)
    tokens = step.index.to_numpy(dtype=np.float64)
    values = step.to_numpy(dtype=np.float64)

    def non_attention(num_tokens: int) -> float:
        return float(np.interp(num_tokens, tokens, values))

    if not with_kernel_bench:
        return _attention_free_observations(non_attention, [int(n) for n in tokens]), [mlp_csv]
    observations, attention_files = _vidur_kernel_bench_observations(
        data_dir, model, tp, folder, non_attention, float(tokens.max())
    )
    return observations, [mlp_csv, *attention_files]


def _attention_free_observations(
    non_attention: Callable[[int], float], measured: list[int]
) -> list[Observation]:
    """Vidur's steps alone: attention-free batches, as the measured time has no attention in it
    (see :mod:`calibration.operator_sources`)."""
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
        Observation(BatchShape(num_decode_seqs=n, num_sampled=n), non_attention(n), kind="operator")
        for n in measured
        if n <= 1024
    ]
    return observations


def _vidur_kernel_bench_observations(
    data_dir: Path,
    model: str,
    tp: int,
    folder: str,
    non_attention: Callable[[int], float],
    max_tokens: float,
) -> tuple[list[Observation], list[Path]]:
    """Vidur's non-attention steps plus the kernel benchmark's attention of the same heads, up
    to ``max_tokens`` (Vidur's largest token count); the files read besides Vidur's."""
    num_layers, heads = VIDUR_MODELS[model]
    prefill_csv = prefill_attention_csv(data_dir, heads)
    # The kernel tables were measured on an H100; on an A100 decode attention (memory-bound)
    # scales with the datasheets' bandwidth and prefill attention (compute-bound) with their
    # bf16 tensor rate (sim/hardware.py cites both).
    h100, here = get_gpu("h100-sxm"), get_gpu(f"{folder}-sxm" if folder == "a100" else "h100-sxm")
    bandwidth_ratio = h100.memory_bandwidth_bytes_per_s / here.memory_bandwidth_bytes_per_s
    flops_ratio = h100.bf16_flops / here.bf16_flops
    decode_csv = decode_table(data_dir, heads, tp)
    assert decode_csv is not None
    observations = [
        Observation(
            prefill_batch(seq_len),
            non_attention(seq_len) + num_layers * latency_us / 1e6 / tp * flops_ratio,
            kind="operator",
        )
        for seq_len, latency_us in read_prefill_attention(prefill_csv)
        if seq_len <= max_tokens
    ]
    for batch, kv_len, attention_s in read_decode_attention(decode_csv, int(max_tokens)):
        seconds = non_attention(batch) + num_layers * attention_s * bandwidth_ratio
        observations.append(Observation(decode_batch(batch, kv_len), seconds, kind="operator"))
    return observations, [prefill_csv, decode_csv]


def _with_all_reduces(
    observations: list[Observation],
    all_reduce: Callable[[int], float],
    num_layers: int,
    hidden: int,
) -> list[Observation]:
    """The observations with two all-reduces per layer of each step's ``tokens × hidden``
    activation added (one after attention, one after the MLP, as vLLM's TP layers do)."""
    return [
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


def observations_and_files(
    source: str, model: str, tp: int, data_dir: Path, hardware: str
) -> tuple[list[Observation], list[Path]]:
    """The step observations of :func:`operator_observations` and the paths (under
    ``data_dir``) of the table files they were summed from, in the order they were read."""
    data_dir = Path(data_dir)
    name = resolve_table_model(source, model, tp, data_dir, hardware)
    folder = gpu_folder(hardware)
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
            num_layers, hidden = VIDUR_MODELS[name][0], VIDUR_HIDDEN[name]
        case _:
            raise AssertionError(source)
    if tp > 1:
        network_csv = all_reduce_csv(data_dir, folder)
        all_reduce = all_reduce_seconds(network_csv, tp)
        files.append(network_csv)
        observations = _with_all_reduces(observations, all_reduce, num_layers, hidden)
    return observations, files


def operator_observations(
    source: str,
    *,
    model: str,
    tensor_parallel_size: int = 1,
    data_dir: Path,
    hardware: str = "h100",
) -> list[Observation]:
    """Step-time observations summed from one source's operator tables (see
    :mod:`calibration.operator_sources`).

    ``model`` is matched loosely (``meta-llama/Llama-3.1-8B``, ``llama-3.1-8b``); ``hardware``
    picks Vidur's A100 or H100 folder (the other sources are H100 only). Raises ValueError
    listing the (model, TP) combinations the source has when the request is not among them.
    """
    observations, _ = observations_and_files(
        source, model, tensor_parallel_size, data_dir, hardware
    )
    return observations


def profiled_observations(tables: OperatorTables) -> list[Observation]:
    """Step-time observations summed from tables written by the operator profiler."""
    table = layer_table(tables.layers)
    num_layers = int(tables.meta["shapes"]["num_layers"])
    prefill = [int(n) for n in table.index if n >= PREFILL_LENGTHS[0]]
    decode = decode_rows(tables.decode_attention, int(table.index.max()))
    return layer_sum_observations(table, num_layers, prefill, decode)
