# Sourced by reproduce_fca.sh and compare_fca.sh: the shared set-up and how one run is trained.
#   OUT (runs/fca), SEEDS ("0 1 2"), STEPS (400), TRAIN_FLAGS (extra train.py flags, every
#   run), AUDIT_FLAGS (extra audit.py flags, every audit)
# train CONFIG NAME SEED [FLAGS...] trains OUT/NAME_sSEED for STEPS steps, unless it has
# finished (eval.json and the STEPS checkpoint); train.py resumes an unfinished one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
bash scripts/setup.sh
OUT=${OUT:-runs/fca}
SEEDS=${SEEDS:-0 1 2}
STEPS=${STEPS:-400}
TRAIN_FLAGS=${TRAIN_FLAGS:-}
AUDIT_FLAGS=${AUDIT_FLAGS:-}
PY=.venv/bin/python
train() {
  local dir="$OUT/$2_s$3"
  [ -f "$dir/eval.json" ] && [ "$(find "$dir/checkpoints" -maxdepth 1 -name "$STEPS" | wc -l)" = 1 ] && return
  # shellcheck disable=SC2086
  $PY train.py --config="$1" --workdir="$dir" --config.seed="$3" --config.train.steps="$STEPS" \
    "${@:4}" $TRAIN_FLAGS
}
