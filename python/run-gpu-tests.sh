#!/usr/bin/env bash
# On the GPU host (python3 with torch, no network, no Rust), from a tree where
# python/build-wheel.sh has put the wheel in .gpu-py/: installs it beside the image's packages
# (pip --target, no index, no dependencies: torch is the image's own), runs every pytest file
# under python/tests (the GPU matrix and the CPU-side checks), then python/bench.py.
#   python/run-gpu-tests.sh [--tests-only | --bench-only] [bench.py options: --quick,
#                           --only S:D:CAUSAL,.., --rust FILE, --overhead-only]
#   python/run-gpu-tests.sh --rows-bench [bench/rows.py options: --quick, --only K,..,
#                           --dtypes, --shapes, --iters]
#       only the row-kernel library beside PyTorch (bench/rows.py), in this process: rows-py.json,
#       rows-py.png, rows-py.md (the table) and rows-bench.log under $OUT
#   python/run-gpu-tests.sh --train [train_compare.py options: --steps, --layers, ..]
#       only the training comparison (python/train_compare.py, kiln's attention beside SDPA):
#       train-cuda.json, train-cuda.svg and train.log under $OUT
#   python/run-gpu-tests.sh --ops-tests
#       only the pytest files of kernel() / kiln_attn.ops and bench/rows.py (pytest-ops.log)
# (the matrix alone took four to five minutes on the H200: --tests-only and --bench-only fit the
# halves in separate jobs of a shorter limit).
# Without --rust, the Rust benchmark (bench_attention, bundled in .gpu/bin by gpu-bundle) runs
# first on the same points in the same job, and bench.py compares with it (python_vs_rust).
# Results go to $OUT, else .gpu-py/results/: pytest.log, pytest.xml, bench.log,
# attention-rust.json, attention-py.json and attention-py.png. Exits non-zero if a test or the
# benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.gpu-py/results}
mkdir -p "$out"
site=.gpu-py/site
rm -rf "$site"
python3 -m pip install --quiet --no-index --no-deps --target "$site" .gpu-py/kiln_attn-*.whl || exit 1
export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import torch, kiln_attn; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "kiln_attn", kiln_attn.__version__)'
if [ "${1:-}" = --rows-bench ]; then
  # The row-kernel library beside PyTorch in this one process (bench/rows.py: its options
  # follow), then its chart and table.
  shift
  python3 bench/rows.py --out "$out/rows-py.json" "$@" 2>&1 | tee "$out/rows-bench.log"
  rows=${PIPESTATUS[0]}
  [ -f "$out/rows-py.json" ] && python3 bench/chart.py "$out/rows-py.json" --out "$out/rows-py.png"
  [ -f "$out/rows-py.json" ] && python3 bench/table.py "$out/rows-py.json" | tee "$out/rows-py.md"
  echo "rows bench exit $rows; results in $out"
  exit "$rows"
fi
if [ "${1:-}" = --train ]; then
  shift
  python3 python/train_compare.py --device cuda --out "$out" "$@" 2>&1 | tee "$out/train.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = --ops-tests ]; then
  # Only the tests of kernels() / kernel() and kiln_attn.ops (GPU, interpreter, CPU-side
  # checks) and of bench/rows.py: a minute or two, without the attention matrix.
  python3 -m pytest -p no:cacheprovider -q -rs python/tests/test_kernels_args.py \
    python/tests/test_ops_gpu.py python/tests/test_ops_interp.py python/tests/test_rows_bench.py \
    --junitxml "$out/pytest-ops.xml" 2>&1 | tee "$out/pytest-ops.log"
  exit "${PIPESTATUS[0]}"
fi
tests=0
if [ "${1:-}" = --bench-only ]; then
  shift
  echo "tests skipped (--bench-only)"
else
  python3 -m pytest -p no:cacheprovider -q -rs python/tests --junitxml "$out/pytest.xml" 2>&1 | tee "$out/pytest.log"
  tests=${PIPESTATUS[0]}
fi
bench=0
if [ "${1:-}" = --tests-only ]; then
  echo "benchmark skipped (--tests-only)"
else
  rust=()
  case " $* " in
    *" --rust "* | *" --overhead-only "*) ;;
    *)
      if [ -x .gpu/bin/bench_attention ]; then
        # The sweep options both benchmarks take (--quick, --only, --iters, --warmup).
        .gpu/bin/bench_attention --out "$out/attention-rust.json" "$@" 2>&1 | tee "$out/bench-rust.log"
        [ -f "$out/attention-rust.json" ] && rust=(--rust "$out/attention-rust.json")
      fi
      ;;
  esac
  python3 python/bench.py --out "$out/attention-py.json" "${rust[@]}" "$@" 2>&1 | tee "$out/bench.log"
  bench=${PIPESTATUS[0]}
fi
echo "pytest exit $tests, bench exit $bench; results in $out"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
