//! The code of the kernel an op runs: the part of a ring loop's body an mma computes, and the
//! regions of the kernel's own code (the softmax between a rotated loop's mmas, the handoff to
//! the next tail, the code after the loop). The loop's structure ([`super::overlap`]) defines
//! them; ops name them.

use std::fmt;

/// Which part of a ring loop's body an mma op runs (see [`super::overlap::Overlap`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaPart {
    /// The whole body of an unrotated loop.
    Body,
    /// The head mma (`S = Q K^T`), for iteration `i`.
    Head,
    /// The tail section (the carried accumulator's rescale and `O += P V`): for iteration
    /// `i - 1` in a rotated sm_90a program, for iteration `i` on sm_100a.
    Tail,
}

/// A region of the kernel's code that an op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// The code between the head and tail mmas of a rotated loop (the online softmax),
    /// on the head's products of iteration `i`.
    Between,
    /// The values of iteration `i` the tail reads (`P`, packed to its element type, and the
    /// rescale factors) move into the registers the next tail reads.
    Handoff,
    /// The kernel's code after the loop, on the accumulator's columns `column ..
    /// column + columns` of the role's block (`None`: on the whole accumulator).
    Epilogue(Option<(u32, u32)>),
}

impl fmt::Display for MmaPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MmaPart::Body => "body",
            MmaPart::Head => "head",
            MmaPart::Tail => "tail",
        })
    }
}
