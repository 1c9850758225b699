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

/// The configuration for rows of `n` elements: a row up to [`ONE_PASS_MAX`] is one tile over
/// at least `MIN_WARPS` warps, more where a thread would hold over `MAX_PER_THREAD` elements
/// of the next power of two; short rows share a block, `bm` of them, until each thread holds
/// `MIN_PER_THREAD`. The tile is `n` rounded up to a whole number of elements a thread
/// ([`fitted_columns`]), not to a power of two: 4097 columns take 4352 (17 a thread over 8
/// warps), not 8192, of which half the threads would hold only masked columns.
pub fn row_config(n: usize) -> RowConfig {
    let (bn, nw) = if n <= ONE_PASS_MAX {
        let pow2 = n.max(32).next_power_of_two();
        let nw = (pow2 / (32 * MAX_PER_THREAD)).clamp(MIN_WARPS, MAX_WARPS);
        (fitted_columns(n, nw), nw)
    } else {
        (LOOP_TILE, MIN_WARPS)
    };
    let bm = prev_power_of_two(32 * nw * MIN_PER_THREAD / bn);
    RowConfig { bm, bn, nw }
}

/// The columns of a one-tile row of `n` elements over `nw` warps: the next power of two, or,
/// where less, `n` rounded up to a multiple of the block's `32 nw` threads (a multiple of
/// 16, as tile extents are). Every warp then holds columns of the row; the layout's vectors
/// narrow where whole vectors would leave warps without any (`kiln_ir`'s blocked layouts).
pub fn fitted_columns(n: usize, nw: usize) -> usize {
    let n = n.max(32);
    n.next_power_of_two().min(n.next_multiple_of(32 * nw))
}

/// The largest power of two at most `x` (1 for 0).
fn prev_power_of_two(x: usize) -> usize {
    if x <= 1 { 1 } else { 1 << x.ilog2() }
}

/// Comptime values of the norm backwards (`layer_norm_backward`, `rms_norm_backward`) for `m`
/// rows of `n` elements: `bm` rows per tile, `bn` columns per tile, `rb` rows per block,
/// `nw` warps per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormBackwardConfig {
    /// Rows per tile (`BM`).
    pub bm: usize,
    /// Columns per tile (`BN`).
    pub bn: usize,
    /// Rows per block (`RB`): the block writes its weight-gradient partials once for them.
    pub rb: usize,
    /// Warps per block (`NW`).
    pub nw: usize,
    /// Blocks a multiprocessor is asked to hold (`OCC`).
    pub occ: usize,
}

/// The longest row the norm backwards keep in one tile: besides a tile each of `x` and `dy`,
/// a thread holds its columns' `dw` and `db` sums across the block's rows (16384 columns
/// spill at 512 threads).
pub const NORM_BACKWARD_ONE_PASS_MAX: usize = 8192;
/// Elements of each tile a norm-backward thread holds (8192 columns: 16). At 16 a thread,
/// 4096 columns over 8 warps made ptxas spill a few bytes (RMS norm, bf16, unaligned rows).
const NORM_BACKWARD_PER_THREAD: usize = 8;
/// Elements of each tile a thread may hold where the norm backwards ask for two blocks a
/// multiprocessor (64 registers): 9 (4097 to 4608 columns) compile without a spill in both
/// kernels, f32 and bf16; 10 spill 12-16 bytes.
const NORM_BACKWARD_TWO_BLOCKS_PER_THREAD: usize = 9;
/// Multiprocessors of the GPUs the row kernels are tuned on (H100, H200): blocks enough for
/// two per multiprocessor before rows per block grow.
const MULTIPROCESSORS: usize = 132;
/// Rows per tile at most (short rows): more made ptxas spill a few bytes of the per-row values.
const MAX_TILE_ROWS: usize = 4;
/// Rows per block at most: past it the partials are a few percent of the bytes.
const MAX_BLOCK_ROWS: usize = 32;

/// The configuration of the norm backwards for `m` rows of `n` elements: a row up to
/// [`NORM_BACKWARD_ONE_PASS_MAX`] is one tile (read once), 8 elements a thread of the next
/// power of two (16 at 8192 columns, 16 warps at most), its columns fitted to the threads
/// ([`fitted_columns`]: 4097 columns take 4608, 9 a thread); a longer row loops over
/// [`LOOP_TILE`]-element tiles of all the block's rows. A block walks `rb` rows: as many as
/// leave about two blocks per multiprocessor (the power of two at or above `m / 264`), at
/// least 4 and at most 32. A one-tile row of up to 9 elements a thread asks for two blocks a
/// multiprocessor: layer norm's bf16 backward at 4096 columns took 72 registers unasked (one
/// block of 512 threads), 64 asked without a spill, and ran 1.45x faster (H100, 16384 and
/// 65536 rows; the others, at 58-64 registers unasked, ran the same); at 16 a thread (8192
/// columns) 64 registers spill.
pub fn norm_backward_config(m: usize, n: usize) -> NormBackwardConfig {
    let (bm, bn, nw) = if n <= NORM_BACKWARD_ONE_PASS_MAX {
        let pow2 = n.max(32).next_power_of_two();
        let nw = (pow2 / (32 * NORM_BACKWARD_PER_THREAD)).clamp(MIN_WARPS, MAX_WARPS);
        let bn = fitted_columns(n, nw);
        let bm = prev_power_of_two(32 * nw * NORM_BACKWARD_PER_THREAD / bn).min(MAX_TILE_ROWS);
        (bm, bn, nw)
    } else {
        (1, LOOP_TILE, MAX_WARPS)
    };
    let per_block = (m / (2 * MULTIPROCESSORS)).max(1).next_power_of_two();
    let rb = per_block.clamp(bm.max(4), MAX_BLOCK_ROWS.max(bm));
    let per_thread = bm * bn / (32 * nw);
    let occ = if n <= bn && per_thread <= NORM_BACKWARD_TWO_BLOCKS_PER_THREAD {
        2
    } else {
        1
    };
    NormBackwardConfig {
        bm,
        bn,
        rb,
        nw,
        occ,
    }
}

#[cfg(test)]
mod tests {
    use super::{NormBackwardConfig, RowConfig, norm_backward_config, row_config};

    #[test]
    fn rows_are_spread_over_the_block() {
        let c = |bm, bn, nw| RowConfig { bm, bn, nw };
        assert_eq!(row_config(1), c(128, 32, 8));
        assert_eq!(row_config(1000), c(4, 1024, 8));
        assert_eq!(row_config(4096), c(1, 4096, 8));
        assert_eq!(row_config(4097), c(1, 4352, 8));
        assert_eq!(row_config(5000), c(1, 5120, 8));
        assert_eq!(row_config(9000), c(1, 9216, 16));
        assert_eq!(row_config(600), c(4, 768, 8));
        assert_eq!(row_config(16384), c(1, 16384, 16));
        assert_eq!(row_config(16385), c(1, 4096, 8));
    }

    #[test]
    fn norm_backwards_read_rows_once_up_to_8192_columns() {
        let c = |bm, bn, rb, nw, occ| NormBackwardConfig {
            bm,
            bn,
            rb,
            nw,
            occ,
        };
        assert_eq!(norm_backward_config(1, 1), c(4, 32, 4, 8, 2));
        assert_eq!(norm_backward_config(4096, 1000), c(2, 1024, 16, 8, 2));
        assert_eq!(norm_backward_config(4096, 4097), c(1, 4608, 16, 16, 2));
        assert_eq!(norm_backward_config(4096, 5000), c(1, 5120, 16, 16, 1));
        assert_eq!(norm_backward_config(4096, 600), c(2, 768, 16, 8, 2));
        assert_eq!(norm_backward_config(32768, 8192), c(1, 8192, 32, 16, 1));
        assert_eq!(norm_backward_config(65536, 4096), c(1, 4096, 32, 16, 2));
        assert_eq!(norm_backward_config(16384, 16384), c(1, 4096, 32, 16, 1));
    }
}
