#!/usr/bin/env bash
# One H200 job inside a device call's 600 s, in one of its parts:
#   OUT=$OUT scripts/gpu-check.sh tests    # the GPU test binaries by priority, each under a timeout
#   OUT=$OUT scripts/gpu-check.sh python   # the package's GPU tests (attention forward, backward,
#                                          # ops), then the training comparison if time is left
#   OUT=$OUT scripts/gpu-check.sh rows     # the row library beside PyTorch in one process
#   OUT=$OUT scripts/gpu-check.sh decode [--quick ..]  # python/bench_decode.py: decode beside FA4's paged path
#   OUT=$OUT scripts/gpu-check.sh attention [--backward|--fwd-bwd] [bench.py's other options,
#                                          # --quick, --only S:D:CAUSAL,..]: python/bench.py: kiln_attn
#                                          # beside FlashAttention-4 (when its wheels are installed
#                                          # in /tmp/fa4-site), FA2 and cuDNN
#   OUT=$OUT scripts/gpu-check.sh bwd-tiles [--quick|--only ..]  # the backward with the tile
#                                          # candidates of AttentionBwdParams::tuned beside it
# summary.log says what ran and how it ended. Needs .gpu/tests/kiln-tests-NAME or tests-NAME
# (release test binaries, stripped), .gpu/commit and the wheel in .gpu-py/ (python/build-wheel.sh).
cd "$(dirname "$0")/.."
part=${1:-tests}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
echo "commit $(cat .gpu/commit 2>/dev/null) part $part" | tee -a "$S"
# GPU_CHECK_SECONDS: the part's time budget (default 575, inside one call's 600 s).
left() { echo $((${GPU_CHECK_SECONDS:-575} - SECONDS)); }
run_test() {  # name, limit
  local lim=$2; [ "$(left)" -lt "$lim" ] && lim=$(left)
  if [ "$lim" -lt 15 ]; then echo "$1 skipped (time)" | tee -a "$S"; return; fi
  local t0=$SECONDS
  local bin=".gpu/tests/kiln-tests-$1"
  [ -x "$bin" ] || bin=".gpu/tests/tests-$1"  # the bundler's other naming
  timeout "$lim" "$bin" --test-threads=1 > "$OUT/$1.log" 2>&1
  local rc=$?
  echo "$1 rc=$rc $((SECONDS - t0))s $(grep -E '^test result|passed|failed' "$OUT/$1.log" | tail -1)" | tee -a "$S"
}
py_setup() {
  export PYTHONPATH=$PWD/.gpu-py/site
  # The results name the bundle's commit, whose wheel runs (bench/peers.py's commit()).
  export KILN_COMMIT=$(cat .gpu/commit 2>/dev/null)
  if [ -d /tmp/fa4-site ]; then
    PYTHONPATH=$PYTHONPATH:/tmp/fa4-site/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4-site
  fi
  python3 -m pip install --quiet --no-index --no-deps --target .gpu-py/site .gpu-py/kiln_attn-*.whl > "$OUT/pip.log" 2>&1
}
case $part in
  tests)
    # The code never run on a GPU first: the row library (cross-entropy), the backward's
    # two-warpgroup forms and the bulk adds; then the rest.
    run_test gpu_library 240
    for t in gpu_attention_backward gpu_bulk_add gpu_wgmma_general gpu_mma_general \
      gpu_attention_decode gpu_vector_memory gpu_ops gpu_memory_ops gpu_tiles_3d \
      gpu_large_tiles gpu_examples gpu_gemm_epilogues gpu_lowering gpu_sm90a \
      gpu_attention_features gpu_tma gpu_runtime gpu_print gpu_user_dump; do
      run_test "$t" 150
    done
    ;;
  python)
    py_setup
    # What has never run on a GPU first: chunks, padded decode head dims, the ring.
    t0=$SECONDS
    timeout $(($(left) - 240)) python3 -m pytest -q -p no:cacheprovider python/tests/test_ring_gpu.py \
      python/tests/test_flash_attn_gpu.py -k "ring or chunk or pad or value_head or seqused or captures" > "$OUT/pytest-new.log" 2>&1
    echo "pytest new rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/pytest-new.log")" | tee -a "$S"
    t0=$SECONDS
    timeout $(($(left) - 120)) python3 -m pytest -q -x -p no:cacheprovider python/tests/test_flash_attn_gpu.py \
      -k "backward or bwd or grad or compile or kvcache" > "$OUT/pytest-backward.log" 2>&1
    echo "pytest backward rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/pytest-backward.log")" | tee -a "$S"
    t0=$SECONDS
    timeout $(($(left) - 10)) python3 -m pytest -q -p no:cacheprovider python/tests/test_ops_gpu.py > "$OUT/pytest-ops.log" 2>&1
    echo "pytest ops rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/pytest-ops.log")" | tee -a "$S"
    ;;
  rows)
    py_setup
    t0=$SECONDS
    timeout $(($(left) - 20)) python3 bench/rows.py --out "$OUT/rows-py.json" \
      --shapes 4096x4097,16384x4096,4096x8192,32768x8192,65536x4096 --dtypes f32,bf16 > "$OUT/rows-bench.log" 2>&1
    echo "rows bench rc=$? $((SECONDS - t0))s" | tee -a "$S"
    [ -f "$OUT/rows-py.json" ] && python3 bench/table.py "$OUT/rows-py.json" > "$OUT/rows-py.md" 2>&1
    [ -f "$OUT/rows-py.json" ] && python3 bench/chart.py "$OUT/rows-py.json" --out "$OUT/rows-py.png" > /dev/null 2>&1
    ;;
  attention)
    py_setup
    t0=$SECONDS
    name=attention-py
    for a in "${@:2}"; do
      case "$a" in --backward) name=attention-py-bwd ;; --fwd-bwd) name=attention-py-fwdbwd ;; esac
    done
    timeout $(($(left) - 20)) python3 -P python/bench.py --out "$OUT/$name.json" "${@:2}" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$S"
    [ -f "$OUT/$name.json" ] && python3 bench/table.py "$OUT/$name.json" > "$OUT/$name.md" 2>&1
    ;;
  bwd-tiles)
    # The dQ walk's tile candidates (python/bench.py --bwd-candidate): 64 keys a dK/dV block
    # with every column (d = 128's tiles before its two warpgroups) or 64 of them (d = 256's
    # before its 128), two consumer warpgroups of 64 keys in both rings, a dQ ring of two
    # warpgroups; and the keys-major kernel with atomics, also with two consumer warpgroups
    # of 64 keys (dQ's columns split between them: d = 128).
    exec "$PWD/scripts/gpu-check.sh" attention --backward "${@:2}" \
      --bwd-candidate 'kiln_n64=block_n=64,block_m=64,num_warps=4,key_cols=d|' \
      --bwd-candidate 'kiln_kc64=block_n=64,block_m=64,num_warps=4,key_cols=64|' \
      --bwd-candidate 'kiln_n128both=block_n=128,block_m=64,num_warps=8,key_cols=d|block_n=128,block_m=64,num_warps=8,key_cols=d' \
      --bwd-candidate 'kiln_dq128=|block_m=128,block_n=64,num_warps=8' \
      --bwd-candidate 'kiln_keys_major=keys_major=true' \
      --bwd-candidate 'kiln_fused128=keys_major=true,block_n=128,block_m=64,num_warps=8,key_cols=d'
    ;;
  decode)
    py_setup
    t0=$SECONDS
    timeout $(($(left) - 20)) python3 -P python/bench_decode.py --out "$OUT/decode-py.json" "${@:2}" > "$OUT/decode-py.log" 2>&1
    echo "decode rc=$? $((SECONDS - t0))s" | tee -a "$S"
    ;;
  *) echo "gpu-check: unknown part $part (tests, python, rows, attention, bwd-tiles or decode)" >&2; exit 2 ;;
esac
echo "done at ${SECONDS}s" | tee -a "$S"
