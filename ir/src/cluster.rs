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
//! On sm_100a the pair is the 2-SM form instead ([`Pair`], [`pair_ring`]): one
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

use crate::ring::{Bar, InitStep, Operand, Ring, Step, TmaBox, TmaLoad};
pub use crate::sched::cluster::{CTAS, Cluster, Multicast, Pair};

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
        pair: None,
    });
    Ok(())
}

/// Pairs `ring` in the 2-SM form around ring load `shared` (the tile both CTAs' work tiles
/// read; see the module doc): CTA `r` loads half `r` of it along N, into the same offset of its
/// own stage; the producer's announcement on `full` counts both CTAs' bytes (the leader's alone
/// is issued); the cluster synchronises after the inits and before exit. `empty` keeps its one
/// arrival (the leader's commit, multicast). Fails, saying why, when the tile's N does not
/// split into whole boxes.
pub fn pair_ring(ring: &mut Ring, shared: usize) -> Result<(), String> {
    let load = ring
        .loads
        .get_mut(shared)
        .ok_or_else(|| format!("the ring has no load {shared}"))?;
    let [rows, cols] = load.tile_dims();
    let halved = match load.operand {
        // Stored `[N, K]`: N is the box rows, whole 8-row swizzle atoms each half.
        Operand::KMajorB if rows % (8 * CTAS) == 0 => {
            TmaLoad::k_major(load.load, load.param, Operand::KMajorB, rows / CTAS, cols)
        }
        // Stored `[K, N]`: N is the 64-column boxes, whole boxes each half.
        Operand::MnMajorB if cols % (64 * CTAS) == 0 => {
            TmaLoad::mn_major_b(load.load, load.param, rows, cols / CTAS)
        }
        Operand::KMajorB | Operand::MnMajorB => {
            return Err(format!(
                "the shared tile is {rows} x {cols}; its N does not split into {CTAS} halves of \
                 whole TMA boxes"
            ));
        }
        Operand::KMajorA => return Err("the shared tile is not an mma's B operand".into()),
    };
    let half = match load.operand {
        Operand::KMajorB => [rows / CTAS, 0],
        _ => [0, cols / CTAS],
    };
    // The stage keeps the place the pipeline planned for the whole tile.
    *load = TmaLoad {
        lead_dims: load.lead_dims,
        offset: load.offset,
        stage_stride: load.stage_stride,
        ..halved
    };
    let bytes: u32 = ring.loads.iter().map(TmaLoad::tile_bytes).sum::<u32>() * CTAS;
    for step in &mut ring.producer {
        if let Step::ArriveExpectTx { bar: Bar::Full, .. } = step {
            *step = Step::ArriveExpectTx {
                bar: Bar::Full,
                bytes,
            };
        }
    }
    for step in &mut ring.init {
        if *step == InitStep::BarSync {
            *step = InitStep::ClusterSync;
        }
    }
    ring.cluster = Some(Cluster {
        ctas: CTAS,
        shared,
        multicast: Vec::new(),
        exit_sync: true,
        pair: Some(Pair {
            leader: 0,
            half,
            commit_mask: ((1u32 << CTAS) - 1) as u16,
        }),
    });
    Ok(())
}
