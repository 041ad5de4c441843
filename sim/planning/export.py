"""What a planned configuration looks like in production: the ``vllm serve`` command lines and
Kubernetes Deployments + Services + HorizontalPodAutoscaler, generated in memory from a scenario.

The manifests follow the shapes documented for ``apps/v1`` Deployments, ``v1`` Services and
``autoscaling/v2`` HorizontalPodAutoscalers, and tests/test_export.py validates them against
the Kubernetes OpenAPI schema (kubernetes-validate). The HPA scales on an External metric named
``vllm_ttft_p<percentile>_ms`` (``target.type: Value``): that series has to be provided by a
metrics adapter (for example prometheus-adapter computing ``histogram_quantile`` over
``vllm:time_to_first_token_seconds``), which the manifest's annotation says.

A fleet becomes one Deployment per pool: one for identical replicas, one per pool of a mixed
fleet (each on its own GPU type, behind one Service), and a prefill and a decode Deployment for a
disaggregated fleet (each with its own Service; a P/D-aware proxy such as llm-d's sends each
request to both). Every pod asks for its GPUs and is pinned to its GPU type by the node label
NVIDIA's GPU Feature Discovery sets, and runs the vLLM image of a pinned version.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from sim.catalog.model_names import checkpoint_quantization
from sim.scenario import CustomGPUSpec, Scenario
from sim.serve_flags import scenario_dtype_args, vllm_serve_args

#: The container image the Deployments run (vLLM's OpenAI-compatible server), tagged
#: ``v<version>``: the scenario's ``engine.vllm_version``, else DEFAULT_VLLM_VERSION.
VLLM_IMAGE = "vllm/vllm-openai"
#: The vLLM release the default (roofline) model was scored against: the real H100 runs in
#: shared/data/real_gpu_runs served with vLLM 0.15.1 (benchmarks/fidelity_gpu.py). A plan is
#: exported for the version it was simulated for, never ``:latest``, whose scheduler may differ.
DEFAULT_VLLM_VERSION = "0.15.1"
#: The port the server listens on inside the pod.
PORT = 8000
#: The node label NVIDIA's GPU Feature Discovery puts on each GPU node: the product name as
#: ``nvidia-smi --query-gpu=name`` prints it, spaces as dashes
#: (https://github.com/NVIDIA/k8s-device-plugin, "GPU Feature Discovery" labels).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: ``nvidia-smi`` product names of the catalogue GPUs (e.g. the RTX 4090 run in
#: shared/data/vllm_real_runs reports "NVIDIA GeForce RTX 4090"; the H100 SXM runs in
#: shared/data/real_gpu_runs "H100-80GB-HBM3").
GPU_PRODUCTS = {
    "a100-40gb-sxm": "NVIDIA A100-SXM4-40GB",
    "a100-80gb-sxm": "NVIDIA A100-SXM4-80GB",
    "a100-40gb-pcie": "NVIDIA A100-PCIE-40GB",
    "a100-80gb-pcie": "NVIDIA A100 80GB PCIe",
    "h100-sxm": "NVIDIA H100 80GB HBM3",
    "h100-pcie": "NVIDIA H100 PCIe",
    "h100-nvl": "NVIDIA H100 NVL",
    "h200-nvl": "NVIDIA H200 NVL",
    "h200": "NVIDIA H200",
    "l40s": "NVIDIA L40S",
    "l4": "NVIDIA L4",
    "b200": "NVIDIA B200",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
}
#: The KV connector a disaggregated pair exchanges KV blocks through: vLLM's NixlConnector, in
#: the role both pools take in its usage guide
#: (https://docs.vllm.ai/en/stable/features/nixl_connector_usage.html).
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


#: Hugging Face repositories of the catalogue models (the config.json each was read from, as
#: cited in sim/models.py), for ``--model``.
HF_IDS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "codellama-7b": "codellama/CodeLlama-7b-hf",
    "codellama-13b": "codellama/CodeLlama-13b-hf",
    "codellama-34b": "codellama/CodeLlama-34b-hf",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-14b": "Qwen/Qwen3-14B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "mistral-nemo-12b": "mistralai/Mistral-Nemo-Instruct-2407",
    "mistral-small-24b": "mistralai/Mistral-Small-24B-Instruct-2501",
    "phi-4": "microsoft/phi-4",
    "deepseek-r1-distill-qwen-1.5b": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}
#: Public AWQ int4 checkpoints of catalogue models (Hugging Face's hugging-quants collection of
#: the Llama 3.1 Instruct models), for ``--model`` when the weights are int4. Other int4 or int8
#: plans keep the 16-bit id, which vLLM refuses with the ``--quantization`` flag: pass the
#: quantized checkpoint as ``model``.
HF_INT4_IDS = {
    "llama-3.1-8b": "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    "llama-3.1-70b": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    "llama-3.1-405b": "hugging-quants/Meta-Llama-3.1-405B-Instruct-AWQ-INT4",
}


def _model_id(scenario: Scenario) -> str:
    """What ``--model`` gets: a quantized checkpoint the scenario names, as named; else the
    catalogue model's Hugging Face id (its int4 checkpoint for int4 weights, where one is
    known), else its name."""
    if isinstance(scenario.model, str) and checkpoint_quantization(scenario.model) is not None:
        return scenario.model.strip()
    name = scenario.resolve_model().name
    if scenario.dtype == "int4" and scenario.quantization != "bitsandbytes":
        return HF_INT4_IDS.get(name, HF_IDS.get(name, name))
    return HF_IDS.get(name, name)


def image(scenario: Scenario) -> str:
    """The vLLM image of the version the plan is for (never ``:latest``)."""
    version = scenario.engine.vllm_version or DEFAULT_VLLM_VERSION
    return f"{VLLM_IMAGE}:v{version.removeprefix('v')}"


@dataclass(frozen=True)
class Pool:
    """One Deployment's worth of identical servers: its name suffix and role, its size, GPU
    and tensor-parallel size, and the flags beyond the scenario's."""

    suffix: str
    role: str
    replicas: int
    gpu: str | CustomGPUSpec
    tensor_parallel_size: int
    extra_args: tuple[str, ...] = ()


def pools(scenario: Scenario) -> list[Pool]:
    """The fleet as Deployments: one for identical replicas (the HPA's minimum when
    autoscaled), one per pool of a mixed fleet, a prefill and a decode one when disaggregated."""
    fleet, engine = scenario.fleet, scenario.engine
    tp = engine.tensor_parallel_size
    if fleet.disaggregation is not None:
        kv = ("--kv-transfer-config", json.dumps(KV_TRANSFER_CONFIG, separators=(",", ":")))
        return [
            Pool(
                f"-{role}",
                role,
                spec.replicas,
                spec.gpu or scenario.gpu,
                spec.tensor_parallel_size or tp,
                kv,
            )
            for role, spec in (
                ("prefill", fleet.disaggregation.prefill),
                ("decode", fleet.disaggregation.decode),
            )
        ]
    if fleet.pools is not None:
        return [
            Pool(
                f"-pool-{i}",
                "serve",
                spec.replicas,
                spec.gpu or scenario.gpu,
                spec.tensor_parallel_size or tp,
            )
            for i, spec in enumerate(fleet.pools)
        ]
    replicas = fleet.autoscaling.min_replicas if fleet.autoscaling else fleet.replicas
    return [Pool("", "serve", replicas, scenario.gpu, tp)]


def serve_args(scenario: Scenario, model: str | None = None, pool: Pool | None = None) -> list[str]:
    """The flags of ``vllm serve`` for the scenario's engine knobs, TP/PP and quantization (and
    a pool's own TP and KV-transfer flags)."""
    model = model or _model_id(scenario)
    torch_dtype, extra = scenario_dtype_args(scenario, model)
    engine = scenario.engine
    if pool is not None:
        # The pool's own GPU and TP, and the batch limits vLLM picks there if the scenario
        # left them out (as the simulation ran it).
        engine = scenario.on_pool(pool.gpu, pool.tensor_parallel_size).engine
        extra = [*extra, *pool.extra_args]
    return vllm_serve_args(model, engine, dtype=torch_dtype, extra_args=extra)


def vllm_serve_command(scenario: Scenario, model: str | None = None) -> str:
    """The shell line that starts the configuration's server; a fleet of several pools gets
    one line per pool, each after a comment naming the pool and its size."""
    lines = []
    fleet = pools(scenario)
    for pool in fleet:
        args = serve_args(scenario, model, pool)
        # `vllm serve` takes the model as its first positional argument.
        model_index = args.index("--model")
        model_name = args[model_index + 1]
        rest = args[:model_index] + args[model_index + 2 :]
        if len(fleet) > 1:
            lines.append(f"# {pool.role} pool{pool.suffix}: {pool.replicas} × on {_gpu_key(pool)}")
        lines.append(shlex.join(["vllm", "serve", model_name, *rest, "--port", str(PORT)]))
    return "\n".join(lines)


def _gpu_key(pool: Pool) -> str:
    return pool.gpu if isinstance(pool.gpu, str) else pool.gpu.name


def kubernetes_manifests(scenario: Scenario, model: str | None = None) -> str:
    """Deployments, Services and (with autoscaling) an HPA for the scenario, as one YAML stream."""
    name = _dns_name(scenario.name)
    documents: list[dict[str, Any]] = []
    services: list[dict[str, Any]] = []
    fleet = pools(scenario)
    app_labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "vllm"}
    for pool in fleet:
        labels = {**app_labels, "servesim/pool": pool.suffix.lstrip("-") or "serve"}
        documents.append(_deployment(scenario, model, pool, name + pool.suffix, labels))
        if pool.role in ("prefill", "decode"):
            services.append(_service(name + pool.suffix, labels))
    if not services:  # one router in front of every pool
        services.append(_service(name, app_labels))
    documents += services
    scaling = scenario.fleet.autoscaling
    if scaling is not None:
        documents.append(_hpa(name, app_labels, scaling))
    return yaml.dump_all(documents, Dumper=_NoAliases, sort_keys=False)


def _deployment(
    scenario: Scenario, model: str | None, pool: Pool, name: str, labels: dict[str, str]
) -> dict[str, Any]:
    """One pool's Deployment: its pods ask for their GPUs and run on nodes of their GPU type."""
    gpus = pool.tensor_parallel_size * scenario.engine.pipeline_parallel_size
    pod: dict[str, Any] = {
        "containers": [
            {
                "name": "vllm",
                "image": image(scenario),
                "args": [*serve_args(scenario, model, pool), "--port", str(PORT)],
                "ports": [{"name": "http", "containerPort": PORT}],
                "resources": {
                    "requests": {"nvidia.com/gpu": gpus},
                    "limits": {"nvidia.com/gpu": gpus},
                },
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": PORT},
                    "periodSeconds": 5,
                },
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            }
        ],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
    }
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    product = GPU_PRODUCTS.get(pool.gpu) if isinstance(pool.gpu, str) else None
    if product is not None:
        pod["nodeSelector"] = {GPU_PRODUCT_LABEL: product.replace(" ", "-")}
    else:
        metadata["annotations"] = {
            "servesim/gpu": f"{_gpu_key(pool)}: set a nodeSelector for its nodes' GPU label"
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": pool.replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _service(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }


class _NoAliases(yaml.SafeDumper):
    """Repeated label maps written out in full (no &anchors), as people write manifests."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _hpa(name: str, labels: dict[str, str], scaling: Any) -> dict[str, Any]:
    metric_name = {
        "ttft_ms": f"vllm_ttft_p{scaling.percentile:g}_ms",
        "waiting_per_replica": "vllm_num_requests_waiting",
        "running_per_replica": "vllm_num_requests_running",
        "kv_usage": "vllm_kv_cache_usage_perc",
    }[scaling.metric]
    if scaling.metric == "ttft_ms":
        metric: dict[str, Any] = {
            "type": "External",
            "external": {
                "metric": {"name": metric_name, "selector": {"matchLabels": labels}},
                "target": {"type": "Value", "value": f"{scaling.target:g}"},
            },
        }
    else:
        metric = {
            "type": "Pods",
            "pods": {
                "metric": {"name": metric_name},
                "target": {"type": "AverageValue", "averageValue": f"{scaling.target:g}"},
            },
        }

    def rules(spec: Any) -> dict[str, Any]:
        return {
            "stabilizationWindowSeconds": int(spec.stabilization_window_s),
            "selectPolicy": {"max": "Max", "min": "Min", "disabled": "Disabled"}[spec.select],
            "policies": [
                {
                    "type": "Pods" if p.type == "pods" else "Percent",
                    "value": int(p.value),
                    "periodSeconds": int(p.period_s),
                }
                for p in spec.policies
            ],
        }

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "servesim/metric-source": (
                    f"{metric_name} must be served by a metrics adapter, e.g. prometheus-adapter "
                    "over vLLM's /metrics"
                )
            },
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [metric],
            "behavior": {
                "scaleUp": rules(scaling.scale_up),
                "scaleDown": rules(scaling.scale_down),
            },
        },
    }


def _dns_name(text: str) -> str:
    """A Kubernetes object name (RFC 1123 label) from a scenario name."""
    cleaned = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    while "--" in cleaned:
        cleaned = cleaned.replace("--", "-")
    return (cleaned or "servesim")[:63].rstrip("-")
