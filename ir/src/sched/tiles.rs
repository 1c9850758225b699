//! The tile scheduler of persistent kernels: a launch runs as many CTAs as fit on the GPU at
//! once, and each walks work tiles (the blocks of the kernel's logical grid) until none is left,
//! so the next tile's loads overlap the current tile's epilogue and no CTA pays a launch per
//! tile. CTA `c` of `C` runs its `k`-th tile in wave `k` (tiles `k C .. (k + 1) C` of the order
//! [`TileScheduler`] gives).

use std::fmt;

/// How a persistent kernel's CTAs walk its logical grid (see the module doc). The order
/// depends on whether the work of a tile varies with its x block index (the kernel's loop
/// trip count depends on it, as a causal attention's query blocks) and whether its loads
/// reuse data along x and y.
///
/// A clustered schedule ([`super::cluster`]) deals tile pairs: the order runs over the grid
/// of `cdiv(nx, 2)` x pairs with a cluster in the place of a CTA, and CTA `r` of the pair
/// takes x block `2 px + r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileScheduler {
    /// Equal tiles, x fastest, CTA `c` takes every `C`-th from `c`.
    ///
    /// Tiles are numbered `t = x + nx (y + ny z)`, x fastest, so the tiles running at once
    /// share y and z (attention's head and batch: the same keys and values, warm in L2); CTA
    /// `c` runs tiles `c, c + C, c + 2C, ...`.
    Strided,
    /// Tiles whose work grows with x: decreasing x, dealt in a snake.
    ///
    /// Tiles in order of decreasing x, the longest first (`t = (nx - 1 - x) ny nz + y + ny
    /// z`), dealt out wave by wave in a snake: in even waves CTA `c` takes position `c`, in
    /// odd waves position `C - 1 - c`, so a CTA that took a longer tile in one wave takes a
    /// shorter one in the next and the CTAs finish together. A fixed stride would not: with
    /// 132 CTAs and 128 query blocks it walks x by 4, and the CTAs that start on the longest
    /// blocks keep the longest ones.
    LongestFirst,
    /// Equal tiles that share data along x and along y: groups of `rows` x blocks, x fastest
    /// within a group, then y.
    ///
    /// For a GEMM a row of tiles reads one panel of `A`, a column one panel of `B`. Within a
    /// group x is fastest, then y; then the next group (z slowest). A wave then reads `rows`
    /// panels of one operand and about `C / rows` of the other, fewer than x fastest over all
    /// of x, so more of them stay in L2 (Triton's grouped order). CTA `c` runs tiles `c, c +
    /// C, ...` as in `Strided`.
    Grouped {
        /// x blocks per group.
        rows: u32,
    },
}

impl TileScheduler {
    /// Work tiles in a logical grid.
    pub fn tiles(grid: [u32; 3]) -> u64 {
        grid.iter().map(|&n| u64::from(n)).product()
    }

    /// The position in the order of the `k`-th tile of CTA `cta` of `ctas`.
    pub fn tile(&self, cta: u32, ctas: u32, k: u32) -> u64 {
        let wave = u64::from(k) * u64::from(ctas);
        let pos = match self {
            TileScheduler::LongestFirst if k % 2 == 1 => ctas - 1 - cta,
            TileScheduler::Strided
            | TileScheduler::LongestFirst
            | TileScheduler::Grouped { .. } => cta,
        };
        wave + u64::from(pos)
    }

    /// The logical block index of tile `t` of the order over `grid` (every extent at least 1).
    pub fn block(&self, t: u32, grid: [u32; 3]) -> [u32; 3] {
        let [nx, ny, nz] = grid;
        match self {
            TileScheduler::Strided => {
                let yz = t / nx;
                [t % nx, yz % ny, yz / ny]
            }
            TileScheduler::LongestFirst => {
                let yz = t % (ny * nz);
                [nx - 1 - t / (ny * nz), yz % ny, yz / ny]
            }
            &TileScheduler::Grouped { rows } => {
                let (z, r) = (t / (nx * ny), t % (nx * ny));
                let first = r / (rows * ny) * rows;
                let width = rows.min(nx - first);
                let within = r - first * ny;
                [first + within % width, within / width, z]
            }
        }
    }
}

impl fmt::Display for TileScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TileScheduler::Strided => f.write_str(
                "  tiles: persistent CTAs; x fastest, CTA c runs tiles c, c + ctas, ...",
            ),
            TileScheduler::LongestFirst => f.write_str(
                "  tiles: persistent CTAs; the loop's trip count depends on x: decreasing x \
                 (longest first), dealt wave by wave in a snake",
            ),
            TileScheduler::Grouped { rows } => write!(
                f,
                "  tiles: persistent CTAs; loads reuse data along x and y: groups of {rows} x \
                 blocks, x fastest within a group, then y; CTA c runs tiles c, c + ctas, ..."
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every CTA's tiles, in order, until the grid is exhausted.
    fn walk(s: TileScheduler, grid: [u32; 3], ctas: u32) -> Vec<Vec<[u32; 3]>> {
        let total = TileScheduler::tiles(grid);
        (0..ctas)
            .map(|c| {
                (0..)
                    .map(|k| s.tile(c, ctas, k))
                    .take_while(|&t| t < total)
                    .map(|t| s.block(t as u32, grid))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_block_is_one_tile() {
        for s in [
            TileScheduler::Strided,
            TileScheduler::LongestFirst,
            TileScheduler::Grouped { rows: 2 },
            TileScheduler::Grouped { rows: 8 },
        ] {
            for ctas in [1, 4, 7, 30, 40] {
                let grid = [5, 3, 2];
                let mut seen: Vec<[u32; 3]> = walk(s, grid, ctas).concat();
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), 30, "{s:?} with {ctas} CTAs");
                assert!(seen.iter().all(|b| b[0] < 5 && b[1] < 3 && b[2] < 2));
            }
        }
        assert_eq!(TileScheduler::LongestFirst.block(0, [5, 3, 2]), [4, 0, 0]);
        assert_eq!(TileScheduler::LongestFirst.block(6, [5, 3, 2]), [3, 0, 0]);
        assert_eq!(TileScheduler::Strided.block(5, [5, 3, 2]), [0, 1, 0]);
        // Groups of two x blocks (the last one narrower): 0 1 | 0 1 | 0 1 over y, then x = 4.
        let grouped = TileScheduler::Grouped { rows: 2 };
        let order: Vec<[u32; 3]> = (0..15).map(|t| grouped.block(t, [5, 3, 2])).collect();
        assert_eq!(order[..4], [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]);
        assert_eq!(order[12..], [[4, 0, 0], [4, 1, 0], [4, 2, 0]]);
        assert_eq!(grouped.block(15, [5, 3, 2]), [0, 0, 1]);
    }

    #[test]
    fn grouped_waves_read_fewer_panels() {
        // A 4096^3 GEMM in 128x256 tiles on 132 CTAs: the panels of A (x) and B (y) that the
        // first wave reads.
        let (grid, ctas) = ([32, 16, 1], 132);
        let panels = |s: TileScheduler| {
            let wave: Vec<[u32; 3]> = (0..ctas).map(|t| s.block(t, grid)).collect();
            let distinct = |axis: usize| {
                let mut v: Vec<u32> = wave.iter().map(|b| b[axis]).collect();
                v.sort();
                v.dedup();
                v.len()
            };
            distinct(0) + distinct(1)
        };
        assert!(panels(TileScheduler::Grouped { rows: 8 }) < 30);
        assert!(panels(TileScheduler::Strided) > 35);
    }

    #[test]
    fn longest_first_evens_out_causal_work() {
        // A causal attention at s = 16k: 128 query blocks of 16 heads, block x sees x + 1 key
        // blocks, on 132 CTAs.
        let (grid, ctas) = ([128, 16, 1], 132);
        let imbalance = |s| {
            let work: Vec<u32> = walk(s, grid, ctas)
                .iter()
                .map(|tiles| tiles.iter().map(|b| b[0] + 1).sum())
                .collect();
            let mean = work.iter().sum::<u32>() as f64 / f64::from(ctas);
            f64::from(*work.iter().max().expect("CTAs")) / mean
        };
        assert!(imbalance(TileScheduler::LongestFirst) < 1.05);
        assert!(imbalance(TileScheduler::Strided) > 1.4);
    }
}
