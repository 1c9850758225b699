//! Thread-block clusters of a persistent ring (sm_90a): two CTAs, consecutive along x, work
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
//!   ([`Step::ArrivePeer`]), and `empty` counts both CTAs' arrivals;
//! - the set-up synchronises the cluster ([`InitStep::ClusterSync`]) after the barrier inits,
//!   before any remote arrival or multicast, and the consumers synchronise it again before
//!   they exit, so no CTA leaves while its peer can still write its shared memory or arrive
//!   on its barriers (threads that exited, the producer's, count as arrived).
//!
//! Persistent: the pair walks tile pairs in lockstep (the tile scheduler deals pairs over the
//! grid of `cdiv(nx, 2)` x pairs); in a ragged last pair the second tile lies past the grid:
//! it still takes part in the loads (its own rows load as zeros) and stores nothing (every
//! store is masked at the tensor's edge). The runtime launches a whole number of clusters.

use std::fmt;

use crate::ring::{Bar, InitStep, Ring, Step, TmaBox};

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
    /// The ring load the cluster's tiles share (index into [`Ring::loads`]).
    pub shared: usize,
    /// Per box of the shared load (in [`crate::ring::TmaLoad::boxes`] order), its issuer
    /// and mask.
    pub multicast: Vec<Multicast>,
    /// Whether the consumers synchronise the cluster before they exit.
    pub exit_sync: bool,
}

impl Cluster {
    /// The mask of every CTA of the cluster.
    pub fn all(&self) -> u16 {
        ((1u32 << self.ctas) - 1) as u16
    }
}

/// Clusters `ring` around ring load `shared` (see the module doc): splits each of its boxes
/// into [`CTAS`] slabs of rows, each issued by one CTA into all; doubles `empty`'s count and
/// adds the peer release after every consumer release on `empty`; synchronises the cluster
/// after the inits and before exit. Fails, saying why, when a box's rows do not split into
/// whole 8-row swizzle atoms.
pub fn cluster_ring(ring: &mut Ring, shared: usize) -> Result<(), String> {
    let load = ring
        .loads
        .get_mut(shared)
        .ok_or_else(|| format!("the ring has no load {shared}"))?;
    let rows = load.box_dims[0];
    // A box's rows are 128-byte swizzled in atoms of 8: each slab must be whole atoms so the
    // slabs together write the box's image.
    if rows % (8 * CTAS) != 0 {
        return Err(format!(
            "the shared tile's boxes have {rows} rows, which do not split into {CTAS} slabs of \
             whole 8-row swizzle atoms"
        ));
    }
    let slab = rows / CTAS;
    let row_bytes = load.box_dims[1] * 2;
    load.box_dims[0] = slab;
    load.boxes = load
        .boxes
        .iter()
        .flat_map(|b| {
            (0..CTAS).map(move |r| TmaBox {
                origin: [b.origin[0] + r * slab, b.origin[1]],
                smem_offset: b.smem_offset + r * slab * row_bytes,
            })
        })
        .collect();
    let multicast = (0..load.boxes.len() as u32)
        .map(|b| Multicast {
            issuer: b % CTAS,
            mask: ((1u32 << CTAS) - 1) as u16,
        })
        .collect();
    ring.empty_count *= CTAS;
    ring.consumer = ring
        .consumer
        .iter()
        .flat_map(|&s| match s {
            Step::Arrive {
                bar: Bar::Empty,
                lag,
            } => vec![
                s,
                Step::ArrivePeer {
                    bar: Bar::Empty,
                    lag,
                },
            ],
            _ => vec![s],
        })
        .collect();
    for step in &mut ring.init {
        if *step == InitStep::BarSync {
            *step = InitStep::ClusterSync;
        }
    }
    ring.cluster = Some(Cluster {
        ctas: CTAS,
        shared,
        multicast,
        exit_sync: true,
    });
    Ok(())
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
