//! The generic writer: one pass over the kernel's own ops, in program order, one `write_*`
//! per kind of op, on the entry's registers, each written the way sm_80 runs it (`mma.sync`,
//! `ldmatrix`, `cp.async`, warp shuffles). A target family whose schedule changes how some of
//! the kernel's ops are written (a persistent kernel's block index, a ring body's `mma` as
//! wgmma, a store through TMA) says so through a [`Lower`] value passed down with the ops it
//! has the generic writer write. It knows no target family's schedule: no role, barrier or
//! ring state lives here, and nothing here names `kiln_ir::sched`.

// Instructions for other concerns live in the submodules as further `impl Emitter` blocks:
// `params` (the entry's parameters), `arith`, `memory` (global loads and stores), `vector`
// (their 16-byte forms), `access` (masked loads and stores, gathers, scatters, atomics),
// `copy` (`cp.async` staging), `mma` (`mma.sync`), `stage` (register mma operands written to
// shared memory for `ldmatrix`), `exchange` (elements changing threads through shared memory:
// layout conversions, reductions across warps), `math` (the transcendental sequences), `sync`
// (reductions, the sm_80 software pipeline), `control`, `print`; `values` reads and
// materialises the registers of IR values. The submodules use this module's items; it uses
// none of theirs.

mod access;
mod arith;
mod bulk_add;
mod checks;
mod control;
mod copy;
mod exchange;
mod in_flight;
mod math;
pub(crate) mod matrices;
mod memory;
mod mma;
mod params;
mod print;
mod scalar_atomic;
mod slab;
mod stage;
pub(crate) use in_flight::InFlight;
pub(crate) use stage::StageSync;
mod sync;
mod take;
mod values;
mod vector;

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::ops::Range;

use kiln_ir::schedule::{SmemBuffer, ThreadSlab};
use kiln_ir::{Block, DType, Kernel, OpId, OpKind, Target, ValueId};

use crate::error::CodegenError;
use crate::types::{Class, Reg, Regs};

/// How the writer holds an IR value.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// A scalar, the same in every thread.
    Scalar(Reg),
    /// A register tile: one register per entry of its layout's distribution.
    Tile(Vec<Reg>),
    /// An i32 register tile whose element `k` is `base + offs[k]` (an `iota` plus scalars):
    /// kept symbolic so the per-element adds happen where the elements are used, after any
    /// loop-variant scalar was folded into `base`, instead of living across a loop.
    Affine {
        /// The thread's base value.
        base: Reg,
        /// Per register, the compile-time offset.
        offs: Vec<u32>,
    },
    /// An f32 register tile rounded to `to` (bf16/f16) only where it is read: the A operand
    /// of `mma`, packed two elements per register by one `cvt.rn.bf16x2.f32`.
    Narrowed {
        /// The f32 registers.
        src: Vec<Reg>,
        /// The element type it is rounded to.
        to: DType,
    },
    /// A narrowed tile packed two elements per `.b32` register (register `k` holds elements
    /// `2k` and `2k + 1` of the distribution, the lower in the low half): the A fragments of
    /// a wgmma handed from one iteration of a rotated loop to the next.
    Packed(Vec<Reg>),
    /// An elementwise op not written yet: its single user computes each element in place.
    Lazy(OpId),
    /// A tile staged in shared memory.
    Smem {
        /// Shared address (`.b32`) of the stage holding it.
        base: Reg,
        /// Its buffer.
        buf: SmemBuffer,
        /// Whether the value is the transpose of the stored tile.
        transposed: bool,
    },
}

/// The registers holding one kernel parameter.
#[derive(Clone, Debug)]
pub(crate) enum ParamRegs {
    /// A tensor: global base address, extents, strides.
    Tensor {
        /// Global address (`.b64`).
        ptr: Reg,
        /// Extents (`.b32`).
        dims: Vec<Reg>,
        /// Strides in elements (`.b64`).
        strides: Vec<Reg>,
        /// The generic address of its tensor map (`.b64`), when TMA reads or writes it.
        map: Option<Reg>,
    },
    /// A scalar.
    Scalar(Reg),
}

/// The software pipeline of one sm_80 `for` loop being written (`sync`).
#[derive(Clone, Debug)]
pub(crate) struct Pipeline {
    /// The loop's induction variable.
    iv: ValueId,
    /// The prefetched loads and their rings.
    loads: Vec<(OpId, Ring)>,
    /// Stages in the ring.
    stages: u32,
    /// Stage read by the current iteration.
    read: Reg,
    /// Stage written by the current iteration's prefetch.
    write: Reg,
}

/// Where a prefetched load's stages sit.
#[derive(Clone, Debug)]
pub(crate) enum Ring {
    /// A tile staged in shared memory for mma, copied by the whole block.
    Tile(SmemBuffer),
    /// A register tile, each thread copying and reading back its own elements.
    Thread(ThreadSlab),
}

impl Pipeline {
    /// Whether a ring of the loop is shared by the block (its copies ordered by barriers).
    fn shared(&self) -> bool {
        self.loads.iter().any(|(_, r)| matches!(r, Ring::Tile(_)))
    }
}

impl Ring {
    /// Byte offset of stage 0, and bytes a stage.
    fn extent(&self) -> (u32, u32) {
        match self {
            Ring::Tile(b) => (b.offset, b.stage_bytes),
            Ring::Thread(b) => (b.offset, b.stage_bytes),
        }
    }
}

/// The module-scope declaration of CUDA's device printf (`print`).
const VPRINTF_DECL: &str =
    ".extern .func (.param .b32 status) vprintf (.param .b64 format, .param .b64 valist);";

/// What a target family changes in the kernel's own ops while the generic writer writes
/// them: passed down with every op ([`Emitter::write_op`]). Each method's default is the
/// generic lowering.
pub(crate) trait Lower {
    /// The register `block_id()` reads along `axis`, when it is not `%ctaid` (a persistent
    /// kernel's work tile).
    fn block_id(&self, axis: usize) -> Option<Reg> {
        let _ = axis;
        None
    }

    /// The register `grid_dim()` reads along `axis`, when it is not `%nctaid` (a persistent
    /// kernel's logical grid).
    fn grid_dim(&self, axis: usize) -> Option<Reg> {
        let _ = axis;
        None
    }

    /// Writes `mma` `id` the family's way (sm_90a: wgmma in a ring's body) and returns
    /// `true`, or returns `false` for the generic `mma.sync`.
    fn mma(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        let _ = (e, id);
        Ok(false)
    }

    /// Writes `store` `id` the family's way (through TMA) and returns `true`, or returns
    /// `false` for the generic stores.
    fn store(&mut self, e: &mut Emitter<'_>, id: OpId) -> Result<bool, CodegenError> {
        let _ = (e, id);
        Ok(false)
    }

    /// The columns of the accumulator the ops run on, when only a chunk of them (the code
    /// after a loop, chunk by chunk): meanwhile every tile whose layout holds the
    /// accumulator's columns has only those registers ([`kiln_ir::tmem::epilogue::chunk`]).
    fn columns(&self) -> Option<Range<u32>> {
        None
    }
}

/// The generic lowering of every op (sm_80, and a kernel without a schedule).
pub(crate) struct Plain;

impl Lower for Plain {}

/// What the generic writer leaves for the module: its module-scope data, the entry's
/// register declarations and its body.
pub(crate) struct Finished {
    /// Declarations before the entry (the print format strings), each line ended.
    pub(crate) module_scope: String,
    /// The entry's register (and print buffer) declarations.
    pub(crate) declarations: String,
    /// The entry's instructions.
    pub(crate) text: String,
}

/// The generic writer of one kernel's entry (see the module doc).
pub(crate) struct Emitter<'k> {
    pub(crate) k: &'k Kernel,
    regs: Regs,
    out: String,
    pub(crate) vals: BTreeMap<ValueId, Val>,
    pub(crate) params: Vec<ParamRegs>,
    /// The thread index the kernel's code sees (`%tid.x`, or a role's own index).
    pub(crate) tid: Reg,
    /// The shared address of dynamic shared memory.
    pub(crate) smem: Reg,
    /// The shared address of the stage each staged load reads in the code being written
    /// (an sm_80 pipelined loop's, a family's ring stage or once tile).
    pub(crate) stage_bases: BTreeMap<OpId, Reg>,
    /// A pipelined loop's prefetch for this iteration not issued yet: it is issued at the end
    /// of the body (see `Emitter::pipeline_iteration`).
    pending_prefetch: Option<(Pipeline, Reg)>,
    /// For every value, the reachable ops reading it.
    uses: BTreeMap<ValueId, Vec<OpId>>,
    /// For every reachable op, the op owning its block and the region index (`None` at the
    /// top level).
    parents: BTreeMap<OpId, (Option<OpId>, usize)>,
    /// Per tile value, its distribution's register index by offsets.
    reg_index: BTreeMap<ValueId, BTreeMap<Vec<u32>, usize>>,
    /// The columns of the accumulator-layout tiles the op being written runs on, when only a
    /// chunk of them ([`Lower::columns`]).
    columns: Option<Range<u32>>,
    /// Module-scope data the body refers to (print format strings).
    globals: Vec<String>,
    /// Whether the body reads the bits of 2/pi (`sin`/`cos`'s reduction, `math`).
    two_over_pi: bool,
    /// The math functions written as `.func`s so far (`math`).
    math_funcs: Vec<math::MathFunc>,
    /// Per op with math sequences, whether its elements call the function (`math`).
    math_calls: BTreeMap<OpId, bool>,
    /// Bytes of the per-thread buffer that print arguments are packed into.
    print_buffer_bytes: u32,
    /// Labels handed out so far (`$Lk1`, `$Lk2`, ...).
    labels: u32,
    /// The scratch slot the last exchange used, while the code since it is straight-line (a
    /// label, where control flow may join, forgets it): `exchange`.
    scratch_slot: Option<u32>,
    /// The target being written, named by unsupported and internal errors.
    target: Target,
    /// bf16 elements a vector load also delivered as f32 (the load is the only writer of
    /// both registers, so an entry stays true): widening one is then free.
    pub(crate) widened: BTreeMap<Reg, Reg>,
    /// 16-bit elements rounded from f32 by the op being written, with their f32 source and
    /// type: a cast's pairs round again in one `cvt.rn.*x2.f32` (`Emitter::round_in_pairs`).
    /// Cleared per op: only that op's own registers are known unchanged.
    pub(crate) rounded: BTreeMap<Reg, (Reg, DType)>,
    /// A ring body's wgmma groups committed and not yet waited for ([`in_flight`]).
    in_flight: Vec<in_flight::InFlight>,
}

impl<'k> Emitter<'k> {
    /// A writer for a kernel that went through the pass pipeline for `target`.
    pub(crate) fn new(k: &'k Kernel, target: Target) -> Emitter<'k> {
        let mut regs = Regs::default();
        let tid = regs.new_reg(Class::B32);
        let smem = regs.new_reg(Class::B32);
        Emitter {
            k,
            regs,
            out: String::new(),
            vals: BTreeMap::new(),
            params: Vec::new(),
            tid,
            smem,
            stage_bases: BTreeMap::new(),
            pending_prefetch: None,
            uses: uses(k, &k.body),
            parents: parents(k, &k.body, (None, 0)),
            reg_index: BTreeMap::new(),
            columns: None,
            globals: Vec::new(),
            two_over_pi: false,
            math_funcs: Vec::new(),
            math_calls: BTreeMap::new(),
            print_buffer_bytes: 0,
            labels: 0,
            scratch_slot: None,
            target,
            widened: BTreeMap::new(),
            rounded: BTreeMap::new(),
            in_flight: Vec::new(),
        }
    }

    /// What the module needs of the writer once the entry is written.
    pub(crate) fn finish(self) -> Finished {
        let mut module_scope = String::new();
        if !self.globals.is_empty() {
            let _ = writeln!(module_scope, "{VPRINTF_DECL}");
            for g in &self.globals {
                let _ = writeln!(module_scope, "{g}");
            }
            module_scope.push('\n');
        }
        if self.two_over_pi {
            let _ = writeln!(module_scope, "{}\n", math::two_over_pi_decl());
        }
        let funcs = math::called_funcs(&self.math_funcs);
        if !funcs.is_empty() {
            let _ = writeln!(module_scope, "{funcs}");
        }
        let mut declarations = self.regs.declarations();
        if let Some(decl) = self.print_buffer_decl() {
            declarations.push_str(&decl);
        }
        Finished {
            module_scope,
            declarations,
            text: self.out,
        }
    }

    /// Whether the op being written runs on a chunk of the accumulator's columns only.
    pub(crate) fn chunked(&self) -> bool {
        self.columns.is_some()
    }

    /// Writes every op of `block` except its terminating `yield`.
    pub(crate) fn write_block(
        &mut self,
        block: &Block,
        lower: &mut dyn Lower,
    ) -> Result<(), CodegenError> {
        for &op in &block.ops {
            if self.k.ops[op].kind == OpKind::Yield {
                continue;
            }
            self.write_op(op, lower)?;
        }
        Ok(())
    }

    /// Writes one op (also used by `sync` to re-emit leaf scalars for prefetches), as
    /// `lower` says where it changes the generic lowering, on the accumulator columns it
    /// names.
    pub(crate) fn write_op(&mut self, id: OpId, lower: &mut dyn Lower) -> Result<(), CodegenError> {
        let outer = std::mem::replace(&mut self.columns, lower.columns());
        // A tile of another chunk has other registers.
        if outer != self.columns {
            self.reg_index.clear();
        }
        let written = self.write_op_on_columns(id, lower);
        if outer != self.columns {
            self.reg_index.clear();
        }
        self.columns = outer;
        written
    }

    /// [`Emitter::write_op`] on the columns set.
    fn write_op_on_columns(&mut self, id: OpId, lower: &mut dyn Lower) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        self.wgmma_before(id);
        self.op_comment(id);
        let result = op.results.first().copied();
        match &op.kind {
            OpKind::Const(c) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = self.constant(*c, self.k.ty(r).dtype());
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::ScalarParam(i) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                match self.params.get(*i) {
                    Some(ParamRegs::Scalar(reg)) => {
                        let reg = *reg;
                        self.vals.insert(r, Val::Scalar(reg));
                    }
                    _ => return Err(self.internal(id, "not a scalar parameter")),
                }
            }
            OpKind::BlockId(a) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = self.special_reg(lower.block_id(*a as usize), "ctaid", *a as usize);
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::GridDim(a) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = self.special_reg(lower.grid_dim(*a as usize), "nctaid", *a as usize);
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::Print { .. } => self.write_print(id, lower)?,
            OpKind::TensorDim { tensor, dim } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = match self.params.get(*tensor) {
                    Some(ParamRegs::Tensor { dims, .. }) => dims.get(*dim).copied(),
                    _ => None,
                }
                .ok_or_else(|| self.internal(id, "bad tensor dimension"))?;
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Select
            | OpKind::Cast { .. }
            | OpKind::Bitcast { .. } => {
                self.write_elementwise(id)?;
            }
            OpKind::Splat { .. } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let s = self.scalar(op.operands[0], id)?;
                let n = self.dist(r, id)?.regs.len();
                self.vals.insert(r, Val::Tile(vec![s; n]));
            }
            OpKind::Iota { dim, .. } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let d = self.dist(r, id)?;
                let base = self.thread_coord(&d.terms[*dim]);
                let offs = d.offsets(*dim).collect();
                self.vals.insert(r, Val::Affine { base, offs });
            }
            // A reshape that leaves its elements in other threads moves them (the `lower`
            // pass sized the scratch region by the same test).
            OpKind::Reshape { .. } if !kiln_ir::passes::lower::reshape_is_free(self.k, &op) => {
                self.write_convert(id, None)?;
            }
            OpKind::Reshape { .. } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let v = self.val(op.operands[0], id)?;
                self.check_reshape(op.operands[0], r, &v, id)?;
                self.vals.insert(r, v);
            }
            OpKind::Permute { perm } => self.write_convert(id, Some(perm))?,
            OpKind::Transpose => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let mut v = self.val(op.operands[0], id)?;
                match &mut v {
                    Val::Smem { transposed, .. } => *transposed = !*transposed,
                    // Every user is an mma that stages the source transposed
                    // (`stage_operand`): nothing to write here.
                    _ if self.k.schedule.staged(r).is_some() => {}
                    // A register tile: its elements move (the `lower` pass sized the scratch
                    // region by the same test).
                    _ if kiln_ir::passes::lower::transpose_moves(self.k, &op) => {
                        return self.write_convert(id, Some(&[1, 0]));
                    }
                    // A view (`Layout::Transposed`): the same registers in the same order,
                    // each at its swapped offsets.
                    _ => v = self.in_registers(op.operands[0], id)?,
                }
                self.vals.insert(r, v);
            }
            OpKind::Reduce { op: rop, dim } => self.write_reduce(id, *rop, *dim)?,
            OpKind::Convert => self.write_convert(id, None)?,
            OpKind::Take { dim } => self.write_take(id, *dim)?,
            OpKind::Mma => {
                if !lower.mma(self, id)? {
                    self.write_mma(id)?;
                }
            }
            OpKind::Load { .. } => self.write_load(id)?,
            OpKind::LoadScalar { .. } => self.write_load_scalar(id)?,
            OpKind::ScalarAtomic { .. } => self.write_scalar_atomic(id)?,
            OpKind::Store { .. } => {
                if !lower.store(self, id)? {
                    self.write_store(id)?;
                }
            }
            OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
                self.write_access(id)?;
            }
            OpKind::For { .. } => self.write_for(id, lower)?,
            OpKind::If => self.write_if(id, lower)?,
            OpKind::Yield => {}
        }
        // A register tile the wgmmas of a later loop read from shared memory is written
        // there once, where it is loaded.
        if let Some(st) = result
            .and_then(|r| self.k.schedule.staged_at_source(r))
            .cloned()
        {
            self.stage_operand(id, &st)?;
        }
        Ok(())
    }

    /// Emits the comment that precedes op `id`: its source location and first printed line.
    pub(crate) fn op_comment(&mut self, id: OpId) {
        let loc = self.k.ops[id].loc;
        let printed = kiln_ir::print::op_str(self.k, id);
        let _ = writeln!(
            self.out,
            "\t// {}:{}  {}",
            loc.file,
            loc.line,
            printed
                .lines()
                .next()
                .and_then(|l| l.split("//").next())
                .unwrap_or("")
                .trim_end()
        );
    }

    /// Emits one instruction line.
    pub(crate) fn ins(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.out, "\t{};", s.as_ref());
    }

    /// Emits a line as written (a brace opening or closing a scope).
    pub(crate) fn line(&mut self, s: &str) {
        let _ = writeln!(self.out, "\t{s}");
    }

    /// Emits a comment line.
    pub(crate) fn comment(&mut self, s: &str) {
        let _ = writeln!(self.out, "\t// {s}");
    }

    /// A fresh register.
    pub(crate) fn new_reg(&mut self, class: Class) -> Reg {
        self.regs.new_reg(class)
    }

    /// `N` fresh registers of `class`, in order.
    pub(crate) fn new_regs<const N: usize>(&mut self, class: Class) -> [Reg; N] {
        [(); N].map(|_| self.new_reg(class))
    }

    /// A fresh predicate set by `setp.{test}` on `a` and `b` (`test`: `lt.u32`, ...).
    pub(crate) fn setp(&mut self, test: &str, a: impl Display, b: impl Display) -> Reg {
        let p = self.new_reg(Class::Pred);
        self.ins(format!("setp.{test} {p}, {a}, {b}"));
        p
    }

    /// Branches to a fresh label, returned, where `setp.{test}` holds on `a` and `b`: what
    /// is written up to the label runs only where it does not.
    pub(crate) fn branch_if(&mut self, test: &str, a: impl Display, b: impl Display) -> String {
        let (p, label) = (self.setp(test, a, b), self.new_label());
        self.ins(format!("@{p} bra {label}"));
        label
    }

    /// A register holding special register `%{special}` (`ctaid`, `nctaid`) along `axis`
    /// (0 = x), or `given`, what [`Lower`] gives instead: a persistent kernel's blocks are
    /// its work tiles, its grid the logical one.
    pub(crate) fn special_reg(&mut self, given: Option<Reg>, special: &str, axis: usize) -> Reg {
        let reg = self.new_reg(Class::B32);
        match given {
            Some(r) => self.mov(reg, r),
            None => self.ins(format!(
                "mov.u32 {reg}, %{special}.{}",
                ["x", "y", "z"][axis]
            )),
        }
        reg
    }

    /// A module-scope, NUL-terminated byte array holding `text`; returns its name.
    pub(crate) fn global_string(&mut self, text: &str) -> String {
        let name = format!("kiln_str{}", self.globals.len());
        let bytes: Vec<String> = text
            .bytes()
            .chain(std::iter::once(0))
            .map(|b| b.to_string())
            .collect();
        self.globals.push(format!(
            ".global .align 1 .b8 {name}[{}] = {{{}}};",
            bytes.len(),
            bytes.join(", ")
        ));
        name
    }

    /// A fresh label name.
    pub(crate) fn new_label(&mut self) -> String {
        self.labels += 1;
        format!("$Lk{}", self.labels)
    }

    /// Emits `label:`.
    pub(crate) fn label(&mut self, l: &str) {
        self.scratch_slot = None;
        let _ = writeln!(self.out, "{l}:");
    }

    /// `mov` of a register of any class.
    pub(crate) fn mov(&mut self, dst: Reg, src: Reg) {
        let ty = match dst.class {
            Class::Pred => "pred",
            Class::B16 => "b16",
            Class::B32 => "b32",
            Class::F32 => "f32",
            Class::B64 => "b64",
            Class::F64 => "f64",
        };
        self.ins(format!("mov.{ty} {dst}, {src}"));
    }

    /// An internal error at op `at`: the passes should have prevented it. Reported at the
    /// user's line of `at`, naming the op in the DSL's words.
    pub(crate) fn internal(&self, at: OpId, what: impl std::fmt::Display) -> CodegenError {
        CodegenError::Diagnostic(kiln_ir::Diagnostic::internal(
            self.loc(at),
            format!(
                "the PTX writer for {} failed on {}: {what}",
                self.target.name(),
                kiln_ir::diag::op_words(self.k, at)
            ),
        ))
    }

    /// A construct this backend does not implement yet, at op `at`: `what` says which form
    /// of the op, in the user's terms.
    pub(crate) fn unsupported(&self, at: OpId, what: &str) -> CodegenError {
        CodegenError::Diagnostic(kiln_ir::Diagnostic::unsupported(
            self.loc(at),
            format!(
                "kiln cannot write {} for {} yet: {what}",
                kiln_ir::diag::op_words(self.k, at),
                self.target.name()
            ),
        ))
    }

    /// The user's source location of op `at` (unknown for a handle the kernel lacks).
    pub(crate) fn loc(&self, at: OpId) -> kiln_ir::Loc {
        self.k.ops.get(at).map(|o| o.loc).unwrap_or_default()
    }

    /// Value `v` in the words of an error at op `at` ([`kiln_ir::diag::value_words`]).
    pub(crate) fn value_words(&self, at: OpId, v: ValueId) -> String {
        kiln_ir::diag::value_words(self.k, at, v)
    }
}

/// The reachable ops reading each value.
fn uses(k: &Kernel, block: &Block) -> BTreeMap<ValueId, Vec<OpId>> {
    let mut out: BTreeMap<ValueId, Vec<OpId>> = BTreeMap::new();
    for &op in &block.ops {
        for &v in &k.ops[op].operands {
            out.entry(v).or_default().push(op);
        }
        for region in &k.ops[op].regions {
            for (v, us) in uses(k, region) {
                out.entry(v).or_default().extend(us);
            }
        }
    }
    out
}

/// The owning op and region of every reachable op.
fn parents(
    k: &Kernel,
    block: &Block,
    at: (Option<OpId>, usize),
) -> BTreeMap<OpId, (Option<OpId>, usize)> {
    let mut out = BTreeMap::new();
    for &op in &block.ops {
        out.insert(op, at);
        for (i, region) in k.ops[op].regions.iter().enumerate() {
            out.extend(parents(k, region, (Some(op), i)));
        }
    }
    out
}
