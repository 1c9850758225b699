#!/usr/bin/env bash
# Runs kiln's row kernels (softmax, layer norm, RMS norm) and PyTorch's on the same GPU, then
# merges them into one table (GB/s, kiln / PyTorch) and one JSON.
#   bench/run-rows.sh [OUT.json] [--quick] [--iters N] [--warmup N] [--target NAME] [--set K=V]
# OUT defaults to bench/results/rows-<UTC date>.json. Run from anywhere on the GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/env.sh
out=bench/results/rows-$(date -u +%Y%m%dT%H%M%SZ).json
if [ $# -gt 0 ] && [[ $1 != --* ]]; then out=$1; shift; fi
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
kiln_status=0
"$(bench_bin bench_rows)" --out "$tmp/kiln.json" "$@" || kiln_status=$?
[ -f "$tmp/kiln.json" ] || { echo "kiln benchmark failed before writing results" >&2; exit 1; }
peer_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --target|--set) shift 2 ;;
    *) peer_args+=("$1"); shift ;;
  esac
done
python3 bench/rows_peers.py run --out "$tmp/peers.json" "${peer_args[@]}"
python3 bench/rows_peers.py merge "$tmp/kiln.json" "$tmp/peers.json" --out "$out"
exit $kiln_status
