#!/usr/bin/env bash
# The paper's FeatureGate experiment at CPU scale, in one command:
#   1. tiny dense / uniform (mass-matched to the feature_gate run of the same seed) /
#      layer_static / feature_gate models, SEEDS seeds each, on the embedded corpus;
#   2. their test bits-per-byte table (the paper's Table 1 analogue);
#   3. the full Frozen-Controller Audit of the feature_gate seeds.
# Resumable: finished runs are skipped (train.py resumes unfinished ones).
# TRAIN_FLAGS / AUDIT_FLAGS add flags to every run / audit (experiments/fca_common.sh).
#   bash experiments/reproduce_fca.sh            # OUT=runs/fca SEEDS="0 1 2" STEPS=400
source "$(dirname "$0")/fca_common.sh"
for s in $SEEDS; do train configs/tiny.py:feature_gate feature_gate "$s"; done
for s in $SEEDS; do
  train configs/tiny.py:uniform uniform "$s" --config.mass_match_run="$OUT/feature_gate_s$s"
  train configs/tiny.py:layer_static layer_static "$s"
  train configs/tiny.py:dense dense "$s"
done
$PY experiments/bpb_table.py "$OUT" | tee "$OUT/bpb_table.md"
fg_runs=$(for s in $SEEDS; do echo "$OUT/feature_gate_s$s"; done)
# shellcheck disable=SC2086
$PY audit.py --config=configs/audit_tiny.py --out="$OUT/audit_feature_gate" $AUDIT_FLAGS \
  --checkpoints $fg_runs
