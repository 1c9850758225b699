#!/usr/bin/env bash
# Builds the kiln_attn wheel with maturin: abi3, so one wheel loads on CPython 3.11 and later.
#   python/build-wheel.sh        release wheel into .gpu-py/ (what python/run-gpu-tests.sh
#                                installs on the GPU host, which has no Rust)
#   python/build-wheel.sh --dev  debug wheel into python/target/wheels/ (quick: what CI tests)
# maturin (pinned) is installed into the venv .tools/py if missing. Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.tools/py
if [ ! -x "$venv/bin/maturin" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check maturin==1.16.0
fi
if [ "${1:-}" = --dev ]; then
  dest=python/target/wheels
  profile=(--profile dev)
else
  dest=.gpu-py
  profile=(--release)
fi
mkdir -p "$dest"
rm -f "$dest"/kiln_attn-*.whl
"$venv/bin/maturin" build --quiet "${profile[@]}" --manifest-path python/Cargo.toml --out "$dest" >&2
ls "$dest"/kiln_attn-*.whl
