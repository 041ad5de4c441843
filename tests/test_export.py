"""The production artefacts of a plan: the vllm serve line and Kubernetes manifests."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sim.catalog.hardware import GPU_CATALOG
from sim.catalog.models import MODEL_CATALOG, get_model
from sim.planning.export import (
    DEFAULT_VLLM_VERSION,
    GPU_PRODUCT_LABEL,
    GPU_PRODUCTS,
    HF_IDS,
    kubernetes_manifests,
    vllm_serve_command,
)
from sim.scenario import Scenario, load_scenario, parse_scenario
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
    assert service["spec"]["selector"].items() <= labels.items()
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


def manifests(scenario: Scenario) -> list[dict]:
    """The scenario's manifests, each checked against the Kubernetes OpenAPI schema."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    documents = list(yaml.safe_load_all(kubernetes_manifests(scenario)))
    for document in documents:
        # strict: an unknown field (a typo) is an error, as `kubectl apply` would say.
        kubernetes_validate.validate(document, "1.37.0", strict=True)
    return documents


def flags(args: list[str]) -> dict[str, str]:
    return {
        word: args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        for i, word in enumerate(args)
        if word.startswith("--")
    }


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_every_example_scenario_exports_valid_manifests() -> None:
    for path in sorted((REPO / "scenarios").glob("*.yaml")):
        scenario = load_scenario(path)
        if scenario.engine.batching != "continuous":
            continue  # a vLLM server only batches continuously; the exporter refuses
        assert manifests(scenario), path


def test_a_schema_error_is_caught() -> None:
    """The schema check can fail: a wrong type in a Deployment is reported."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = manifests(parse_scenario(scenario_dict()))[0]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.37.0", strict=True)


def test_a_disaggregated_plan_is_a_prefill_and_a_decode_deployment() -> None:
    scenario = parse_scenario(
        scenario_dict(
            name="pd",
            fleet={
                "disaggregation": {
                    "prefill": {"replicas": 2, "gpu": "h200", "tensor_parallel_size": 2},
                    "decode": {"replicas": 3},
                }
            },
        )
    )
    documents = manifests(scenario)
    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [
        ("Deployment", "pd-prefill"),
        ("Deployment", "pd-decode"),
        ("Service", "pd-prefill"),
        ("Service", "pd-decode"),
    ]
    prefill, decode, prefill_service, decode_service = documents
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (2, 3)
    assert container(prefill)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container(decode)["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert flags(container(prefill)["args"])["--tensor-parallel-size"] == "2"
    for deployment in (prefill, decode):
        config = json.loads(flags(container(deployment)["args"])["--kv-transfer-config"])
        assert config["kv_connector"] == "NixlConnector"
    selector = prefill["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {GPU_PRODUCT_LABEL: "NVIDIA-H200"}
    assert decode["spec"]["template"]["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == (
        "NVIDIA-H100-80GB-HBM3"
    )
    # Each Service reaches its own pool only.
    assert prefill_service["spec"]["selector"] == prefill["spec"]["selector"]["matchLabels"]
    assert decode_service["spec"]["selector"] == decode["spec"]["selector"]["matchLabels"]
    lines = vllm_serve_command(scenario).splitlines()
    assert [line.split(":")[0] for line in lines[::2]] == [
        "# prefill pool-prefill",
        "# decode pool-decode",
    ]


def test_mixed_pools_are_one_deployment_each_behind_one_service() -> None:
    scenario = parse_scenario(
        scenario_dict(
            name="mixed",
            fleet={"pools": [{"replicas": 1, "gpu": "a100-80gb-sxm"}, {"replicas": 2}]},
        )
    )
    *deployments, service = manifests(scenario)
    assert [d["metadata"]["name"] for d in deployments] == ["mixed-pool-0", "mixed-pool-1"]
    products = [d["spec"]["template"]["spec"]["nodeSelector"] for d in deployments]
    assert products == [
        {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"},
        {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"},
    ]
    for deployment in deployments:
        assert (
            service["spec"]["selector"].items()
            <= deployment["spec"]["selector"]["matchLabels"].items()
        )


def test_quantized_weights_export_their_quantization() -> None:
    def exported(**fields: object) -> tuple[str, dict[str, str]]:
        words = shlex.split(vllm_serve_command(parse_scenario(scenario_dict(**fields))))
        return words[2], flags(words)

    # A public AWQ checkpoint where one is known: vLLM reads its method (and runs it with
    # Marlin) from its config. Without one, the 16-bit id under awq_marlin, which vLLM refuses
    # rather than serve weights the plan did not simulate.
    model, int4 = exported(dtype="int4")
    assert model == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    assert "--quantization" not in int4
    model, int4 = exported(model="qwen2.5-7b", dtype="int4")
    assert model == "Qwen/Qwen2.5-7B" and int4["--quantization"] == "awq_marlin"
    _, int8 = exported(dtype="int8")
    assert int8["--quantization"] == "compressed-tensors"
    _, nf4 = exported(dtype="int4", quantization="bitsandbytes")
    assert nf4["--quantization"] == "bitsandbytes"
    model, bf16 = exported()
    assert "--quantization" not in bf16 and model == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(
    ("checkpoint", "dtype"),
    [
        ("Qwen/Qwen3-8B-FP8", "fp8"),
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", "fp8"),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "int8"),
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "int4"),
    ],
)
def test_a_named_quantized_checkpoint_is_served_as_named(checkpoint: str, dtype: str) -> None:
    # Its weights are simulated at the dtype its name says; vLLM reads the method from its
    # config, so no --quantization (one naming another method is refused).
    scenario = parse_scenario(scenario_dict(model=checkpoint))
    assert scenario.dtype == dtype
    words = shlex.split(vllm_serve_command(scenario))
    assert words[2] == checkpoint and "--quantization" not in flags(words)
    nf4 = parse_scenario(scenario_dict(model="unsloth/Llama-3.2-1B-bnb-4bit"))
    assert flags(shlex.split(vllm_serve_command(nf4)))["--quantization"] == "bitsandbytes"


def test_the_flags_follow_the_model_served_not_the_scenarios_name() -> None:
    # The scenario names the base model at fp8; the server is launched with an fp8 checkpoint,
    # whose own method vLLM reads: no --quantization fp8 beside it. A local 16-bit copy of a
    # quantized scenario's model is quantized on the fly, as simulated.
    base = parse_scenario(scenario_dict(model="llama-3.1-8b", dtype="fp8"))
    served = "RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic"
    assert "--quantization" not in flags(shlex.split(vllm_serve_command(base, served)))
    assert flags(shlex.split(vllm_serve_command(base)))["--quantization"] == "fp8"
    named = parse_scenario(scenario_dict(model="Qwen/Qwen3-8B-FP8"))
    local = flags(shlex.split(vllm_serve_command(named, "/models/qwen3-8b")))
    assert local["--quantization"] == "fp8"


def test_the_image_is_pinned_to_the_plans_vllm_version() -> None:
    default = manifests(parse_scenario(scenario_dict()))[0]
    assert container(default)["image"] == f"vllm/vllm-openai:v{DEFAULT_VLLM_VERSION}"
    pinned = manifests(parse_scenario(scenario_dict(engine={"vllm_version": "0.11.0"})))[0]
    assert container(pinned)["image"] == "vllm/vllm-openai:v0.11.0"


def test_every_catalogue_gpu_has_a_node_label_and_a_custom_one_says_so() -> None:
    assert set(GPU_PRODUCTS) == set(GPU_CATALOG)
    custom = parse_scenario(
        scenario_dict(
            gpu={
                "name": "mi300x",
                "memory_gb": 192,
                "memory_bandwidth_tb_s": 5.3,
                "bf16_tflops": 1307,
            }
        )
    )
    deployment = manifests(custom)[0]
    assert "nodeSelector" not in deployment["spec"]["template"]["spec"]
    assert "nodeSelector" in deployment["metadata"]["annotations"]["servesim/gpu"]


def test_expert_parallel_reaches_the_serve_line() -> None:
    scenario = parse_scenario(
        scenario_dict(
            model="qwen3-30b-a3b",
            engine={"tensor_parallel_size": 2, "enable_expert_parallel": True},
        )
    )
    assert "--enable-expert-parallel" in shlex.split(vllm_serve_command(scenario))


def test_every_catalogue_model_exports_a_hugging_face_id_that_resolves_back_to_it() -> None:
    public = set(MODEL_CATALOG) - {"servesim-tiny-llama"}  # generated locally, never published
    assert public <= set(HF_IDS), f"no Hugging Face id for {sorted(public - set(HF_IDS))}"
    for key, hf_id in HF_IDS.items():
        assert "/" in hf_id and get_model(hf_id).name == key


def test_a_pool_on_another_gpu_is_served_with_the_batch_limits_it_was_simulated_with() -> None:
    fleet = {
        "disaggregation": {"prefill": {"replicas": 1, "gpu": "l40s"}, "decode": {"replicas": 1}}
    }
    prefill, decode = manifests(parse_scenario(scenario_dict(name="pd", fleet=fleet)))[:2]
    # vLLM's own defaults on each pool's GPU, as the scenario left the limits out.
    assert flags(container(prefill)["args"])["--max-num-seqs"] == "256"
    assert flags(container(prefill)["args"])["--max-num-batched-tokens"] == "2048"
    assert flags(container(decode)["args"])["--max-num-seqs"] == "1024"
