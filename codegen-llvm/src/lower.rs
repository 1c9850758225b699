//! The driver: the NVPTX module and kernel function, the parameters, the value map, scalar
//! ops and structured control flow (`for`, `if`), then LLVM's optimiser and PTX emission.

use std::collections::HashMap;

use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetTriple,
};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, IntValue, PointerValue,
    ValueKind,
};
use inkwell::{AddressSpace, IntPredicate, OptimizationLevel};
use kiln_ir::{
    Block, Const, DType, DiagKind, Diagnostic, Kernel, Loc, OpId, OpKind, Target, ValueId,
};
use kiln_ptx::PtxModule;
use kiln_ptx::abi::{self, AbiError, SlotRole, SlotType};

/// NVPTX address space of global memory.
pub(crate) const GLOBAL: u16 = 1;
/// NVPTX address space of shared memory.
pub(crate) const SHARED: u16 = 3;

/// Why a kernel could not be lowered through LLVM.
#[derive(Debug, thiserror::Error)]
pub enum LlvmError {
    /// A diagnostic at the user's source: the kernel is wrong or over a budget (from the pass
    /// pipeline), uses something outside the subset this backend lowers, or broke an
    /// invariant the passes promise (a kiln bug); its [`DiagKind`] says which.
    #[error("{0}")]
    Diagnostic(#[from] Diagnostic),
    /// A parameter the ABI cannot pass.
    #[error(transparent)]
    Abi(#[from] AbiError),
    /// LLVM refused the module (builder, verifier, optimiser or code generator).
    #[error("LLVM: {0}")]
    Llvm(String),
}

impl LlvmError {
    /// Whether the kernel is wrong, unsupported by this backend, or kiln (or LLVM, given
    /// IR kiln wrote) has a bug.
    pub fn kind(&self) -> DiagKind {
        match self {
            LlvmError::Diagnostic(d) => d.kind,
            LlvmError::Abi(_) => DiagKind::Unsupported,
            LlvmError::Llvm(_) => DiagKind::Internal,
        }
    }
}

impl From<BuilderError> for LlvmError {
    fn from(e: BuilderError) -> Self {
        LlvmError::Llvm(e.to_string())
    }
}

/// A kernel compiled through LLVM: the LLVM IR it was lowered to (after optimisation) and
/// the PTX module LLVM wrote, ready for `Device::load_ptx`.
#[derive(Clone, Debug)]
pub struct LlvmModule {
    /// The optimised LLVM IR, as text.
    pub llvm_ir: String,
    /// The PTX and launch facts, in the PTX backend's form (same ABI, same launch).
    pub ptx: PtxModule,
}

/// Runs the sm_80 pass pipeline on a copy of `kernel`, then [`compile_scheduled`].
pub fn compile(kernel: &Kernel) -> Result<LlvmModule, LlvmError> {
    let mut k = kernel.clone();
    kiln_ir::passes::run_pipeline(&mut k, Target::Sm80, &mut |_, _| {})?;
    compile_scheduled(&k)
}

/// Lowers a kernel already scheduled for sm_80 to LLVM IR, optimises it (`default<O3>`) and
/// writes PTX with LLVM's NVPTX target (`sm_80`, PTX ISA 7.5).
pub fn compile_scheduled(k: &Kernel) -> Result<LlvmModule, LlvmError> {
    // LLVM's target registry is global: register NVPTX once, whichever thread compiles first.
    static NVPTX: std::sync::Once = std::sync::Once::new();
    NVPTX.call_once(|| LlvmTarget::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = LlvmTarget::from_triple(&triple).map_err(|e| LlvmError::Llvm(e.to_string()))?;
    let tm = target
        .create_target_machine(
            &triple,
            "sm_80",
            "+ptx75",
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| LlvmError::Llvm("no NVPTX target machine".into()))?;
    let cx = Context::create();
    let m = cx.create_module(&k.name);
    m.set_triple(&triple);
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    let threads = k.options.num_warps * 32;
    Lower::new(k, &cx, &m)?.lower_kernel()?;
    m.verify().map_err(|e| LlvmError::Llvm(e.to_string()))?;
    m.run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| LlvmError::Llvm(e.to_string()))?;
    let llvm_ir = m.print_to_string().to_string();
    let buf = tm
        .write_to_memory_buffer(&m, FileType::Assembly)
        .map_err(|e| LlvmError::Llvm(e.to_string()))?;
    let ptx = String::from_utf8_lossy(buf.as_slice())
        .trim_end_matches('\0')
        .to_string();
    Ok(LlvmModule {
        llvm_ir,
        ptx: PtxModule {
            ptx,
            entry: k.name.clone(),
            threads_per_block: threads,
            dynamic_smem_bytes: k.schedule.smem_bytes,
            target: Target::Sm80,
            tensor_maps: Vec::new(),
            persistent: false,
        },
    })
}

/// A kernel parameter as the function sees it.
pub(crate) enum ParamVals<'ctx> {
    /// A tensor: its global base address, extents (i32) and strides in elements (i64).
    Tensor {
        /// `i8 addrspace(1)*`.
        ptr: PointerValue<'ctx>,
        /// Extents, outermost first.
        dims: Vec<IntValue<'ctx>>,
        /// Strides in elements, outermost first.
        strides: Vec<IntValue<'ctx>>,
    },
    /// A scalar's value.
    Scalar(BasicValueEnum<'ctx>),
}

/// The lowered form of an IR value.
#[derive(Clone, Debug)]
pub(crate) enum Val<'ctx> {
    /// A scalar (uniform over the block).
    Scalar(BasicValueEnum<'ctx>),
    /// A register tile: this thread's elements, in its layout's register order
    /// ([`kiln_ir::schedule::Distribution::regs`]). bf16 and f16 elements are `i16` bits.
    Tile(Vec<BasicValueEnum<'ctx>>),
    /// A tile staged in shared memory by the load `load` (its buffer), viewed transposed when
    /// `transposed`.
    Smem {
        /// The load whose buffer holds the tile.
        load: OpId,
        /// Whether element `(r, c)` of the view is element `(c, r)` of the buffer.
        transposed: bool,
    },
}

/// The lowering state of one kernel.
pub(crate) struct Lower<'a, 'ctx> {
    /// The scheduled kernel.
    pub(crate) k: &'a Kernel,
    /// The LLVM context.
    pub(crate) cx: &'ctx Context,
    /// The module being built.
    pub(crate) m: &'a Module<'ctx>,
    /// The instruction builder.
    pub(crate) b: Builder<'ctx>,
    /// The kernel function.
    pub(crate) f: FunctionValue<'ctx>,
    /// `threadIdx.x`.
    pub(crate) tid: IntValue<'ctx>,
    /// Per kernel parameter, its values.
    pub(crate) params: Vec<ParamVals<'ctx>>,
    /// The lowered form of every value written so far.
    pub(crate) vals: HashMap<ValueId, Val<'ctx>>,
    /// The block's dynamic shared memory (`i8 addrspace(3)*`), when it has any.
    pub(crate) smem: Option<PointerValue<'ctx>>,
}

impl<'a, 'ctx> Lower<'a, 'ctx> {
    /// Declares the kernel function with the ABI's slots, marks it a kernel, and reads its
    /// parameters and thread index.
    fn new(k: &'a Kernel, cx: &'ctx Context, m: &'a Module<'ctx>) -> Result<Self, LlvmError> {
        let slots = abi::slots(&k.params)?;
        let mut tys: Vec<BasicMetadataTypeEnum> = Vec::new();
        for s in &slots {
            tys.push(match s.ty {
                // Generic pointers, as CUDA passes them; cast to global below.
                SlotType::U64 => cx.i8_type().ptr_type(AddressSpace::default()).into(),
                SlotType::S32 | SlotType::U32 => cx.i32_type().into(),
                SlotType::S64 => cx.i64_type().into(),
                SlotType::F32 => cx.f32_type().into(),
                SlotType::TensorMap => {
                    return Err(Diagnostic::unsupported(
                        Loc::default(),
                        format!("the LLVM backend cannot pass `{s}`, a TMA descriptor (sm_90a)"),
                    )
                    .into());
                }
            });
        }
        let f = m.add_function(&k.name, cx.void_type().fn_type(&tys, false), None);
        let threads = k.options.num_warps * 32;
        let i32t = cx.i32_type();
        let annotate = |key: &str, v: u64| {
            let node = cx.metadata_node(&[
                f.as_global_value().as_pointer_value().into(),
                cx.metadata_string(key).into(),
                i32t.const_int(v, false).into(),
            ]);
            m.add_global_metadata("nvvm.annotations", &node)
                .map_err(|e| LlvmError::Llvm(e.to_string()))
        };
        annotate("kernel", 1)?;
        annotate("maxntidx", u64::from(threads))?;
        if k.options.blocks_per_sm > 1 {
            annotate("minctasm", u64::from(k.options.blocks_per_sm))?;
        }
        let b = cx.create_builder();
        b.position_at_end(cx.append_basic_block(f, "entry"));
        let gptr = cx.i8_type().ptr_type(AddressSpace::from(GLOBAL));
        let mut params: Vec<ParamVals> = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            let arg = f
                .get_nth_param(i as u32)
                .ok_or_else(|| LlvmError::Llvm("missing parameter".into()))?;
            arg.set_name(&s.name);
            match s.role {
                SlotRole::Ptr { .. } => {
                    let ptr = b.build_address_space_cast(arg.into_pointer_value(), gptr, "")?;
                    params.push(ParamVals::Tensor {
                        ptr,
                        dims: Vec::new(),
                        strides: Vec::new(),
                    });
                }
                SlotRole::Extent { .. } | SlotRole::Stride { .. } => {
                    let Some(ParamVals::Tensor { dims, strides, .. }) = params.last_mut() else {
                        return Err(LlvmError::Llvm("tensor slot before its pointer".into()));
                    };
                    match s.role {
                        SlotRole::Extent { .. } => dims.push(arg.into_int_value()),
                        _ => strides.push(arg.into_int_value()),
                    }
                }
                SlotRole::Scalar { .. } => params.push(ParamVals::Scalar(arg)),
                SlotRole::TensorMap { .. } | SlotRole::Grid { .. } => {
                    return Err(Diagnostic::unsupported(
                        Loc::default(),
                        format!("the LLVM backend cannot pass `{s}`, an sm_90a parameter slot"),
                    )
                    .into());
                }
            }
        }
        let smem = if k.schedule.smem_bytes > 0 {
            // Dynamic shared memory, sized by the launch (`dynamic_smem_bytes`).
            let g = m.add_global(
                cx.i8_type().array_type(0),
                Some(AddressSpace::from(SHARED)),
                "kiln_smem",
            );
            g.set_linkage(Linkage::External);
            g.set_alignment(128);
            let p = b.build_pointer_cast(
                g.as_pointer_value(),
                cx.i8_type().ptr_type(AddressSpace::from(SHARED)),
                "smem",
            )?;
            Some(p)
        } else {
            None
        };
        let mut l = Lower {
            k,
            cx,
            m,
            b,
            f,
            tid: i32t.const_zero(),
            params,
            vals: HashMap::new(),
            smem,
        };
        l.tid = l.sreg("tid.x")?;
        Ok(l)
    }

    /// Lowers the body and returns.
    fn lower_kernel(mut self) -> Result<(), LlvmError> {
        let body = self.k.body.clone();
        self.lower_block(&body)?;
        self.b.build_return(None)?;
        Ok(())
    }

    /// Lowers every op of `block` but its terminating `yield`.
    pub(crate) fn lower_block(&mut self, block: &Block) -> Result<(), LlvmError> {
        for &op in &block.ops {
            if self.k.ops[op].kind != OpKind::Yield {
                self.lower_op(op)?;
            }
        }
        Ok(())
    }

    fn lower_op(&mut self, id: OpId) -> Result<(), LlvmError> {
        if let Some(what) = beyond_subset(self.k, id) {
            return Err(self.unsupported(id, what));
        }
        let op = self.k.ops[id].clone();
        let result = op.results.first().copied();
        let set = |l: &mut Self, v: Val<'ctx>| -> Result<(), LlvmError> {
            let r = result.ok_or_else(|| l.internal(id, "no result"))?;
            l.vals.insert(r, v);
            Ok(())
        };
        match &op.kind {
            OpKind::Const(c) => {
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let v = self.constant(*c, self.k.ty(r).dtype());
                set(self, Val::Scalar(v))?;
            }
            OpKind::ScalarParam(i) => match self.params.get(*i) {
                Some(ParamVals::Scalar(v)) => {
                    let v = *v;
                    set(self, Val::Scalar(v))?;
                }
                _ => return Err(self.internal(id, "not a scalar parameter")),
            },
            OpKind::BlockId(a) => {
                let v = self.sreg(&format!("ctaid.{}", a.name()))?;
                set(self, Val::Scalar(v.into()))?;
            }
            OpKind::GridDim(a) => {
                let v = self.sreg(&format!("nctaid.{}", a.name()))?;
                set(self, Val::Scalar(v.into()))?;
            }
            OpKind::TensorDim { tensor, dim } => {
                let d = match self.params.get(*tensor) {
                    Some(ParamVals::Tensor { dims, .. }) => dims.get(*dim).copied(),
                    _ => None,
                }
                .ok_or_else(|| self.internal(id, "bad tensor dimension"))?;
                set(self, Val::Scalar(d.into()))?;
            }
            OpKind::Bitcast { .. } => return Err(self.unsupported(id, "`bitcast`")),
            OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Select | OpKind::Cast { .. } => {
                self.lower_elementwise(id)?
            }
            OpKind::Splat { .. } => {
                let s = self.scalar(op.operands[0], id)?;
                let r = result.ok_or_else(|| self.internal(id, "no result"))?;
                let n = self.dist(r, id)?.regs.len();
                set(self, Val::Tile(vec![s; n]))?;
            }
            OpKind::Iota { dim, .. } => self.lower_iota(id, *dim)?,
            OpKind::Reshape { .. } if !kiln_ir::passes::lower::reshape_is_free(self.k, &op) => {
                return Err(self.unsupported(
                    id,
                    "a reshape that moves elements between threads (the PTX backend moves \
                     them through shared memory)",
                ));
            }
            OpKind::Permute { .. } => {
                return Err(self.unsupported(
                    id,
                    "a permutation of a tile's dimensions (the PTX backend moves its \
                     elements through shared memory)",
                ));
            }
            OpKind::Reshape { .. } => {
                // [R] <-> [R, 1] and [C] <-> [1, C] keep every register (the slice layouts
                // the layout pass gives both list them in the same order).
                let v = self.val(op.operands[0], id)?;
                set(self, v)?;
            }
            OpKind::Transpose => match self.val(op.operands[0], id)? {
                Val::Smem { load, transposed } => set(
                    self,
                    Val::Smem {
                        load,
                        transposed: !transposed,
                    },
                )?,
                Val::Scalar(_) | Val::Tile(_) => {
                    return Err(self.unsupported(id, "a transpose not feeding mma"));
                }
            },
            OpKind::Convert => {
                return Err(self.unsupported(
                    id,
                    "a tile changing layout between threads (the PTX backend moves it \
                     through shared memory)",
                ));
            }
            OpKind::Take { .. } => {
                return Err(self.unsupported(
                    id,
                    "an in-tile gather (`take`), which moves elements between threads (the \
                     PTX backend moves them through shared memory)",
                ));
            }
            OpKind::Reduce { op: rop, dim } => self.lower_reduce(id, *rop, *dim)?,
            OpKind::Mma => self.lower_mma(id)?,
            OpKind::Load { .. } => self.lower_load(id)?,
            OpKind::LoadScalar { .. } => self.lower_load_scalar(id)?,
            OpKind::Store { .. } => self.lower_store(id)?,
            OpKind::For { .. } => self.lower_for(id)?,
            OpKind::If => self.lower_if(id)?,
            OpKind::Print { .. } => return Err(self.unsupported(id, "in-kernel print")),
            OpKind::Gather { .. }
            | OpKind::Scatter { .. }
            | OpKind::Atomic { .. }
            | OpKind::ScalarAtomic { .. } => {
                // Reported at the user's line, in the DSL's words.
                // Loads and stores of tiles of rank 3 or more are addressed accesses too
                // (`canonicalize`); the user wrote a plain `load` or `store`.
                let tile_rank = match &op.kind {
                    OpKind::Gather { shape, .. } => shape.rank(),
                    _ => op
                        .access_operands()
                        .and_then(|p| p.value)
                        .and_then(|v| self.k.ty(v).shape().map(|s| s.rank()))
                        .unwrap_or(0),
                };
                let what = match &op.kind {
                    _ if tile_rank >= 3 => "tiles of 3 or more dimensions",
                    OpKind::Gather { .. } => "masked loads and gathers",
                    OpKind::Scatter { .. } => "masked stores and scatters",
                    _ => "atomics",
                };
                return Err(LlvmError::Diagnostic(
                    Diagnostic::unsupported(
                        self.k.ops[id].loc,
                        format!("{what} are not supported by the LLVM backend"),
                    )
                    .note("compile this kernel with the PTX backend"),
                ));
            }
            OpKind::Yield => {}
        }
        Ok(())
    }

    /// `for`: a header with one phi per induction variable and carried register, the body,
    /// and the exit, where the header's phis are the loop's results.
    fn lower_for(&mut self, id: OpId) -> Result<(), LlvmError> {
        let op = self.k.ops[id].clone();
        let (lo, hi, step) = (
            self.int(op.operands[0], id)?,
            self.int(op.operands[1], id)?,
            self.int(op.operands[2], id)?,
        );
        let init: Vec<Val> = op.operands[3..]
            .iter()
            .map(|&v| self.val(v, id))
            .collect::<Result<_, _>>()?;
        let (flat, shape) = self.flatten(&init, id)?;
        let pre = self.current_block()?;
        let head = self.cx.append_basic_block(self.f, "for.head");
        let body_bb = self.cx.append_basic_block(self.f, "for.body");
        let exit = self.cx.append_basic_block(self.f, "for.exit");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        let iv = self.b.build_phi(self.cx.i32_type(), "iv")?;
        iv.add_incoming(&[(&lo, pre)]);
        let mut phis = Vec::with_capacity(flat.len());
        for v in &flat {
            let p = self.b.build_phi(v.get_type(), "")?;
            p.add_incoming(&[(v, pre)]);
            phis.push(p);
        }
        let ivv = iv.as_basic_value().into_int_value();
        let go = self
            .b
            .build_int_compare(IntPredicate::SLT, ivv, hi, "for.go")?;
        self.b.build_conditional_branch(go, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        let region = &op.regions[0];
        let carried: Vec<BasicValueEnum> = phis.iter().map(|p| p.as_basic_value()).collect();
        self.vals.insert(region.args[0], Val::Scalar(ivv.into()));
        for (&a, v) in region.args[1..]
            .iter()
            .zip(self.unflatten(&carried, &shape))
        {
            self.vals.insert(a, v);
        }
        self.lower_block(region)?;
        let next = self.yielded(region, id)?;
        let (next, next_shape) = self.flatten(&next, id)?;
        if next_shape != shape {
            return Err(self.internal(id, "carried values change their register count"));
        }
        let ivn = self.b.build_int_add(ivv, step, "iv.next")?;
        let latch = self.current_block()?;
        self.b.build_unconditional_branch(head)?;
        iv.add_incoming(&[(&ivn, latch)]);
        for (p, v) in phis.iter().zip(&next) {
            p.add_incoming(&[(v, latch)]);
        }
        self.b.position_at_end(exit);
        for (&r, v) in op.results.iter().zip(self.unflatten(&carried, &shape)) {
            self.vals.insert(r, v);
        }
        Ok(())
    }

    /// `if`: both regions, then a merge block whose phis are the results.
    fn lower_if(&mut self, id: OpId) -> Result<(), LlvmError> {
        let op = self.k.ops[id].clone();
        let cond = self.int(op.operands[0], id)?;
        let then_bb = self.cx.append_basic_block(self.f, "if.then");
        let else_bb = self.cx.append_basic_block(self.f, "if.else");
        let merge = self.cx.append_basic_block(self.f, "if.end");
        self.b.build_conditional_branch(cond, then_bb, else_bb)?;
        let mut arms = Vec::new();
        for (region, bb) in op.regions.iter().zip([then_bb, else_bb]) {
            self.b.position_at_end(bb);
            self.lower_block(region)?;
            let y = self.yielded(region, id)?;
            let flat = self.flatten(&y, id)?;
            arms.push((flat, self.current_block()?));
            self.b.build_unconditional_branch(merge)?;
        }
        self.b.position_at_end(merge);
        let [((tv, tshape), tbb), ((ev, eshape), ebb)] =
            <[_; 2]>::try_from(arms).map_err(|_| self.internal(id, "an if needs two regions"))?;
        if tshape != eshape {
            return Err(self.internal(id, "branches yield different register counts"));
        }
        let mut merged = Vec::with_capacity(tv.len());
        for (t, e) in tv.iter().zip(&ev) {
            let p = self.b.build_phi(t.get_type(), "")?;
            p.add_incoming(&[(t, tbb), (e, ebb)]);
            merged.push(p.as_basic_value());
        }
        for (&r, v) in op.results.iter().zip(self.unflatten(&merged, &tshape)) {
            self.vals.insert(r, v);
        }
        Ok(())
    }

    /// The values the `yield` ending `region` passes on.
    fn yielded(&self, region: &Block, at: OpId) -> Result<Vec<Val<'ctx>>, LlvmError> {
        let y = region
            .ops
            .last()
            .filter(|&&y| self.k.ops[y].kind == OpKind::Yield)
            .ok_or_else(|| self.internal(at, "region without yield"))?;
        self.k.ops[*y]
            .operands
            .iter()
            .map(|&v| self.val(v, at))
            .collect()
    }

    /// The registers of `vals` in one list, with each value's register count (`None`: a
    /// scalar), to carry them through phis.
    fn flatten(
        &self,
        vals: &[Val<'ctx>],
        at: OpId,
    ) -> Result<(Vec<BasicValueEnum<'ctx>>, Vec<Option<usize>>), LlvmError> {
        let (mut flat, mut shape) = (Vec::new(), Vec::new());
        for v in vals {
            match v {
                Val::Scalar(s) => {
                    flat.push(*s);
                    shape.push(None);
                }
                Val::Tile(regs) => {
                    flat.extend(regs.iter().copied());
                    shape.push(Some(regs.len()));
                }
                Val::Smem { .. } => {
                    return Err(self.unsupported(at, "a shared-memory tile carried by a loop"));
                }
            }
        }
        Ok((flat, shape))
    }

    /// The inverse of [`Lower::flatten`].
    fn unflatten(&self, flat: &[BasicValueEnum<'ctx>], shape: &[Option<usize>]) -> Vec<Val<'ctx>> {
        let mut at = 0;
        shape
            .iter()
            .map(|n| match n {
                None => {
                    at += 1;
                    Val::Scalar(flat[at - 1])
                }
                Some(n) => {
                    at += n;
                    Val::Tile(flat[at - n..at].to_vec())
                }
            })
            .collect()
    }

    /// The block the builder is appending to.
    pub(crate) fn current_block(
        &self,
    ) -> Result<inkwell::basic_block::BasicBlock<'ctx>, LlvmError> {
        self.b
            .get_insert_block()
            .ok_or_else(|| LlvmError::Llvm("builder has no block".into()))
    }

    /// `llvm.nvvm.read.ptx.sreg.<name>` (`tid.x`, `ctaid.y`, ...).
    fn sreg(&self, name: &str) -> Result<IntValue<'ctx>, LlvmError> {
        let v = self.intrinsic(
            &format!("llvm.nvvm.read.ptx.sreg.{name}"),
            self.cx.i32_type().into(),
            &[],
        )?;
        Ok(v.into_int_value())
    }

    /// Calls intrinsic `name`, declared on first use with the arguments' types and `ret`
    /// (`None`: void); returns its result, if any.
    fn call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>, LlvmError> {
        let f = self.m.get_function(name).unwrap_or_else(|| {
            let tys: Vec<BasicMetadataTypeEnum> =
                args.iter().map(|a| a.get_type().into()).collect();
            let fty = match ret {
                Some(t) => t.fn_type(&tys, false),
                None => self.cx.void_type().fn_type(&tys, false),
            };
            self.m.add_function(name, fty, None)
        });
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
        Ok(
            match self.b.build_call(f, &args, "")?.try_as_basic_value() {
                ValueKind::Basic(v) => Some(v),
                ValueKind::Instruction(_) => None,
            },
        )
    }

    /// Calls intrinsic `name`, which returns a `ret`.
    pub(crate) fn intrinsic(
        &self,
        name: &str,
        ret: BasicTypeEnum<'ctx>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        self.call(name, Some(ret), args)?
            .ok_or_else(|| LlvmError::Llvm(format!("{name} returned nothing")))
    }

    /// `bar.sync 0` (`llvm.nvvm.barrier0`).
    pub(crate) fn barrier(&self) -> Result<(), LlvmError> {
        self.call("llvm.nvvm.barrier0", None, &[])?;
        Ok(())
    }

    /// The LLVM type of a `dtype` element: bf16 and f16 travel as their `i16` bits.
    pub(crate) fn elem_type(&self, dtype: DType) -> BasicTypeEnum<'ctx> {
        match dtype {
            DType::F32 => self.cx.f32_type().into(),
            DType::I32 | DType::U32 => self.cx.i32_type().into(),
            DType::Bool => self.cx.bool_type().into(),
            DType::Bf16 | DType::F16 => self.cx.i16_type().into(),
        }
    }

    /// Constant `c` as a `dtype` value.
    pub(crate) fn constant(&self, c: Const, dtype: DType) -> BasicValueEnum<'ctx> {
        let x = match c {
            Const::Int(i) => i as f64,
            Const::Float(f) => f,
            Const::Bool(b) => f64::from(u8::from(b)),
        };
        let i16t = self.cx.i16_type();
        match dtype {
            DType::F32 => self.cx.f32_type().const_float(x).as_basic_value_enum(),
            DType::I32 => self
                .cx
                .i32_type()
                .const_int(x as i32 as u64, true)
                .as_basic_value_enum(),
            DType::U32 => self
                .cx
                .i32_type()
                .const_int(u64::from(x as u32), false)
                .as_basic_value_enum(),
            DType::Bool => self
                .cx
                .bool_type()
                .const_int(u64::from(x != 0.0), false)
                .as_basic_value_enum(),
            DType::Bf16 => i16t
                .const_int(u64::from(kiln_ir::rounding::to_bf16(x).to_bits()), false)
                .as_basic_value_enum(),
            DType::F16 => i16t
                .const_int(u64::from(kiln_ir::rounding::to_f16(x).to_bits()), false)
                .as_basic_value_enum(),
        }
    }

    /// The lowered form of `v`.
    pub(crate) fn val(&self, v: ValueId, at: OpId) -> Result<Val<'ctx>, LlvmError> {
        self.vals.get(&v).cloned().ok_or_else(|| {
            self.internal(
                at,
                format!(
                    "{} is used before it is written",
                    kiln_ir::diag::value_words(self.k, at, v)
                ),
            )
        })
    }

    /// The value of scalar `v`.
    pub(crate) fn scalar(&self, v: ValueId, at: OpId) -> Result<BasicValueEnum<'ctx>, LlvmError> {
        match self.val(v, at)? {
            Val::Scalar(s) => Ok(s),
            Val::Tile(_) | Val::Smem { .. } => Err(self.internal(
                at,
                format!(
                    "{} is not a scalar",
                    kiln_ir::diag::value_words(self.k, at, v)
                ),
            )),
        }
    }

    /// The value of integer (or bool) scalar `v`.
    pub(crate) fn int(&self, v: ValueId, at: OpId) -> Result<IntValue<'ctx>, LlvmError> {
        match self.scalar(v, at)? {
            BasicValueEnum::IntValue(i) => Ok(i),
            _ => Err(self.internal(
                at,
                format!(
                    "{} is not an integer",
                    kiln_ir::diag::value_words(self.k, at, v)
                ),
            )),
        }
    }

    /// An internal error at op `at` (the passes promised otherwise), at the user's line.
    pub(crate) fn internal(&self, at: OpId, what: impl std::fmt::Display) -> LlvmError {
        Diagnostic::internal(
            self.loc(at),
            format!(
                "the LLVM backend failed on {}: {what}",
                kiln_ir::diag::op_words(self.k, at)
            ),
        )
        .into()
    }

    /// A form of op `at` this backend does not lower, at the user's line.
    pub(crate) fn unsupported(&self, at: OpId, what: &'static str) -> LlvmError {
        Diagnostic::unsupported(
            self.loc(at),
            format!(
                "the LLVM backend cannot lower {} yet: {what}",
                kiln_ir::diag::op_words(self.k, at)
            ),
        )
        .note("the PTX backend (`kiln_ptx::compile`) may lower it")
        .into()
    }

    fn loc(&self, at: OpId) -> Loc {
        self.k.ops.get(at).map(|o| o.loc).unwrap_or_default()
    }
}

/// What op `id` uses that this backend does not lower (u32 values, bit operations other than
/// `!`, `mulhi`, bitcasts, the transcendental functions), if anything: caught before any of it
/// is lowered, so the user reads their line rather than an internal error.
fn beyond_subset(k: &Kernel, id: OpId) -> Option<&'static str> {
    use kiln_ir::{BinaryOp, UnaryOp};
    let op = &k.ops[id];
    let u32_value = op
        .operands
        .iter()
        .chain(&op.results)
        .any(|&v| k.ty(v).dtype() == DType::U32);
    match &op.kind {
        _ if u32_value => Some("a u32 value"),
        OpKind::Bitcast { .. } => Some("`bitcast`"),
        OpKind::Unary(
            UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tanh | UnaryOp::Erf | UnaryOp::Sigmoid,
        ) => Some("sin, cos, tanh, erf and sigmoid"),
        // kiln's logarithms are accurate f64 sequences this backend does not write.
        OpKind::Unary(UnaryOp::Log2 | UnaryOp::Log) => Some("log and log2"),
        OpKind::Binary(
            BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr
            | BinaryOp::MulHi,
        ) => Some("a bit operation (`&`, `|`, `^`, `<<`, `>>`, `mulhi`)"),
        _ => None,
    }
}
