//! Warp roles and their programs.
//!
//! A [`Role`] is a set of the CTA's warps with a register budget and one [`Program`]. A
//! program is sections of [`Op`]s, each run at one place of the CTA's life: once before its
//! first work tile, per work tile before the loop, per loop iteration, per tile after the
//! loop, once after its last tile. Where the sections run is the same for every role, so one
//! expansion serves the protocol check, the CPU execution and the writers.

use std::fmt;

use super::op::Op;

/// What a role does, for dumps and for the writers' choice of how to enter it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoleKind {
    /// Issues the TMA loads of the ring (one elected thread).
    Producer,
    /// sm_90a: the kernel's warps, issuing the wgmmas and running the kernel's code.
    Consumer,
    /// sm_100a: issues the `tcgen05.mma`s from one thread; its warp owns tensor memory.
    Mma,
    /// sm_100a: the kernel's warps, copying the accumulator out of TMEM and running the
    /// kernel's code after the loop.
    Epilogue,
    /// sm_100a attention: the softmax warpgroup of Q tile `g`.
    Softmax(u32),
    /// sm_100a attention: rescales `O` in tensor memory.
    Correction,
}

/// Who of a role's warps runs its program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Issue {
    /// One elected thread (the role's first); it arrives once per [`Op::Arrive`].
    Thread,
    /// Every thread; lane 0 of each warp arrives once per [`Op::Arrive`].
    Warps,
}

/// A set of warps and what they run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Role {
    /// What it does.
    pub kind: RoleKind,
    /// Its first warp.
    pub first_warp: u32,
    /// Its warps (whole warpgroups where it sets its registers).
    pub warps: u32,
    /// The `setmaxnreg` target of its warps, or `None` to keep the launch's count.
    pub regs: Option<u32>,
    /// Who runs the program.
    pub issue: Issue,
    /// Copies of the role running the same program on their own warpgroup (the sm_90a
    /// consumer warpgroups): each names its own element of an indexed named barrier.
    pub replicas: u32,
    /// The cluster rank whose CTA runs the role (the 2-SM form's leader or peer MMA warp),
    /// or `None` for every CTA.
    pub rank: Option<u32>,
    /// Its program.
    pub program: Program,
}

impl Role {
    /// A role of `warps` warps from `first_warp`, one replica in every CTA, with an empty
    /// program.
    pub fn new(kind: RoleKind, first_warp: u32, warps: u32, issue: Issue) -> Role {
        Role {
            kind,
            first_warp,
            warps,
            regs: None,
            issue,
            replicas: 1,
            rank: None,
            program: Program::default(),
        }
    }

    /// Arrivals one [`Op::Arrive`] of the role makes.
    pub fn arrivals(&self) -> u32 {
        match self.issue {
            Issue::Thread => 1,
            Issue::Warps => self.warps,
        }
    }

    /// The warps after the role's last.
    pub fn end_warp(&self) -> u32 {
        self.first_warp + self.warps
    }
}

/// A role's program: the sections of the CTA's life it runs (see the module doc).
///
/// Iteration `i` counts the loop's iterations across the CTA's work tiles; `lag` ops name
/// the stage of an earlier iteration. A rotated program (the sm_90a overlap) runs its
/// iteration section over `t = 0 ..= trips` of each tile: ops serving iteration `t` (lag 0)
/// skip the last round, those serving `t - 1` skip the first, and the rest run in every
/// round ([`Op::runs_rotated`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Program {
    /// Once per CTA, before its first work tile.
    pub start: Vec<Op>,
    /// Per work tile, before the loop (after the first `lead` iterations).
    pub tile: Vec<Op>,
    /// Iterations of each tile run before [`Program::tile`]: a persistent producer issues
    /// the tile's first stage before it waits to reload the tile's once loads.
    pub lead: u32,
    /// Per loop iteration.
    pub iteration: Vec<Op>,
    /// Whether the iteration section is rotated.
    pub rotated: bool,
    /// Per tile, after the loop: what is still in flight.
    pub drain: Vec<Op>,
    /// Per tile, the release of the tile's once loads: after the drain, or in a rotated
    /// program before its last round (the last block's tail, which reads no once load).
    pub release: Vec<Op>,
    /// Per tile, after the release: the code after the loop.
    pub end: Vec<Op>,
    /// Once per CTA, after its last work tile.
    pub exit: Vec<Op>,
}

impl Program {
    /// Every section with its name, in the order of the CTA's life.
    pub fn sections(&self) -> [(&'static str, &[Op]); 7] {
        [
            ("start", &self.start),
            ("tile", &self.tile),
            ("iteration", &self.iteration),
            ("drain", &self.drain),
            ("release", &self.release),
            ("end", &self.end),
            ("exit", &self.exit),
        ]
    }

    /// Every op of every section.
    pub fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        self.ops_except(&[])
    }

    /// Every op of the sections not named in `skip` (names as [`Program::sections`] gives
    /// them).
    pub fn ops_except<'a>(&'a self, skip: &'a [&str]) -> impl Iterator<Item = Op> + 'a {
        self.sections()
            .into_iter()
            .filter(move |(name, _)| !skip.contains(name))
            .flat_map(|(_, ops)| ops.iter().copied())
    }
}

impl fmt::Display for RoleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoleKind::Producer => f.write_str("producer"),
            RoleKind::Consumer => f.write_str("consumer"),
            RoleKind::Mma => f.write_str("mma"),
            RoleKind::Epilogue => f.write_str("epilogue"),
            RoleKind::Softmax(g) => write!(f, "softmax {g}"),
            RoleKind::Correction => f.write_str("correction"),
        }
    }
}
