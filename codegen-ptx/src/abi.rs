//! The kernel parameter ABI: how a kernel's [`Param`]s become `.entry` parameters.
//!
//! Every kiln entry takes its parameters in [`Kernel::params`](kiln_ir::Kernel) order, each
//! expanded into one or more PTX parameter *slots* ([`Slot`]): a tensor's base address,
//! extents and strides (in elements), a scalar's value, and on sm_90a a TMA tensor map and a
//! persistent kernel's logical grid. [`slots`] lists them, with the slot table, the alignment
//! rules and the launch contract, so the runtime need not re-derive them.

use std::fmt;

use kiln_ir::{DType, Param};

/// The PTX type of one parameter slot; also the width of the value the runtime passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotType {
    /// `.u64`: a device address.
    U64,
    /// `.s32`: an extent or an `i32` scalar.
    S32,
    /// `.u32`: a `u32` scalar.
    U32,
    /// `.s64`: a stride in elements.
    S64,
    /// `.f32`: an `f32` scalar.
    F32,
    /// `.align 64 .b8 name[128]`: a `CUtensorMap` passed by value (sm_90a TMA).
    TensorMap,
}

impl SlotType {
    /// PTX spelling (`.u64`, ...).
    pub fn ptx(self) -> &'static str {
        match self {
            SlotType::U64 => ".u64",
            SlotType::S32 => ".s32",
            SlotType::U32 => ".u32",
            SlotType::S64 => ".s64",
            SlotType::F32 => ".f32",
            SlotType::TensorMap => ".align 64 .b8",
        }
    }

    /// Size of the value in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            SlotType::U64 | SlotType::S64 => 8,
            SlotType::S32 | SlotType::U32 | SlotType::F32 => 4,
            SlotType::TensorMap => 128,
        }
    }
}

/// What a slot carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotRole {
    /// Base address of tensor parameter `param`.
    Ptr {
        /// Index into the kernel's parameters.
        param: usize,
    },
    /// Extent of dimension `dim` of tensor parameter `param`.
    Extent {
        /// Index into the kernel's parameters.
        param: usize,
        /// Dimension, outermost first.
        dim: usize,
    },
    /// Stride, in elements, of dimension `dim` of tensor parameter `param`.
    Stride {
        /// Index into the kernel's parameters.
        param: usize,
        /// Dimension, outermost first.
        dim: usize,
    },
    /// The TMA descriptor (`CUtensorMap`, 128 bytes by value) of tensor parameter `param`,
    /// described by the module's [`TensorMapSpec`](crate::TensorMapSpec) for `param`.
    TensorMap {
        /// Index into the kernel's parameters.
        param: usize,
    },
    /// The value of scalar parameter `param`.
    Scalar {
        /// Index into the kernel's parameters.
        param: usize,
    },
    /// A persistent kernel's logical grid extent along `axis` (0: x, 1: y, 2: z).
    Grid {
        /// The axis.
        axis: usize,
    },
}

/// One `.param` of the entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// What it carries.
    pub role: SlotRole,
    /// Its PTX type.
    pub ty: SlotType,
    /// Its PTX name (`<param>_ptr`, `<param>_dim<d>`, `<param>_stride<d>`, `<param>`; a
    /// parameter whose name is not a plain ASCII identifier is called `arg<index>`).
    pub name: String,
}

/// Why a parameter has no ABI.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    /// A scalar parameter of a type the ABI does not pass.
    #[error("scalar parameter `{name}` has type {dtype}; kernels take f32 or i32 scalars")]
    ScalarType {
        /// The parameter's name.
        name: String,
        /// Its element type.
        dtype: DType,
    },
}

/// The entry's parameter slots for `params`, in launch order.
///
/// Each parameter expands into these slots:
///
/// | kiln parameter                 | slots, in order                                           |
/// | ------------------------------ | --------------------------------------------------------- |
/// | `Tensor { rank: r, .. }`       | `.u64` base address (device pointer, bytes),              |
/// |                                | then `r` x `.s32` extents, outermost dimension first,     |
/// |                                | then `r` x `.s64` strides **in elements**, outermost first |
/// | `Scalar { dtype: F32 }`        | one `.f32`                                                |
/// | `Scalar { dtype: I32 }`        | one `.s32`                                                |
///
/// Every tensor passes all `r` strides, including the innermost one, which must be 1 (the IR
/// assumes it; the runtime checks it and the kernel never reads it). Extents must fit in an
/// `i32` and be non-negative. For a tensor marked `aligned16` the base address and every stride
/// but the innermost, times the element size, must be multiples of 16 bytes: the kernel then
/// uses 16-byte vector accesses and cp.async, and a misaligned argument would fault.
///
/// On sm_90a a tensor loaded through TMA also takes a `.param .align 64 .b8 <name>_tmap[128]`
/// slot right after its strides ([`SlotRole::TensorMap`]): a `CUtensorMap` the runtime encodes
/// from the module's [`TensorMapSpec`](crate::TensorMapSpec) over the same tensor and passes by
/// value (`kernelParams[i]` points at the 128 bytes).
///
/// A persistent kernel (sm_90a, `kiln_ir::sched::tiles`) takes three more `.s32` slots at the
/// end, `kiln_grid_x`, `kiln_grid_y` and `kiln_grid_z` ([`SlotRole::Grid`]): the logical grid
/// the caller asked for, whose blocks its CTAs walk as work tiles.
///
/// With the driver's `cuLaunchKernel(.., kernelParams, ..)` the runtime passes one pointer per
/// slot, in slot order, to a value of the slot's width (`u64`, `i32`, `i64`, `f32`); the driver
/// lays them out.
///
/// Launch geometry is not part of the parameter list (but for a persistent kernel's logical
/// grid): the grid is chosen by the caller (for a persistent kernel, by the runtime: at most
/// as many CTAs as fit on the GPU at once, in x), the block is
/// `PtxModule::threads_per_block` threads in x, and the launch must request
/// `PtxModule::dynamic_smem_bytes` of dynamic shared memory (setting
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` first when it exceeds 48 KiB).
pub fn slots(params: &[Param]) -> Result<Vec<Slot>, AbiError> {
    slots_with_maps(params, &[], false)
}

/// The slots of an entry whose tensor parameters `tma` (indices) are read through TMA (each
/// of them gets a `<name>_tmap` slot after its strides), with the logical grid's slots at the
/// end when the kernel is `persistent`: [`slot_roles`], each named.
pub fn slots_with_maps(
    params: &[Param],
    tma: &[usize],
    persistent: bool,
) -> Result<Vec<Slot>, AbiError> {
    let kinds = params.iter().map(|p| match p {
        Param::Tensor { rank, .. } => ParamKind::Tensor { rank: *rank },
        Param::Scalar { dtype, .. } => ParamKind::Scalar { dtype: *dtype },
    });
    let roles = slot_roles(kinds, tma, persistent).map_err(|index| AbiError::ScalarType {
        name: params[index].name().to_string(),
        dtype: params[index].dtype(),
    })?;
    let names: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, p)| ptx_name(p.name(), i))
        .collect();
    Ok(roles
        .into_iter()
        .map(|(role, ty)| Slot {
            role,
            ty,
            name: slot_name(role, &names),
        })
        .collect())
}

/// What the slot table needs of a parameter: a tensor's rank or a scalar's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A tensor of `rank` dimensions.
    Tensor {
        /// Its rank.
        rank: usize,
    },
    /// A scalar of type `dtype`.
    Scalar {
        /// Its element type.
        dtype: DType,
    },
}

/// The roles and types of the slots [`slots_with_maps`] lists, without their names: what a
/// launch packs (no string is built per launch). `Err(index)`: parameter `index` is a scalar
/// of a type the ABI does not pass.
pub fn slot_roles(
    params: impl IntoIterator<Item = ParamKind>,
    tma: &[usize],
    persistent: bool,
) -> Result<Vec<(SlotRole, SlotType)>, usize> {
    let mut out = Vec::new();
    for (index, p) in params.into_iter().enumerate() {
        match p {
            ParamKind::Tensor { rank } => {
                out.push((SlotRole::Ptr { param: index }, SlotType::U64));
                out.extend(
                    (0..rank).map(|dim| (SlotRole::Extent { param: index, dim }, SlotType::S32)),
                );
                out.extend(
                    (0..rank).map(|dim| (SlotRole::Stride { param: index, dim }, SlotType::S64)),
                );
                if tma.contains(&index) {
                    out.push((SlotRole::TensorMap { param: index }, SlotType::TensorMap));
                }
            }
            ParamKind::Scalar { dtype } => {
                let ty = match dtype {
                    DType::F32 => SlotType::F32,
                    DType::I32 => SlotType::S32,
                    DType::U32 => SlotType::U32,
                    DType::Bf16 | DType::F16 | DType::Bool => return Err(index),
                };
                out.push((SlotRole::Scalar { param: index }, ty));
            }
        }
    }
    if persistent {
        out.extend((0..3).map(|axis| (SlotRole::Grid { axis }, SlotType::S32)));
    }
    Ok(out)
}

/// The PTX name of the slot with `role`, `names` the parameters' [`ptx_name`]s.
fn slot_name(role: SlotRole, names: &[String]) -> String {
    match role {
        SlotRole::Ptr { param } => format!("{}_ptr", names[param]),
        SlotRole::Extent { param, dim } => format!("{}_dim{dim}", names[param]),
        SlotRole::Stride { param, dim } => format!("{}_stride{dim}", names[param]),
        SlotRole::TensorMap { param } => format!("{}_tmap", names[param]),
        SlotRole::Scalar { param } => names[param].clone(),
        SlotRole::Grid { axis } => format!("kiln_grid_{}", ["x", "y", "z"][axis]),
    }
}

/// The parameter's name if PTX accepts it as an identifier stem, else `arg<index>`.
fn ptx_name(name: &str, index: usize) -> String {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("arg{index}")
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ty {
            SlotType::TensorMap => write!(f, ".param {} {}[128]", self.ty.ptx(), self.name),
            _ => write!(f, ".param {} {}", self.ty.ptx(), self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_expands_to_ptr_extents_strides() {
        let params = vec![
            Param::Tensor {
                name: "x".into(),
                dtype: DType::Bf16,
                rank: 2,
                mutable: false,
                aligned16: true,
            },
            Param::Scalar {
                name: "scale".into(),
                dtype: DType::F32,
            },
        ];
        let got: Vec<String> = slots(&params)
            .expect("valid params")
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            got,
            [
                ".param .u64 x_ptr",
                ".param .s32 x_dim0",
                ".param .s32 x_dim1",
                ".param .s64 x_stride0",
                ".param .s64 x_stride1",
                ".param .f32 scale",
            ]
        );
    }

    #[test]
    fn bf16_scalar_is_rejected_by_name() {
        let params = vec![Param::Scalar {
            name: "s".into(),
            dtype: DType::Bf16,
        }];
        let err = slots(&params).expect_err("bf16 scalar has no ABI");
        assert!(err.to_string().contains("`s`"));
    }
}
