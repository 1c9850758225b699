//! The runtime's side of the kernel parameter ABI (`kiln_ptx::abi`): each validated argument
//! becomes the slot values the entry declares, and `cuLaunchKernel` gets one pointer per slot.
//!
//! | argument            | slots, in order                                                     |
//! | ------------------- | ------------------------------------------------------------------- |
//! | tensor of rank `r`  | `u64` address of element `[0, .., 0]`, `r` x `s32` extents, `r` x `s64` strides in elements |
//! | `f32` / `i32`       | one `f32` / `s32`                                                   |

use std::ffi::c_void;

use crate::validate::ArgView;

/// One parameter slot's value, at the width the entry declares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum SlotValue {
    /// `.u64` device address.
    U64(u64),
    /// `.s32` extent or scalar.
    S32(i32),
    /// `.s64` stride.
    S64(i64),
    /// `.f32` scalar.
    F32(f32),
}

/// The packed parameters of one launch.
#[derive(Debug)]
pub(crate) struct ParamBuffer {
    slots: Vec<SlotValue>,
}

impl ParamBuffer {
    /// Packs validated arguments (validation guarantees extents fit `i32` and strides `i64`).
    pub(crate) fn pack(args: &[ArgView<'_>]) -> ParamBuffer {
        let mut slots = Vec::new();
        for arg in args {
            match arg {
                ArgView::Tensor { layout, base, .. } => {
                    let elem = layout.dtype.size_bytes() as u64;
                    slots.push(SlotValue::U64(base + layout.offset as u64 * elem));
                    slots.extend(layout.shape.iter().map(|&n| SlotValue::S32(n as i32)));
                    slots.extend(layout.strides.iter().map(|&s| SlotValue::S64(s as i64)));
                }
                ArgView::F32(v) => slots.push(SlotValue::F32(*v)),
                ArgView::I32(v) => slots.push(SlotValue::S32(*v)),
            }
        }
        ParamBuffer { slots }
    }

    /// The slot values, in order.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> &[SlotValue] {
        &self.slots
    }

    /// One pointer per slot, as `cuLaunchKernel`'s `kernelParams` wants; valid while `self`
    /// is borrowed mutably and not moved.
    pub(crate) fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| match s {
                SlotValue::U64(v) => (v as *mut u64).cast(),
                SlotValue::S32(v) => (v as *mut i32).cast(),
                SlotValue::S64(v) => (v as *mut i64).cast(),
                SlotValue::F32(v) => (v as *mut f32).cast(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use kiln_ir::DType;

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
        let mut p = ParamBuffer::pack(&args);
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
}
