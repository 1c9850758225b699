//! `mma` inside a ring's body as `wgmma.mma_async.m64nNk16` with shared-memory descriptors
//! (ptx-notes §4). Each consumer warpgroup `g` computes rows `64 g .. 64 g + 63` of the
//! accumulator, whose `#mma(num_warps x 1)` layout is exactly the wgmma accumulator layout of
//! each warpgroup (row `16 w + l / 4 + 8 v1`, column `8 v2 + 2 (l % 4) + v0` for register
//! `4 v2 + 2 v1 + v0`), so the registers are passed in layout order.
//!
//! A is K-major: box `c` of the stage holds columns `64 c ..` of every row, rows of
//! `swizzle` bytes; warpgroup `g` starts `64 g` rows in, SBO = 8 rows, and each k16 step moves
//! the start address by 32 bytes inside a box. B is MN-major: one 128-B-swizzled box of
//! `BK` rows x 64 columns per 64 columns of N, LBO = the box stride, SBO = 1024 (8 K-rows),
//! each k16 step is 16 rows (2048 bytes), and `imm-trans-b = 1`.

use kiln_ir::ring::{Operand, TmaLoad};
use kiln_ir::{DType, OpId};

use crate::CodegenError;
use crate::types::{Class, Reg};
use crate::writer::{Val, Writer};

/// The descriptor's swizzle field (bits 62-63) for a swizzle span in bytes.
fn swizzle_bits(span: u32) -> u64 {
    match span {
        128 => 1,
        64 => 2,
        _ => 3,
    }
}

/// The constant part of a descriptor: LBO, SBO and swizzle fields.
fn template(lbo: u32, sbo: u32, span: u32) -> u64 {
    (swizzle_bits(span) << 62) | (u64::from(sbo >> 4) << 32) | (u64::from(lbo >> 4) << 16)
}

impl Writer<'_> {
    /// A descriptor of the matrix starting at shared address `addr` with constant fields `t`.
    fn descriptor(&mut self, addr: Reg, t: u64) -> Reg {
        let d = self.new_reg(Class::B64);
        self.ins(format!("cvt.u64.u32 {d}, {addr}"));
        self.ins(format!("shr.u64 {d}, {d}, 4"));
        self.ins(format!("and.b64 {d}, {d}, 16383"));
        self.ins(format!("or.b64 {d}, {d}, 0x{t:016X}"));
        d
    }

    /// The ring load whose stage `v` is, with its stage base.
    fn ring_operand(&self, v: kiln_ir::ValueId, id: OpId) -> Result<(Reg, TmaLoad), CodegenError> {
        let Val::Smem {
            base,
            buf,
            transposed: false,
        } = self.val(v, id)?
        else {
            return Err(self.internal(id, "a wgmma operand that is not a ring stage"));
        };
        let load = self
            .ring
            .as_ref()
            .and_then(|r| r.loads.iter().find(|l| l.load == buf.load))
            .cloned()
            .ok_or_else(|| self.internal(id, "a wgmma operand outside the ring"))?;
        Ok((base, load))
    }

    /// Writes `d = a @ b + c` as one wgmma per k16 step and warpgroup, accumulating in place.
    pub(crate) fn write_wgmma(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let (a, b, r) = (op.operands[0], op.operands[1], op.results[0]);
        let &c = op
            .operands
            .get(2)
            .ok_or_else(|| self.internal(id, "a ring mma without an accumulator"))?;
        let (a_base, a_load) = self.ring_operand(a, id)?;
        let (b_base, b_load) = self.ring_operand(b, id)?;
        if a_load.operand != Operand::KMajorA || b_load.operand != Operand::MnMajorB {
            return Err(self.internal(id, "wgmma operands in unexpected majorness"));
        }
        let [bm, chunk] = a_load.box_dims;
        let bk = chunk * a_load.boxes.len() as u32;
        let bn = 64 * b_load.boxes.len() as u32;
        let elem = match self.k.ty(a).dtype() {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            _ => return Err(self.internal(id, "wgmma operands must be bf16 or f16")),
        };
        let mut acc = self.tile(c, id)?;
        let distinct = acc.iter().collect::<std::collections::BTreeSet<_>>().len() == acc.len();
        if !(self.dies_here(c, id) && distinct) {
            let fresh: Vec<Reg> = acc.iter().map(|_| self.new_reg(Class::F32)).collect();
            for (d, s) in fresh.iter().zip(&acc) {
                self.mov(*d, *s);
            }
            acc = fresh;
        }
        if acc.len() as u32 != bn / 2 {
            return Err(self.internal(id, "accumulator registers do not match m64nNk16"));
        }
        // Warp-uniform: the warpgroup's first row in the A stage.
        let wg = self.new_reg(Class::B32);
        self.ins(format!("shr.u32 {wg}, {}, 7", self.tid));
        let a_addr = self.new_reg(Class::B32);
        self.ins(format!(
            "mad.lo.u32 {a_addr}, {wg}, {}, {a_base}",
            64 * chunk * 2
        ));
        let da = self.descriptor(a_addr, template(16, 8 * chunk * 2, a_load.swizzle));
        let db = self.descriptor(b_base, template(bk * 128, 1024, 128));
        self.ins("wgmma.fence.sync.aligned");
        let regs: Vec<String> = acc.iter().map(Reg::to_string).collect();
        let regs = regs.join(", ");
        for s in 0..bk / 16 {
            let (box_index, within) = ((16 * s) / chunk, (16 * s) % chunk);
            let a_off = (box_index * bm * chunk * 2 + within * 2) >> 4;
            let b_off = (s * 16 * 128) >> 4;
            let (das, dbs) = (self.new_reg(Class::B64), self.new_reg(Class::B64));
            self.ins(format!("add.s64 {das}, {da}, {a_off}"));
            self.ins(format!("add.s64 {dbs}, {db}, {b_off}"));
            self.ins(format!(
                "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{elem}.{elem} \
                 {{{regs}}}, {das}, {dbs}, 1, 1, 1, 0, 1"
            ));
        }
        self.vals.insert(r, Val::Tile(acc));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::template;

    /// The descriptor constants ptx-notes §4 verified on the H200.
    #[test]
    fn templates_match_the_verified_descriptors() {
        // K-major SW128 bf16: LBO field 1, SBO 1024, swizzle 1.
        assert_eq!(template(16, 1024, 128), 0x4000_0040_0001_0000);
        // MN-major SW128, N = 128 as two boxes of Ktile = 64 rows: LBO 8192, SBO 1024.
        assert_eq!(template(64 * 128, 1024, 128), 0x4000_0040_0200_0000);
        // K-major SW64 (BK = 32): SBO = 8 rows of 64 B, swizzle 2.
        assert_eq!(template(16, 512, 64), 0x8000_0020_0001_0000);
    }
}
