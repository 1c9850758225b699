//! Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
//! easy as 1, 2, 3", SC'11), with the conventions of Triton's `tl.randint4x`, `tl.randint`,
//! `tl.rand`, `tl.rand4x` and `tl.randn`, so a kernel ported from Triton draws the same
//! numbers. The key is a 64-bit [`Seed`], the counter `(offset, 0, 0, 0)` per element of the
//! `offsets` tile (i32 or u32; an i32 offset is taken as its bits). Philox is written in the
//! DSL's own ops (`umulhi`, `*`, `^`, `+`): about 80 integer instructions per offset, with the
//! key schedule computed once per block as scalars, and the words that start at zero folded
//! away.

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Loc, OpKind, UnaryOp};
use crate::types::DType;

use super::value::{self, AsValue, Operand, Value, binary, unary};

/// Philox's first round multiplier (applied to counter word 0).
pub const ROUND_A: u32 = 0xD251_1F53;
/// Philox's second round multiplier (applied to counter word 2).
pub const ROUND_B: u32 = 0xCD9E_8D57;
/// The Weyl increment of key word 0 between rounds.
pub const KEY_A: u32 = 0x9E37_79B9;
/// The Weyl increment of key word 1 between rounds.
pub const KEY_B: u32 = 0xBB67_AE85;
/// Rounds of Philox4x32-10.
pub const ROUNDS: usize = 10;
/// Triton's scale from a non-negative i32 to `[0, 1)`, rounded to f32 where it is used: the
/// largest with `i32::MAX as f32 * scale < 1` in f32.
pub const UNIFORM_SCALE: f64 = 4.656_612_734_2e-10;
/// The smallest uniform `randn` takes the logarithm of.
pub const RANDN_MIN_UNIFORM: f64 = 1.0e-7;

/// What [`randint`] and friends take as the seed: a 64-bit key split into two 32-bit words
/// `(lo, hi)`. A scalar `u32` value (`hi = 0`), a scalar `i32` value (sign-extended to 64
/// bits, as Triton widens an `int32` seed), a pair `(lo, hi)` of scalar i32/u32 values for a
/// full 64-bit seed passed as two kernel arguments, or a Rust integer (`u64`, `u32`, `i32`).
pub trait Seed {
    /// The two u32 key words `(lo, hi)`, or `None` after recording a diagnostic.
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)>;
}

impl Seed for Value {
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)> {
        let ty = self.ty()?;
        match (ty.shape(), ty.dtype()) {
            (None, DType::U32) => Some((*self, word(0, loc))),
            (None, DType::I32) => {
                let hi = binary(BinaryOp::Shr, Operand::Value(*self), Operand::Int(31), loc);
                Some((as_u32(*self, loc), as_u32(hi, loc)))
            }
            _ => bad_seed(what, &ty.to_string(), loc),
        }
    }
}

impl Seed for &Value {
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)> {
        (**self).key(what, loc)
    }
}

impl Seed for (Value, Value) {
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)> {
        let mut words = [self.0, self.1];
        for w in &mut words {
            let ty = w.ty()?;
            match (ty.shape(), ty.dtype()) {
                (None, DType::U32 | DType::I32) => *w = as_u32(*w, loc),
                _ => return bad_seed(what, &format!("a pair holding {}", ty.words()), loc),
            }
        }
        Some((words[0], words[1]))
    }
}

impl Seed for u64 {
    fn key(&self, _: &str, loc: Loc) -> Option<(Value, Value)> {
        Some((word(*self as u32, loc), word((*self >> 32) as u32, loc)))
    }
}

impl Seed for u32 {
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)> {
        u64::from(*self).key(what, loc)
    }
}

impl Seed for i32 {
    fn key(&self, what: &str, loc: Loc) -> Option<(Value, Value)> {
        (i64::from(*self) as u64).key(what, loc)
    }
}

fn bad_seed(what: &str, found: &str, loc: Loc) -> Option<(Value, Value)> {
    value::fail(
        Diagnostic::new(
            loc,
            format!("the seed of `{what}` must be a scalar i32 or u32, found {found}"),
        )
        .note("a 64-bit seed is a pair `(lo, hi)` of scalars, or a Rust u64"),
    );
    None
}

/// A u32 constant.
fn word(v: u32, loc: Loc) -> Value {
    Operand::Int(i64::from(v)).place(Some(DType::U32), loc)
}

/// `x` as u32: its bits, for an i32.
fn as_u32(x: Value, loc: Loc) -> Value {
    match x.ty().map(|t| t.dtype()) {
        Some(DType::U32) => x,
        _ => value::emit(OpKind::Bitcast { to: DType::U32 }, &[x], loc),
    }
}

/// A Philox word: a traced u32 value, or a known zero (three of the four counter words start
/// at zero; their ops fold away in the first rounds).
#[derive(Clone, Copy)]
enum Word {
    Zero,
    Val(Value),
}

impl Word {
    fn xor(self, other: Word, loc: Loc) -> Word {
        match (self, other) {
            (Word::Zero, w) | (w, Word::Zero) => w,
            (Word::Val(a), Word::Val(b)) => Word::Val(binary(
                BinaryOp::BitXor,
                Operand::Value(a),
                Operand::Value(b),
                loc,
            )),
        }
    }

    fn times(self, m: u32, op: BinaryOp, loc: Loc) -> Word {
        match self {
            Word::Zero => Word::Zero,
            Word::Val(v) => Word::Val(binary(
                op,
                Operand::Int(i64::from(m)),
                Operand::Value(v),
                loc,
            )),
        }
    }

    fn value(self, like: Value, loc: Loc) -> Value {
        match self {
            Word::Val(v) => v,
            // Never reached after ten rounds; a zero of the counter's shape if it were.
            Word::Zero => binary(BinaryOp::Mul, Operand::Value(like), Operand::Int(0), loc),
        }
    }
}

/// The first `want` words of Philox4x32-10 of counter `(c0, 0, 0, 0)` under `key`; the last
/// round computes only those words.
fn philox(key: (Value, Value), c0: Value, want: usize, loc: Loc) -> Vec<Value> {
    let (mut k0, mut k1) = key;
    let mut c = [Word::Val(c0), Word::Zero, Word::Zero, Word::Zero];
    for round in 0..ROUNDS {
        let need = |i: usize| round + 1 < ROUNDS || i < want;
        let mut next = [Word::Zero; 4];
        if need(0) {
            next[0] = c[2]
                .times(ROUND_B, BinaryOp::MulHi, loc)
                .xor(c[1], loc)
                .xor(Word::Val(k0), loc);
        }
        if need(1) {
            next[1] = c[2].times(ROUND_B, BinaryOp::Mul, loc);
        }
        if need(2) {
            next[2] = c[0]
                .times(ROUND_A, BinaryOp::MulHi, loc)
                .xor(c[3], loc)
                .xor(Word::Val(k1), loc);
        }
        if need(3) {
            next[3] = c[0].times(ROUND_A, BinaryOp::Mul, loc);
        }
        c = next;
        if round + 1 < ROUNDS {
            let bump = |k: Value, inc: u32| {
                binary(
                    BinaryOp::Add,
                    Operand::Value(k),
                    Operand::Int(i64::from(inc)),
                    loc,
                )
            };
            k0 = bump(k0, KEY_A);
            k1 = bump(k1, KEY_B);
        }
    }
    c[..want].iter().map(|w| w.value(c0, loc)).collect()
}

/// The seed's key and the offsets as a u32 counter word, or `None` (diagnostic recorded).
fn inputs(
    what: &str,
    seed: &impl Seed,
    offsets: Value,
    loc: Loc,
) -> Option<((Value, Value), Value)> {
    let ty = offsets.ty()?;
    if !matches!(ty.dtype(), DType::I32 | DType::U32) {
        value::fail(Diagnostic::new(
            loc,
            format!(
                "the offsets of `{what}` must be i32 or u32, found {}",
                ty.words()
            ),
        ));
        return None;
    }
    let key = seed.key(what, loc)?;
    Some((key, as_u32(offsets, loc)))
}

/// Four u32 tiles of random bits per offset: the four words of Philox4x32-10 of counter
/// `(offset, 0, 0, 0)` under `seed`'s key (Triton's `tl.randint4x`).
#[track_caller]
pub fn randint4x(seed: impl Seed, offsets: impl AsValue) -> [Value; 4] {
    let loc = Loc::caller();
    match inputs("randint4x", &seed, offsets.as_value(), loc) {
        Some((key, c0)) => {
            let w = philox(key, c0, 4, loc);
            [w[0], w[1], w[2], w[3]]
        }
        None => [Value::POISON; 4],
    }
}

/// A u32 tile of random bits: the first word of [`randint4x`] (Triton's `tl.randint`).
#[track_caller]
pub fn randint(seed: impl Seed, offsets: impl AsValue) -> Value {
    let loc = Loc::caller();
    match inputs("randint", &seed, offsets.as_value(), loc) {
        Some((key, c0)) => philox(key, c0, 1, loc)[0],
        None => Value::POISON,
    }
}

/// An f32 tile uniform in `[0, 1)` (Triton's `tl.rand`): [`randint`]'s u32 `x` mapped as
/// Triton does: read `x` as i32, replace a negative `v` by `-v - 1` (that is `!v`), convert to
/// f32 and multiply by [`UNIFORM_SCALE`].
#[track_caller]
pub fn rand(seed: impl Seed, offsets: impl AsValue) -> Value {
    let loc = Loc::caller();
    match inputs("rand", &seed, offsets.as_value(), loc) {
        Some((key, c0)) => uniform(philox(key, c0, 1, loc)[0], loc),
        None => Value::POISON,
    }
}

/// Four f32 tiles uniform in `[0, 1)` per offset (Triton's `tl.rand4x`): the four words of
/// [`randint4x`], each mapped as [`rand`] maps its word. One Philox call gives four numbers, so
/// a kernel that needs many draws takes a quarter of [`rand`]'s integer work per number.
#[track_caller]
pub fn rand4x(seed: impl Seed, offsets: impl AsValue) -> [Value; 4] {
    let loc = Loc::caller();
    match inputs("rand4x", &seed, offsets.as_value(), loc) {
        Some((key, c0)) => {
            let w = philox(key, c0, 4, loc);
            [0, 1, 2, 3].map(|i| uniform(w[i], loc))
        }
        None => [Value::POISON; 4],
    }
}

/// An f32 tile of standard normal samples (Triton's `tl.randn`): Box-Muller on the first two
/// words of [`randint4x`], `sqrt(-2 ln max(u1, 1e-7)) * cos(2 pi u2)`, with `ln` as
/// `ln 2 * log2` (the GPU's `lg2.approx`, so `randn` matches a reference to about 1e-6, not
/// bit for bit).
#[track_caller]
pub fn randn(seed: impl Seed, offsets: impl AsValue) -> Value {
    let loc = Loc::caller();
    let Some((key, c0)) = inputs("randn", &seed, offsets.as_value(), loc) else {
        return Value::POISON;
    };
    let w = philox(key, c0, 2, loc);
    let u1 = uniform(w[0], loc);
    let u2 = uniform(w[1], loc);
    let u1 = binary(
        BinaryOp::Max,
        Operand::Value(u1),
        Operand::Float(RANDN_MIN_UNIFORM),
        loc,
    );
    let theta = binary(
        BinaryOp::Mul,
        Operand::Value(u2),
        Operand::Float(std::f64::consts::TAU),
        loc,
    );
    // -2 ln u1: the accurate logarithm, times -2 (exact).
    let l = unary(UnaryOp::Log, u1, loc);
    let m2 = binary(BinaryOp::Mul, Operand::Value(l), Operand::Float(-2.0), loc);
    let r = unary(UnaryOp::Sqrt, m2, loc);
    let c = unary(UnaryOp::Cos, theta, loc);
    binary(BinaryOp::Mul, Operand::Value(r), Operand::Value(c), loc)
}

/// `x` (u32 bits) as a float in `[0, 1)`, as Triton's `uint_to_uniform_float`.
fn uniform(x: Value, loc: Loc) -> Value {
    let s = value::emit(OpKind::Bitcast { to: DType::I32 }, &[x], loc);
    let negative = binary(BinaryOp::Lt, Operand::Value(s), Operand::Int(0), loc);
    let flipped = unary(UnaryOp::Not, s, loc);
    let v = value::emit(OpKind::Select, &[negative, flipped, s], loc);
    let f = value::emit(OpKind::Cast { to: DType::F32 }, &[v], loc);
    binary(
        BinaryOp::Mul,
        Operand::Value(f),
        Operand::Float(UNIFORM_SCALE),
        loc,
    )
}
