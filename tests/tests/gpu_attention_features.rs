//! The attention example's FlashAttention features on the GPU (sm_80, and sm_90a on a Hopper
//! GPU) against the f64 reference: f16, sliding windows, chunks, soft-capping, head dim 96 and
//! grouped-query heads, over ragged lengths, `sq > sk` (rows outside every window must be 0),
//! every input distribution, NaN-poisoned outputs and K read through padded rows; then the
//! single-launch varlen kernels over packed ragged batches with empty sequences, against each
//! sequence's reference, and with offsets of any value, which must not fault.

mod gpu_common;
mod varlen_params;

use std::process::ExitCode;

use gpu_common::{Needs, device, upload_padded};
use kiln_examples::attention::{
    AttentionParams, attention, attention_varlen, attention_varlen_lse, tuned_blocks,
};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor, KernelArg};
use kiln_tests::check::{Case, assert_close, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;
use kiln_tests::varlen::{Packed, Varlen};

/// One call: `(batch, heads, kv heads, sq, sk, d)` and the comptime features.
struct Call {
    shape: [usize; 6],
    dtype: DType,
    causal: bool,
    window: (i32, i32),
    /// Keys per chunk (`attention_chunk`); 0: none.
    chunk: i32,
    softcap: f32,
}

/// The calls every target runs.
fn calls() -> Vec<Call> {
    let plain = |shape, dtype| Call {
        shape,
        dtype,
        causal: false,
        window: (-1, -1),
        chunk: 0,
        softcap: 0.0,
    };
    vec![
        plain([1, 2, 2, 150, 90, 64], DType::F16),
        Call {
            causal: true,
            ..plain([2, 2, 2, 200, 333, 128], DType::F16)
        },
        Call {
            window: (20, 0),
            ..plain([1, 2, 2, 300, 300, 64], DType::Bf16)
        },
        Call {
            window: (33, 17),
            ..plain([1, 2, 2, 200, 460, 128], DType::Bf16)
        },
        Call {
            window: (10, 5),
            ..plain([1, 1, 1, 500, 100, 64], DType::Bf16)
        },
        Call {
            window: (64, -1),
            causal: true,
            ..plain([1, 2, 2, 333, 333, 128], DType::F16)
        },
        Call {
            softcap: 5.0,
            ..plain([1, 2, 2, 150, 270, 64], DType::Bf16)
        },
        Call {
            softcap: 30.0,
            causal: true,
            ..plain([1, 2, 2, 257, 130, 128], DType::F16)
        },
        plain([1, 2, 2, 130, 200, 96], DType::Bf16),
        Call {
            window: (100, -1),
            softcap: 20.0,
            causal: true,
            ..plain([2, 4, 1, 300, 517, 96], DType::F16)
        },
        Call {
            chunk: 200,
            causal: true,
            ..plain([1, 2, 2, 650, 650, 128], DType::Bf16)
        },
        Call {
            chunk: 96,
            window: (40, -1),
            ..plain([1, 4, 2, 300, 420, 64], DType::F16)
        },
    ]
}

/// A poisoned output tensor on the device.
fn output(dev: &Device, dtype: DType, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(dtype, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// `t: [b, hkv, s, d]` with each head repeated `group` times, for the reference.
fn repeat_heads(t: &HostTensor, group: usize) -> HostTensor {
    let [b, hkv, s, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    let h = hkv * group;
    HostTensor::from_fn(&[b, h, s, d], t.dtype(), |i| {
        let (x, j, hh, n) = (i % d, i / d % s, i / (d * s) % h, i / (d * s * h));
        t.data.get_f64(t.offset(&[n, hh / group, j, x]))
    })
}

/// Runs every call on `dev` (compiling for its target) for every input distribution.
fn run_calls(dev: &Device, target: Target) {
    let mut rng = Rng::from_env();
    for c in calls() {
        let [b, h, h_kv, sq, sk, d] = c.shape;
        let group = h / h_kv;
        let params = AttentionParams {
            kv_group: group,
            dtype: c.dtype,
            window_left: c.window.0,
            window_right: c.window.1,
            attention_chunk: c.chunk,
            softcap: c.softcap,
            ..AttentionParams::tuned(target, d, c.causal, (sq, sk))
        };
        let name = format!(
            "attention@{target} d={d} {} causal={} window={:?} chunk={} softcap={} \
             kv_group={group}",
            c.dtype, c.causal, c.window, c.chunk, c.softcap
        );
        for dist in Dist::ALL {
            let q = tensor(&mut rng, &[b, h, sq, d], c.dtype, dist);
            let k = tensor(&mut rng, &[b, h_kv, sk, d], c.dtype, dist);
            let v = tensor(&mut rng, &[b, h_kv, sk, d], c.dtype, dist);
            let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
            let grid = attention.grid(&params, [sq, h, b]);
            let (dq, dk, dv) = (
                dev.upload(&q).expect("upload"),
                upload_padded(dev, &k, 8),
                dev.upload(&v).expect("upload"),
            );
            let o = output(dev, c.dtype, &[b, h, sq, d]);
            attention
                .launch(dev, &params, grid, &dq, &dk, &dv, &o, scale)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            dev.synchronize().expect("kernel ran");
            let got = o.download().expect("download");
            let case = Case {
                kernel: name.clone(),
                shape: format!("b={b} h={h} h_kv={h_kv} sq={sq} sk={sk} scale={scale}"),
                dist,
                seed: rng.seed(),
            };
            let right = if c.causal { 0 } else { c.window.1 };
            let want = reference::attention_window(
                &q,
                &repeat_heads(&k, group),
                &repeat_heads(&v, group),
                f64::from(scale),
                reference::Window {
                    left: i64::from(c.window.0),
                    right: i64::from(right),
                    chunk: i64::from(c.chunk),
                },
                (c.softcap > 0.0).then_some(f64::from(c.softcap)),
            );
            assert_close(&case, &got, &want, tolerance(c.dtype));
            // A row that sees no key is exactly 0 (sq > sk with a right bound).
            let diag_shift = sk as i64 - sq as i64 + i64::from(right);
            if right >= 0 && diag_shift < 0 {
                let blind = (-diag_shift) as usize;
                let out = got.to_f64_vec();
                for head in out.chunks(sq * d) {
                    assert!(
                        head[..blind * d].iter().all(|&x| x == 0.0),
                        "{name}: rows that see no key must be 0, KILN_SEED={}",
                        rng.seed()
                    );
                }
            }
        }
    }
}

/// The varlen calls every target runs: ragged batches with sequences of no query, no key or
/// neither, every feature.
fn varlen_calls() -> Vec<Varlen> {
    let ragged = [
        (100, 130),
        (0, 50),
        (257, 200),
        (40, 0),
        (1, 1),
        (0, 0),
        (1000, 700),
    ];
    vec![
        Varlen::new(&ragged),
        Varlen {
            causal: true,
            d: 128,
            ..Varlen::new(&ragged)
        },
        Varlen {
            dtype: DType::F16,
            causal: true,
            h: 4,
            h_kv: 2,
            ..Varlen::new(&[(300, 90), (77, 77), (5, 260), (513, 513)])
        },
        Varlen {
            window: (33, 17),
            d: 128,
            ..Varlen::new(&[(200, 460), (150, 150), (320, 100)])
        },
        Varlen {
            window: (20, -1),
            causal: true,
            softcap: 5.0,
            ..Varlen::new(&[(333, 333), (64, 200), (0, 9)])
        },
        Varlen {
            d: 96,
            softcap: 20.0,
            h: 2,
            h_kv: 1,
            ..Varlen::new(&[(129, 65), (1, 300), (600, 0)])
        },
    ]
}

/// The device tensors of one varlen launch: the packed inputs viewed `[1, heads, total, d]`,
/// the offsets, and the poisoned outputs (`o` packed `[total_q, h, d]` with its view, the
/// log-sum-exp `[1, h, total_q]`).
struct VarlenArgs {
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    o_view: DeviceTensor,
    lse: DeviceTensor,
    cu_q: DeviceTensor,
    cu_k: DeviceTensor,
}

impl VarlenArgs {
    fn new(dev: &Device, c: &Varlen, p: &Packed) -> VarlenArgs {
        // `[total, heads, d]` as the kernel's `[1, heads, total, d]`.
        let bhsd = |t: &DeviceTensor| {
            let [total, heads, d] = [t.shape()[0], t.shape()[1], t.shape()[2]];
            t.as_strided(
                &[1, heads, total, d],
                &[total * heads * d, d, heads * d, 1],
                0,
            )
            .expect("view")
        };
        let up = |t: &HostTensor| dev.upload(t).expect("upload");
        let (o, lse) = c.outputs();
        let (o, lse) = (
            output(dev, c.dtype, &o.shape),
            output(dev, DType::F32, &lse.shape),
        );
        VarlenArgs {
            q: bhsd(&up(&p.q)),
            k: bhsd(&up(&p.k)),
            v: bhsd(&up(&p.v)),
            o_view: bhsd(&o),
            o,
            lse,
            cu_q: up(&p.cu_q),
            cu_k: up(&p.cu_k),
        }
    }

    /// Launches the kernel (its lse form when `lse`) with comptime values `ct` over `grid`;
    /// waits for it.
    fn launch(&self, dev: &Device, ct: &AttentionParams, grid: [u32; 3], lse: bool, scale: f32) {
        let mut args = vec![
            KernelArg::Tensor(&self.q),
            KernelArg::Tensor(&self.k),
            KernelArg::Tensor(&self.v),
            KernelArg::Tensor(&self.o_view),
        ];
        if lse {
            args.push(KernelArg::Tensor(&self.lse));
        }
        args.extend([
            KernelArg::Tensor(&self.cu_q),
            KernelArg::Tensor(&self.cu_k),
            KernelArg::F32(scale),
        ]);
        let def: &dyn KernelDef<Comptime = AttentionParams> = if lse {
            &attention_varlen_lse
        } else {
            &attention_varlen
        };
        dev.launch(def, ct, grid, &args)
            .unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        dev.synchronize().expect("kernel ran");
    }
}

/// The blocks `kiln_attn` launches a packed batch `c` with: the tuned choice for the rows of
/// its packed query and key tensors.
fn varlen_blocks(target: Target, c: &Varlen) -> (usize, usize) {
    let rows = c.seqs.iter().fold(c.pad, |(q, k), s| (q + s.0, k + s.1));
    tuned_blocks(target, c.d, c.causal, rows)
}

/// Runs every varlen call on `dev` for every input distribution (the log-sum-exp form every
/// other run), then one call with offsets of any value.
fn run_varlen(dev: &Device, target: Target) {
    let mut rng = Rng::from_env();
    for (i, c) in varlen_calls().into_iter().enumerate() {
        let (block_m, block_n) = varlen_blocks(target, &c);
        let ct = varlen_params::params(&c, block_n, block_m);
        for (j, dist) in Dist::ALL.into_iter().enumerate() {
            let lse = (i + j).is_multiple_of(2);
            let p = c.inputs(&mut rng, dist);
            let a = VarlenArgs::new(dev, &c, &p);
            a.launch(dev, &ct, c.grid(block_m), lse, p.scale);
            let case = c.case(&format!("attention_varlen@{target}"), dist, &rng);
            let (o, l) = (
                a.o.download().expect("download"),
                a.lse.download().expect("download"),
            );
            c.check(&case, &p, &o, lse.then_some(&l));
        }
    }
    // Decreasing, huge and negative offsets, and a grid of more sequences than they hold: the
    // kernel must stay inside every tensor (a fault fails the synchronisation).
    let c = Varlen::new(&[(60, 70)]);
    let p = c.inputs(&mut rng, Dist::Normal);
    let (block_m, block_n) = varlen_blocks(target, &c);
    let ct = varlen_params::params(&c, block_n, block_m);
    let offsets = |cu: &[i32]| {
        HostTensor::new(&[cu.len()], kiln_ir::TensorData::I32(cu.to_vec())).expect("offsets")
    };
    for (cu_q, cu_k, batch) in [
        (&[0, 60, 30, 40][..], &[0, 70, 10, 500][..], 3),
        (&[0, 60, 1 << 30, i32::MAX], &[0, 70, -5, i32::MIN], 3),
        (&[0, 60, -100, 50], &[0, 70, 0, 40], 3),
        (&[0, 60], &[0, 70], 4),
    ] {
        let bad = Packed {
            cu_q: offsets(cu_q),
            cu_k: offsets(cu_k),
            ..p.clone()
        };
        let a = VarlenArgs::new(dev, &c, &bad);
        let grid = [c.totals().0.div_ceil(128) as u32 + 1, c.h as u32, batch];
        a.launch(dev, &ct, grid, true, p.scale);
        // The padding rows past every offset stay poisoned.
        let row = c.h * c.d;
        let o = a.o.download().expect("download").to_f64_vec();
        let past = cu_q
            .iter()
            .map(|&x| x.clamp(0, 63) as usize)
            .max()
            .unwrap_or(0);
        assert!(
            o[past * row..].iter().all(|x| x.is_nan()),
            "{target} offsets {cu_q:?}: rows past every sequence written"
        );
    }
}

fn gpu_attention_varlen_on_sm80() {
    let Some(dev) = device() else { return };
    run_varlen(&dev, Target::Sm80);
}

fn gpu_attention_varlen_on_sm90a() {
    let Some(dev) = device() else { return };
    if dev.compute_capability() != (9, 0) {
        println!("skipped: sm_90a needs a Hopper GPU");
        return;
    }
    run_varlen(&dev.with_target(Target::Sm90a), Target::Sm90a);
}

fn gpu_attention_features_on_sm80() {
    let Some(dev) = device() else { return };
    run_calls(&dev, Target::Sm80);
}

fn gpu_attention_features_on_sm90a() {
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
            "gpu_attention_features_on_sm80",
            Needs::Gpu,
            gpu_attention_features_on_sm80,
        ),
        (
            "gpu_attention_features_on_sm90a",
            Needs::Gpu,
            gpu_attention_features_on_sm90a,
        ),
        (
            "gpu_attention_varlen_on_sm80",
            Needs::Gpu,
            gpu_attention_varlen_on_sm80,
        ),
        (
            "gpu_attention_varlen_on_sm90a",
            Needs::Gpu,
            gpu_attention_varlen_on_sm90a,
        ),
    ])
}
