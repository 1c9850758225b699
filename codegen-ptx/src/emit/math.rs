//! `sin`, `cos`, `tanh`, `erf`, `sigmoid` and `log`: per element, the fixed f64 sequence
//! that [`kiln_ir::math`] specifies, step for step (the same constants, fused multiply-adds
//! and roundings), so the GPU gives the interpreter's bits. No branches: where a function has
//! ranges (small or large arguments, NaN), every range is computed and `selp` picks.
//!
//! An op whose sequences would take more than [`INLINE_MATH_LINES`] lines of a thread's code
//! (a large tile the `strip_mine` pass could not chunk) calls the function instead, written
//! once as a `.func`: the code then grows by a call an element, not by the sequence.

use std::fmt::Write;

use kiln_ir::math;
use kiln_ir::{OpId, UnaryOp};

use super::Emitter;
use crate::types::{Class, Reg, f32_imm};

/// Most PTX lines one op's inline math sequences may take in a thread's code. A chunk of a
/// streamed tile (at most 16 elements a thread, `strip_mine`) and every bundled kernel stay
/// inline, where ptxas interleaves the elements' sequences.
const INLINE_MATH_LINES: usize = 2048;

/// A math function written once as a `.func` of one f32 argument and result.
pub(super) struct MathFunc {
    op: UnaryOp,
    /// The definition, at module scope.
    text: String,
    /// Lines of its body: what inlining it costs an element.
    lines: usize,
    /// Whether an op calls it (and the module must define it).
    called: bool,
}

/// The definitions of the functions `funcs` that were called, in the order first asked for.
pub(super) fn called_funcs(funcs: &[MathFunc]) -> String {
    funcs
        .iter()
        .filter(|f| f.called)
        .map(|f| f.text.as_str())
        .collect()
}

/// The module-scope name of the bits of 2/pi.
const TWO_OVER_PI: &str = "kiln_two_over_pi";

/// The declaration of the bits of 2/pi the reduction of `sin`/`cos` reads.
pub(super) fn two_over_pi_decl() -> String {
    let words: Vec<String> = math::TWO_OVER_PI
        .iter()
        .map(|w| format!("0x{w:08X}"))
        .collect();
    format!(
        ".const .align 4 .b32 {TWO_OVER_PI}[{}] = {{{}}};",
        words.len(),
        words.join(", ")
    )
}

/// The module-scope name of `u`'s function.
fn func_name(u: UnaryOp) -> String {
    format!("kiln_{}_f32", u.name())
}

/// The PTX spelling of an f64 immediate.
fn f64_imm(x: f64) -> String {
    format!("0d{:016X}", x.to_bits())
}

impl Emitter<'_> {
    /// `u(x)` for an f32 register `x`, an element of op `id`'s result, as an f32 register:
    /// inline, or a call where the op's inline sequences would be too long.
    pub(super) fn transcendental(&mut self, id: OpId, u: UnaryOp, x: Reg) -> Reg {
        let at = self.math_func(u);
        let calls = match self.math_calls.get(&id) {
            Some(&c) => c,
            None => {
                let result = self.k.ops[id].results[0];
                let elements = self.dist(result, id).map_or(1, |d| d.regs.len());
                let c = elements * self.math_funcs[at].lines > INLINE_MATH_LINES;
                self.math_calls.insert(id, c);
                c
            }
        };
        if !calls {
            return self.math_inline(u, x);
        }
        self.math_funcs[at].called = true;
        let y = self.new_reg(Class::F32);
        self.ins(format!("call ({y}), {}, ({x})", func_name(u)));
        y
    }

    /// The index in `math_funcs` of `u`'s function, written on first use.
    fn math_func(&mut self, u: UnaryOp) -> usize {
        if let Some(i) = self.math_funcs.iter().position(|f| f.op == u) {
            return i;
        }
        // The body in a register namespace and text of its own.
        let outer_regs = std::mem::take(&mut self.regs);
        let outer_out = std::mem::take(&mut self.out);
        let x = self.new_reg(Class::F32);
        let y = self.math_inline(u, x);
        let regs = std::mem::replace(&mut self.regs, outer_regs);
        let body = std::mem::replace(&mut self.out, outer_out);
        let lines = body.lines().count();
        let mut text = String::new();
        let _ = writeln!(
            text,
            ".func (.reg .f32 %ret) {}(.reg .f32 %arg)\n{{\n{}\tmov.f32 {x}, %arg;\n{body}\tmov.f32 %ret, {y};\n\tret;\n}}",
            func_name(u),
            regs.declarations(),
        );
        self.math_funcs.push(MathFunc {
            op: u,
            text,
            lines,
            called: false,
        });
        self.math_funcs.len() - 1
    }

    /// `u(x)`'s sequence, written here.
    fn math_inline(&mut self, u: UnaryOp, x: Reg) -> Reg {
        match u {
            UnaryOp::Sin => self.sin_quadrant(x, 0),
            UnaryOp::Cos => self.sin_quadrant(x, 1),
            UnaryOp::Tanh => self.tanh(x),
            UnaryOp::Sigmoid => self.sigmoid(x),
            UnaryOp::Log2 => self.log(x, true),
            UnaryOp::Log => self.log(x, false),
            _ => self.erf(x),
        }
    }

    fn f64_op(&mut self, op: &str, srcs: &[&dyn std::fmt::Display]) -> Reg {
        let d = self.new_reg(Class::F64);
        let srcs: Vec<String> = srcs.iter().map(|s| s.to_string()).collect();
        self.ins(format!("{op} {d}, {}", srcs.join(", ")));
        d
    }

    /// Horner's rule with `fma.rn.f64`, highest coefficient first ([`math::horner`]).
    fn horner(&mut self, coeffs: &[f64], x: Reg) -> Reg {
        let n = coeffs.len();
        let mut p = self.f64_op("mov.f64", &[&f64_imm(coeffs[n - 1])]);
        for &c in coeffs[..n - 1].iter().rev() {
            p = self.f64_op("fma.rn.f64", &[&p, &x, &f64_imm(c)]);
        }
        p
    }

    /// `e^y` for an f64 register `|y| <= 220` ([`math::exp64`]).
    fn exp64(&mut self, y: Reg) -> Reg {
        let (hi, lo) = math::ln2_split();
        let t = self.f64_op("mul.rn.f64", &[&y, &f64_imm(std::f64::consts::LOG2_E)]);
        let k = self.f64_op("cvt.rni.f64.f64", &[&t]);
        let nk = self.f64_op("neg.f64", &[&k]);
        let r = self.f64_op("fma.rn.f64", &[&nk, &f64_imm(hi), &y]);
        let r = self.f64_op("fma.rn.f64", &[&nk, &f64_imm(lo), &r]);
        let p = self.horner(&math::exp_coeffs(), r);
        let [ki, bits] = self.new_regs(Class::B64);
        self.ins(format!("cvt.rzi.s64.f64 {ki}, {k}"));
        self.ins(format!("add.s64 {ki}, {ki}, 1023"));
        self.ins(format!("shl.b64 {bits}, {ki}, 52"));
        let scale = self.f64_op("mov.b64", &[&bits]);
        self.f64_op("mul.rn.f64", &[&p, &scale])
    }

    /// `sin(x + quarter * pi/2)` ([`math::sin`], [`math::cos`]).
    fn sin_quadrant(&mut self, x: Reg, quarter: u32) -> Reg {
        let ax = self.new_reg(Class::F32);
        self.ins(format!("abs.f32 {ax}, {x}"));
        let small = self.setp("lt.f32", ax, f32_imm(f64::from(math::REDUCE_FROM)));
        let xs = self.f64_op("cvt.f64.f32", &[&x]);

        // |x| = m * 2^e; the window of 2/pi starts at word j (table index j + 1).
        let [bits, ex, m, e, j, t, idx, j32] = self.new_regs(Class::B32);
        self.ins(format!("mov.b32 {bits}, {x}"));
        self.ins(format!("bfe.u32 {ex}, {bits}, 23, 8"));
        self.ins(format!("and.b32 {m}, {bits}, 8388607"));
        self.ins(format!("or.b32 {m}, {m}, 8388608"));
        self.ins(format!("add.s32 {e}, {ex}, -150"));
        self.ins(format!("add.s32 {t}, {e}, -2"));
        self.ins(format!("shr.s32 {j}, {t}, 5"));
        self.ins(format!("add.s32 {idx}, {j}, 1"));
        self.ins(format!("max.s32 {idx}, {idx}, 0"));
        self.ins(format!("shl.b32 {j32}, {j}, 5"));
        self.two_over_pi = true;
        let [base, off, addr] = self.new_regs(Class::B64);
        self.ins(format!("mov.u64 {base}, {TWO_OVER_PI}"));
        self.ins(format!("mul.wide.s32 {off}, {idx}, 4"));
        self.ins(format!("add.s64 {addr}, {base}, {off}"));
        let w: [Reg; 4] = self.new_regs(Class::B32);
        for (i, wi) in w.iter().enumerate() {
            self.ins(format!("ld.const.u32 {wi}, [{addr}+{}]", 4 * i));
        }
        let [whi, wlo, m64, p0, carry, p1, lo, hi, frac, fr, qq, d] = self.new_regs(Class::B64);
        self.ins(format!("mov.b64 {whi}, {{{}, {}}}", w[1], w[0]));
        self.ins(format!("mov.b64 {wlo}, {{{}, {}}}", w[3], w[2]));
        self.ins(format!("cvt.u64.u32 {m64}, {m}"));
        self.ins(format!("mul.lo.u64 {p0}, {m64}, {wlo}"));
        self.ins(format!("mul.hi.u64 {carry}, {m64}, {wlo}"));
        self.ins(format!("mad.lo.u64 {p1}, {m64}, {whi}, {carry}"));
        // sh = 66 - s with s = e - 32j; the low 64 bits of the product shifted right by sh
        // hold two integer bits and 62 fraction bits of |x| * 2/pi.
        let [sh, sh2] = self.new_regs(Class::B32);
        self.ins(format!("add.s32 {sh}, {j32}, 66"));
        self.ins(format!("sub.s32 {sh}, {sh}, {e}"));
        self.ins(format!("sub.s32 {sh2}, {e}, {j32}"));
        self.ins(format!("add.s32 {sh2}, {sh2}, -2"));
        self.ins(format!("shr.b64 {lo}, {p0}, {sh}"));
        self.ins(format!("shl.b64 {hi}, {p1}, {sh2}"));
        self.ins(format!("or.b64 {frac}, {lo}, {hi}"));
        self.ins(format!("add.s64 {fr}, {frac}, 2305843009213693952"));
        self.ins(format!("shr.u64 {qq}, {fr}, 62"));
        self.ins(format!("shl.b64 {d}, {frac}, 2"));
        let [q, qn] = self.new_regs(Class::B32);
        self.ins(format!("cvt.u32.u64 {q}, {qq}"));
        let rf = self.f64_op("cvt.rn.f64.s64", &[&d]);
        let r = self.f64_op("mul.rn.f64", &[&rf, &f64_imm(math::QUADRANT_SCALE)]);
        // A negative x: the reduction of |x|, negated.
        let neg = self.setp("lt.f32", x, f32_imm(0.0));
        let rn = self.f64_op("neg.f64", &[&r]);
        let r = self.f64_op("selp.f64", &[&rn, &r, &neg]);
        self.ins(format!("neg.s32 {qn}, {q}"));
        self.ins(format!("selp.b32 {q}, {qn}, {q}, {neg}"));
        let r = self.f64_op("selp.f64", &[&xs, &r, &small]);
        self.ins(format!("selp.b32 {q}, 0, {q}, {small}"));
        if quarter != 0 {
            self.ins(format!("add.s32 {q}, {q}, {quarter}"));
        }

        let r2 = self.f64_op("mul.rn.f64", &[&r, &r]);
        let ps = self.horner(&math::sin_coeffs(), r2);
        let s = self.f64_op("mul.rn.f64", &[&r, &ps]);
        let c = self.horner(&math::cos_coeffs(), r2);
        let [b0, b1] = self.new_regs(Class::B32);
        self.ins(format!("and.b32 {b0}, {q}, 1"));
        self.ins(format!("and.b32 {b1}, {q}, 2"));
        let odd = self.setp("ne.b32", b0, 0);
        let flip = self.setp("ne.b32", b1, 0);
        let v = self.f64_op("selp.f64", &[&c, &s, &odd]);
        let vn = self.f64_op("neg.f64", &[&v]);
        let v = self.f64_op("selp.f64", &[&vn, &v, &flip]);
        let out = self.new_reg(Class::F32);
        self.ins(format!("cvt.rn.f32.f64 {out}, {v}"));
        // Infinities and NaN give the interpreter's NaN.
        let [finite] = self.new_regs(Class::Pred);
        self.ins(format!("testp.finite.f32 {finite}, {x}"));
        self.ins(format!(
            "selp.f32 {out}, {out}, 0f{:08X}, {finite}",
            f32::NAN.to_bits()
        ));
        out
    }

    /// `tanh(x)` ([`math::tanh`]).
    fn tanh(&mut self, x: Reg) -> Reg {
        let xf = self.f64_op("cvt.f64.f32", &[&x]);
        let ax = self.f64_op("abs.f64", &[&xf]);
        let a = self.f64_op("min.f64", &[&ax, &f64_imm(math::TANH_CLAMP)]);
        let a2 = self.f64_op("add.rn.f64", &[&a, &a]);
        let e = self.exp64(a2);
        let em = self.f64_op("sub.rn.f64", &[&e, &f64_imm(1.0)]);
        let ep = self.f64_op("add.rn.f64", &[&e, &f64_imm(1.0)]);
        let t = self.f64_op("div.rn.f64", &[&em, &ep]);
        let t = self.f64_op("copysign.f64", &[&xf, &t]);
        let out = self.new_reg(Class::F32);
        self.ins(format!("cvt.rn.f32.f64 {out}, {t}"));
        let linear = self.setp("lt.f64", ax, f64_imm(math::TANH_LINEAR_BELOW));
        let nan = self.setp("nan.f32", x, x);
        self.ins(format!("or.pred {linear}, {linear}, {nan}"));
        self.ins(format!("selp.f32 {out}, {x}, {out}, {linear}"));
        out
    }

    /// `1 / (1 + e^-x)` ([`math::sigmoid`]).
    fn sigmoid(&mut self, x: Reg) -> Reg {
        let xf = self.f64_op("cvt.f64.f32", &[&x]);
        let y = self.f64_op("neg.f64", &[&xf]);
        let y = self.f64_op("max.f64", &[&y, &f64_imm(-math::SIGMOID_CLAMP)]);
        let y = self.f64_op("min.f64", &[&y, &f64_imm(math::SIGMOID_CLAMP)]);
        let e = self.exp64(y);
        let d = self.f64_op("add.rn.f64", &[&e, &f64_imm(1.0)]);
        let s = self.f64_op("rcp.rn.f64", &[&d]);
        let out = self.new_reg(Class::F32);
        self.ins(format!("cvt.rn.f32.f64 {out}, {s}"));
        let nan = self.setp("nan.f32", x, x);
        self.ins(format!("selp.f32 {out}, {x}, {out}, {nan}"));
        out
    }

    /// `erf(x)` ([`math::erf`]).
    fn erf(&mut self, x: Reg) -> Reg {
        let xf = self.f64_op("cvt.f64.f32", &[&x]);
        let a = self.f64_op("abs.f64", &[&xf]);
        let a2 = self.f64_op("mul.rn.f64", &[&a, &a]);
        let p = self.horner(&math::erf_taylor(), a2);
        let small = self.f64_op("mul.rn.f64", &[&a, &p]);
        let t = self.f64_op(
            "fma.rn.f64",
            &[&a, &f64_imm(2.0 / 3.0), &f64_imm(-5.0 / 3.0)],
        );
        let mid = self.clenshaw(&math::ERF_CHEBYSHEV, t);
        let below = self.setp("lt.f64", a, f64_imm(1.0));
        let above = self.setp("ge.f64", a, f64_imm(4.0));
        let v = self.f64_op("selp.f64", &[&f64_imm(1.0), &mid, &above]);
        let v = self.f64_op("selp.f64", &[&small, &v, &below]);
        let v = self.f64_op("copysign.f64", &[&xf, &v]);
        let out = self.new_reg(Class::F32);
        self.ins(format!("cvt.rn.f32.f64 {out}, {v}"));
        // NaN in, the same NaN out (a conversion would choose its own bits).
        let nan = self.setp("nan.f32", x, x);
        self.ins(format!("selp.f32 {out}, {x}, {out}, {nan}"));
        out
    }

    /// `log2(x)` (`base2`) or `ln(x)` ([`math::log2`], [`math::log`]).
    fn log(&mut self, x: Reg, base2: bool) -> Reg {
        let xd = self.f64_op("cvt.f64.f32", &[&x]);
        let [bits, t, k, kk, mb] = self.new_regs(Class::B64);
        self.ins(format!("mov.b64 {bits}, {xd}"));
        self.ins(format!(
            "sub.s64 {t}, {bits}, {}",
            math::LOG_SPLIT_BITS as i64
        ));
        self.ins(format!("shr.s64 {k}, {t}, 52"));
        self.ins(format!("shl.b64 {kk}, {k}, 52"));
        self.ins(format!("sub.s64 {mb}, {bits}, {kk}"));
        let m = self.f64_op("mov.b64", &[&mb]);
        let num = self.f64_op("sub.rn.f64", &[&m, &f64_imm(1.0)]);
        let den = self.f64_op("add.rn.f64", &[&m, &f64_imm(1.0)]);
        let s = self.f64_op("div.rn.f64", &[&num, &den]);
        let s2 = self.f64_op("mul.rn.f64", &[&s, &s]);
        let p = self.horner(&math::log_coeffs(), s2);
        let twos = self.f64_op("add.rn.f64", &[&s, &s]);
        let lnm = self.f64_op("mul.rn.f64", &[&twos, &p]);
        let kf = self.f64_op("cvt.rn.f64.s64", &[&k]);
        let v = if base2 {
            let l2e = f64_imm(std::f64::consts::LOG2_E);
            self.f64_op("fma.rn.f64", &[&lnm, &l2e, &kf])
        } else {
            let ln2 = f64_imm(std::f64::consts::LN_2);
            self.f64_op("fma.rn.f64", &[&kf, &ln2, &lnm])
        };
        let out = self.new_reg(Class::F32);
        self.ins(format!("cvt.rn.f32.f64 {out}, {v}"));
        // IEEE's answers off the positive finite numbers, in [`math::log_special`]'s order
        // (last select wins).
        let inf = self.setp("eq.f32", x, format!("0f{:08X}", f32::INFINITY.to_bits()));
        self.ins(format!("selp.f32 {out}, {x}, {out}, {inf}"));
        let zero = self.setp("eq.f32", x, f32_imm(0.0));
        let ninf = f32::NEG_INFINITY.to_bits();
        self.ins(format!("selp.f32 {out}, 0f{ninf:08X}, {out}, {zero}"));
        let neg = self.setp("lt.f32", x, f32_imm(0.0));
        let nan = f32::NAN.to_bits();
        self.ins(format!("selp.f32 {out}, 0f{nan:08X}, {out}, {neg}"));
        let isnan = self.setp("nan.f32", x, x);
        self.ins(format!("selp.f32 {out}, {x}, {out}, {isnan}"));
        out
    }

    /// Clenshaw's recurrence ([`math::clenshaw`]); the steps whose terms are known zeros (the
    /// first two) are left out, which changes no bit.
    fn clenshaw(&mut self, coeffs: &[f64], t: Reg) -> Reg {
        let n = coeffs.len();
        let t2 = self.f64_op("add.rn.f64", &[&t, &t]);
        // b_{n-1} = c_{n-1} (2t * 0 + c - 0); b_{n-2} = fma(2t, b_{n-1}, c_{n-2}) - 0.
        let mut b1 = self.f64_op("mov.f64", &[&f64_imm(coeffs[n - 1])]);
        let mut b2 = self.f64_op("fma.rn.f64", &[&t2, &b1, &f64_imm(coeffs[n - 2])]);
        std::mem::swap(&mut b1, &mut b2);
        for &c in coeffs[1..n - 2].iter().rev() {
            let f = self.f64_op("fma.rn.f64", &[&t2, &b1, &f64_imm(c)]);
            let b0 = self.f64_op("sub.rn.f64", &[&f, &b2]);
            b2 = b1;
            b1 = b0;
        }
        let f = self.f64_op("fma.rn.f64", &[&t, &b1, &f64_imm(coeffs[0])]);
        self.f64_op("sub.rn.f64", &[&f, &b2])
    }
}
