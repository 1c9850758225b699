//! Tile extents that are multiples of 16 but not powers of two (48, 80, 96, 160, 192): elementwise
//! ops, row and column reductions and mma on the interpreter against f64 references, tensors
//! smaller than the tiles so the masked edges count; the same kernels compiled for sm_80 and
//! assembled by ptxas; the gemm with 96-wide K and N tiles through the sm_90a schedule (its
//! 64-byte-swizzled TMA boxes executed on the CPU, its protocol proved, ptxas); and the
//! extents and shapes that stay invalid, as diagnostics naming what is expected.

mod ptx_examples;

use kiln::ir::dsl::{KernelDef, Spec};
use kiln::ir::interp::{HostArg, run_def, run_scheduled};
use kiln::ir::passes::{protocol_check, run_pipeline};
use kiln::ir::{DType, HostTensor, Target};
use kiln::prelude::*;
use kiln_examples::gemm::GemmComptime;
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// `o = max(x * y, x + 1) - y` over `r x c` tiles, block `(i, j)` at `[i r, j c]`.
#[kernel(num_warps = 4)]
fn elementwise(
    x: Tensor<f32, 2>,
    y: Tensor<f32, 2>,
    o: TensorMut<f32, 2>,
    #[comptime(default = 96)] r: usize,
    #[comptime(default = 32)] c: usize,
) {
    let (i, j) = (block_id().x, block_id().y);
    let a = x.tile([r, c], [i * r, j * c]).load(); // MARK-extent
    let b = y.tile([r, c], [i * r, j * c]).load();
    o.tile([r, c], [i * r, j * c])
        .store(max(&(a * b), &(a + 1.0)) - b);
}

/// Row sums and maxima (`[r]`) and column sums and maxima (`[c]`) of one `r x c` tile.
#[kernel(num_warps = 4)]
fn reductions(
    x: Tensor<f32, 2>,
    row_sums: TensorMut<f32, 1>,
    row_maxes: TensorMut<f32, 1>,
    col_sums: TensorMut<f32, 1>,
    col_maxes: TensorMut<f32, 1>,
    #[comptime(default = 96)] r: usize,
    #[comptime(default = 192)] c: usize,
) {
    let a = x.tile([r, c], [0, 0]).load();
    row_sums.tile([r], [0]).store(row_sum(&a));
    row_maxes.tile([r], [0]).store(row_max(&a));
    col_sums.tile([c], [0]).store(col_sum(&a));
    col_maxes.tile([c], [0]).store(col_max(&a));
}

/// `c = 2 a b` over `m x n` tiles with the whole `k` in one tile: `mma`, then `mma_acc` on it.
#[kernel(num_warps = 4)]
fn matmul(
    a: Tensor<bf16, 2>,
    b: Tensor<bf16, 2>,
    c: TensorMut<f32, 2>,
    #[comptime(default = 96)] m: usize,
    #[comptime(default = 160)] n: usize,
    #[comptime(default = 96)] k: usize,
) {
    let (i, j) = (block_id().x, block_id().y);
    let x = a.tile([m, k], [i * m, 0]).load();
    let y = b.tile([k, n], [0, j * n]).load();
    let p = mma(&x, &y);
    c.tile([m, n], [i * m, j * n]).store(mma_acc(&x, &y, &p));
}

/// The spec of `def` at `comptime`, every tensor 16-byte aligned.
fn spec<K: KernelDef>(def: &K, comptime: K::Comptime) -> Spec<K::Comptime> {
    Spec::uniform(comptime, def.signature(), true)
}

/// `def` at `comptime` compiles for sm_80 and assembles without spills.
fn assembles_on_sm80<K: KernelDef>(def: &K, comptime: K::Comptime) {
    let k = def.build(&spec(def, comptime.clone())).expect("builds");
    let m = kiln_ptx::compile(&k, Target::Sm80).unwrap_or_else(|e| panic!("{comptime:?}: {e}"));
    let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm80)
        .unwrap_or_else(|e| panic!("{comptime:?}: {e}"));
    assert!(!report.spills(), "{comptime:?}: {report}");
}

fn case(kernel: &str, shape: String, dist: Dist, rng: &Rng) -> Case {
    Case {
        kernel: kernel.into(),
        shape,
        dist,
        seed: rng.seed(),
    }
}

#[test]
fn elementwise_tiles_of_96_and_160_match_reference() {
    let mut rng = Rng::from_env();
    let tiles = [
        ((96, 32), (250, 70)),
        ((32, 160), (70, 300)),
        ((192, 32), (200, 70)),
        ((80, 48), (170, 100)),
    ];
    for ((r, c), (rows, cols)) in tiles {
        let x = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Normal);
        let y = tensor(&mut rng, &[rows, cols], DType::F32, Dist::Normal);
        let mut o = poisoned(&[rows, cols], DType::F32);
        let grid = [rows.div_ceil(r) as u32, cols.div_ceil(c) as u32, 1];
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::Tensor(&y),
            HostArg::TensorMut(&mut o),
        ];
        run_def(&elementwise, &ElementwiseComptime { r, c }, grid, &mut args).expect("runs");
        let want: Vec<f64> = x
            .to_f64_vec()
            .into_iter()
            .zip(y.to_f64_vec())
            .map(|(a, b)| (a * b).max(a + 1.0) - b)
            .collect();
        let shape = format!("{r}x{c} tiles over {rows}x{cols}");
        let c = case("elementwise", shape, Dist::Normal, &rng);
        assert_close(&c, &o, &want, tolerance(DType::F32));
    }
    assembles_on_sm80(&elementwise, ElementwiseComptime::default());
    assembles_on_sm80(&elementwise, ElementwiseComptime { r: 32, c: 160 });
    assembles_on_sm80(&elementwise, ElementwiseComptime { r: 192, c: 32 });
    assembles_on_sm80(&elementwise, ElementwiseComptime { r: 80, c: 48 });
}

#[test]
fn reductions_over_96_rows_and_192_columns_match_reference() {
    let mut rng = Rng::from_env();
    let (r, c) = (96, 192);
    for dist in Dist::ALL {
        let x = tensor(&mut rng, &[r, c], DType::F32, dist);
        let outs: Vec<HostTensor> = [r, r, c, c]
            .iter()
            .map(|&n| poisoned(&[n], DType::F32))
            .collect();
        let [mut rs, mut rm, mut cs, mut cm] = <[HostTensor; 4]>::try_from(outs).expect("four");
        let mut args = [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut rs),
            HostArg::TensorMut(&mut rm),
            HostArg::TensorMut(&mut cs),
            HostArg::TensorMut(&mut cm),
        ];
        run_def(
            &reductions,
            &ReductionsComptime { r, c },
            [1, 1, 1],
            &mut args,
        )
        .expect("runs");
        let xv = x.to_f64_vec();
        let xv = &xv;
        let row = |i: usize| xv[i * c..(i + 1) * c].iter().copied();
        let col = |j: usize| (0..r).map(move |i| xv[i * c + j]);
        let checks: [(&str, &HostTensor, Vec<f64>); 4] = [
            ("row_sum", &rs, (0..r).map(|i| row(i).sum()).collect()),
            (
                "row_max",
                &rm,
                (0..r).map(|i| row(i).fold(f64::MIN, f64::max)).collect(),
            ),
            ("col_sum", &cs, (0..c).map(|j| col(j).sum()).collect()),
            (
                "col_max",
                &cm,
                (0..c).map(|j| col(j).fold(f64::MIN, f64::max)).collect(),
            ),
        ];
        for (name, got, want) in checks {
            let cs = case(name, format!("{r}x{c}"), dist, &rng);
            assert_close(&cs, got, &want, tolerance(DType::F32));
        }
    }
    // Both dimensions are reduced, so no warp splits either (each warp holds the whole
    // tile): assembled at tiles that fit a thread's registers.
    assembles_on_sm80(&reductions, ReductionsComptime { r: 96, c: 32 });
    assembles_on_sm80(&reductions, ReductionsComptime { r: 32, c: 96 });
}

#[test]
fn mma_with_96_wide_operands_matches_reference() {
    let mut rng = Rng::from_env();
    // (m, n, k) tiles over an (rows, cols) output: M and K of 96, N of 160; M of 192, N of 96;
    // M of 80, N of 48, K of 80.
    for ((m, n, k), (rows, cols)) in [
        ((96, 160, 96), (150, 170)),
        ((192, 96, 64), (200, 90)),
        ((80, 48, 80), (170, 100)),
    ] {
        let a = tensor(&mut rng, &[rows, k], DType::Bf16, Dist::Normal);
        let b = tensor(&mut rng, &[k, cols], DType::Bf16, Dist::Normal);
        let mut c = poisoned(&[rows, cols], DType::F32);
        let grid = [rows.div_ceil(m) as u32, cols.div_ceil(n) as u32, 1];
        let mut args = [
            HostArg::Tensor(&a),
            HostArg::Tensor(&b),
            HostArg::TensorMut(&mut c),
        ];
        run_def(&matmul, &MatmulComptime { m, n, k }, grid, &mut args).expect("runs");
        let want: Vec<f64> = reference::gemm(&a, &b).iter().map(|x| 2.0 * x).collect();
        let shape = format!("{m}x{n}x{k} tiles over {rows}x{cols}");
        assert_close(
            &case("matmul", shape, Dist::Normal, &rng),
            &c,
            &want,
            tolerance(DType::F32),
        );
    }
    assembles_on_sm80(&matmul, MatmulComptime::default());
    // 80 rows over 4 warps split only along N: 80 x 16 a warp.
    for (m, n, k) in [(192, 96, 64), (80, 64, 80)] {
        assembles_on_sm80(&matmul, MatmulComptime { m, n, k });
    }
}

#[test]
fn sm90a_gemm_with_96_wide_k_and_n_tiles_matches_reference() {
    // BK = BN = 96: A and B in three 32-column, 64-byte-swizzled TMA boxes each (B MN-major,
    // and K-major when stored `[N, K]`), six k16 steps of m64n96k16 per stage. BN = 32: one
    // 64-byte box of an MN-major B, m64n32k16.
    let mut rng = Rng::from_env();
    for (bn, bk, b_col_major) in [
        (96, "96", "false"),
        (96, "96", "true"),
        (32, "64", "false"),
        (32, "64", "true"),
    ] {
        let bn_text = bn.to_string();
        let v = [
            ("BN", bn_text.as_str()),
            ("BK", bk),
            ("b_col_major", b_col_major),
        ];
        let built = ptx_examples::build("gemm", &v);
        let mut k = built.clone();
        run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
        let s = k.schedule.sched.as_ref().expect("a TMA ring");
        let sw64 =
            |(_, l): (_, &kiln::ir::sched::Load)| l.tma.swizzle == 64 && l.tma.box_dims[1] == 32;
        let boxes_ok = if bn == 96 {
            s.loads.iter().all(sw64)
        } else {
            s.loads.iter().any(sw64) == (b_col_major == "false")
        };
        assert!(boxes_ok, "{v:?}: {s}");
        let mut checked = k.clone();
        protocol_check::run(&mut checked, Target::Sm90a).unwrap_or_else(|d| panic!("{d}"));
        let (mm, nn, kk) = (200, 250, 300);
        let a = tensor(&mut rng, &[mm, kk], DType::Bf16, Dist::Normal);
        let (b, want) = if b_col_major == "true" {
            let bt = tensor(&mut rng, &[nn, kk], DType::Bf16, Dist::Normal);
            let want = reference::gemm_bt(&a, &bt);
            (bt, want)
        } else {
            let b = tensor(&mut rng, &[kk, nn], DType::Bf16, Dist::Normal);
            let want = reference::gemm(&a, &b);
            (b, want)
        };
        let mut c = poisoned(&[mm, nn], DType::Bf16);
        let mut args = [
            HostArg::Tensor(&a),
            HostArg::Tensor(&b),
            HostArg::TensorMut(&mut c),
        ];
        let grid = [mm.div_ceil(128) as u32, nn.div_ceil(bn) as u32, 1];
        run_scheduled(&k, grid, 2, &mut args).unwrap_or_else(|e| panic!("{v:?}: {e}"));
        let shape = format!("m={mm} n={nn} k={kk}");
        let cs = case(
            &format!("gemm {v:?} sm_90a schedule"),
            shape,
            Dist::Normal,
            &rng,
        );
        assert_close(&cs, &c, &want, tolerance(DType::Bf16));
        let m = kiln_ptx::compile(&built, Target::Sm90a).expect("compile");
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).expect("ptxas");
        assert!(
            !report.spills() && report.warnings.is_empty(),
            "{v:?}: {report}"
        );
    }
}

#[test]
fn extents_neither_a_power_of_two_nor_a_multiple_of_16_are_diagnostics() {
    let line = include_str!("interp_tile_extents.rs")
        .lines()
        .position(|l| l.contains("MARK-extent") && l.contains("let a"))
        .expect("marker") as u32
        + 1;
    for bad in [24, 40, 100, 4100, 3 << 20] {
        let c = ElementwiseComptime {
            r: bad,
            ..ElementwiseComptime::default()
        };
        let d = elementwise
            .build(&spec(&elementwise, c))
            .expect_err("rejected");
        assert_eq!((d.loc.file, d.loc.line), (file!(), line), "{d}");
        assert_eq!(
            d.message,
            format!(
                "tile extent {bad} must be a power of two or a multiple of 16, between 1 and 1048576"
            ),
            "{d}"
        );
    }
}

#[test]
fn a_192_row_gemm_runs_on_sm80_and_sm90a() {
    // 192 rows: 12 warps on sm_80, three consumer warpgroups on sm_90a (whose schedule
    // `sm90a_schedule` and `interp_scheduled` check); 256 rows are more than sm_90a's three
    // warpgroups take, and run as mma.sync there.
    let v = [("BM", "192"), ("BN", "64")];
    let mut rng = Rng::from_env();
    let (mm, nn, kk) = (300, 130, 100);
    let a = tensor(&mut rng, &[mm, kk], DType::Bf16, Dist::Normal);
    let b = tensor(&mut rng, &[kk, nn], DType::Bf16, Dist::Normal);
    let mut c = poisoned(&[mm, nn], DType::Bf16);
    let mut args = [
        HostArg::Tensor(&a),
        HostArg::Tensor(&b),
        HostArg::TensorMut(&mut c),
    ];
    let tile = GemmComptime {
        BM: 192,
        BN: 64,
        ..GemmComptime::default()
    };
    let gemm = kiln_examples::gemm::gemm;
    let grid = gemm.grid(&tile, [mm, nn, 1]);
    let kernel = gemm.build(&spec(&gemm, tile)).expect("builds");
    kiln::ir::interp::run(&kernel, grid, &mut args).expect("runs");
    let cs = case(
        "gemm BM=192",
        format!("m={mm} n={nn} k={kk}"),
        Dist::Normal,
        &rng,
    );
    assert_close(&cs, &c, &reference::gemm(&a, &b), tolerance(DType::Bf16));
    let built = ptx_examples::build("gemm", &v);
    for target in [Target::Sm80, Target::Sm90a] {
        let m = kiln_ptx::compile(&built, target).expect("compiles");
        let report = kiln_ptx::ptxas::check(&m.ptx, target).expect("ptxas");
        assert!(!report.spills(), "{target}: {report}");
    }
    // 256 rows are lowered the sm_80 way on sm_90a (mma.sync, 16 warps), with a note why.
    let wide = ptx_examples::build("gemm", &[("BM", "256"), ("BN", "64")]);
    let m = kiln_ptx::compile(&wide, Target::Sm90a).expect("compiles the plain way");
    let note = m
        .ptx
        .lines()
        .find(|l| l.starts_with("// note: sm_90a: lowered with mma.sync"))
        .expect("a note");
    assert!(
        note.contains("64, 128 or 192") && note.contains("examples/src/gemm.rs"),
        "{note}"
    );
    assert!(m.ptx.contains("mma.sync") && !m.ptx.contains("wgmma.mma_async"));
    let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).expect("ptxas");
    assert!(!report.spills(), "256 rows on sm_90a: {report}");
}
