"""Calibration profiles fitted to operator timing tables: step times without a serving engine.

The public tables in ``shared/data`` (:mod:`calibration.operator_sources` says what each source
can and cannot say) and the ones :mod:`calibration.operators` profiles on a GPU node are summed
into step-time observations by :mod:`calibration.operator_steps` and fitted here with
:func:`calibration.fit.fit_steps` into a :class:`~sim.engine.profile.Profile`
(:func:`operator_profile`, :func:`profiled_profile`); :func:`compare_with_roofline` sets a
profile's step times beside the roofline model's. The profiles shipped in ``profiles/``
(:data:`SHIPPED`) are rebuilt with ``python -m calibration.operator_tables profiles
../shared/data`` (``make profiles``).

The public names of the readers and observation builders that used to live here are
re-exported, so ``from calibration.operator_tables import operator_observations`` keeps working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from calibration.fit import fit_steps
from calibration.observations import Observation
from calibration.operator_sources import (
    LAYER_MODULES,
    MAX_DECODE_KV_LEN,
    SOURCES,
    available,
    gpu_folder,
    resolve_table_model,
)
from calibration.operator_steps import (
    PREFILL_LENGTHS,
    decode_batch,
    observations_and_files,
    operator_observations,
    prefill_batch,
    profiled_observations,
)
from calibration.operators import OperatorTables
from calibration.profile import now_iso
from sim.catalog.hardware import get_gpu
from sim.catalog.model_names import normalise_model_name
from sim.catalog.models import get_model
from sim.engine.latency import (
    DEFAULT_FRONTEND_OVERHEAD_S,
    BatchShape,
    CalibratedModel,
    IterationTimeModel,
    RooflineModel,
)
from sim.engine.profile import SCHEMA_VERSION, EngineInfo, Profile

#: The old private name of :data:`calibration.operator_sources.LAYER_MODULES` (tests import it).
_LAYER_MODULES = LAYER_MODULES

__all__ = [
    "MAX_DECODE_KV_LEN",
    "PREFILL_LENGTHS",
    "SHIPPED",
    "SOURCES",
    "_LAYER_MODULES",
    "available",
    "canonical_batches",
    "compare_with_roofline",
    "operator_observations",
    "operator_profile",
    "profiled_observations",
    "profiled_profile",
    "shipped_profile",
    "shipped_profile_name",
    "write_shipped_profiles",
]

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
    observations, files = observations_and_files(
        source, model, tensor_parallel_size, data_dir, hardware
    )
    try:
        model_name = get_model(model).name
    except ValueError:
        model_name = normalise_model_name(model)
    notes = list(_SOURCE_NOTES[source])
    table_model = resolve_table_model(source, model, tensor_parallel_size, Path(data_dir), hardware)
    if normalise_model_name(table_model) != normalise_model_name(model):
        notes.append(
            f"tables of {table_model} used for {model_name}: the same layer shapes (config.json)"
        )
    if source == "vidur+kernel_bench" and gpu_folder(hardware) == "a100":
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


_FRONTEND_NOTE = (
    f"front end {DEFAULT_FRONTEND_OVERHEAD_S * 1e3:g} ms, the roofline's measured default "
    "(sim/engine/latency.py DEFAULT_FRONTEND_OVERHEAD_S): operator tables time no server"
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
    # Operator tables time the GPU's kernels, never a request through a server: the front end
    # a client sees in TTFT is the roofline's measured default, not the zero they would fit.
    coefficients = dataclasses.replace(
        coefficients, frontend_overhead_s=DEFAULT_FRONTEND_OVERHEAD_S
    )
    notes = [*notes, _FRONTEND_NOTE]
    fitted_notes = [n for n in report.notes if not n.startswith("frontend_overhead_s fixed at 0")]
    report = report.model_copy(update={"notes": [*fitted_notes, *notes]})
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
        f"decode {b} @ {context_tokens} ctx": decode_batch(b, context_tokens) for b in (1, 32, 128)
    }
    batches.update({f"prefill {n}": prefill_batch(n) for n in (512, 2048)})
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
    """The file name in ``profiles/`` of the shipped profile of ``model`` at TP ``tp`` on a GPU."""
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
