//! The static cluster rules ([`crate::sched::cluster`]): the set-up synchronises the cluster
//! after the inits; the schedule is a persistent GEMM mainloop; `empty` counts every CTA's
//! releases (the 2-SM pair's: the leader's one multicast commit); each box of the shared load
//! is issued by one CTA into all; peer releases exist only in a multicast cluster, on the
//! shared load's free barrier. The dynamic ones (a multicast refilling a peer's stage its
//! readers have not released, a remote op reaching an exited CTA) are the machine's.

use super::rules::{in_order, readers, wgmma_role};
use super::{ClusterError, ProtocolError};
use crate::sched::{LoadId, Op, Phase, Sched};

/// The rules of the module doc.
pub(super) fn check(s: &Sched) -> Result<(), ProtocolError> {
    let peer = s
        .roles
        .iter()
        .flat_map(|r| r.program.ops())
        .find(|op| matches!(op, Op::ArrivePeer { .. }));
    let Some(c) = &s.cluster else {
        return match peer {
            Some(op) => Err(ClusterError::PeerWithoutCluster(s.name(op)).into()),
            None => Ok(()),
        };
    };
    if !in_order(
        &s.setup,
        &[Op::InitBarriers, Op::FenceBarrierInit, Op::ClusterSync],
    ) {
        return Err(ClusterError::Init(format!("[{}]", s.names(&s.setup))).into());
    }
    let once = s.loads.iter().any(|(h, _)| s.once(h));
    let data: std::collections::BTreeSet<_> = s.ring_loads().map(|(_, l)| l.barrier).collect();
    let shape = |why: String| Err(ClusterError::Shape(why).into());
    let why_not = if !s.persistent() {
        Some("it is not persistent")
    } else if s.overlap.is_some() {
        Some("it is rotated")
    } else if once || data.len() > 1 {
        Some("it has once or split loads")
    } else if c.shared >= s.ring_loads().count() {
        Some("its shared load does not exist")
    } else {
        None
    };
    if let Some(why) = why_not {
        return shape(why.to_string());
    }
    let shared = LoadId::from_index(c.shared);
    let Some(empty) = s.loads[shared].free else {
        return shape("its shared load is never released".into());
    };
    // The releases of one CTA's readers; the 2-SM pair's `empty` hears the leader's one
    // multicast commit.
    let arrivals: u32 = readers(s)
        .filter(|r| r.rank.is_none_or(|k| Some(k) == c.pair.map(|p| p.leader)))
        .map(|r| r.arrivals())
        .sum();
    let expected = match c.pair {
        Some(_) => arrivals,
        None => c.ctas * arrivals,
    };
    let count = s.mbarrier(empty).map_or(0, |m| m.count);
    if count != expected {
        return Err(ClusterError::EmptyCount {
            count,
            ctas: c.ctas,
            expected,
        }
        .into());
    }
    if let Some(p) = c.pair {
        if p.leader >= c.ctas {
            return shape(format!("its leader is CTA {} of {}", p.leader, c.ctas));
        }
        if !c.multicast.is_empty() {
            return shape("a 2-SM pair multicasts no boxes (each CTA loads its own half)".into());
        }
        if let Some(op) = peer {
            return shape(format!(
                "`{}` in a 2-SM pair, whose commits multicast",
                s.name(op)
            ));
        }
        return Ok(());
    }
    let boxes = s.loads[shared].tma.boxes.len();
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
            }
            .into());
        }
    }
    // The peer releases name the shared load's own free barrier, per iteration.
    let wrong = s
        .roles
        .iter()
        .filter(|r| wgmma_role(r))
        .flat_map(|r| r.program.ops())
        .find(|op| {
            matches!(*op, Op::ArrivePeer { bar, .. }
                if bar != empty || s.mbarrier(bar).is_none_or(|m| m.phase != Phase::Iteration))
        });
    if let Some(op) = wrong {
        return shape(format!("`{}` releases another array", s.name(op)));
    }
    Ok(())
}
