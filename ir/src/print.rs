//! The IR's text form, used in dumps, snapshots and diagnostics: one line per op, ending
//! with a comment naming the user's source location. Values print by handle (`%12`), so
//! verifier errors and PTX comments refer to the same names.

use std::fmt::Write;

use crate::kernel::{Block, Kernel, OpId, OpKind, Param, ValueId};

/// Column at which the source-location comment starts.
const LOC_COLUMN: usize = 64;

/// Prints a whole kernel:
///
/// ```text
/// kernel softmax(x: tensor<f32,2>, y: tensor_mut<f32,2,a16>) num_warps=4 {
///   %0 = block_id.x : i32                                   // examples/src/softmax.rs:14:13
///   %1 = load x[%0, %2] : rt<f32,4x1024>
///   %5 = for %3 = %a to %b step %c iter(%4 = %1) stages=2 -> (rt<f32,4x1024>) { ... }
/// }
/// ```
pub fn print_kernel(kernel: &Kernel) -> String {
    let mut out = String::new();
    let params: Vec<String> = kernel.params.iter().map(param_str).collect();
    // A cluster request, warp specialisation turned off, or a blocks-per-multiprocessor
    // request is printed only when made, so every other kernel prints as before (and the
    // disk cache, keyed by this text, tells the kernels apart).
    let cluster = match kernel.options.cluster {
        1 => String::new(),
        n => format!(" cluster={n}"),
    };
    let plain = if kernel.options.warp_specialize {
        ""
    } else {
        " warp_specialize=false"
    };
    let occupancy = match kernel.options.blocks_per_sm {
        1 => String::new(),
        n => format!(" blocks_per_sm={n}"),
    };
    let _ = writeln!(
        out,
        "kernel {}({}) num_warps={}{cluster}{plain}{occupancy} {{",
        kernel.name,
        params.join(", "),
        kernel.options.num_warps
    );
    for b in &kernel.schedule.buffers {
        let _ = writeln!(
            out,
            "  smem @{} : {} x {} B (row {} B{}) for {}",
            b.offset,
            b.stages,
            b.stage_bytes,
            b.row_bytes,
            if b.swizzled { ", swizzled" } else { "" },
            b.load
        );
    }
    for b in &kernel.schedule.slabs {
        let _ = writeln!(
            out,
            "  smem @{} : {} x {} B (each thread its own registers) for {}",
            b.offset, b.stages, b.stage_bytes, b.load
        );
    }
    for st in &kernel.schedule.staged {
        let b = &st.buffer;
        let _ = writeln!(
            out,
            "  smem @{} : {} B (row {} B{}) staging {}{} for {}{}",
            b.offset,
            b.stage_bytes,
            b.row_bytes,
            if b.swizzled { ", swizzled" } else { "" },
            st.source,
            if st.transposed { ".t" } else { "" },
            b.load,
            if st.at_source {
                ", once where loaded"
            } else {
                ""
            }
        );
    }
    for n in &kernel.schedule.notes {
        let _ = writeln!(out, "  note: {} ({})", n.text, n.loc);
    }
    for (op, plan) in &kernel.schedule.loops {
        let loads: Vec<String> = plan.prefetched.iter().map(|l| l.to_string()).collect();
        let _ = writeln!(
            out,
            "  pipeline {op}: stages={} prefetch [{}]",
            plan.stages,
            loads.join(", ")
        );
    }
    if let Some(sched) = &kernel.schedule.sched {
        let _ = writeln!(out, "{sched}");
        if let Some(o) = &sched.overlap {
            let _ = writeln!(
                out,
                "    mma tiles: head {}, tail {}",
                mma_shape(kernel, o.head),
                mma_shape(kernel, o.tail)
            );
        }
    }
    print_block(kernel, &kernel.body, 1, &mut out);
    out.push_str("}\n");
    out
}

/// `MxNxK` of an `mma` op (its result is `M x N`; its A operand `M x K`).
fn mma_shape(kernel: &Kernel, op: OpId) -> String {
    let o = &kernel.ops[op];
    let dims = |v: ValueId| kernel.ty(v).shape().map(|s| s.dims().to_vec());
    match (
        o.results.first().and_then(|&r| dims(r)),
        o.operands.first().and_then(|&a| dims(a)),
    ) {
        (Some(mn), Some(mk)) if mn.len() == 2 && mk.len() == 2 => {
            format!("{}x{}x{}", mn[0], mn[1], mk[1])
        }
        _ => "?".to_string(),
    }
}

/// Prints one parameter as in the kernel header.
pub fn param_str(p: &Param) -> String {
    match p {
        Param::Tensor {
            name,
            dtype,
            rank,
            mutable,
            aligned16,
        } => format!(
            "{name}: {}<{dtype},{rank}{}>",
            if *mutable { "tensor_mut" } else { "tensor" },
            if *aligned16 { ",a16" } else { "" }
        ),
        Param::Scalar { name, dtype } => format!("{name}: {dtype}"),
    }
}

/// Prints one operation as it appears in a dump, without nested regions and without the
/// trailing source-location comment.
pub fn op_str(kernel: &Kernel, op: OpId) -> String {
    let mut out = String::new();
    print_op(kernel, op, 0, &mut out, false);
    out.trim_end().to_string()
}

fn print_block(kernel: &Kernel, block: &Block, level: usize, out: &mut String) {
    for &op in &block.ops {
        print_op(kernel, op, level, out, true);
    }
}

fn values(vs: &[ValueId]) -> String {
    vs.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_op(kernel: &Kernel, id: OpId, level: usize, out: &mut String, regions: bool) {
    let op = &kernel.ops[id];
    let indent = "  ".repeat(level);
    let mut line = indent.clone();
    if !op.results.is_empty() && !matches!(op.kind, OpKind::For { .. } | OpKind::If) {
        let _ = write!(line, "{} = ", values(&op.results));
    }
    let ops = &op.operands;
    let tensor_name = |i: usize| kernel.params.get(i).map_or("?", |p| p.name()).to_string();
    match &op.kind {
        OpKind::Const(c) => {
            let _ = write!(line, "const {c}");
        }
        OpKind::ScalarParam(i) => {
            let _ = write!(line, "param {}", tensor_name(*i));
        }
        OpKind::BlockId(a) => {
            let _ = write!(line, "block_id.{}", a.name());
        }
        OpKind::GridDim(a) => {
            let _ = write!(line, "grid_dim.{}", a.name());
        }
        OpKind::TensorDim { tensor, dim } => {
            let _ = write!(line, "dim {}.{dim}", tensor_name(*tensor));
        }
        OpKind::Unary(u) => {
            let _ = write!(line, "{} {}", u.name(), values(ops));
        }
        OpKind::Binary(b) => {
            let _ = write!(line, "{} {}", b.name(), values(ops));
        }
        OpKind::Select => {
            let _ = write!(line, "select {}", values(ops));
        }
        OpKind::Cast { to } => {
            let _ = write!(line, "cast {} to {to}", values(ops));
        }
        OpKind::Take { dim } => {
            let _ = write!(line, "take dim {dim} {}", values(ops));
        }
        OpKind::Bitcast { to } => {
            let _ = write!(line, "bitcast {} to {to}", values(ops));
        }
        OpKind::Splat { shape } => {
            let _ = write!(line, "splat {} [{shape}]", values(ops));
        }
        OpKind::Iota { shape, dim } => {
            let _ = write!(line, "iota [{shape}] dim {dim}");
        }
        OpKind::Reshape { shape } => {
            let _ = write!(line, "reshape {} [{shape}]", values(ops));
        }
        OpKind::Transpose => {
            let _ = write!(line, "transpose {}", values(ops));
        }
        OpKind::Permute { perm } => {
            let _ = write!(line, "permute {} {perm:?}", values(ops));
        }
        OpKind::Convert => {
            let _ = write!(line, "convert {}", values(ops));
        }
        OpKind::Reduce { op: r, dim } => {
            let _ = write!(line, "reduce.{} {} dim {dim}", r.name(), values(ops));
        }
        OpKind::Mma => {
            let _ = write!(line, "mma {}", values(ops));
        }
        OpKind::Load { tensor, shape } => {
            let _ = write!(
                line,
                "load {}[{}] [{shape}]",
                tensor_name(*tensor),
                values(ops)
            );
        }
        OpKind::LoadScalar { tensor } => {
            let _ = write!(
                line,
                "load_scalar {}[{}]",
                tensor_name(*tensor),
                values(ops)
            );
        }
        OpKind::Store { tensor, bound } => {
            // The verifier prints malformed ops too: split what is there.
            let limit = usize::from(bound.is_some()).min(ops.len());
            let rank = (ops.len() - limit).saturating_sub(1);
            let _ = write!(
                line,
                "store {}[{}], {}",
                tensor_name(*tensor),
                values(&ops[..rank]),
                values(&ops[rank..ops.len() - limit])
            );
            if let Some(dim) = bound {
                let _ = write!(
                    line,
                    " bounded dim {dim} < {}",
                    values(&ops[ops.len() - limit..])
                );
            }
        }
        OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
            let _ = write!(line, "{}", access_str(op, &tensor_name));
        }
        OpKind::ScalarAtomic {
            tensor,
            op: a,
            sem,
            scope,
        } => {
            // `scalar_atomic.add.relaxed.gpu c[%1], %2`; the verifier prints malformed ops
            // too, so the split is only by what is there.
            let rank = crate::entities::tensor_param(&kernel.params, *tensor)
                .map_or(0, |(_, r, _)| r)
                .min(ops.len());
            let _ = write!(
                line,
                "scalar_atomic.{}.{}.{} {}[{}], {}",
                a.name(),
                sem.name(),
                scope.name(),
                tensor_name(*tensor),
                values(&ops[..rank]),
                values(&ops[rank..])
            );
        }
        OpKind::For { stages } => {
            if !op.results.is_empty() {
                let _ = write!(line, "{} = ", values(&op.results));
            }
            let args = op
                .regions
                .first()
                .map(|b| b.args.clone())
                .unwrap_or_default();
            let iv = args.first().map_or("?".to_string(), |v| v.to_string());
            // `get`, not indexing: the verifier prints malformed ops in its errors too.
            let bound = |i: usize| ops.get(i).map_or("?".to_string(), |v| v.to_string());
            let _ = write!(
                line,
                "for {iv} = {} to {} step {}",
                bound(0),
                bound(1),
                bound(2)
            );
            if ops.len() > 3 {
                let iters: Vec<String> = args
                    .iter()
                    .skip(1)
                    .zip(&ops[3..])
                    .map(|(a, i)| format!("{a} = {i}"))
                    .collect();
                let _ = write!(line, " iter({})", iters.join(", "));
            }
            if let Some(s) = stages {
                let _ = write!(line, " stages={s}");
            }
        }
        OpKind::If => {
            if !op.results.is_empty() {
                let _ = write!(line, "{} = ", values(&op.results));
            }
            let _ = write!(line, "if {}", values(ops));
        }
        OpKind::Yield => {
            let _ = write!(line, "yield {}", values(ops));
        }
        OpKind::Print { pieces, elements } => {
            let args: Vec<String> = ops
                .iter()
                .zip(elements)
                .map(|(v, e)| match e {
                    Some(idx) => format!("{v}{idx:?}"),
                    None => v.to_string(),
                })
                .collect();
            let _ = write!(line, "print {:?}", pieces.join("{}"));
            if !args.is_empty() {
                let _ = write!(line, ", {}", args.join(", "));
            }
        }
    }
    let tys: Vec<String> = op
        .results
        .iter()
        .map(|&r| match kernel.schedule.layouts.get(&r) {
            Some(layout) => {
                let ty = kernel.ty(r).to_string();
                format!("{},{layout}>", ty.trim_end_matches('>'))
            }
            None => kernel.ty(r).to_string(),
        })
        .collect();
    if !tys.is_empty() {
        if matches!(op.kind, OpKind::For { .. } | OpKind::If) {
            let _ = write!(line, " -> ({})", tys.join(", "));
        } else {
            let _ = write!(line, " : {}", tys.join(", "));
        }
    }
    let has_regions = regions && !op.regions.is_empty();
    if has_regions {
        line.push_str(" {");
    }
    // A single op (`op_str`, used in PTX comments and verifier errors) names its location elsewhere.
    if regions && op.loc.is_known() && !matches!(op.kind, OpKind::Yield) {
        let pad = LOC_COLUMN.saturating_sub(line.len()).max(1);
        let _ = write!(line, "{:pad$}// {}:{}", "", op.loc.file, op.loc.line);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    if has_regions {
        for (i, block) in op.regions.iter().enumerate() {
            if i > 0 {
                let _ = writeln!(out, "{indent}}} else {{");
            }
            print_block(kernel, block, level + 1, out);
        }
        let _ = writeln!(out, "{indent}}}");
    }
}

/// An addressed memory op's text: `gather x[%1, idx %2] mask %3 other %4 [64x32]`,
/// `scatter y[..], %5`, `atomic.add.relaxed.gpu h[idx %2], %5 mask %3`.
fn access_str(op: &crate::kernel::Op, tensor_name: &dyn Fn(usize) -> String) -> String {
    use crate::kernel::Addr;
    let (tensor, head) = match &op.kind {
        OpKind::Gather { tensor, .. } => (*tensor, "gather".to_string()),
        OpKind::Scatter { tensor, .. } => (*tensor, "scatter".to_string()),
        OpKind::Atomic {
            tensor,
            op: a,
            sem,
            scope,
            ..
        } => (
            *tensor,
            format!("atomic.{}.{}.{}", a.name(), sem.name(), scope.name()),
        ),
        _ => return String::new(),
    };
    let (
        Some(parts),
        OpKind::Gather { access, .. }
        | OpKind::Scatter { access, .. }
        | OpKind::Atomic { access, .. },
    ) = (op.access_operands(), &op.kind)
    else {
        // The verifier prints malformed ops too.
        let ops: Vec<String> = op.operands.iter().map(|v| v.to_string()).collect();
        return format!(
            "{head} {}[{}] (malformed)",
            tensor_name(tensor),
            ops.join(", ")
        );
    };
    let addr: Vec<String> = access
        .dims
        .iter()
        .zip(parts.addr)
        .map(|(a, v)| match a {
            Addr::Coord => v.to_string(),
            Addr::Index => format!("idx {v}"),
        })
        .collect();
    let mut s = format!("{head} {}[{}]", tensor_name(tensor), addr.join(", "));
    for v in [parts.compare, parts.value].into_iter().flatten() {
        s.push_str(&format!(", {v}"));
    }
    if let Some(m) = parts.mask {
        s.push_str(&format!(" mask {m}"));
    }
    if let Some(o) = parts.other {
        s.push_str(&format!(" other {o}"));
    }
    if let OpKind::Gather { shape, .. } = &op.kind {
        s.push_str(&format!(" [{shape}]"));
    }
    s
}
