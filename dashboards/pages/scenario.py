"""Scenario page: every knob, grouped; presets; YAML load and save; trace upload."""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from dashboards.core import (
    parse_upload,
    parse_yaml_text,
    presets,
    scenario_yaml,
    store_trace,
    upload_directory,
)
from dashboards.state import (
    current_scenario,
    knob_key,
    load_scenario,
    pop_flash,
    save_scenario,
    scenario_data,
    set_scenario_data,
)
from sim.catalog.hardware import GPU_CATALOG, get_gpu
from sim.catalog.model_names import checkpoint_quantization
from sim.catalog.models import MODEL_CATALOG
from sim.scenario.sections import GPU_BATCH_DEFAULTS, vllm_batch_defaults

ROUTERS = ["round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity"]


def _number(label: str, low: float, high: float, value: Any, key: str) -> Any:
    """A number input for ``value``; a value outside [low, high] (or not a number) is shown as
    text and kept, so the scenario's own error says what is wrong with it."""
    integer = isinstance(value, int) and isinstance(low, int) and not isinstance(value, bool)
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        st.caption(f"{label}: {value!r} (outside {low}–{high}; edit it in YAML)")
        return value
    if integer:
        return int(st.number_input(label, int(low), int(high), int(value), key=knob_key(key)))
    return float(st.number_input(label, float(low), float(high), float(value), key=knob_key(key)))


def _choice(label: str, options: list[Any], value: Any, key: str) -> Any:
    """A select box for ``value``; a value not among ``options`` (a custom model, TP 16, …) is
    shown as text and kept, to be edited in YAML."""
    if value not in options:
        st.caption(f"{label}: {value!r} (edit it in YAML)")
        return value
    return st.selectbox(label, options, options.index(value), key=knob_key(key))


def _lengths(label: str, spec: dict[str, Any], key: str) -> dict[str, Any]:
    """Mean and p90 of a lognormal length (other distributions are kept as they are)."""
    if spec.get("type") != "lognormal":
        st.caption(f"{label}: {spec.get('type')} (edit in YAML)")
        return spec
    mean = _number(f"{label} mean", 1, 200_000, spec.get("mean"), f"{key}_mean")
    p90 = _number(f"{label} p90", 1, 400_000, spec.get("p90"), f"{key}_p90")
    return {**spec, "mean": mean, "p90": p90}


def main() -> None:
    st.title("Scenario")
    flash = pop_flash()
    if flash:
        st.success(flash)
    data = copy.deepcopy(scenario_data())
    _preset()
    tabs = st.tabs([label for label, _ in TABS])
    for tab, (_, render) in zip(tabs, TABS, strict=True):
        with tab:
            render(data)
    set_scenario_data(data)
    _save_for_comparison(data)
    _validity()


def _preset() -> None:
    """Replace the scenario with a preset, on request."""
    choice = st.selectbox("Start from a preset", ["(keep current)", *presets()], key="preset")
    if choice != "(keep current)" and st.button("Load preset", key="load_preset"):
        load_scenario(presets()[choice], f"Loaded the preset {choice}.")


def _model_and_gpu(data: dict[str, Any]) -> None:
    data["model"] = _choice("Model", list(MODEL_CATALOG), data.get("model"), "model")
    data["gpu"] = _choice("GPU", list(GPU_CATALOG), data.get("gpu"), "gpu")
    dtypes = ["bf16", "fp16", "fp8", "int8", "int4"]
    # A quantized checkpoint (Qwen/Qwen3-8B-FP8) implies its weights' dtype.
    model = data["model"]
    quantized = checkpoint_quantization(model) if isinstance(model, str) else None
    default = quantized.dtype if quantized is not None else "bf16"
    data["dtype"] = _choice("Weights", dtypes, data.get("dtype", default), "dtype")


def _workload(data: dict[str, Any]) -> None:
    workload = data.setdefault("workload", {})
    _arrival(workload)
    if "trace" not in workload:
        workload["prompt_tokens"] = _lengths("Prompt tokens", workload["prompt_tokens"], "p")
        workload["output_tokens"] = _lengths("Output tokens", workload["output_tokens"], "o")
    if "num_requests" in workload:
        workload["num_requests"] = _number(
            "Requests", 1, 1_000_000, workload["num_requests"], "num_requests"
        )


def _arrival(workload: dict[str, Any]) -> None:
    """The arrival process and its rate (other processes keep their shape; the rate is kept
    editable whenever there is one)."""
    arrival = workload.get("arrival", {})
    kinds = ["poisson", "gamma", "constant"]
    if arrival.get("type") in kinds:
        kind = st.selectbox(
            "Arrivals", kinds, kinds.index(arrival["type"]), key=knob_key("arrival_type")
        )
        old = arrival
        arrival = {"type": kind, "rate": old.get("rate", 1.0)}
        if kind == "gamma":
            arrival["cv"] = _number(
                "Burstiness (CV)", 0.01, 100.0, old.get("cv", 2.0), "arrival_cv"
            )
    elif arrival:
        st.caption(f"Arrivals: {arrival.get('type')} (edit in YAML)")
    if "rate" in arrival:
        at_once = st.toggle(
            "All requests at once (rate ∞)",
            arrival["rate"] == math.inf,
            key=knob_key("rate_inf"),
            help="vllm bench serve --request-rate inf; with concurrent users, a closed loop",
        )
        if at_once:
            rate = math.inf
        else:
            old_rate = 1.0 if arrival["rate"] == math.inf else arrival["rate"]
            rate = _number("Arrival rate (req/s)", 0.01, 10_000.0, old_rate, "rate")
        workload["arrival"] = {**arrival, "rate": rate}
    _closed_loop(workload)


def _closed_loop(workload: dict[str, Any]) -> None:
    """Concurrent users (``max_concurrency``; 0 is an open loop) and their think time."""
    users = _number(
        "Concurrent users (0: open loop)",
        0,
        1_000_000,
        workload.get("max_concurrency") or 0,
        "max_concurrency",
    )
    if users:
        workload["max_concurrency"] = users
        workload["think_time_s"] = _number(
            "Think time between a user's requests (s)",
            0.0,
            3600.0,
            float(workload.get("think_time_s", 0.0)),
            "think_time_s",
        )
    else:
        workload.pop("max_concurrency", None)
        workload.pop("think_time_s", None)


def _batch_defaults(data: dict[str, Any]) -> tuple[int, int]:
    """vLLM's max_num_seqs and max_num_batched_tokens for the scenario's GPU, if it names a
    catalogue one (a custom GPU: the small-GPU values)."""
    try:
        gpu = get_gpu(str(data.get("gpu")))
    except ValueError:
        return GPU_BATCH_DEFAULTS
    engine = data.get("engine", {})
    world_size = int(engine.get("tensor_parallel_size", 1)) * int(
        engine.get("pipeline_parallel_size", 1)
    )
    return vllm_batch_defaults(gpu, world_size)


def _engine(data: dict[str, Any]) -> None:
    seqs, tokens = _batch_defaults(data)
    engine = data.setdefault("engine", {})
    engine["max_num_seqs"] = _number(
        "max_num_seqs", 1, 4096, engine.get("max_num_seqs", seqs), "seqs"
    )
    engine["tensor_parallel_size"] = _choice(
        "Tensor parallel size", [1, 2, 4, 8, 16], engine.get("tensor_parallel_size", 1), "tp"
    )
    engine["pipeline_parallel_size"] = _number(
        "Pipeline parallel size", 1, 64, engine.get("pipeline_parallel_size", 1), "pp"
    )
    engine["max_num_batched_tokens"] = _number(
        "max_num_batched_tokens",
        1,
        1_048_576,
        engine.get("max_num_batched_tokens", tokens),
        "batched_tokens",
    )
    # A limit at vLLM's default for this GPU is left out, so that the scenario fills it in
    # for whatever GPU it runs on (another candidate in a plan, a pool).
    for field, default in (("max_num_seqs", seqs), ("max_num_batched_tokens", tokens)):
        if engine.get(field) == default:
            del engine[field]
    if "max_model_len" in engine:
        engine["max_model_len"] = _number(
            "max_model_len", 1, 10_000_000, engine["max_model_len"], "max_model_len"
        )
    engine["block_size"] = _choice(
        "Block size", [1, 8, 16, 32, 64, 128], engine.get("block_size", 16), "block"
    )
    engine["gpu_memory_utilization"] = _number(
        "gpu_memory_utilization", 0.05, 1.0, engine.get("gpu_memory_utilization", 0.9), "gmu"
    )
    engine["enable_prefix_caching"] = st.toggle(
        "Prefix caching", bool(engine.get("enable_prefix_caching", True)), key=knob_key("caching")
    )
    engine["enable_chunked_prefill"] = st.toggle(
        "Chunked prefill", bool(engine.get("enable_chunked_prefill", True)), key=knob_key("chunked")
    )
    batchings = ["continuous", "static", "dynamic"]
    engine["batching"] = _choice(
        "Batching", batchings, engine.get("batching", "continuous"), "batching"
    )
    _precision(data)


def _precision(data: dict[str, Any]) -> None:
    """Quantization method and KV cache dtype (top-level keys, shown under Engine)."""
    methods = ["auto", "weight_only", "w8a8", "bitsandbytes"]
    data["quantization"] = _choice(
        "Quantization method", methods, data.get("quantization", "auto"), "quantization"
    )
    kv_types = ["auto", "bf16", "fp16", "fp8"]
    data["kv_cache_dtype"] = _choice(
        "KV cache dtype", kv_types, data.get("kv_cache_dtype", "auto"), "kv_dtype"
    )


def _fleet(data: dict[str, Any]) -> None:
    fleet = data.setdefault("fleet", {})
    fleet["replicas"] = _number("Replicas", 1, 512, fleet.get("replicas", 1), "replicas")
    router = fleet.get("router", {})
    policy = _choice("Router", ROUTERS, router.get("policy", "round_robin"), "router")
    fleet["router"] = {**router, "policy": policy}
    _autoscaling(fleet)


def _autoscaling(fleet: dict[str, Any]) -> None:
    """The HPA's knobs while it is on; turning it off removes the section."""
    scaling = st.toggle("Autoscale (Kubernetes HPA)", "autoscaling" in fleet, key=knob_key("hpa"))
    if scaling:
        hpa = fleet.get("autoscaling") or {"target": 500}
        hpa["target"] = _number(
            _hpa_target_label(hpa), 0.001, 1e6, float(hpa.get("target", 500)), "hpa_target"
        )
        hpa["max_replicas"] = _number(
            "Max replicas", 1, 512, hpa.get("max_replicas", 10), "hpa_max"
        )
        fleet["autoscaling"] = hpa
    else:
        fleet.pop("autoscaling", None)


#: What an HPA target means for each metric the autoscaler follows (sim/scenario AutoscalingSpec).
HPA_TARGETS = {
    "ttft_ms": "p{percentile:g} TTFT (ms)",
    "waiting_per_replica": "waiting requests per replica",
    "running_per_replica": "running requests per replica",
    "kv_usage": "KV cache usage (0–1)",
}


def _hpa_target_label(hpa: dict[str, Any]) -> str:
    """The target's label for the HPA's own metric (and percentile, for TTFT)."""
    metric = hpa.get("metric", "ttft_ms")
    template = HPA_TARGETS.get(metric, metric)
    return "Target " + template.format(percentile=float(hpa.get("percentile", 90)))


def _slo_and_cost(data: dict[str, Any]) -> None:
    slo = data.setdefault("slo", {})
    slo["ttft_s"] = _number("TTFT target (s)", 0.001, 600.0, slo.get("ttft_s", 0.5), "slo_ttft")
    slo["tpot_s"] = _number("TPOT target (s)", 0.0001, 10.0, slo.get("tpot_s", 0.05), "slo_tpot")
    e2e = _number("E2E target (s; 0: none)", 0.0, 36_000.0, slo.get("e2e_s") or 0.0, "slo_e2e")
    if e2e:
        slo["e2e_s"] = e2e
    else:
        slo.pop("e2e_s", None)
    slo["percentile"] = _number("At percentile", 1.0, 100.0, slo.get("percentile", 90), "slo_pct")
    _price(data)


def _price(data: dict[str, Any]) -> None:
    """The scenario GPU's price per hour: shown from the scenario's own ``cost`` section, so
    a rerun or a visit to another page keeps it; 0 drops the override (the catalogue's)."""
    gpu = data.get("gpu")
    if not isinstance(gpu, str):
        st.caption("Price per GPU-hour: a custom GPU's price is set in YAML (cost.gpu_hour_usd)")
        return
    prices = dict(data.get("cost", {}).get("gpu_hour_usd", {}))
    price = _number(
        "Price per GPU-hour (USD, 0 = catalogue default)",
        0.0,
        1_000.0,
        float(prices.get(gpu, 0.0)),
        "price",
    )
    if price > 0:
        prices[gpu] = price
    else:
        prices.pop(gpu, None)
    cost = {k: v for k, v in data.get("cost", {}).items() if k != "gpu_hour_usd"}
    if prices:
        cost["gpu_hour_usd"] = prices
    if cost:
        data["cost"] = cost
    else:
        data.pop("cost", None)


def _save_for_comparison(data: dict[str, Any]) -> None:
    name = st.text_input("Save as (for Compare)", data.get("name", "scenario"), key="save_name")
    if st.button("Save for comparison", key="save_compare") and name.strip():
        save_scenario(name.strip(), data)
        st.toast(f"saved {name.strip()}")


def _validity() -> None:
    """Whether the scenario as edited can run, and if not, every reason."""
    scenario, errors = current_scenario()
    if errors:
        st.error("This scenario cannot run:\n\n" + "\n".join(f"- {e}" for e in errors))
    else:
        assert scenario is not None
        st.success(f"Valid: {scenario.name}. Open Results to simulate it.")


def _files(data: dict[str, Any]) -> None:
    st.download_button(
        "Save scenario YAML",
        scenario_yaml(data),
        file_name=f"{data.get('name', 'scenario')}.yaml",
        mime="application/x-yaml",
        key="save_yaml",
    )
    pasted = st.text_area("Paste scenario YAML", key="pasted_yaml", height=150)
    if st.button("Use pasted YAML", key="use_pasted") and pasted.strip():
        parsed = parse_yaml_text(pasted, "pasted YAML")
        _accept(parsed.scenario, parsed.errors)
    uploaded = st.file_uploader("Load scenario YAML", type=["yaml", "yml"], key="yaml_upload")
    if uploaded is None:  # removed: the same file uploaded again loads again
        st.session_state.pop("yaml_upload_seen", None)
    elif _first_sight("yaml_upload", uploaded.getvalue()):
        parsed = parse_upload(uploaded.getvalue(), "uploaded scenario")
        _accept(parsed.scenario, parsed.errors)
    trace = st.file_uploader("Replay a trace (CSV or JSONL)", type=["csv", "jsonl"], key="trace")
    if trace is None:
        st.session_state.pop("trace_seen", None)
    elif _first_sight("trace", trace.getvalue()):
        path, error = store_trace(
            trace.getvalue(), Path(trace.name).suffix.lower(), upload_directory()
        )
        if error:
            st.error(error)
        else:
            workload = data.setdefault("workload", {})
            for key in ("prompt_tokens", "output_tokens", "prefix", "arrival"):
                workload.pop(key, None)
            workload["trace"] = {"path": str(path)}
            st.success("Trace loaded: the workload now replays it.")


def _first_sight(uploader: str, content: bytes) -> bool:
    """Whether this upload is new: a file stays in its uploader across reruns, and loading it
    again on every rerun would undo each edit made since."""
    key = f"{uploader}_seen"
    digest = hashlib.sha256(content).hexdigest()
    if st.session_state.get(key) == digest:
        return False
    st.session_state[key] = digest
    return True


def _accept(scenario: Any, errors: list[str]) -> None:
    if errors:
        st.error("Not loaded:\n\n" + "\n".join(f"- {e}" for e in errors))
        return
    load_scenario(scenario.model_dump(mode="json", exclude_none=True), "Loaded.")


#: The page's tabs, in order: label and the function that renders the tab's knobs into the
#: scenario dict.
TABS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("Model & GPU", _model_and_gpu),
    ("Workload", _workload),
    ("Engine", _engine),
    ("Fleet & autoscaling", _fleet),
    ("SLOs & cost", _slo_and_cost),
    ("YAML & trace", _files),
]


main()
