#!/usr/bin/env bash
# The main job: set up whatever is missing, train the default tiny FeatureGate model on the
# embedded corpus (resuming if runs/main/feature_gate exists) and print its test bits/byte.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
RUN=${RUN:-runs/main}
.venv/bin/python train.py --config=configs/tiny.py:feature_gate --workdir="$RUN/feature_gate" "$@"
