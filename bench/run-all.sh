#!/usr/bin/env bash
# One batch for a GPU host, so a short device lease measures everything at once:
#   bench/run-all.sh OUT_DIR [--quick] [--sanitize]
# 1. every GPU test binary under .gpu/tests (filter `gpu`), each log in OUT_DIR;
# 2. the main job (.gpu/bin/attention);
# 3. with --sanitize, compute-sanitizer memcheck, racecheck and synccheck over the GPU example
#    and sm_90a tests;
# 4. gemm vs cuBLAS and attention vs FlashAttention-2/cuDNN, on sm_80 and on sm_90a;
#    softmax, layer norm and RMS norm vs PyTorch (GB/s) on sm_80.
# Results (JSON + PNG) land in OUT_DIR; a summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/run-all.sh OUT_DIR [--quick] [--sanitize]}; shift
quick=(); sanitize=0
for a in "$@"; do
  case $a in
    --quick) quick=(--quick) ;;
    --sanitize) sanitize=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
summary=()
for t in .gpu/tests/*gpu_*; do
  name=$(basename "$t")
  "$t" gpu --test-threads=1 > "$out/$name.log" 2>&1
  summary+=("$name: $(grep -E '^test result' "$out/$name.log" | tail -n 1)")
done
.gpu/bin/attention > "$out/main-job.log" 2>&1
summary+=("main job: $(tail -n 1 "$out/main-job.log")")
if [ $sanitize = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    for t in .gpu/tests/*gpu_examples* .gpu/tests/*gpu_sm90a*; do
      log="$out/sanitize-$tool-$(basename "$t").log"
      compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" gpu --test-threads=1 > "$log" 2>&1
      summary+=("$tool $(basename "$t"): rc=$? $(grep -E 'ERROR SUMMARY' "$log" | tail -n 1)")
    done
  done
fi
for target in sm_80 sm_90a; do
  bench/run-gemm.sh "$out/gemm-$target.json" --target "$target" "${quick[@]}" > "$out/gemm-$target.log" 2>&1
  summary+=("gemm $target: rc=$?")
  bench/run-attention.sh "$out/attention-$target.json" --target "$target" "${quick[@]}" > "$out/attention-$target.log" 2>&1
  summary+=("attention $target: rc=$?")
done
bench/run-rows.sh "$out/rows-py.json" "${quick[@]}" > "$out/rows-py.log" 2>&1
summary+=("rows (kiln_attn.ops beside PyTorch): rc=$?")
for f in "$out"/gemm-*.log "$out"/attention-*.log "$out"/rows-*.log; do
  echo "== $f"; grep -v $'\r' "$f" | tail -n 25
done
printf '%s\n' "${summary[@]}"
