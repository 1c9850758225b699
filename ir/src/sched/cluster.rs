//! Thread-block clusters of a persistent schedule (sm_90a): two CTAs, consecutive along x, work
//! on two work tiles that read the same tile of one operand (a GEMM's pair `(2p, y)` and
//! `(2p + 1, y)` reads one panel of `B`), so each stage of that *shared* load is fetched
//! once for both: its boxes are split in halves by rows, and CTA `r` issues half `r` of every
//! box with `cp.async.bulk.tensor .multicast::cluster` into the same offset of both CTAs'
//! stage, completing on both CTAs' `full` barrier. Its other loads stay its own. On sm_100a
//! the pair is the 2-SM form instead ([`Pair`]). Why along x, the protocol
//! ([`crate::passes::protocol_check`] proves it) and ragged pairs: `docs/pipeline.md`.

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

/// A clustered ring's plan (see `docs/pipeline.md`).
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
    /// sm_100a: the 2-SM form (no multicast boxes; see `docs/pipeline.md`).
    pub pair: Option<Pair>,
}

/// The 2-SM form of a cluster (sm_100a, see `docs/pipeline.md`).
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
