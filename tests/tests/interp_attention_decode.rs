//! The decode kernels (`kv_cache_append`, `attention_decode`, `attention_decode_split`,
//! `attention_decode_combine`) on the CPU interpreter against the f64 reference of
//! `flash_attn_with_kvcache` (`decode_cases`): batches of 3 with ragged cache lengths (0 and 1
//! among them), dense caches (with `cache_batch_idx`) and paged ones (pages of 1, 16 and 256
//! keys, a random page table), appends rotated in both layouts, groups of 1, 4 and 8 heads,
//! causal, windows, soft-caps, leftpads, 1, 3 and 7 splits, 1 and 5 query tokens, every head
//! dim, f16 and bf16. Cache slots no sequence holds and every output start as NaN: the cache
//! after the append must equal the reference's, and no NaN may leak into an output.

mod decode_cases;

use decode_cases::{Call, Inputs, Results, heads_first, seq_first};
use kiln::ir::interp::{HostArg, run_def};
use kiln_examples::attention_decode::{
    attention_decode, attention_decode_combine, attention_decode_split, kv_cache_append, rotary_q,
};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::poisoned;
use kiln_tests::inputs::{Dist, Rng};

/// Runs the call's kernels on the interpreter: the append (when there are new keys), then
/// the attention in one pass or split and combined.
fn run(c: &Call, x: &Inputs) -> Results {
    let p = c.params();
    let (b, sq, heads, d) = (c.batch(), c.sq, c.heads(), c.d);
    let dv = c.dv();
    let mut k_cache = heads_first(x.k_cache.clone());
    let mut v_cache = heads_first(x.v_cache.clone());
    if c.s_new > 0 {
        let (k_new, v_new) = (heads_first(x.k_new.clone()), heads_first(x.v_new.clone()));
        let mut args = [
            HostArg::Tensor(&k_new),
            HostArg::Tensor(&v_new),
            HostArg::TensorMut(&mut k_cache),
            HostArg::TensorMut(&mut v_cache),
            HostArg::Tensor(&x.page_table),
            HostArg::Tensor(&x.seqlens),
            HostArg::Tensor(&x.cos),
            HostArg::Tensor(&x.sin),
        ];
        run_def(&kv_cache_append, &p, c.append_grid(), &mut args)
            .unwrap_or_else(|e| panic!("{c:?}: kv_cache_append: {e}"));
    }
    let q = if c.rotary.is_some() {
        let mut q_rot = poisoned(&[b, sq, heads, d], c.dtype);
        let mut args = [
            HostArg::Tensor(&x.q),
            HostArg::Tensor(&x.cos),
            HostArg::Tensor(&x.sin),
            HostArg::Tensor(&x.seqlens),
            HostArg::TensorMut(&mut q_rot),
        ];
        run_def(&rotary_q, &p, c.rotary_grid(), &mut args)
            .unwrap_or_else(|e| panic!("{c:?}: rotary_q: {e}"));
        q_rot
    } else {
        x.q.clone()
    };
    let mut out = poisoned(&[b, sq, heads, dv], c.dtype);
    let mut lse = poisoned(&[b, heads, sq], DType::F32);
    let inputs: [HostTensor; 6] = [
        q,
        k_cache.clone(),
        v_cache.clone(),
        x.page_table.clone(),
        x.seqlens.clone(),
        x.leftpad.clone(),
    ];
    let scalars = [HostArg::F32(x.scale), HostArg::I32(c.s_new as i32)];
    if c.splits == 1 {
        let mut args: Vec<HostArg> = inputs.iter().map(HostArg::Tensor).collect();
        args.push(HostArg::TensorMut(&mut out));
        args.push(HostArg::TensorMut(&mut lse));
        args.extend(scalars);
        run_def(&attention_decode, &p, c.attention_grid(), &mut args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode: {e}"));
    } else {
        let mut o_partial = poisoned(&[c.splits * b, sq, heads, dv], DType::F32);
        let mut lse_partial = poisoned(&[c.splits * b, sq, heads], DType::F32);
        let mut args: Vec<HostArg> = inputs.iter().map(HostArg::Tensor).collect();
        args.push(HostArg::TensorMut(&mut o_partial));
        args.push(HostArg::TensorMut(&mut lse_partial));
        args.extend(scalars);
        run_def(&attention_decode_split, &p, c.attention_grid(), &mut args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode_split: {e}"));
        drop(args);
        let mut args = [
            HostArg::Tensor(&o_partial),
            HostArg::Tensor(&lse_partial),
            HostArg::TensorMut(&mut out),
            HostArg::TensorMut(&mut lse),
        ];
        run_def(&attention_decode_combine, &p, c.combine_grid(), &mut args)
            .unwrap_or_else(|e| panic!("{c:?}: attention_decode_combine: {e}"));
    }
    Results {
        k_cache: seq_first(k_cache),
        v_cache: seq_first(v_cache),
        out,
        lse,
    }
}

#[test]
fn decode_matches_reference() {
    let mut rng = Rng::from_env();
    for c in decode_cases::calls() {
        for dist in Dist::ALL {
            let x = c.inputs(&mut rng, dist);
            let want = c.reference(&x);
            let got = run(&c, &x);
            c.check(&c.case("decode", dist, &rng), &want, &got);
        }
    }
}

#[test]
fn page_tables_and_lengths_of_any_value() {
    // Spare page-table entries (past the pages a sequence holds) of any value change
    // nothing: the gathered rows past a sequence's end read them, and must add no NaN.
    let mut rng = Rng::from_env();
    let c = Call {
        s_new: 2,
        page: Some(16),
        splits: 3,
        ..Call::new(1, 4, 64, 2, &[40, 3, 70])
    };
    let mut x = c.inputs(&mut rng, Dist::Normal);
    let pps = x.page_table.shape[1];
    let want = c.reference(&x);
    for (s, &n) in c.lens.iter().enumerate() {
        let used = (n + c.s_new).div_ceil(16);
        for (i, e) in (used..pps).enumerate() {
            let junk = [-7.0, f64::from(i32::MAX), 1e6][i % 3];
            x.page_table.data.set_f64(s * pps + e, junk);
        }
    }
    let got = run(&c, &x);
    c.check(
        &c.case("decode, junk spare pages", Dist::Normal, &rng),
        &want,
        &got,
    );
    // Every entry junk, lengths past the cache or negative: the kernels build and run (the
    // interpreter clips every access at its tensor, as the GPU's bounds checks do; on the
    // GPU compute-sanitizer is the check), whatever they compute.
    for (i, e) in (0..x.page_table.data.len()).enumerate() {
        let junk = [-1.0, 1e9, f64::from(i32::MIN), 5.0][i % 4];
        x.page_table.data.set_f64(e, junk);
    }
    for s in 0..c.batch() {
        x.seqlens.data.set_f64(s, [700.0, -50.0, 1000.0][s % 3]);
    }
    x.leftpad.data.set_f64(1, 9.0);
    let c = Call {
        lens: vec![0; 3],
        ..c
    };
    run(&c, &x);
}
