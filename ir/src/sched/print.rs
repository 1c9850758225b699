//! The schedule IR's text form, part of the kernel's IR dump.

use std::fmt;

use super::Sched;
use super::role::{Issue, Role};

/// A schedule prints as:
///
/// ```text
///   sched op7: 4 stages
///     bar0 full: mbarrier @65536 count 1 x4 stages, phase per iteration
///     bar1 empty: mbarrier @65568 count 8 x4 stages, phase per iteration
///     tma0 = op3 param0 KMajorA @0 stride 16384 B -> full: 2 box(es) 128x64 sw128
///     setup: mbarrier.init; fence.mbarrier_init; bar.sync 0
///     role producer: warps 8..12, setmaxnreg 40, one thread
///       iteration: wait empty(phase from 1); arrive.expect_tx full 32768B; tma tma0; tma tma1
/// ```
impl fmt::Display for Sched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  sched {}: {} stages", self.for_op, self.stages)?;
        if self.work_tiles > 1 {
            write!(f, ", {} work tiles at once", self.work_tiles)?;
        }
        if self.ctas_per_sm > 1 {
            write!(f, ", {} CTAs per multiprocessor", self.ctas_per_sm)?;
        }
        writeln!(f)?;
        if let Some(t) = &self.tiles {
            writeln!(f, "  {t}")?;
        }
        if let Some(c) = &self.cluster {
            writeln!(f, "{c}")?;
        }
        for (h, b) in self.barriers.iter() {
            writeln!(f, "    {h} {b}: {}", b.kind)?;
        }
        for (h, l) in self.loads.iter() {
            let t = &l.tma;
            let dims: Vec<String> = t.map_box().iter().map(u32::to_string).collect();
            write!(
                f,
                "    {h} = {} param{} {:?} @{} stride {} B -> {}: {} box(es) {} sw{}",
                t.load,
                t.param,
                t.operand,
                t.offset,
                t.stage_stride,
                self.barriers[l.barrier],
                t.boxes.len(),
                dims.join("x"),
                t.swizzle
            )?;
            if let Some(free) = l.free {
                write!(f, ", freed on {}", self.barriers[free])?;
            }
            if l.read_by != super::MmaPart::Body {
                write!(f, ", read by the {}", l.read_by)?;
            }
            if l.work_tile > 0 {
                write!(f, " (work tile {})", l.work_tile)?;
            }
            writeln!(f)?;
        }
        for st in &self.stores {
            writeln!(
                f,
                "    store {} param{} via smem @{} ({} B): {} box(es) {}x{} sw{} in {} round(s), \
                 {} group(s) of {} threads at {}; round: {}",
                st.store,
                st.param,
                st.offset,
                st.bytes(),
                st.boxes.len(),
                st.box_dims[0],
                st.box_dims[1],
                st.swizzle,
                st.rounds,
                st.groups,
                st.threads,
                self.barriers[st.barrier],
                self.names(&st.round)
            )?;
        }
        if let Some(t) = &self.tmem {
            let tiles: Vec<String> = t
                .tiles
                .iter()
                .map(|x| format!("{x}@{}+{}", x.column, x.columns))
                .collect();
            writeln!(
                f,
                "    tmem: {} columns, address slot @{}; {}",
                t.columns,
                t.slot_offset,
                tiles.join(" ")
            )?;
            for m in &t.mmas {
                write!(f, "      mma {}: idesc 0x{:08X}", m.part, m.idesc)?;
                match &m.a {
                    Some(a) => write!(f, ", a {a}")?,
                    None => f.write_str(", a from tmem")?,
                }
                writeln!(f, ", b {}", m.b)?;
            }
        }
        if let Some(off) = self.factors_offset {
            writeln!(f, "    rescale factors @{off} (128 f32 per Q tile)")?;
        }
        if self.poly_share.1 > 0 {
            writeln!(
                f,
                "    exp2 polynomial on score columns c % {} < {}",
                self.poly_share.1, self.poly_share.0
            )?;
        }
        if let Some(c) = self.epilogue_columns {
            writeln!(f, "    epilogue on {c} accumulator columns at a time")?;
        }
        if let Some(o) = &self.overlap {
            writeln!(f, "{o}")?;
        }
        writeln!(f, "    setup: {}", self.names(&self.setup))?;
        for (i, r) in self.roles.iter().enumerate() {
            write_role(f, self, r)?;
            if i + 1 < self.roles.len() {
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

fn write_role(f: &mut fmt::Formatter<'_>, sched: &Sched, r: &Role) -> fmt::Result {
    write!(
        f,
        "    role {}: warps {}..{}",
        r.kind,
        r.first_warp,
        r.end_warp()
    )?;
    if r.replicas > 1 {
        write!(f, " ({} replicas)", r.replicas)?;
    }
    if let Some(regs) = r.regs {
        write!(f, ", setmaxnreg {regs}")?;
    }
    f.write_str(match r.issue {
        Issue::Thread => ", one thread",
        Issue::Warps => ", every thread",
    })?;
    if let Some(rank) = r.rank {
        write!(f, ", cluster rank {rank}")?;
    }
    let p = &r.program;
    for (name, section) in p.sections() {
        if section.is_empty() {
            continue;
        }
        write!(f, "\n      {name}")?;
        if name == "tile" && p.lead > 0 {
            write!(f, " (after {} iteration(s))", p.lead)?;
        }
        if name == "iteration" && p.rotated {
            f.write_str(" (rotated)")?;
        }
        write!(f, ": {}", sched.names(section))?;
    }
    Ok(())
}
