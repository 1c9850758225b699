//! The gemm family on the GPU in bf16 and f16 (the kernels' comptime `dtype`): `gemm`,
//! `gemm_bias_act` with every activation and `gemm_alpha_beta`, on sm_80 and on sm_90a,
//! against the f64 reference: shapes that are not tile multiples (and one element), every
//! input distribution, row- and column-major B, outputs poisoned with NaN before each run.
//! On sm_90a every tensor is given 16-byte aligned rows (padded, the padding NaN), so the
//! kernels take the TMA + wgmma schedule with the TMA-store epilogue (the test checks the
//! module takes tensor maps); one contiguous odd shape checks the cp.async fallback too.
//! GPU tests are reported ignored without a driver (and the sm_90a ones without a Hopper GPU).

mod gemm_family;
mod gpu_common;

use std::process::ExitCode;

use gemm_family::Tile;
use gpu_common::{Needs, device, upload_padded};
use kiln_examples::gemm::gemm;
use kiln_examples::gemm_epilogue::{gemm_alpha_beta, gemm_bias_act};
use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::{DType, HostTensor, Target};
use kiln_runtime::{Device, DeviceTensor, KernelArg, LaunchError};
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference::{self, Activation};

/// `(m, n, k)`: non-multiples of every tile below, K shorter than a ring stage, one element.
const SHAPES: [(usize, usize, usize); 3] = [(130, 70, 50), (257, 129, 100), (1, 1, 1)];

/// `(BM, BN, BK, STAGES)`: the defaults and a small tile with several blocks per dimension
/// and several trips of the ring.
const TILES: [(usize, usize, usize, usize); 2] = [(128, 128, 64, 3), (128, 64, 32, 4)];

/// The element types the gemm family takes.
const DTYPES: [DType; 2] = [DType::Bf16, DType::F16];

/// `(alpha, beta)`: general, and each term alone.
const ALPHA_BETA: [(f32, f32); 3] = [(0.75, -1.25), (1.0, 0.0), (0.0, 2.0)];

/// Which kernel of the family a case runs, with its epilogue's parameters.
#[derive(Clone, Copy, Debug)]
enum Epilogue {
    /// `gemm`: `c = a @ B`.
    Plain,
    /// `gemm_bias_act`.
    BiasAct(Activation),
    /// `gemm_alpha_beta`.
    AlphaBeta(f32, f32),
}

impl Epilogue {
    /// Every case: the plain gemm, each activation, each `(alpha, beta)`.
    fn all() -> Vec<Epilogue> {
        let mut all = vec![Epilogue::Plain];
        all.extend(Activation::ALL.map(Epilogue::BiasAct));
        all.extend(ALPHA_BETA.map(|(a, b)| Epilogue::AlphaBeta(a, b)));
        all
    }

    /// The kernel's name.
    fn name(self) -> &'static str {
        match self {
            Epilogue::Plain => gemm.name(),
            Epilogue::BiasAct(_) => gemm_bias_act.name(),
            Epilogue::AlphaBeta(..) => gemm_alpha_beta.name(),
        }
    }

    /// Launches this kernel with `tile`'s comptime values over `grid`; with `check_tma`,
    /// first checks that the specialisation of aligned tensors takes the TMA path.
    fn launch(
        self,
        dev: &Device,
        tile: Tile,
        check_tma: bool,
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        match self {
            Epilogue::Plain => launch(dev, &gemm, tile.gemm(), check_tma, grid, args),
            Epilogue::BiasAct(act) => {
                let act = Activation::ALL.iter().position(|a| *a == act).unwrap_or(0);
                let c = tile.bias_act(act);
                launch(dev, &gemm_bias_act, c, check_tma, grid, args)
            }
            Epilogue::AlphaBeta(..) => launch(
                dev,
                &gemm_alpha_beta,
                tile.alpha_beta(),
                check_tma,
                grid,
                args,
            ),
        }
    }
}

/// [`Epilogue::launch`] for one kernel.
fn launch<K: KernelDef>(
    dev: &Device,
    def: &K,
    comptime: K::Comptime,
    check_tma: bool,
    grid: [u32; 3],
    args: &[KernelArg<'_>],
) -> Result<(), LaunchError> {
    if check_tma {
        let spec = Spec::uniform(comptime.clone(), def.signature(), true);
        let loaded = dev.compile(def, &spec)?;
        assert!(
            !loaded.ptx().tensor_maps.is_empty(),
            "{}: no TMA path with aligned tensors",
            def.name()
        );
    }
    dev.launch(def, &comptime, grid, args)
}

/// `host` on the device: on sm_90a with rows padded to a multiple of 16 bytes (the padding
/// NaN), so every tensor is TMA-able whatever its extents; else contiguous.
fn upload(dev: &Device, host: &HostTensor, aligned_rows: bool) -> DeviceTensor {
    let n = *host.shape.last().unwrap_or(&1);
    if aligned_rows && host.shape.len() > 1 {
        upload_padded(dev, host, n.next_multiple_of(8) - n + 8)
    } else {
        dev.upload(host).expect("upload")
    }
}

/// Runs one case on `dev` (in clusters of `cluster` CTAs along M) and checks it against the
/// f64 reference; with `aligned_rows` also checks that the specialisation launched takes the
/// TMA path (sm_90a).
#[allow(clippy::too_many_arguments)]
fn run_case(
    dev: &Device,
    rng: &mut Rng,
    epi: Epilogue,
    (tile, cluster): ((usize, usize, usize, usize), usize),
    b_col_major: bool,
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    dist: Dist,
    aligned_rows: bool,
) {
    let comptime = Tile {
        cluster,
        ..Tile::new(tile, b_col_major, dtype)
    };
    let a = tensor(rng, &[m, k], dtype, dist);
    let b_shape = if b_col_major { [n, k] } else { [k, n] };
    let b = tensor(rng, &b_shape, dtype, dist);
    let ab = if b_col_major {
        reference::gemm_bt(&a, &b)
    } else {
        reference::gemm(&a, &b)
    };
    let (da, db) = (upload(dev, &a, aligned_rows), upload(dev, &b, aligned_rows));
    let out = upload(dev, &poisoned(&[m, n], dtype), aligned_rows);
    let (extra, want, tol) = match epi {
        Epilogue::Plain => (None, ab, tolerance(dtype)),
        Epilogue::BiasAct(act) => {
            let bias = tensor(rng, &[n], dtype, dist);
            let want = reference::bias_act(&ab, &bias, act);
            let tol = reference::bias_act_tolerance((&a, &b, b_col_major), &ab, &bias, act, dtype);
            (Some(upload(dev, &bias, aligned_rows)), want, tol)
        }
        Epilogue::AlphaBeta(alpha, beta) => {
            let c = tensor(rng, &[m, n], dtype, dist);
            let want = reference::alpha_beta(&ab, &c, f64::from(alpha), f64::from(beta));
            (Some(upload(dev, &c, aligned_rows)), want, tolerance(dtype))
        }
    };
    let mut args = vec![KernelArg::Tensor(&da), KernelArg::Tensor(&db)];
    args.extend(extra.iter().map(KernelArg::Tensor));
    args.push(KernelArg::Tensor(&out));
    if let Epilogue::AlphaBeta(alpha, beta) = epi {
        args.extend([KernelArg::F32(alpha), KernelArg::F32(beta)]);
    }
    let grid = gemm.grid(&comptime.gemm(), [m, n, 1]);
    epi.launch(dev, comptime, aligned_rows, grid, &args)
        .expect("launch");
    dev.synchronize().expect("kernel ran");
    let case = Case {
        kernel: format!(
            "{}@{} {epi:?} dtype={dtype} tile={tile:?} b_col_major={b_col_major} \
             CLUSTER_M={cluster}",
            epi.name(),
            dev.target()
        ),
        shape: format!("m={m} n={n} k={k}, aligned rows {aligned_rows}"),
        dist,
        seed: rng.seed(),
    };
    let got = out.download().expect("download");
    assert_close(&case, &got, &as_stored(&want, dtype), tol);
}

/// Every kernel, dtype, tile, B layout, shape and distribution on `dev`, in clusters of
/// `cluster` CTAs along M.
fn sweep(dev: &Device, aligned_rows: bool, cluster: usize) {
    let mut rng = Rng::from_env();
    for epi in Epilogue::all() {
        for dtype in DTYPES {
            for tile in TILES {
                for b_col_major in [false, true] {
                    for shape in SHAPES {
                        for dist in Dist::ALL {
                            run_case(
                                dev,
                                &mut rng,
                                epi,
                                (tile, cluster),
                                b_col_major,
                                dtype,
                                shape,
                                dist,
                                aligned_rows,
                            );
                        }
                    }
                }
            }
        }
    }
}

fn gpu_sm80_gemm_family_matches_reference() {
    let Some(dev) = device() else { return };
    sweep(&dev, false, 1);
}

fn gpu_sm90a_gemm_family_matches_reference() {
    let Some(dev) = device() else { return };
    sweep(&dev.with_target(Target::Sm90a), true, 1);
}

/// The family in 2-CTA clusters (B multicast to the M-adjacent pair), every case of the
/// sweep; written before any GPU ran it.
fn gpu_sm90a_clustered_gemm_family_matches_reference() {
    let Some(dev) = device() else { return };
    sweep(&dev.with_target(Target::Sm90a), true, 2);
}

/// Contiguous tensors with odd extents are not 16-byte aligned: the sm_90a build falls back
/// to the cp.async + mma.sync lowering, which must agree as well.
fn gpu_sm90a_unaligned_gemm_family_falls_back() {
    let Some(dev) = device() else { return };
    let dev = dev.with_target(Target::Sm90a);
    let mut rng = Rng::from_env();
    for epi in Epilogue::all() {
        for dtype in DTYPES {
            run_case(
                &dev,
                &mut rng,
                epi,
                (TILES[0], 1),
                false,
                dtype,
                (130, 70, 50),
                Dist::Normal,
                false,
            );
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        (
            "gpu_sm80_gemm_family_matches_reference",
            Needs::Gpu,
            gpu_sm80_gemm_family_matches_reference,
        ),
        (
            "gpu_sm90a_gemm_family_matches_reference",
            Needs::Hopper,
            gpu_sm90a_gemm_family_matches_reference,
        ),
        (
            "gpu_sm90a_unaligned_gemm_family_falls_back",
            Needs::Hopper,
            gpu_sm90a_unaligned_gemm_family_falls_back,
        ),
        (
            "gpu_sm90a_clustered_gemm_family_matches_reference",
            Needs::Hopper,
            gpu_sm90a_clustered_gemm_family_matches_reference,
        ),
    ])
}
