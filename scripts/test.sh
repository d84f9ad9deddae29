#!/usr/bin/env bash
# The test command: set up whatever is missing, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q --durations=15 "$@"
