//! What the CPU and GPU tests of the gemm family (`gemm`, `gemm_bias_act`, `gemm_alpha_beta`)
//! share: one specialisation's tile, B layout, dtype and cluster, as each kernel's comptime
//! struct.

#![allow(dead_code)]

use kiln_examples::gemm::GemmComptime;
use kiln_examples::gemm_epilogue::{GemmAlphaBetaComptime, GemmBiasActComptime};
use kiln_ir::DType;
use kiln_ir::dsl::{Comptime, ComptimeValue};

/// The comptime values the three kernels share.
#[derive(Clone, Copy, Debug)]
pub struct Tile {
    /// `(BM, BN, BK, STAGES)`.
    pub shape: (usize, usize, usize, usize),
    /// B stored column-major.
    pub b_col_major: bool,
    /// Every tensor's element type.
    pub dtype: DType,
    /// CTAs per cluster along M.
    pub cluster: usize,
}

impl Tile {
    /// `shape`, `b_col_major` and `dtype` in clusters of one CTA.
    pub fn new(shape: (usize, usize, usize, usize), b_col_major: bool, dtype: DType) -> Tile {
        Tile {
            shape,
            b_col_major,
            dtype,
            cluster: 1,
        }
    }

    /// `gemm`'s comptime values.
    pub fn gemm(self) -> GemmComptime {
        let (bm, bn, bk, stages) = self.shape;
        GemmComptime {
            CLUSTER_M: self.cluster,
            BM: bm,
            BN: bn,
            BK: bk,
            STAGES: stages,
            b_col_major: self.b_col_major,
            dtype: self.dtype,
        }
    }

    /// `gemm_bias_act`'s, with activation number `act` (which it declares after the gemm's
    /// `CLUSTER_M`, before the gemm's other parameters).
    pub fn bias_act(self, act: usize) -> GemmBiasActComptime {
        let mut values = self.gemm().values();
        values.insert(1, ComptimeValue::Usize(act));
        GemmBiasActComptime::from_values(&values)
            .expect("gemm_bias_act declares the gemm's comptime parameters and `act`")
    }

    /// `gemm_alpha_beta`'s: the gemm's parameters, in the same order.
    pub fn alpha_beta(self) -> GemmAlphaBetaComptime {
        GemmAlphaBetaComptime::from_values(&self.gemm().values())
            .expect("gemm_alpha_beta declares the gemm's comptime parameters")
    }
}
