//! The entry's parameters: every ABI slot ([`crate::abi`]) loaded into registers at entry.

use kiln_ir::{DType, OpId, Param};

use super::{Emitter, ParamRegs};
use crate::abi::{self, SlotRole};
use crate::error::CodegenError;
use crate::types::{Class, Reg};

impl Emitter<'_> {
    /// Loads every parameter slot into registers (each tensor map's generic address too);
    /// returns a persistent kernel's logical grid, from its grid slots.
    pub(crate) fn write_prologue(
        &mut self,
        slots: &[abi::Slot],
    ) -> Result<Option<[Reg; 3]>, CodegenError> {
        let mut grid: Option<[Reg; 3]> = None;
        self.params = self
            .k
            .params
            .iter()
            .map(|p| match p {
                Param::Tensor { .. } => ParamRegs::Tensor {
                    ptr: Reg {
                        class: Class::B64,
                        index: 0,
                    },
                    dims: Vec::new(),
                    strides: Vec::new(),
                    map: None,
                },
                Param::Scalar { .. } => ParamRegs::Scalar(Reg {
                    class: Class::B32,
                    index: 0,
                }),
            })
            .collect();
        self.ins(format!("mov.u32 {}, %tid.x", self.tid));
        if self.k.schedule.smem_bytes > 0 {
            self.ins(format!("mov.u32 {}, kiln_smem", self.smem));
        }
        for s in slots {
            match s.role {
                SlotRole::Ptr { param } => {
                    let raw = self.new_reg(Class::B64);
                    let ptr = self.new_reg(Class::B64);
                    self.ins(format!("ld.param.u64 {raw}, [{}]", s.name));
                    self.ins(format!("cvta.to.global.u64 {ptr}, {raw}"));
                    if let ParamRegs::Tensor { ptr: p, .. } = &mut self.params[param] {
                        *p = ptr;
                    }
                }
                SlotRole::Extent { param, .. } => {
                    let r = self.new_reg(Class::B32);
                    self.ins(format!("ld.param.s32 {r}, [{}]", s.name));
                    if let ParamRegs::Tensor { dims, .. } = &mut self.params[param] {
                        dims.push(r);
                    }
                }
                SlotRole::Stride { param, .. } => {
                    let r = self.new_reg(Class::B64);
                    self.ins(format!("ld.param.s64 {r}, [{}]", s.name));
                    if let ParamRegs::Tensor { strides, .. } = &mut self.params[param] {
                        strides.push(r);
                    }
                }
                SlotRole::TensorMap { param } => {
                    let raw = self.new_reg(Class::B64);
                    let map = self.new_reg(Class::B64);
                    // Without cvta.param the TMA faults at run time (docs/ptx.md §1).
                    self.ins(format!("mov.b64 {raw}, {}", s.name));
                    self.ins(format!("cvta.param.u64 {map}, {raw}"));
                    if let ParamRegs::Tensor { map: m, .. } = &mut self.params[param] {
                        *m = Some(map);
                    }
                }
                SlotRole::Grid { axis } => {
                    let r = self.new_reg(Class::B32);
                    self.ins(format!("ld.param.s32 {r}, [{}]", s.name));
                    grid.get_or_insert([r; 3])[axis] = r;
                }
                SlotRole::Scalar { param } => {
                    let dtype = self.k.params[param].dtype();
                    let r = self.new_reg(Class::of(dtype));
                    let ty = match dtype {
                        DType::F32 => "f32",
                        DType::U32 => "u32",
                        _ => "s32",
                    };
                    self.ins(format!("ld.param.{ty} {r}, [{}]", s.name));
                    self.params[param] = ParamRegs::Scalar(r);
                }
            }
        }
        Ok(grid)
    }

    /// The generic address of tensor parameter `param`'s map, or an internal error at `at`.
    pub(crate) fn tensor_map(&self, param: usize, at: OpId) -> Result<Reg, CodegenError> {
        match self.params.get(param) {
            Some(ParamRegs::Tensor { map: Some(m), .. }) => Ok(*m),
            _ => Err(self.internal(at, "a TMA transfer without a tensor map")),
        }
    }
}
