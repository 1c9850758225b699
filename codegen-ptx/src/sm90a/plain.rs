//! `mma` outside a ring as wgmma issued by every warpgroup of the block, in program order
//! (`kiln_ir::passes::wgmma_plain` chose which): `wgmma.mma_async.m64nNk16` per k16 step,
//! warpgroup `g` computing rows `64 g ..` of the `#mma(W x 1)` accumulator (16 rows a warp:
//! exactly wgmma's accumulator layout, so the registers pass in layout order and stay where a
//! loop carries them). The operands sit where the sm_80 lowering puts them: loads staged by
//! cp.async, register tiles staged by every thread (`stage_operand`; an A loaded before the
//! loop once, where it is loaded), or, for A, registers in the accumulator layout (the RS
//! form).

use kiln_ir::schedule::SmemBuffer;
use kiln_ir::{OpId, ValueId};

use super::wgmma::{advance_descriptor, template};
use crate::emit::{Emitter, Lower, Val};
use crate::error::CodegenError;
use crate::sched;
use crate::types::{Class, Reg, half_ty};

/// The generic lowering, with the mmas the plan took written as wgmma.
pub(crate) struct Wgmma;

impl Lower for Wgmma {
    fn mma(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        if !e.k.schedule.wgmma.contains(&id) {
            return Ok(false);
        }
        write(e, id).map(|()| true)
    }
}

/// How a descriptor walks one shared operand of one wgmma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Walk {
    /// Stored along K (K-major); else along M or N (MN-major, the transpose bit set).
    pub(crate) k_major: bool,
    /// Swizzle span in bytes: 128, 64 or 32.
    pub(crate) span: u32,
    /// Bytes of one column box (the stage when unboxed).
    pub(crate) box_bytes: u32,
}

impl Walk {
    /// The walk of a buffer read as an operand stored along K or not.
    pub(crate) fn of(buf: &SmemBuffer, k_major: bool) -> Option<Walk> {
        let span = buf.span()?;
        // The descriptor's implicit row stride inside a box is the span.
        if buf.pitch() != span {
            return None;
        }
        Some(Walk {
            k_major,
            span,
            box_bytes: buf.box_bytes(),
        })
    }

    /// `(LBO, SBO, span)` of the descriptor.
    pub(crate) fn fields(&self) -> (u32, u32, u32) {
        let lbo = if self.k_major { 16 } else { self.box_bytes };
        (lbo, 8 * self.span, self.span)
    }

    /// Byte offset from the stage base of the descriptor reading rows (K-major) or columns
    /// (MN-major) `mn0 ..` of the M or N extent at k16 step `s`.
    pub(crate) fn start(&self, mn0: u32, s: u32) -> u32 {
        if self.k_major {
            let along = 32 * s;
            (along / self.span) * self.box_bytes + mn0 * self.span + along % self.span
        } else {
            (2 * mn0 / self.span) * self.box_bytes + 16 * s * self.span
        }
    }
}

/// An operand as the wgmma reads it.
enum Source {
    /// A shared stage at `base`.
    Shared(Reg, Walk),
    /// A register A in the accumulator layout.
    Registers(Val),
}

/// The operand `v` (slot 0: A, 1: B) of mma `id`: staged first when the lowering staged it.
fn operand(e: &mut Emitter<'_>, id: OpId, v: ValueId, slot: usize) -> Result<Source, CodegenError> {
    let val = if let Some(st) = e.k.schedule.staged(v).cloned() {
        e.stage_operand(id, &st)?
    } else if let Some(st) = e.k.schedule.staged_at_source(v).cloned() {
        e.staged_buffer(&st)
    } else {
        e.in_registers(v, id)?
    };
    match val {
        Val::Smem {
            base,
            buf,
            transposed,
        } => {
            // A stored `[M, K]` is K-major; B is K-major when stored `[N, K]` (read
            // transposed).
            let k_major = transposed == (slot == 1);
            let walk = Walk::of(&buf, k_major)
                .ok_or_else(|| e.internal(id, "a wgmma operand in an unswizzled buffer"))?;
            Ok(Source::Shared(base, walk))
        }
        v if slot == 0 => Ok(Source::Registers(v)),
        _ => Err(e.internal(id, "a register wgmma B operand")),
    }
}

/// Writes `d = a @ b (+ c)` as wgmmas of every warpgroup, committed and waited for.
///
/// A shared operand is read by a swizzled descriptor straight from its buffer: a stage is
/// column boxes of `span` bytes (one box when the row is no wider), each box `rows x span`
/// with the chunks of row `r` XOR-swizzled by `r`, which is the canonical swizzled layout
/// (docs/ptx.md §4). Stored along K (A `[M, K]`, B `[N, K]` read as `k.t()`) it is K-major:
/// SBO = 8 rows, and k16 step `s` starts `32 s` bytes along the row (in box `32 s / span`).
/// Stored along M or N (B `[K, N]`, A `[K, M]` read as `p.t()`) it is MN-major with the
/// transpose bit: LBO = the box stride, SBO = 8 K-rows, k16 step `s` starting 16 rows down.
///
/// Every thread's stores into those buffers were fenced into the async proxy before the
/// barrier that published them (`async_proxy_fence`). The group is committed and waited for
/// here, before any other instruction touches the accumulator or a buffer is written again.
pub(crate) fn write(e: &mut Emitter<'_>, id: OpId) -> Result<(), CodegenError> {
    let op = e.k.ops[id].clone();
    let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
    let (Some(rs), Some(a_shape)) = (e.k.ty(r).shape().cloned(), e.k.ty(a).shape().cloned()) else {
        return Err(e.internal(id, "a scalar wgmma"));
    };
    let (m, n, k) = (rs.rows() as u32, rs.cols() as u32, a_shape.cols() as u32);
    let warps = e.k.options.num_warps;
    if m != 16 * warps || !warps.is_multiple_of(4) || !n.is_multiple_of(8) || n > 256 {
        return Err(e.internal(id, "a wgmma of a shape the plan does not take"));
    }
    let Some(elem) = half_ty(e.k.ty(a).dtype()) else {
        return Err(e.internal(id, "wgmma operands must be bf16 or f16"));
    };
    let acc: Vec<Reg> = match op.operands.get(2) {
        Some(&c) => {
            let regs = e.tile(c, id)?;
            let distinct =
                regs.iter().collect::<std::collections::BTreeSet<_>>().len() == regs.len();
            if e.dies_here(c, id) && distinct {
                regs
            } else {
                let fresh: Vec<Reg> = regs.iter().map(|_| e.new_reg(Class::F32)).collect();
                for (d, s) in fresh.iter().zip(&regs) {
                    e.mov(*d, *s);
                }
                fresh
            }
        }
        None => (0..n / 2).map(|_| e.new_reg(Class::F32)).collect(),
    };
    if acc.len() as u32 != n / 2 {
        return Err(e.internal(id, "accumulator registers do not match m64nNk16"));
    }
    let a_src = operand(e, id, a, 0)?;
    let Source::Shared(b_base, b_walk) = operand(e, id, b, 1)? else {
        return Err(e.internal(id, "a register wgmma B operand"));
    };
    let db = sched::descriptor(e, b_base, fields_template(b_walk));
    let a_form = match &a_src {
        Source::Shared(a_base, a_walk) => {
            // The warpgroup's rows (K-major) or columns (MN-major) of A.
            let at = if warps > 4 {
                let (wg, at) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                e.ins(format!("shr.u32 {wg}, {}, 7", e.tid));
                e.ins(format!(
                    "mad.lo.u32 {at}, {wg}, {}, {a_base}",
                    a_walk.start(64, 0)
                ));
                at
            } else {
                *a_base
            };
            AForm::Shared(sched::descriptor(e, at, fields_template(*a_walk)), *a_walk)
        }
        Source::Registers(v) => AForm::Registers(
            (0..k / 16)
                .map(|s| e.pack_a_fragment(id, v, k / 8, 0, s))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    e.ins("wgmma.fence.sync.aligned");
    let regs = acc
        .iter()
        .map(Reg::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let shape = format!("m64n{n}k16.f32.{elem}.{elem}");
    let trans_b = u32::from(!b_walk.k_major);
    let zero_init = op.operands.get(2).is_none();
    for s in 0..k / 16 {
        // Without `c` the first step ignores the accumulator's undefined registers.
        let scale_d = u32::from(!(zero_init && s == 0));
        let dbs = advance_descriptor(e, db, b_walk.start(0, s) >> 4);
        match &a_form {
            AForm::Shared(da, a_walk) => {
                let das = advance_descriptor(e, *da, a_walk.start(0, s) >> 4);
                let trans_a = u32::from(!a_walk.k_major);
                e.ins(format!(
                    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {das}, {dbs}, {scale_d}, \
                     1, 1, {trans_a}, {trans_b}"
                ));
            }
            AForm::Registers(frags) => {
                let [a0, a1, a2, a3] = frags[s as usize];
                e.ins(format!(
                    "wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, {{{a0}, {a1}, {a2}, \
                     {a3}}}, {dbs}, {scale_d}, 1, 1, {trans_b}"
                ));
            }
        }
    }
    e.ins("wgmma.commit_group.sync.aligned");
    e.ins("wgmma.wait_group.sync.aligned 0");
    e.vals.insert(r, Val::Tile(acc));
    Ok(())
}

/// A in the form the instruction takes.
enum AForm {
    /// A descriptor of the warpgroup's A at k step 0.
    Shared(Reg, Walk),
    /// The packed fragments of every k16 step.
    Registers(Vec<[Reg; 4]>),
}

fn fields_template(w: Walk) -> u64 {
    let (lbo, sbo, span) = w.fields();
    template(lbo, sbo, span)
}

#[cfg(test)]
mod tests {
    use super::Walk;
    use kiln_ir::OpId;
    use kiln_ir::schedule::SmemBuffer;

    /// A stage of `rows x cols` bf16 elements as the lowering lays it out for wgmma.
    fn buffer(rows: u32, cols: u32) -> SmemBuffer {
        let row_bytes = 2 * cols;
        let mut b = SmemBuffer {
            load: OpId::from_index(0),
            offset: 0,
            stage_bytes: rows * row_bytes,
            stages: 1,
            row_bytes,
            swizzled: true,
            boxed: false,
        };
        b.boxed = b.span().is_some_and(|s| row_bytes > s);
        b
    }

    /// The swizzle both wgmma and the buffer apply to addresses from a 1024-aligned base:
    /// 16-byte chunk bits `[4, 4 + b)` XOR row bits `[7, 7 + b)`, `b = log2(span / 16)`.
    fn hw_swizzle(addr: u32, span: u32) -> u32 {
        let bits = (span / 16).trailing_zeros();
        let mask = ((1 << bits) - 1) << 4;
        addr ^ ((addr >> 3) & mask)
    }

    /// Where the PTX ISA's canonical layouts put element `(mn, k)` of a descriptor's view
    /// (before the swizzle): K-major, 8-row groups SBO apart and rows of the span; MN-major,
    /// boxes of `span / 2` elements LBO apart, 8-K-row groups SBO apart, rows of the span.
    fn canonical(w: &Walk, start: u32, mn: u32, k: u32) -> u32 {
        let (lbo, sbo, span) = w.fields();
        if w.k_major {
            start + (mn / 8) * sbo + (mn % 8) * span + 2 * k
        } else {
            let t = span / 2;
            start + (mn / t) * lbo + (k / 8) * sbo + (k % 8) * span + 2 * (mn % t)
        }
    }

    /// Where the buffer holds element `(row, col)`, swizzled.
    fn stored(b: &SmemBuffer, row: u32, col: u32) -> u32 {
        b.boxed_offset(row, 2 * col / 16) + (2 * col) % 16
    }

    /// Every element each warpgroup's wgmma reads at every k16 step is the one the lowering
    /// stored there, for both orientations, every swizzle span and boxed rows (a 128-, 96-
    /// and 256-column tile), 64 to 192 rows of M.
    #[test]
    fn descriptors_read_what_the_buffer_holds() {
        for (rows, cols) in [
            (64, 64),
            (64, 128),
            (128, 128),
            (64, 96),
            (128, 32),
            (64, 16),
            (192, 64),
            (64, 256),
            (128, 48),
        ] {
            let b = buffer(rows, cols);
            for k_major in [true, false] {
                let w = Walk::of(&b, k_major).expect("swizzled");
                // K-major: rows are M (or N), columns K; MN-major: rows K, columns M or N.
                let (mn_total, k_total) = if k_major { (rows, cols) } else { (cols, rows) };
                if !k_total.is_multiple_of(16) {
                    continue;
                }
                let groups = if mn_total.is_multiple_of(64) {
                    mn_total / 64
                } else {
                    1
                };
                let width = mn_total.min(64);
                for g in 0..groups {
                    for s in 0..k_total / 16 {
                        let start = w.start(64 * g, 0) + w.start(0, s);
                        for mn in 0..width {
                            for k in 0..16 {
                                let (r, c) = if k_major {
                                    (64 * g + mn, 16 * s + k)
                                } else {
                                    (16 * s + k, 64 * g + mn)
                                };
                                let read = hw_swizzle(canonical(&w, start, mn, k), w.span);
                                let wrote = stored(&b, r, c);
                                assert_eq!(
                                    read, wrote,
                                    "{rows}x{cols} k-major {k_major}: group {g} step {s} ({mn},{k})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs the integer instructions the writer emits for shared addresses (`shr`, `and`,
    /// `xor`, `mul.lo`, `mad.lo`, `add`) on register values `regs`.
    fn run(text: &str, regs: &mut std::collections::BTreeMap<String, u64>) {
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let line = line.trim_end_matches(';');
            let (op, rest) = line.split_once(' ').expect("an instruction");
            let args: Vec<&str> = rest.split(", ").collect();
            let val = |a: &str| -> u64 {
                regs.get(a)
                    .copied()
                    .unwrap_or_else(|| a.parse().unwrap_or_else(|_| panic!("operand {a}")))
            };
            let r = match op.split('.').next().expect("opcode") {
                "shr" => val(args[1]) >> val(args[2]),
                "and" => val(args[1]) & val(args[2]),
                "xor" => val(args[1]) ^ val(args[2]),
                "mul" => val(args[1]) * val(args[2]),
                "mad" => val(args[1]) * val(args[2]) + val(args[3]),
                "add" => val(args[1]) + val(args[2]),
                other => panic!("unexpected `{other}` in `{line}`"),
            };
            regs.insert(args[0].to_string(), r);
        }
    }

    /// The writer's shared offsets (cp.async destinations, ldmatrix and staging rows) are the
    /// layout the descriptors were checked against: for every row and chunk of boxed and
    /// plain buffers, the emitted arithmetic gives [`SmemBuffer::boxed_offset`]; and a cp.async
    /// thread's later rows (a multiple of 8 rows on) are `pitch` bytes a row further.
    #[test]
    fn emitted_offsets_are_the_buffer_layout() {
        use crate::emit::Emitter;
        use crate::types::Class;
        use kiln_ir::Target;
        use kiln_ir::kernel::{Kernel, KernelOptions};
        let k = Kernel::new("offsets", Vec::new(), KernelOptions::default());
        for (rows, cols) in [(64, 64), (64, 128), (32, 256), (64, 96), (16, 48), (8, 16)] {
            for boxed in [false, true] {
                let mut b = buffer(rows, cols);
                b.boxed = boxed && b.boxed;
                let mut e = Emitter::new(&k, Target::Sm90a);
                let (row, chunk) = (e.new_reg(Class::B32), e.new_reg(Class::B32));
                let off = e.smem_offset(row, chunk, &b);
                let text = e.finish().text;
                for r in 0..rows {
                    for c in 0..2 * cols / 16 {
                        let mut regs = std::collections::BTreeMap::new();
                        regs.insert(row.to_string(), u64::from(r));
                        regs.insert(chunk.to_string(), u64::from(c));
                        run(&text, &mut regs);
                        let want = b.boxed_offset(r, c);
                        assert_eq!(regs[&off.to_string()], u64::from(want), "{b:?} ({r}, {c})");
                        if r + 8 < rows {
                            let later = b.boxed_offset(r + 8, c);
                            assert_eq!(later, want + 8 * b.pitch(), "{b:?} ({r}, {c})");
                        }
                    }
                }
            }
        }
    }
}
