//! Thread-block clusters of a persistent schedule (sm_90a): two CTAs, consecutive along x, work
//! on two work tiles that read the same tile of one operand (a GEMM's pair `(2p, y)` and
//! `(2p + 1, y)` reads one panel of `B`), so each stage of that *shared* load is fetched
//! once for both: its boxes are split in halves by rows, and CTA `r` issues half `r` of every
//! box with `cp.async.bulk.tensor .multicast::cluster` into the same offset of both CTAs'
//! stage, completing on both CTAs' `full` barrier. Its other loads stay its own.
//!
//! The pair is along x (M for a GEMM): `B`'s tile (`BK x BN`) is at least as large as `A`'s
//! (`BM x BK`) for every tile the GEMM's autotuner tries (`BN >= BM`), so sharing it saves the
//! most L2 traffic; and x is the axis a cluster's CTAs are consecutive along
//! (`%cluster_ctarank` is `%ctaid.x % 2`).
//!
//! The protocol ([`crate::passes::protocol_check`] proves it on two CTAs):
//! - `full` still expects the whole stage's bytes in each CTA (half of the shared load's come
//!   from the peer's TMA);
//! - a stage is refilled only when both CTAs' consumers released it, because either CTA's TMA
//!   writes both: every consumer release arrives on its own CTA's `empty` and on the peer's
//!   (`Op::ArrivePeer`), and `empty` counts both CTAs' arrivals;
//! - the set-up synchronises the cluster (`Op::ClusterSync`) after the barrier inits,
//!   before any remote arrival or multicast, and the consumers synchronise it again before
//!   they exit, so no CTA leaves while its peer can still write its shared memory or arrive
//!   on its barriers (threads that exited, the producer's, count as arrived).
//!
//! On sm_100a the pair is the 2-SM form instead ([`Pair`]): one
//! `tcgen05.mma.cta_group::2` of M = 256 computes both tiles, issued by the leader CTA (rank
//! 0) alone. Each CTA loads its own A tile and *half* of the shared tile along N (the mma reads
//! B's halves from both CTAs' shared memory at the same offset, and A's 128 rows of each CTA
//! from that CTA's), every TMA of the pair completes on the leader's `full` (`.cta_group::2`
//! lets it signal the peer CTA's barrier), which announces the whole pair's bytes, and each
//! `tcgen05.commit` multicasts its arrival to both CTAs' barrier (`empty` then counts that one
//! arrival). PTX ISA "tcgen05 issue granularity"; CUTLASS `SM100_TMA_2SM_LOAD`,
//! `umma_arrive_multicast_2x1SM`.
//!
//! Persistent: the pair walks tile pairs in lockstep (the tile scheduler deals pairs over the
//! grid of `cdiv(nx, 2)` x pairs); in a ragged last pair the second tile lies past the grid:
//! it still takes part in the loads (its own rows load as zeros) and stores nothing (every
//! store is masked at the tensor's edge). The runtime launches a whole number of clusters.

//!
//! The `persistent` pass plans both forms.

use std::fmt;

/// CTAs per cluster the passes schedule.
pub const CTAS: u32 = 2;

/// One box of the shared load: which CTA issues it and which CTAs it lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Multicast {
    /// `%cluster_ctarank` of the issuing CTA.
    pub issuer: u32,
    /// The `ctaMask` operand: bit `r` set when the box lands in CTA `r`'s stage.
    pub mask: u16,
}

/// A clustered ring's plan (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cluster {
    /// CTAs per cluster, along x.
    pub ctas: u32,
    /// The ring load the cluster's tiles share (index into the ring's loads).
    pub shared: usize,
    /// Per box of the shared load (in `TmaLoad::boxes` order), its issuer
    /// and mask.
    pub multicast: Vec<Multicast>,
    /// Whether the consumers synchronise the cluster before they exit.
    pub exit_sync: bool,
    /// sm_100a: the 2-SM form (no multicast boxes; see the module doc).
    pub pair: Option<Pair>,
}

/// The 2-SM form of a cluster (sm_100a, see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pair {
    /// `%cluster_ctarank` of the CTA whose MMA thread issues the pair's mmas and on whose
    /// `full` barriers every TMA of the pair completes.
    pub leader: u32,
    /// Element offset `[row, col]` of CTA `r`'s half of the shared tile: `r` times this is
    /// added to the coordinates of each of its boxes.
    pub half: [u32; 2],
    /// The `ctaMask` of every `tcgen05.commit`: the CTAs whose barrier it arrives on.
    pub commit_mask: u16,
}

impl Cluster {
    /// The mask of every CTA of the cluster.
    pub fn all(&self) -> u16 {
        ((1u32 << self.ctas) - 1) as u16
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.pair {
            return write!(
                f,
                "    cluster: {} CTAs along x walk tile pairs in lockstep as one 2-SM mma \
                 (cta_group::2, leader CTA {}); load{} split along N, CTA r's half at r x {:?}; \
                 every TMA completes on the leader's full; commits multicast {:#b}; {}",
                self.ctas,
                p.leader,
                self.shared,
                p.half,
                p.commit_mask,
                if self.exit_sync {
                    "cluster barrier before exit"
                } else {
                    "no cluster barrier before exit"
                }
            );
        }
        let issuers: Vec<String> = self
            .multicast
            .iter()
            .map(|m| format!("{}->{:#b}", m.issuer, m.mask))
            .collect();
        write!(
            f,
            "    cluster: {} CTAs along x walk tile pairs in lockstep (the tile order's x counts \
             pairs); load{} shared, its boxes multicast (issuer->mask) {}; empty counts both \
             CTAs' releases; {}",
            self.ctas,
            self.shared,
            issuers.join(" "),
            if self.exit_sync {
                "cluster barrier before exit"
            } else {
                "no cluster barrier before exit"
            }
        )
    }
}
