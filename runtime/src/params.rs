//! The runtime's side of the kernel parameter ABI: [`kiln_ptx::abi::slot_roles`] says which
//! `.param` slots the entry declares for the signature (without their names: a launch builds
//! no string); each validated argument fills its slots, and `cuLaunchKernel` gets one
//! pointer per slot. The table lives in `kiln_ptx::abi` only, so the backend and the runtime
//! cannot disagree on it. On sm_90a a TMA-loaded tensor
//! also fills a tensor-map slot with the map the launch encoded for it (by value).

use std::collections::BTreeMap;
use std::ffi::c_void;

use cudarc::driver::sys;

use kiln_ir::dsl::ParamSig;
use kiln_ptx::abi::{self, ParamKind, SlotRole, SlotType};

use crate::error::LaunchError;
use crate::validate::ArgView;

/// One parameter slot's value, at the width the entry declares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum SlotValue<'m> {
    /// `.u64` device address.
    U64(u64),
    /// `.s32` extent or scalar.
    S32(i32),
    /// `.u32` scalar.
    U32(u32),
    /// `.s64` stride.
    S64(i64),
    /// `.f32` scalar.
    F32(f32),
    /// `.align 64 .b8 [128]` tensor map, passed by value: the driver copies it from the
    /// caller's encoded map, so a slot stays small (slots are built on every launch).
    Map(&'m sys::CUtensorMap),
}

/// The packed parameters of one launch.
#[derive(Debug)]
pub(crate) struct ParamBuffer<'m> {
    slots: Vec<SlotValue<'m>>,
}

impl<'m> ParamBuffer<'m> {
    /// Packs arguments already validated against `signature` (so extents fit `i32`, strides
    /// `i64`, and each argument has the kind its parameter declares), with `maps`, by
    /// parameter index, the encoded tensor maps of the entry's TMA-loaded tensors, and a
    /// persistent kernel's logical `grid` (extents at most `i32::MAX`, as `check_grid` allows).
    pub(crate) fn pack(
        signature: &[ParamSig],
        args: &[ArgView<'_>],
        maps: &'m BTreeMap<usize, sys::CUtensorMap>,
        grid: Option<[u32; 3]>,
    ) -> Result<ParamBuffer<'m>, LaunchError> {
        // The slots' roles only: their names are the PTX writer's, and a launch builds no
        // string.
        let kinds = signature.iter().map(|p| match *p {
            ParamSig::Tensor { rank, .. } => ParamKind::Tensor { rank },
            ParamSig::Scalar { dtype, .. } => ParamKind::Scalar { dtype },
        });
        let tma: Vec<usize> = maps.keys().copied().collect();
        let slots = abi::slot_roles(kinds, &tma, grid.is_some()).map_err(|index| {
            LaunchError::AbiMismatch {
                slot: format!("scalar parameter #{index} of a type the ABI does not pass"),
            }
        })?;
        // Filled in place at its final size: a collected `Result` cannot reserve, and
        // regrowing it took longer than the rest of the packing (this runs on every launch).
        let mut values = Vec::with_capacity(slots.len());
        for &(role, ty) in &slots {
            let arg = slot_param(role).and_then(|p| args.get(p));
            let value = match (role, ty, arg) {
                (SlotRole::Grid { axis }, SlotType::S32, None) => {
                    grid.map(|g| SlotValue::S32(g[axis] as i32))
                }
                (
                    SlotRole::Ptr { .. },
                    SlotType::U64,
                    Some(ArgView::Tensor { layout, base, .. }),
                ) => {
                    let elem = layout.dtype.size_bytes() as u64;
                    Some(SlotValue::U64(base + layout.offset as u64 * elem))
                }
                (
                    SlotRole::Extent { dim, .. },
                    SlotType::S32,
                    Some(ArgView::Tensor { layout, .. }),
                ) => layout.shape.get(dim).map(|&n| SlotValue::S32(n as i32)),
                (
                    SlotRole::Stride { dim, .. },
                    SlotType::S64,
                    Some(ArgView::Tensor { layout, .. }),
                ) => layout.strides.get(dim).map(|&s| SlotValue::S64(s as i64)),
                (SlotRole::TensorMap { param }, SlotType::TensorMap, Some(_)) => {
                    maps.get(&param).map(SlotValue::Map)
                }
                (SlotRole::Scalar { .. }, SlotType::F32, Some(ArgView::F32(v))) => {
                    Some(SlotValue::F32(*v))
                }
                (SlotRole::Scalar { .. }, SlotType::S32, Some(ArgView::I32(v))) => {
                    Some(SlotValue::S32(*v))
                }
                (SlotRole::Scalar { .. }, SlotType::U32, Some(ArgView::U32(v))) => {
                    Some(SlotValue::U32(*v))
                }
                _ => None,
            };
            values.push(value.ok_or_else(|| LaunchError::AbiMismatch {
                slot: format!("{role:?} ({})", ty.ptx()),
            })?);
        }
        Ok(ParamBuffer { slots: values })
    }

    /// The slot values, in order.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> &[SlotValue<'m>] {
        &self.slots
    }

    /// One pointer per slot, as `cuLaunchKernel`'s `kernelParams` wants; valid while `self`
    /// is borrowed mutably and not moved, and the maps it was packed with live.
    pub(crate) fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| match s {
                SlotValue::U64(v) => (v as *mut u64).cast(),
                SlotValue::S32(v) => (v as *mut i32).cast(),
                SlotValue::U32(v) => (v as *mut u32).cast(),
                SlotValue::S64(v) => (v as *mut i64).cast(),
                SlotValue::F32(v) => (v as *mut f32).cast(),
                // Read-only to the driver, like every parameter.
                SlotValue::Map(m) => std::ptr::from_ref::<sys::CUtensorMap>(m).cast_mut().cast(),
            })
            .collect()
    }
}

/// The index of the parameter a slot belongs to; `None` for the logical grid's slots.
fn slot_param(role: SlotRole) -> Option<usize> {
    match role {
        SlotRole::Ptr { param }
        | SlotRole::Extent { param, .. }
        | SlotRole::Stride { param, .. }
        | SlotRole::TensorMap { param }
        | SlotRole::Scalar { param } => Some(param),
        SlotRole::Grid { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use kiln_ir::DType;

    const SIG: &[ParamSig] = &[
        ParamSig::Tensor {
            name: "x",
            dtype: DType::Bf16,
            dtype_param: None,
            rank: 2,
            mutable: false,
        },
        ParamSig::Scalar {
            name: "scale",
            dtype: DType::F32,
        },
        ParamSig::Scalar {
            name: "n",
            dtype: DType::I32,
        },
    ];

    #[test]
    fn tensor_packs_address_of_first_element_extents_and_strides() {
        let whole = Layout::contiguous(DType::Bf16, &[4, 10]);
        let view = whole.narrow(1, 3, 5).expect("in range");
        let args = [
            ArgView::Tensor {
                layout: &view,
                base: 0x1000,
                alloc_bytes: 80,
                context: 0,
            },
            ArgView::F32(0.25),
            ArgView::I32(-3),
        ];
        let no_maps = BTreeMap::new();
        let mut p = ParamBuffer::pack(SIG, &args, &no_maps, None).expect("valid");
        assert_eq!(
            p.slots(),
            [
                SlotValue::U64(0x1006),
                SlotValue::S32(4),
                SlotValue::S32(5),
                SlotValue::S64(10),
                SlotValue::S64(1),
                SlotValue::F32(0.25),
                SlotValue::S32(-3),
            ]
        );
        let ptrs = p.pointers();
        assert_eq!(ptrs.len(), 7);
        // SAFETY: the pointers point into `p`, which is alive and not moved.
        let (addr, stride) = unsafe { (*ptrs[0].cast::<u64>(), *ptrs[3].cast::<i64>()) };
        assert_eq!((addr, stride), (0x1006, 10));
    }

    #[test]
    fn tma_tensor_gets_its_map_after_its_strides_by_value() {
        let layout = Layout::contiguous(DType::Bf16, &[4, 16]);
        let args = [
            ArgView::Tensor {
                layout: &layout,
                base: 0x2000,
                alloc_bytes: 128,
                context: 0,
            },
            ArgView::F32(0.5),
            ArgView::I32(7),
        ];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        map.opaque[0] = 0xABCD;
        map.opaque[15] = 0x1234;
        let maps = BTreeMap::from([(0, map)]);
        let mut p = ParamBuffer::pack(SIG, &args, &maps, None).expect("valid");
        assert_eq!(p.slots().len(), 8);
        assert_eq!(p.slots()[5], SlotValue::Map(&map));
        assert_eq!(p.slots()[6], SlotValue::F32(0.5));
        let ptrs = p.pointers();
        // SAFETY: slot 5 points at the map in `maps`, which is alive and not moved.
        let words = unsafe { (*ptrs[5].cast::<sys::CUtensorMap>()).opaque };
        assert_eq!((words[0], words[15]), (0xABCD, 0x1234));
    }

    #[test]
    fn unvalidated_mismatch_is_an_error_not_a_panic() {
        let err = ParamBuffer::pack(SIG, &[ArgView::F32(1.0)], &BTreeMap::new(), None)
            .expect_err("scalar for tensor");
        assert!(matches!(err, LaunchError::AbiMismatch { .. }), "{err}");
        assert!(err.to_string().starts_with("internal kiln error"), "{err}");
    }
}
