"""The production artefacts of a plan: the vllm serve line and Kubernetes manifests."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sim.planning.export import kubernetes_manifests, vllm_serve_command
from sim.scenario import load_scenario, parse_scenario
from tests.factories import scenario_dict

REPO = Path(__file__).parents[1]


def test_serve_command_carries_the_configuration() -> None:
    scenario = parse_scenario(
        scenario_dict(
            dtype="fp8",
            engine={"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "max_model_len": 8192},
        )
    )
    words = shlex.split(vllm_serve_command(scenario))
    assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    flags: dict[str, str] = {}
    for i, word in enumerate(words[3:], start=3):
        if word.startswith("--"):
            following = words[i + 1] if i + 1 < len(words) else ""
            flags[word] = "" if following.startswith("--") else following
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--pipeline-parallel-size"] == "2"
    assert flags["--quantization"] == "fp8"
    assert flags["--max-model-len"] == "8192"
    assert "--model" not in words  # the model is the positional argument
    custom = shlex.split(vllm_serve_command(scenario, "/models/my-llama"))
    assert custom[2] == "/models/my-llama"


def test_manifests_for_an_autoscaled_fleet() -> None:
    scenario = load_scenario(REPO / "scenarios" / "fleet_autoscaling.yaml")
    documents = list(yaml.safe_load_all(kubernetes_manifests(scenario)))
    kinds = [d["kind"] for d in documents]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    deployment, service, hpa = documents
    assert deployment["apiVersion"] == "apps/v1" and hpa["apiVersion"] == "autoscaling/v2"
    assert deployment["spec"]["replicas"] == 1  # the HPA's minimum
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"][:2] == ["--model", "meta-llama/Llama-3.1-8B"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    assert service["spec"]["selector"] == labels
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 6)
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    metric = spec["metrics"][0]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "Value", "value": "500"}
    assert metric["external"]["metric"]["name"] == "vllm_ttft_p90_ms"
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert spec["behavior"]["scaleUp"]["policies"] == [
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ]
    name = deployment["metadata"]["name"]
    assert name == "chat-hpa-h100" and len(name) <= 63


def test_a_fixed_fleet_has_no_hpa_and_its_replica_count() -> None:
    scenario = parse_scenario(
        scenario_dict(
            name="My Chat Service!", fleet={"replicas": 3}, engine={"tensor_parallel_size": 4}
        )
    )
    documents = list(yaml.safe_load_all(kubernetes_manifests(scenario)))
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    assert documents[0]["spec"]["replicas"] == 3
    assert documents[0]["metadata"]["name"] == "my-chat-service"
    limits = documents[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 4


def _cluster_reachable() -> bool:
    if shutil.which("kubectl") is None:
        return False
    probe = subprocess.run(
        ["kubectl", "version", "--request-timeout=3s"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _cluster_reachable(), reason="kubectl has no API server to dry-run on")
def test_kubectl_accepts_the_manifests(tmp_path: Path) -> None:
    path = tmp_path / "k8s.yaml"
    path.write_text(
        kubernetes_manifests(load_scenario(REPO / "scenarios" / "fleet_autoscaling.yaml"))
    )
    result = subprocess.run(
        ["kubectl", "apply", "--dry-run=client", "-f", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_live_launcher_starts_what_the_export_prints(tmp_path: Path) -> None:
    """`live run --launch` (and so calibrate/validate --launch) once left out PP and
    bitsandbytes while the export had them: both now take their flags from sim.serve_flags."""
    pytest.importorskip("httpx")
    from live.cli import launcher
    from sim.planning.export import serve_args

    scenario = parse_scenario(
        scenario_dict(
            dtype="int8",
            quantization="bitsandbytes",
            engine={"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "block_size": 32},
        )
    )
    launched = launcher(scenario, "/models/m", tmp_path / "server.log").command
    exported = serve_args(scenario, "/models/m")

    def pairs(args: list[str]) -> set[tuple[str, str]]:
        return {
            (word, args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "")
            for i, word in enumerate(args)
            if word.startswith("--")
        }

    assert ("--pipeline-parallel-size", "2") in pairs(launched)
    assert ("--quantization", "bitsandbytes") in pairs(launched)
    # The launcher differs only where the platform does (the CPU backend here has no
    # --gpu-memory-utilization) and in where it listens.
    platform = {flag for flag, _ in pairs(exported) ^ pairs(launched)}
    assert platform <= {"--gpu-memory-utilization", "--enforce-eager", "--host", "--port"}
