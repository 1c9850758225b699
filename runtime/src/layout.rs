//! Strided tensor layouts: element type, shape, strides and offset, with the view operations
//! (transpose, narrow) and the address arithmetic that launch validation relies on. Host-only,
//! so every rule here is unit-tested without a GPU.

use kiln_ir::DType;
use kiln_ir::host::{contiguous_strides, row_major_offsets};

use crate::error::RuntimeError;

/// Where the elements of a tensor sit inside its allocation. Strides and offset are in
/// elements; dimensions are outermost first; `strides` has one entry per `shape` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Element type.
    pub dtype: DType,
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Strides in elements, outermost first.
    pub strides: Vec<usize>,
    /// Offset of element `[0, .., 0]` from the allocation's start, in elements.
    pub offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` starting at the allocation's start.
    pub fn contiguous(dtype: DType, shape: &[usize]) -> Layout {
        Layout {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements are row-major and dense (so the view is one run of memory).
    pub fn is_contiguous(&self) -> bool {
        self.shape
            .iter()
            .zip(&self.strides)
            .zip(contiguous_strides(&self.shape))
            .all(|((&n, &s), c)| n <= 1 || s == c)
    }

    /// One past the largest element index addressed, counted from the allocation's start;
    /// `None` if that overflows `usize`. An empty tensor addresses nothing and ends at its offset.
    pub fn end_elem(&self) -> Option<usize> {
        // Not `numel() == 0`: that product may overflow where the checked sum below reports it.
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset + 1, |acc, (&n, &s)| {
                (n - 1).checked_mul(s).and_then(|d| acc.checked_add(d))
            })
    }

    /// Bytes from the allocation's start to the end of the last addressed element; `None` on
    /// overflow.
    pub fn end_byte(&self) -> Option<usize> {
        self.end_elem()?.checked_mul(self.dtype.size_bytes())
    }

    /// The offset, in elements, of the element at `index`.
    pub fn elem_offset(&self, index: &[usize]) -> usize {
        self.offset
            + index
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    /// Whether `base` (the allocation's device address) plus the offset, and every stride but
    /// the innermost, are multiples of 16 bytes: the fact kernels specialise on to use 16-byte
    /// vector accesses.
    pub fn aligned16(&self, base: u64) -> bool {
        let elem = self.dtype.size_bytes();
        let start = base as u128 + (self.offset as u128) * elem as u128;
        let outer = self.strides.len().saturating_sub(1);
        start.is_multiple_of(16)
            && self.strides[..outer]
                .iter()
                .all(|&s| (s as u128 * elem as u128).is_multiple_of(16))
    }

    /// The view with dimensions `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Layout, RuntimeError> {
        let rank = self.shape.len();
        for d in [a, b] {
            if d >= rank {
                return Err(RuntimeError::Shape {
                    what: "transpose dimension",
                    expected: format!("a dimension below the rank {rank}"),
                    got: d.to_string(),
                });
            }
        }
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.strides.swap(a, b);
        Ok(out)
    }

    /// The view of `len` elements of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout, RuntimeError> {
        let rank = self.shape.len();
        let extent = *self.shape.get(dim).ok_or_else(|| RuntimeError::Shape {
            what: "narrow dimension",
            expected: format!("a dimension below the rank {rank}"),
            got: dim.to_string(),
        })?;
        if start.checked_add(len).is_none_or(|end| end > extent) {
            return Err(RuntimeError::Shape {
                what: "narrow range",
                expected: format!("start + len <= {extent} (extent of dimension {dim})"),
                got: format!("start {start}, len {len}"),
            });
        }
        let mut out = self.clone();
        out.offset += start * self.strides[dim];
        out.shape[dim] = len;
        Ok(out)
    }

    /// For each element in row-major order of `shape`, its offset in elements.
    pub fn elem_offsets(&self) -> Vec<usize> {
        let mut out = row_major_offsets(&self.shape, &self.strides);
        out.iter_mut().for_each(|o| *o += self.offset);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layout_ends_at_numel() {
        let l = Layout::contiguous(DType::Bf16, &[3, 5, 7]);
        assert!(l.is_contiguous());
        assert_eq!(l.end_elem(), Some(105));
        assert_eq!(l.end_byte(), Some(210));
    }

    #[test]
    fn transpose_swaps_shape_and_strides() {
        let l = Layout::contiguous(DType::F32, &[4, 6]);
        let t = l.transpose(0, 1).expect("valid dims");
        assert_eq!(t.shape, [6, 4]);
        assert_eq!(t.strides, [1, 6]);
        assert!(!t.is_contiguous());
        assert_eq!(t.end_elem(), Some(24));
        let err = l.transpose(0, 2).expect_err("rank 2 has no dim 2");
        assert!(err.to_string().contains("below the rank 2"), "{err}");
    }

    #[test]
    fn narrow_moves_offset_and_keeps_strides() {
        let l = Layout::contiguous(DType::F32, &[10, 8]);
        let n = l.narrow(1, 3, 4).expect("in range");
        assert_eq!(
            (n.offset, n.shape.clone(), n.strides.clone()),
            (3, vec![10, 4], vec![8, 1])
        );
        assert_eq!(n.end_elem(), Some(3 + 9 * 8 + 3 + 1));
        let rows = l.narrow(0, 2, 5).expect("in range");
        assert!(rows.is_contiguous());
        assert_eq!(rows.offset, 16);
        let err = l.narrow(1, 6, 3).expect_err("6 + 3 > 8");
        assert!(err.to_string().contains("start + len <= 8"), "{err}");
    }

    #[test]
    fn empty_tensor_addresses_nothing() {
        let l = Layout::contiguous(DType::F32, &[0, 8]);
        assert_eq!(l.end_elem(), Some(0));
        assert!(l.elem_offsets().is_empty());
    }

    #[test]
    fn huge_strides_overflow_to_none() {
        let mut l = Layout::contiguous(DType::F32, &[3, 2]);
        l.strides[0] = usize::MAX / 2;
        assert_eq!(l.end_elem(), None);
    }

    #[test]
    fn aligned16_checks_base_offset_and_outer_strides() {
        let l = Layout::contiguous(DType::Bf16, &[4, 64]);
        assert!(l.aligned16(0x1000));
        assert!(!l.aligned16(0x1008));
        // 60 bf16 = 120 bytes per row: not a multiple of 16.
        assert!(!Layout::contiguous(DType::Bf16, &[4, 60]).aligned16(0x1000));
        // A column offset of 4 bf16 = 8 bytes breaks the base alignment.
        assert!(!l.narrow(1, 4, 8).expect("in range").aligned16(0x1000));
        assert!(l.narrow(1, 8, 8).expect("in range").aligned16(0x1000));
        // Rank 1: only the base counts.
        assert!(Layout::contiguous(DType::F32, &[7]).aligned16(0x2000));
    }

    #[test]
    fn elem_offsets_follow_strides() {
        let l = Layout::contiguous(DType::F32, &[2, 3])
            .transpose(0, 1)
            .expect("valid");
        assert_eq!(l.elem_offsets(), [0, 3, 1, 4, 2, 5]);
    }
}
