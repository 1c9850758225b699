//! The structure of a ring loop shaped `head mma -> code -> tail mma into a carried
//! accumulator` (attention's `S = Q K^T`, online softmax, `O += P V`), as the `overlap` pass
//! finds it: the semantic regions the schedule's ops run ([`super::region::MmaPart`],
//! [`super::region::Region`]) and the exact deferral of the accumulator's rescale.

use std::fmt;

use crate::entities::{OpId, ValueId};

/// The `overlap` pass's schedule of a ring body shaped `head mma -> code -> tail mma into a
/// carried accumulator` (attention's `S = Q K^T`, softmax, `O += P V`): the loop is rotated
/// so the head mma of the next block runs on the tensor cores under the code between, and
/// the tail mma of the block before it runs under the next code between.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Overlap {
    /// The head mma (its products are read by the code between).
    pub head: OpId,
    /// The tail mma, accumulating into the carried value [`Overlap::carried`].
    pub tail: OpId,
    /// Index of the tail's accumulator among the loop's carried values.
    pub carried: usize,
    /// The code between, in block order: the head's forward slice without the tail section.
    pub between: Vec<OpId>,
    /// The tail section, in block order: the ops reading the carried accumulator (its
    /// rescale) and the tail mma.
    pub tail_ops: Vec<OpId>,
    /// The tail's rescale of the carried accumulator, `acc * factor` (an op of
    /// [`Overlap::tail_ops`], and its factor from the code between): a warp whose factors are
    /// all 1 (its rows' maximum did not grow) skips it, which is exact.
    pub rescale: Option<(OpId, ValueId)>,
    /// The online-softmax maximum whose growth the rescale may defer, when the body and the
    /// final normalisation have its shape (see [`Deferral`]).
    pub defer: Option<Deferral>,
    /// The consumer warpgroups issue their wgmmas in turns, ordered by named barriers.
    pub turns: Option<Turns>,
    /// Whether the pass gave the ring one stage more than the loop asked for.
    pub deepened: bool,
}

/// The rescale's deferral (FlashAttention-4's): the body keeps a running row maximum
/// `m_new = max(m, row_max(s))`, exponentiates `p = exp2(s - m_use)` and
/// `alpha = exp2(m - m_use)` against it (`m_use` is `m_new`, or 0 where it is `-inf`), and
/// updates `l = l * alpha + row_sum(p)` and `acc = acc * alpha + p v`, and after the loop only
/// `acc / l` is read. Then any reference `m_ref <= m_new` in place of `m_new` in `m_use` scales
/// `p`, `alpha`, `l` and `acc` alike and leaves `acc / l` as it was: a warp keeps its previous
/// reference while every one of its rows' maximum grew by at most [`Deferral::THRESHOLD`]
/// (so `p <= 2^THRESHOLD`), its factors are then exactly 1 and the rescale is skipped. The
/// carried maximum becomes that reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deferral {
    /// The op computing `m_new`.
    pub max: OpId,
    /// The carried maximum `m` (a block argument of the loop body).
    pub carried: ValueId,
    /// The op computing `m_use` from `m_new` (the `select`), or `max` itself.
    pub m_use: OpId,
    /// The op computing `m - m_use` (the exponent of `alpha`).
    pub alpha_exponent: OpId,
}

impl Deferral {
    /// How far (in the base-2 exponent) a row's maximum may grow before the reference moves.
    pub const THRESHOLD: f32 = 8.0;
}

/// Named barrier ids of a CTA: 0 (the block-wide `bar.sync 0`) to 15.
pub const NAMED_BARRIERS: u32 = 16;

/// Ping-pong between the consumer warpgroups, in the fixed round-robin order `0, 1, .., 0`:
/// warpgroup `g` waits on named barrier `first_barrier + g` before issuing its wgmmas and
/// arrives on the next warpgroup's (`g + 1` modulo `warpgroups`) after, so one warpgroup's code
/// between runs under the others' wgmmas. The last warpgroup hands the leader its first turn
/// once per CTA (in the consumer's start section), and the turns go round across a persistent CTA's
/// tiles, so the leader starts a tile while the others finish the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Turns {
    /// The named barrier id of warpgroup 0's turn.
    pub first_barrier: u32,
    /// Consumer warpgroups taking turns (two or three).
    pub warpgroups: u32,
}

impl Turns {
    /// Warpgroups meeting at each turn barrier, whatever their number: the one whose turn it
    /// is (`bar.sync`) and the one before it, handing the turn on (`bar.arrive`). A count of
    /// every consumer warpgroup would let a third warpgroup's arrival stand in for the
    /// hand-over, and two of them could issue at once.
    pub const MEETING: u32 = 2;
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = |v: &[OpId]| v.iter().map(OpId::to_string).collect::<Vec<_>>().join(" ");
        write!(
            f,
            "    overlap: rotated, head {} under between[i-1] and tail {} (carried {}) under \
             between[i]; between: {}; tail: {}; ",
            self.head,
            self.tail,
            self.carried,
            ops(&self.between),
            ops(&self.tail_ops)
        )?;
        if self.deepened {
            f.write_str("one stage added for the tail's; ")?;
        }
        if let Some((op, factor)) = self.rescale {
            write!(
                f,
                "rescale {op} skipped while every factor {factor} of a warp is 1; "
            )?;
        }
        if let Some(d) = self.defer {
            write!(
                f,
                "max {} deferred while every row of a warp grew by at most {}; ",
                d.max,
                Deferral::THRESHOLD
            )?;
        }
        match self.turns {
            Some(t) => write!(
                f,
                "ping-pong: {} warpgroups, turn barriers {}..{}",
                t.warpgroups,
                t.first_barrier,
                t.first_barrier + t.warpgroups
            ),
            None => f.write_str("no ping-pong"),
        }
    }
}
