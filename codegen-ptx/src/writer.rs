//! The PTX writer: one pass over the scheduled kernel, in program order, one `write_*` per
//! kind of op. Instructions for other concerns live in sibling modules (`arith`, `memory`,
//! `mma`, `sync`, `control`) as further `impl Writer` blocks; `values` reads and
//! materialises the registers of IR values.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;

use kiln_ir::sched::RoleKind;
use kiln_ir::schedule::SmemBuffer;
use kiln_ir::{Block, DType, Kernel, OpId, OpKind, Param, Target, ValueId};

use crate::abi::{self, SlotRole};
use crate::types::{Class, Reg, Regs};
use crate::{CodegenError, PtxModule};

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
    },
    /// A scalar.
    Scalar(Reg),
}

/// Writes one kernel as a PTX module.
pub struct Writer<'k> {
    pub(crate) k: &'k Kernel,
    pub(crate) regs: Regs,
    pub(crate) out: String,
    pub(crate) vals: BTreeMap<ValueId, Val>,
    pub(crate) params: Vec<ParamRegs>,
    pub(crate) tid: Reg,
    pub(crate) smem: Reg,
    /// Shared stage of each prefetched load in the iteration being written.
    pub(crate) stage_bases: BTreeMap<OpId, Reg>,
    /// A pipelined loop's prefetch for this iteration not issued yet: it is issued at the end
    /// of the body (see `Writer::pipeline_iteration`).
    pub(crate) pending_prefetch: Option<(crate::sync::Pipeline, Reg)>,
    /// For every value, the reachable ops reading it.
    pub(crate) uses: BTreeMap<ValueId, Vec<OpId>>,
    /// For every reachable op, the op owning its block and the region index (`None` at the
    /// top level).
    pub(crate) parents: BTreeMap<OpId, (Option<OpId>, usize)>,
    /// sm_90a: the generic address of each TMA tensor parameter's map, by parameter.
    pub(crate) tmaps: BTreeMap<usize, Reg>,
    /// sm_90a: the ring loop's body whose wgmmas are being written.
    pub(crate) ring: Option<crate::sm90a::RingBody>,
    /// Per tile value, its distribution's register index by offsets.
    pub(crate) reg_index: BTreeMap<ValueId, BTreeMap<Vec<u32>, usize>>,
    /// sm_90a: the consumer's warpgroup index, computed where the consumers start.
    pub(crate) warpgroup: Option<Reg>,
    /// sm_90a: the consumer warpgroup's turn barriers when the ring ping-pongs, computed where
    /// the consumers start.
    pub(crate) turns: Option<crate::sm90a::TurnRegs>,
    /// A persistent kernel's logical grid (its parameters).
    pub(crate) grid: Option<[Reg; 3]>,
    /// A persistent kernel's block index: that of the work tile being run.
    pub(crate) block: Option<[Reg; 3]>,
    /// sm_100a, sm_90a: the columns of the accumulator whose chunk the epilogue runs the code
    /// after the ring loop on; meanwhile a tile whose layout holds the accumulator's columns
    /// has only their registers ([`kiln_ir::tmem::epilogue::chunk`]).
    pub(crate) columns: Option<Range<u32>>,
    /// Module-scope data the body refers to (print format strings).
    globals: Vec<String>,
    /// Bytes of the per-thread buffer that print arguments are packed into.
    pub(crate) print_buffer_bytes: u32,
    /// Labels handed out so far (`$Lk1`, `$Lk2`, ...).
    labels: u32,
    /// The target being written, named by `Unsupported` errors.
    target: Target,
}

impl<'k> Writer<'k> {
    /// A writer for a kernel that went through the pass pipeline for `target`.
    pub fn new(k: &'k Kernel, target: Target) -> Writer<'k> {
        let mut regs = Regs::default();
        let tid = regs.new_reg(Class::B32);
        let smem = regs.new_reg(Class::B32);
        Writer {
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
            tmaps: BTreeMap::new(),
            ring: None,
            reg_index: BTreeMap::new(),
            warpgroup: None,
            turns: None,
            grid: None,
            block: None,
            columns: None,
            globals: Vec::new(),
            print_buffer_bytes: 0,
            labels: 0,
            target,
        }
    }

    /// Writes the module.
    pub fn write(self) -> Result<PtxModule, CodegenError> {
        // The writer reads the schedule IR the protocol check leaves; a kernel scheduled
        // without the check (a test running the passes one by one) is checked here.
        if self.k.schedule.sched.is_none() && matches!(self.target, Target::Sm90a | Target::Sm100a)
        {
            let mut k = self.k.clone();
            kiln_ir::passes::protocol_check::run(&mut k, self.target)?;
            if k.schedule.sched.is_some() {
                return Writer::new(&k, self.target).write_checked();
            }
        }
        self.write_checked()
    }

    /// Writes the module of a kernel whose schedule, if it has one, was checked.
    fn write_checked(mut self) -> Result<PtxModule, CodegenError> {
        let target = self.target;
        let maps = crate::sm90a::tensor_maps(self.k);
        let tma: Vec<usize> = maps.iter().map(|m| m.param).collect();
        let k: &Kernel = self.k;
        let sched = k.schedule.sched.as_ref();
        let tiles = sched.and_then(|s| s.tiles);
        let slots = abi::slots_with_maps(&self.k.params, &tma, tiles.is_some())
            .map_err(|e| self.unsupported_msg(e.to_string()))?;
        // Roles that set their registers (`setmaxnreg`) are whole warpgroups.
        let budgets = sched.is_some_and(|s| s.roles.iter().any(|r| r.regs.is_some()));
        let threads = match sched {
            Some(s) if budgets => s.threads().next_multiple_of(128),
            Some(s) => s.threads(),
            None => 32 * self.k.options.num_warps,
        };
        self.write_prologue(&slots)?;
        let attention = sched.is_some_and(|s| s.role(RoleKind::Softmax(0)).is_some());
        match (sched, tiles) {
            (Some(_), Some(tiles)) if attention => self.write_attention(tiles)?,
            (Some(s), _) if s.tmem.is_some() => self.write_tcgen05(tiles)?,
            (Some(_), Some(tiles)) => self.write_persistent(tiles)?,
            (_, _) => {
                let body = self.k.body.clone();
                self.write_block(&body)?;
                if let Some(s) = sched
                    && let Some(consumer) = s.role(RoleKind::Consumer)
                {
                    for &op in &consumer.program.exit {
                        if op == kiln_ir::sched::Op::BulkWaitAll {
                            self.finish_tma_stores(s, &s.stores)?;
                        }
                    }
                }
            }
        }
        let mut ptx = String::new();
        let _ = writeln!(
            ptx,
            "//\n// Generated by kiln for kernel `{}`\n//",
            self.k.name
        );
        let _ = writeln!(
            ptx,
            ".version {}\n.target {}\n.address_size 64\n",
            // tcgen05 and `.target sm_100a` need PTX ISA 8.6 (ptx-notes §1).
            if target == Target::Sm100a {
                "8.6"
            } else {
                "8.0"
            },
            target.name()
        );
        if !self.globals.is_empty() {
            let _ = writeln!(ptx, "{}", crate::device_print::VPRINTF_DECL);
            for g in &self.globals {
                let _ = writeln!(ptx, "{g}");
            }
            ptx.push('\n');
        }
        let smem_bytes = self.k.schedule.smem_bytes;
        if smem_bytes > 0 {
            // TMA's 128-byte swizzle repeats every 1024 bytes; stages sit on that atom.
            let align = if sched.is_none() { 128 } else { 1024 };
            let _ = writeln!(ptx, ".extern .shared .align {align} .b8 kiln_smem[];\n");
        }
        let _ = writeln!(ptx, ".visible .entry {}(", self.k.name);
        let decls: Vec<String> = slots.iter().map(|s| format!("\t{s}")).collect();
        let _ = writeln!(ptx, "{}\n)", decls.join(",\n"));
        let _ = writeln!(ptx, ".maxntid {threads}, 1, 1");
        if let Some(s) = sched
            && budgets
        {
            // With `.maxntid`, lets ptxas know the register count at entry, which
            // `setmaxnreg` needs (ptx-notes §5, C7508).
            let _ = writeln!(ptx, ".minnctapersm {}", s.ctas_per_sm);
        }
        // A clustered ring's CTAs run in clusters along x; the directive makes every launch
        // (`cuLaunchKernel` included) one of whole clusters.
        if let Some(c) = sched.and_then(|s| s.cluster.as_ref()) {
            let _ = writeln!(ptx, ".reqnctapercluster {}, 1, 1", c.ctas);
        }
        ptx.push_str("{\n");
        ptx.push_str(&self.regs.declarations());
        if let Some(decl) = self.print_buffer_decl() {
            ptx.push_str(&decl);
        }
        ptx.push('\n');
        ptx.push_str(&self.out);
        ptx.push_str("\tret;\n}\n");
        Ok(PtxModule {
            ptx,
            entry: self.k.name.clone(),
            threads_per_block: threads,
            dynamic_smem_bytes: smem_bytes,
            target,
            tensor_maps: maps,
            persistent: tiles.is_some(),
        })
    }

    fn write_prologue(&mut self, slots: &[abi::Slot]) -> Result<(), CodegenError> {
        self.params = self
            .k
            .params
            .iter()
            .map(|p| match p {
                Param::Tensor { .. } => ParamRegs::Tensor {
                    ptr: Reg {
                        class: Class::B64,
                        index: 0,
                    },
                    dims: Vec::new(),
                    strides: Vec::new(),
                },
                Param::Scalar { .. } => ParamRegs::Scalar(Reg {
                    class: Class::B32,
                    index: 0,
                }),
            })
            .collect();
        self.ins(format!("mov.u32 {}, %tid.x", self.tid));
        if self.k.schedule.smem_bytes > 0 {
            self.ins(format!("mov.u32 {}, kiln_smem", self.smem));
        }
        for s in slots {
            match s.role {
                SlotRole::Ptr { param } => {
                    let raw = self.new_reg(Class::B64);
                    let ptr = self.new_reg(Class::B64);
                    self.ins(format!("ld.param.u64 {raw}, [{}]", s.name));
                    self.ins(format!("cvta.to.global.u64 {ptr}, {raw}"));
                    if let ParamRegs::Tensor { ptr: p, .. } = &mut self.params[param] {
                        *p = ptr;
                    }
                }
                SlotRole::Extent { param, .. } => {
                    let r = self.new_reg(Class::B32);
                    self.ins(format!("ld.param.s32 {r}, [{}]", s.name));
                    if let ParamRegs::Tensor { dims, .. } = &mut self.params[param] {
                        dims.push(r);
                    }
                }
                SlotRole::Stride { param, .. } => {
                    let r = self.new_reg(Class::B64);
                    self.ins(format!("ld.param.s64 {r}, [{}]", s.name));
                    if let ParamRegs::Tensor { strides, .. } = &mut self.params[param] {
                        strides.push(r);
                    }
                }
                SlotRole::TensorMap { param } => {
                    let raw = self.new_reg(Class::B64);
                    let map = self.new_reg(Class::B64);
                    // Without cvta.param the TMA faults at run time (ptx-notes §1).
                    self.ins(format!("mov.b64 {raw}, {}", s.name));
                    self.ins(format!("cvta.param.u64 {map}, {raw}"));
                    self.tmaps.insert(param, map);
                }
                SlotRole::Grid { axis } => {
                    let r = self.new_reg(Class::B32);
                    self.ins(format!("ld.param.s32 {r}, [{}]", s.name));
                    self.grid.get_or_insert([r; 3])[axis] = r;
                }
                SlotRole::Scalar { param } => {
                    let dtype = match &self.k.params[param] {
                        Param::Scalar { dtype, .. } => *dtype,
                        Param::Tensor { dtype, .. } => *dtype,
                    };
                    let r = self.new_reg(Class::of(dtype));
                    let ty = if dtype == DType::F32 { "f32" } else { "s32" };
                    self.ins(format!("ld.param.{ty} {r}, [{}]", s.name));
                    self.params[param] = ParamRegs::Scalar(r);
                }
            }
        }
        self.write_ring_init()
    }

    /// Writes every op of `block` except its terminating `yield`.
    pub(crate) fn write_block(&mut self, block: &Block) -> Result<(), CodegenError> {
        for &op in &block.ops {
            if self.k.ops[op].kind == OpKind::Yield {
                continue;
            }
            self.write_op(op)?;
        }
        Ok(())
    }

    /// Writes one op (also used by `sync` to re-emit leaf scalars for prefetches).
    pub(crate) fn write_op(&mut self, id: OpId) -> Result<(), CodegenError> {
        let op = self.k.ops[id].clone();
        let printed = kiln_ir::print::op_str(self.k, id);
        let _ = writeln!(
            self.out,
            "\t// {}:{}  {}",
            op.loc.file,
            op.loc.line,
            printed
                .lines()
                .next()
                .and_then(|l| l.split("//").next())
                .unwrap_or("")
                .trim_end()
        );
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
                let reg = self.block_index(*a as usize);
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::GridDim(a) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = self.new_reg(Class::B32);
                // A persistent kernel's grid is the logical one.
                match self.grid {
                    Some(regs) => self.mov(reg, regs[*a as usize]),
                    None => self.ins(format!("mov.u32 {reg}, %nctaid.{}", a.name())),
                }
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::Print { .. } => self.write_print(id)?,
            OpKind::TensorDim { tensor, dim } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let reg = match self.params.get(*tensor) {
                    Some(ParamRegs::Tensor { dims, .. }) => dims.get(*dim).copied(),
                    _ => None,
                }
                .ok_or_else(|| self.internal(id, "bad tensor dimension"))?;
                self.vals.insert(r, Val::Scalar(reg));
            }
            OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Select | OpKind::Cast { .. } => {
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
            OpKind::Reshape { .. } => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let v = self.val(op.operands[0], id)?;
                self.vals.insert(r, v);
            }
            OpKind::Transpose => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                match self.val(op.operands[0], id)? {
                    Val::Smem {
                        base,
                        buf,
                        transposed,
                    } => {
                        self.vals.insert(
                            r,
                            Val::Smem {
                                base,
                                buf,
                                transposed: !transposed,
                            },
                        );
                    }
                    Val::Scalar(_)
                    | Val::Tile(_)
                    | Val::Affine { .. }
                    | Val::Lazy(_)
                    | Val::Narrowed { .. }
                    | Val::Packed(_) => {
                        return Err(self.unsupported(id, "a transpose not feeding mma"));
                    }
                }
            }
            OpKind::Reduce { op: rop, dim } => self.write_reduce(id, *rop, *dim)?,
            OpKind::Mma if self.ring.is_some() => self.write_wgmma(id)?,
            OpKind::Mma => self.write_mma(id)?,
            OpKind::Load { .. } => self.write_load(id)?,
            OpKind::LoadScalar { .. } => self.write_load_scalar(id)?,
            OpKind::Store { .. } => self.write_store(id)?,
            OpKind::For { .. }
                if self
                    .k
                    .schedule
                    .sched
                    .as_ref()
                    .is_some_and(|s| s.for_op == id) =>
            {
                self.write_ring_loop(id)?
            }
            OpKind::For { .. } => self.write_for(id)?,
            OpKind::If => self.write_if(id)?,
            OpKind::Yield => {}
        }
        Ok(())
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

    /// A fresh label name.
    /// This block's index along `axis` (0 = x): a persistent kernel's blocks are its work
    /// tiles.
    pub(crate) fn block_index(&mut self, axis: usize) -> Reg {
        let reg = self.new_reg(Class::B32);
        match self.block {
            Some(regs) => self.mov(reg, regs[axis]),
            None => self.ins(format!("mov.u32 {reg}, %ctaid.{}", ["x", "y", "z"][axis])),
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

    pub(crate) fn new_label(&mut self) -> String {
        self.labels += 1;
        format!("$Lk{}", self.labels)
    }

    /// Emits `label:`.
    pub(crate) fn label(&mut self, l: &str) {
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
        };
        self.ins(format!("mov.{ty} {dst}, {src}"));
    }

    /// An internal error at op `at`: the passes should have prevented it.
    pub(crate) fn internal(&self, at: OpId, what: impl std::fmt::Display) -> CodegenError {
        CodegenError::Diagnostic(kiln_ir::Diagnostic::internal(
            self.k.ops[at].loc,
            format!("PTX writer: {what}"),
        ))
    }

    /// A construct this backend does not implement yet, at op `at`.
    pub(crate) fn unsupported(&self, at: OpId, what: &str) -> CodegenError {
        CodegenError::Unsupported {
            op: format!("{} ({what})", kiln_ir::print::op_str(self.k, at)),
            target: self.target,
        }
    }

    fn unsupported_msg(&self, what: String) -> CodegenError {
        CodegenError::Unsupported {
            op: what,
            target: self.target,
        }
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
