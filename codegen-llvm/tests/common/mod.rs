//! What both differential test files share: the example-kernel variants compared, each with
//! its typed comptime values, and how one is built.

#![allow(dead_code)]

use kiln::ir::dsl::{KernelDef, ParamSig, Spec, specialise};
use kiln::ir::{DType, Kernel};
use kiln_examples::gemm::{GemmComptime, gemm};
use kiln_examples::softmax::{SoftmaxComptime, softmax};
use kiln_examples::vector_add::vector_add;

/// An example kernel of the sm_80 subset with its comptime values.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// `vector_add` (no comptime values).
    VectorAdd,
    /// `softmax`.
    Softmax(SoftmaxComptime),
    /// `gemm`.
    Gemm(GemmComptime),
}

/// `(name, variant, tensors 16-byte aligned)` of every variant compared: the sm_80 subset
/// (vector_add, softmax, gemm) at its defaults and at other tile shapes, column-major B,
/// f16, and tensors not known to be aligned.
pub fn variants() -> Vec<(&'static str, Variant, bool)> {
    let rows = SoftmaxComptime::default();
    let tile = GemmComptime::default();
    vec![
        ("vector_add", Variant::VectorAdd, true),
        ("vector_add_unaligned", Variant::VectorAdd, false),
        ("softmax", Variant::Softmax(rows), true),
        // (One row a block would split the row over warps, a reduction this backend does not
        // lower: `codegen-llvm/src/tile.rs`.)
        (
            "softmax_bm4_bn1024",
            Variant::Softmax(SoftmaxComptime {
                BM: 4,
                BN: 1024,
                ..Default::default()
            }),
            true,
        ),
        (
            "softmax_bm8_bn128",
            Variant::Softmax(SoftmaxComptime {
                BM: 8,
                BN: 128,
                ..Default::default()
            }),
            false,
        ),
        ("gemm", Variant::Gemm(tile), true),
        (
            "gemm_bcol",
            Variant::Gemm(GemmComptime {
                b_col_major: true,
                ..tile
            }),
            true,
        ),
        (
            "gemm_64x64x32",
            Variant::Gemm(GemmComptime {
                BM: 64,
                BN: 64,
                BK: 32,
                ..tile
            }),
            true,
        ),
        (
            // 64 rows: a 128x256 f32 accumulator over the gemm's 4 warps takes 256 registers a
            // thread, which the lowering refuses.
            "gemm_bn256_bk32",
            Variant::Gemm(GemmComptime {
                BM: 64,
                BN: 256,
                BK: 32,
                ..tile
            }),
            true,
        ),
        ("gemm_f16", Variant::Gemm(f16_gemm()), true),
        ("gemm_unaligned", Variant::Gemm(tile), false),
    ]
}

/// The gemm's defaults in f16.
pub fn f16_gemm() -> GemmComptime {
    GemmComptime {
        dtype: DType::F16,
        ..GemmComptime::default()
    }
}

impl Variant {
    /// The IR of the variant with every tensor's `aligned16` set to `aligned`, and the
    /// signature a launch validates its arguments against (element types resolved).
    pub fn build(&self, aligned: bool) -> (Kernel, Vec<ParamSig>) {
        match *self {
            Variant::VectorAdd => built(&vector_add, (), aligned),
            Variant::Softmax(c) => built(&softmax, c, aligned),
            Variant::Gemm(c) => built(&gemm, c, aligned),
        }
    }

    /// [`Variant::build`]'s IR alone.
    pub fn kernel(&self, aligned: bool) -> Kernel {
        self.build(aligned).0
    }
}

/// `def` built with `comptime`, and its specialised signature.
fn built<K: KernelDef>(def: &K, comptime: K::Comptime, aligned: bool) -> (Kernel, Vec<ParamSig>) {
    let spec = Spec::uniform(comptime, def.signature(), aligned);
    let k = def
        .build(&spec)
        .unwrap_or_else(|d| panic!("{} does not build: {d}", def.name()));
    (k, specialise(def.signature(), &spec.comptime))
}
