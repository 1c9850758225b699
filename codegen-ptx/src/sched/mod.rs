//! What the target families' writers share of the schedule IR (`kiln_ir::sched`): a
//! [`View`] of the schedule, the lowering both families give its barriers (addresses,
//! inits, cursors, waits, arrivals: `barrier`), the producer's program (`producer`), the
//! persistent tile walk (`tiles`), the role split (`split`), TMA loads (`tma`) and stores (`store`), and the lowering
//! of the kernel's own ops both pass down to the generic writer ([`Ops`]).
//!
//! A family's writer owns the walk over its roles' programs; these are the ops whose PTX is
//! the same on sm_90a and sm_100a (TMA and mbarriers did not change on Blackwell).

mod barrier;
mod ops;
mod producer;
mod split;
mod store;
mod tiles;
mod tma;
mod view;

pub(crate) use barrier::{Cursor, cluster_barrier, cluster_rank, lane0};
pub(crate) use ops::{Ops, RingMma};
pub(crate) use split::{elect, set_registers};
pub(crate) use store::write as write_store;
pub(crate) use tiles::TileLoop;
pub(crate) use tma::{descriptor, stage_address};
pub(crate) use view::{View, tensor_maps};
