//! The decode kernels (`kiln_examples::attention_decode`) on the GPU, for sm_80 and (on a
//! Hopper GPU) sm_90a, against the f64 reference of `flash_attn_with_kvcache`
//! (`decode_cases`): the interpreter's calls (dense and paged caches with pages of 1, 16 and
//! 256 keys, appended and rotated keys, GQA, masks, soft-caps, leftpads, 1, 3 and 7 splits),
//! every input distribution, the cache NaN wherever no sequence holds a key and the outputs
//! NaN before the run. The tensors are FlashAttention's (`[batch, seq, heads, d]`), the
//! caches and new keys read through transposed views, as the Python entry passes them.
//! Skips itself without a GPU.

mod decode_cases;
mod gpu_common;

use std::process::ExitCode;

use decode_cases::{Call, Inputs, Results};
use gpu_common::{Needs, devices, poisoned_output};
use kiln_examples::attention_decode::{
    attention_decode, attention_decode_combine, attention_decode_split, kv_cache_append, rotary_q,
};
use kiln_ir::DType;
use kiln_runtime::{Device, DeviceTensor, KernelArg};
use kiln_tests::inputs::{Dist, Rng};

/// Runs the call's kernels on `dev`, launched as the Python entry would: the append (new keys
/// and values), the query rotation (a rotary dim), the attention in one pass or split, then
/// the combine.
fn run(dev: &Device, c: &Call, x: &Inputs) -> Results {
    let p = c.params();
    let (b, sq, heads, d) = (c.batch(), c.sq, c.heads(), c.d);
    let dv = c.dv();
    let up = |t| dev.upload(t).expect("upload");
    let (k_cache, v_cache) = (up(&x.k_cache), up(&x.v_cache));
    // `[pages, page, heads_k, d]` read as `[pages, heads_k, page, d]`.
    let heads_first = |t: &DeviceTensor| t.transpose(1, 2).expect("view");
    let (k_view, v_view) = (heads_first(&k_cache), heads_first(&v_cache));
    let (table, seqlens, leftpad) = (up(&x.page_table), up(&x.seqlens), up(&x.leftpad));
    let (cos, sin) = (up(&x.cos), up(&x.sin));
    if c.s_new > 0 {
        let (k_new, v_new) = (up(&x.k_new), up(&x.v_new));
        let (k_new, v_new) = (heads_first(&k_new), heads_first(&v_new));
        let args = [
            KernelArg::Tensor(&k_new),
            KernelArg::Tensor(&v_new),
            KernelArg::Tensor(&k_view),
            KernelArg::Tensor(&v_view),
            KernelArg::Tensor(&table),
            KernelArg::Tensor(&seqlens),
            KernelArg::Tensor(&cos),
            KernelArg::Tensor(&sin),
        ];
        dev.launch(&kv_cache_append, &p, c.append_grid(), &args)
            .unwrap_or_else(|e| panic!("{c:?}: kv_cache_append: {e}"));
    }
    let q = up(&x.q);
    let q = if c.rotary.is_some() {
        let q_rot = poisoned_output(dev, c.dtype, &[b, sq, heads, d]);
        let args = [
            KernelArg::Tensor(&q),
            KernelArg::Tensor(&cos),
            KernelArg::Tensor(&sin),
            KernelArg::Tensor(&seqlens),
            KernelArg::Tensor(&q_rot),
        ];
        dev.launch(&rotary_q, &p, c.rotary_grid(), &args)
            .unwrap_or_else(|e| panic!("{c:?}: rotary_q: {e}"));
        q_rot
    } else {
        q
    };
    let out = poisoned_output(dev, c.dtype, &[b, sq, heads, dv]);
    let lse = poisoned_output(dev, DType::F32, &[b, heads, sq]);
    let cache = [&q, &k_view, &v_view, &table, &seqlens, &leftpad].map(KernelArg::Tensor);
    let scalars = [KernelArg::F32(x.scale), KernelArg::I32(c.s_new as i32)];
    if c.splits == 1 {
        let mut args = cache.to_vec();
        args.extend([KernelArg::Tensor(&out), KernelArg::Tensor(&lse)]);
        args.extend(scalars);
        dev.launch(&attention_decode, &p, c.attention_grid(), &args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode: {e}"));
    } else {
        let o_partial = poisoned_output(dev, DType::F32, &[c.splits * b, sq, heads, dv]);
        let lse_partial = poisoned_output(dev, DType::F32, &[c.splits * b, sq, heads]);
        let mut args = cache.to_vec();
        args.extend([
            KernelArg::Tensor(&o_partial),
            KernelArg::Tensor(&lse_partial),
        ]);
        args.extend(scalars);
        dev.launch(&attention_decode_split, &p, c.attention_grid(), &args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode_split: {e}"));
        let args = [&o_partial, &lse_partial, &out, &lse].map(KernelArg::Tensor);
        dev.launch(&attention_decode_combine, &p, c.combine_grid(), &args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode_combine: {e}"));
    }
    dev.synchronize().expect("kernels ran");
    let down = |t: &DeviceTensor| t.download().expect("download");
    Results {
        k_cache: down(&k_cache),
        v_cache: down(&v_cache),
        out: down(&out),
        lse: down(&lse),
    }
}

fn gpu_decode_matches_reference() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for c in decode_cases::calls() {
            for dist in Dist::ALL {
                let x = c.inputs(&mut rng, dist);
                let want = c.reference(&x);
                let got = run(&dev, &c, &x);
                let what = format!("decode on {}", dev.target());
                c.check(&c.case(&what, dist, &rng), &want, &got);
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[(
        "gpu_decode_matches_reference",
        Needs::Gpu,
        gpu_decode_matches_reference,
    )])
}
