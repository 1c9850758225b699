#!/usr/bin/env bash
# One H200 job inside a device call's 600 s: the row kernels' GPU test, the row library beside
# PyTorch in one process (bench/rows.py at the misaligned and large shapes), then the GPU tests
# by priority while time is left (each under a timeout; summary.log says which ran).
# Needs .gpu/tests/kiln-tests-NAME (release test binaries, stripped), .gpu/commit and the wheel
# in .gpu-py/ (python/build-wheel.sh); results go to $OUT.
#   OUT=$OUT scripts/gpu-check.sh
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git_commit=$(cat .gpu/commit 2>/dev/null); echo "commit $git_commit" | tee -a "$S"
run_test() {  # name, limit
  local left=$((575 - SECONDS)); local lim=$2; [ $left -lt $lim ] && lim=$left
  if [ $lim -lt 15 ]; then echo "$1 skipped (time)" | tee -a "$S"; return; fi
  local t0=$SECONDS
  timeout $lim .gpu/tests/kiln-tests-$1 --test-threads=1 > "$OUT/$1.log" 2>&1
  local rc=$?
  echo "$1 rc=$rc $((SECONDS - t0))s $(grep -E '^test result|passed|failed' "$OUT/$1.log" | tail -1)" | tee -a "$S"
}
run_test gpu_vector_memory 90
# The row library beside PyTorch, one process.
t0=$SECONDS
export PYTHONPATH=$PWD/.gpu-py/site
python3 -m pip install --quiet --no-index --no-deps --target .gpu-py/site .gpu-py/kiln_attn-*.whl > "$OUT/pip.log" 2>&1
timeout 200 python3 bench/rows.py --out "$OUT/rows-py.json" --only softmax,layer_norm,rms_norm,cross_entropy \
  --shapes 4096x4097,16384x4096,4096x8192,32768x8192,65536x4096 --dtypes f32,bf16 > "$OUT/rows-bench.log" 2>&1
echo "rows bench rc=$? $((SECONDS - t0))s" | tee -a "$S"
[ -f "$OUT/rows-py.json" ] && python3 bench/table.py "$OUT/rows-py.json" > "$OUT/rows-py.md" 2>&1
[ -f "$OUT/rows-py.json" ] && python3 bench/chart.py "$OUT/rows-py.json" --out "$OUT/rows-py.png" > /dev/null 2>&1
for t in gpu_ops gpu_memory_ops gpu_attention_backward gpu_tiles_3d gpu_large_tiles gpu_examples gpu_gemm_epilogues gpu_lowering gpu_sm90a gpu_library; do
  run_test $t 120
done
echo "done at ${SECONDS}s" | tee -a "$S"
