#!/usr/bin/env bash
# Installs TRL (PyPI trl, the version docs/trl-comparison.md measured) into the project's
# .venv, for scripts/compare-trl/. Nothing else of skein needs it. Idempotent: does nothing
# when that version imports.
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.16.0
# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh

installed() {
  .venv/bin/python -c "import trl, sys; sys.exit(trl.__version__ != '$version')" 2>/dev/null
}
if ! installed; then
  echo "skein setup: installing trl $version (PyPI trl) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "trl==$version"
  installed || {
    echo "skein setup: trl $version installed but does not import; reinstall with: .venv/bin/pip install --force-reinstall trl==$version" >&2
    exit 1
  }
fi
