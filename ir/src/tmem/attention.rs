//! The sm_100a schedule of an attention-shaped ring loop (`S = Q K^T`, an online softmax,
//! `O = O * alpha + P V`; found by structure by the `overlap` pass's analysis), in the style of
//! FlashAttention-4: warp roles, the tensor-memory plan and every role's program.
//!
//! **Work.** A CTA runs pairs of work tiles: tiles `2 p` and `2 p + 1` along x of the kernel's
//! grid (two 128-row query tiles of one head, so 256 query rows) share every K/V block the
//! ring loads. The pair walks the key blocks from the earlier of the two tiles' starts to the
//! later of their ends (causal: the second's); a softmax warpgroup runs the iterations
//! outside its own tile's range as no-ops (no score copied, `P = 0`, factors 1, its running
//! values kept), so each tile's result is that of its own loop, whatever the kernel's mask
//! (but for `0 x V` where V is not finite, which the tile's own loop would never read).
//!
//! **Roles** ([`AttentionRoles`], 16 warps): two softmax warpgroups (warpgroup `g` owns Q tile
//! `g`: thread `t` one query row, TMEM lane `t`), a correction warpgroup, then a warpgroup
//! whose first warp issues the TMA loads, whose second owns TMEM and issues every
//! `tcgen05.mma` from one thread, and whose last two only give their registers back.
//!
//! **TMEM** (one allocation of [`TMEM_COLUMNS`]): per Q tile `g`, `O_g` (`d` f32 columns) and
//! `S_g` (`block_n` f32 columns). The softmax overwrites `S_g` with `P_g` (bf16, two a
//! column: the first `block_n / 2` columns), which the PV mma reads as its A operand from TMEM.
//!
//! **Handoffs**, per loop iteration (phase `i` of every per-iteration barrier is iteration
//! `i`, counted across the CTA's tiles): the MMA thread waits for the stage, issues
//! `S_g = Q_g K^T` and commits it to `s_full[g]`; softmax `g` copies `S_g` to registers, runs
//! the loop's code between the mmas, writes its rows' rescale factors `alpha` to shared memory
//! (`scale_full[g]`) and `P_g` over `S_g` (`p_full[g]`); the correction warpgroup waits for the
//! previous `O_g += P V` (`o_full[g]`) and rescales `O_g` in TMEM by `alpha`, then hands `O_g`
//! to the MMA thread (`o_ready[g]`), which issues `O_g += P_g V` and commits it to `o_full[g]`;
//! the stage is released by a `tcgen05.commit` after the last mma reading it. After its
//! loop, softmax `g` waits for the last `o_full[g]`, copies `O_g` out, hands TMEM back
//! (`o_empty[g]`, one phase per tile) and runs the kernel's code after the loop; its store
//! goes through a staging tile of its own and TMA ([`AttentionPlan::stores`]) where shared
//! memory has room for both warpgroups' (in as few rounds as fit), else from registers.
//!
//! **Conditional rescale** (FlashAttention-4's): a row keeps its reference maximum while its
//! running maximum exceeds it by at most [`crate::ring::Deferral::THRESHOLD`] (in the base-2
//! exponent), so `p <= 2^8` and its `alpha` is exactly 1; a correction warp whose 32 rows all
//! have `alpha = 1` skips the rescale. This is exact, not an approximation: `O` and `l` of a
//! row are both accumulated against the same stale reference, and only `O / l` is read after
//! the loop, so the reference cancels.

use std::fmt;

use super::{Descriptor, TMEM_COLUMNS};
use crate::kernel::OpId;
use crate::print::join_steps;
use crate::ring::{Bar, Overlap};

/// Warps of a warpgroup (the softmax and correction roles are whole warpgroups, as
/// `setmaxnreg` and the four 32-lane quarters of TMEM want).
pub const WARPGROUP_WARPS: u32 = 4;
/// Query tiles a CTA runs at once (one per softmax warpgroup).
pub const Q_TILES: u32 = 2;
/// Columns one `tcgen05.ld`/`st` of the correction copies (`32x32b.x32`).
pub const RESCALE_COLUMNS: u32 = 32;

/// Which warps do what (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionRoles {
    /// Warps of each softmax warpgroup (warpgroup `g` is warps `4 g ..`).
    pub softmax_warps: u32,
    /// The correction warpgroup's first warp.
    pub correction_warp: u32,
    /// The warp whose elected thread issues the TMA loads.
    pub load_warp: u32,
    /// The warp that owns TMEM and whose elected thread issues the `tcgen05.mma`s.
    pub mma_warp: u32,
    /// Warps in the block (whole warpgroups, as `setmaxnreg` wants).
    pub warps: u32,
    /// `setmaxnreg` of the softmax, correction and last warpgroups (they sum to the register
    /// file: `128 * (2 softmax + correction + other) = 65536`).
    pub regs: [u32; 3],
}

impl AttentionRoles {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
}

/// The schedule's own mbarriers, one per Q tile each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttnBar {
    /// `S_g` computed (`tcgen05.commit`, count 1).
    SFull(u32),
    /// `alpha` of tile `g`'s rows in shared memory (one arrival per softmax warp).
    ScaleFull(u32),
    /// `P_g` written over `S_g`, `S_g` read (one arrival per softmax warp).
    PFull(u32),
    /// `O_g` rescaled (one arrival per correction warp).
    OReady(u32),
    /// `O_g += P_g V` complete (`tcgen05.commit`, count 1).
    OFull(u32),
    /// `O_g` copied out by the epilogue (one arrival per softmax warp; one phase per tile).
    OEmpty(u32),
}

impl AttnBar {
    /// Every barrier of the schedule, in shared-memory order.
    pub fn all() -> Vec<AttnBar> {
        (0..Q_TILES)
            .flat_map(|g| {
                [
                    AttnBar::SFull(g),
                    AttnBar::ScaleFull(g),
                    AttnBar::PFull(g),
                    AttnBar::OReady(g),
                    AttnBar::OFull(g),
                    AttnBar::OEmpty(g),
                ]
            })
            .collect()
    }

    /// Its index in [`AttnBar::all`].
    pub fn index(self) -> u32 {
        let (g, k) = match self {
            AttnBar::SFull(g) => (g, 0),
            AttnBar::ScaleFull(g) => (g, 1),
            AttnBar::PFull(g) => (g, 2),
            AttnBar::OReady(g) => (g, 3),
            AttnBar::OFull(g) => (g, 4),
            AttnBar::OEmpty(g) => (g, 5),
        };
        6 * g + k
    }

    /// Whether an arrival on it hands TMEM to another role (so the arriving role's tcgen05
    /// ops must be fenced before it); `scale_full` hands over shared memory only.
    pub fn hands_tmem(self) -> bool {
        !matches!(self, AttnBar::ScaleFull(_))
    }

    /// Whether a phase completes per work tile (else per loop iteration).
    pub fn per_tile(self) -> bool {
        matches!(self, AttnBar::OEmpty(_))
    }
}

/// One step of a role's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnStep {
    /// `tcgen05.alloc` of `columns` by the whole MMA warp.
    Alloc {
        /// Columns (a power of 2 in 32..=512).
        columns: u32,
    },
    /// `tcgen05.relinquish_alloc_permit`.
    Relinquish,
    /// The TMEM address reaches every thread (fences around `bar.sync 0`, `ld.shared`).
    Publish,
    /// `tcgen05.dealloc` of `columns` by the whole MMA warp.
    Dealloc {
        /// Columns (those allocated).
        columns: u32,
    },
    /// A parity wait on one of the ring's barriers (its stage and phase as in the ring's
    /// programs; `once` and `once_free` per tile).
    RingWait {
        /// The barrier.
        bar: Bar,
        /// The parity of the first wait.
        start: u32,
    },
    /// `mbarrier.arrive.expect_tx` on the ring's `once` barrier (both Q tiles' bytes).
    ExpectQ {
        /// Transaction bytes.
        bytes: u32,
    },
    /// The TMA boxes of Q tile `tile` (the ring's once load at that tile's block index).
    LoadQ {
        /// The Q tile.
        tile: u32,
    },
    /// The ring's producer program for one iteration (K and V into the next stage).
    LoadKv,
    /// `tcgen05.commit` to one of the ring's barriers (`empty` of the iteration's stage, or
    /// `once_free`): released when every mma the thread issued so far has completed.
    RingCommit {
        /// The barrier.
        bar: Bar,
    },
    /// A parity wait on a schedule barrier; `lag` 1 waits for the previous iteration's phase
    /// and is skipped where there is none in this tile (its first iteration; after a loop
    /// that ran no iteration).
    Wait {
        /// The barrier.
        bar: AttnBar,
        /// The parity of the first wait.
        start: u32,
        /// Iterations back.
        lag: u32,
    },
    /// One arrival per warp (its lane 0).
    Arrive {
        /// The barrier.
        bar: AttnBar,
    },
    /// `tcgen05.commit` to a schedule barrier.
    Commit {
        /// The barrier.
        bar: AttnBar,
    },
    /// `tcgen05.fence::after_thread_sync`.
    FenceAfter,
    /// `tcgen05.fence::before_thread_sync`.
    FenceBefore,
    /// `S_g = Q_g K^T`: `tcgen05.mma`s from shared-memory descriptors into `S_g`.
    MmaS {
        /// The Q tile.
        tile: u32,
    },
    /// `O_g (+)= P_g V`: `tcgen05.mma`s with A (`P_g`) from TMEM, V from shared memory; the
    /// tile's first iteration overwrites `O_g`.
    MmaO {
        /// The Q tile.
        tile: u32,
    },
    /// `tcgen05.ld.32x32b` of `S_g` (the thread's row) into registers.
    LoadS {
        /// The Q tile.
        tile: u32,
    },
    /// The loop's code between the two mmas on the copied scores (the online softmax).
    Softmax,
    /// The rows' rescale factors into tile `tile`'s shared-memory slot (`st.shared`).
    StoreScale {
        /// The Q tile.
        tile: u32,
    },
    /// `tcgen05.st.32x32b` of `P_g` (bf16 pairs) over `S_g`.
    StoreP {
        /// The Q tile.
        tile: u32,
    },
    /// The correction reads its rows' factors from tile `tile`'s slot.
    LoadScale {
        /// The Q tile.
        tile: u32,
    },
    /// Opens the rescale of `O_g`: skipped by a warp whose factors are all 1, and in a tile's
    /// first iteration (no product in `O_g` yet: the first PV mma overwrites it).
    BeginRescale {
        /// The Q tile.
        tile: u32,
    },
    /// `tcgen05.ld.32x32b` of `columns` of `O_g` from `column`.
    LoadO {
        /// The Q tile.
        tile: u32,
        /// First column of `O_g`.
        column: u32,
        /// Columns.
        columns: u32,
    },
    /// Multiplies the registers the last [`AttnStep::LoadO`] copied by the row's factor.
    ScaleO {
        /// The Q tile.
        tile: u32,
    },
    /// `tcgen05.st.32x32b` of those registers back.
    StoreO {
        /// The Q tile.
        tile: u32,
    },
    /// Closes [`AttnStep::BeginRescale`].
    EndRescale,
    /// `tcgen05.wait::ld`.
    WaitLd,
    /// `tcgen05.wait::st`.
    WaitSt,
    /// The kernel's code after the loop, on the copied `O_g` and the softmax's `l`.
    Epilogue,
}

/// Where a Q tile's values live in TMEM (columns from the allocation's base).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileColumns {
    /// First column of `O_g`.
    pub o: u32,
    /// First column of `S_g` (and of `P_g`, written over it).
    pub s: u32,
}

/// The sm_100a attention schedule (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionPlan {
    /// The ring's `for`.
    pub for_op: OpId,
    /// The loop's structure: head (`S`) and tail (`P V`) mmas, the code between, the
    /// rescale and its factor, the deferred maximum.
    pub overlap: Overlap,
    /// The warp roles.
    pub roles: AttentionRoles,
    /// TMEM columns allocated.
    pub columns: u32,
    /// Head dimension (`O`'s columns) and key block (`S`'s columns).
    pub d: u32,
    /// See [`AttentionPlan::d`].
    pub block_n: u32,
    /// Each Q tile's columns.
    pub tiles: Vec<TileColumns>,
    /// Instruction descriptors of `S = Q K^T` and `O += P V`.
    pub s_idesc: u32,
    /// See [`AttentionPlan::s_idesc`].
    pub o_idesc: u32,
    /// Shared-memory descriptors of Q, K and V.
    pub q: Descriptor,
    /// See [`AttentionPlan::q`].
    pub k: Descriptor,
    /// See [`AttentionPlan::q`].
    pub v: Descriptor,
    /// Shared byte offset of Q tile 1 (tile 0 is the ring's once buffer).
    pub q1_offset: u32,
    /// Shared byte offsets of the TMEM address slot, of the first schedule barrier (the
    /// rest follow [`AttnBar::all`], 8 bytes each), and of tile 0's factor slot (128 f32;
    /// tile 1's follows).
    pub slot_offset: u32,
    /// See [`AttentionPlan::slot_offset`].
    pub bars_offset: u32,
    /// See [`AttentionPlan::slot_offset`].
    pub scale_offset: u32,
    /// The epilogue's TMA store of each Q tile (one staging tile and named barrier per
    /// softmax warpgroup; tile 0's is also `schedule.tma_stores`' entry), or none where shared
    /// memory has no room for both staging tiles (the output is then stored from registers).
    pub stores: Vec<crate::tma_store::TmaStore>,
    /// The share of the score tile's exponentials the polynomial computes
    /// ([`super::exp2`]): every column `c` with `c % den < num`.
    pub poly_share: (u32, u32),
    /// The MMA warp before the roles split.
    pub setup: Vec<AttnStep>,
    /// The load warp's thread, per work tile: before its loop, and per iteration.
    pub load_tile: Vec<AttnStep>,
    /// See [`AttentionPlan::load_tile`].
    pub load_iteration: Vec<AttnStep>,
    /// The MMA thread, per work tile: before its loop, per iteration, after it.
    pub mma_tile: Vec<AttnStep>,
    /// See [`AttentionPlan::mma_tile`].
    pub mma_iteration: Vec<AttnStep>,
    /// See [`AttentionPlan::mma_tile`].
    pub mma_tile_end: Vec<AttnStep>,
    /// The MMA warp after the last tile.
    pub mma_exit: Vec<AttnStep>,
    /// Softmax warpgroup `g`, per work tile before its loop, per iteration and after the
    /// loop (tile `g`'s steps name `g`; one list per warpgroup).
    pub softmax_tile: Vec<Vec<AttnStep>>,
    /// See [`AttentionPlan::softmax_tile`].
    pub softmax_iteration: Vec<Vec<AttnStep>>,
    /// See [`AttentionPlan::softmax_iteration`].
    pub softmax_end: Vec<Vec<AttnStep>>,
    /// The correction warpgroup, per iteration.
    pub correction_iteration: Vec<AttnStep>,
}

impl AttentionPlan {
    /// Arrivals that complete a phase of `bar`.
    pub fn count(&self, bar: AttnBar) -> u32 {
        match bar {
            AttnBar::SFull(_) | AttnBar::OFull(_) => 1,
            AttnBar::ScaleFull(_) | AttnBar::PFull(_) | AttnBar::OEmpty(_) => {
                self.roles.softmax_warps
            }
            AttnBar::OReady(_) => WARPGROUP_WARPS,
        }
    }

    /// Shared byte offset of `bar`.
    pub fn offset(&self, bar: AttnBar) -> u32 {
        self.bars_offset + 8 * bar.index()
    }

    /// Shared byte offset of tile `tile`'s rescale factors (one f32 per row).
    pub fn scale_slot(&self, tile: u32) -> u32 {
        self.scale_offset + super::ACC_ROWS * 4 * tile
    }

    /// Whether column `c` of the score tile takes the polynomial exponential.
    pub fn poly_column(&self, c: u32) -> bool {
        let (num, den) = self.poly_share;
        den > 0 && c % den < num
    }
}

/// The programs of a plan, from its shapes (see the module doc for what each role does).
pub struct Programs {
    /// [`AttentionPlan::setup`].
    pub setup: Vec<AttnStep>,
    /// [`AttentionPlan::load_tile`].
    pub load_tile: Vec<AttnStep>,
    /// [`AttentionPlan::load_iteration`].
    pub load_iteration: Vec<AttnStep>,
    /// [`AttentionPlan::mma_tile`].
    pub mma_tile: Vec<AttnStep>,
    /// [`AttentionPlan::mma_iteration`].
    pub mma_iteration: Vec<AttnStep>,
    /// [`AttentionPlan::mma_tile_end`].
    pub mma_tile_end: Vec<AttnStep>,
    /// [`AttentionPlan::mma_exit`].
    pub mma_exit: Vec<AttnStep>,
    /// [`AttentionPlan::softmax_tile`].
    pub softmax_tile: Vec<Vec<AttnStep>>,
    /// [`AttentionPlan::softmax_iteration`].
    pub softmax_iteration: Vec<Vec<AttnStep>>,
    /// [`AttentionPlan::softmax_end`].
    pub softmax_end: Vec<Vec<AttnStep>>,
    /// [`AttentionPlan::correction_iteration`].
    pub correction_iteration: Vec<AttnStep>,
}

impl Programs {
    /// The programs for `columns` allocated TMEM columns, head dimension `d` and both Q
    /// tiles' bytes `q_bytes`.
    pub fn new(columns: u32, d: u32, q_bytes: u32) -> Programs {
        use AttnStep as S;
        let tiles = 0..Q_TILES;
        let wait = |bar, start, lag| S::Wait { bar, start, lag };
        let mut load_tile = vec![
            S::RingWait {
                bar: Bar::OnceFree,
                start: 1,
            },
            S::ExpectQ { bytes: q_bytes },
        ];
        load_tile.extend(tiles.clone().map(|tile| S::LoadQ { tile }));
        // O_g is overwritten by the tile's first PV mma only once the previous tile's O_g was
        // copied out (a fresh barrier passes parity 1 at once).
        let mut mma_tile: Vec<AttnStep> = tiles
            .clone()
            .map(|g| wait(AttnBar::OEmpty(g), 1, 0))
            .collect();
        mma_tile.extend([
            S::RingWait {
                bar: Bar::Once,
                start: 0,
            },
            S::FenceAfter,
        ]);
        let mut mma_iteration = vec![
            S::RingWait {
                bar: Bar::Full,
                start: 0,
            },
            S::FenceAfter,
        ];
        for g in tiles.clone() {
            mma_iteration.extend([
                S::MmaS { tile: g },
                S::Commit {
                    bar: AttnBar::SFull(g),
                },
            ]);
        }
        for g in tiles.clone() {
            mma_iteration.extend([
                wait(AttnBar::PFull(g), 0, 0),
                wait(AttnBar::OReady(g), 0, 0),
                S::FenceAfter,
                S::MmaO { tile: g },
                S::Commit {
                    bar: AttnBar::OFull(g),
                },
            ]);
        }
        // The last mma reading the stage (tile 1's PV) was just issued: the commit frees the
        // stage once it, and everything before it, completes.
        mma_iteration.push(S::RingCommit { bar: Bar::Empty });
        let mut mma_exit: Vec<AttnStep> = tiles
            .clone()
            .map(|g| wait(AttnBar::OEmpty(g), 1, 0))
            .collect();
        mma_exit.extend([S::FenceAfter, S::Dealloc { columns }]);
        // A softmax warpgroup starts a tile only once its Q is loaded: the load follows the MMA
        // thread's previous tile (`once_free`), so the warpgroup never runs through empty
        // tiles more than one `o_empty` phase ahead of the MMA thread's wait on it.
        let softmax_tile = tiles
            .clone()
            .map(|_| {
                vec![S::RingWait {
                    bar: Bar::Once,
                    start: 0,
                }]
            })
            .collect();
        let softmax_iteration = tiles
            .clone()
            .map(|g| {
                vec![
                    wait(AttnBar::SFull(g), 0, 0),
                    S::FenceAfter,
                    S::LoadS { tile: g },
                    S::WaitLd,
                    S::Softmax,
                    S::StoreScale { tile: g },
                    S::Arrive {
                        bar: AttnBar::ScaleFull(g),
                    },
                    S::StoreP { tile: g },
                    S::WaitSt,
                    S::FenceBefore,
                    S::Arrive {
                        bar: AttnBar::PFull(g),
                    },
                ]
            })
            .collect();
        let softmax_end = tiles
            .clone()
            .map(|g| {
                let mut end = vec![wait(AttnBar::OFull(g), 0, 1), S::FenceAfter];
                end.extend((0..d.div_ceil(RESCALE_COLUMNS)).map(|q| S::LoadO {
                    tile: g,
                    column: q * RESCALE_COLUMNS,
                    columns: RESCALE_COLUMNS.min(d - q * RESCALE_COLUMNS),
                }));
                end.extend([
                    S::WaitLd,
                    S::FenceBefore,
                    S::Arrive {
                        bar: AttnBar::OEmpty(g),
                    },
                    S::Epilogue,
                ]);
                end
            })
            .collect();
        let mut correction_iteration = Vec::new();
        for g in tiles {
            correction_iteration.extend([
                wait(AttnBar::ScaleFull(g), 0, 0),
                S::LoadScale { tile: g },
                wait(AttnBar::OFull(g), 0, 1),
                S::FenceAfter,
                S::BeginRescale { tile: g },
            ]);
            for q in 0..d.div_ceil(RESCALE_COLUMNS) {
                correction_iteration.extend([
                    S::LoadO {
                        tile: g,
                        column: q * RESCALE_COLUMNS,
                        columns: RESCALE_COLUMNS.min(d - q * RESCALE_COLUMNS),
                    },
                    S::WaitLd,
                    S::ScaleO { tile: g },
                    S::StoreO { tile: g },
                ]);
            }
            correction_iteration.extend([
                S::WaitSt,
                S::EndRescale,
                S::FenceBefore,
                S::Arrive {
                    bar: AttnBar::OReady(g),
                },
            ]);
        }
        Programs {
            setup: vec![S::Alloc { columns }, S::Relinquish, S::Publish],
            load_tile,
            load_iteration: vec![S::LoadKv],
            mma_tile,
            mma_iteration,
            mma_tile_end: vec![S::RingCommit { bar: Bar::OnceFree }],
            mma_exit,
            softmax_tile,
            softmax_iteration,
            softmax_end,
            correction_iteration,
        }
    }
}

impl fmt::Display for AttnBar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttnBar::SFull(g) => write!(f, "s_full[{g}]"),
            AttnBar::ScaleFull(g) => write!(f, "scale_full[{g}]"),
            AttnBar::PFull(g) => write!(f, "p_full[{g}]"),
            AttnBar::OReady(g) => write!(f, "o_ready[{g}]"),
            AttnBar::OFull(g) => write!(f, "o_full[{g}]"),
            AttnBar::OEmpty(g) => write!(f, "o_empty[{g}]"),
        }
    }
}

impl fmt::Display for AttnStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttnStep::Alloc { columns } => write!(f, "alloc {columns} cols"),
            AttnStep::Relinquish => f.write_str("relinquish_alloc_permit"),
            AttnStep::Publish => f.write_str("publish address"),
            AttnStep::Dealloc { columns } => write!(f, "dealloc {columns} cols"),
            AttnStep::RingWait { bar, start } => write!(f, "wait {bar}(phase from {start})"),
            AttnStep::ExpectQ { bytes } => write!(f, "arrive.expect_tx once {bytes}B"),
            AttnStep::LoadQ { tile } => write!(f, "tma q{tile}"),
            AttnStep::LoadKv => f.write_str("ring producer"),
            AttnStep::RingCommit { bar } => write!(f, "tcgen05.commit {bar}"),
            AttnStep::Wait { bar, start, lag } => {
                write!(f, "wait {bar}(phase from {start}")?;
                if *lag > 0 {
                    write!(f, ", i-{lag}")?;
                }
                f.write_str(")")
            }
            AttnStep::Arrive { bar } => write!(f, "arrive {bar}"),
            AttnStep::Commit { bar } => write!(f, "tcgen05.commit {bar}"),
            AttnStep::FenceAfter => f.write_str("fence::after"),
            AttnStep::FenceBefore => f.write_str("fence::before"),
            AttnStep::MmaS { tile } => write!(f, "mma S{tile}=Q{tile}K^T"),
            AttnStep::MmaO { tile } => write!(f, "mma O{tile}+=P{tile}V"),
            AttnStep::LoadS { tile } => write!(f, "ld S{tile}"),
            AttnStep::Softmax => f.write_str("softmax"),
            AttnStep::StoreScale { tile } => write!(f, "st.shared scale{tile}"),
            AttnStep::StoreP { tile } => write!(f, "st P{tile}"),
            AttnStep::LoadScale { tile } => write!(f, "ld.shared scale{tile}"),
            AttnStep::BeginRescale { tile } => write!(f, "rescale O{tile} {{"),
            AttnStep::LoadO {
                tile,
                column,
                columns,
            } => write!(f, "ld O{tile}[{column}+{columns}]"),
            AttnStep::ScaleO { .. } => f.write_str("mul"),
            AttnStep::StoreO { tile } => write!(f, "st O{tile}"),
            AttnStep::EndRescale => f.write_str("}"),
            AttnStep::WaitLd => f.write_str("wait::ld"),
            AttnStep::WaitSt => f.write_str("wait::st"),
            AttnStep::Epilogue => f.write_str("epilogue"),
        }
    }
}

impl fmt::Display for AttentionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.roles;
        writeln!(
            f,
            "  attention roles ({} threads): softmax warpgroups 0-{} (tile g: tcgen05.ld S, \
             softmax, tcgen05.st P, epilogue), correction warps {}-{} (O rescale in TMEM), \
             load warp {} (TMA), mma warp {} (TMEM owner, one thread issues tcgen05.mma); \
             setmaxnreg {}/{}/{}",
            r.threads(),
            Q_TILES - 1,
            r.correction_warp,
            r.correction_warp + 3,
            r.load_warp,
            r.mma_warp,
            r.regs[0],
            r.regs[1],
            r.regs[2]
        )?;
        let tiles: Vec<String> = self
            .tiles
            .iter()
            .enumerate()
            .map(|(g, t)| format!("O{g}@{} S{g}/P{g}@{}", t.o, t.s))
            .collect();
        writeln!(
            f,
            "  tmem {}: {} of {TMEM_COLUMNS} columns; d={} block_n={}; {}; q1@{} slot@{} \
             bars@{} scale@{}; exp2 polynomial on columns c % {} < {}",
            self.for_op,
            self.columns,
            self.d,
            self.block_n,
            tiles.join(" "),
            self.q1_offset,
            self.slot_offset,
            self.bars_offset,
            self.scale_offset,
            self.poly_share.1,
            self.poly_share.0
        )?;
        writeln!(
            f,
            "    idesc S 0x{:08X}, O 0x{:08X}",
            self.s_idesc, self.o_idesc
        )?;
        if self.stores.is_empty() {
            writeln!(f, "    epilogue stores from registers")?;
        }
        for (g, st) in self.stores.iter().enumerate() {
            writeln!(f, "    softmax {g}'s store:\n{st}")?;
        }
        for (name, d) in [("q", &self.q), ("k", &self.k), ("v", &self.v)] {
            let steps: Vec<String> = d.steps.iter().map(u32::to_string).collect();
            writeln!(
                f,
                "    desc {name}: 0x{:016X} (lbo {} sbo {} sw{}), k16 steps at +{}",
                d.template,
                d.lbo,
                d.sbo,
                d.swizzle,
                steps.join(" +")
            )?;
        }
        writeln!(
            f,
            "    (the ring's consumer side above is the mma thread's programs below: its release \
             of once_free is a tcgen05.commit)"
        )?;
        writeln!(f, "    setup (mma warp): {}", join_steps(&self.setup))?;
        writeln!(f, "    load, per tile: {}", join_steps(&self.load_tile))?;
        writeln!(
            f,
            "    load, per iteration: {}",
            join_steps(&self.load_iteration)
        )?;
        writeln!(f, "    mma, per tile: {}", join_steps(&self.mma_tile))?;
        writeln!(
            f,
            "    mma, per iteration: {}",
            join_steps(&self.mma_iteration)
        )?;
        writeln!(f, "    mma, tile end: {}", join_steps(&self.mma_tile_end))?;
        writeln!(
            f,
            "    mma warp, after the tiles: {}",
            join_steps(&self.mma_exit)
        )?;
        for (g, (it, end)) in self
            .softmax_iteration
            .iter()
            .zip(&self.softmax_end)
            .enumerate()
        {
            writeln!(
                f,
                "    softmax {g}, per tile: {}",
                join_steps(&self.softmax_tile[g])
            )?;
            writeln!(f, "    softmax {g}, per iteration: {}", join_steps(it))?;
            writeln!(f, "    softmax {g}, after the loop: {}", join_steps(end))?;
        }
        write!(
            f,
            "    correction, per iteration: {}",
            join_steps(&self.correction_iteration)
        )
    }
}
