//! Element types, tile shapes and value types of the tile IR.

use std::fmt;

/// An element type. Tiles and scalars are made of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// bfloat16: 8-bit exponent, 7-bit mantissa. Arithmetic on it rounds to nearest even.
    Bf16,
    /// IEEE binary16.
    F16,
    /// IEEE binary32.
    F32,
    /// 32-bit signed integer: indices, offsets, loop counters.
    I32,
    /// 32-bit unsigned integer: bit patterns, hashes and random numbers. Arithmetic wraps;
    /// division, remainder, comparisons, `min`/`max`, right shifts and conversions read it
    /// as unsigned.
    U32,
    /// A predicate.
    Bool,
}

impl DType {
    /// Size of one element in bytes (`Bool` counts as 1 in memory).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        match self {
            DType::Bf16 | DType::F16 | DType::F32 => true,
            DType::I32 | DType::U32 | DType::Bool => false,
        }
    }

    /// Whether this is a 32-bit integer type (`i32` or `u32`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// The short name used in IR dumps and DSL type parameters.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A compile-time tile shape of rank 1 to 4, outermost dimension first.
///
/// A dimension of extent 1 broadcasts in elementwise operations (`[R, 1]` against `[R, C]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// The number of dimensions (1 to 4).
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The total number of elements.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Extents as a slice.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Rows of a 2-D shape, or the extent of a 1-D one.
    pub fn rows(&self) -> usize {
        self.0[0]
    }

    /// Columns of a 2-D shape; 1 for a 1-D shape.
    pub fn cols(&self) -> usize {
        if self.0.len() == 2 { self.0[1] } else { 1 }
    }

    /// The numpy-style broadcast of two shapes of equal rank, or `None` if they disagree.
    pub fn broadcast(&self, other: &Shape) -> Option<Shape> {
        if self.rank() != other.rank() {
            return None;
        }
        let dims = self
            .0
            .iter()
            .zip(&other.0)
            .map(|(&a, &b)| match (a, b) {
                _ if a == b => Some(a),
                (1, b) => Some(b),
                (a, 1) => Some(a),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Shape(dims))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("x")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// The type of an SSA value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// One element, uniform across the thread block.
    Scalar(DType),
    /// A register tile: a compile-time-shaped array distributed over the block's threads.
    Tile {
        /// Element type.
        dtype: DType,
        /// Extents.
        shape: Shape,
    },
}

impl Type {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Type::Scalar(d) => *d,
            Type::Tile { dtype, .. } => *dtype,
        }
    }

    /// The tile shape, or `None` for a scalar.
    pub fn shape(&self) -> Option<&Shape> {
        match self {
            Type::Scalar(_) => None,
            Type::Tile { shape, .. } => Some(shape),
        }
    }

    /// A tile type.
    pub fn tile(dtype: DType, dims: &[usize]) -> Type {
        Type::Tile {
            dtype,
            shape: Shape(dims.to_vec()),
        }
    }

    /// The same kind of value (scalar or tile of the same shape) with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Type {
        match self {
            Type::Scalar(_) => Type::Scalar(dtype),
            Type::Tile { shape, .. } => Type::Tile {
                dtype,
                shape: shape.clone(),
            },
        }
    }
}

impl Type {
    /// The type in the DSL's words, for messages: `a 64x64 f32 tile`, `an i32 scalar` (the
    /// IR's `rt<f32,64x64>` is for dumps).
    pub fn words(&self) -> String {
        let (lead, text) = match self {
            Type::Scalar(d) => (d.to_string(), format!("{d} scalar")),
            Type::Tile { dtype, shape } => (shape.to_string(), format!("{shape} {dtype} tile")),
        };
        format!("{} {text}", article(&lead))
    }
}

/// `a` or `an` before `word` read aloud: "an f32", "an i32", "an 8x8", "an 11x64", "an
/// 18x32"; "a u32", "a bf16", "a 64x64".
fn article(word: &str) -> &'static str {
    let digits: String = word.chars().take_while(char::is_ascii_digit).collect();
    // Eleven and eighteen, alone or as thousands, millions (11, 18, 11000, ...).
    let eleven = digits.len() % 3 == 2 && (digits.starts_with("11") || digits.starts_with("18"));
    if eleven || word.starts_with(['f', 'i', '8']) {
        "an"
    } else {
        "a"
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Tile { dtype, shape } => write!(f, "rt<{dtype},{shape}>"),
        }
    }
}

/// Most dimensions a tile has: a rank-3 or rank-4 tile's leading dimensions fold into the
/// rows of a 2-D register layout (`passes::layout`), so more would only add bookkeeping.
pub const MAX_RANK: usize = 4;

/// Largest tile extent. A tile too large for registers is streamed in chunks (the
/// `strip_mine` pass), so the bound is what the budget checks there and the interpreter
/// can hold, not a thread's registers.
const MAX_EXTENT: usize = 1 << 20;

/// Most elements of one tile (64 MiB of f32): what the interpreter allocates for it.
const MAX_NUMEL: usize = 1 << 24;

/// Tile extents are powers of two or multiples of 16, at most [`MAX_EXTENT`]. Either maps
/// onto the hardware: a power of two splits evenly over lanes and warps; a multiple of 16
/// (48, 80, 96, 192) is whole 16x8 mma fragments, whole k16 and n8 wgmma steps, whole
/// 16-column TMA boxes of 16-bit elements (32 bytes, the 32-byte swizzle's row) and whole
/// 16-byte ldmatrix chunks. What a target cannot map beyond that (rows per warp, a box
/// count) the passes reject at the op.
pub(crate) fn check_shape(s: &Shape) -> Result<(), String> {
    if s.rank() == 0 || s.rank() > MAX_RANK {
        return Err(format!(
            "tiles have 1 to {MAX_RANK} dimensions, found {}",
            s.rank()
        ));
    }
    for &d in s.dims() {
        if d == 0 || d > MAX_EXTENT || !(d.is_power_of_two() || d.is_multiple_of(16)) {
            return Err(format!(
                "tile extent {d} must be a power of two or a multiple of 16, between 1 and {MAX_EXTENT}"
            ));
        }
    }
    // The extents are checked first, so their product cannot overflow.
    if s.numel() > MAX_NUMEL {
        return Err(format!(
            "a {s} tile has {} elements; a tile holds at most {MAX_NUMEL}",
            s.numel()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{DType, Type};

    /// Types in messages read as the DSL's words, with the article their spoken form takes.
    #[test]
    fn types_read_in_the_dsls_words() {
        for (ty, words) in [
            (Type::tile(DType::F32, &[64, 64]), "a 64x64 f32 tile"),
            (Type::tile(DType::Bf16, &[8, 64]), "an 8x64 bf16 tile"),
            (Type::tile(DType::I32, &[128]), "a 128 i32 tile"),
            (Type::tile(DType::F16, &[11, 32]), "an 11x32 f16 tile"),
            (Type::tile(DType::F16, &[18]), "an 18 f16 tile"),
            (Type::tile(DType::F32, &[1100]), "a 1100 f32 tile"),
            (Type::Scalar(DType::I32), "an i32 scalar"),
            (Type::Scalar(DType::F32), "an f32 scalar"),
            (Type::Scalar(DType::U32), "a u32 scalar"),
            (Type::Scalar(DType::Bool), "a bool scalar"),
        ] {
            assert_eq!(ty.words(), words);
        }
    }
}
