#!/usr/bin/env bash
# FeatureGate and MUDD, trained in-project, under the same Frozen-Controller Audit:
#   1. tiny feature_gate runs (configs/tiny.py, exactly as experiments/reproduce_fca.sh trains
#      them, so its finished runs OUT/feature_gate_sSEED are reused, not retrained);
#   2. tiny MUDD runs (configs/mudd_tiny.py:mudd) with the same seeds, steps and data;
#   3. audit.py on each family's seeds (configs/audit_tiny.py, same settings for both);
#   4. a side-by-side table (condition, ΔNLL FeatureGate, ΔNLL MUDD, ratio), also written to
#      OUT/compare/compare_fca.md. The paper's finding: MUDD's reassignment penalties
#      (cross_input, token_shuffle) are orders of magnitude above FeatureGate's.
# Resumable: finished runs are skipped (train.py resumes unfinished ones); audits are rerun.
# Do not run it while reproduce_fca.sh is training the same OUT (both would train a seed).
#   bash experiments/compare_fca.sh            # OUT=runs/fca SEEDS="0 1 2" STEPS=400
# Extra flags: TRAIN_FLAGS for both families' train.py, AUDIT_FLAGS for both audits, e.g. a
# quick smoke test:
#   OUT=/tmp/fca SEEDS=0 STEPS=20 TRAIN_FLAGS="--config.eval.windows=16" \
#     AUDIT_FLAGS="--config.reassignments=2 --config.data.calib_windows=8 \
#     --config.data.eval_windows=8 --config.stats.n_resamples=99" bash experiments/compare_fca.sh
source "$(dirname "$0")/fca_common.sh"
audit() {  # name
  # shellcheck disable=SC2086
  $PY audit.py --config=configs/audit_tiny.py --out="$OUT/compare/audit_$1" $AUDIT_FLAGS \
    --checkpoints $(for s in $SEEDS; do echo "$OUT/$1_s$s"; done)
}
for s in $SEEDS; do train configs/tiny.py:feature_gate feature_gate "$s"; done
for s in $SEEDS; do train configs/mudd_tiny.py:mudd mudd "$s"; done
audit feature_gate
audit mudd
mkdir -p "$OUT/compare"
$PY experiments/compare_fca.py "$OUT/compare/audit_feature_gate/results.json" \
  "$OUT/compare/audit_mudd/results.json" | tee "$OUT/compare/compare_fca.md"
