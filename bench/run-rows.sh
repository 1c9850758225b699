#!/usr/bin/env bash
# Runs kiln's row-kernel library beside PyTorch in one process on one GPU (bench/rows.py: each
# kernel through kiln_attn.ops beside its PyTorch peer, GB/s sustained and held, ratios, the
# copy_ row), then draws the PNG beside the JSON and prints the table.
#   bench/run-rows.sh [OUT.json] [bench/rows.py options: --quick, --only K,.., --dtypes,
#                     --shapes MxN,.., --iters N, --warmup N]
# OUT defaults to bench/results/rows-py-<UTC date>-<commit>.json. Needs PyTorch and the kiln_attn
# wheel: importable as it is, else installed from .gpu-py/ (python/build-wheel.sh) into
# .gpu-py/site. kiln's figures from Rust alone (no peer) are bench_rows's (.gpu/bin/bench_rows).
set -euo pipefail
cd "$(dirname "$0")/.."
out=()
if [ $# -gt 0 ] && [[ $1 != --* ]]; then out=(--out "$1"); shift; fi
if ! python3 -c 'import kiln_attn.ops' 2>/dev/null; then
  site=.gpu-py/site
  rm -rf "$site"
  python3 -m pip install --quiet --no-index --no-deps --target "$site" .gpu-py/kiln_attn-*.whl
  export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
fi
log=$(mktemp)
status=0
python3 bench/rows.py "${out[@]}" "$@" 2>&1 | tee "$log" || status=$?
json=$(sed -n 's/^wrote //p' "$log" | tail -n 1)
rm -f "$log"
[ -n "$json" ] || { echo "bench/rows.py wrote no results" >&2; exit 1; }
python3 bench/chart.py "$json"
python3 bench/table.py "$json"
exit $status
