#!/usr/bin/env bash
# Many hosts on one machine: two CPU processes (2 simulated devices each) on 127.0.0.1 train
# the tiny FeatureGate model together, then audit it together, exactly as the hosts of a pod
# would: every process runs the same train.py / audit.py command with its own --process_id,
# JAX's runtime connects them (gloo collectives on the CPU), each process feeds only its rows
# of every batch, orbax saves and restores collectively, process 0 alone writes and prints.
#
#   bash scripts/multihost_demo.sh                 # RUN=runs/multihost STEPS=200 PORT=12421
#
# The run directory and its checkpoints are then ordinary: `train.py --workdir=$RUN/fg`
# resumes them in one process, and `audit.py` audits them on one device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
RUN=${RUN:-runs/multihost}
STEPS=${STEPS:-200}
PORT=${PORT:-12421}
export JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2

# both processes of one command; a failure in either ends the other and the script
both() {
  local pids=() status=0
  for id in 0 1; do
    .venv/bin/python "$@" --coordinator_address="127.0.0.1:$PORT" --num_processes=2 \
      --process_id=$id &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
    if [ "$status" -ne 0 ]; then kill "${pids[@]}" 2>/dev/null || true; return "$status"; fi
  done
}

both train.py --config=configs/tiny.py:feature_gate --workdir="$RUN/fg" \
  --config.train.steps="$STEPS" --config.train.ckpt_every=100 --config.eval.windows=128
both audit.py --config=configs/audit_tiny.py --out="$RUN/audit" --checkpoints "$RUN/fg" \
  --config.reassignments=5 --config.data.calib_windows=32 --config.data.eval_windows=32
