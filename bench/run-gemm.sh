#!/usr/bin/env bash
# Runs kiln's gemm against cuBLAS in one process.
#   bench/run-gemm.sh [OUT.json] [--quick] [--iters N] [--warmup N] [--target NAME] [--autotune]
# OUT defaults to bench/results/gemm-<UTC date>.json. Run from anywhere on the GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/env.sh
out=bench/results/gemm-$(date -u +%Y%m%dT%H%M%SZ).json
if [ $# -gt 0 ] && [[ $1 != --* ]]; then out=$1; shift; fi
status=0
"$(bench_bin bench_gemm)" --out "$out" "$@" || status=$?
[ -f "$out" ] && python3 bench/chart.py "$out"
exit $status
