//! Checks the writer makes before reusing registers across a change of view: where the
//! layouts the passes chose would need a conversion the writer cannot do, they turn what
//! would be a wrong register (or an index past the end) into an error at the user's line.

use kiln_ir::schedule::Distribution;
use kiln_ir::{OpId, Shape, ValueId};

use super::{Emitter, Val};
use crate::error::CodegenError;

/// Threads past which a distribution's thread terms are not followed: a CTA's limit.
const MAX_THREADS: u32 = 1024;

impl Emitter<'_> {
    /// Checks that reshape `at` may hand its operand `src`'s registers (`val`) on to its
    /// result `dst` as they are: every thread's register `k` holds the same element (by
    /// row-major index) in both views. A vector loaded in a 1-D layout and viewed with
    /// `.col()` in the slice of a 2-D one does not, and needs a layout conversion.
    pub(crate) fn check_reshape(
        &self,
        src: ValueId,
        dst: ValueId,
        val: &Val,
        at: OpId,
    ) -> Result<(), CodegenError> {
        let held = match val {
            Val::Tile(regs) => regs.len(),
            Val::Affine { offs, .. } => offs.len(),
            // Scalars have no layout; lazy, staged and narrowed tiles are read through their
            // own paths, which check their operands.
            _ => return Ok(()),
        };
        let (Some(ss), Some(ds)) = (self.k.ty(src).shape(), self.k.ty(dst).shape()) else {
            return Ok(());
        };
        let (sd, dd) = (self.dist(src, at)?, self.dist(dst, at)?);
        if held == sd.regs.len() && same_elements(&sd, ss, &dd, ds) {
            return Ok(());
        }
        Err(self
            .unsupported(
                at,
                "its operand is held in a register layout that this view cannot reuse, and \
                 kiln does not convert register layouts here yet",
            )
            .note(
                "a vector reduced from the tile it is combined with (`row_sum(&t).col()`, \
                 `col_max(&t).row()`) is always held so that the view can reuse it",
            ))
    }
}

impl Emitter<'_> {
    /// Checks that reduction `at` over dimension `dim`, whose input is laid out as `src`,
    /// leaves each element of its result in the threads and register the result's layout
    /// `dst` expects. The layout pass may give the result the layout of a value it meets (a
    /// vector carried through a loop, merged by an `if`) instead of the slice of its input:
    /// that needs a layout conversion.
    pub(crate) fn check_reduce(
        &self,
        src: &Distribution,
        dst: &Distribution,
        dim: usize,
        at: OpId,
    ) -> Result<(), CodegenError> {
        if reduces_into(src, dst, dim) {
            return Ok(());
        }
        Err(self
            .unsupported(
                at,
                "its result is used in a register layout other than the one the reduction \
                 leaves (it meets a vector reduced from another tile, in a loop or an `if`), \
                 and kiln does not convert register layouts here yet",
            )
            .note(
                "start the loop's vector from the same kind of reduction of a tile of the \
                 same shape, or reduce each tile into its own vector",
            ))
    }
}

/// Whether reducing `src` along `dim` leaves, in every thread, the element register `k` of
/// `dst` names in the register of that index: the kept dimensions' thread terms of both
/// give each thread the same coordinates, and every register of `dst` has a source.
fn reduces_into(src: &Distribution, dst: &Distribution, dim: usize) -> bool {
    let rank = src.terms.len();
    if dim >= rank {
        return false;
    }
    let kept: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
    // A kept dimension of extent 1 (`keep_dim`) has the reduced one's place in `dst`.
    let dst_dims: Vec<usize> = if dst.terms.len() == rank {
        kept.clone()
    } else if dst.terms.len() == rank - 1 {
        (0..rank - 1).collect()
    } else {
        return false;
    };
    let keys: std::collections::BTreeSet<Vec<u32>> = src
        .regs
        .iter()
        .map(|o| kept.iter().map(|&d| o[d]).collect())
        .collect();
    if !dst
        .regs
        .iter()
        .all(|o| keys.contains(&dst_dims.iter().map(|&d| o[d]).collect::<Vec<_>>()))
    {
        return false;
    }
    let period = src
        .terms
        .iter()
        .chain(&dst.terms)
        .flatten()
        .fold(1u32, |p, t| lcm(p, t.div.saturating_mul(t.modulo)))
        .min(MAX_THREADS);
    (0..period).all(|tid| {
        kept.iter().zip(&dst_dims).all(|(&s, &d)| {
            kiln_ir::schedule::Term::sum(&src.terms[s], tid)
                == kiln_ir::schedule::Term::sum(&dst.terms[d], tid)
        })
    })
}

/// Whether every thread's register `k` holds the element of the same row-major index in
/// distribution `a` over `sa` and in `b` over `sb`.
fn same_elements(a: &Distribution, sa: &Shape, b: &Distribution, sb: &Shape) -> bool {
    if a.regs.len() != b.regs.len() || a.terms.len() != sa.rank() || b.terms.len() != sb.rank() {
        return false;
    }
    let period = a
        .terms
        .iter()
        .chain(&b.terms)
        .flatten()
        .fold(1u32, |p, t| lcm(p, t.div.saturating_mul(t.modulo)))
        .min(MAX_THREADS);
    (0..period).all(|tid| {
        let (ca, cb) = (a.coords(tid), b.coords(tid));
        ca.iter()
            .zip(&cb)
            .all(|(x, y)| linear(x, sa) == linear(y, sb))
    })
}

/// The row-major index of `coords` in `shape`.
fn linear(coords: &[u32], shape: &Shape) -> u64 {
    coords
        .iter()
        .zip(shape.dims())
        .fold(0u64, |i, (&c, &n)| i * n as u64 + u64::from(c))
}

fn lcm(a: u32, b: u32) -> u32 {
    let gcd = |mut x: u32, mut y: u32| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    if a == 0 || b == 0 {
        return a.max(b).max(1);
    }
    (a / gcd(a, b)).saturating_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::schedule::Term;

    fn term(div: u32, modulo: u32, mul: u32) -> Term {
        Term { div, modulo, mul }
    }

    #[test]
    fn a_column_view_of_the_same_rows_keeps_its_registers() {
        // 64 rows, a row per thread pair: thread t holds row t/2... as [64] and as [64, 1].
        let v = Distribution {
            terms: vec![vec![term(1, 32, 2)]],
            regs: vec![vec![0], vec![1]],
        };
        let c = Distribution {
            terms: vec![vec![term(1, 32, 2)], vec![]],
            regs: vec![vec![0, 0], vec![1, 0]],
        };
        assert!(same_elements(&v, &Shape(vec![64]), &c, &Shape(vec![64, 1])));
    }

    #[test]
    fn a_view_in_another_thread_order_needs_a_conversion() {
        let v = Distribution {
            terms: vec![vec![term(1, 32, 2)]],
            regs: vec![vec![0], vec![1]],
        };
        let c = Distribution {
            terms: vec![vec![term(1, 32, 1)], vec![]],
            regs: vec![vec![0, 0], vec![32, 0]],
        };
        assert!(!same_elements(
            &v,
            &Shape(vec![64]),
            &c,
            &Shape(vec![64, 1])
        ));
        // And a different register count never matches.
        let short = Distribution {
            terms: vec![vec![term(1, 32, 2)], vec![]],
            regs: vec![vec![0, 0]],
        };
        assert!(!same_elements(
            &v,
            &Shape(vec![64]),
            &short,
            &Shape(vec![64, 1])
        ));
    }
}
