//! The tile scheduler of persistent kernels: a launch runs as many CTAs as fit on the GPU at
//! once, and each walks work tiles (the blocks of the kernel's logical grid) until none is
//! left, so the next tile's loads overlap the current tile's epilogue and no CTA pays a launch
//! per tile.
//!
//! Tiles are numbered `t = x + nx * (y + ny * z)` over the logical grid `(nx, ny, nz)`: x, the
//! kernel's first block index, varies fastest, so consecutive tiles share the y and z indices
//! (attention's head and batch: the same keys and values, warm in L2). CTA `c` of `C` runs tiles
//! `c, c + C, c + 2C, ...`. Where the work of a tile grows with its x index (a causal
//! attention's query blocks), x runs from the last block down, so the longest tiles start
//! first and the short ones fill in behind them.

use std::fmt;

/// How a persistent kernel's CTAs walk its logical grid (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileScheduler {
    /// Whether x runs from the last block down (the loop's trip count depends on it).
    pub x_descending: bool,
}

impl TileScheduler {
    /// Work tiles in a logical grid.
    pub fn tiles(grid: [u32; 3]) -> u64 {
        grid.iter().map(|&n| u64::from(n)).product()
    }

    /// The logical block index of tile `t` of `grid` (every extent at least 1).
    pub fn block(&self, t: u32, grid: [u32; 3]) -> [u32; 3] {
        let (x, yz) = (t % grid[0], t / grid[0]);
        let x = if self.x_descending {
            grid[0] - 1 - x
        } else {
            x
        };
        [x, yz % grid[1], yz / grid[1]]
    }
}

impl fmt::Display for TileScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  tiles: persistent CTAs, CTA c runs tiles c, c + ctas, ...; t = x + nx (y + ny z), \
             x {}",
            if self.x_descending {
                "descending (the loop's trip count depends on it: longest first)"
            } else {
                "ascending"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_one_tile() {
        for x_descending in [false, true] {
            let s = TileScheduler { x_descending };
            let grid = [5, 3, 2];
            let mut seen: Vec<[u32; 3]> = (0..TileScheduler::tiles(grid) as u32)
                .map(|t| s.block(t, grid))
                .collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 30);
            assert!(seen.iter().all(|b| b[0] < 5 && b[1] < 3 && b[2] < 2));
        }
        let s = TileScheduler { x_descending: true };
        assert_eq!(s.block(0, [5, 3, 2]), [4, 0, 0]);
        assert_eq!(s.block(5, [5, 3, 2]), [4, 1, 0]);
    }
}
