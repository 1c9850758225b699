//! The DSL gemm (B row- and column-major, and in 2-CTA clusters) and the attention example
//! compiled for sm_90a (TMA stage rings, warp specialisation, wgmma) on the GPU against the
//! f64 reference: odd shapes, every input distribution, outputs poisoned with NaN, exact
//! small-integer runs that name the first wrong elements, fully masked rows, unaligned views
//! on the cp.async fallback. What each test covers: `docs/testing.md`, "GPU tests".
//! Without a Hopper GPU the tests are reported ignored, with the reason.

mod gpu_common;
mod softcap;

use std::process::ExitCode;

use gpu_common::{Needs, device, upload_padded};
use kiln_examples::attention::{AttentionParams, attention};
use kiln_examples::gemm::{GemmComptime, gemm};
use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor, DiskCache};
use kiln_tests::check::{Case, assert_close, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// The GPU as an sm_90a device, or `None` (printed) when there is none or it is not Hopper.
fn hopper() -> Option<Device> {
    let dev = device()?;
    if dev.compute_capability() != (9, 0) {
        println!(
            "skipped: sm_90a needs a Hopper GPU, found {} (sm_{}{})",
            dev.name(),
            dev.compute_capability().0,
            dev.compute_capability().1
        );
        return None;
    }
    Some(dev.with_target(Target::Sm90a))
}

/// A poisoned output tensor on the device.
fn output(dev: &Device, shape: &[usize]) -> DeviceTensor {
    let t = dev.alloc(DType::Bf16, shape).expect("alloc");
    dev.fill_nan(&t).expect("poison");
    t
}

/// The comptime values of the gemm's tile shape, B layout and CTAs per cluster along M.
fn tiles((bm, bn, bk): (usize, usize, usize), b_col_major: bool, cluster: usize) -> GemmComptime {
    GemmComptime {
        CLUSTER_M: cluster,
        BM: bm,
        BN: bn,
        BK: bk,
        b_col_major,
        ..GemmComptime::default()
    }
}

/// The stored shape of `b`: `[k, n]`, or `[n, k]` holding B column-major.
fn b_shape(b_col_major: bool, k: usize, n: usize) -> [usize; 2] {
    if b_col_major { [n, k] } else { [k, n] }
}

/// The f64 reference of `a @ B` for `b` stored as [`b_shape`] says.
fn want(a: &HostTensor, b: &HostTensor, b_col_major: bool) -> Vec<f64> {
    if b_col_major {
        reference::gemm_bt(a, b)
    } else {
        reference::gemm(a, b)
    }
}

/// Runs `c = a @ B` on the GPU in clusters of `cluster` with `b`'s rows padded by `pad`
/// elements and checks it.
#[allow(clippy::too_many_arguments)]
fn run_case(
    dev: &Device,
    rng: &mut Rng,
    tile: (usize, usize, usize),
    b_col_major: bool,
    cluster: usize,
    (m, n, k): (usize, usize, usize),
    pad: usize,
    dist: Dist,
    expect_tma: bool,
) {
    let (bm, bn, bk) = tile;
    let a = tensor(rng, &[m, k], DType::Bf16, dist);
    let b_dims = b_shape(b_col_major, k, n);
    let b = tensor(rng, &b_dims, DType::Bf16, dist);
    let (da, db) = (dev.upload(&a).expect("upload"), upload_padded(dev, &b, pad));
    let c = output(dev, &[m, n]);
    // The specialisation `launch` picks: bf16 rows are 16-byte aligned when their length
    // is a multiple of 8 (allocations are).
    let spec = Spec {
        comptime: tiles(tile, b_col_major, cluster),
        aligned16: [("a", k), ("b", b_dims[1] + pad), ("c", n)]
            .into_iter()
            .map(|(t, row)| (t.to_string(), row % 8 == 0))
            .collect(),
    };
    let loaded = dev.compile(&gemm, &spec).expect("compile for sm_90a");
    assert_eq!(
        !loaded.ptx().tensor_maps.is_empty(),
        expect_tma,
        "m={m} n={n} k={k} pad={pad}: TMA path expected {expect_tma}"
    );
    assert_eq!(
        loaded.cluster_width(),
        cluster as u32,
        "the entry's cluster shape"
    );
    launch(dev, tile, b_col_major, cluster, m, n, [&da, &db, &c]);
    let got = c.download().expect("download");
    let case = Case {
        kernel: format!(
            "gemm@sm_90a BM={bm} BN={bn} BK={bk} b_col_major={b_col_major} CLUSTER_M={cluster}"
        ),
        shape: format!("m={m} n={n} k={k}, b row stride {}", b_dims[1] + pad),
        dist,
        seed: rng.seed(),
    };
    assert_close(
        &case,
        &got,
        &want(&a, &b, b_col_major),
        tolerance(DType::Bf16),
    );
}

/// Launches the gemm on sm_90a through the typed-argument path.
fn launch(
    dev: &Device,
    tile: (usize, usize, usize),
    b_col_major: bool,
    cluster: usize,
    m: usize,
    n: usize,
    ts: [&DeviceTensor; 3],
) {
    let c = tiles(tile, b_col_major, cluster);
    let [a, b, out] = ts;
    gemm.launch(dev, &c, gemm.grid(&c, [m, n, 1]), a, b, out)
        .expect("launch");
    dev.synchronize().expect("kernel ran");
}

/// `c = a @ B` on entries in {-2, .., 2}, where every partial sum is an integer of magnitude
/// at most 4 k <= 256, exact in f32 and in bf16: the result must equal the reference, and
/// the first wrong elements are named.
fn exact_case(
    dev: &Device,
    rng: &mut Rng,
    tile: (usize, usize, usize),
    b_col_major: bool,
    cluster: usize,
    (m, n, k): (usize, usize, usize),
) {
    let a = HostTensor::from_fn(&[m, k], DType::Bf16, |_| rng.range(0, 5) as f64 - 2.0);
    let b = HostTensor::from_fn(&b_shape(b_col_major, k, n), DType::Bf16, |_| {
        rng.range(0, 5) as f64 - 2.0
    });
    let (da, db) = (
        dev.upload(&a).expect("upload"),
        dev.upload(&b).expect("upload"),
    );
    let c = output(dev, &[m, n]);
    launch(dev, tile, b_col_major, cluster, m, n, [&da, &db, &c]);
    let got = c.download().expect("download").to_f64_vec();
    let want = want(&a, &b, b_col_major);
    let wrong: Vec<String> = (0..m * n)
        .filter(|&i| got[i] != want[i])
        .take(8)
        .map(|i| format!("({}, {}): got {} want {}", i / n, i % n, got[i], want[i]))
        .collect();
    assert!(
        wrong.is_empty(),
        "gemm@sm_90a tile {tile:?} b_col_major={b_col_major} CLUSTER_M={cluster}, m={m} n={n} \
         k={k}, seed {}: first wrong elements {wrong:?}",
        rng.seed()
    );
}

fn gpu_sm90a_gemm_is_exact_on_small_integers() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    for (tile, b_col_major) in [
        ((128, 128, 32), false),
        ((128, 128, 64), false),
        ((128, 256, 64), false),
        ((128, 128, 16), false),
        ((128, 128, 64), true),
        ((128, 256, 64), true),
        ((128, 128, 32), true),
        ((128, 128, 16), true),
        // The small-M tile: one consumer warpgroup.
        ((64, 128, 64), false),
        ((64, 256, 64), true),
    ] {
        exact_case(&dev, &mut rng, tile, b_col_major, 1, (256, 256, 64));
    }
}

/// Launches of one loaded gemm over other tensors, or over another view of the same memory,
/// read those tensors: each launch's tensor maps are its own, however the runtime reuses them
/// (`tensor_map_cache`). Exact small-integer inputs, every result checked.
fn gpu_sm90a_gemm_launches_read_each_launchs_tensors() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    let (tile, (m, n, k)) = ((128, 128, 64), (256, 256, 128));
    let input = |rng: &mut Rng, shape: &[usize]| {
        HostTensor::from_fn(shape, DType::Bf16, |_| rng.range(0, 5) as f64 - 2.0)
    };
    let hosts: Vec<[HostTensor; 2]> = (0..2)
        .map(|_| [input(&mut rng, &[m, k]), input(&mut rng, &[k, n])])
        .collect();
    let device: Vec<[DeviceTensor; 2]> = hosts
        .iter()
        .map(|[a, b]| [a, b].map(|t| dev.upload(t).expect("upload")))
        .collect();
    // (a, b, rows of a used): set 0, set 1, set 0 again, a mix, then the first half of set
    // 1's a (the same address as before, another shape).
    for (case, (ia, ib, rows)) in [(0, 0, m), (1, 1, m), (0, 0, m), (0, 1, m), (1, 0, m / 2)]
        .into_iter()
        .enumerate()
    {
        let a = device[ia][0].narrow(0, 0, rows).expect("rows of a");
        let c = output(&dev, &[rows, n]);
        launch(&dev, tile, false, 1, rows, n, [&a, &device[ib][1], &c]);
        let got = c.download().expect("download").to_f64_vec();
        let full = want(&hosts[ia][0], &hosts[ib][1], false);
        let wrong = (0..rows * n).filter(|&i| got[i] != full[i]).count();
        assert_eq!(
            wrong,
            0,
            "launch {case} (a of set {ia}, {rows} rows; b of set {ib}): {wrong} wrong \
             elements, seed {}",
            rng.seed()
        );
    }
}

fn gpu_sm90a_gemm_matches_reference() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    // (m, n, k): a tile, edge tiles in M and N, a K tail (k % BK != 0), K shorter than the
    // 3-stage ring, and enough K for several wraps of the ring (phase bits flip).
    let shapes = [
        (128, 128, 32),
        (136, 200, 56),
        (257, 136, 104),
        (64, 64, 16),
        (384, 256, 1000),
        (512, 384, 1024),
    ];
    for b_col_major in [false, true] {
        for tile in [
            (128, 128, 32),
            (128, 128, 64),
            (128, 256, 64),
            (64, 128, 64),
            // Three consumer warpgroups.
            (192, 128, 64),
        ] {
            for shape in shapes {
                for dist in Dist::ALL {
                    run_case(&dev, &mut rng, tile, b_col_major, 1, shape, 8, dist, true);
                }
            }
        }
    }
}

fn gpu_sm90a_unaligned_gemm_falls_back_to_cp_async() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    for b_col_major in [false, true] {
        for shape in [(130, 70, 50), (128, 128, 64)] {
            run_case(
                &dev,
                &mut rng,
                (128, 128, 32),
                b_col_major,
                1,
                shape,
                1,
                Dist::Normal,
                false,
            );
        }
    }
}

fn gpu_sm90a_attention_matches_reference() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    // (batch, heads, sq, sk, d, causal, block_n); sq > sk with causal gives fully masked rows;
    // block_n 0 is the kernel's default key block.
    let cases = [
        (1, 2, 128, 128, 64, false, 0, 128),
        (1, 2, 128, 128, 128, true, 0, 128),
        (2, 1, 100, 100, 64, true, 0, 128),
        (1, 2, 150, 90, 64, true, 0, 128),
        (1, 2, 150, 90, 128, true, 0, 128),
        (2, 3, 200, 333, 128, false, 0, 128),
        (1, 1, 64, 300, 128, true, 0, 128),
        (1, 2, 300, 40, 64, true, 0, 128),
        (1, 1, 1000, 1000, 64, true, 0, 128),
        (1, 1, 700, 1100, 128, false, 0, 128),
        (1, 2, 150, 90, 128, true, 128, 128),
        (2, 1, 1000, 1000, 128, true, 128, 128),
        (1, 2, 700, 1100, 128, false, 128, 128),
        (1, 1, 4097, 4097, 128, false, 128, 128),
        (1, 2, 300, 333, 256, false, 0, 128),
        (1, 1, 1000, 1000, 256, true, 0, 128),
        // Three consumer warpgroups (192 query rows): odd lengths, sq != sk, rows with no
        // visible key (causal, sq > sk), a ragged last block.
        (1, 2, 128, 128, 64, false, 128, 192),
        (2, 1, 100, 100, 64, true, 128, 192),
        (1, 2, 300, 40, 64, true, 128, 192),
        (1, 1, 1000, 1000, 64, true, 128, 192),
        (2, 3, 200, 333, 64, false, 128, 192),
        (1, 1, 4097, 4097, 64, false, 128, 192),
        (1, 2, 700, 1100, 64, true, 64, 192),
    ];
    for case in cases {
        attention_case(&dev, &mut rng, case);
    }
}

/// `(batch, heads, sq, sk, d, causal, block_n, block_m)`.
type AttentionCase = (usize, usize, usize, usize, usize, bool, usize, usize);

/// One attention shape `(batch, heads, sq, sk, d, causal, block_n, block_m)` on `dev` for
/// every input distribution, against the f64 reference.
fn attention_case(
    dev: &Device,
    rng: &mut Rng,
    (b, h, sq, sk, d, causal, block_n, block_m): AttentionCase,
) {
    // Every tensor 16-byte aligned: the TMA path.
    let p = AttentionParams {
        d,
        causal,
        block_n,
        block_m,
        ..AttentionParams::default()
    };
    let spec = Spec::uniform(p, attention.signature(), true);
    let loaded = dev.compile(&attention, &spec).expect("compile for sm_90a");
    assert!(
        !loaded.ptx().tensor_maps.is_empty() && loaded.ptx().persistent,
        "attention d={d} causal={causal}: the persistent TMA ring is expected"
    );
    for dist in Dist::ALL {
        let q = tensor(rng, &[b, h, sq, d], DType::Bf16, dist);
        let k = tensor(rng, &[b, h, sk, d], DType::Bf16, dist);
        let v = tensor(rng, &[b, h, sk, d], DType::Bf16, dist);
        // The usual 1/sqrt(d), perturbed so that no test depends on one exact scale.
        let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
        let grid = attention.grid(&p, [sq, h, b]);
        let dq = dev.upload(&q).expect("upload");
        // K through padded rows: a tensor map over a non-contiguous (aligned) stride.
        let dk = upload_padded(dev, &k, 8);
        let dv = dev.upload(&v).expect("upload");
        let o = output(dev, &[b, h, sq, d]);
        attention
            .launch(dev, &p, grid, &dq, &dk, &dv, &o, scale)
            .expect("launch");
        dev.synchronize().expect("kernel ran");
        let case = Case {
            kernel: format!(
                "attention@sm_90a d={d} causal={causal} block_n={block_n} block_m={block_m}"
            ),
            shape: format!(
                "b={b} h={h} sq={sq} sk={sk} scale={scale}, k row stride {}",
                d + 8
            ),
            dist,
            seed: rng.seed(),
        };
        let want = reference::attention(&q, &k, &v, f64::from(scale), causal);
        assert_close(
            &case,
            &o.download().expect("download"),
            &want,
            tolerance(DType::Bf16),
        );
    }
}

/// A persistent kernel's CTAs walk every work tile of the logical grid, the ring and its
/// once barriers carried from tile to tile: with 1, 3 and 7 CTAs, each runs many tiles of
/// different trip counts (causal query blocks of one, many and no key blocks; the split ring
/// of d = 256; gemm tiles in grouped order).
fn gpu_sm90a_persistent_ctas_walk_every_tile() {
    for ctas in [1, 3, 7] {
        let Some(dev) = hopper() else { return };
        let dev = dev.with_persistent_ctas(Some(ctas));
        let mut rng = Rng::from_env();
        for case in [
            (2, 3, 1000, 1000, 128, true, 128, 128),
            (1, 2, 700, 300, 64, true, 0, 128),
            (2, 1, 300, 4097, 64, false, 0, 128),
            // Three consumer warpgroups' turns carried across tiles.
            (2, 1, 1000, 1000, 64, true, 128, 192),
            // d = 256: the split ring (V on its own barriers) carried across tiles.
            (1, 2, 500, 700, 256, true, 0, 128),
        ] {
            attention_case(&dev, &mut rng, case);
        }
        // Gemm tiles in groups of 8 x blocks: 11 x blocks make a full group and a narrow one.
        for shape in [(384, 256, 1000), (1300, 384, 520)] {
            run_case(
                &dev,
                &mut rng,
                (128, 128, 64),
                false,
                1,
                shape,
                8,
                Dist::Normal,
                true,
            );
        }
    }
}

/// The autotuner times attention's `block_n` candidates once per shape bucket, keeps the
/// winner in memory and in the disk cache, where a new device (as a new process would) finds
/// it without timing anything; the chosen kernel computes the reference's result.
fn gpu_sm90a_autotune_picks_and_keeps_a_key_block() {
    let Some(dev) = hopper() else { return };
    let dir = std::env::temp_dir().join(format!("kiln-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = Some(DiskCache::at(&dir));
    let dev = dev.with_disk_cache(cache.clone());
    let mut rng = Rng::from_env();
    let (b, h, s, d) = (1, 4, 1000, 128);
    let q = tensor(&mut rng, &[b, h, s, d], DType::Bf16, Dist::Normal);
    let k = tensor(&mut rng, &[b, h, s, d], DType::Bf16, Dist::Normal);
    let v = tensor(&mut rng, &[b, h, s, d], DType::Bf16, Dist::Normal);
    let (dq, dk, dv) = (
        dev.upload(&q).expect("upload"),
        dev.upload(&k).expect("upload"),
        dev.upload(&v).expect("upload"),
    );
    let o = output(&dev, &[b, h, s, d]);
    let scale = 1.0 / (d as f32).sqrt();
    // Each candidate's grid has its own block_m's rows per block.
    let grid = |p: &AttentionParams| attention.grid(p, [s, h, b]);
    let p = AttentionParams {
        d,
        ..AttentionParams::default()
    };
    let spec = Spec::uniform(p, attention.signature(), true);
    let tune = |dev: &Device| {
        let mut runs = 0;
        let chosen = dev
            .autotune(&attention, &spec, "s=1000", &mut |c| {
                runs += 1;
                attention.launch(dev, c, grid(c), &dq, &dk, &dv, &o, scale)
            })
            .expect("autotune");
        (chosen, runs)
    };
    let (chosen, runs) = tune(&dev);
    let block_n = chosen.block_n;
    println!("chose {block_n} after {runs} runs");
    assert!(runs >= 2, "the candidates were timed");
    assert!([64, 128, 160, 192].contains(&block_n));
    assert_eq!(tune(&dev), (chosen, 0), "kept in memory");
    let record = dev
        .autotune_record(&attention, &spec, "s=1000")
        .expect("the search is on disk");
    let candidates = kiln_runtime::autotune::candidates(&p).len();
    assert_eq!(record.timings.len(), candidates, "every candidate recorded");
    assert!(record.timings.iter().any(|t| t.result.is_ok()));
    let fresh = hopper().expect("the same GPU").with_disk_cache(cache);
    assert_eq!(tune(&fresh), (chosen, 0), "kept on disk");
    dev.fill_nan(&o).expect("poison");
    attention
        .launch(&dev, &chosen, grid(&chosen), &dq, &dk, &dv, &o, scale)
        .expect("launch");
    let case = Case {
        kernel: format!("autotuned attention@sm_90a block_n={block_n}"),
        shape: format!("b={b} h={h} s={s} d={d}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    let want = reference::attention(&q, &k, &v, f64::from(scale), false);
    assert_close(
        &case,
        &o.download().expect("download"),
        &want,
        tolerance(DType::Bf16),
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

fn gpu_sm90a_softcap_attention_matches_reference() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    // (batch, heads, sq, sk, d): lengths that are not multiples of either block, several
    // wraps of the ring.
    for (b, h, sq, sk, d) in [
        (1, 2, 200, 333, 128),
        (1, 1, 1000, 777, 64),
        (2, 1, 128, 4097, 128),
    ] {
        let loaded = dev
            .compile(&softcap::softcap_attention, &softcap::spec(d))
            .expect("compile");
        assert!(
            loaded.ptx().ptx.contains("rotated loop: steady state"),
            "soft-capped attention d={d}: the overlap schedule is expected"
        );
        for dist in Dist::ALL {
            let q = tensor(&mut rng, &[b, h, sq, d], DType::Bf16, dist);
            let k = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, dist);
            let v = tensor(&mut rng, &[b, h, sk, d], DType::Bf16, dist);
            let scale = (rng.uniform(0.5, 1.5) / (d as f64).sqrt()) as f32;
            let cap = rng.uniform(10.0, 50.0) as f32;
            let (dq, dk, dv) = (
                dev.upload(&q).expect("upload"),
                dev.upload(&k).expect("upload"),
                dev.upload(&v).expect("upload"),
            );
            let o = output(&dev, &[b, h, sq, d]);
            let grid = [sq.div_ceil(128) as u32, h as u32, b as u32];
            let c = softcap::SoftcapAttentionComptime { d };
            softcap::softcap_attention
                .launch(&dev, &c, grid, &dq, &dk, &dv, &o, scale, cap)
                .expect("launch");
            dev.synchronize().expect("kernel ran");
            let case = Case {
                kernel: format!("softcap_attention@sm_90a d={d}"),
                shape: format!("b={b} h={h} sq={sq} sk={sk} scale={scale} cap={cap}"),
                dist,
                seed: rng.seed(),
            };
            let want = reference::attention_softcap(&q, &k, &v, f64::from(scale), f64::from(cap));
            assert_close(
                &case,
                &o.download().expect("download"),
                &want,
                tolerance(DType::Bf16),
            );
        }
    }
}

/// The clustered variants of the gemm (`CLUSTER_M = 2`: M-adjacent pairs of CTAs share B's
/// tile, each multicasting half of its boxes into both): tile width, B layout, the 64-row
/// tile and a 32-wide K step.
const CLUSTERED: [((usize, usize, usize), bool); 6] = [
    ((128, 128, 64), false),
    ((128, 128, 64), true),
    ((128, 256, 64), false),
    ((128, 256, 64), true),
    ((64, 128, 64), false),
    ((128, 128, 32), true),
];

/// Clustered gemms on small integers, exact: 3 and 5 M blocks leave a ragged last pair
/// (its second tile past the grid loads zeros and stores nothing), 264 columns a ragged N.
fn gpu_sm90a_clustered_gemm_is_exact_on_small_integers() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    for (tile, b_col_major) in CLUSTERED {
        for shape in [
            (256, 256, 64),
            (3 * tile.0, 256, 64),
            (5 * tile.0 - 7, 264, 64),
        ] {
            exact_case(&dev, &mut rng, tile, b_col_major, 2, shape);
        }
    }
}

/// Clustered gemms against the f64 reference on odd shapes, every input distribution. K
/// stays a multiple of 8: TMA needs 16-byte rows, and a gemm it cannot read is not clustered
/// (`sm90a_cluster` checks that diagnostic).
fn gpu_sm90a_clustered_gemm_matches_reference() {
    let Some(dev) = hopper() else { return };
    let mut rng = Rng::from_env();
    let shapes = [
        (136, 200, 56),
        (257, 136, 104),
        (64, 64, 16),
        (1000, 520, 776),
    ];
    for (tile, b_col_major) in CLUSTERED {
        for shape in shapes {
            for dist in Dist::ALL {
                run_case(&dev, &mut rng, tile, b_col_major, 2, shape, 8, dist, true);
            }
        }
    }
}

/// Clusters walking tile pairs in lockstep with 1, 3 and 7 clusters (2, 6 and 14 CTAs), each
/// many pairs: 11 x blocks make 6 pairs (the last ragged) in groups of 4 pairs.
fn gpu_sm90a_clustered_persistent_walks_every_pair() {
    for clusters in [1, 3, 7] {
        let Some(dev) = hopper() else { return };
        let dev = dev.with_persistent_ctas(Some(2 * clusters));
        let mut rng = Rng::from_env();
        for shape in [(384, 256, 1000), (1300, 384, 520), (1300, 1000, 64)] {
            for b_col_major in [false, true] {
                let tile = (128, 128, 64);
                run_case(
                    &dev,
                    &mut rng,
                    tile,
                    b_col_major,
                    2,
                    shape,
                    8,
                    Dist::Normal,
                    true,
                );
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_sm90a_gemm_is_exact_on_small_integers",
            Needs::Hopper,
            gpu_sm90a_gemm_is_exact_on_small_integers,
        ),
        (
            "gpu_sm90a_gemm_matches_reference",
            Needs::Hopper,
            gpu_sm90a_gemm_matches_reference,
        ),
        (
            "gpu_sm90a_gemm_launches_read_each_launchs_tensors",
            Needs::Hopper,
            gpu_sm90a_gemm_launches_read_each_launchs_tensors,
        ),
        (
            "gpu_sm90a_unaligned_gemm_falls_back_to_cp_async",
            Needs::Hopper,
            gpu_sm90a_unaligned_gemm_falls_back_to_cp_async,
        ),
        (
            "gpu_sm90a_attention_matches_reference",
            Needs::Hopper,
            gpu_sm90a_attention_matches_reference,
        ),
        (
            "gpu_sm90a_persistent_ctas_walk_every_tile",
            Needs::Hopper,
            gpu_sm90a_persistent_ctas_walk_every_tile,
        ),
        (
            "gpu_sm90a_autotune_picks_and_keeps_a_key_block",
            Needs::Hopper,
            gpu_sm90a_autotune_picks_and_keeps_a_key_block,
        ),
        (
            "gpu_sm90a_softcap_attention_matches_reference",
            Needs::Hopper,
            gpu_sm90a_softcap_attention_matches_reference,
        ),
        (
            "gpu_sm90a_clustered_gemm_is_exact_on_small_integers",
            Needs::Hopper,
            gpu_sm90a_clustered_gemm_is_exact_on_small_integers,
        ),
        (
            "gpu_sm90a_clustered_gemm_matches_reference",
            Needs::Hopper,
            gpu_sm90a_clustered_gemm_matches_reference,
        ),
        (
            "gpu_sm90a_clustered_persistent_walks_every_pair",
            Needs::Hopper,
            gpu_sm90a_clustered_persistent_walks_every_pair,
        ),
    ])
}
