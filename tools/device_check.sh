#!/usr/bin/env bash
# The GPU check of issue 15 item 6 that a session lent a device machine can run, in one call.
#
# vLLM's CUDA build cannot reach that machine: it has no network, and a call carries at most
# 64 MiB while vLLM's wheel alone is several hundred. It has PyTorch, so it times the model's own
# operators with torch (`servesim calibrate --operators torch`, CUDA events) on the real GPU and
# scores the fitted profile against the real H100 runs (benchmarks/fidelity_gpu.py --profile):
#   1. Llama-2-7B fp16, the runs' model: the torch profile's error on the real runs, beside the
#      roofline's in the same call;
#   2. Llama-3.1-8B bf16: a profile of the Llama-3.1-8B shape to ship, with its provenance (GPU,
#      driver, torch version, date) in the profile and in gpu.txt.
#
# Prepare here (downloads the project's dependencies the machine lacks, for its Python 3.12, and
# copies the real runs beside them; .device/ is kept out of git by .git/info/exclude):
#   bash tools/device_check.sh --prepare
# Then one call, with time left for a second:
#   run(command="bash tools/device_check.sh", carry=[".device"], timeout_s=480)
# Everything it writes is under $OUT: gpu.txt, the profiles, their operator tables, the
# fidelity tables, and log.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p .device/wheels
    grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    # The versions this checkout's .venv runs; the machine has numpy, pandas, scipy, pyarrow,
    # pyyaml, typer, rich and torch (../.library/device/KINDS.md).
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .device/wheels \
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 simpy==4.1.2 fastdigest==0.12.0
    cp ../shared/data/real_gpu_runs/h100_llama2_7b_inference_perf.csv .device/runs.csv
    du -sh .device
    exit 0
fi

OUT="${OUT:-runs/device}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
servesim() { python3 -c 'import sys; from servesim.cli import app; sys.argv[0] = "servesim"; app()' "$@"; }

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    date -u +%FT%TZ
} | tee "$OUT/gpu.txt"

scenario() {  # model dtype -> a one-replica H100 scenario file
    cat > "/tmp/$1.yaml" <<EOF
name: device-$1
seed: 0
model: $1
gpu: h100-sxm
dtype: $2
engine: {max_model_len: 4096}
workload:
  arrival: {type: poisson, rate: 2}
  prompt_tokens: {type: constant, value: 512}
  output_tokens: {type: constant, value: 32}
  num_requests: 20
EOF
    echo "/tmp/$1.yaml"
}

for spec in "llama-2-7b fp16" "llama-3.1-8b bf16"; do
    set -- $spec
    timeout 240 servesim calibrate "$(scenario "$1" "$2")" --operators torch --device cuda \
        --out "$OUT/h100-sxm_$1_tp1_torch.json" || echo "calibrate $1: exit $?"
done

profile="$OUT/h100-sxm_llama-2-7b_tp1_torch.json"
python3 benchmarks/fidelity_gpu.py --runs .device/runs.csv --seeds 1 --json "$OUT/fidelity-roofline.json"
if [[ -f "$profile" ]]; then
    python3 benchmarks/fidelity_gpu.py --runs .device/runs.csv --seeds 1 --profile "$profile" \
        --json "$OUT/fidelity-torch.json"
fi
