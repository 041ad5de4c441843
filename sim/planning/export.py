"""What a planned configuration looks like in production: the ``vllm serve`` command line and a
Kubernetes Deployment + Service + HorizontalPodAutoscaler, generated in memory from a scenario.

The manifests follow the shapes documented for ``apps/v1`` Deployments, ``v1`` Services and
``autoscaling/v2`` HorizontalPodAutoscalers. The HPA scales on an External metric named
``vllm_ttft_p<percentile>_ms`` (``target.type: Value``): that series has to be provided by a
metrics adapter (for example prometheus-adapter computing ``histogram_quantile`` over
``vllm:time_to_first_token_seconds``), which the manifest's annotation says.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from sim.scenario import Scenario
from sim.serve_flags import scenario_dtype_args, vllm_serve_args

#: The container image the Deployment runs (vLLM's OpenAI-compatible server).
VLLM_IMAGE = "vllm/vllm-openai:latest"
#: The port the server listens on inside the pod.
PORT = 8000


#: Hugging Face repositories of the catalogue models (the config.json each was read from, as
#: cited in sim/models.py), for ``--model``.
HF_IDS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B",
}


def _model_id(scenario: Scenario) -> str:
    """What ``--model`` gets: the catalogue model's Hugging Face id, else its name."""
    name = scenario.resolve_model().name
    return HF_IDS.get(name, name)


def serve_args(scenario: Scenario, model: str | None = None) -> list[str]:
    """The flags of ``vllm serve`` for the scenario's engine knobs, TP/PP and quantization."""
    torch_dtype, extra = scenario_dtype_args(scenario)
    return vllm_serve_args(
        model or _model_id(scenario), scenario.engine, dtype=torch_dtype, extra_args=extra
    )


def vllm_serve_command(scenario: Scenario, model: str | None = None) -> str:
    """One shell line that starts the configuration's server."""
    args = serve_args(scenario, model)
    # `vllm serve` takes the model as its first positional argument.
    model_index = args.index("--model")
    model_name = args[model_index + 1]
    rest = args[:model_index] + args[model_index + 2 :]
    return shlex.join(["vllm", "serve", model_name, *rest, "--port", str(PORT)])


def kubernetes_manifests(scenario: Scenario, model: str | None = None) -> str:
    """Deployment, Service and (with autoscaling) HPA for the scenario, as one YAML stream."""
    name = _dns_name(scenario.name)
    engine = scenario.engine
    gpus = engine.tensor_parallel_size * engine.pipeline_parallel_size
    fleet = scenario.fleet
    scaling = fleet.autoscaling
    replicas = scaling.min_replicas if scaling else fleet.replicas
    args = serve_args(scenario, model)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "vllm"}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": VLLM_IMAGE,
                            "args": [*args, "--port", str(PORT)],
                            "ports": [{"name": "http", "containerPort": PORT}],
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": PORT},
                                "periodSeconds": 5,
                            },
                            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                        }
                    ],
                    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }
    documents: list[dict[str, Any]] = [deployment, service]
    if scaling is not None:
        documents.append(_hpa(name, labels, scaling))
    return yaml.dump_all(documents, Dumper=_NoAliases, sort_keys=False)


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
