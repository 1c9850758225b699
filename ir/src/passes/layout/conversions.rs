//! Layout conversions: where an op needs a tile in another layout than the one it was made
//! in, a `convert` op gives it that layout (the backends move the elements between threads
//! through shared memory). Every kernel whose layouts already agree is left as it was.

use std::collections::BTreeMap;

use crate::kernel::{Block, Kernel, Loc, Op, OpId, OpKind, ValueData, ValueDef, ValueId};
use crate::schedule::{Distribution, Layout};
use crate::types::Shape;

use super::super::walk::ops_in_order;
use super::{broadcast_layout, is_view, view_layout};

/// Where a converted value is made: before the op reading it, or after the op making it.
#[derive(Clone, Copy)]
enum At {
    Before(OpId),
    After(OpId),
}

/// Inserts the conversions; `layouts` gains the new values' layouts.
///
/// Layouts flow through the kernel as far as they can (the rules of the parent module); a
/// conversion is left only where two of them meet:
/// - an elementwise operand whose elements are in other threads than the result's (not
///   [`Distribution::broadcasts_to`] it) is converted to the result's layout (a broadcast
///   operand: to the result's layout sliced along the broadcast dimension);
/// - `reshape` views its operand's registers in place, so the operand is converted to the
///   result's layout with the unit dimension added or removed;
/// - a reduction's result must be its operand's layout sliced along the reduced dimension,
///   and a loop's (or branch's) carried values one layout throughout: the value made in
///   another layout is converted after it is made (a reduction's or a loop's result) or
///   before it is read (a loop's initial value, a yielded value);
/// - an mma accumulates into its own result's layout;
/// - a `take` reads its indices in its result's layout;
/// - an addressed access (gather, scatter, atomic) reads its index tiles, mask and values in
///   the layout of the tile it accesses, and gives its result in it.
///
/// Every kernel whose layouts already agree is left exactly as it was.
pub(super) fn insert(kernel: &mut Kernel, layouts: &mut BTreeMap<ValueId, Layout>) {
    for id in ops_in_order(kernel) {
        let op = kernel.ops[id].clone();
        match &op.kind {
            OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Select
            | OpKind::Cast { .. }
            | OpKind::Bitcast { .. } => {
                operands_to(kernel, layouts, id, op.results[0]);
            }
            OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
                // Every tile of an addressed access is in its accessed tile's layout (the
                // gather's result, the stored values).
                let anchor = match op.kind {
                    OpKind::Gather { .. } => op.results.first().copied(),
                    _ => op.access_operands().and_then(|p| p.value),
                };
                let Some(anchor) = anchor else {
                    continue;
                };
                // A masked load staged in shared memory reads no mask tile.
                if layouts.get(&anchor).is_some_and(Layout::is_shared) {
                    continue;
                }
                operands_to(kernel, layouts, id, anchor);
                if let (Some(&r), Some(al), Some(s)) = (
                    op.results.first(),
                    layouts.get(&anchor).cloned(),
                    shape(kernel, anchor),
                ) && r != anchor
                    && !same(layouts.get(&r), &al, &s)
                {
                    convert_result(kernel, layouts, id, 0, al);
                }
            }
            // The indices in the result's layout; the gathered tile is read in whatever
            // layout it has (it goes through shared memory whole).
            OpKind::Take { .. } => {
                let (idx, r) = (op.operands[1], op.results[0]);
                if let (Some(rl), Some(rs)) = (layouts.get(&r).cloned(), shape(kernel, r))
                    && !same(layouts.get(&idx), &rl, &rs)
                {
                    convert_operand(kernel, layouts, id, 1, rl);
                }
            }
            // A general reshape moves its elements itself where their threads differ.
            OpKind::Reshape { .. } if is_view(kernel, &op) => {
                let (x, r) = (op.operands[0], op.results[0]);
                let (Some(rl), Some(rs), Some(xs)) =
                    (layouts.get(&r).cloned(), shape(kernel, r), shape(kernel, x))
                else {
                    continue;
                };
                let adds = rs.rank() > xs.rank();
                let unit = (0..rs.rank()).find(|&d| rs.dims()[d] == 1);
                let want = view_layout(&rl, &rs, &xs)
                    .or_else(|| {
                        // The result's layout with its unit dimension reduced away.
                        (adds && unit.is_some()).then(|| Layout::Slice {
                            dim: unit.unwrap_or(0),
                            keep_dim: false,
                            parent: Box::new(rl.clone()),
                            parent_shape: rs.clone(),
                        })
                    })
                    .or_else(|| (!adds).then(|| with_unit(&rl, &rs, &xs)).flatten());
                if let Some(want) = want
                    && !same(layouts.get(&x), &want, &xs)
                {
                    convert_operand(kernel, layouts, id, 0, want);
                }
            }
            OpKind::Reduce { dim, .. } => {
                let (x, r) = (op.operands[0], op.results[0]);
                let (Some(xl), Some(xs), Some(rs)) =
                    (layouts.get(&x).cloned(), shape(kernel, x), shape(kernel, r))
                else {
                    continue;
                };
                if xl.is_shared() {
                    continue;
                }
                let made = Layout::Slice {
                    dim: *dim,
                    keep_dim: false,
                    parent: Box::new(xl),
                    parent_shape: xs,
                };
                if !same(layouts.get(&r), &made, &rs) {
                    convert_result(kernel, layouts, id, 0, made);
                }
            }
            OpKind::Mma => {
                if let (Some(&c), Some(&r)) = (op.operands.get(2), op.results.first())
                    && let (Some(rl), Some(rs)) = (layouts.get(&r).cloned(), shape(kernel, r))
                    && !same(layouts.get(&c), &rl, &rs)
                {
                    convert_operand(kernel, layouts, id, 2, rl);
                }
            }
            OpKind::For { .. } => {
                let body = &op.regions[0];
                let yield_op = body.ops.last().copied();
                for (i, &res) in op.results.iter().enumerate() {
                    let arg = body.args[1 + i];
                    let (Some(al), Some(s)) = (layouts.get(&arg).cloned(), shape(kernel, arg))
                    else {
                        continue;
                    };
                    if !same(layouts.get(&op.operands[3 + i]), &al, &s) {
                        convert_operand(kernel, layouts, id, 3 + i, al.clone());
                    }
                    if let Some(y) = yield_op
                        && !same(layouts.get(&kernel.ops[y].operands[i]), &al, &s)
                    {
                        convert_operand(kernel, layouts, y, i, al.clone());
                    }
                    if !same(layouts.get(&res), &al, &s) {
                        convert_result(kernel, layouts, id, i, al);
                    }
                }
            }
            OpKind::If => {
                for (i, &res) in op.results.iter().enumerate() {
                    let (Some(rl), Some(s)) = (layouts.get(&res).cloned(), shape(kernel, res))
                    else {
                        continue;
                    };
                    for region in &op.regions {
                        if let Some(&y) = region.ops.last()
                            && !same(layouts.get(&kernel.ops[y].operands[i]), &rl, &s)
                        {
                            convert_operand(kernel, layouts, y, i, rl.clone());
                        }
                    }
                }
            }
            OpKind::Const(_)
            | OpKind::ScalarParam(_)
            | OpKind::BlockId(_)
            | OpKind::GridDim(_)
            | OpKind::TensorDim { .. }
            | OpKind::LoadScalar { .. }
            | OpKind::ScalarAtomic { .. }
            | OpKind::Load { .. }
            | OpKind::Store { .. }
            | OpKind::Splat { .. }
            | OpKind::Iota { .. }
            | OpKind::Transpose
            | OpKind::Permute { .. }
            | OpKind::Reshape { .. }
            | OpKind::Convert
            | OpKind::Print { .. }
            | OpKind::Yield => {}
        }
    }
}

/// Converts each tile operand of `id` other than `anchor` whose elements are not in the
/// threads holding `anchor`'s (not [`Distribution::broadcasts_to`] it) to `anchor`'s layout,
/// or its slice along the dimension it broadcasts.
fn operands_to(
    kernel: &mut Kernel,
    layouts: &mut BTreeMap<ValueId, Layout>,
    id: OpId,
    anchor: ValueId,
) {
    let (Some(rl), Some(rs)) = (layouts.get(&anchor).cloned(), shape(kernel, anchor)) else {
        return;
    };
    let Ok(rd) = rl.distribution(&rs) else {
        return;
    };
    let operands = kernel.ops[id].operands.clone();
    for (i, &v) in operands.iter().enumerate() {
        if v == anchor {
            continue;
        }
        let (Some(vl), Some(vs)) = (layouts.get(&v), shape(kernel, v)) else {
            continue;
        };
        if vl.is_shared()
            || vl
                .distribution(&vs)
                .is_ok_and(|vd| vd.broadcasts_to(&vs, &rd, &rs))
        {
            continue;
        }
        let want = if vs == rs {
            Some(rl.clone())
        } else {
            broadcast_layout(&vs, &rs, &rl)
        };
        if let Some(want) = want {
            convert_operand(kernel, layouts, id, i, want);
        }
    }
}

/// The shape of tile `v`.
fn shape(kernel: &Kernel, v: ValueId) -> Option<Shape> {
    kernel.ty(v).shape().cloned()
}

/// A blocked layout of `with` (`shape` with an extent of 1 added) holding every element
/// where blocked `l` holds it over `shape`: `l` itself (`[1, n]`), or `l` with rows and
/// columns swapped (`[n, 1]`: a 1-D layout's columns become the rows).
fn with_unit(l: &Layout, shape: &Shape, with: &Shape) -> Option<Layout> {
    let Layout::Blocked {
        size_per_thread: spt,
        threads_per_warp: tpw,
        warps,
    } = l
    else {
        return None;
    };
    let swapped = Layout::Blocked {
        size_per_thread: [spt[1], spt[0]],
        threads_per_warp: [tpw[1], tpw[0]],
        warps: [warps[1], warps[0]],
    };
    let have = l.distribution(shape).ok()?;
    [l.clone(), swapped].into_iter().find(|c| {
        c.distribution(with)
            .is_ok_and(|d| d.same_elements(with, &have, shape))
    })
}

/// Whether a value in layout `have` holds its elements where `want` would, over `shape`.
fn same(have: Option<&Layout>, want: &Layout, shape: &Shape) -> bool {
    let dist = |l: &Layout| -> Option<Distribution> { l.distribution(shape).ok() };
    match have {
        Some(h) if h == want => true,
        Some(h) if h.is_shared() || want.is_shared() => false,
        Some(h) => dist(h).is_some() && dist(h) == dist(want),
        None => false,
    }
}

/// Reads operand `index` of `user` through a conversion to `want`, made just before it.
fn convert_operand(
    kernel: &mut Kernel,
    layouts: &mut BTreeMap<ValueId, Layout>,
    user: OpId,
    index: usize,
    want: Layout,
) {
    let v = kernel.ops[user].operands[index];
    let converted = value_like(kernel, v, ValueDef::Op(user, 0));
    let op = convert_op(kernel, v, converted, kernel.ops[user].loc);
    kernel.ops[user].operands[index] = converted;
    layouts.insert(converted, want);
    place(kernel, op, At::Before(user));
}

/// Makes result `index` of `maker` in layout `made`, then converts it to the layout the
/// value had, which its readers keep.
fn convert_result(
    kernel: &mut Kernel,
    layouts: &mut BTreeMap<ValueId, Layout>,
    maker: OpId,
    index: usize,
    made: Layout,
) {
    let r = kernel.ops[maker].results[index];
    let fresh = value_like(kernel, r, ValueDef::Op(maker, index));
    kernel.ops[maker].results[index] = fresh;
    layouts.insert(fresh, made);
    let op = convert_op(kernel, fresh, r, kernel.ops[maker].loc);
    place(kernel, op, At::After(maker));
}

/// A new value of `v`'s type, defined by `def`.
fn value_like(kernel: &mut Kernel, v: ValueId, def: ValueDef) -> ValueId {
    let ty = kernel.ty(v).clone();
    kernel.values.append(ValueData { ty, def })
}

/// A `convert` of `from` into `to` at `loc`, in no block yet; `to` becomes its result.
fn convert_op(kernel: &mut Kernel, from: ValueId, to: ValueId, loc: Loc) -> OpId {
    let op = kernel.ops.append(Op {
        kind: OpKind::Convert,
        operands: vec![from],
        results: vec![to],
        regions: Vec::new(),
        loc,
    });
    kernel.values[to].def = ValueDef::Op(op, 0);
    op
}

/// Puts `op` into the block holding the op `at` names, before or after it.
fn place(kernel: &mut Kernel, op: OpId, at: At) {
    let target = match at {
        At::Before(o) | At::After(o) => o,
    };
    let after = matches!(at, At::After(_));
    if insert_in(&mut kernel.body, target, op, after) {
        return;
    }
    let holders: Vec<OpId> = kernel
        .ops
        .iter()
        .filter(|(_, o)| !o.regions.is_empty())
        .map(|(h, _)| h)
        .collect();
    for h in holders {
        for region in &mut kernel.ops[h].regions {
            if insert_in(region, target, op, after) {
                return;
            }
        }
    }
}

/// Inserts `op` next to `target` if `block` holds it directly.
fn insert_in(block: &mut Block, target: OpId, op: OpId, after: bool) -> bool {
    match block.ops.iter().position(|&o| o == target) {
        Some(at) => {
            block.ops.insert(at + usize::from(after), op);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::with_unit;
    use crate::schedule::Layout;
    use crate::types::Shape;

    /// A vector's blocked layout seen with a unit dimension added: itself as a row
    /// (`[1, n]`), its rows and columns swapped as a column (`[n, 1]`), each holding every
    /// element where the vector's holds it; a layout other than a blocked one has none.
    #[test]
    fn a_vector_layout_takes_a_unit_dimension_either_side() {
        let v = Layout::Blocked {
            size_per_thread: [1, 4],
            threads_per_warp: [1, 32],
            warps: [1, 4],
        };
        let n = Shape(vec![1024]);
        assert_eq!(with_unit(&v, &n, &Shape(vec![1, 1024])), Some(v.clone()));
        let column = Layout::Blocked {
            size_per_thread: [4, 1],
            threads_per_warp: [32, 1],
            warps: [4, 1],
        };
        assert_eq!(with_unit(&v, &n, &Shape(vec![1024, 1])), Some(column));
        let mma = Layout::Mma { warps: [4, 1] };
        assert_eq!(with_unit(&mma, &n, &Shape(vec![1024, 1])), None);
    }
}
