//! How the row kernels (softmax, layer norm, RMS norm) split a row length over a block.

/// Comptime values of a row kernel for rows of one length: `bm` rows per block, `bn`
/// columns per tile, `nw` warps per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowConfig {
    /// Rows per block (`BM`).
    pub bm: usize,
    /// Columns per tile (`BN`).
    pub bn: usize,
    /// Warps per block (`NW`).
    pub nw: usize,
}

/// The longest row kept whole in registers (one read of `x`); a longer row is walked twice in
/// tiles of [`LOOP_TILE`] columns.
pub const ONE_PASS_MAX: usize = 16384;
/// Columns per tile of a row longer than [`ONE_PASS_MAX`].
pub const LOOP_TILE: usize = 4096;
/// Elements each thread holds, at most and at least: few enough registers for several blocks
/// per SM, enough 16-byte loads in flight per thread to cover HBM's latency (measured on the
/// H200: 32 a thread beat 16 for 8192-element bf16 rows, by up to 1.3x).
const MAX_PER_THREAD: usize = 32;
const MIN_PER_THREAD: usize = 16;
/// Warps per block at least and at most.
const MIN_WARPS: usize = 8;
const MAX_WARPS: usize = 16;

/// The configuration for rows of `n` elements: a row up to [`ONE_PASS_MAX`] is one tile
/// (`bn` the next power of two) over at least `MIN_WARPS` warps, more where a thread would
/// hold over `MAX_PER_THREAD` elements; short rows share a block, `bm` of them, until each
/// thread holds `MIN_PER_THREAD`.
pub fn row_config(n: usize) -> RowConfig {
    let bn = if n <= ONE_PASS_MAX {
        n.max(32).next_power_of_two()
    } else {
        LOOP_TILE
    };
    let nw = (bn / (32 * MAX_PER_THREAD)).clamp(MIN_WARPS, MAX_WARPS);
    let bm = (32 * nw * MIN_PER_THREAD / bn).max(1);
    RowConfig { bm, bn, nw }
}

#[cfg(test)]
mod tests {
    use super::{RowConfig, row_config};

    #[test]
    fn rows_are_spread_over_the_block() {
        let c = |bm, bn, nw| RowConfig { bm, bn, nw };
        assert_eq!(row_config(1), c(128, 32, 8));
        assert_eq!(row_config(1000), c(4, 1024, 8));
        assert_eq!(row_config(4096), c(1, 4096, 8));
        assert_eq!(row_config(4097), c(1, 8192, 8));
        assert_eq!(row_config(16384), c(1, 16384, 16));
        assert_eq!(row_config(16385), c(1, 4096, 8));
    }
}
