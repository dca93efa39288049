#!/usr/bin/env bash
# Installs libtorch for the tch crate: the PyPI `torch` wheel in a project-local virtual
# environment, linked as .venv/torch (which .cargo/config.toml points LIBTORCH at).
# Idempotent: does nothing when the pinned version is already there.
#
# The wheel's CUDA runtime headers (nvidia/cu13/include) lack the `crt/` folder they include;
# the `nvidia-cuda-crt` package of the same CUDA release has it. With it the build compiles
# its CUDA graph plugin (crates/skein/build.rs); without it skein decodes without graphs.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
PY=${PYTHON:-python3}

add_cuda_crt() {
  local include=.venv/torch/../nvidia/cu13/include
  [ -e "$include/cuda_runtime_api.h" ] && [ ! -e "$include/crt/host_defines.h" ] || return 0
  local runtime
  runtime=$(.venv/bin/python -c 'import importlib.metadata as m; print(".".join(m.version("nvidia-cuda-runtime").split(".")[:2]))' 2>/dev/null) || return 0
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-cuda-crt==$runtime.*" \
    || echo "skein setup: nvidia-cuda-crt==$runtime.* did not install; building without CUDA graphs" >&2
}

if [ -e .venv/torch/lib/libtorch_cpu.so ] && [ "$(cat .venv/torch.version 2>/dev/null)" = "$TORCH_VERSION" ]; then
  add_cuda_crt
  exit 0
fi
echo "skein setup: installing libtorch (PyPI torch==$TORCH_VERSION) into .venv — first run only, a few minutes" >&2
# A .venv without pip (python3 -m venv stopped at ensurepip because python3-venv was missing)
# would fail every run below with "No module named pip"; make it again from scratch.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  [ -e .venv ] && echo "skein setup: .venv has no working pip; recreating it" >&2
  "$PY" -m venv --clear .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
# Found without importing torch: the import warns that NumPy is missing (skein needs no NumPy).
site=$(.venv/bin/python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
ln -sfn "$site" .venv/torch
add_cuda_crt
echo "$TORCH_VERSION" > .venv/torch.version
echo "skein setup: libtorch ready at $site" >&2
