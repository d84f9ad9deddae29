#!/usr/bin/env bash
# The main job: set up whatever is missing, train the default tiny FeatureGate model on the
# embedded corpus (resuming if the run exists) and print its test bits/byte, then audit it
# with the Frozen-Controller Audit and print the verdict. Extra flags go to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
RUN=${RUN:-runs/main}
.venv/bin/python train.py --config=configs/tiny.py:feature_gate --workdir="$RUN/feature_gate" "$@"
.venv/bin/python audit.py --config=configs/audit_tiny.py --out="$RUN/audit" \
  --checkpoints "$RUN/feature_gate"
