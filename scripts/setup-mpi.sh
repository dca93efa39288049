#!/usr/bin/env bash
# Installs what the `mpi` feature (data-parallel ranks as MPI processes) builds and runs with:
# Debian's OpenMPI (mpicc, mpirun, the library) and libclang, which generates the bindings.
# Idempotent: does nothing when mpicc, mpirun and libclang are already there.
# With --check it installs nothing and only says, by its exit status, whether they are there.
set -euo pipefail

# The names clang-sys (bindgen) loads: libclang.so[.N] or libclang-N.so[.N], never libclang-cpp,
# which is a different library. Each candidate is tested on its own, with no pipe: under pipefail
# `ls a b | grep` fails whenever one pattern matches nothing (an arm64 host has no x86_64 dir).
have_libclang() {
  local f
  for f in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
    /usr/lib/*-linux-gnu/libclang.so* /usr/lib/*-linux-gnu/libclang-[0-9]*.so*; do
    [ -e "$f" ] && return 0
  done
  return 1
}

if command -v mpicc >/dev/null && command -v mpirun >/dev/null && have_libclang; then
  exit 0
fi
[ "${1:-}" = "--check" ] && exit 1
packages="libopenmpi-dev openmpi-bin libclang-dev"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null; then
  sudo="sudo"
else
  echo "skein setup: MPI needs these Debian packages, and installing them needs root: $packages" >&2
  echo "  install them (apt-get install $packages) and run this again" >&2
  exit 1
fi
echo "skein setup: installing OpenMPI and libclang ($packages)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $packages >/dev/null
command -v mpirun >/dev/null || { echo "skein setup: mpirun missing after installing $packages" >&2; exit 1; }
