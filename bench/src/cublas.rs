//! cuBLAS GEMM for bf16 row-major tensors (bf16 in, f32 compute, bf16 out): the peer of
//! kiln's gemm, run in the same process on the same stream.

use cudarc::cublas::{CudaBlas, result, sys};
use kiln_runtime::{Device, DeviceTensor};

use crate::error::BenchError;

/// A cuBLAS handle on the device's stream.
#[derive(Debug)]
pub struct Cublas {
    blas: CudaBlas,
}

impl Cublas {
    /// Loads cuBLAS and creates a handle; [`BenchError::NoCublas`] if the library is missing.
    pub fn new(device: &Device) -> Result<Cublas, BenchError> {
        // SAFETY: only tries to dlopen libcublas by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(BenchError::NoCublas);
        }
        let stream = device.cuda_context().default_stream();
        let blas = CudaBlas::new(stream).map_err(|source| BenchError::Cublas {
            call: "cublasCreate",
            source,
        })?;
        Ok(Cublas { blas })
    }

    /// `c[M, N] = a[M, K] @ B`, all contiguous row-major bf16 (asynchronous), where `B` is
    /// `b[K, N]`, or when `b_col_major` `b[N, K]` holding `B` column-major.
    ///
    /// cuBLAS is column-major: a row-major `[R, C]` matrix is its column-major transpose, so
    /// this computes `c^T = B^T a^T` with leading dimensions `N` (or `K`), `K`, `N`: no
    /// transposes for a row-major `b`; a column-major `b` is column-major `B` itself (`K x N`,
    /// leading dimension `K`) and enters transposed.
    pub fn gemm_bf16(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &DeviceTensor,
        b_col_major: bool,
    ) -> Result<(), BenchError> {
        let (m, k, n) = match (a.shape(), c.shape()) {
            (&[m, k], &[_, n]) => (m, k, n),
            _ => (0, 0, 0),
        };
        let b_want = if b_col_major { [n, k] } else { [k, n] };
        let shapes_ok = a.shape().len() == 2 && c.shape() == [m, n] && b.shape() == b_want;
        if !shapes_ok || ![a, b, c].iter().all(|t| t.layout().is_contiguous()) {
            return Err(BenchError::Runtime(kiln_runtime::RuntimeError::Shape {
                what: "cuBLAS gemm operands",
                expected: format!(
                    "contiguous a[M,K], b{}, c[M,N]",
                    if b_col_major { "[N,K]" } else { "[K,N]" }
                ),
                got: format!("a{:?} b{:?} c{:?}", a.shape(), b.shape(), c.shape()),
            }));
        }
        let (b_op, ldb) = if b_col_major {
            (sys::cublasOperation_t::CUBLAS_OP_T, k)
        } else {
            (sys::cublasOperation_t::CUBLAS_OP_N, n)
        };
        let dim = |v: usize| v as i32;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the three buffers are live device allocations of the shapes checked above;
        // alpha/beta are host f32 (the handle's default pointer mode) matching COMPUTE_32F.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                b_op,
                sys::cublasOperation_t::CUBLAS_OP_N,
                dim(n),
                dim(m),
                dim(k),
                (&alpha as *const f32).cast(),
                b.device_ptr() as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                dim(ldb),
                a.device_ptr() as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                dim(k),
                (&beta as *const f32).cast(),
                c.device_ptr() as *mut _,
                sys::cudaDataType::CUDA_R_16BF,
                dim(n),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| BenchError::Cublas {
            call: "cublasGemmEx",
            source,
        })
    }
}
