//! Kernels with the shapes of the example kernels, built directly with `kiln_ir::Builder`
//! for the PTX tests (until `kiln-examples` is merged, then these switch to the real ones).

#![allow(dead_code)]

use kiln_ir::{
    Axis, BinaryOp, Builder, Const, DType, Kernel, KernelOptions, Loc, OpKind, Param, ReduceOp,
    Shape, UnaryOp, ValueId,
};

/// A thin layer over [`Builder`] that panics on builder errors (test code only).
pub struct B(pub Builder);

fn loc() -> Loc {
    Loc {
        file: "tests/ptx_common.rs",
        line: 1,
        column: 1,
    }
}

impl B {
    pub fn new(name: &str, params: Vec<Param>, num_warps: u32) -> B {
        B(Builder::new(name, params, KernelOptions { num_warps }))
    }
    pub fn op(&mut self, kind: OpKind, ops: &[ValueId]) -> ValueId {
        self.0.op1(kind, ops, loc()).expect("builder op")
    }
    pub fn i(&mut self, x: i64) -> ValueId {
        self.0
            .constant(Const::Int(x), DType::I32, loc())
            .expect("const")
    }
    pub fn f(&mut self, x: f64) -> ValueId {
        self.0
            .constant(Const::Float(x), DType::F32, loc())
            .expect("const")
    }
    pub fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.op(OpKind::Binary(op), &[a, b])
    }
    pub fn un(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        self.op(OpKind::Unary(op), &[a])
    }
    pub fn block(&mut self, a: Axis) -> ValueId {
        self.op(OpKind::BlockId(a), &[])
    }
    pub fn dim(&mut self, tensor: usize, dim: usize) -> ValueId {
        self.op(OpKind::TensorDim { tensor, dim }, &[])
    }
    pub fn splat(&mut self, x: ValueId, dims: &[usize]) -> ValueId {
        self.op(
            OpKind::Splat {
                shape: Shape(dims.to_vec()),
            },
            &[x],
        )
    }
    pub fn iota(&mut self, dims: &[usize], dim: usize) -> ValueId {
        self.op(
            OpKind::Iota {
                shape: Shape(dims.to_vec()),
                dim,
            },
            &[],
        )
    }
    pub fn reshape(&mut self, x: ValueId, dims: &[usize]) -> ValueId {
        self.op(
            OpKind::Reshape {
                shape: Shape(dims.to_vec()),
            },
            &[x],
        )
    }
    pub fn reduce(&mut self, op: ReduceOp, x: ValueId, dim: usize) -> ValueId {
        self.op(OpKind::Reduce { op, dim }, &[x])
    }
    pub fn load(&mut self, tensor: usize, dims: &[usize], coords: &[ValueId]) -> ValueId {
        self.op(
            OpKind::Load {
                tensor,
                shape: Shape(dims.to_vec()),
            },
            coords,
        )
    }
    pub fn store(&mut self, tensor: usize, coords: &[ValueId], v: ValueId) {
        let mut ops = coords.to_vec();
        ops.push(v);
        self.0
            .op(OpKind::Store { tensor }, &ops, loc())
            .expect("store");
    }
    pub fn cdiv(&mut self, a: ValueId, b: i64) -> ValueId {
        let bm1 = self.i(b - 1);
        let bb = self.i(b);
        let t = self.bin(BinaryOp::Add, a, bm1);
        self.bin(BinaryOp::Div, t, bb)
    }
    pub fn finish(self) -> Kernel {
        self.0.finish().expect("finish")
    }
}

fn tensor(name: &str, dtype: DType, rank: usize, mutable: bool) -> Param {
    Param::Tensor {
        name: name.into(),
        dtype,
        rank,
        mutable,
        aligned16: true,
    }
}

/// `c = a + b` over f32 vectors, one 1024-element tile per block. Grid: `cdiv(n, 1024)`.
pub fn vector_add() -> Kernel {
    let params = vec![
        tensor("a", DType::F32, 1, false),
        tensor("b", DType::F32, 1, false),
        tensor("c", DType::F32, 1, true),
    ];
    let mut b = B::new("vector_add", params, 4);
    let i = b.block(Axis::X);
    let bs = b.i(1024);
    let off = b.bin(BinaryOp::Mul, i, bs);
    let x = b.load(0, &[1024], &[off]);
    let y = b.load(1, &[1024], &[off]);
    let s = b.bin(BinaryOp::Add, x, y);
    b.store(2, &[off], s);
    b.finish()
}

/// Row softmax of `x[M, N]` (f32) into `y`, `BM` rows per block, online max/sum over column
/// tiles of `BN`, then a second pass writing `exp2((x - m) log2e) / l`. Grid: `cdiv(M, BM)`.
pub fn softmax(bm: usize, bn: usize) -> Kernel {
    let params = vec![
        tensor("x", DType::F32, 2, false),
        tensor("y", DType::F32, 2, true),
    ];
    let mut b = B::new("softmax", params, 4);
    let log2e = b.f(std::f64::consts::LOG2_E);
    let ninf = b.f(f64::NEG_INFINITY);
    let zero = b.f(0.0);
    let pid = b.block(Axis::X);
    let bmv = b.i(bm as i64);
    let row0 = b.bin(BinaryOp::Mul, pid, bmv);
    let n = b.dim(0, 1);
    let nt = b.cdiv(n, bn as i64);
    let m0 = b.splat(ninf, &[bm]);
    let l0 = b.splat(zero, &[bm]);
    let (lo, step) = (b.i(0), b.i(1));
    let f =
        b.0.begin_for(lo, nt, step, &[m0, l0], None, loc())
            .expect("for");
    let (j, m, l) = (f.iv, f.carried[0], f.carried[1]);
    let bnv = b.i(bn as i64);
    let col0 = b.bin(BinaryOp::Mul, j, bnv);
    let t = b.load(0, &[bm, bn], &[row0, col0]);
    let io = b.iota(&[1, bn], 1);
    let cols = b.bin(BinaryOp::Add, io, col0);
    let valid = b.bin(BinaryOp::Lt, cols, n);
    let t = b.op(OpKind::Select, &[valid, t, ninf]);
    let rm = b.reduce(ReduceOp::Max, t, 1);
    let m_new = b.bin(BinaryOp::Max, m, rm);
    let mc = b.reshape(m_new, &[bm, 1]);
    let d = b.bin(BinaryOp::Sub, t, mc);
    let d = b.bin(BinaryOp::Mul, d, log2e);
    let p = b.un(UnaryOp::Exp2, d);
    let dm = b.bin(BinaryOp::Sub, m, m_new);
    let dm = b.bin(BinaryOp::Mul, dm, log2e);
    let alpha = b.un(UnaryOp::Exp2, dm);
    let la = b.bin(BinaryOp::Mul, l, alpha);
    let ps = b.reduce(ReduceOp::Sum, p, 1);
    let l_new = b.bin(BinaryOp::Add, la, ps);
    let res = b.0.end_for(&f, &[m_new, l_new], loc()).expect("end_for");
    let (m, l) = (res[0], res[1]);
    let (lo, step) = (b.i(0), b.i(1));
    let f = b.0.begin_for(lo, nt, step, &[], None, loc()).expect("for");
    let j = f.iv;
    let bnv = b.i(bn as i64);
    let col0 = b.bin(BinaryOp::Mul, j, bnv);
    let t = b.load(0, &[bm, bn], &[row0, col0]);
    let mc = b.reshape(m, &[bm, 1]);
    let lc = b.reshape(l, &[bm, 1]);
    let d = b.bin(BinaryOp::Sub, t, mc);
    let d = b.bin(BinaryOp::Mul, d, log2e);
    let p = b.un(UnaryOp::Exp2, d);
    let y = b.bin(BinaryOp::Div, p, lc);
    b.store(1, &[row0, col0], y);
    b.0.end_for(&f, &[], loc()).expect("end_for");
    b.finish()
}

/// `c[M, N] = a[M, K] @ b[K, N]` (bf16 in and out, f32 accumulation), `BM x BN` tiles,
/// `BK`-deep pipelined k loop. Grid: `(cdiv(N, BN), cdiv(M, BM))`.
pub fn gemm(bm: usize, bn: usize, bk: usize, stages: u32, warps: u32) -> Kernel {
    let params = vec![
        tensor("a", DType::Bf16, 2, false),
        tensor("b", DType::Bf16, 2, false),
        tensor("c", DType::Bf16, 2, true),
    ];
    let mut b = B::new("gemm", params, warps);
    let (px, py) = (b.block(Axis::X), b.block(Axis::Y));
    let (bmv, bnv) = (b.i(bm as i64), b.i(bn as i64));
    let row0 = b.bin(BinaryOp::Mul, py, bmv);
    let col0 = b.bin(BinaryOp::Mul, px, bnv);
    let kdim = b.dim(0, 1);
    let kt = b.cdiv(kdim, bk as i64);
    let zero = b.f(0.0);
    let acc0 = b.splat(zero, &[bm, bn]);
    let (lo, step) = (b.i(0), b.i(1));
    let f =
        b.0.begin_for(lo, kt, step, &[acc0], Some(stages), loc())
            .expect("for");
    let (kk, acc) = (f.iv, f.carried[0]);
    let bkv = b.i(bk as i64);
    let k0 = b.bin(BinaryOp::Mul, kk, bkv);
    let at = b.load(0, &[bm, bk], &[row0, k0]);
    let bt = b.load(1, &[bk, bn], &[k0, col0]);
    let prod = b.op(OpKind::Mma, &[at, bt]);
    let acc_new = b.bin(BinaryOp::Add, acc, prod);
    let res = b.0.end_for(&f, &[acc_new], loc()).expect("end_for");
    let out = b.op(OpKind::Cast { to: DType::Bf16 }, &[res[0]]);
    b.store(2, &[row0, col0], out);
    b.finish()
}

/// FlashAttention-2 forward: q, k, v, o `[batch, heads, seq, d]` bf16, `scale` f32; causal
/// aligned bottom-right. Grid: `(cdiv(sq, 128), heads, batch)`.
pub fn attention(d: usize, causal: bool) -> Kernel {
    let (bm, bn) = (128usize, if d <= 64 { 128usize } else { 64 });
    let params = vec![
        tensor("q", DType::Bf16, 4, false),
        tensor("k", DType::Bf16, 4, false),
        tensor("v", DType::Bf16, 4, false),
        tensor("o", DType::Bf16, 4, true),
        Param::Scalar {
            name: "scale".into(),
            dtype: DType::F32,
        },
    ];
    let mut b = B::new("attention", params, 4);
    let (mb, h, bb) = (b.block(Axis::X), b.block(Axis::Y), b.block(Axis::Z));
    let zi = b.i(0);
    let bmv = b.i(bm as i64);
    let q0 = b.bin(BinaryOp::Mul, mb, bmv);
    let qs = b.load(0, &[bm, d], &[bb, h, q0, zi]);
    let zero = b.f(0.0);
    let ninf = b.f(f64::NEG_INFINITY);
    let acc0 = b.splat(zero, &[bm, d]);
    let m0 = b.splat(ninf, &[bm]);
    let l0 = b.splat(zero, &[bm]);
    let sq = b.dim(0, 2);
    let sk = b.dim(1, 2);
    let mut nb = b.cdiv(sk, bn as i64);
    let shift = b.bin(BinaryOp::Sub, sk, sq);
    if causal {
        // Last key any row of this block sees: q0 + bm - 1 + shift.
        let one = b.i(1);
        let t = b.bin(BinaryOp::Add, q0, bmv);
        let t = b.bin(BinaryOp::Add, t, shift);
        let t = b.bin(BinaryOp::Sub, t, one);
        let t = b.bin(BinaryOp::Add, t, one);
        let t = b.cdiv(t, bn as i64);
        let t = b.bin(BinaryOp::Max, t, zi);
        nb = b.bin(BinaryOp::Min, nb, t);
    }
    let scale = b.op(OpKind::ScalarParam(4), &[]);
    let log2e = b.f(std::f64::consts::LOG2_E);
    let sl = b.bin(BinaryOp::Mul, scale, log2e);
    let (lo, step) = (b.i(0), b.i(1));
    let f =
        b.0.begin_for(lo, nb, step, &[acc0, m0, l0], Some(2), loc())
            .expect("for");
    let (j, acc, m, l) = (f.iv, f.carried[0], f.carried[1], f.carried[2]);
    let bnv = b.i(bn as i64);
    let k0 = b.bin(BinaryOp::Mul, j, bnv);
    let ks = b.load(1, &[bn, d], &[bb, h, k0, zi]);
    let vs = b.load(2, &[bn, d], &[bb, h, k0, zi]);
    let kt = b.op(OpKind::Transpose, &[ks]);
    let s = b.op(OpKind::Mma, &[qs, kt]);
    let s = b.bin(BinaryOp::Mul, s, sl);
    let io = b.iota(&[1, bn], 1);
    let cols = b.bin(BinaryOp::Add, io, k0);
    let mut valid = b.bin(BinaryOp::Lt, cols, sk);
    if causal {
        let ir = b.iota(&[bm, 1], 0);
        let rows = b.bin(BinaryOp::Add, ir, q0);
        let lim = b.bin(BinaryOp::Add, rows, shift);
        let ok = b.bin(BinaryOp::Le, cols, lim);
        valid = b.bin(BinaryOp::And, valid, ok);
    }
    let s = b.op(OpKind::Select, &[valid, s, ninf]);
    let rm = b.reduce(ReduceOp::Max, s, 1);
    let m_new = b.bin(BinaryOp::Max, m, rm);
    let is_ninf = b.bin(BinaryOp::Eq, m_new, ninf);
    let m_use = b.op(OpKind::Select, &[is_ninf, zero, m_new]);
    let mc = b.reshape(m_use, &[bm, 1]);
    let sd = b.bin(BinaryOp::Sub, s, mc);
    let p = b.un(UnaryOp::Exp2, sd);
    let dm = b.bin(BinaryOp::Sub, m, m_use);
    let alpha = b.un(UnaryOp::Exp2, dm);
    let la = b.bin(BinaryOp::Mul, l, alpha);
    let ps = b.reduce(ReduceOp::Sum, p, 1);
    let l_new = b.bin(BinaryOp::Add, la, ps);
    let ac = b.reshape(alpha, &[bm, 1]);
    let accs = b.bin(BinaryOp::Mul, acc, ac);
    let pb = b.op(OpKind::Cast { to: DType::Bf16 }, &[p]);
    let pv = b.op(OpKind::Mma, &[pb, vs]);
    let acc_new = b.bin(BinaryOp::Add, accs, pv);
    let res =
        b.0.end_for(&f, &[acc_new, m_new, l_new], loc())
            .expect("end_for");
    let (acc, l) = (res[0], res[2]);
    let l_zero = b.bin(BinaryOp::Eq, l, zero);
    let one = b.f(1.0);
    let l_safe = b.op(OpKind::Select, &[l_zero, one, l]);
    let lc = b.reshape(l_safe, &[bm, 1]);
    let out = b.bin(BinaryOp::Div, acc, lc);
    let out = b.op(OpKind::Cast { to: DType::Bf16 }, &[out]);
    b.store(3, &[bb, h, q0, zi], out);
    b.finish()
}

/// Every test kernel with its snapshot name.
pub fn all() -> Vec<(&'static str, Kernel)> {
    vec![
        ("vector_add", vector_add()),
        ("softmax", softmax(4, 256)),
        ("gemm", gemm(128, 128, 32, 3, 8)),
        ("attention", attention(128, false)),
        ("attention_causal", attention(128, true)),
        ("attention_d64", attention(64, false)),
    ]
}
