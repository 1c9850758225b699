//! What a `#[kernel]` function becomes: a [`KernelDef`] that builds a [`Kernel`] for a
//! [`Spec`] (its typed comptime values plus what the runtime specialises on), and the
//! object-safe [`AnyKernelDef`] through which the CLI and test tables reach a kernel by name,
//! its comptime values given as `-D` text.

use std::collections::BTreeMap;
use std::fmt;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, Param};
use crate::types::DType;

use super::comptime::Comptime;
use super::comptime_value::{ComptimeParam, ComptimeValue};
use super::defines::DefineError;

/// A launch parameter as declared in the kernel's signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSig {
    /// `Tensor<T, RANK>` (read-only) or `TensorMut<T, RANK>`.
    Tensor {
        /// Name.
        name: &'static str,
        /// Element type; when `dtype_param` is set, that parameter's declared default.
        dtype: DType,
        /// The comptime [`DType`] parameter `T` of `Tensor<T, RANK>`, whose value is the
        /// element type in each specialisation ([`ParamSig::specialised`]).
        dtype_param: Option<&'static str>,
        /// Rank.
        rank: usize,
        /// Whether declared `TensorMut`.
        mutable: bool,
    },
    /// A scalar passed by value (`f32` or `i32`).
    Scalar {
        /// Name.
        name: &'static str,
        /// Type.
        dtype: DType,
    },
}

impl ParamSig {
    /// The parameter's name.
    pub fn name(&self) -> &'static str {
        match self {
            ParamSig::Tensor { name, .. } | ParamSig::Scalar { name, .. } => name,
        }
    }

    /// This declaration in the specialisation whose comptime values are `comptime`: a tensor
    /// whose element type is a comptime parameter gets that parameter's value (its declared
    /// default when `comptime` has no such [`DType`] parameter).
    pub fn specialised<C: Comptime>(&self, comptime: &C) -> ParamSig {
        match *self {
            ParamSig::Tensor {
                name,
                dtype,
                dtype_param: Some(param),
                rank,
                mutable,
            } => ParamSig::Tensor {
                name,
                dtype: comptime.dtype(param).unwrap_or(dtype),
                dtype_param: None,
                rank,
                mutable,
            },
            ref other => other.clone(),
        }
    }

    /// The IR parameter this declaration becomes; `aligned16` is the specialisation's
    /// alignment fact for a tensor (ignored for a scalar). A tensor whose element type is a
    /// comptime parameter must be [`ParamSig::specialised`] first (else it takes the default).
    pub fn to_param(&self, aligned16: bool) -> Param {
        match *self {
            ParamSig::Tensor {
                name,
                dtype,
                rank,
                mutable,
                ..
            } => Param::Tensor {
                name: name.to_string(),
                dtype,
                rank,
                mutable,
                aligned16,
            },
            ParamSig::Scalar { name, dtype } => Param::Scalar {
                name: name.to_string(),
                dtype,
            },
        }
    }
}

/// Prints the declaration as written in the kernel's signature: `q: Tensor<bf16, 4>`,
/// `o: TensorMut<bf16, 4>`, `a: Tensor<T, 2>` (element type a comptime parameter),
/// `scale: f32`.
impl fmt::Display for ParamSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamSig::Tensor {
                name,
                dtype,
                dtype_param,
                rank,
                mutable,
            } => {
                let ty = if *mutable { "TensorMut" } else { "Tensor" };
                match dtype_param {
                    Some(t) => write!(f, "{name}: {ty}<{t}, {rank}>"),
                    None => write!(f, "{name}: {ty}<{dtype}, {rank}>"),
                }
            }
            ParamSig::Scalar { name, dtype } => write!(f, "{name}: {dtype}"),
        }
    }
}

/// Everything a kernel is specialised on: its comptime values, and for each tensor parameter
/// (by name) whether its base address and outer strides are 16-byte aligned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Spec<C> {
    /// The comptime values.
    pub comptime: C,
    /// Alignment facts for tensor parameters, by name. A tensor missing here counts as not
    /// aligned.
    pub aligned16: BTreeMap<String, bool>,
}

impl<C: Comptime> Spec<C> {
    /// `comptime` with no tensor known to be 16-byte aligned.
    pub fn new(comptime: C) -> Spec<C> {
        Spec {
            comptime,
            aligned16: BTreeMap::new(),
        }
    }

    /// `comptime` with every tensor parameter of `signature` marked `aligned` (how the CLI
    /// and the tests build a kernel without arguments to take alignments from).
    pub fn uniform(comptime: C, signature: &[ParamSig], aligned: bool) -> Spec<C> {
        let aligned16 = signature
            .iter()
            .filter_map(|p| match p {
                ParamSig::Tensor { name, .. } => Some((name.to_string(), aligned)),
                ParamSig::Scalar { .. } => None,
            })
            .collect();
        Spec {
            comptime,
            aligned16,
        }
    }

    /// The same spec with the tensors `names` marked 16-byte aligned (what a launch with
    /// contiguous, aligned allocations of them specialises on).
    pub fn with_aligned16(mut self, names: &[&str]) -> Spec<C> {
        self.aligned16
            .extend(names.iter().map(|n| (n.to_string(), true)));
        self
    }

    /// A stable text key for caches and file names (`causal=false,d=128|q:a16,...`): the
    /// comptime values by parameter name, then the alignment facts by tensor name.
    pub fn key(&self) -> String {
        self.key_of(|_| true)
    }

    /// [`Spec::key`] over the comptime parameters `keep` accepts (the autotuner's key leaves
    /// out the tuned ones).
    pub fn key_of(&self, keep: impl Fn(&ComptimeParam) -> bool) -> String {
        let mut c: Vec<(&str, ComptimeValue)> = C::PARAMS
            .iter()
            .zip(self.comptime.values())
            .filter(|(p, _)| keep(p))
            .map(|(p, v)| (p.name, v))
            .collect();
        c.sort_by_key(|(name, _)| *name);
        let c: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let a: Vec<String> = self
            .aligned16
            .iter()
            .map(|(k, v)| format!("{k}:{}", if *v { "a16" } else { "a1" }))
            .collect();
        format!("{}|{}", c.join(","), a.join(","))
    }
}

/// What every kernel definition declares, whatever its comptime struct: the part of a kernel
/// that generic and object-safe code alike read.
pub trait KernelDecl: Sync {
    /// The kernel's name (the Rust function's).
    fn name(&self) -> &'static str;
    /// Comptime parameters: the fields of its comptime struct, in declaration order.
    fn comptime_params(&self) -> &'static [ComptimeParam];
    /// Launch parameters in order, as declared (see [`specialise`] for one specialisation's).
    fn signature(&self) -> &'static [ParamSig];
}

/// A kernel definition, as generated by `#[kernel]`, with its comptime values as one typed
/// struct: `gemm`'s `GemmComptime`, or the `#[comptime]` struct it takes.
pub trait KernelDef: KernelDecl {
    /// The kernel's comptime struct (`()` when it has no comptime parameters).
    type Comptime: Comptime;

    /// Builds the kernel's IR for `spec`. Every shape or type error in the body comes back as
    /// a diagnostic at the user's source.
    fn build(&self, spec: &Spec<Self::Comptime>) -> Result<Kernel, Diagnostic>;

    /// The grid a launch over a problem of `extents` (along x, y, z) takes with `comptime`:
    /// `cdiv(extent, tile)` blocks along each axis, the tiles from `#[kernel(grid = [..])]`
    /// (one block per unit of extent when the kernel declares none). A zero tile gives zero
    /// blocks, which a launch refuses.
    fn grid(&self, comptime: &Self::Comptime, extents: [usize; 3]) -> [u32; 3] {
        let _ = comptime;
        extents.map(|e| grid_blocks(e, 1))
    }
}

/// The warp count `#[kernel(num_warps = P)]` takes from comptime parameter `P`: `n` when it
/// is in 1..=32 (a block of at most 1024 threads), else a diagnostic at the attribute.
#[track_caller]
pub fn warp_count(n: usize) -> Result<u32, Diagnostic> {
    match u32::try_from(n) {
        Ok(w) if (1..=32).contains(&w) => Ok(w),
        _ => Err(Diagnostic::new(
            crate::entities::Loc::caller(),
            format!("`num_warps` is {n}; a block has 1 to 32 warps"),
        )),
    }
}

/// Blocks of `tile` units over `extent` (`cdiv`), saturated at `u32::MAX`; 0 for a 0 tile.
pub fn grid_blocks(extent: usize, tile: usize) -> u32 {
    match tile {
        0 => 0,
        t => u32::try_from(extent.div_ceil(t)).unwrap_or(u32::MAX),
    }
}

/// Why a kernel reached by name did not build from `-D` text.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The defines do not make the kernel's comptime struct.
    #[error("kernel `{kernel}`: {source}")]
    Define {
        /// The kernel.
        kernel: &'static str,
        /// Why.
        source: DefineError,
    },
    /// Building the IR failed (at the user's source).
    #[error("{0}")]
    Build(#[from] Diagnostic),
}

/// A kernel definition whose comptime struct is out of sight: what a registry of kernels of
/// different comptime structs holds (the CLI's, the examples'). Its comptime values come as
/// `-D NAME=VALUE` text, parsed by the kernel's [`Comptime::from_defines`]; every
/// [`KernelDef`] is one.
pub trait AnyKernelDef: KernelDecl {
    /// Builds the kernel with its comptime defaults replaced by `defines`, every tensor
    /// parameter marked 16-byte aligned or not by `aligned16`.
    fn build_defines(
        &self,
        defines: &[(String, String)],
        aligned16: bool,
    ) -> Result<Kernel, BuildError>;

    /// The comptime values (in [`KernelDecl::comptime_params`] order) that `-D` text
    /// `defines` makes over the declared defaults: what a caller without the kernel's type
    /// (the Python package) keys its specialisations by and hands back to
    /// [`AnyKernelDef::build_values`] and [`AnyKernelDef::grid_values`].
    fn comptime_values(
        &self,
        defines: &[(String, String)],
    ) -> Result<Vec<ComptimeValue>, BuildError>;

    /// Builds the specialisation of comptime `values` ([`AnyKernelDef::comptime_values`]'s),
    /// each tensor parameter 16-byte aligned as `aligned16` says (a launch's own facts).
    fn build_values(
        &self,
        values: &[ComptimeValue],
        aligned16: BTreeMap<String, bool>,
    ) -> Result<Kernel, BuildError>;

    /// [`KernelDef::grid`] for comptime `values` over `extents`.
    fn grid_values(
        &self,
        values: &[ComptimeValue],
        extents: [usize; 3],
    ) -> Result<[u32; 3], BuildError>;
}

impl<K: KernelDef> AnyKernelDef for K {
    fn build_defines(
        &self,
        defines: &[(String, String)],
        aligned16: bool,
    ) -> Result<Kernel, BuildError> {
        let comptime = K::Comptime::from_defines(defines).map_err(|source| BuildError::Define {
            kernel: self.name(),
            source,
        })?;
        Ok(self.build(&Spec::uniform(comptime, self.signature(), aligned16))?)
    }

    fn comptime_values(
        &self,
        defines: &[(String, String)],
    ) -> Result<Vec<ComptimeValue>, BuildError> {
        K::Comptime::from_defines(defines)
            .map(|c| c.values())
            .map_err(|source| BuildError::Define {
                kernel: self.name(),
                source,
            })
    }

    fn build_values(
        &self,
        values: &[ComptimeValue],
        aligned16: BTreeMap<String, bool>,
    ) -> Result<Kernel, BuildError> {
        let comptime = typed::<K>(self.name(), values)?;
        Ok(self.build(&Spec {
            comptime,
            aligned16,
        })?)
    }

    fn grid_values(
        &self,
        values: &[ComptimeValue],
        extents: [usize; 3],
    ) -> Result<[u32; 3], BuildError> {
        Ok(self.grid(&typed::<K>(self.name(), values)?, extents))
    }
}

/// The comptime struct of `K` whose fields are `values`; values of other kinds or count are
/// [`DefineError::Inconsistent`] (they never came from [`AnyKernelDef::comptime_values`]).
fn typed<K: KernelDef>(
    kernel: &'static str,
    values: &[ComptimeValue],
) -> Result<K::Comptime, BuildError> {
    K::Comptime::from_values(values).ok_or(BuildError::Define {
        kernel,
        source: DefineError::Inconsistent,
    })
}

/// `signature` in the specialisation whose comptime values are `comptime`: every tensor's
/// element type resolved ([`ParamSig::specialised`]). What a launch validates its arguments
/// against.
pub fn specialise<C: Comptime>(signature: &[ParamSig], comptime: &C) -> Vec<ParamSig> {
    signature.iter().map(|p| p.specialised(comptime)).collect()
}
