//! The order in which a role runs its program's ops over a run of work tiles with given trip
//! counts: the one reading of the execution model ([`super`]) that the protocol check and
//! the CPU execution share (the writers emit the same order as loops).
//!
//! The order, and where an op is dropped for having nothing to do: [`expand`].

use super::op::Op;
use super::role::{Program, Role};

/// The section of a program an op comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// Once per CTA, before its first tile.
    Start,
    /// Per tile, before the loop.
    Tile,
    /// Per iteration (per round of a rotated program).
    Iteration,
    /// Per tile, after the loop.
    Drain,
    /// Per tile, the release of its once loads.
    Release,
    /// Per tile, the code after the loop.
    End,
    /// Once per CTA, after its last tile.
    Exit,
}

/// Where an op of an expanded program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct At {
    /// The section.
    pub section: Section,
    /// The work tile (the number of tiles, in the exit section).
    pub tile: u32,
    /// The loop iteration, counted across the CTA's tiles: the round's in the iteration
    /// section, the tile's first before its loop, one past its last after it.
    pub i: u32,
    /// The iteration within the tile (`i` less the tile's first), the trip count after the
    /// loop.
    pub t: u32,
    /// The tile's trip count.
    pub trips: u32,
}

/// One op of a role's expanded program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// The op.
    pub op: Op,
    /// Where it runs.
    pub at: At,
}

/// The ops replica `replica` of `role` runs, in order, over work tiles with trip counts
/// `tiles`.
///
/// Per CTA: the start section; per work tile `k` with `trips` iterations, the program's first
/// `lead` iterations, the tile section, the remaining iterations (a rotated program: its
/// rounds `0 ..= trips`, the release section before the last), the drain, the release (an
/// unrotated program) and the end; then the exit section. An op is dropped where it has
/// nothing to do:
/// - a `Sync`/`Signal` whose [`Who`](super::Who) excludes the replica;
/// - a wait with a lag when the lagged iteration is not in the tile (its first iterations,
///   or after a loop that ran fewer);
/// - an arrival or commit with a lag when the lagged iteration was never run (in a rotated
///   program: not in the tile);
/// - the correction's rescale (`RescaleBegin ..= RescaleEnd`) in a tile's first iteration,
///   which has no product to rescale yet.
pub fn expand(role: &Role, replica: u32, tiles: &[u32]) -> Vec<Step> {
    let p = &role.program;
    let mut out = Expansion {
        program: p,
        role,
        replica,
        steps: Vec::new(),
    };
    let first = tiles.first().copied().unwrap_or(0);
    out.section(&p.start, at(Section::Start, 0, 0, 0, first));
    let mut base = 0;
    for (k, &trips) in tiles.iter().enumerate() {
        let k = k as u32;
        let place = |section, t| at(section, k, base + t, t, trips);
        let lead = p.lead.min(trips);
        for t in 0..lead {
            out.iteration(place(Section::Iteration, t));
        }
        out.section(&p.tile, place(Section::Tile, 0));
        if p.rotated {
            let rounds = if trips == 0 { 0 } else { trips + 1 };
            for t in 0..rounds {
                if t == trips {
                    out.section(&p.release, place(Section::Release, trips));
                }
                out.iteration(place(Section::Iteration, t));
            }
            if trips == 0 {
                out.section(&p.release, place(Section::Release, 0));
            }
            out.section(&p.drain, place(Section::Drain, trips));
        } else {
            for t in lead..trips {
                out.iteration(place(Section::Iteration, t));
            }
            out.section(&p.drain, place(Section::Drain, trips));
            out.section(&p.release, place(Section::Release, trips));
        }
        out.section(&p.end, place(Section::End, trips));
        base += trips;
    }
    let tiles = tiles.len() as u32;
    out.section(&p.exit, at(Section::Exit, tiles, base, 0, 0));
    out.steps
}

fn at(section: Section, tile: u32, i: u32, t: u32, trips: u32) -> At {
    At {
        section,
        tile,
        i,
        t,
        trips,
    }
}

struct Expansion<'p> {
    program: &'p Program,
    role: &'p Role,
    replica: u32,
    steps: Vec<Step>,
}

impl Expansion<'_> {
    /// The ops of a section at `at` that have something to do there.
    fn section(&mut self, ops: &[Op], at: At) {
        for &op in ops {
            if self.runs(op, at) {
                self.steps.push(Step { op, at });
            }
        }
    }

    /// One iteration (round) of the iteration section.
    fn iteration(&mut self, at: At) {
        let mut rescaling = true;
        for &op in &self.program.iteration {
            if let Op::RescaleBegin { .. } = op {
                rescaling = at.t > 0;
            }
            let rotated_out = self.program.rotated && !op.runs_rotated(at.t, at.trips);
            if rescaling && !rotated_out && self.runs(op, at) {
                self.steps.push(Step { op, at });
            }
            if op == Op::RescaleEnd {
                rescaling = true;
            }
        }
    }

    /// Whether `op` has something to do at `at` (see [`expand`]).
    fn runs(&self, op: Op, at: At) -> bool {
        match op {
            Op::Sync { who, .. } | Op::Signal { who, .. } => {
                who.includes(self.replica, self.role.replicas)
            }
            Op::Wait { lag, .. } => at.t >= lag,
            Op::Arrive { lag, .. } | Op::ArrivePeer { lag, .. } | Op::Tcgen05Commit { lag, .. } => {
                let done = if self.program.rotated { at.t } else { at.i };
                done >= lag
            }
            _ => true,
        }
    }
}
