#!/usr/bin/env bash
# The test command: set up whatever is missing, then run the whole suite; with --quick, only
# the unit tier (tests/unit: in process, the inner loop). Other arguments go to pytest.
set -euo pipefail
tier=()
if [ "${1:-}" = "--quick" ]; then shift; tier=(tests/unit); fi
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
# Most of the suite is XLA compilation, and many tests compile the same program (a train.py
# run and its resume, one model in several files). One compilation cache for the run, shared by
# both workers and every subprocess a test starts; empty at the start (a cold run, as on a fresh
# clone) and removed at the end. No size limit: with one, JAX lists and reads every entry on
# each write to find what to evict, and at the suite's ~10^4 entries that made the suite about
# a third slower (6 files, 2 workers: 332 s with a limit, 222 s without, 262 s with no cache).
# Without the limit there is no lock either: a process that reads an entry another is still
# writing gets a truncated zlib stream, which JAX reports as a warning and compiles afresh.
export JAX_COMPILATION_CACHE_DIR="${DYNJAX_TEST_XLA_CACHE:-$(mktemp -d -t dynjax-xla-cache.XXXXXX)}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
unset JAX_COMPILATION_CACHE_MAX_SIZE
[ -n "${DYNJAX_TEST_XLA_CACHE:-}" ] || trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
# Two workers, whole files each (a file's module fixtures, e.g. a trained model, are built
# once): compilation uses one core. Files go out longest first (tests/durations.json, kept
# by scripts/test_durations.py; tests/conftest.py orders them), not xdist's most-tests first.
.venv/bin/python -m pytest -q --durations=15 -n "${DYNJAX_TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder "${tier[@]}" "$@"
