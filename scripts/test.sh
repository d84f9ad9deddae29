#!/usr/bin/env bash
# The test command: set up whatever is missing, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
# Most of the suite is XLA compilation, and many tests compile the same program (a train.py
# run and its resume, one model in several files). One compilation cache for the run, shared by
# both workers and every subprocess a test starts; empty at the start (a cold run, as on a fresh
# clone) and removed at the end. A size limit turns on JAX's file lock for concurrent writers.
export JAX_COMPILATION_CACHE_DIR="${DYNJAX_TEST_XLA_CACHE:-$(mktemp -d -t dynjax-xla-cache.XXXXXX)}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
export JAX_COMPILATION_CACHE_MAX_SIZE=$((8 << 30))
[ -n "${DYNJAX_TEST_XLA_CACHE:-}" ] || trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
# Two workers, whole files each (a file's module fixtures, e.g. a trained model, are built
# once): compilation uses one core.
.venv/bin/python -m pytest -q --durations=15 -n "${DYNJAX_TEST_WORKERS:-2}" --dist loadfile "$@"
