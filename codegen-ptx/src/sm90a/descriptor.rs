//! wgmma's shared-memory matrix descriptors (docs/ptx.md §4): the constant fields
//! ([`template`]), a descriptor moved along its k16 steps ([`advance_descriptor`]), and how a
//! descriptor walks a swizzled buffer in either orientation ([`Walk`]), for the ring's
//! wgmmas ([`super::wgmma`]) and those issued in program order ([`super::plain`]).

use kiln_ir::sched::tma::TmaLoad;
use kiln_ir::schedule::SmemBuffer;

use crate::emit::Emitter;
use crate::types::{Class, Reg};

/// The descriptor's swizzle field (bits 62-63) for a swizzle span in bytes.
fn swizzle_bits(span: u32) -> u64 {
    match span {
        128 => 1,
        64 => 2,
        _ => 3,
    }
}

/// The constant part of a descriptor: LBO, SBO and swizzle fields.
pub(super) fn template(lbo: u32, sbo: u32, span: u32) -> u64 {
    (swizzle_bits(span) << 62) | (u64::from(sbo >> 4) << 32) | (u64::from(lbo >> 4) << 16)
}

/// `desc` with `units` (16-byte units) added to its start address: a 32-bit add on the low
/// word, which holds the 14-bit address field; shared addresses stay below 256 KiB, so the
/// sum never carries into the next field.
pub(super) fn advance_descriptor(e: &mut Emitter<'_>, desc: Reg, units: u32) -> Reg {
    if units == 0 {
        return desc;
    }
    let (lo, hi, out) = (
        e.new_reg(Class::B32),
        e.new_reg(Class::B32),
        e.new_reg(Class::B64),
    );
    e.ins(format!("mov.b64 {{{lo}, {hi}}}, {desc}"));
    e.ins(format!("add.u32 {lo}, {lo}, {units}"));
    e.ins(format!("mov.b64 {out}, {{{lo}, {hi}}}"));
    out
}

/// How a descriptor walks one shared operand of one wgmma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Walk {
    /// Stored along K (K-major); else along M or N (MN-major, the transpose bit set).
    pub(super) k_major: bool,
    /// Swizzle span in bytes: 128, 64 or 32.
    pub(super) span: u32,
    /// Bytes of one column box (the stage when unboxed).
    pub(super) box_bytes: u32,
}

impl Walk {
    /// The walk of a buffer read as an operand stored along K or not.
    pub(super) fn of(buf: &SmemBuffer, k_major: bool) -> Option<Walk> {
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

    /// The walk of ring or once load `l`'s stage read along K or not: TMA writes each box of
    /// its columns with every row of the tile, rows of the swizzle span.
    pub(super) fn of_load(l: &TmaLoad, k_major: bool) -> Walk {
        Walk {
            k_major,
            span: l.swizzle,
            box_bytes: l.tile_dims()[0] * l.swizzle,
        }
    }

    /// The descriptor's constant fields for this walk ([`template`]).
    pub(super) fn template(&self) -> u64 {
        let (lbo, sbo, span) = self.fields();
        template(lbo, sbo, span)
    }

    /// `(LBO, SBO, span)` of the descriptor.
    pub(super) fn fields(&self) -> (u32, u32, u32) {
        let lbo = if self.k_major { 16 } else { self.box_bytes };
        (lbo, 8 * self.span, self.span)
    }

    /// Byte offset from the stage base of the descriptor reading rows (K-major) or columns
    /// (MN-major) `mn0 ..` of the M or N extent at k16 step `s`.
    pub(super) fn start(&self, mn0: u32, s: u32) -> u32 {
        if self.k_major {
            let along = 32 * s;
            (along / self.span) * self.box_bytes + mn0 * self.span + along % self.span
        } else {
            (2 * mn0 / self.span) * self.box_bytes + 16 * s * self.span
        }
    }
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
    /// and 256-column tile), 64 to 192 rows of M; an extent no multiple of 64 (a B's N of
    /// 80 in five 32-byte boxes) read whole by one descriptor.
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
            (128, 80),
        ] {
            let b = buffer(rows, cols);
            for k_major in [true, false] {
                let w = Walk::of(&b, k_major).expect("swizzled");
                // K-major: rows are M (or N), columns K; MN-major: rows K, columns M or N.
                let (mn_total, k_total) = if k_major { (rows, cols) } else { (cols, rows) };
                if !k_total.is_multiple_of(16) {
                    continue;
                }
                // A warpgroup's 64 rows or columns of A; else all of a B's N.
                let (groups, width) = if mn_total.is_multiple_of(64) {
                    (mn_total / 64, 64)
                } else {
                    (1, mn_total)
                };
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
