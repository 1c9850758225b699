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
    /// Tiles whose work varies with x: each wave the next `C` tiles in plane order, by
    /// decreasing x, dealt in a snake.
    ///
    /// Wave `k` runs tiles `k C .. (k + 1) C` of the plane order (`x + nx (y + ny z)`, x
    /// fastest), so the tiles running at once span about `C / nx` planes (attention's heads:
    /// their keys and values, or queries and dQ, warm in L2), as in `Strided`; within the
    /// wave they are dealt by decreasing x in a snake: in even waves CTA `c` takes the
    /// wave's `c`-th, in odd waves its `(C - 1 - c)`-th, so a CTA that took a longer tile in
    /// one wave takes a shorter one in the next and the CTAs finish together. A fixed stride
    /// would not: with 132 CTAs and 128 query blocks it walks x by 4, and the CTAs that start
    /// on the longest blocks keep the longest ones. Sorting every tile by x instead (a wave
    /// of one or two x for every plane) balanced as well but ran `C` planes at once: the
    /// keys-major attention backward at d = 128, s = 4k, causal, 32 heads read 759 MB from
    /// DRAM on an H100 (L2 hit rate 70%) where its non-causal twice the work read 218 MB
    /// (94%).
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

    /// The logical block index of tile `t` of the order over `grid` (every extent at least 1)
    /// on `ctas` CTAs.
    pub fn block(&self, t: u32, grid: [u32; 3], ctas: u32) -> [u32; 3] {
        let [nx, ny, nz] = grid;
        match self {
            TileScheduler::Strided => {
                let yz = t / nx;
                [t % nx, yz % ny, yz / ny]
            }
            TileScheduler::LongestFirst => {
                let wave = WaveRun::of(t / ctas * ctas, ctas, nx * ny * nz, nx);
                let (x, plane) = wave.tile(t - t / ctas * ctas);
                [x, plane % ny, plane / ny]
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

/// The tiles of one wave of [`TileScheduler::LongestFirst`]: positions `start .. end` of the
/// plane order over a grid `nx` wide, counted by x from the largest down. The run holds part
/// of plane `first` (x from `first_x` on), every x of the `full` planes after it, and part of
/// plane `last` (x below `last_x`); `full` is -1 where the run lies inside one plane
/// (`first == last`), which the count below then needs no case for.
#[derive(Clone, Copy, Debug)]
pub struct WaveRun {
    nx: u32,
    first: u32,
    first_x: u32,
    last_x: u32,
    full: i64,
}

impl WaveRun {
    /// The run of `ctas` positions from `start` (a multiple of `ctas`) of `total`.
    pub fn of(start: u32, ctas: u32, total: u32, nx: u32) -> WaveRun {
        let end = (start + ctas).min(total);
        let (first, last) = (start / nx, end / nx);
        WaveRun {
            nx,
            first,
            first_x: start % nx,
            last_x: end % nx,
            full: i64::from(last) - i64::from(first) - 1,
        }
    }

    /// How many of the run's tiles have an x of `x0` or more.
    pub fn at_or_above(&self, x0: u32) -> u32 {
        let n = i64::from(self.nx - x0) * self.full
            + i64::from(self.nx - x0.max(self.first_x))
            + i64::from(self.last_x.saturating_sub(x0));
        n as u32
    }

    /// The run's `r`-th tile by decreasing x (planes in order within one x): `(x, plane)`.
    pub fn tile(&self, r: u32) -> (u32, u32) {
        // The largest x whose tiles and those above it number more than r.
        let (mut lo, mut hi) = (0, self.nx);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.at_or_above(mid) > r {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let within = r - self.at_or_above(lo + 1);
        let start = if lo >= self.first_x {
            self.first
        } else {
            self.first + 1
        };
        (lo, start + within)
    }
}

impl fmt::Display for TileScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TileScheduler::Strided => f.write_str(
                "  tiles: persistent CTAs; x fastest, CTA c runs tiles c, c + ctas, ...",
            ),
            TileScheduler::LongestFirst => f.write_str(
                "  tiles: persistent CTAs; the loop's trip count depends on x: each wave the \
                 next ctas tiles, x fastest, run by decreasing x, dealt in a snake",
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
                    .map(|t| s.block(t as u32, grid, ctas))
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
        // Waves of 7 over planes of 5: the first runs plane 0 (x 4 down to 0) and plane 1's x
        // 0 and 1, by decreasing x: (4, 0), (3, 0), (2, 0), (1, 0), (1, 1), (0, 0), (0, 1).
        let longest = |t| TileScheduler::LongestFirst.block(t, [5, 3, 2], 7);
        assert_eq!(longest(0), [4, 0, 0]);
        assert_eq!(longest(4), [1, 1, 0]);
        assert_eq!(longest(6), [0, 1, 0]);
        // The second: plane 1's x 2..=4 and plane 2's x 0..=3, so (4, 1), (3, 1), (3, 2),
        // (2, 1), ...
        assert_eq!(longest(7), [4, 1, 0]);
        assert_eq!(longest(8), [3, 1, 0]);
        assert_eq!(longest(9), [3, 2, 0]);
        assert_eq!(longest(10), [2, 1, 0]);
        assert_eq!(TileScheduler::Strided.block(5, [5, 3, 2], 7), [0, 1, 0]);
        // Groups of two x blocks (the last one narrower): 0 1 | 0 1 | 0 1 over y, then x = 4.
        let grouped = TileScheduler::Grouped { rows: 2 };
        let order: Vec<[u32; 3]> = (0..15).map(|t| grouped.block(t, [5, 3, 2], 7)).collect();
        assert_eq!(order[..4], [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]);
        assert_eq!(order[12..], [[4, 0, 0], [4, 1, 0], [4, 2, 0]]);
        assert_eq!(grouped.block(15, [5, 3, 2], 7), [0, 0, 1]);
    }

    #[test]
    fn grouped_waves_read_fewer_panels() {
        // A 4096^3 GEMM in 128x256 tiles on 132 CTAs: the panels of A (x) and B (y) that the
        // first wave reads.
        let (grid, ctas) = ([32, 16, 1], 132);
        let panels = |s: TileScheduler| {
            let wave: Vec<[u32; 3]> = (0..ctas).map(|t| s.block(t, grid, ctas)).collect();
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

    #[test]
    fn longest_first_runs_few_planes_at_once_and_stays_balanced() {
        // Causal attention, forward (work grows with x) and the keys-major backward (work
        // shrinks with x), on 132 CTAs: the heads (planes) a wave runs, and the largest CTA's
        // work over the mean.
        for (grid, grows) in [
            ([32, 16, 4], true),
            ([32, 16, 4], false),
            ([64, 16, 4], false),
            ([128, 16, 1], true),
            ([8, 16, 16], true),
            ([17, 16, 8], true),
        ] {
            let ctas = 132;
            let nx = grid[0];
            let tiles = walk(TileScheduler::LongestFirst, grid, ctas);
            let work = |b: &[u32; 3]| if grows { b[0] + 1 } else { nx - b[0] };
            let loads: Vec<u32> = tiles.iter().map(|t| t.iter().map(work).sum()).collect();
            let mean = loads.iter().sum::<u32>() as f64 / f64::from(ctas);
            let most = f64::from(*loads.iter().max().expect("CTAs"));
            assert!(most / mean < 1.1, "{grid:?}: imbalance {}", most / mean);
            let waves = tiles.iter().map(Vec::len).max().unwrap_or(0);
            for k in 0..waves {
                let mut planes: Vec<u32> = tiles
                    .iter()
                    .filter_map(|t| t.get(k))
                    .map(|b| b[1] + grid[1] * b[2])
                    .collect();
                planes.sort();
                planes.dedup();
                assert!(
                    planes.len() as u32 <= ctas.div_ceil(nx) + 1,
                    "{grid:?} wave {k}: {} planes",
                    planes.len()
                );
            }
        }
    }

    #[test]
    fn a_waves_tiles_by_x_are_its_run_in_plane_order() {
        // Every wave of every order over odd grids: the run's tiles, each once.
        for (grid, ctas) in [
            ([5, 3, 2], 7),
            ([4, 1, 1], 9),
            ([7, 2, 3], 3),
            ([3, 5, 1], 4),
        ] {
            let [nx, ny, nz] = grid;
            let total = nx * ny * nz;
            for start in (0..total).step_by(ctas as usize) {
                let run = WaveRun::of(start, ctas, total, nx);
                let end = (start + ctas).min(total);
                let mut got: Vec<u32> = (0..end - start)
                    .map(|r| run.tile(r))
                    .map(|(x, plane)| x + nx * plane)
                    .collect();
                let xs: Vec<u32> = got.iter().map(|t| t % nx).collect();
                assert!(xs.windows(2).all(|w| w[0] >= w[1]), "{grid:?}: {xs:?}");
                got.sort();
                assert_eq!(
                    got,
                    (start..end).collect::<Vec<_>>(),
                    "{grid:?} from {start}"
                );
            }
        }
    }
}
