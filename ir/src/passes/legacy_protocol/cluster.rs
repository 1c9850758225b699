//! The cluster-scope rules of a clustered ring ([`crate::cluster`]): the static ones here,
//! the dynamic ones (a multicast refilling a peer's stage its consumers have not released, a
//! remote arrival or multicast reaching a CTA that has exited) on the abstract machine, which
//! runs both CTAs ([`super::machine`]).

use crate::cluster::{Cluster, Pair};
use crate::ring::{Bar, InitStep, Ring, Step};

/// A broken cluster-scope protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The set-up does not synchronise the cluster after the inits and their fence.
    #[error(
        "a clustered ring's set-up must be mbarrier.init, fence.mbarrier_init, barrier.cluster \
         in that order (before any remote arrival or multicast); got {0:?}"
    )]
    Init(Vec<InitStep>),
    /// `empty` does not count both CTAs' consumer releases.
    #[error(
        "`empty` counts {count} arrivals per phase; the consumers of the cluster's {ctas} CTAs \
         make {expected}"
    )]
    EmptyCount {
        /// The init count.
        count: u32,
        /// CTAs in the cluster.
        ctas: u32,
        /// `ctas` times the consumer warps of one CTA.
        expected: u32,
    },
    /// A box of the shared load does not land in every CTA (or the plan does not cover the
    /// load's boxes).
    #[error(
        "box {index} of the shared load is issued by CTA {issuer} with mask {mask:#b}; every \
         box must be issued by one CTA of the {ctas} and land in all ({all:#b}), so that each \
         `full` gets the bytes it announces"
    )]
    Multicast {
        /// The box.
        index: usize,
        /// Its issuer (`u32::MAX`: no plan for the box).
        issuer: u32,
        /// Its mask.
        mask: u16,
        /// CTAs in the cluster.
        ctas: u32,
        /// The mask of every CTA.
        all: u16,
    },
    /// A ring the clustered PTX does not write (rotated, split, once loads, not persistent).
    #[error("a clustered ring must be a persistent GEMM mainloop: {0}")]
    Shape(String),
    /// A peer release in a ring without a cluster.
    #[error("`{0}` in a ring without a cluster")]
    PeerWithoutCluster(Step),
    /// A multicast lands in a CTA's stage before that CTA's consumers released it.
    #[error(
        "CTA {from}'s multicast refills CTA {cta}'s stage of iteration {previous} in iteration \
         {iteration} before CTA {cta}'s consumers released it"
    )]
    Overwrite {
        /// The CTA whose stage is overwritten.
        cta: u32,
        /// The issuing CTA.
        from: u32,
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage before.
        previous: u32,
    },
    /// A 2-SM CTA's TMA refills its stage before the pair's mma that read it was committed
    /// to it.
    #[error(
        "CTA {cta}'s TMA refills its stage of iteration {previous} in iteration {iteration} \
         before the pair's mma reading it completed (no commit released it there)"
    )]
    Refill {
        /// The refilling CTA.
        cta: u32,
        /// The refilling iteration.
        iteration: u32,
        /// The iteration that used the stage before.
        previous: u32,
    },
    /// A remote arrival or multicast reaches a CTA that has already exited.
    #[error(
        "CTA {from}'s `{step}` reaches CTA {cta} after it exited (no cluster barrier before exit)"
    )]
    AfterExit {
        /// The exited CTA.
        cta: u32,
        /// The CTA whose step reaches it.
        from: u32,
        /// The step.
        step: Step,
    },
}

/// The static cluster rules: set-up, `empty`'s count, the multicast plan and the ring's
/// shape; a ring without a cluster may not release on a peer.
pub(super) fn check_cluster(ring: &Ring, consumer_warps: u32) -> Result<(), ClusterError> {
    let Some(c) = &ring.cluster else {
        let peer = ring
            .consumer
            .iter()
            .chain(&ring.consumer_drain)
            .chain(&ring.producer)
            .find(|s| matches!(s, Step::ArrivePeer { .. }));
        return match peer {
            Some(&s) => Err(ClusterError::PeerWithoutCluster(s)),
            None => Ok(()),
        };
    };
    let pos = |s: InitStep| ring.init.iter().position(|&x| x == s);
    match (
        pos(InitStep::InitBarriers),
        pos(InitStep::FenceMbarrierInit),
        pos(InitStep::ClusterSync),
    ) {
        (Some(a), Some(b), Some(c)) if a < b && b < c => {}
        _ => return Err(ClusterError::Init(ring.init.clone())),
    }
    let shape = if !ring.persistent {
        Some("it is not persistent")
    } else if ring.overlap.is_some() {
        Some("it is rotated")
    } else if !ring.once.is_empty() || !ring.tail_loads.is_empty() {
        Some("it has once or split loads")
    } else if c.shared >= ring.loads.len() {
        Some("its shared load does not exist")
    } else {
        None
    };
    if let Some(why) = shape {
        return Err(ClusterError::Shape(why.to_string()));
    }
    // The 2-SM form's `empty` hears the leader's multicast commit alone.
    let expected = match c.pair {
        Some(_) => consumer_warps,
        None => c.ctas * consumer_warps,
    };
    if ring.empty_count != expected {
        return Err(ClusterError::EmptyCount {
            count: ring.empty_count,
            ctas: c.ctas,
            expected,
        });
    }
    if let Some(p) = c.pair {
        return check_pair(ring, c, p);
    }
    let boxes = ring.loads[c.shared].boxes.len();
    for index in 0..boxes.max(c.multicast.len()) {
        let (issuer, mask) = c
            .multicast
            .get(index)
            .filter(|_| index < boxes)
            .map_or((u32::MAX, 0), |m| (m.issuer, m.mask));
        if issuer >= c.ctas || mask != c.all() {
            return Err(ClusterError::Multicast {
                index,
                issuer,
                mask,
                ctas: c.ctas,
                all: c.all(),
            });
        }
    }
    // The peer releases name the ring's own `empty` (the machine checks when they come).
    if let Some(&s) = ring
        .consumer
        .iter()
        .find(|s| matches!(s, Step::ArrivePeer { bar, .. } if *bar != Bar::Empty))
    {
        return Err(ClusterError::Shape(format!("`{s}` releases another array")));
    }
    Ok(())
}

/// The 2-SM form: a leader in the cluster, no multicast boxes and no peer releases (the
/// leader's commits reach both CTAs; the TMEM rules check their masks).
fn check_pair(ring: &Ring, c: &Cluster, p: Pair) -> Result<(), ClusterError> {
    if p.leader >= c.ctas {
        return Err(ClusterError::Shape(format!(
            "its leader is CTA {} of {}",
            p.leader, c.ctas
        )));
    }
    if !c.multicast.is_empty() {
        return Err(ClusterError::Shape(
            "a 2-SM pair multicasts no boxes (each CTA loads its own half)".into(),
        ));
    }
    match ring
        .consumer
        .iter()
        .chain(&ring.consumer_drain)
        .find(|s| matches!(s, Step::ArrivePeer { .. }))
    {
        Some(s) => Err(ClusterError::Shape(format!(
            "`{s}` in a 2-SM pair, whose commits multicast"
        ))),
        None => Ok(()),
    }
}
