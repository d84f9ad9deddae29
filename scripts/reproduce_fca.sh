#!/usr/bin/env bash
# The paper's FeatureGate experiment at CPU scale, in one command:
#   1. tiny dense / uniform (mass-matched to the feature_gate run of the same seed) /
#      layer_static / feature_gate models, SEEDS seeds each, on the embedded corpus;
#   2. their test bits-per-byte table (the paper's Table 1 analogue);
#   3. the full Frozen-Controller Audit of the feature_gate seeds.
# Resumable: finished runs are skipped (train.py resumes unfinished ones).
#   bash scripts/reproduce_fca.sh            # OUT=runs/fca SEEDS="0 1 2" STEPS=400
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
OUT=${OUT:-runs/fca}
SEEDS=${SEEDS:-0 1 2}
STEPS=${STEPS:-400}
PY=.venv/bin/python
train() {  # variant seed [extra flags]
  local dir="$OUT/$1_s$2"
  [ -f "$dir/eval.json" ] && [ "$(find "$dir/checkpoints" -maxdepth 1 -name "$STEPS" | wc -l)" = 1 ] && return
  $PY train.py --config="configs/tiny.py:$1" --workdir="$dir" --config.seed="$2" \
    --config.train.steps="$STEPS" "${@:3}"
}
for s in $SEEDS; do train feature_gate "$s"; done
for s in $SEEDS; do
  train uniform "$s" --config.mass_match_run="$OUT/feature_gate_s$s"
  train layer_static "$s"
  train dense "$s"
done
$PY scripts/bpb_table.py "$OUT" | tee "$OUT/bpb_table.md"
fg_runs=$(for s in $SEEDS; do echo "$OUT/feature_gate_s$s"; done)
$PY audit.py --config=configs/audit_tiny.py --out="$OUT/audit_feature_gate" --checkpoints $fg_runs
