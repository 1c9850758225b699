//! The `strip_mine` pass: a tile too large for a thread's registers becomes a runtime loop
//! over chunks of it, so the code a backend writes grows with the kernel, not with its tiles.
//!
//! It runs on the semantic IR, after `canonicalize` and before `layout`. A tile over
//! [`TRIGGER_PER_THREAD`] elements a thread, with every op reading or making a tile of its
//! extent along the chunked dimension, is rewritten into loops over chunks of at most
//! [`CHUNK_PER_THREAD`] elements a thread; reductions along it become loop-carried partials.
//! What is chunked, what keeps its whole tile and why: `docs/pipeline.md`, "Inside the passes".

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::Diagnostic;
use crate::kernel::{
    Addr, BinaryOp, Block, Const, Kernel, Loc, OpId, OpKind, ReduceOp, ValueDef, ValueId,
};
use crate::target::Target;
use crate::types::{DType, Shape, Type};

use super::edit::{add, add1, close_loop, constant, open_loop, substitute};
use super::walk::ops_in_order;

/// A tile holding more elements than this per thread is chunked. Small enough that a
/// kernel with a few such tiles live fits the register file; large enough that every tile
/// kiln's kernels were written with before (at most `[1, 4096]` over 4 warps: 32) stays
/// whole.
pub const TRIGGER_PER_THREAD: usize = 64;

/// The most elements a thread holds of the largest chunk of a component.
pub const CHUNK_PER_THREAD: usize = 16;

/// A bound on a chunk loop's body, in element operations a thread (see `code_weight`).
pub const CODE_PER_LOOP: usize = 1536;

/// Roughly how many instructions an op takes per element a thread holds: the math
/// sequences of `ir/src/math.rs` (sine's range reduction, erf's polynomial) are long.
fn code_weight(kind: &OpKind) -> usize {
    use crate::kernel::UnaryOp;
    match kind {
        OpKind::Unary(UnaryOp::Sin | UnaryOp::Cos) => 40,
        OpKind::Unary(UnaryOp::Tanh | UnaryOp::Erf | UnaryOp::Sigmoid) => 20,
        OpKind::Unary(UnaryOp::Exp | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt) => 4,
        OpKind::Binary(BinaryOp::Div | BinaryOp::Rem) => 8,
        _ => 1,
    }
}

/// The register bytes a thread can give one tile: 255 32-bit registers.
pub const REGISTER_BYTES: usize = 255 * 4;

/// Chunks every component that can be and checks the remaining tiles against the budgets.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    let threads = 32 * kernel.options.num_warps.max(1) as usize;
    let written = written_tensors(kernel);
    let mut failed = Vec::new();
    let body = std::mem::take(&mut kernel.body);
    let body = process_block(kernel, body, threads, &written, &mut failed)?;
    kernel.body = body;
    crate::verify::verify(kernel).map_err(|errs| {
        // At the user's op the first broken invariant names, as the verify pass reports.
        let loc = errs
            .errors
            .first()
            .and_then(|e| kernel.ops.get(e.op))
            .map_or(Loc::default(), |o| o.loc);
        Diagnostic::internal(loc, "strip_mine broke the IR").note(errs.to_string())
    })?;
    check_budgets(kernel, target, threads, &failed)
}

/// Why a component keeps its whole tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Keep {
    /// It feeds or is an `mma` (whose operands and accumulators have their own lowering).
    Mma,
    /// Any other reason, in the DSL's words.
    Other(String),
}

/// A component that could not be chunked: its values and why.
struct Failed {
    values: BTreeSet<ValueId>,
    why: Keep,
}

/// A component to chunk: its values with their chunked dimension, its ops, extent and chunk.
/// `ops` are ops of the block (a loop carrying one of its tiles among them); `inner` the ops
/// of such loops' bodies that read or make its tiles.
struct Component {
    dims: BTreeMap<ValueId, usize>,
    ops: BTreeSet<OpId>,
    inner: BTreeSet<OpId>,
    extent: usize,
    chunk: usize,
}

/// Where a value of a component lives, seen from the block being chunked.
#[derive(Clone, Copy)]
enum Site {
    /// Made by an op of the block.
    Block(OpId),
    /// Made by an op of the body of one of the block's loops.
    Body(OpId),
    /// Carried by the block's loop `.0` in its slot `.1` (its initial value, body argument,
    /// yielded value and result).
    Carried(OpId, usize),
}

/// Why a loop of the block cannot carry chunks of a tile, if it cannot: its body runs once per
/// chunk, so it may not print or update memory atomically (each chunk would repeat it), nest
/// a loop or branch, or be a pipelined mma loop. (Its stores must be of chunks:
/// [`loop_writes_refusal`].)
fn loop_refusal(kernel: &Kernel, f: OpId) -> Option<&'static str> {
    let o = &kernel.ops[f];
    if o.kind != (OpKind::For { stages: None }) {
        return Some("a tile carried around a pipelined loop");
    }
    let body = o.regions.first()?;
    for &b in &body.ops {
        let bo = &kernel.ops[b];
        if !bo.regions.is_empty() {
            return Some("a tile carried around a loop that nests a loop or branch");
        }
        if matches!(
            bo.kind,
            OpKind::Atomic { .. } | OpKind::ScalarAtomic { .. } | OpKind::Print { .. }
        ) {
            return Some("a tile carried around a loop that updates memory atomically or prints");
        }
    }
    None
}

/// Why loop `f`, carrying chunks with `inner` the ops of its body on them, cannot run once
/// per chunk because of what it writes, if it cannot: a store of a whole tile would be
/// repeated, and a tensor the body both writes and reads would be read in another order
/// (all iterations of one chunk, then the next).
fn loop_writes_refusal(kernel: &Kernel, f: OpId, inner: &BTreeSet<OpId>) -> Option<&'static str> {
    let body = kernel.ops[f].regions.first()?;
    let mut reads = BTreeSet::new();
    let mut writes = BTreeSet::new();
    for &b in &body.ops {
        let e = Effects::of(kernel, b);
        if !e.writes.is_empty() && !inner.contains(&b) {
            return Some("a tile carried around a loop that stores a tile it does not chunk");
        }
        reads.extend(e.reads);
        writes.extend(e.writes);
    }
    (!reads.is_disjoint(&writes))
        .then_some("a tile carried around a loop that reads a tensor it writes")
}

fn process_block(
    kernel: &mut Kernel,
    mut block: Block,
    threads: usize,
    written: &BTreeSet<usize>,
    failed: &mut Vec<Failed>,
) -> Result<Block, Diagnostic> {
    for &op in &block.ops {
        let regions = std::mem::take(&mut kernel.ops[op].regions);
        let mut done = Vec::with_capacity(regions.len());
        for r in regions {
            done.push(process_block(kernel, r, threads, written, failed)?);
        }
        kernel.ops[op].regions = done;
    }
    let mut tried: BTreeSet<ValueId> = BTreeSet::new();
    loop {
        let seed = block.ops.iter().find_map(|&op| {
            kernel.ops[op].results.iter().copied().find(|&v| {
                !tried.contains(&v) && per_thread(kernel, v, threads) > TRIGGER_PER_THREAD
            })
        });
        let Some(seed) = seed else {
            return Ok(block);
        };
        match component(kernel, &block, seed, threads) {
            Ok(c) if c.extent / c.chunk <= 1 => {
                tried.extend(c.dims.keys().copied());
            }
            Ok(c) => match rewrite(kernel, &block, &c, written)? {
                Ok(b) => block = b,
                Err(why) => {
                    tried.extend(c.dims.keys().copied());
                    failed.push(Failed {
                        values: c.dims.keys().copied().collect(),
                        why: Keep::Other(why),
                    });
                }
            },
            Err((values, why)) => {
                tried.extend(values.iter().copied());
                tried.insert(seed);
                failed.push(Failed { values, why });
            }
        }
    }
}

/// Elements of tile `v` a thread holds when the block's threads share it evenly.
fn per_thread(kernel: &Kernel, v: ValueId, threads: usize) -> usize {
    kernel
        .ty(v)
        .shape()
        .map_or(0, |s| s.numel().div_ceil(threads))
}

/// Tensors some op of the kernel writes.
fn written_tensors(kernel: &Kernel) -> BTreeSet<usize> {
    ops_in_order(kernel)
        .into_iter()
        .filter_map(|o| match kernel.ops[o].kind {
            OpKind::Store { tensor, .. }
            | OpKind::Scatter { tensor, .. }
            | OpKind::Atomic { tensor, .. } => Some(tensor),
            _ => None,
        })
        .collect()
}

/// Per op of `block`, the values it reads, those of its regions included.
fn captured(kernel: &Kernel, op: OpId, out: &mut Vec<ValueId>) {
    out.extend(kernel.ops[op].operands.iter().copied());
    for r in &kernel.ops[op].regions {
        for &o in &r.ops {
            captured(kernel, o, out);
        }
    }
}

/// The tensors an op (and its regions) reads and writes, and whether it prints.
#[derive(Default)]
struct Effects {
    reads: BTreeSet<usize>,
    writes: BTreeSet<usize>,
    prints: bool,
}

impl Effects {
    fn of(kernel: &Kernel, op: OpId) -> Effects {
        let mut e = Effects::default();
        e.add(kernel, op);
        e
    }

    fn add(&mut self, kernel: &Kernel, op: OpId) {
        match kernel.ops[op].kind {
            OpKind::Load { tensor, .. }
            | OpKind::LoadScalar { tensor }
            | OpKind::Gather { tensor, .. } => {
                self.reads.insert(tensor);
            }
            OpKind::Store { tensor, .. } | OpKind::Scatter { tensor, .. } => {
                self.writes.insert(tensor);
            }
            OpKind::Atomic { tensor, .. } => {
                self.reads.insert(tensor);
                self.writes.insert(tensor);
            }
            OpKind::Print { .. } => self.prints = true,
            _ => {}
        }
        for r in &kernel.ops[op].regions {
            for &o in &r.ops {
                self.add(kernel, o);
            }
        }
    }

    fn conflicts(&self, other: &Effects) -> bool {
        (self.prints && other.prints)
            || self
                .writes
                .iter()
                .any(|t| other.writes.contains(t) || other.reads.contains(t))
            || self.reads.iter().any(|t| other.writes.contains(t))
    }
}

type Found = (BTreeSet<ValueId>, Keep);

/// The component of `seed` (see `docs/pipeline.md`), or its values so far and why it cannot be
/// chunked.
fn component(
    kernel: &Kernel,
    block: &Block,
    seed: ValueId,
    threads: usize,
) -> Result<Component, Found> {
    let in_block: BTreeSet<OpId> = block.ops.iter().copied().collect();
    let mut uses: BTreeMap<ValueId, Vec<OpId>> = BTreeMap::new();
    // Uses anywhere under an op of the block count as that op's.
    for &op in &block.ops {
        let mut vs = Vec::new();
        captured(kernel, op, &mut vs);
        for v in vs {
            uses.entry(v).or_default().push(op);
        }
    }
    // The ops of the block's loops' bodies, by loop, and their uses (a loop of the block may
    // carry chunks of the component: its body then runs once per chunk).
    let mut body_of: BTreeMap<OpId, OpId> = BTreeMap::new();
    let mut body_uses: BTreeMap<ValueId, Vec<OpId>> = BTreeMap::new();
    for &op in &block.ops {
        if let (OpKind::For { .. }, Some(body)) =
            (&kernel.ops[op].kind, kernel.ops[op].regions.first())
        {
            for &b in &body.ops {
                body_of.insert(b, op);
                for &x in &kernel.ops[b].operands {
                    body_uses.entry(x).or_default().push(b);
                }
            }
        }
    }
    let site = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(op, _) if in_block.contains(&op) => Some(Site::Block(op)),
        ValueDef::Op(op, _) => body_of.contains_key(&op).then_some(Site::Body(op)),
        ValueDef::BlockArg {
            op,
            region: 0,
            index,
        } if index > 0
            && in_block.contains(&op)
            && matches!(kernel.ops[op].kind, OpKind::For { .. }) =>
        {
            Some(Site::Carried(op, index - 1))
        }
        ValueDef::BlockArg { .. } => None,
    };
    // The four values of loop `f`'s carried slot `i`.
    let slot = |f: OpId, i: usize| -> Vec<ValueId> {
        let o = &kernel.ops[f];
        let body = &o.regions[0];
        let yielded = body.ops.last().and_then(|&y| kernel.ops[y].operands.get(i));
        [
            o.operands.get(3 + i),
            body.args.get(1 + i),
            yielded,
            o.results.get(i),
        ]
        .into_iter()
        .flatten()
        .copied()
        .collect()
    };
    let shape = kernel
        .ty(seed)
        .shape()
        .cloned()
        .unwrap_or(Shape(Vec::new()));
    // The widest dimension; of two equal ones the outer (the last maximum of the reversed
    // order), so chunks of whole rows keep each row's contiguous run.
    let d0 = (0..shape.rank())
        .rev()
        .max_by_key(|&i| shape.dims()[i])
        .unwrap_or(0);
    let extent = shape.dims().get(d0).copied().unwrap_or(1);
    let mut dims: BTreeMap<ValueId, usize> = BTreeMap::new();
    let mut ops: BTreeSet<OpId> = BTreeSet::new();
    let mut inner: BTreeSet<OpId> = BTreeSet::new();
    let mut work = vec![(seed, d0)];
    let fail = |dims: &BTreeMap<ValueId, usize>, why: Keep| -> Found {
        let mut vs: BTreeSet<ValueId> = dims.keys().copied().collect();
        vs.insert(seed);
        (vs, why)
    };
    let other = |s: &str| Keep::Other(s.to_string());
    while let Some((v, d)) = work.pop() {
        match dims.get(&v) {
            Some(&e) if e == d => continue,
            Some(_) => {
                return Err(fail(
                    &dims,
                    other("the tile is reshaped or transposed so that its long dimension changes"),
                ));
            }
            None => {}
        }
        if kernel.ty(v).shape().and_then(|s| s.dims().get(d).copied()) != Some(extent) {
            return Err(fail(&dims, other("its tiles do not share the long extent")));
        }
        dims.insert(v, d);
        // The ops to follow `v` through: those of the block (`outer`), those of a loop body
        // (`body`), and the loops carrying it (`slots`).
        let mut outer: Vec<OpId> = Vec::new();
        let mut body: Vec<OpId> = Vec::new();
        let mut slots: Vec<(OpId, usize)> = Vec::new();
        let at = site(v);
        match at {
            Some(Site::Block(op)) if matches!(kernel.ops[op].kind, OpKind::For { .. }) => {
                let i = kernel.ops[op].results.iter().position(|&r| r == v);
                slots.extend(i.map(|i| (op, i)));
            }
            Some(Site::Block(op)) => outer.push(op),
            Some(Site::Body(op)) => body.push(op),
            Some(Site::Carried(f, i)) => slots.push((f, i)),
            None if matches!(kernel.values[v].def, ValueDef::BlockArg { .. }) => {
                return Err(fail(&dims, other("a tile carried around a loop")));
            }
            None => {
                return Err(fail(
                    &dims,
                    other("a tile made outside the loop or branch reading it"),
                ));
            }
        }
        if matches!(at, Some(Site::Block(_))) {
            for &op in uses.get(&v).into_iter().flatten() {
                let o = &kernel.ops[op];
                if o.regions.is_empty() {
                    outer.push(op);
                    continue;
                }
                // A loop reading it: as its initial value, and inside its body (not inside
                // a branch or loop of its body, which would run per chunk too).
                let nested = o.regions.iter().flat_map(|r| &r.ops).any(|&b| {
                    let mut vs = Vec::new();
                    if !kernel.ops[b].regions.is_empty() {
                        captured(kernel, b, &mut vs);
                    }
                    vs.contains(&v)
                });
                if nested || !matches!(o.kind, OpKind::For { .. }) {
                    return Err(fail(
                        &dims,
                        other("a tile read inside a nested loop or branch"),
                    ));
                }
                for (i, &x) in o.operands.iter().enumerate().skip(3) {
                    if x == v {
                        slots.push((op, i - 3));
                    }
                }
                body.extend(body_uses.get(&v).into_iter().flatten().copied());
            }
        } else {
            body.extend(body_uses.get(&v).into_iter().flatten().copied());
        }
        let visits = outer
            .into_iter()
            .map(|op| (op, None))
            .chain(body.into_iter().map(|op| (op, Some(body_of[&op]))));
        for (op, in_loop) in visits {
            let o = &kernel.ops[op];
            match in_loop {
                None if !o.regions.is_empty() => {
                    return Err(fail(
                        &dims,
                        other("a tile read inside a nested loop or branch"),
                    ));
                }
                None => {}
                Some(f) => {
                    if let Some(why) = loop_refusal(kernel, f) {
                        return Err(fail(&dims, other(why)));
                    }
                    // The loop runs once per chunk whether it carries chunks or only reads
                    // them in its body.
                    ops.insert(f);
                    if o.kind == OpKind::Yield {
                        for (i, &x) in o.operands.iter().enumerate() {
                            if x == v {
                                slots.push((f, i));
                            }
                        }
                        continue;
                    }
                    if matches!(o.kind, OpKind::Reduce { dim, .. } if dim == d && o.operands[0] == v)
                    {
                        return Err(fail(
                            &dims,
                            other(
                                "a reduction along its long dimension inside the loop carrying it",
                            ),
                        ));
                    }
                }
            }
            match members(kernel, op, v, d, extent) {
                Ok(ms) => {
                    if in_loop.is_some() {
                        inner.insert(op);
                    } else {
                        ops.insert(op);
                    }
                    work.extend(ms);
                }
                Err(why) => return Err(fail(&dims, why)),
            }
        }
        for (f, i) in slots {
            if let Some(why) = loop_refusal(kernel, f) {
                return Err(fail(&dims, other(why)));
            }
            ops.insert(f);
            work.extend(slot(f, i).into_iter().map(|x| (x, d)));
        }
    }
    for &f in &ops {
        if !matches!(kernel.ops[f].kind, OpKind::For { .. }) {
            continue;
        }
        if let Some(why) = loop_writes_refusal(kernel, f, &inner) {
            return Err(fail(&dims, other(why)));
        }
        // The loop moves into the chunk loop: what else it carries would be its last
        // chunk's, and out of reach after it.
        let o = &kernel.ops[f];
        if o.results
            .iter()
            .any(|r| !dims.contains_key(r) && uses.contains_key(r))
        {
            return Err(fail(
                &dims,
                other(
                    "a tile read inside a loop whose other loop-carried values are read after it",
                ),
            ));
        }
    }
    let largest = dims
        .keys()
        .filter_map(|&v| kernel.ty(v).shape().map(Shape::numel))
        .max()
        .unwrap_or(1);
    // Elements a thread holds of the largest chunk: CHUNK_PER_THREAD, halved while the loop
    // body's code (its ops, the long math sequences weighing more) would exceed
    // CODE_PER_LOOP instructions a thread.
    let weight: usize = ops
        .iter()
        .chain(&inner)
        .map(|&o| code_weight(&kernel.ops[o].kind))
        .sum();
    let mut per = CHUNK_PER_THREAD;
    while per > 1 && per * weight > CODE_PER_LOOP {
        per /= 2;
    }
    // The chunk: the largest power of two dividing the extent whose largest chunk tile has
    // at most `per` elements a thread.
    let bound = (per * threads * extent / largest).max(1);
    let mut chunk = 1;
    while chunk * 2 <= bound && extent.is_multiple_of(chunk * 2) {
        chunk *= 2;
    }
    Ok(Component {
        dims,
        ops,
        inner,
        extent,
        chunk,
    })
}

/// The values of `op` chunked with `v` (chunked along `d`), with their dimensions; or why
/// `op` cannot run on chunks.
fn members(
    kernel: &Kernel,
    op: OpId,
    v: ValueId,
    d: usize,
    extent: usize,
) -> Result<Vec<(ValueId, usize)>, Keep> {
    let o = &kernel.ops[op];
    let long = |x: ValueId, dim: usize| {
        kernel
            .ty(x)
            .shape()
            .and_then(|s| s.dims().get(dim).copied())
            == Some(extent)
    };
    let rank = |x: ValueId| kernel.ty(x).shape().map_or(0, Shape::rank);
    // Tiles of the op that are long along `dim` in the result's space (equal ranks).
    let same_space = |vals: &[ValueId], dim: usize| -> Result<Vec<(ValueId, usize)>, Keep> {
        let mut out = Vec::new();
        for &x in vals {
            if rank(x) == 0 {
                continue;
            }
            if rank(x) != rank(v) {
                return Err(Keep::Other(
                    "an operand of another rank than the tile it is combined with".into(),
                ));
            }
            if long(x, dim) {
                out.push((x, dim));
            }
        }
        Ok(out)
    };
    let other = |s: &str| Keep::Other(s.to_string());
    // Chunks are cut along a dimension of a 1-D or 2-D tile; a tile of more dimensions keeps
    // its whole extent (its reshapes and permutes may move any dimension).
    if rank(v) > 2 {
        return Err(other("a tile of more than two dimensions"));
    }
    match &o.kind {
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Select
        | OpKind::Cast { .. }
        | OpKind::Bitcast { .. }
        | OpKind::Splat { .. }
        | OpKind::Iota { .. }
        | OpKind::Load { .. } => {
            let all: Vec<ValueId> = o.operands.iter().chain(&o.results).copied().collect();
            same_space(&all, d)
        }
        OpKind::Store { .. } => {
            let value = o.store_operands().map(|p| p.value);
            Ok(value
                .filter(|&x| long(x, d))
                .map(|x| (x, d))
                .into_iter()
                .collect())
        }
        OpKind::Gather { access, .. }
        | OpKind::Scatter { access, .. }
        | OpKind::Atomic { access, .. } => {
            let parts = o
                .access_operands()
                .ok_or_else(|| other("malformed access"))?;
            // An index tile long along the chunked dimension is chunked with the rest (each
            // chunk's elements read their own indices); one broadcast along it serves every
            // chunk whole.
            let indices = parts
                .addr
                .iter()
                .zip(&access.dims)
                .filter(|&(_, a)| *a == Addr::Index)
                .map(|(&x, _)| x);
            let tiles: Vec<ValueId> = parts
                .compare
                .into_iter()
                .chain(parts.value)
                .chain(parts.mask)
                .chain(indices)
                .chain(o.results.iter().copied())
                .collect();
            same_space(&tiles, d)
        }
        OpKind::Reshape { .. } => {
            let (x, r) = (o.operands[0], o.results[0]);
            let (from, to, dd) = if v == x { (x, r, d) } else { (r, x, d) };
            let ordinal = non_unit(kernel, from).iter().position(|&i| i == dd);
            match ordinal.and_then(|k| non_unit(kernel, to).get(k).copied()) {
                Some(td) => Ok(vec![
                    (x, if v == x { d } else { td }),
                    (r, if v == x { td } else { d }),
                ]),
                None => Err(other("a reshape of the long dimension")),
            }
        }
        OpKind::Transpose => Ok(
            vec![(o.operands[0], 1 - d.min(1)), (o.results[0], 1 - d.min(1))]
                .into_iter()
                .map(|(x, dd)| if x == v { (x, d) } else { (x, dd) })
                .collect(),
        ),
        OpKind::Reduce { dim, .. } => {
            let (x, r) = (o.operands[0], o.results[0]);
            if v == x {
                if *dim == d {
                    Ok(vec![(x, d)])
                } else {
                    Ok(vec![(x, d), (r, d - usize::from(*dim < d))])
                }
            } else {
                // The result is long: the operand is long along the kept dimension.
                Ok(vec![(x, 1 - *dim), (r, d)])
            }
        }
        OpKind::Take { .. } => Err(other("a gather inside a tile (`take`)")),
        OpKind::Permute { .. } => Err(other("a permute")),
        OpKind::ScalarAtomic { .. } => Err(other("a scalar atomic")),
        OpKind::Mma => Err(Keep::Mma),
        OpKind::Print { .. } => Err(other("a `print` of one of its elements")),
        OpKind::Yield => Err(other("a tile passed out of a loop or branch")),
        OpKind::For { .. } | OpKind::If => Err(other("a tile read inside a nested loop or branch")),
        OpKind::Convert => Err(other("a layout conversion")),
        OpKind::Const(_)
        | OpKind::ScalarParam(_)
        | OpKind::BlockId(_)
        | OpKind::GridDim(_)
        | OpKind::TensorDim { .. }
        | OpKind::LoadScalar { .. } => Err(other("an op that makes no tile")),
    }
}

/// The dimensions of tile `v` whose extent is not 1.
fn non_unit(kernel: &Kernel, v: ValueId) -> Vec<usize> {
    kernel.ty(v).shape().map_or(Vec::new(), |s| {
        (0..s.rank()).filter(|&i| s.dims()[i] != 1).collect()
    })
}

/// A reduction of the component along its chunked dimension: an exit.
fn is_exit(kernel: &Kernel, c: &Component, op: OpId) -> bool {
    let o = &kernel.ops[op];
    matches!(o.kind, OpKind::Reduce { dim, .. }
        if c.dims.get(&o.operands[0]) == Some(&dim) && !c.dims.contains_key(&o.results[0]))
}

/// Whether `a` and `b` are a `load` and a `store` of the same elements (the same tensor,
/// coordinates and shape: an in-place update). In one chunk loop each chunk then reads and
/// writes only its own elements, in the order the whole tile did.
fn same_elements(kernel: &Kernel, a: OpId, b: OpId) -> bool {
    let io = |x: OpId, y: OpId| {
        let (l, s) = (&kernel.ops[x], &kernel.ops[y]);
        let (OpKind::Load { tensor, shape }, Some(p)) = (&l.kind, s.store_operands()) else {
            return false;
        };
        matches!(s.kind, OpKind::Store { tensor: t, bound: None } if t == *tensor)
            && p.coords.len() == l.operands.len()
            && p.coords
                .iter()
                .zip(&l.operands)
                .all(|(&u, &v)| same_scalar(kernel, u, v))
            && kernel.ty(p.value).shape() == Some(shape)
    };
    io(a, b) || io(b, a)
}

/// Whether scalars `u` and `v` are one value: the same, or equal constants of one type.
fn same_scalar(kernel: &Kernel, u: ValueId, v: ValueId) -> bool {
    let konst = |x: ValueId| match kernel.values[x].def {
        ValueDef::Op(op, _) => match kernel.ops[op].kind {
            OpKind::Const(c) => Some(c),
            _ => None,
        },
        ValueDef::BlockArg { .. } => None,
    };
    u == v || (kernel.ty(u) == kernel.ty(v) && konst(u).is_some() && konst(u) == konst(v))
}

/// Whether `op` can be recomputed in a later loop: it writes nothing and reads only tensors
/// no op of the kernel writes.
fn rematerialisable(kernel: &Kernel, op: OpId, written: &BTreeSet<usize>) -> bool {
    let here = match kernel.ops[op].kind {
        OpKind::Store { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => false,
        OpKind::Load { tensor, .. } | OpKind::Gather { tensor, .. } => !written.contains(&tensor),
        _ => true,
    };
    here && kernel.ops[op]
        .regions
        .iter()
        .all(|r| r.ops.iter().all(|&o| rematerialisable(kernel, o, written)))
}

/// Rewrites `block` with component `c` in loops; the new block, or why it must stay whole.
#[allow(clippy::type_complexity)]
fn rewrite(
    kernel: &mut Kernel,
    block: &Block,
    c: &Component,
    written: &BTreeSet<usize>,
) -> Result<Result<Block, String>, Diagnostic> {
    // Phases of the component's ops, levels of the others (see `docs/pipeline.md`).
    let mut phase: BTreeMap<OpId, usize> = BTreeMap::new();
    let mut level: BTreeMap<ValueId, usize> = BTreeMap::new();
    let mut small_level: BTreeMap<OpId, usize> = BTreeMap::new();
    let def_of = |kernel: &Kernel, v: ValueId| match kernel.values[v].def {
        ValueDef::Op(op, _) => Some(op),
        ValueDef::BlockArg { .. } => None,
    };
    let effects: Vec<Effects> = block.ops.iter().map(|&o| Effects::of(kernel, o)).collect();
    for (i, &op) in block.ops.iter().enumerate() {
        // An op touching a tensor an earlier op touched goes after it, as a data dependence
        // would put it: a store after the chunk loop storing to its tensor, a chunk store
        // after a small op's store before it, and a chunk store in the loop after that of
        // an earlier chunk store to other elements of its tensor (in one loop their chunks
        // would interleave); a load and a store of the same elements share a loop.
        let in_c = c.ops.contains(&op);
        let ordered = block.ops[..i]
            .iter()
            .zip(&effects)
            .filter(|&(_, fx)| fx.conflicts(&effects[i]))
            .map(|(&e, _)| match (phase.get(&e), small_level.get(&e)) {
                (Some(&k), _) => k + usize::from(in_c && !same_elements(kernel, e, op)),
                (None, Some(&l)) => l + usize::from(in_c),
                (None, None) => 0,
            })
            .max()
            .unwrap_or(0);
        if in_c {
            let mut p = ordered.max(1);
            // A loop carrying chunks reads values of the block inside its body too.
            let mut inputs = Vec::new();
            captured(kernel, op, &mut inputs);
            for &x in &inputs {
                if c.dims.contains_key(&x) {
                    if let Some(q) = def_of(kernel, x).and_then(|d| phase.get(&d)) {
                        p = p.max(*q);
                    }
                } else {
                    p = p.max(level.get(&x).copied().unwrap_or(0) + 1);
                }
            }
            phase.insert(op, p);
            for &r in &kernel.ops[op].results {
                if !c.dims.contains_key(&r) {
                    level.insert(r, p);
                }
            }
        } else {
            let mut vs = Vec::new();
            captured(kernel, op, &mut vs);
            let l = vs
                .iter()
                .map(|v| level.get(v).copied().unwrap_or(0))
                .max()
                .unwrap_or(0)
                .max(ordered);
            small_level.insert(op, l);
            for &r in &kernel.ops[op].results {
                level.insert(r, l);
            }
        }
    }
    let phases = phase.values().copied().max().unwrap_or(1);
    // Where each op lands: 2L for the other ops of level L, 2k-1 for loop k.
    let major = |op: OpId| match phase.get(&op) {
        Some(&k) => 2 * k - 1,
        None => 2 * small_level.get(&op).copied().unwrap_or(0),
    };
    for (i, &a) in block.ops.iter().enumerate() {
        for (j, &b) in block.ops.iter().enumerate().skip(i + 1) {
            if !effects[i].conflicts(&effects[j]) {
                continue;
            }
            let (ma, mb) = (major(a), major(b));
            if ma == mb && ma % 2 == 1 && same_elements(kernel, a, b) {
                continue;
            }
            if ma > mb || (ma == mb && ma % 2 == 1) {
                return Ok(Err(
                    "streaming it in chunks would reorder accesses to one tensor".into(),
                ));
            }
        }
    }
    // Each loop's ops: what its phase's exits and writes need, earlier chunk values
    // recomputed (a chunk value only a later phase reads is made there, not here).
    let mut loops: Vec<Vec<OpId>> = vec![Vec::new(); phases];
    for k in 1..=phases {
        let mut need: BTreeSet<OpId> = phase
            .iter()
            .filter(|&(&o, &p)| {
                // Exits and writes (a loop carrying chunks may store them in its body).
                p == k && (is_exit(kernel, c, o) || !Effects::of(kernel, o).writes.is_empty())
            })
            .map(|(&o, _)| o)
            .collect();
        let mut work: Vec<OpId> = need.iter().copied().collect();
        while let Some(op) = work.pop() {
            let mut inputs = Vec::new();
            captured(kernel, op, &mut inputs);
            for &x in &inputs {
                if !c.dims.contains_key(&x) {
                    continue;
                }
                let Some(d) = def_of(kernel, x) else { continue };
                if need.insert(d) {
                    if phase.get(&d).is_some_and(|&p| p < k)
                        && !rematerialisable(kernel, d, written)
                    {
                        return Ok(Err(
                            "a later loop over it would re-read a tensor the kernel writes, or \
                             repeat an atomic"
                                .into(),
                        ));
                    }
                    work.push(d);
                }
            }
        }
        loops[k - 1] = block
            .ops
            .iter()
            .copied()
            .filter(|o| need.contains(o))
            .collect();
    }
    let mut out = Block {
        args: block.args.clone(),
        ops: Vec::new(),
    };
    let mut subst: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    // A region's `yield` ends it whatever it depends on.
    let end = block
        .ops
        .last()
        .copied()
        .filter(|&y| kernel.ops[y].kind == OpKind::Yield);
    for l in 0..=phases {
        for &op in &block.ops {
            if Some(op) != end && !phase.contains_key(&op) && small_level.get(&op) == Some(&l) {
                substitute(kernel, op, &subst);
                out.ops.push(op);
            }
        }
        if let Some(ops) = loops.get(l).filter(|o| !o.is_empty()) {
            emit_loop(kernel, c, ops, &mut out.ops, &mut subst)?;
        }
    }
    if let Some(y) = end {
        substitute(kernel, y, &subst);
        out.ops.push(y);
    }
    Ok(Ok(out))
}

/// `shape` with `dim` cut to `chunk`.
fn chunked(shape: &Shape, dim: usize, chunk: usize) -> Shape {
    let mut s = shape.clone();
    s.0[dim] = chunk;
    s
}

/// A reduction's identity and the binary op combining two partial results.
fn identity(op: ReduceOp, dtype: DType) -> (Const, BinaryOp) {
    let float = dtype.is_float();
    let u32 = dtype == DType::U32;
    match op {
        ReduceOp::Sum if float => (Const::Float(0.0), BinaryOp::Add),
        ReduceOp::Sum => (Const::Int(0), BinaryOp::Add),
        ReduceOp::Max if float => (Const::Float(f64::NEG_INFINITY), BinaryOp::Max),
        ReduceOp::Max if u32 => (Const::Int(0), BinaryOp::Max),
        ReduceOp::Max => (Const::Int(i64::from(i32::MIN)), BinaryOp::Max),
        ReduceOp::Min if float => (Const::Float(f64::INFINITY), BinaryOp::Min),
        ReduceOp::Min if u32 => (Const::Int(i64::from(u32::MAX)), BinaryOp::Min),
        ReduceOp::Min => (Const::Int(i64::from(i32::MAX)), BinaryOp::Min),
    }
}

/// One exit of a loop: the reduction, its accumulator's dtype and combining op.
struct Exit {
    op: OpId,
    acc: DType,
    combine: BinaryOp,
}

/// Emits `for c in (0..E).step_by(CH)` running `ops` on chunks; maps each exit's result to
/// its final accumulator in `subst`.
fn emit_loop(
    kernel: &mut Kernel,
    c: &Component,
    ops: &[OpId],
    out: &mut Vec<OpId>,
    subst: &mut BTreeMap<ValueId, ValueId>,
) -> Result<(), Diagnostic> {
    let loc = ops.first().map_or(Loc::default(), |&o| kernel.ops[o].loc);
    let lo = constant(kernel, out, Const::Int(0), DType::I32, loc)?;
    let hi = constant(kernel, out, Const::Int(c.extent as i64), DType::I32, loc)?;
    let step = constant(kernel, out, Const::Int(c.chunk as i64), DType::I32, loc)?;
    let mut exits = Vec::new();
    let mut inits = Vec::new();
    let exit_ops: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| is_exit(kernel, c, o))
        .collect();
    for op in exit_ops {
        let OpKind::Reduce { op: rop, .. } = kernel.ops[op].kind else {
            continue;
        };
        let r = kernel.ops[op].results[0];
        let dtype = kernel.ty(r).dtype();
        let acc = match (rop, dtype) {
            (ReduceOp::Sum, DType::Bf16 | DType::F16) => DType::F32,
            _ => dtype,
        };
        let (id, combine) = identity(rop, acc);
        let oloc = kernel.ops[op].loc;
        let k = constant(kernel, out, id, acc, oloc)?;
        let shape = kernel.ty(r).shape().cloned().unwrap_or(Shape(Vec::new()));
        inits.push(add1(kernel, out, OpKind::Splat { shape }, vec![k], oloc)?);
        exits.push(Exit { op, acc, combine });
    }
    let mut operands = vec![lo, hi, step];
    operands.extend(&inits);
    let mut arg_tys = vec![Type::Scalar(DType::I32)];
    arg_tys.extend(inits.iter().map(|&v| kernel.ty(v).clone()));
    let (for_op, args) = open_loop(kernel, OpKind::For { stages: None }, operands, arg_tys, loc);
    let iv = args[0];
    let mut body: Vec<OpId> = Vec::new();
    let mut map: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let mut next = Vec::new();
    for &op in ops {
        let o = kernel.ops[op].clone();
        let m = |x: &ValueId| map.get(x).copied().unwrap_or(*x);
        if let Some(i) = exits.iter().position(|e| e.op == op) {
            let OpKind::Reduce { op: rop, dim } = o.kind else {
                continue;
            };
            let mut x = m(&o.operands[0]);
            if kernel.ty(x).dtype() != exits[i].acc {
                x = add1(
                    kernel,
                    &mut body,
                    OpKind::Cast { to: exits[i].acc },
                    vec![x],
                    o.loc,
                )?;
            }
            let part = add1(
                kernel,
                &mut body,
                OpKind::Reduce { op: rop, dim },
                vec![x],
                o.loc,
            )?;
            next.push(add1(
                kernel,
                &mut body,
                OpKind::Binary(exits[i].combine),
                vec![args[1 + i], part],
                o.loc,
            )?);
            continue;
        }
        chunk_op(kernel, c, op, iv, &mut body, &mut map)?;
    }
    add(kernel, &mut body, OpKind::Yield, next, loc, None)?;
    let results = close_loop(kernel, for_op, body);
    out.push(for_op);
    for (e, &res) in exits.iter().zip(&results) {
        let old = kernel.ops[e.op].results[0];
        let want = kernel.ty(old).dtype();
        let oloc = kernel.ops[e.op].loc;
        let v = if want != e.acc {
            add1(kernel, out, OpKind::Cast { to: want }, vec![res], oloc)?
        } else {
            res
        };
        subst.insert(old, v);
    }
    Ok(())
}

/// Emits op `op` of a chunk loop (induction variable `iv`) into `body`: a component op on its
/// chunks (coordinates along the chunked dimension moved to the chunk, shapes cut to it), a
/// loop carrying chunks with its body so chunked, any other op as it is; `map` takes each
/// result to the emitted one.
fn chunk_op(
    kernel: &mut Kernel,
    c: &Component,
    op: OpId,
    iv: ValueId,
    body: &mut Vec<OpId>,
    map: &mut BTreeMap<ValueId, ValueId>,
) -> Result<(), Diagnostic> {
    let o = kernel.ops[op].clone();
    let m = |x: &ValueId| map.get(x).copied().unwrap_or(*x);
    if !c.ops.contains(&op) && !c.inner.contains(&op) {
        let operands: Vec<ValueId> = o.operands.iter().map(m).collect();
        let ty = matches!(o.kind, OpKind::Const(_)).then(|| kernel.ty(o.results[0]).clone());
        let rs = add(kernel, body, o.kind.clone(), operands, o.loc, ty.as_ref())?;
        map.extend(o.results.iter().copied().zip(rs));
        return Ok(());
    }
    if let OpKind::For { .. } = o.kind {
        return chunk_loop(kernel, c, op, iv, body, map);
    }
    let mut operands: Vec<ValueId> = o.operands.iter().map(m).collect();
    let dim_of = |v: ValueId| c.dims.get(&v).copied();
    // Moves the scalar coordinate of the tensor dimension `tile`'s chunked dimension
    // falls on to the chunk (the tile covers the tensor's last dimensions); one addressed
    // through an index tile is left, as is a chunked dimension no tensor dimension covers
    // (a tile of more dimensions than an `elems` access's tensor): the index tiles,
    // chunked or broadcast along it, carry each element's coordinates.
    let access = match &o.kind {
        OpKind::Gather { access, .. }
        | OpKind::Scatter { access, .. }
        | OpKind::Atomic { access, .. } => Some(access.clone()),
        _ => None,
    };
    let shift = |kernel: &mut Kernel,
                 body: &mut Vec<OpId>,
                 operands: &mut Vec<ValueId>,
                 coords: usize,
                 tile: ValueId|
     -> Result<(), Diagnostic> {
        let (Some(d), Some(rank)) = (dim_of(tile), kernel.ty(tile).shape().map(Shape::rank)) else {
            return Ok(());
        };
        let Some(at) = (coords + d).checked_sub(rank) else {
            return Ok(());
        };
        if access
            .as_ref()
            .is_some_and(|a| a.dims.get(at) == Some(&Addr::Index))
        {
            return Ok(());
        }
        operands[at] = add1(
            kernel,
            body,
            OpKind::Binary(BinaryOp::Add),
            vec![operands[at], iv],
            o.loc,
        )?;
        Ok(())
    };
    let kind = match &o.kind {
        OpKind::Load { tensor, shape } => {
            let n = operands.len();
            shift(kernel, body, &mut operands, n, o.results[0])?;
            let d = dim_of(o.results[0]).unwrap_or(0);
            OpKind::Load {
                tensor: *tensor,
                shape: chunked(shape, d, c.chunk),
            }
        }
        OpKind::Gather {
            tensor,
            shape,
            access,
        } => {
            let n = access.dims.len();
            shift(kernel, body, &mut operands, n, o.results[0])?;
            let d = dim_of(o.results[0]).unwrap_or(0);
            OpKind::Gather {
                tensor: *tensor,
                shape: chunked(shape, d, c.chunk),
                access: access.clone(),
            }
        }
        OpKind::Store { .. } => {
            if let Some(p) = o.store_operands() {
                let n = p.coords.len();
                shift(kernel, body, &mut operands, n, p.value)?;
            }
            o.kind.clone()
        }
        OpKind::Scatter { access, .. } | OpKind::Atomic { access, .. } => {
            if let Some(v) = o.access_operands().and_then(|p| p.value) {
                shift(kernel, body, &mut operands, access.dims.len(), v)?;
            }
            o.kind.clone()
        }
        OpKind::Splat { shape } => OpKind::Splat {
            shape: chunked(shape, dim_of(o.results[0]).unwrap_or(0), c.chunk),
        },
        OpKind::Iota { shape, dim } => OpKind::Iota {
            shape: chunked(shape, dim_of(o.results[0]).unwrap_or(0), c.chunk),
            dim: *dim,
        },
        OpKind::Reshape { shape } => OpKind::Reshape {
            shape: chunked(shape, dim_of(o.results[0]).unwrap_or(0), c.chunk),
        },
        k => k.clone(),
    };
    let rs = add(kernel, body, kind.clone(), operands, o.loc, None)?;
    for (&old, &new) in o.results.iter().zip(&rs) {
        map.insert(old, new);
    }
    // An iota along the chunked dimension counts from the chunk's first element.
    if let OpKind::Iota { dim, .. } = kind
        && dim_of(o.results[0]) == Some(dim)
    {
        let shifted = add1(
            kernel,
            body,
            OpKind::Binary(BinaryOp::Add),
            vec![rs[0], iv],
            o.loc,
        )?;
        map.insert(o.results[0], shifted);
    }
    Ok(())
}

/// Emits loop `f`, which carries chunks of `c`, into a chunk loop's `body`: the same loop
/// over chunk tiles, its body's ops emitted by [`chunk_op`] (its own loads moved to the chunk
/// like the block's).
fn chunk_loop(
    kernel: &mut Kernel,
    c: &Component,
    f: OpId,
    iv: ValueId,
    body: &mut Vec<OpId>,
    map: &mut BTreeMap<ValueId, ValueId>,
) -> Result<(), Diagnostic> {
    let o = kernel.ops[f].clone();
    let operands: Vec<ValueId> = o
        .operands
        .iter()
        .map(|x| map.get(x).copied().unwrap_or(*x))
        .collect();
    let Some(old_body) = o.regions.first() else {
        return Err(Diagnostic::internal(
            o.loc,
            "strip_mine: a loop without a body",
        ));
    };
    let chunk_ty = |kernel: &Kernel, v: ValueId| match (c.dims.get(&v), kernel.ty(v)) {
        (Some(&d), Type::Tile { dtype, shape }) => Type::Tile {
            dtype: *dtype,
            shape: chunked(shape, d, c.chunk),
        },
        (_, ty) => ty.clone(),
    };
    let tys: Vec<Type> = old_body.args.iter().map(|&a| chunk_ty(kernel, a)).collect();
    let (new_f, args) = open_loop(kernel, o.kind.clone(), operands, tys, o.loc);
    map.extend(old_body.args.iter().copied().zip(args));
    let mut ops = Vec::with_capacity(old_body.ops.len());
    for &b in &old_body.ops {
        chunk_op(kernel, c, b, iv, &mut ops, map)?;
    }
    let results = close_loop(kernel, new_f, ops);
    map.extend(o.results.iter().copied().zip(results));
    body.push(new_f);
    Ok(())
}

/// Every tile left is within its budget: registers for a register tile, the target's
/// shared memory for one staged for `mma`. The error names the tile, its bytes, the budget
/// and why it was not streamed.
fn check_budgets(
    kernel: &Kernel,
    target: Target,
    threads: usize,
    failed: &[Failed],
) -> Result<(), Diagnostic> {
    let order = ops_in_order(kernel);
    let uses = super::walk::uses(kernel);
    let smem = target.sm_limits().shared_bytes as usize;
    let with_mma = mma_connected(kernel, &order);
    for &id in &order {
        let op = &kernel.ops[id];
        for &v in &op.results {
            let Some(shape) = kernel.ty(v).shape() else {
                continue;
            };
            let dtype = kernel.ty(v).dtype();
            let bytes = shape.numel() * dtype.size_bytes();
            let why = failed
                .iter()
                .find(|f| f.values.contains(&v))
                .map(|f| &f.why);
            let staged = matches!(op.kind, OpKind::Load { .. })
                && uses.get(&v).is_some_and(|us| {
                    us.iter()
                        .all(|&u| matches!(kernel.ops[u].kind, OpKind::Mma | OpKind::Transpose))
                });
            if staged {
                if bytes > smem {
                    return Err(Diagnostic::new(
                        op.loc,
                        format!(
                            "this {shape} {dtype} tile takes {bytes} bytes of shared memory; \
                             {target} has {smem}"
                        ),
                    )
                    .note("load the `mma` operand in smaller tiles inside a loop over its K dimension"));
                }
                continue;
            }
            // mma accumulators, their operands and what flows into or out of them are
            // spread over the warps the mma lowering picks (the `layout` pass), not the
            // declared ones: their budget is the mma lowering's.
            if why == Some(&Keep::Mma) || with_mma.contains(&v) {
                continue;
            }
            let per = shape.numel().div_ceil(threads) * dtype.size_bytes().max(4);
            if per > REGISTER_BYTES {
                let mut d = Diagnostic::new(
                    op.loc,
                    format!(
                        "this {shape} {dtype} tile takes {bytes} bytes: {per} bytes a thread \
                         over the block's {threads} threads, more than the {REGISTER_BYTES} \
                         bytes (255 registers) a thread holds"
                    ),
                );
                if let Some(Keep::Other(w)) = why {
                    d = d.note(format!(
                        "kiln streams a large tile in chunks, but not this one: {w}"
                    ));
                }
                return Err(d.note(
                    "use a smaller tile in a loop over the rest, or more warps \
                     (`#[kernel(num_warps = N)]`)",
                ));
            }
        }
    }
    Ok(())
}

/// The tiles connected to an `mma` through any chain of ops (operands and results of one op,
/// a loop's initial, carried, yielded and final values, a branch's yields and results).
fn mma_connected(kernel: &Kernel, order: &[OpId]) -> BTreeSet<ValueId> {
    let mut parent: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    fn root(parent: &mut BTreeMap<ValueId, ValueId>, v: ValueId) -> ValueId {
        let mut r = v;
        while let Some(&p) = parent.get(&r) {
            if p == r {
                break;
            }
            r = p;
        }
        parent.insert(v, r);
        r
    }
    let join = |parent: &mut BTreeMap<ValueId, ValueId>, group: &[ValueId]| {
        let tiles: Vec<ValueId> = group
            .iter()
            .copied()
            .filter(|&v| kernel.ty(v).shape().is_some())
            .collect();
        if let Some((&first, rest)) = tiles.split_first() {
            let r = root(parent, first);
            for &v in rest {
                let rv = root(parent, v);
                parent.insert(rv, r);
            }
        }
    };
    let yields = |b: &Block| -> Vec<ValueId> {
        b.ops
            .last()
            .map(|&y| kernel.ops[y].operands.clone())
            .unwrap_or_default()
    };
    let mut mma = Vec::new();
    for &id in order {
        let op = &kernel.ops[id];
        match op.kind {
            OpKind::For { .. } => {
                let body = &op.regions[0];
                let ys = yields(body);
                for (i, &res) in op.results.iter().enumerate() {
                    let group: Vec<ValueId> = [
                        op.operands.get(3 + i),
                        body.args.get(1 + i),
                        ys.get(i),
                        Some(&res),
                    ]
                    .into_iter()
                    .flatten()
                    .copied()
                    .collect();
                    join(&mut parent, &group);
                }
            }
            OpKind::If => {
                for (i, &res) in op.results.iter().enumerate() {
                    let mut group = vec![res];
                    group.extend(op.regions.iter().filter_map(|r| yields(r).get(i).copied()));
                    join(&mut parent, &group);
                }
            }
            OpKind::Yield => {}
            _ => {
                let all: Vec<ValueId> = op.operands.iter().chain(&op.results).copied().collect();
                join(&mut parent, &all);
                if op.kind == OpKind::Mma {
                    mma.extend(op.results.iter().copied());
                }
            }
        }
    }
    let roots: BTreeSet<ValueId> = mma.into_iter().map(|v| root(&mut parent, v)).collect();
    let values: Vec<ValueId> = parent.keys().copied().collect();
    values
        .into_iter()
        .filter(|&v| roots.contains(&root(&mut parent, v)))
        .collect()
}
