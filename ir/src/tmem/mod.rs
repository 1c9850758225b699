//! The Blackwell (sm_100a) layer under a stage ring: warp roles, the tensor-memory (TMEM)
//! accumulator, the `tcgen05.mma` descriptors and the programs of the warps that own and read
//! the accumulator (ptx-notes §7).
//!
//! The block is the kernel's epilogue warps (threads `0..32 * epilogue_warps`, which run the
//! kernel's code before and after the ring loop), then one TMA producer warp and one MMA warp.
//! The MMA warp allocates the accumulator's columns and publishes their address through shared
//! memory ([`TmemPlan::setup`]). Per work tile (one, or each tile a persistent CTA walks), its
//! elected thread waits until the epilogue has copied the previous tile's accumulator out
//! (`acc_empty`), runs the ring's MMA program (each stage released by a `tcgen05.commit` to its
//! `empty` barrier) and commits the finished accumulator to `acc_full` ([`TmemPlan::mma_tile`]);
//! after the last tile it waits for the last copy and the warp frees the columns
//! ([`TmemPlan::mma_exit`]). Per tile the epilogue warps wait on `acc_full`, copy the
//! accumulator to registers (`tcgen05.ld`, shape `32x32b`: warp `w` reads TMEM lanes
//! `32 (w % 4) ..`, the only lanes it may reach, and the columns of warpgroup `w / 4`'s block
//! (one block, or two halves where a whole row is more than a thread should hold:
//! [`epilogue`]), thread `t` one row, consecutive columns, exactly the [`accumulator_layout`]),
//! wait for the copies and hand TMEM back on `acc_empty` before the registers are used
//! ([`TmemPlan::epilogue`]), so the next tile's mmas run under this tile's stores; a thread
//! that should not hold its whole block at once copies and uses it chunk by chunk and hands
//! TMEM back once the last chunk has landed ([`epilogue::program`]). Both
//! barriers have one phase per tile: tile `k` waits with parity `start ^ (k & 1)`, and the
//! exit's wait with `start ^ (tiles & 1)`. Like the ring, the plan is plain data: the `tmem`
//! pass writes it, `protocol_check` proves it and the PTX writer emits exactly these steps.
//!
//! Attention-shaped ring loops get a schedule of their own ([`attention`]), in the style of
//! FlashAttention-4, with the same TMEM ownership rules.

pub mod attention;
pub mod epilogue;
pub mod exp2;

pub use crate::sched::tmem::{
    ACC_ROWS, Descriptor, LOAD_COLUMNS, TMEM_COLUMNS, instruction_descriptor,
};

use std::fmt;

use crate::kernel::OpId;
use crate::print::join_steps;
use crate::schedule::Layout;

/// The register layout of a `128 x n` accumulator after `tcgen05.ld.32x32b` by `warps`
/// epilogue warps (a multiple of 4): thread `t` of warp `w` holds row `32 (w % 4) + t`, the
/// `n / (warps / 4)` columns of block `w / 4` in order.
pub fn accumulator_layout(warps: u32) -> Layout {
    Layout::TmemRows {
        warpgroups: warps / 4,
    }
}

/// The warp roles of a Blackwell ring kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Roles {
    /// Epilogue warps (threads `0..32 * epilogue_warps`): one or two warpgroups, each warp
    /// 32 accumulator rows of its warpgroup's column block.
    pub epilogue_warps: u32,
    /// The warp whose elected thread issues the TMA loads (the ring's producer).
    pub producer_warp: u32,
    /// The warp that owns TMEM and whose elected thread issues the `tcgen05.mma`s.
    pub mma_warp: u32,
}

impl Roles {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * (self.mma_warp.max(self.producer_warp) + 1)
    }
}

/// The single-phase barriers between the MMA warp and the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccBar {
    /// Completes when every mma into the accumulator has (`tcgen05.commit`, count 1).
    Full,
    /// Completes when every epilogue warp has copied the accumulator out (count: the
    /// epilogue warps, one elected lane each).
    Empty,
}

/// One step of the MMA warp's or the epilogue's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TmemStep {
    /// `tcgen05.alloc` of `columns` by the whole warp; the address lands in the shared slot.
    Alloc {
        /// Columns (a power of 2 in 32..=512).
        columns: u32,
    },
    /// `tcgen05.relinquish_alloc_permit`: the CTA allocates no more.
    Relinquish,
    /// Every thread reads the address: `tcgen05.fence::before_thread_sync`, `bar.sync 0`
    /// (the ring's set-up barrier), `tcgen05.fence::after_thread_sync`, `ld.shared`.
    Publish,
    /// The ring's MMA program over the loop ([`crate::ring::Ring::consumer`]), one thread.
    Mainloop,
    /// `tcgen05.commit` to `acc_full` by the thread that issued the mmas.
    CommitAcc,
    /// A parity wait on an accumulator barrier (see the module doc for the parity).
    Wait {
        /// The barrier.
        bar: AccBar,
        /// The parity of tile 0's wait.
        start: u32,
    },
    /// One arrival per warp (its lane 0) on an accumulator barrier.
    Arrive {
        /// The barrier.
        bar: AccBar,
    },
    /// `tcgen05.fence::after_thread_sync`: tcgen05 ops after a wait are ordered after it.
    FenceAfter,
    /// `tcgen05.fence::before_thread_sync`: tcgen05 ops before an arrival are ordered
    /// before it.
    FenceBefore,
    /// `tcgen05.ld.sync.aligned.32x32b.x{columns}` of accumulator columns
    /// `column .. column + columns` into registers.
    Load {
        /// First column.
        column: u32,
        /// Columns (registers a thread).
        columns: u32,
    },
    /// `tcgen05.wait::ld`: every earlier `tcgen05.ld` of the thread has landed.
    WaitLoad,
    /// The kernel's code after the loop runs on the copied registers of block columns
    /// `column .. column + columns` (the whole block, or one chunk of it:
    /// [`epilogue::program`]).
    Read {
        /// First column.
        column: u32,
        /// Columns.
        columns: u32,
    },
    /// `tcgen05.dealloc` of `columns` by the whole warp.
    Dealloc {
        /// Columns (those allocated).
        columns: u32,
    },
    /// The 2-SM form: `barrier.cluster` by the whole warp, met by every thread of the pair
    /// that has not exited, so neither CTA frees its columns while the leader's mmas or the
    /// other's copies may still use them (PTX ISA "tcgen05 issue granularity").
    ClusterSync,
}

/// The 2-SM form's side of a plan ([`crate::cluster::Pair`]): the leader's MMA thread writes
/// both CTAs' accumulator (each CTA's TMEM holds its 128 rows at the same columns); its
/// `acc_empty` counts both CTAs' epilogue warps (the peer's arrive remotely) and its
/// `acc_full` commit arrives on both CTAs' `acc_full`. Both CTAs' MMA warps run
/// [`TmemPlan::setup`] (the `cta_group::2` allocation is collective); the peer's issues no
/// mma and after the tiles runs [`TmemPair::peer_exit`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmemPair {
    /// `%cluster_ctarank` of the leader.
    pub leader: u32,
    /// The `ctaMask` of the `acc_full` commit.
    pub commit_mask: u16,
    /// The peer's MMA warp after its tiles.
    pub peer_exit: Vec<TmemStep>,
}

/// The Blackwell plan of a kernel's ring loop (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmemPlan {
    /// The ring's `for`.
    pub for_op: OpId,
    /// The warp roles.
    pub roles: Roles,
    /// TMEM columns allocated (a power of 2, 32..=512); the accumulator starts at column 0.
    pub columns: u32,
    /// The accumulator's columns (its N; f32, one column per element).
    pub acc_columns: u32,
    /// The instruction descriptor.
    pub idesc: u32,
    /// The operands' descriptors, A then B.
    pub a: Descriptor,
    /// See [`TmemPlan::a`].
    pub b: Descriptor,
    /// Byte offsets in shared memory of the TMEM address slot (4 B) and of `acc_full` and
    /// `acc_empty` (8 B each).
    pub slot_offset: u32,
    /// See [`TmemPlan::slot_offset`].
    pub acc_full_offset: u32,
    /// See [`TmemPlan::slot_offset`].
    pub acc_empty_offset: u32,
    /// The MMA warp's steps before the roles split (its `Publish` runs in every thread).
    pub setup: Vec<TmemStep>,
    /// The MMA warp's elected thread, per work tile.
    pub mma_tile: Vec<TmemStep>,
    /// The MMA warp after its last tile: the wait by the elected thread, the rest by the warp.
    pub mma_exit: Vec<TmemStep>,
    /// Each epilogue warp, per work tile.
    pub epilogue: Vec<TmemStep>,
    /// The 2-SM form (a paired ring on sm_100a).
    pub pair: Option<TmemPair>,
}

impl TmemPlan {
    /// The epilogue's warpgroups: each copies one block of the accumulator's columns.
    pub fn epilogue_warpgroups(&self) -> u32 {
        self.roles.epilogue_warps / 4
    }

    /// Columns of each epilogue warpgroup's block: warpgroup `g`'s [`TmemStep::Load`]s read
    /// their columns plus `g` times this.
    pub fn block_columns(&self) -> u32 {
        self.acc_columns / self.epilogue_warpgroups().max(1)
    }

    /// Arrivals that complete `bar`'s phase.
    pub fn count(&self, bar: AccBar) -> u32 {
        match bar {
            AccBar::Full => 1,
            // The 2-SM leader's counts both CTAs' epilogue warps.
            AccBar::Empty => {
                self.roles.epilogue_warps * self.pair.as_ref().map_or(1, |_| crate::cluster::CTAS)
            }
        }
    }

    /// Shared byte offset of `bar`.
    pub fn offset(&self, bar: AccBar) -> u32 {
        match bar {
            AccBar::Full => self.acc_full_offset,
            AccBar::Empty => self.acc_empty_offset,
        }
    }
}

impl fmt::Display for AccBar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccBar::Full => "acc_full",
            AccBar::Empty => "acc_empty",
        })
    }
}

impl fmt::Display for TmemStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TmemStep::Alloc { columns } => write!(f, "alloc {columns} cols"),
            TmemStep::Relinquish => f.write_str("relinquish_alloc_permit"),
            TmemStep::Publish => f.write_str("publish address"),
            TmemStep::Mainloop => f.write_str("mainloop"),
            TmemStep::CommitAcc => f.write_str("tcgen05.commit acc_full"),
            TmemStep::Wait { bar, start } => write!(f, "wait {bar}(phase from {start})"),
            TmemStep::Arrive { bar } => write!(f, "arrive {bar}"),
            TmemStep::FenceAfter => f.write_str("fence::after_thread_sync"),
            TmemStep::FenceBefore => f.write_str("fence::before_thread_sync"),
            TmemStep::Load { column, columns } => {
                write!(f, "ld.32x32b.x{columns} col {column}")
            }
            TmemStep::WaitLoad => f.write_str("wait::ld"),
            TmemStep::Read { column, columns } => {
                write!(f, "read cols {column}..{}", column + columns)
            }
            TmemStep::Dealloc { columns } => write!(f, "dealloc {columns} cols"),
            TmemStep::ClusterSync => f.write_str("barrier.cluster"),
        }
    }
}

impl fmt::Display for TmemPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.roles;
        writeln!(
            f,
            "  roles: epilogue warps 0-{} (tcgen05.ld, the kernel's code), producer warp {} \
             (TMA), mma warp {} (TMEM owner, one thread issues tcgen05.mma)",
            r.epilogue_warps - 1,
            r.producer_warp,
            r.mma_warp
        )?;
        writeln!(
            f,
            "  tmem {}: {} of {TMEM_COLUMNS} columns; accumulator {ACC_ROWS}x{} f32 at column 0; \
             address slot @{}, acc_full@{} x{}, acc_empty@{} x{}",
            self.for_op,
            self.columns,
            self.acc_columns,
            self.slot_offset,
            self.acc_full_offset,
            self.count(AccBar::Full),
            self.acc_empty_offset,
            self.count(AccBar::Empty)
        )?;
        writeln!(f, "    idesc 0x{:08X}", self.idesc)?;
        for (name, d) in [("a", &self.a), ("b", &self.b)] {
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
        writeln!(f, "    setup (mma warp): {}", join_steps(&self.setup))?;
        writeln!(
            f,
            "    mma thread, per tile: {}",
            join_steps(&self.mma_tile)
        )?;
        writeln!(
            f,
            "    mma warp, after the tiles: {}",
            join_steps(&self.mma_exit)
        )?;
        if let Some(p) = &self.pair {
            writeln!(
                f,
                "    2-SM: leader CTA {} issues the mmas (cta_group::2) and commits acc_full to \
                 {:#b}; peer mma warp, after the tiles: {}",
                p.leader,
                p.commit_mask,
                join_steps(&p.peer_exit)
            )?;
        }
        let blocks = match self.epilogue_warpgroups() {
            1 => String::new(),
            _ => format!(" (warpgroup g: columns + g x {})", self.block_columns()),
        };
        write!(
            f,
            "    epilogue, per tile{blocks}: {}",
            join_steps(&self.epilogue)
        )
    }
}
