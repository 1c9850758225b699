//! The Blackwell (sm_100a) register side of tensor memory: how the epilogue warps copy a TMEM
//! accumulator into registers ([`accumulator_layout`], [`epilogue`]) and how the softmax's
//! exponentials are shared with the FMA pipes ([`exp2`]). The schedule of the warps that own
//! and read TMEM is the schedule IR's ([`crate::sched::tmem`], the `tmem` pass).

pub mod epilogue;
pub mod exp2;

pub use crate::sched::tmem::{
    ACC_ROWS, Descriptor, LOAD_COLUMNS, TMEM_COLUMNS, instruction_descriptor,
};

use crate::schedule::Layout;

/// The register layout of a `128 x n` accumulator after `tcgen05.ld.32x32b` by `warps`
/// epilogue warps (a multiple of 4): thread `t` of warp `w` holds row `32 (w % 4) + t`, the
/// `n / (warps / 4)` columns of block `w / 4` in order.
pub fn accumulator_layout(warps: u32) -> Layout {
    Layout::TmemRows {
        warpgroups: warps / 4,
    }
}
