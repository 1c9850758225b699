#!/usr/bin/env bash
# Runs kiln's attention benchmark and the PyTorch peers (FlashAttention-2 and cuDNN through
# SDPA) on the same GPU, then merges them into one table and one JSON.
#   bench/run-attention.sh [OUT.json] [--quick] [--iters N] [--warmup N] [--autotune]
# OUT defaults to bench/results/attention-<UTC date>.json. Run from anywhere on the GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/env.sh
out=bench/results/attention-$(date -u +%Y%m%dT%H%M%SZ).json
if [ $# -gt 0 ] && [[ $1 != --* ]]; then out=$1; shift; fi
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
bin=$(bench_bin bench_attention)
kiln_status=0
"$bin" --out "$tmp/kiln.json" "$@" || kiln_status=$?
[ -f "$tmp/kiln.json" ] || { echo "kiln benchmark failed before writing results" >&2; exit 1; }
# The peers take the same sweep options, not kiln's --target or --set.
peer_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --target|--set) shift 2 ;;
    --autotune) shift ;;
    *) peer_args+=("$1"); shift ;;
  esac
done
python3 bench/peers.py run --out "$tmp/peers.json" "${peer_args[@]}"
python3 bench/peers.py merge "$tmp/kiln.json" "$tmp/peers.json" --out "$out"
python3 bench/chart.py "$out"
exit $kiln_status
