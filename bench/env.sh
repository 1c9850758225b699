# Sourced by the run-*.sh scripts: finds a benchmark binary and makes libcublas loadable.
# bench_bin NAME prints the path of the bundled (.gpu/bin) or release (target/release) binary.
bench_bin() {
  for p in ".gpu/bin/$1" "target/release/$1"; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
  echo "no $1 binary: run ../shared/tools/gpu-bundle (or cargo build --release -p kiln-bench)" >&2
  return 1
}
# cudarc loads libcublas by name: add the CUDA toolkit's and PyTorch's copies to the search path.
cublas_dirs=$(
  { ls -d /usr/local/cuda/lib64 2>/dev/null
    site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) &&
      find "$site/nvidia" -name 'libcublas.so*' -printf '%h\n' 2>/dev/null
  } | sort -u | paste -sd: -)
export LD_LIBRARY_PATH="${cublas_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Measure the driver JIT itself, not its on-disk cache.
export CUDA_CACHE_DISABLE=1
