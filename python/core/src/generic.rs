//! Any registered `#[kernel]` from Python: its declaration ([`KernelInfo`]), a call's arguments
//! and comptime values checked against it ([`plan`]), and the launch on the caller's stream
//! ([`launch`]), compiled once per process. Comptime values ([`Given`]) become `-D NAME=VALUE`
//! text parsed by the kernel's own comptime struct ([`AnyKernelDef::comptime_values`]), so they
//! are refused in the CLI's words; a `DType` parameter a tensor's element type names and the
//! call leaves out takes that tensor's dtype. Like [`crate::args`], nothing here knows Python.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use kiln::ir::dsl::registry::display_names;
use kiln::ir::dsl::{
    AnyKernelDef, BuildError, ComptimeKind, ComptimeParam, ComptimeValue, DefineError, ParamSig,
    Registered, registered,
};
use kiln::ir::interp::HostArg;
use kiln::ir::{DType, HostTensor, Target};
use kiln::runtime::{Device, DeviceTensor, ForeignStream, KernelArg, LaunchError, LoadedKernel};

use crate::args::{ArgError, Place, TensorInfo, TorchDType, TorchDevice};
use crate::launch::{LaunchFailure, device};

/// Every registered kernel's name (its path where two share a name), in the registry's
/// order: what `kiln_attn.kernels()` lists and [`find`] accepts.
pub fn kernel_names() -> Vec<String> {
    display_names(registered())
}

/// The registered kernel `name` (a name, or a path `crate::module::name`); a `ValueError`
/// listing the kernels otherwise.
pub fn find(name: &str) -> Result<&'static Registered, ArgError> {
    kiln::ir::dsl::registry::find(name).map_err(|e| ArgError::value_error(e.to_string()))
}

/// A kernel's declaration, as Python shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelInfo {
    /// The kernel's name.
    pub name: &'static str,
    /// `crate::module::name`.
    pub path: String,
    /// Launch parameters, in order.
    pub params: Vec<ParamSig>,
    /// Comptime parameters, in order, with their kinds and declared defaults.
    pub comptime: Vec<ComptimeParam>,
}

impl KernelInfo {
    /// The declaration of `reg`.
    pub fn of(reg: &'static Registered) -> KernelInfo {
        let def = reg.def();
        KernelInfo {
            name: def.name(),
            path: reg.path(),
            params: def.signature().to_vec(),
            comptime: def.comptime_params().to_vec(),
        }
    }

    /// `name(x: Tensor<dtype, 2>, .., eps: f32; BM: usize = 4, ..)`: the signature as the
    /// kernel declares it, comptime parameters (if any) after the `;`.
    pub fn signature_text(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|p| p.to_string()).collect();
        let comptime: Vec<String> = self
            .comptime
            .iter()
            .map(|c| match c.default {
                Some(d) => format!("{}: {} = {d}", c.name, c.kind.name()),
                None => format!("{}: {}", c.name, c.kind.name()),
            })
            .collect();
        if comptime.is_empty() {
            return format!("{}({})", self.name, params.join(", "));
        }
        format!(
            "{}({}; {})",
            self.name,
            params.join(", "),
            comptime.join(", ")
        )
    }
}

/// A comptime value as the caller gave it (a Python keyword argument).
#[derive(Clone, Debug, PartialEq)]
pub enum Given {
    /// A Python `int`.
    Int(i64),
    /// A Python `bool`.
    Bool(bool),
    /// A Python `float`.
    Float(f64),
    /// A `torch.dtype`.
    DType(TorchDType),
    /// A `str`: `-D` text (`"bf16"`, `"128"`).
    Text(String),
    /// Anything else, by its Python type name: never a comptime value.
    Other(String),
}

impl Given {
    /// What Python calls the value's type, for errors.
    fn type_name(&self) -> &str {
        match self {
            Given::Int(_) => "int",
            Given::Bool(_) => "bool",
            Given::Float(_) => "float",
            Given::DType(_) => "torch.dtype",
            Given::Text(_) => "str",
            Given::Other(t) => t,
        }
    }

    /// The `-D` text of this value for a parameter of `kind`; a `TypeError` when a Python
    /// value of this type is never one (text always goes to the parser).
    fn define_text(&self, name: &str, kind: ComptimeKind) -> Result<String, ArgError> {
        let text = match (self, kind) {
            (Given::Text(t), _) => Some(t.clone()),
            (Given::Int(n), ComptimeKind::Usize | ComptimeKind::I32) => Some(n.to_string()),
            // An integral float is no size: `BM=4.0` is refused, `eps=1` is 1.0.
            (Given::Int(n), ComptimeKind::F32) => Some(format!("{n}")),
            (Given::Float(x), ComptimeKind::F32) => Some(format!("{x:?}")),
            (Given::Bool(b), ComptimeKind::Bool) => Some(b.to_string()),
            (Given::DType(d), ComptimeKind::DType) => {
                Some(kiln_dtype(d).map(|d| d.name().to_string()).ok_or_else(|| {
                    ArgError::type_error(format!(
                        "{name}: kiln kernels take torch.bfloat16, torch.float16, \
                             torch.float32 or torch.int32, got {d}"
                    ))
                })?)
            }
            _ => None,
        };
        text.ok_or_else(|| {
            ArgError::type_error(format!(
                "{name}: comptime parameter `{name}` is a {}, got {}",
                kind.name(),
                self.type_name()
            ))
        })
    }
}

/// A launch argument as the caller gave it (a Python positional argument).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// Something that reads as a tensor.
    Tensor(TensorInfo),
    /// A Python `int` (not a `bool`).
    Int(i64),
    /// A Python `float`.
    Float(f64),
    /// Anything else, by its Python type name.
    Other(String),
}

impl Arg {
    fn type_name(&self) -> &str {
        match self {
            Arg::Tensor(_) => "torch.Tensor",
            Arg::Int(_) => "int",
            Arg::Float(_) => "float",
            Arg::Other(t) => t,
        }
    }
}

/// The kiln element type of a PyTorch dtype, if kernels take it.
pub fn kiln_dtype(d: &TorchDType) -> Option<DType> {
    match d {
        TorchDType::Bf16 => Some(DType::Bf16),
        TorchDType::F16 => Some(DType::F16),
        TorchDType::Other(name) => match name.as_str() {
            "torch.float32" => Some(DType::F32),
            "torch.int32" => Some(DType::I32),
            _ => None,
        },
    }
}

/// PyTorch's name of a kiln element type.
fn torch_name(d: DType) -> &'static str {
    match d {
        DType::Bf16 => "torch.bfloat16",
        DType::F16 => "torch.float16",
        DType::F32 => "torch.float32",
        DType::I32 => "torch.int32",
        DType::U32 => "torch.uint32",
        DType::Bool => "torch.bool",
    }
}

/// One checked launch argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Checked {
    /// A CUDA tensor: its address, shape and strides in elements, element type.
    Tensor {
        /// `data_ptr()`.
        ptr: u64,
        /// Extents.
        shape: Vec<usize>,
        /// Strides, in elements.
        strides: Vec<usize>,
        /// Element type.
        dtype: DType,
    },
    /// A scalar of the parameter's type.
    Scalar(ScalarArg),
}

/// A scalar argument, converted to the parameter's type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarArg {
    /// `f32`.
    F32(f32),
    /// `i32`.
    I32(i32),
    /// `u32`.
    U32(u32),
}

/// A call checked against its kernel: the comptime values, the signature they specialise,
/// the arguments, the device.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The kernel.
    pub reg: &'static Registered,
    /// Comptime values in the kernel's order.
    pub values: Vec<ComptimeValue>,
    /// The signature with every tensor's element type resolved.
    pub signature: Vec<ParamSig>,
    /// The arguments, in signature order.
    pub args: Vec<Checked>,
    /// The CUDA ordinal of the tensors (0 when there are none).
    pub device: usize,
}

/// Why a call failed: a bad argument (`TypeError`/`ValueError`), or past the checks.
#[derive(Debug, thiserror::Error)]
pub enum GenericError {
    /// A bad argument or comptime value.
    #[error("{0}")]
    Arg(#[from] ArgError),
    /// No device, a compile or driver failure.
    #[error("{0}")]
    Launch(#[from] LaunchFailure),
}

/// The comptime values of `def` for `given` (keyword name and value), a `DType` parameter
/// not given taking the element type of the first tensor in `args` that names it.
pub fn comptime_values(
    def: &dyn AnyKernelDef,
    args: &[Arg],
    given: &[(String, Given)],
) -> Result<Vec<ComptimeValue>, ArgError> {
    let params = def.comptime_params();
    let mut defines = Vec::with_capacity(given.len());
    for (name, value) in given {
        let Some(p) = params.iter().find(|p| p.name == name) else {
            let known: Vec<&str> = params.iter().map(|p| p.name).collect();
            return Err(ArgError::type_error(format!(
                "{}() got an unexpected comptime parameter `{name}`; its comptime parameters \
                 are: {}",
                def.name(),
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            )));
        };
        defines.push((name.clone(), value.define_text(name, p.kind)?));
    }
    for (sig, arg) in def.signature().iter().zip(args) {
        if let (
            ParamSig::Tensor {
                dtype_param: Some(p),
                ..
            },
            Arg::Tensor(t),
        ) = (sig, arg)
            && !defines.iter().any(|(n, _)| n == p)
            && let Some(d) = kiln_dtype(&t.dtype)
        {
            defines.push((p.to_string(), d.name().to_string()));
        }
    }
    def.comptime_values(&defines).map_err(|e| match e {
        BuildError::Define {
            source: DefineError::Missing { .. },
            ..
        } => ArgError::type_error(e.to_string()),
        other => ArgError::value_error(other.to_string()),
    })
}

/// `signature` with each tensor's element type that names a comptime parameter resolved by
/// `values` (in `params` order).
fn specialised(
    signature: &[ParamSig],
    params: &[ComptimeParam],
    values: &[ComptimeValue],
) -> Vec<ParamSig> {
    signature
        .iter()
        .map(|p| match *p {
            ParamSig::Tensor {
                name,
                dtype,
                dtype_param: Some(param),
                rank,
                mutable,
            } => {
                let value = params
                    .iter()
                    .position(|c| c.name == param)
                    .and_then(|i| values.get(i));
                ParamSig::Tensor {
                    name,
                    dtype: match value {
                        Some(ComptimeValue::DType(d)) => *d,
                        _ => dtype,
                    },
                    dtype_param: None,
                    rank,
                    mutable,
                }
            }
            ref other => other.clone(),
        })
        .collect()
}

/// The parameter list for errors: `(x, y)`.
fn param_list(signature: &[ParamSig]) -> String {
    let names: Vec<&str> = signature.iter().map(ParamSig::name).collect();
    format!("({})", names.join(", "))
}

/// Checks a call of `reg` with `args` (positional, in signature order) and comptime values
/// `given`: the count, each argument's kind, a tensor's device, dtype, rank and strides, a
/// scalar's range, and the comptime values ([`comptime_values`]). Shapes against each other
/// and bounds are the kernel's and the runtime's business.
pub fn plan(
    reg: &'static Registered,
    args: &[Arg],
    given: &[(String, Given)],
) -> Result<Planned, ArgError> {
    plan_at(reg, args, given, Place::Cuda)
}

/// [`plan`] for tensors at `place`.
pub fn plan_at(
    reg: &'static Registered,
    args: &[Arg],
    given: &[(String, Given)],
    place: Place,
) -> Result<Planned, ArgError> {
    let def = reg.def();
    let declared = def.signature();
    if args.len() != declared.len() {
        return Err(ArgError::type_error(format!(
            "{}() takes {} launch argument(s) {}, got {}",
            def.name(),
            declared.len(),
            param_list(declared),
            args.len()
        )));
    }
    let values = comptime_values(def, args, given)?;
    let signature = specialised(declared, def.comptime_params(), &values);
    let mut device = None;
    let mut checked = Vec::with_capacity(args.len());
    for (sig, arg) in signature.iter().zip(args) {
        checked.push(match *sig {
            ParamSig::Tensor {
                name, dtype, rank, ..
            } => {
                let Arg::Tensor(t) = arg else {
                    return Err(ArgError::type_error(format!(
                        "{name}: expected a torch.Tensor, got {}",
                        arg.type_name()
                    )));
                };
                let ordinal = match (place, &t.device) {
                    (Place::Cuda, TorchDevice::Cuda(i)) => *i,
                    (Place::Host, TorchDevice::Other(cpu)) if cpu == "cpu" => 0,
                    (Place::Cuda, other) => {
                        return Err(ArgError::value_error(format!(
                            "{name}: expected a CUDA tensor, got one on {other}"
                        )));
                    }
                    (Place::Host, other) => {
                        return Err(ArgError::value_error(format!(
                            "{name}: expected a CPU tensor (the interpreter runs on the host), \
                             got one on {other}"
                        )));
                    }
                };
                match device {
                    None => device = Some((ordinal, name)),
                    Some((d, first)) if d != ordinal => {
                        return Err(ArgError::value_error(format!(
                            "{name}: expected a tensor on cuda:{d} (where {first} is), got one \
                             on cuda:{ordinal}"
                        )));
                    }
                    Some(_) => {}
                }
                if kiln_dtype(&t.dtype) != Some(dtype) {
                    return Err(ArgError::type_error(format!(
                        "{name}: expected a {} tensor, got {}",
                        torch_name(dtype),
                        t.dtype
                    )));
                }
                if t.shape.len() != rank {
                    return Err(ArgError::value_error(format!(
                        "{name}: expected a {rank}-D tensor, got shape {:?}",
                        t.shape
                    )));
                }
                let nonneg = |v: &[i64], what: &str| {
                    v.iter()
                        .map(|&x| usize::try_from(x))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| {
                            ArgError::value_error(format!(
                                "{name}: expected non-negative {what}, got {v:?}"
                            ))
                        })
                };
                Checked::Tensor {
                    ptr: t.ptr,
                    shape: nonneg(&t.shape, "extents")?,
                    strides: nonneg(&t.strides, "strides")?,
                    dtype,
                }
            }
            ParamSig::Scalar { name, dtype } => Checked::Scalar(scalar(name, dtype, arg)?),
        });
    }
    Ok(Planned {
        reg,
        values,
        signature,
        args: checked,
        device: device.map_or(0, |(d, _)| d),
    })
}

/// `arg` as the scalar parameter `name` of type `dtype`.
fn scalar(name: &str, dtype: DType, arg: &Arg) -> Result<ScalarArg, ArgError> {
    let kind_error = || {
        ArgError::type_error(format!(
            "{name}: expected {} ({dtype}), got {}",
            if dtype == DType::F32 {
                "a number"
            } else {
                "an int"
            },
            arg.type_name()
        ))
    };
    let range_error =
        |n: i64| ArgError::value_error(format!("{name}: {n} does not fit the kernel's {dtype}"));
    match (dtype, arg) {
        (DType::F32, Arg::Float(x)) => Ok(ScalarArg::F32(*x as f32)),
        (DType::F32, Arg::Int(n)) => Ok(ScalarArg::F32(*n as f32)),
        (DType::I32, Arg::Int(n)) => i32::try_from(*n)
            .map(ScalarArg::I32)
            .map_err(|_| range_error(*n)),
        (DType::U32, Arg::Int(n)) => u32::try_from(*n)
            .map(ScalarArg::U32)
            .map_err(|_| range_error(*n)),
        _ => Err(kind_error()),
    }
}

/// The launch grid from the caller's one to three block counts (missing ones are 1).
pub fn grid(blocks: &[i64]) -> Result<[u32; 3], ArgError> {
    if blocks.is_empty() || blocks.len() > 3 {
        return Err(ArgError::value_error(format!(
            "grid: expected 1 to 3 block counts, got {}",
            blocks.len()
        )));
    }
    let mut g = [1u32; 3];
    for (slot, &b) in g.iter_mut().zip(blocks) {
        *slot = u32::try_from(b).ok().filter(|&b| b > 0).ok_or_else(|| {
            ArgError::value_error(format!(
                "grid: block counts are 1 to 2^32 - 1, got {blocks:?}"
            ))
        })?;
    }
    Ok(g)
}

/// The kernel's own grid (`#[kernel(grid = [..])]`) over `extents` for comptime `values`.
pub fn kernel_grid(
    reg: &'static Registered,
    values: &[ComptimeValue],
    extents: &[usize],
) -> Result<[u32; 3], ArgError> {
    if extents.is_empty() || extents.len() > 3 {
        return Err(ArgError::value_error(format!(
            "extents: expected 1 to 3 extents, got {}",
            extents.len()
        )));
    }
    let mut e = [1usize; 3];
    e[..extents.len()].copy_from_slice(extents);
    reg.def()
        .grid_values(values, e)
        .map_err(|err| ArgError::value_error(err.to_string()))
}

/// What picks a loaded specialisation: the kernel, the device, the comptime values and
/// each tensor argument's 16-byte alignment (bit `i` for tensor `i`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    path: String,
    device: usize,
    values: Vec<ComptimeValue>,
    aligned: u64,
}

/// Builds and loads `p`'s kernel with the tensors' alignment `aligned16` (by name), or takes
/// it from the process's cache.
fn loaded(
    dev: &Device,
    p: &Planned,
    aligned16: BTreeMap<String, bool>,
) -> Result<Arc<LoadedKernel>, GenericError> {
    static LOADED: OnceLock<Mutex<HashMap<Key, Arc<LoadedKernel>>>> = OnceLock::new();
    let key = Key {
        path: p.reg.path(),
        device: p.device,
        values: p.values.clone(),
        aligned: aligned16
            .values()
            .enumerate()
            .fold(0, |bits, (i, &a)| bits | (u64::from(a) << i)),
    };
    let cache = LOADED.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(k.clone());
    }
    let ptx = build(p.reg.def(), &p.values, aligned16, dev.target())?;
    let loaded = Arc::new(dev.load_ptx(ptx).map_err(LaunchFailure::from)?);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(cache.entry(key).or_insert(loaded).clone())
}

/// The PTX of `def`'s specialisation for `values` and `aligned16` on `target`. A kernel that
/// does not build for these comptime values is the caller's `ValueError` (the diagnostic
/// names the kernel's source line); a backend failure is kiln's.
pub fn build(
    def: &dyn AnyKernelDef,
    values: &[ComptimeValue],
    aligned16: BTreeMap<String, bool>,
    target: Target,
) -> Result<kiln::ptx::PtxModule, GenericError> {
    let kernel = def
        .build_values(values, aligned16)
        .map_err(|e| ArgError::value_error(format!("{}: {e}", def.name())))?;
    kiln::ptx::compile(&kernel, target)
        .map_err(|e| GenericError::Launch(LaunchFailure::Launch(e.into())))
}

/// Whether a launch error is the caller's argument (a `ValueError` naming it) rather than a
/// failure of kiln or the driver.
pub fn is_argument_error(e: &LaunchError) -> bool {
    matches!(
        e,
        LaunchError::ArgCount { .. }
            | LaunchError::ArgKind { .. }
            | LaunchError::DType { .. }
            | LaunchError::Rank { .. }
            | LaunchError::InnerStride { .. }
            | LaunchError::Extent { .. }
            | LaunchError::Stride { .. }
            | LaunchError::OutOfBounds { .. }
            | LaunchError::ForeignTensor { .. }
            | LaunchError::Grid { .. }
            | LaunchError::Build(_)
            | LaunchError::TensorMapArg { .. }
    )
}

/// Launches the planned call on `grid` on `stream` of its device.
///
/// # Safety
/// Every tensor argument must address live device memory of the plan's device (its primary
/// context) that stays allocated until the kernel has run, and `stream` must be 0 or a live
/// stream of that context. Outputs overlapping inputs are the caller's affair.
pub unsafe fn launch(p: &Planned, grid: [u32; 3], stream: u64) -> Result<(), GenericError> {
    let dev = device(p.device).map_err(LaunchFailure::from)?;
    /// An argument with its tensor borrowed.
    enum Owned {
        Tensor(DeviceTensor),
        Scalar(ScalarArg),
    }
    let mut owned = Vec::with_capacity(p.args.len());
    let mut aligned16 = BTreeMap::new();
    for (sig, a) in p.signature.iter().zip(&p.args) {
        owned.push(match a {
            Checked::Tensor {
                ptr,
                shape,
                strides,
                dtype,
            } => {
                // SAFETY: the caller guarantees the memory behind every tensor argument.
                let t = unsafe { dev.borrow_tensor(*ptr, *dtype, shape, strides) }
                    .map_err(|e| ArgError::value_error(format!("{}: {e}", sig.name())))?;
                aligned16.insert(sig.name().to_string(), t.aligned16());
                Owned::Tensor(t)
            }
            Checked::Scalar(s) => Owned::Scalar(*s),
        });
    }
    let kernel = loaded(&dev, p, aligned16)?;
    let args: Vec<KernelArg<'_>> = owned
        .iter()
        .map(|a| match a {
            Owned::Tensor(t) => KernelArg::Tensor(t),
            Owned::Scalar(ScalarArg::F32(x)) => KernelArg::F32(*x),
            Owned::Scalar(ScalarArg::I32(x)) => KernelArg::I32(*x),
            Owned::Scalar(ScalarArg::U32(x)) => KernelArg::U32(*x),
        })
        .collect();
    // SAFETY: the caller guarantees the stream.
    let stream = unsafe { ForeignStream::from_raw(stream) };
    dev.launch_loaded_on_stream(stream, &kernel, &p.signature, grid, &args)
        .map_err(|e| {
            if is_argument_error(&e) {
                GenericError::Arg(ArgError::value_error(e.to_string()))
            } else {
                GenericError::Launch(e.into())
            }
        })
}

/// Runs the planned call on kiln's CPU interpreter over host tensors `args` (in signature
/// order, as the plan's tensors), the same specialisation a launch takes but with no tensor
/// marked 16-byte aligned: the generic path's dispatch tested without a GPU.
pub fn interpret(p: &Planned, grid: [u32; 3], args: &mut [HostArg<'_>]) -> Result<(), String> {
    let aligned16 = p
        .signature
        .iter()
        .filter_map(|s| match s {
            ParamSig::Tensor { name, .. } => Some((name.to_string(), false)),
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    let kernel = p
        .reg
        .def()
        .build_values(&p.values, aligned16)
        .map_err(|e| e.to_string())?;
    kiln::ir::interp::run(&kernel, grid, args).map_err(|e| e.to_string())
}

/// Runs the planned call ([`plan_at`] with [`Place::Host`]) on kiln's CPU interpreter over the
/// caller's host memory: each tensor is read from its address and strides, and each tensor the
/// kernel writes (`TensorMut`) is written back in place. The same kernel, comptime values and
/// checks as a launch, without a GPU.
///
/// # Safety
/// Every tensor argument must address live host memory of its dtype that is not written
/// elsewhere during the call (a PyTorch CPU tensor the caller holds).
pub unsafe fn interpret_host(p: &Planned, grid: [u32; 3]) -> Result<(), GenericError> {
    let mut host: Vec<Option<HostTensor>> = Vec::with_capacity(p.args.len());
    for a in &p.args {
        host.push(match a {
            Checked::Tensor {
                ptr,
                shape,
                strides,
                dtype,
            } => Some(unsafe { read_host(*ptr, shape, strides, *dtype) }),
            Checked::Scalar(_) => None,
        });
    }
    {
        let mut args: Vec<HostArg<'_>> = Vec::with_capacity(p.args.len());
        for ((a, t), sig) in p.args.iter().zip(host.iter_mut()).zip(&p.signature) {
            args.push(match (a, t) {
                (_, Some(t)) => match sig {
                    ParamSig::Tensor { mutable: true, .. } => HostArg::TensorMut(t),
                    _ => HostArg::Tensor(t),
                },
                (Checked::Scalar(ScalarArg::F32(x)), None) => HostArg::F32(*x),
                (Checked::Scalar(ScalarArg::I32(x)), None) => HostArg::I32(*x),
                (Checked::Scalar(ScalarArg::U32(x)), None) => HostArg::U32(*x),
                (Checked::Tensor { .. }, None) => {
                    return Err(ArgError::value_error("internal: an unread tensor").into());
                }
            });
        }
        interpret(p, grid, &mut args).map_err(|e| {
            GenericError::Arg(ArgError::value_error(format!("{}: {e}", p.reg.name())))
        })?;
    }
    for ((a, t), sig) in p.args.iter().zip(&host).zip(&p.signature) {
        if let (
            Checked::Tensor {
                ptr,
                shape,
                strides,
                ..
            },
            Some(t),
            ParamSig::Tensor { mutable: true, .. },
        ) = (a, t, sig)
        {
            // SAFETY: the caller guarantees the memory, as for the read.
            unsafe { write_host(*ptr, shape, strides, t) };
        }
    }
    Ok(())
}

/// The element offsets (in elements) of a `shape` view with `strides`, in row-major order.
fn offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize];
    for (&n, &s) in shape.iter().zip(strides) {
        out = out
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o + i * s))
            .collect();
    }
    out
}

/// A contiguous host copy of the view at `ptr`.
///
/// # Safety
/// As [`interpret_host`].
unsafe fn read_host(ptr: u64, shape: &[usize], strides: &[usize], dtype: DType) -> HostTensor {
    let offs = offsets(shape, strides);
    let size = dtype.size_bytes() as u64;
    let at = |i: usize| (ptr + offs[i] as u64 * size) as usize;
    // SAFETY (each read): the caller guarantees the view's elements are readable.
    HostTensor::from_fn(shape, dtype, |i| unsafe {
        match dtype {
            DType::F32 => f64::from(std::ptr::read_unaligned(at(i) as *const f32)),
            DType::Bf16 => {
                half::bf16::from_bits(std::ptr::read_unaligned(at(i) as *const u16)).to_f64()
            }
            DType::F16 => {
                half::f16::from_bits(std::ptr::read_unaligned(at(i) as *const u16)).to_f64()
            }
            DType::I32 => f64::from(std::ptr::read_unaligned(at(i) as *const i32)),
            DType::U32 => f64::from(std::ptr::read_unaligned(at(i) as *const u32)),
            DType::Bool => f64::from(std::ptr::read_unaligned(at(i) as *const u8)),
        }
    })
}

/// Writes host tensor `t` back into the view at `ptr`.
///
/// # Safety
/// As [`interpret_host`], the view writable.
unsafe fn write_host(ptr: u64, shape: &[usize], strides: &[usize], t: &HostTensor) {
    let size = t.dtype().size_bytes() as u64;
    for (i, o) in offsets(shape, strides).into_iter().enumerate() {
        let at = (ptr + o as u64 * size) as usize;
        let v = t.data.get_f64(i);
        // SAFETY: the caller guarantees the view's elements are writable.
        unsafe {
            match t.dtype() {
                DType::F32 => std::ptr::write_unaligned(at as *mut f32, v as f32),
                DType::Bf16 => std::ptr::write_unaligned(
                    at as *mut u16,
                    kiln::ir::rounding::to_bf16(v).to_bits(),
                ),
                DType::F16 => std::ptr::write_unaligned(
                    at as *mut u16,
                    kiln::ir::rounding::to_f16(v).to_bits(),
                ),
                DType::I32 => std::ptr::write_unaligned(at as *mut i32, v as i32),
                DType::U32 => std::ptr::write_unaligned(at as *mut u32, v as u32),
                DType::Bool => std::ptr::write_unaligned(at as *mut u8, u8::from(v != 0.0)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_tests::check::{poisoned, rel_error, tolerance};
    use kiln_tests::inputs::{Dist, Rng, tensor};
    use kiln_tests::reference;

    /// What PyTorch would report for a contiguous tensor of `shape` and `dtype` on cuda:0.
    fn info(shape: &[usize], dtype: &str) -> TensorInfo {
        let dtype = match dtype {
            "bf16" => TorchDType::Bf16,
            "f16" => TorchDType::F16,
            other => TorchDType::Other(format!("torch.{other}")),
        };
        TensorInfo::contiguous(shape, dtype, TorchDevice::Cuda(0), 0x7f00_0000_0000)
    }

    fn t(shape: &[usize], dtype: &str) -> Arg {
        Arg::Tensor(info(shape, dtype))
    }

    fn reg(name: &str) -> &'static Registered {
        find(name).expect("registered")
    }

    #[test]
    fn the_library_kernels_are_registered_and_found_by_name_or_path() {
        let names = kernel_names();
        for k in [
            "softmax",
            "softmax_backward",
            "layer_norm",
            "layer_norm_backward",
            "rms_norm",
            "rms_norm_backward",
            "sum_partials",
            "cross_entropy",
            "cross_entropy_reduce",
            "cross_entropy_backward",
            "rotary",
            "dropout",
        ] {
            assert!(names.iter().any(|n| n == k), "{k} in {names:?}");
        }
        assert_eq!(
            find("kiln_examples::rms_norm::rms_norm").map(|r| r.name()),
            Ok("rms_norm")
        );
        let e = find("nope").expect_err("unknown");
        assert!(e.message.starts_with("no kernel named `nope`; one of: "));
    }

    #[test]
    fn the_signature_text_shows_params_and_comptime_defaults() {
        assert_eq!(
            KernelInfo::of(reg("rms_norm")).signature_text(),
            "rms_norm(x: Tensor<dtype, 2>, w: Tensor<dtype, 1>, y: TensorMut<dtype, 2>, \
             rstd: TensorMut<f32, 1>, eps: f32; BM: usize = 4, BN: usize = 1024, \
             NW: usize = 4, dtype: DType = f32)"
        );
    }

    #[test]
    fn comptime_values_come_from_python_values_text_defaults_and_tensors() {
        let def = reg("softmax").def();
        let x = t(&[3, 5], "bf16");
        let v = comptime_values(def, &[x.clone(), x.clone()], &[]).expect("ok");
        assert_eq!(
            v,
            [
                ComptimeValue::Usize(4),
                ComptimeValue::Usize(512),
                ComptimeValue::Usize(4),
                ComptimeValue::DType(DType::Bf16)
            ]
        );
        let given = [
            ("BM".to_string(), Given::Int(16)),
            ("BN".to_string(), Given::Text("128".into())),
            ("dtype".to_string(), Given::DType(TorchDType::F16)),
        ];
        let v = comptime_values(def, &[x], &given).expect("ok");
        assert_eq!(
            v,
            [
                ComptimeValue::Usize(16),
                ComptimeValue::Usize(128),
                ComptimeValue::Usize(4),
                ComptimeValue::DType(DType::F16)
            ]
        );
        // An int is an f32 value (eps=1); a float never a usize.
        let ln = reg("dropout").def();
        assert!(comptime_values(ln, &[], &[("BLOCK".into(), Given::Int(256))]).is_ok());
    }

    #[test]
    fn bad_comptime_values_are_type_or_value_errors_naming_the_parameter() {
        let def = reg("softmax").def();
        let check = |name: &str, g: Given, kind: ErrorKind, text: &str| {
            let e = comptime_values(def, &[], &[(name.to_string(), g)]).expect_err("bad");
            assert_eq!(e.kind, kind, "{}", e.message);
            assert!(e.message.contains(text), "{} lacks {text}", e.message);
        };
        use crate::args::ErrorKind;
        check(
            "BX",
            Given::Int(1),
            ErrorKind::Type,
            "unexpected comptime parameter `BX`",
        );
        check(
            "BM",
            Given::Float(4.0),
            ErrorKind::Type,
            "`BM` is a usize, got float",
        );
        check(
            "BM",
            Given::Bool(true),
            ErrorKind::Type,
            "`BM` is a usize, got bool",
        );
        check("BM", Given::Int(-2), ErrorKind::Value, "`-2` is not one");
        check(
            "dtype",
            Given::Text("f64".into()),
            ErrorKind::Value,
            "`f64` is not one",
        );
        check(
            "dtype",
            Given::DType(TorchDType::Other("torch.float64".into())),
            ErrorKind::Type,
            "got torch.float64",
        );
        check(
            "BM",
            Given::Other("list".into()),
            ErrorKind::Type,
            "got list",
        );
    }

    #[test]
    fn a_plan_checks_count_kinds_devices_dtypes_ranks_and_scalars() {
        let ln = reg("layer_norm");
        let ok = || {
            vec![
                t(&[4, 8], "bf16"),
                t(&[8], "bf16"),
                t(&[8], "bf16"),
                t(&[4, 8], "bf16"),
                t(&[4], "float32"),
                t(&[4], "float32"),
                Arg::Float(1e-5),
            ]
        };
        let p = plan(ln, &ok(), &[]).expect("valid");
        assert_eq!(p.values[3], ComptimeValue::DType(DType::Bf16));
        assert!(matches!(
            p.signature[0],
            ParamSig::Tensor {
                dtype: DType::Bf16,
                dtype_param: None,
                ..
            }
        ));
        assert_eq!(p.args[6], Checked::Scalar(ScalarArg::F32(1e-5)));
        let err = |i: usize, a: Arg| {
            let mut args = ok();
            args[i] = a;
            plan(ln, &args, &[]).expect_err("invalid").message
        };
        assert_eq!(err(1, Arg::Int(3)), "w: expected a torch.Tensor, got int");
        assert_eq!(
            err(2, t(&[8], "f16")),
            "b: expected a torch.bfloat16 tensor, got torch.float16"
        );
        assert_eq!(
            err(1, t(&[2, 4], "bf16")),
            "w: expected a 1-D tensor, got shape [2, 4]"
        );
        let mut other = info(&[4, 8], "bf16");
        other.device = TorchDevice::Cuda(1);
        assert_eq!(
            err(3, Arg::Tensor(other)),
            "y: expected a tensor on cuda:0 (where x is), got one on cuda:1"
        );
        assert_eq!(
            err(6, Arg::Other("str".into())),
            "eps: expected a number (f32), got str"
        );
        let e = plan(ln, &ok()[..6], &[]).expect_err("count");
        assert!(
            e.message
                .starts_with("layer_norm() takes 7 launch argument(s)")
        );
        let d = reg("dropout");
        let x = t(&[10], "float32");
        let e = plan(
            d,
            &[x.clone(), x.clone(), Arg::Float(0.5), Arg::Int(-1)],
            &[],
        );
        assert_eq!(
            e.expect_err("negative").message,
            "seed: -1 does not fit the kernel's u32"
        );
        let p = plan(d, &[x.clone(), x, Arg::Int(1), Arg::Int(7)], &[]).expect("valid");
        assert_eq!(p.args[3], Checked::Scalar(ScalarArg::U32(7)));
        // Dropout's dtype is x's: a bf16 x is a bf16 kernel, and y must match it.
        let xb = t(&[10], "bf16");
        let p = plan(
            d,
            &[xb.clone(), xb.clone(), Arg::Float(0.5), Arg::Int(7)],
            &[],
        )
        .expect("valid");
        assert_eq!(p.values[1], ComptimeValue::DType(DType::Bf16));
        let e = plan(
            d,
            &[xb, t(&[10], "float32"), Arg::Float(0.5), Arg::Int(7)],
            &[],
        );
        assert_eq!(
            e.expect_err("mixed").message,
            "y: expected a torch.bfloat16 tensor, got torch.float32"
        );
    }

    #[test]
    fn grids_come_from_the_caller_or_the_kernels_rule() {
        assert_eq!(grid(&[5]), Ok([5, 1, 1]));
        assert_eq!(grid(&[5, 2, 3]), Ok([5, 2, 3]));
        assert!(grid(&[0]).is_err());
        assert!(grid(&[]).is_err());
        assert!(grid(&[1, 1, 1, 1]).is_err());
        assert!(grid(&[1 << 33]).is_err());
        let sm = reg("softmax");
        let v = comptime_values(sm.def(), &[], &[("BM".into(), Given::Int(8))]).expect("ok");
        assert_eq!(kernel_grid(sm, &v, &[4097]), Ok([513, 1, 1]));
        let r = reg("rotary");
        let v = comptime_values(r.def(), &[], &[]).expect("ok");
        assert_eq!(kernel_grid(r, &v, &[7, 3, 17]), Ok([7, 3, 3]));
    }

    /// The generic path's specialisations of softmax and layer norm, with the comptime values
    /// the Python wrappers choose for rows of `n` (`kiln_attn.ops.config_rows`: `BN` the row
    /// up to 1024 columns, `BM` 4096 / BN up to 16), run on the interpreter on odd shapes,
    /// against f64 references, outputs poisoned.
    #[test]
    fn generic_launches_match_references_on_the_interpreter() {
        let mut rng = Rng::new(0x6e6e);
        for (m, n, dtype, name) in [
            (5usize, 37usize, DType::F32, "float32"),
            (9, 130, DType::Bf16, "bf16"),
            (3, 1100, DType::F16, "f16"),
        ] {
            let bn = n.next_power_of_two().clamp(32, 1024);
            let bm = (4096 / bn).clamp(1, 16);
            let given = [
                ("BM".to_string(), Given::Int(bm as i64)),
                ("BN".to_string(), Given::Int(bn as i64)),
            ];
            for dist in [Dist::Uniform, Dist::Large] {
                let x = tensor(&mut rng, &[m, n], dtype, dist);
                let mut y = poisoned(&[m, n], dtype);
                let sm = reg("softmax");
                let p = plan(sm, &[t(&[m, n], name), t(&[m, n], name)], &given).expect("plan");
                let g = kernel_grid(sm, &p.values, &[m]).expect("grid");
                interpret(
                    &p,
                    g,
                    &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)],
                )
                .expect("runs");
                let e = rel_error(&y.to_f64_vec(), &reference::softmax_rows(&x));
                assert!(
                    e < tolerance(dtype) * 2.0,
                    "softmax {m}x{n} {dtype} {dist}: {e}"
                );

                let w = tensor(&mut rng, &[n], dtype, Dist::Uniform);
                let b = tensor(&mut rng, &[n], dtype, Dist::Uniform);
                let mut y = poisoned(&[m, n], dtype);
                let mut mean = poisoned(&[m], DType::F32);
                let mut rstd = poisoned(&[m], DType::F32);
                let ln = reg("layer_norm");
                let args = [
                    t(&[m, n], name),
                    t(&[n], name),
                    t(&[n], name),
                    t(&[m, n], name),
                    t(&[m], "float32"),
                    t(&[m], "float32"),
                    Arg::Float(1e-5),
                ];
                let p = plan(ln, &args, &given).expect("plan");
                let g = kernel_grid(ln, &p.values, &[m]).expect("grid");
                interpret(
                    &p,
                    g,
                    &mut [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&w),
                        HostArg::Tensor(&b),
                        HostArg::TensorMut(&mut y),
                        HostArg::TensorMut(&mut mean),
                        HostArg::TensorMut(&mut rstd),
                        HostArg::F32(1e-5),
                    ],
                )
                .expect("runs");
                let want = layer_norm_ref(&x, &w, &b, 1e-5);
                let e = rel_error(&y.to_f64_vec(), &want);
                assert!(
                    e < tolerance(dtype) * 2.0,
                    "layer_norm {m}x{n} {dtype} {dist}: {e}"
                );
            }
        }
    }

    /// `interpret_host` reads strided host memory the way PyTorch CPU tensors lay it out and
    /// writes the outputs back in place, NaN-poisoned elements outside the view untouched.
    #[test]
    fn interpreting_over_host_memory_reads_and_writes_the_views_in_place() {
        let (m, n, pitch) = (3usize, 45usize, 50usize);
        let mut rng = Rng::new(7);
        let x: Vec<f32> = (0..m * pitch)
            .map(|_| rng.uniform(-4.0, 4.0) as f32)
            .collect();
        let mut y = vec![f32::NAN; m * pitch];
        let view = |ptr: u64| {
            Arg::Tensor(TensorInfo {
                shape: vec![m as i64, n as i64],
                strides: vec![pitch as i64, 1],
                dtype: TorchDType::Other("torch.float32".into()),
                device: TorchDevice::Other("cpu".into()),
                ptr,
            })
        };
        let sm = reg("softmax");
        let args = [view(x.as_ptr() as u64 + 4), view(y.as_mut_ptr() as u64 + 4)];
        let given = [("BN".to_string(), Given::Int(32))];
        assert!(
            plan(sm, &args, &given).is_err(),
            "a launch wants CUDA tensors"
        );
        let p = plan_at(sm, &args, &given, Place::Host).expect("plan");
        let g = kernel_grid(sm, &p.values, &[m]).expect("grid");
        // SAFETY: the views lie inside `x` and `y`, which outlive the call.
        unsafe { interpret_host(&p, g) }.expect("runs");
        for r in 0..m {
            let row: Vec<f64> = (0..n).map(|c| f64::from(x[r * pitch + 1 + c])).collect();
            let want =
                reference::softmax_rows(&HostTensor::from_fn(&[1, n], DType::F32, |c| row[c]));
            let got: Vec<f64> = (0..n).map(|c| f64::from(y[r * pitch + 1 + c])).collect();
            assert!(rel_error(&got, &want) < 1e-5, "row {r}");
            assert!(y[r * pitch].is_nan() && y[r * pitch + 1 + n].is_nan());
        }
    }

    fn layer_norm_ref(x: &HostTensor, w: &HostTensor, b: &HostTensor, eps: f64) -> Vec<f64> {
        let n = x.shape[1];
        let (w, b) = (w.to_f64_vec(), b.to_f64_vec());
        x.to_f64_vec()
            .chunks(n)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
                let r = 1.0 / (var + eps).sqrt();
                row.iter()
                    .enumerate()
                    .map(|(c, v)| (v - mean) * r * w[c] + b[c])
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Every specialisation the wrappers pick for the benchmark's shapes, and the candidates
    /// a benchmark compares with them, compiles to PTX for both targets, aligned and not.
    #[test]
    fn the_wrappers_specialisations_compile_for_both_targets() {
        for (name, given) in [
            ("softmax", vec![("BM", 4), ("BN", 1024)]),
            ("softmax_backward", vec![("BM", 16), ("BN", 256)]),
            ("layer_norm", vec![("BM", 4), ("BN", 1024)]),
            ("rms_norm", vec![("BM", 16), ("BN", 128)]),
            ("layer_norm_backward", vec![("BM", 4), ("BN", 1024)]),
            ("rms_norm_backward", vec![("BM", 4), ("BN", 1024)]),
            ("cross_entropy", vec![("BM", 1), ("BN", 2048)]),
            ("cross_entropy_backward", vec![("BM", 1), ("BN", 2048)]),
            // The reduction's and the partial sums' smallest and largest configs.
            ("cross_entropy_reduce", vec![("BM", 256), ("NW", 1)]),
            (
                "cross_entropy_reduce",
                vec![("BM", 8192), ("NW", 16), ("STAGES", 2)],
            ),
            ("sum_partials", vec![("BM", 16), ("BN", 32)]),
            ("sum_partials", vec![("BM", 128), ("BN", 32), ("STAGES", 2)]),
            ("rotary", vec![("D", 128), ("R", 128), ("BH", 8)]),
            ("dropout", vec![("BLOCK", 1024)]),
        ] {
            let def = reg(name).def();
            let given: Vec<(String, Given)> = given
                .into_iter()
                .map(|(k, v)| (k.to_string(), Given::Int(v)))
                .chain(
                    def.comptime_params()
                        .iter()
                        .any(|p| p.name == "dtype")
                        .then(|| ("dtype".to_string(), Given::DType(TorchDType::Bf16))),
                )
                .collect();
            let values = comptime_values(def, &[], &given).expect("values");
            for target in [Target::Sm80, Target::Sm90a] {
                for aligned in [false, true] {
                    let a = def
                        .signature()
                        .iter()
                        .filter_map(|p| match p {
                            ParamSig::Tensor { name, .. } => Some((name.to_string(), aligned)),
                            ParamSig::Scalar { .. } => None,
                        })
                        .collect();
                    build(def, &values, a, target)
                        .unwrap_or_else(|e| panic!("{name} on {target:?}: {e}"));
                }
            }
        }
    }
}
