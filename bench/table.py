#!/usr/bin/env python3
"""Prints a merged benchmark JSON (bench/run-attention.sh or bench/run-gemm.sh) as the README's
markdown table: python3 bench/table.py RESULT.json"""
import json
import sys


def attention(rows, commit):
    print("| s | d | causal | kiln | cuDNN | kiln/cuDNN | FA2 | kiln/FA2 | block_m, block_n | commit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ct = dict(kv.split("=") for kv in r["comptime"].split(","))
        bn = f"{ct.get('block_m', 128)}, {ct.get('block_n', '?')}"
        cudnn, fa2 = r.get("cudnn") or {}, r.get("fa2") or {}
        print(f"| {r['s']} | {r['d']} | {str(r['causal']).lower()} | {r['kiln_tflops']:.0f} "
              f"| {cudnn.get('tflops', float('nan')):.0f} | {r.get('ratio_vs_cudnn', float('nan')):.2f} "
              f"| {fa2.get('tflops', float('nan')):.0f} | {r.get('ratio_vs_fa2', float('nan')):.2f} "
              f"| {bn} | {commit} |")


def gemm(rows, commit):
    print("| M | N | K | kiln | cuBLAS | kiln/cuBLAS | tile (BM, BN, BK, STAGES, CLUSTER_M) | commit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = dict(kv.split("=") for kv in r["comptime"].split(","))
        print(f"| {r['m']} | {r['n']} | {r['k']} | {r['kiln_tflops']:.0f} | {r['cublas_tflops']:.0f} "
              f"| {r['ratio']:.2f} | {c.get('BM', 128)}, {c.get('BN')}, {c.get('BK')}, {c.get('STAGES')}, "
              f"{c.get('CLUSTER_M', 1)} | {commit} |")


def main():
    d = json.load(open(sys.argv[1]))
    meta = d["meta"].get("kiln", d["meta"])
    commit = meta.get("commit", "?")[:7]
    (gemm if meta.get("benchmark") == "gemm" else attention)(d["rows"], commit)


if __name__ == "__main__":
    main()
