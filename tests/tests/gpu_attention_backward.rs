//! Attention's backward kernels on the GPU (sm_80, and sm_90a on Hopper) after kiln's own
//! forward, as in training: dq, dk and dv against the f64 reference gradients by
//! FlashAttention's rule, both dQ modes (the deterministic one's bits must repeat), the
//! features and shapes of `interp_attention_backward`, sm_90a's default and tuned tiles, the
//! dK/dV kernel keys-major with atomics (`keys_major`; on sm_90a also with two consumer
//! warpgroups, dQ's columns split between them), varlen
//! batches (NaN where no block may read), a value head dim of its own (`dv`) and used lengths
//! (`seqused_q`, `seqused_k`: gradients 0 past them).

mod bwd_varlen;
mod gpu_common;

use std::process::ExitCode;

use bwd_varlen::{Packed, Problem};
use gpu_common::{Needs, device};
use kiln_examples::attention::{AttentionParams, attention_lse};
use kiln_examples::attention_backward::{
    AttentionBwdParams, attention_bwd_dkdv, attention_bwd_dkdv_varlen,
    attention_bwd_dkdv_varlen_used, attention_bwd_dq, attention_bwd_dq_convert,
    attention_bwd_dq_convert_varlen, attention_bwd_dq_varlen, attention_bwd_dq_varlen_used,
    attention_bwd_preprocess, attention_bwd_preprocess_varlen,
};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor};
use kiln_tests::check::{Case, assert_within_rule};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference::{AttentionDims, AttentionMath, Rounding, attention_backward_f64_dv};

/// One call: `(batch, heads, kv heads, sq, sk, d)`, the comptime features, and whether the
/// atomic dQ mode runs too.
struct Call {
    shape: [usize; 6],
    /// Head dim of `v`, `o`, `dout`; 0: `d`.
    dv: usize,
    dtype: DType,
    causal: bool,
    window: (i32, i32),
    softcap: f32,
    atomics: bool,
}

fn calls() -> Vec<Call> {
    let plain = |shape, dtype| Call {
        shape,
        dv: 0,
        dtype,
        causal: false,
        window: (-1, -1),
        softcap: 0.0,
        atomics: true,
    };
    vec![
        plain([1, 2, 2, 257, 300, 64], DType::Bf16),
        Call {
            causal: true,
            ..plain([2, 2, 2, 300, 190, 128], DType::F16)
        },
        Call {
            causal: true,
            ..plain([1, 4, 2, 200, 333, 64], DType::Bf16)
        },
        Call {
            window: (33, 17),
            softcap: 20.0,
            ..plain([1, 4, 1, 150, 270, 128], DType::Bf16)
        },
        Call {
            window: (10, 5),
            ..plain([1, 1, 1, 300, 100, 64], DType::F16)
        },
        plain([1, 2, 2, 130, 200, 96], DType::Bf16),
        Call {
            causal: true,
            atomics: false,
            ..plain([1, 4, 2, 100, 140, 96], DType::F16)
        },
        plain([1, 2, 1, 150, 130, 256], DType::Bf16),
        Call {
            causal: true,
            ..plain([1, 2, 2, 77, 200, 256], DType::F16)
        },
        Call {
            dv: 128,
            causal: true,
            ..plain([1, 4, 2, 200, 333, 192], DType::Bf16)
        },
        Call {
            dv: 128,
            ..plain([2, 2, 1, 130, 257, 64], DType::F16)
        },
        Call {
            dv: 64,
            window: (40, 20),
            ..plain([1, 2, 2, 150, 190, 128], DType::Bf16)
        },
    ]
}

impl Call {
    /// The head dim of `v`, `o`, `dout`.
    fn value_dim(&self) -> usize {
        if self.dv == 0 { self.shape[5] } else { self.dv }
    }
}

/// A poisoned tensor on the device.
fn output(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(dtype, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// The backward's gradients `(dq, dk, dv)` on the device for the forward's `o` and `lse`.
#[allow(clippy::too_many_arguments)]
fn backward(
    dev: &Device,
    p: &AttentionBwdParams,
    c: &Call,
    [q, k, v, dout, o, lse]: [&DeviceTensor; 6],
    scale: f32,
) -> [HostTensor; 3] {
    let [b, h, h_kv, sq, sk, d] = c.shape;
    let delta = output(dev, DType::F32, &[b, h, sq]);
    let dq_accum = output(dev, DType::F32, &[b, h, sq, d]);
    let dq = output(dev, c.dtype, &[b, h, sq, d]);
    let dk = output(dev, c.dtype, &[b, h_kv, sk, d]);
    let dv = output(dev, c.dtype, &[b, h_kv, sk, c.value_dim()]);
    // The query-side kernels' tiles beside the dK/dV kernel's.
    let qp = &p.query_tiles();
    let qgrid = qp.query_grid([sq, h, b]);
    attention_bwd_preprocess
        .launch(dev, qp, qgrid, o, dout, &delta, &dq_accum)
        .expect("preprocess");
    let kgrid = p.key_grid([sk, h_kv, b]);
    attention_bwd_dkdv
        .launch(
            dev, p, kgrid, q, k, v, dout, lse, &delta, &dq_accum, &dk, &dv, scale,
        )
        .expect("dkdv");
    if p.deterministic {
        attention_bwd_dq
            .launch(
                dev,
                qp,
                qp.dq_grid([sq, h, b]),
                q,
                k,
                v,
                dout,
                lse,
                &delta,
                &dq,
                scale,
            )
            .expect("dq");
    } else {
        attention_bwd_dq_convert
            .launch(dev, qp, qgrid, &dq_accum, &dq, scale)
            .expect("dq convert");
    }
    dev.synchronize().expect("kernels ran");
    [dq, dk, dv].map(|t| t.download().expect("download"))
}

/// Runs every call on `dev` (compiling for `target`) in both dQ modes.
fn run_calls(dev: &Device, target: Target) {
    let mut rng = Rng::from_env();
    for c in calls() {
        let [b, h, h_kv, sq, sk, d] = c.shape;
        let dvd = c.value_dim();
        let fwd = AttentionParams {
            d,
            dv: c.dv,
            causal: c.causal,
            kv_group: h / h_kv,
            dtype: c.dtype,
            window_left: c.window.0,
            window_right: c.window.1,
            attention_chunk: 0,
            softcap: c.softcap,
            ..AttentionParams::default()
        };
        for dist in [Dist::Normal, Dist::Large] {
            let q = tensor(&mut rng, &[b, h, sq, d], c.dtype, dist);
            let k = tensor(&mut rng, &[b, h_kv, sk, d], c.dtype, dist);
            let v = tensor(&mut rng, &[b, h_kv, sk, dvd], c.dtype, dist);
            let dout = tensor(&mut rng, &[b, h, sq, dvd], c.dtype, dist);
            let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
            let up = |t: &HostTensor| dev.upload(t).expect("upload");
            let (dq_in, dk_in, dv_in, ddo) = (up(&q), up(&k), up(&v), up(&dout));
            let o = output(dev, c.dtype, &[b, h, sq, dvd]);
            let lse = output(dev, DType::F32, &[b, h, sq]);
            attention_lse
                .launch(
                    dev,
                    &fwd,
                    attention_lse.grid(&fwd, [sq, h, b]),
                    &dq_in,
                    &dk_in,
                    &dv_in,
                    &o,
                    &lse,
                    scale,
                )
                .expect("forward");
            let right = if c.causal { 0 } else { c.window.1 };
            let math = AttentionMath {
                scale: f64::from(scale),
                window: (i64::from(c.window.0), i64::from(right)).into(),
                cap: (c.softcap > 0.0).then_some(f64::from(c.softcap)),
            };
            let dims = AttentionDims {
                b,
                h,
                h_kv,
                sq,
                sk,
                d,
            };
            let [qv, kv, vv, dov] = [&q, &k, &v, &dout].map(HostTensor::to_f64_vec);
            let at = |r| attention_backward_f64_dv([&qv, &kv, &vv, &dov], dims, dvd, math, r);
            let (exact, rounded) = (at(Rounding::Exact), at(Rounding::Stored(c.dtype)));
            let inputs = [&dq_in, &dk_in, &dv_in, &ddo, &o, &lse];
            let modes: &[bool] = if c.atomics { &[false, true] } else { &[true] };
            // The default tiles, and on sm_90a also its tuned ones (every dK/dV column in
            // one block at d = 96 and 128).
            let tiles: &[bool] = if target == Target::Sm90a {
                &[false, true]
            } else {
                &[false]
            };
            let params = modes.iter().flat_map(|&deterministic| {
                let p = AttentionBwdParams::of_forward(&fwd, deterministic);
                let mut ps: Vec<AttentionBwdParams> = tiles
                    .iter()
                    .map(|&tuned| if tuned { p.tuned(target, false) } else { p })
                    .collect();
                // sm_90a's dK/dV ring with two consumer warpgroups of 64 keys each.
                if deterministic && target == Target::Sm90a && p.d <= 128 && p.value_dim() == p.d {
                    ps.push(AttentionBwdParams {
                        block_n: 128,
                        block_m: 64,
                        num_warps: 8,
                        key_cols: p.d,
                        ..p
                    });
                }
                // dQ by atomics from the keys-major kernel's staged dS (on sm_90a its ring).
                if !deterministic {
                    ps.push(AttentionBwdParams {
                        keys_major: true,
                        ..p
                    });
                }
                // The rings of two consumer warpgroups that add dQ (sm_90a): at d = 128
                // keys-major, 64 keys each, dQ's 64 query rows split into column blocks, one a
                // warpgroup (`WgmmaColumns`), or 80 query rows, dQ computed transposed (K^T
                // read MN-major, dS^T staged as B) and added from its transposed
                // accumulator; at d = 64 128 queries against 128 keys, both
                // ways: queries-major (64 query rows a warpgroup, P^T and dS^T staged) and
                // keys-major (64 keys a warpgroup, dS^T staged for dQ, each thread's 32 query
                // columns' statistics read from the stage at use). A soft-cap's accumulators do
                // not fit the consumers' registers: refused.
                let two_warpgroups: &[(usize, bool)] = match p.d {
                    128 => &[(64, true), (80, true)],
                    64 => &[(128, false), (128, true)],
                    _ => &[],
                };
                let fits = p.softcap == 0.0 && p.value_dim() == p.d;
                if !deterministic && target == Target::Sm90a && fits {
                    for &(block_m, keys_major) in two_warpgroups {
                        ps.push(AttentionBwdParams {
                            keys_major,
                            block_n: 128,
                            block_m,
                            num_warps: 8,
                            key_cols: p.d,
                            ..p
                        });
                    }
                }
                ps
            });
            for p in params {
                let deterministic = p.deterministic;
                let got = backward(dev, &p, &c, inputs, scale);
                let case = Case {
                    kernel: format!("attention backward@{target} {p:?}"),
                    shape: format!("{dims:?} dv={dvd} scale={scale}"),
                    dist,
                    seed: rng.seed(),
                };
                let names = ["dq", "dk", "dv"];
                let wants = [
                    (&exact.dq, &rounded.dq),
                    (&exact.dk, &rounded.dk),
                    (&exact.dv, &rounded.dv),
                ];
                for ((name, g), (e, r)) in names.iter().zip(&got).zip(wants) {
                    assert_within_rule(&case, name, g, e, r, c.dtype);
                }
                // Rows that see no key (a right bound with sq > sk): dq exactly 0.
                let shift = sk as i64 - sq as i64 + i64::from(right);
                if right >= 0 && shift < 0 {
                    let blind = (-shift) as usize * d;
                    let dq = got[0].to_f64_vec();
                    for head in dq.chunks(sq * d) {
                        assert!(
                            head[..blind].iter().all(|&x| x == 0.0),
                            "{case}: rows that see no key must have dq = 0"
                        );
                    }
                }
                if deterministic {
                    let again = backward(dev, &p, &c, inputs, scale);
                    for ((name, a), b) in names.iter().zip(&got).zip(&again) {
                        assert!(a.data == b.data, "{case}: {name} differs between runs");
                    }
                }
            }
        }
    }
}

/// The varlen kernels on `dev` over packed batches whose sequences' lengths are no multiple
/// of any block and whose neighbouring rows a block must not read are NaN (the pad rows, the
/// inputs of a sequence without keys and of one without queries, right after the first
/// sequence's): a copy reading past a sequence's end shows as NaN. Both dQ modes, masks,
/// caps and grouped heads, head dims 64 and 128 (and `dv` apart: 192 / 128, 64 / 128), large
/// inputs, used lengths (the `_used` kernels); checked against each sequence's reference
/// gradients (with used lengths: over its used rows and keys, 0 past them).
fn run_varlen(dev: &Device, target: Target) {
    let mut rng = Rng::from_env();
    let packed = Packed {
        seqs: vec![(70, 50), (40, 0), (0, 30), (100, 75), (20, 60), (129, 131)],
        pad: (3, 5),
    };
    let used = vec![(70, 33), (0, 0), (0, 30), (64, 75), (20, 60), (100, 131)];
    for (d, dv, causal, window, softcap, deterministic, used) in [
        (64, 0, false, (-1, -1), 0.0, false, None),
        (128, 0, true, (40, -1), 0.0, true, None),
        (64, 0, false, (20, 10), 15.0, true, None),
        (128, 0, false, (-1, -1), 0.0, false, None),
        (192, 128, true, (-1, -1), 0.0, false, None),
        (64, 128, false, (-1, -1), 0.0, true, Some(used.clone())),
        (128, 0, true, (-1, -1), 0.0, false, Some(used.clone())),
        (64, 0, false, (30, 10), 0.0, true, Some(used.clone())),
    ] {
        let p = AttentionBwdParams {
            d,
            dv,
            causal,
            kv_group: 2,
            dtype: DType::Bf16,
            window_left: window.0,
            attention_chunk: 0,
            window_right: window.1,
            softcap,
            deterministic,
            ..AttentionBwdParams::default()
        };
        for dist in [Dist::Normal, Dist::Large] {
            let x = Problem::with_used(&mut rng, packed.clone(), used.clone(), p, (4, 2), dist);
            let up = |t: &HostTensor| dev.upload(t).expect("upload");
            let [q, k, v, dout, o, lse] = x.inputs.each_ref().map(up);
            let (cu_q, cu_k) = (up(&x.cu_q), up(&x.cu_k));
            let used_on = x.used.as_ref().map(|(uq, uk)| (up(uq), up(uk)));
            let (rows, acc_shape, kv_shape) = x.output_shapes();
            let delta = output(dev, DType::F32, &rows);
            let dq_accum = output(dev, DType::F32, &acc_shape);
            let dq = output(dev, p.dtype, &acc_shape);
            let dk = output(dev, p.dtype, &kv_shape);
            let dv = output(dev, p.dtype, &x.value_shape());
            let [qgrid, kgrid, dq_grid] = x.grids();
            let scale = x.scale;
            attention_bwd_preprocess_varlen
                .launch(dev, &p, qgrid, &o, &dout, &delta, &dq_accum, &cu_q, &cu_k)
                .expect("preprocess");
            match &used_on {
                None => attention_bwd_dkdv_varlen.launch(
                    dev, &p, kgrid, &q, &k, &v, &dout, &lse, &delta, &dq_accum, &dk, &dv, &cu_q,
                    &cu_k, scale,
                ),
                Some((uq, uk)) => attention_bwd_dkdv_varlen_used.launch(
                    dev, &p, kgrid, &q, &k, &v, &dout, &lse, &delta, &dq_accum, &dk, &dv, &cu_q,
                    &cu_k, uq, uk, scale,
                ),
            }
            .expect("dkdv");
            if deterministic {
                match &used_on {
                    None => attention_bwd_dq_varlen.launch(
                        dev, &p, dq_grid, &q, &k, &v, &dout, &lse, &delta, &dq, &cu_q, &cu_k, scale,
                    ),
                    Some((uq, uk)) => attention_bwd_dq_varlen_used.launch(
                        dev, &p, dq_grid, &q, &k, &v, &dout, &lse, &delta, &dq, &cu_q, &cu_k, uq,
                        uk, scale,
                    ),
                }
                .expect("dq");
            } else {
                attention_bwd_dq_convert_varlen
                    .launch(dev, &p, qgrid, &dq_accum, &dq, &cu_q, &cu_k, scale)
                    .expect("dq convert");
            }
            dev.synchronize().expect("kernels ran");
            let [dq, dk, dv] = [dq, dk, dv].map(|t| t.download().expect("download"));
            let name = format!("attention backward varlen@{target}");
            x.check(&name, &rng, dist, [&dq, &dk, &dv]);
        }
    }
}

fn gpu_attention_backward_varlen_on_sm80() {
    let Some(dev) = device() else { return };
    run_varlen(&dev, Target::Sm80);
}

fn gpu_attention_backward_varlen_on_sm90a() {
    let Some(dev) = device() else { return };
    if dev.compute_capability() != (9, 0) {
        println!("skipped: sm_90a needs a Hopper GPU");
        return;
    }
    run_varlen(&dev.with_target(Target::Sm90a), Target::Sm90a);
}

fn gpu_attention_backward_on_sm80() {
    let Some(dev) = device() else { return };
    run_calls(&dev, Target::Sm80);
}

fn gpu_attention_backward_on_sm90a() {
    let Some(dev) = device() else { return };
    if dev.compute_capability() != (9, 0) {
        println!("skipped: sm_90a needs a Hopper GPU");
        return;
    }
    run_calls(&dev.with_target(Target::Sm90a), Target::Sm90a);
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_attention_backward_on_sm80",
            Needs::Gpu,
            gpu_attention_backward_on_sm80,
        ),
        (
            "gpu_attention_backward_on_sm90a",
            Needs::Gpu,
            gpu_attention_backward_on_sm90a,
        ),
        (
            "gpu_attention_backward_varlen_on_sm80",
            Needs::Gpu,
            gpu_attention_backward_varlen_on_sm80,
        ),
        (
            "gpu_attention_backward_varlen_on_sm90a",
            Needs::Gpu,
            gpu_attention_backward_varlen_on_sm90a,
        ),
    ])
}
