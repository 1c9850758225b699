//! Launch validation: every argument against the kernel signature, and the grid against the
//! device's limits. Host-only (it sees tensors as [`ArgView`]s: a layout plus the allocation's
//! address and size), so each rule is unit-tested without a GPU.
//!
//! Rationale: the kernels trust their shape and stride parameters (they mask only against the
//! extents they are given), so these checks are what keeps a wrong-sized argument from reading
//! or writing outside its allocation.

use std::collections::BTreeMap;

use kiln_ir::dsl::ParamSig;

use crate::error::LaunchError;
use crate::layout::Layout;

/// A launch argument as validation and parameter packing see it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ArgView<'a> {
    /// A tensor view into an allocation.
    Tensor {
        /// Its layout (offset and strides in elements).
        layout: &'a Layout,
        /// Device address of the allocation's start.
        base: u64,
        /// Size of the allocation in bytes.
        alloc_bytes: usize,
        /// Identity of the device context that owns the allocation.
        context: usize,
    },
    /// An `f32` scalar.
    F32(f32),
    /// An `i32` scalar.
    I32(i32),
    /// A `u32` scalar.
    U32(u32),
}

impl ArgView<'_> {
    /// How the argument is named in errors ("a bf16 tensor of rank 2", "an f32 scalar").
    fn describe(&self) -> String {
        match self {
            ArgView::Tensor { layout, .. } => {
                format!("a {} tensor of rank {}", layout.dtype, layout.shape.len())
            }
            ArgView::F32(_) => "an f32 scalar".to_string(),
            ArgView::I32(_) => "an i32 scalar".to_string(),
            ArgView::U32(_) => "a u32 scalar".to_string(),
        }
    }
}

/// Checks that every grid dimension is in `1..=max`.
pub(crate) fn check_grid(grid: [u32; 3], max: [u32; 3]) -> Result<(), LaunchError> {
    for ((axis, got), max) in ['x', 'y', 'z'].into_iter().zip(grid).zip(max) {
        if got == 0 || got > max {
            return Err(LaunchError::Grid { axis, max, got });
        }
    }
    Ok(())
}

/// Checks `args` against `signature` for a launch on the device context `context`. Builds no
/// string unless it fails: a launch of an already loaded kernel runs it every time.
pub(crate) fn check_args(
    kernel: &str,
    signature: &[ParamSig],
    args: &[ArgView<'_>],
    context: usize,
) -> Result<(), LaunchError> {
    if signature.len() != args.len() {
        return Err(LaunchError::ArgCount {
            kernel: kernel.to_string(),
            expected: signature.len(),
            got: args.len(),
        });
    }
    for (index, (sig, arg)) in signature.iter().zip(args).enumerate() {
        match (sig, arg) {
            (
                ParamSig::Tensor {
                    name, dtype, rank, ..
                },
                ArgView::Tensor {
                    layout,
                    alloc_bytes,
                    context: owner,
                    ..
                },
            ) => {
                check_tensor(name, *dtype, *rank, layout, *alloc_bytes)?;
                if *owner != context {
                    return Err(LaunchError::ForeignTensor { param: name });
                }
            }
            (ParamSig::Scalar { dtype, .. }, ArgView::F32(_)) if *dtype == kiln_ir::DType::F32 => {}
            (ParamSig::Scalar { dtype, .. }, ArgView::I32(_)) if *dtype == kiln_ir::DType::I32 => {}
            (ParamSig::Scalar { dtype, .. }, ArgView::U32(_)) if *dtype == kiln_ir::DType::U32 => {}
            (sig, arg) => {
                let expected = match sig {
                    ParamSig::Tensor { dtype, rank, .. } => {
                        format!("a {dtype} tensor of rank {rank}")
                    }
                    ParamSig::Scalar { dtype, .. } => format!("an {dtype} scalar"),
                };
                return Err(LaunchError::ArgKind {
                    index,
                    param: sig.name(),
                    expected,
                    got: arg.describe(),
                });
            }
        }
    }
    Ok(())
}

/// For each tensor parameter of `signature` by name, whether its argument in `args` (already
/// checked by [`check_args`]) is 16-byte aligned ([`Layout::aligned16`]): the alignment facts
/// of the launch's [`kiln_ir::dsl::Spec`].
pub(crate) fn alignment(signature: &[ParamSig], args: &[ArgView<'_>]) -> BTreeMap<String, bool> {
    signature
        .iter()
        .zip(args)
        .filter_map(|(sig, arg)| match (sig, arg) {
            (ParamSig::Tensor { name, .. }, ArgView::Tensor { layout, base, .. }) => {
                Some((name.to_string(), layout.aligned16(*base)))
            }
            _ => None,
        })
        .collect()
}

/// The tensor rules: dtype, rank, innermost stride 1, extents below 2^31, strides below 2^63,
/// every addressed element inside the allocation.
fn check_tensor(
    param: &'static str,
    dtype: kiln_ir::DType,
    rank: usize,
    layout: &Layout,
    alloc_bytes: usize,
) -> Result<(), LaunchError> {
    if layout.dtype != dtype {
        return Err(LaunchError::DType {
            param,
            expected: dtype,
            got: layout.dtype,
        });
    }
    if layout.shape.len() != rank {
        return Err(LaunchError::Rank {
            param,
            expected: rank,
            got: layout.shape.len(),
        });
    }
    // A rank-0 tensor has no innermost dimension to check, and one of extent 1 is never
    // stepped along (PyTorch gives such a dimension any stride, 0 after `expand`).
    if let (Some(&stride), Some(&extent)) = (layout.strides.last(), layout.shape.last())
        && stride != 1
        && extent > 1
    {
        return Err(LaunchError::InnerStride { param, stride });
    }
    for (dim, (&extent, &stride)) in layout.shape.iter().zip(&layout.strides).enumerate() {
        if extent > i32::MAX as usize {
            return Err(LaunchError::Extent { param, dim, extent });
        }
        if stride > i64::MAX as usize {
            return Err(LaunchError::Stride { param, dim, stride });
        }
    }
    match layout.end_byte() {
        Some(needed) if needed <= alloc_bytes => Ok(()),
        needed => Err(LaunchError::OutOfBounds {
            param,
            shape: layout.shape.clone(),
            strides: layout.strides.clone(),
            offset: layout.offset,
            needed: needed.unwrap_or(usize::MAX),
            available: alloc_bytes,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DType;

    const SIG: &[ParamSig] = &[
        ParamSig::Tensor {
            name: "a",
            dtype: DType::Bf16,
            dtype_param: None,
            rank: 2,
            mutable: false,
        },
        ParamSig::Tensor {
            name: "out",
            dtype: DType::F32,
            dtype_param: None,
            rank: 2,
            mutable: true,
        },
        ParamSig::Scalar {
            name: "scale",
            dtype: DType::F32,
        },
    ];
    const CTX: usize = 7;

    fn tensor(layout: &Layout) -> ArgView<'_> {
        ArgView::Tensor {
            layout,
            base: 0x10_0000,
            alloc_bytes: layout.end_byte().expect("small layout"),
            context: CTX,
        }
    }

    fn check(args: &[ArgView<'_>]) -> Result<(), LaunchError> {
        check_args("k", SIG, args, CTX)
    }

    #[test]
    fn valid_arguments_report_alignment() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let args = [tensor(&a), tensor(&out), ArgView::F32(0.5)];
        check(&args).expect("valid");
        let aligned = alignment(SIG, &args);
        assert_eq!(aligned.len(), 2, "one fact per tensor, none for the scalar");
        assert!(aligned["a"]);
        // 3 f32 = 12-byte rows.
        assert!(!aligned["out"]);
    }

    #[test]
    fn wrong_count_names_both_numbers() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let err = check(&[tensor(&a)]).expect_err("two missing");
        assert!(matches!(
            err,
            LaunchError::ArgCount {
                expected: 3,
                got: 1,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "kernel `k` takes 3 launch argument(s), got 1"
        );
    }

    #[test]
    fn scalar_for_tensor_and_wrong_scalar_type_are_kind_errors() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let err = check(&[ArgView::F32(1.0), tensor(&out), ArgView::F32(0.5)])
            .expect_err("scalar for a tensor");
        assert!(matches!(
            err,
            LaunchError::ArgKind {
                index: 0,
                param: "a",
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "argument 0 `a`: expected a bf16 tensor of rank 2, got an f32 scalar"
        );
        let err = check(&[tensor(&a), tensor(&out), ArgView::I32(1)]).expect_err("i32 for f32");
        assert_eq!(
            err.to_string(),
            "argument 2 `scale`: expected an f32 scalar, got an i32 scalar"
        );
    }

    #[test]
    fn wrong_dtype_and_rank_name_the_parameter() {
        let f = Layout::contiguous(DType::F32, &[5, 64]);
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let err = check(&[tensor(&f), tensor(&out), ArgView::F32(0.5)]).expect_err("dtype");
        assert!(matches!(
            err,
            LaunchError::DType {
                param: "a",
                expected: DType::Bf16,
                got: DType::F32
            }
        ));
        assert_eq!(
            err.to_string(),
            "argument `a`: expected a bf16 tensor, got f32"
        );
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let out3 = Layout::contiguous(DType::F32, &[2, 5, 3]);
        let err = check(&[tensor(&a), tensor(&out3), ArgView::F32(0.5)]).expect_err("rank");
        assert!(matches!(
            err,
            LaunchError::Rank {
                param: "out",
                expected: 2,
                got: 3
            }
        ));
    }

    #[test]
    fn transposed_tensor_is_rejected_for_its_inner_stride() {
        let a = Layout::contiguous(DType::Bf16, &[64, 5])
            .transpose(0, 1)
            .expect("valid");
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let err = check(&[tensor(&a), tensor(&out), ArgView::F32(0.5)]).expect_err("stride");
        assert!(matches!(
            err,
            LaunchError::InnerStride {
                param: "a",
                stride: 5
            }
        ));
        assert!(err.to_string().contains("innermost stride must be 1"));
    }

    #[test]
    fn innermost_extent_one_takes_any_stride() {
        // A [5, 1] column expanded from [5] (`expand` gives the size-1 dimension stride 0).
        let a = Layout {
            strides: vec![64, 0],
            ..Layout::contiguous(DType::Bf16, &[5, 64])
                .narrow(1, 0, 1)
                .expect("in range")
        };
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        check(&[tensor(&a), tensor(&out), ArgView::F32(0.5)]).expect("valid");
        let b = Layout {
            strides: vec![64, 0],
            ..Layout::contiguous(DType::Bf16, &[5, 64])
                .narrow(1, 0, 2)
                .expect("in range")
        };
        let err = check(&[tensor(&b), tensor(&out), ArgView::F32(0.5)]).expect_err("stride 0");
        assert!(matches!(
            err,
            LaunchError::InnerStride {
                param: "a",
                stride: 0
            }
        ));
    }

    #[test]
    fn narrowed_tensor_with_outer_stride_is_accepted() {
        let whole = Layout::contiguous(DType::Bf16, &[5, 64]);
        let a = whole.narrow(1, 8, 40).expect("in range");
        let out = Layout::contiguous(DType::F32, &[5, 4]);
        let view = ArgView::Tensor {
            layout: &a,
            base: 0x10_0000,
            alloc_bytes: whole.end_byte().expect("small"),
            context: CTX,
        };
        let args = [view, tensor(&out), ArgView::F32(0.5)];
        check(&args).expect("valid");
        let aligned = alignment(SIG, &args);
        assert!(aligned["a"]);
        assert!(aligned["out"]);
    }

    #[test]
    fn too_small_allocation_is_out_of_bounds() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let short = ArgView::Tensor {
            layout: &out,
            base: 0x10_0000,
            alloc_bytes: 59,
            context: CTX,
        };
        let err = check(&[tensor(&a), short, ArgView::F32(0.5)]).expect_err("60 > 59 bytes");
        assert!(matches!(
            err,
            LaunchError::OutOfBounds {
                param: "out",
                needed: 60,
                available: 59,
                ..
            }
        ));
        assert!(err.to_string().contains("needs 60 bytes"), "{err}");
    }

    #[test]
    fn overflowing_strides_are_out_of_bounds_not_a_panic() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let mut out = Layout::contiguous(DType::F32, &[5, 3]);
        out.strides[0] = usize::MAX / 2;
        let view = ArgView::Tensor {
            layout: &out,
            base: 0,
            alloc_bytes: 1 << 20,
            context: CTX,
        };
        let err = check(&[tensor(&a), view, ArgView::F32(0.5)]).expect_err("overflow");
        assert!(
            matches!(
                err,
                LaunchError::OutOfBounds {
                    param: "out",
                    needed: usize::MAX,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn stride_beyond_i64_is_rejected_even_for_an_empty_tensor() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let mut out = Layout::contiguous(DType::F32, &[0, 3]);
        out.strides[0] = usize::MAX;
        let err = check(&[tensor(&a), tensor(&out), ArgView::F32(0.5)]).expect_err("stride");
        assert!(
            matches!(
                err,
                LaunchError::Stride {
                    param: "out",
                    dim: 0,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn extent_of_2_pow_31_is_rejected() {
        let mut a = Layout::contiguous(DType::Bf16, &[1, 1 << 31]);
        a.strides[0] = 1 << 31;
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let err = check(&[tensor(&a), tensor(&out), ArgView::F32(0.5)]).expect_err("extent");
        assert!(matches!(
            err,
            LaunchError::Extent {
                param: "a",
                dim: 1,
                extent: 2147483648
            }
        ));
    }

    #[test]
    fn tensor_of_another_device_is_foreign() {
        let a = Layout::contiguous(DType::Bf16, &[5, 64]);
        let out = Layout::contiguous(DType::F32, &[5, 3]);
        let err = check_args(
            "k",
            SIG,
            &[tensor(&a), tensor(&out), ArgView::F32(0.5)],
            CTX + 1,
        )
        .expect_err("foreign");
        assert!(matches!(err, LaunchError::ForeignTensor { param: "a" }));
    }

    #[test]
    fn grid_must_be_non_zero_and_within_limits() {
        let max = [i32::MAX as u32, 65535, 65535];
        check_grid([1, 1, 1], max).expect("valid");
        check_grid([i32::MAX as u32, 65535, 65535], max).expect("at the limit");
        let err = check_grid([4, 0, 1], max).expect_err("zero y");
        assert!(matches!(
            err,
            LaunchError::Grid {
                axis: 'y',
                got: 0,
                ..
            }
        ));
        let err = check_grid([4, 1, 65536], max).expect_err("z too big");
        assert_eq!(
            err.to_string(),
            "grid dimension z: expected 1..=65535, got 65536"
        );
    }
}
