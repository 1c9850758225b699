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

    /// `c[M, N] = a[M, K] @ b[K, N]`, all contiguous row-major bf16 (asynchronous).
    ///
    /// cuBLAS is column-major: a row-major `[R, C]` matrix is its column-major transpose, so
    /// this computes `c^T = b^T a^T` with no transposes and leading dimensions `N`, `K`, `N`.
    pub fn gemm_bf16(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &DeviceTensor,
    ) -> Result<(), BenchError> {
        let shapes_ok = match (a.shape(), b.shape(), c.shape()) {
            (&[m, k], &[k2, n], &[m2, n2]) => k == k2 && m == m2 && n == n2,
            _ => false,
        };
        if !shapes_ok || ![a, b, c].iter().all(|t| t.layout().is_contiguous()) {
            return Err(BenchError::Runtime(kiln_runtime::RuntimeError::Shape {
                what: "cuBLAS gemm operands",
                expected: "contiguous a[M,K], b[K,N], c[M,N]".into(),
                got: format!("a{:?} b{:?} c{:?}", a.shape(), b.shape(), c.shape()),
            }));
        }
        let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
        let dim = |v: usize| v as i32;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the three buffers are live device allocations of the shapes checked above;
        // alpha/beta are host f32 (the handle's default pointer mode) matching COMPUTE_32F.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_N,
                sys::cublasOperation_t::CUBLAS_OP_N,
                dim(n),
                dim(m),
                dim(k),
                (&alpha as *const f32).cast(),
                b.device_ptr() as *const _,
                sys::cudaDataType::CUDA_R_16BF,
                dim(n),
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
