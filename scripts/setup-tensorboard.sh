#!/usr/bin/env bash
# Installs the `tensorboard` Python package into the project's .venv, for
# scripts/read_tensorboard.py and the test that reads a run's event files back with it
# (crates/skein/tests/tracking.rs). Idempotent: does nothing when the package imports.
set -euo pipefail
cd "$(dirname "$0")/.."

# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh

reader=tensorboard.backend.event_processing.event_file_loader
if ! .venv/bin/python -c "import $reader" 2>/dev/null; then
  echo "skein setup: installing tensorboard (PyPI tensorboard) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "tensorboard>=2.14,<3"
  .venv/bin/python -c "import $reader" || {
    echo "skein setup: tensorboard installed but does not import; reinstall with: .venv/bin/pip install --force-reinstall tensorboard" >&2
    exit 1
  }
fi
