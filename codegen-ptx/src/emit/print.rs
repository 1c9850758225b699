//! `print` ops through `vprintf` ([`kiln_ir::device_print`] gives the line format).
//!
//! Each print gets its C format string as a global byte array and packs its arguments into a
//! per-thread `.local` buffer laid out as C varargs (ints 4 bytes, floats widened to 8-byte
//! doubles, each at its natural alignment). One thread prints: thread 0 for scalars (every
//! thread holds them), else the lowest thread holding the printed tile element.

use kiln_ir::device_print::{c_conversion, escape_percent};
use kiln_ir::schedule::Term;
use kiln_ir::{DType, OpId, OpKind};

use super::{Emitter, Lower};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

/// Name of the per-thread argument buffer.
const BUFFER: &str = "kiln_print_buf";

impl Emitter<'_> {
    /// Writes `print` op `id`.
    pub(crate) fn write_print(&mut self, id: OpId, lower: &dyn Lower) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let OpKind::Print { pieces, elements } = &op.kind else {
            return Err(self.internal(id, "not a print"));
        };
        // The values to print (registers) and the thread that prints them.
        let mut owner: Option<u32> = None;
        let mut args: Vec<(Reg, DType)> = Vec::new();
        for (&v, element) in op.operands.iter().zip(elements) {
            let dtype = self.k.ty(v).dtype();
            match element {
                None => args.push((self.scalar(v, id)?, dtype)),
                Some(idx) => {
                    let (tid, reg) = self.element_owner(v, idx, id)?;
                    if owner.is_some_and(|o| o != tid) {
                        return Err(self.unsupported(
                            id,
                            "printing tile elements that different threads hold in one print",
                        ));
                    }
                    owner = Some(tid);
                    let regs = self.tile(v, id)?;
                    let r = *regs
                        .get(reg)
                        .ok_or_else(|| self.internal(id, "a printed element without a register"))?;
                    args.push((r, dtype));
                }
            }
        }
        let mut format = String::from("[block (%d, %d, %d)] ");
        for (i, piece) in pieces.iter().enumerate() {
            format.push_str(&escape_percent(piece));
            if let Some(&(_, dtype)) = args.get(i) {
                format.push_str(c_conversion(dtype));
            }
        }
        format.push('\n');
        let name = self.global_string(&format);

        let skip = self.new_label();
        let prints = self.setp("eq.u32", self.tid, owner.unwrap_or(0));
        self.ins(format!("@!{prints} bra {skip}"));
        let mut at = 0u32;
        for axis in 0..3 {
            let b = self.special_reg(lower.block_id(axis), "ctaid", axis);
            self.ins(format!("st.local.u32 [{BUFFER}+{at}], {b}"));
            at += 4;
        }
        for (r, dtype) in args {
            match dtype {
                DType::I32 | DType::U32 => {
                    at = at.next_multiple_of(4);
                    self.ins(format!("st.local.u32 [{BUFFER}+{at}], {r}"));
                    at += 4;
                }
                DType::Bool => {
                    let x = self.new_reg(Class::B32);
                    self.ins(format!("selp.u32 {x}, 1, 0, {r}"));
                    at = at.next_multiple_of(4);
                    self.ins(format!("st.local.u32 [{BUFFER}+{at}], {x}"));
                    at += 4;
                }
                DType::F32 | DType::Bf16 | DType::F16 => {
                    let f = if dtype == DType::F32 {
                        r
                    } else {
                        self.widen(r, dtype)
                    };
                    let d = self.new_reg(Class::B64);
                    self.ins(format!("cvt.f64.f32 {d}, {f}"));
                    at = at.next_multiple_of(8);
                    self.ins(format!("st.local.f64 [{BUFFER}+{at}], {d}"));
                    at += 8;
                }
            }
        }
        self.print_buffer_bytes = self.print_buffer_bytes.max(at);
        let (fmt, buf) = (self.new_reg(Class::B64), self.new_reg(Class::B64));
        self.ins(format!("mov.u64 {fmt}, {name}"));
        self.ins(format!("cvta.global.u64 {fmt}, {fmt}"));
        self.ins(format!("mov.u64 {buf}, {BUFFER}"));
        self.ins(format!("cvta.local.u64 {buf}, {buf}"));
        // The call's parameters live in a scope of their own.
        self.line("{");
        self.ins(".param .b64 kiln_fmt");
        self.ins(".param .b64 kiln_args");
        self.ins(".param .b32 kiln_status");
        self.ins(format!("st.param.b64 [kiln_fmt], {fmt}"));
        self.ins(format!("st.param.b64 [kiln_args], {buf}"));
        self.ins("call.uni (kiln_status), vprintf, (kiln_fmt, kiln_args)");
        self.line("}");
        self.label(&skip);
        Ok(())
    }

    /// The `.local` buffer declaration the prints need (none if there is no print).
    pub(crate) fn print_buffer_decl(&self) -> Option<String> {
        (self.print_buffer_bytes > 0).then(|| {
            format!(
                "\t.local .align 8 .b8 {BUFFER}[{}];\n",
                self.print_buffer_bytes
            )
        })
    }

    /// The lowest thread holding element `idx` of tile `v`, and the register index it holds
    /// it in.
    fn element_owner(
        &self,
        v: kiln_ir::ValueId,
        idx: &[u32],
        at: OpId,
    ) -> Result<(u32, usize), CodegenError> {
        let d = self.dist(v, at)?;
        let threads = 32 * self.k.options.num_warps;
        for tid in 0..threads {
            for (r, offs) in d.regs.iter().enumerate() {
                let holds = offs
                    .iter()
                    .zip(&d.terms)
                    .zip(idx)
                    .all(|((&off, terms), &want)| off + Term::sum(terms, tid) == want);
                if holds {
                    return Ok((tid, r));
                }
            }
        }
        Err(self.internal(
            at,
            format!(
                "no thread holds element {idx:?} of {}",
                self.value_words(at, v)
            ),
        ))
    }
}
