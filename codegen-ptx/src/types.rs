//! Virtual registers of the PTX writer: classes, names and the allocator.

use std::fmt;

use kiln_ir::DType;

/// A PTX register class; each is declared once as a `%<prefix><N>` range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// `.pred %p`.
    Pred,
    /// `.b16 %h`: bf16 and f16 elements.
    B16,
    /// `.b32 %r`: i32 and u32 values, packed pairs, shared addresses.
    B32,
    /// `.f32 %f`.
    F32,
    /// `.b64 %rd`: global addresses and 64-bit offsets.
    B64,
    /// `.f64 %fd`: the f64 steps of the transcendental functions.
    F64,
}

impl Class {
    /// Every class, in declaration order.
    pub const ALL: [Class; 6] = [
        Class::Pred,
        Class::B16,
        Class::B32,
        Class::F32,
        Class::B64,
        Class::F64,
    ];

    fn prefix(self) -> &'static str {
        match self {
            Class::Pred => "p",
            Class::B16 => "h",
            Class::B32 => "r",
            Class::F32 => "f",
            Class::B64 => "rd",
            Class::F64 => "fd",
        }
    }

    fn decl(self) -> &'static str {
        match self {
            Class::Pred => ".pred",
            Class::B16 => ".b16",
            Class::B32 => ".b32",
            Class::F32 => ".f32",
            Class::B64 => ".b64",
            Class::F64 => ".f64",
        }
    }

    /// The class holding one element of `dtype`.
    pub fn of(dtype: DType) -> Class {
        match dtype {
            DType::Bf16 | DType::F16 => Class::B16,
            DType::F32 => Class::F32,
            DType::I32 | DType::U32 => Class::B32,
            DType::Bool => Class::Pred,
        }
    }
}

/// A virtual register; prints as `%f12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg {
    /// Its class.
    pub class: Class,
    /// Its number within the class.
    pub index: u32,
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}{}", self.class.prefix(), self.index)
    }
}

/// Hands out registers in a fixed order, so the output is deterministic.
#[derive(Debug, Default)]
pub struct Regs {
    counts: [u32; 6],
}

impl Regs {
    /// A fresh register of `class`.
    pub fn new_reg(&mut self, class: Class) -> Reg {
        let slot = &mut self.counts[class as usize];
        let index = *slot;
        *slot += 1;
        Reg { class, index }
    }

    /// The `.reg` declarations of every class used.
    pub fn declarations(&self) -> String {
        let mut out = String::new();
        for class in Class::ALL {
            let n = self.counts[class as usize];
            if n > 0 {
                out.push_str(&format!(
                    "\t.reg {} %{}<{n}>;\n",
                    class.decl(),
                    class.prefix()
                ));
            }
        }
        out
    }
}

/// The PTX spelling of an f32 immediate (`0f3F800000`).
pub fn f32_imm(x: f64) -> String {
    format!("0f{:08X}", (x as f32).to_bits())
}

/// The PTX type suffix used for arithmetic on `dtype` elements held in registers (bf16 and
/// f16 are computed in f32).
pub fn arith_ty(dtype: DType) -> &'static str {
    match dtype {
        DType::Bf16 | DType::F16 | DType::F32 => "f32",
        DType::I32 => "s32",
        DType::U32 => "u32",
        DType::Bool => "pred",
    }
}

/// The PTX name of a 16-bit float element type (the mma and wgmma operand types, and the
/// types converted to f32 for arithmetic); `None` for the others.
pub fn half_ty(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::Bf16 => Some("bf16"),
        DType::F16 => Some("f16"),
        DType::F32 | DType::I32 | DType::U32 | DType::Bool => None,
    }
}

/// The PTX type used to move one element of `dtype`.
pub fn mem_ty(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::Bf16 | DType::F16 => "b16",
        DType::I32 | DType::U32 => "b32",
        DType::Bool => "u8",
    }
}
