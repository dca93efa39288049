#!/usr/bin/env bash
# Installs libtorch for the tch crate: the PyPI `torch` wheel in a project-local virtual
# environment, linked as .venv/torch (which .cargo/config.toml points LIBTORCH at).
# Idempotent: does nothing when the pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
PY=${PYTHON:-python3}

if [ -e .venv/torch/lib/libtorch_cpu.so ] && [ "$(cat .venv/torch.version 2>/dev/null)" = "$TORCH_VERSION" ]; then
  exit 0
fi
echo "skein setup: installing libtorch (PyPI torch==$TORCH_VERSION) into .venv — first run only, a few minutes" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
# Found without importing torch: the import warns that NumPy is missing (skein needs no NumPy).
site=$(.venv/bin/python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
ln -sfn "$site" .venv/torch
echo "$TORCH_VERSION" > .venv/torch.version
echo "skein setup: libtorch ready at $site" >&2
