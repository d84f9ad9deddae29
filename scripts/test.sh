#!/usr/bin/env bash
# The test command: set up whatever is missing, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
# Two workers, whole files each (a file's module fixtures, e.g. a trained model, are built
# once): most of the suite is XLA compilation, which uses one core.
exec .venv/bin/python -m pytest -q --durations=15 -n "${DYNJAX_TEST_WORKERS:-2}" --dist loadfile "$@"
