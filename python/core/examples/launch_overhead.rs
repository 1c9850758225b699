//! The Rust half of `flash_attn_func`'s call overhead on a GPU: host time per call of the core's
//! checks and launch beside an empty launch through the same stream path, then each stage alone
//! (what is timed and how: `docs/benchmarking.md`, "From Python"); then the same for the
//! generic path `kiln_attn.ops` takes (a row kernel's plan and launch). Build here with `(cd python &&
//! cargo build --release -p kiln-attn-core --example launch_overhead)` and run
//! `python/target/release/examples/launch_overhead` on the GPU host (it needs no Rust there).

use std::process::ExitCode;
use std::time::Instant;

use kiln::ir::DType;
use kiln::ir::dsl::KernelDecl;
use kiln::runtime::{KernelArg, L2Promotion, OobFill, Swizzle};
use kiln_attn_core::args::{self, Options, TensorInfo, TorchDType, TorchDevice};
use kiln_attn_core::generic::{self, Arg, Given};
use kiln_attn_core::launch::{self, LaunchFailure};
use kiln_examples::attention::attention;

/// Calls per round and rounds, as `python/bench.py`'s `host_us`.
const CALLS: usize = 200;
const ROUNDS: usize = 15;

/// Median host microseconds per call of `call`.
fn host_us(dev: &kiln::runtime::Device, mut call: impl FnMut()) -> f64 {
    (0..CALLS).for_each(|_| call());
    dev.synchronize().expect("synchronize");
    let mut per_call: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            (0..CALLS).for_each(|_| call());
            let us = start.elapsed().as_secs_f64() / CALLS as f64 * 1e6;
            dev.synchronize().expect("synchronize");
            us
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[ROUNDS / 2]
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), LaunchFailure> {
    // python/bench.py's overhead shape: batch 1, s = 128, 16 heads of 128.
    let shape = [1usize, 128, 16, 128];
    let dev = launch::device(0)?;
    let tensors = (0..4)
        .map(|_| dev.alloc(DType::Bf16, &shape))
        .collect::<Result<Vec<_>, _>>()?;
    let info = |t: &kiln::runtime::DeviceTensor| TensorInfo {
        shape: t.shape().iter().map(|&n| n as i64).collect(),
        strides: t.strides().iter().map(|&n| n as i64).collect(),
        dtype: TorchDType::Bf16,
        device: TorchDevice::Cuda(0),
        ptr: t.device_ptr(),
    };
    let [q, k, v, o] = [0, 1, 2, 3].map(|i| info(&tensors[i]));
    let opts = Options::default();
    let mut failed = None;
    let mut checked_launch = || {
        let result = args::plan(&q, &k, &v, &opts)
            .and_then(|plan| Ok((args::check_out(&plan, &q, &o)?, plan)));
        match result {
            // SAFETY: the views address the four live allocations above, which outlive every
            // launch (each round is synchronised); the null stream is the context's own.
            Ok((out, plan)) => {
                if let Err(e) = unsafe { launch::launch(&plan, &out, None, 0) } {
                    failed.get_or_insert(e.to_string());
                }
            }
            Err(e) => {
                failed.get_or_insert(e.message);
            }
        }
    };
    let with_checks = host_us(&dev, &mut checked_launch);
    // SAFETY: the null stream of the device's primary context.
    let empty = host_us(&dev, || {
        unsafe { launch::empty_launch(0, 0) }.expect("empty launch")
    });
    // One of the four tensor maps each launch encodes (host work in the driver library).
    let encode = host_us(&dev, || {
        dev.tensor_map(
            &tensors[0],
            &[1, 1, 64, 64],
            Swizzle::B128,
            L2Promotion::B256,
            OobFill::Zero,
        )
        .map(drop)
        .expect("tensor map");
    });
    // The stages of `launch::launch` on their own, on the same plan and views.
    let plan = args::plan(&q, &k, &v, &opts).expect("plan");
    let out = args::check_out(&plan, &q, &o).expect("out");
    let borrow = |view: &args::View| {
        // SAFETY: as above.
        unsafe { dev.borrow_tensor(view.ptr, DType::Bf16, &view.shape, &view.strides) }
            .expect("borrow")
    };
    let borrowing = host_us(&dev, || {
        for view in [&plan.q, &plan.k, &plan.v, &out] {
            drop(borrow(view));
        }
    });
    let views = [&plan.q, &plan.k, &plan.v, &out].map(borrow);
    let ct = launch::comptime(&plan, dev.target());
    let spec = kiln::ir::dsl::Spec::new(ct).with_aligned16(&["q", "k", "v", "o"]);
    let lookup = host_us(&dev, || {
        dev.compile(&attention, &spec).map(drop).expect("compile");
    });
    let kernel = dev.compile(&attention, &spec).expect("compile");
    let signature = kiln::ir::dsl::specialise(attention.signature(), &ct);
    let kargs = [
        KernelArg::Tensor(&views[0]),
        KernelArg::Tensor(&views[1]),
        KernelArg::Tensor(&views[2]),
        KernelArg::Tensor(&views[3]),
        KernelArg::F32(plan.scale),
    ];
    let grid = launch::grid(&plan, &ct);
    let loaded = host_us(&dev, || {
        dev.launch_loaded(&kernel, &signature, grid, &kargs)
            .expect("launch loaded");
    });
    let full = host_us(&dev, || {
        dev.launch(&attention, &ct, grid, &kargs).expect("launch");
    });
    // The same entry (parameters, shared memory, launch geometry) with an empty body: what
    // the driver's launch of this parameter block costs, apart from kiln's host work.
    let hollow = dev
        .load_ptx(hollow_entry(kernel.ptx()))
        .expect("load the hollow entry");
    let hollow_us = host_us(&dev, || {
        dev.launch_loaded(&hollow, &signature, grid, &kargs)
            .expect("launch the hollow entry");
    });
    let bare_us = bare_launch_us(&dev, &hollow, grid);
    println!(
        "rust stages per call: borrow 4 tensors {borrowing:.2} us, compile-cache hit \
         {lookup:.2} us, launch_loaded (checks, maps, pack, launch) {loaded:.1} us, \
         Device::launch {full:.1} us, launch_loaded of the entry with an empty body \
         {hollow_us:.1} us, bare cuLaunchKernel of that entry {bare_us:.1} us"
    );
    if let Some(e) = failed {
        eprintln!("launch failed: {e}");
        return Ok(());
    }
    generic_row_launch(&dev)?;
    println!(
        "rust host time per call at b=1 s=128 h=16 d=128: empty launch {empty:.1} us, \
         checks + launch {with_checks:.1} us; overhead {:.1} us (of which 4 tensor maps \
         {:.1} us)",
        with_checks - empty,
        4.0 * encode
    );
    Ok(())
}

/// The generic path's Rust stages for `layer_norm_backward` (eight tensors, the comptime
/// values `kiln_attn.ops` passes) on bf16 64 x 1000 rows, few enough that the GPU keeps up
/// with the host: `generic::plan` alone, then plan and `generic::launch` (tensor borrows,
/// the loaded-kernel lookup, checks, launch) per call.
fn generic_row_launch(dev: &kiln::runtime::Device) -> Result<(), LaunchFailure> {
    let (m, n) = (64usize, 1000usize);
    let c = kiln_examples::rows::norm_backward_config(m, n);
    let blocks = m.div_ceil(c.rb);
    let shapes: [(&[usize], DType); 8] = [
        (&[m, n], DType::Bf16),
        (&[n], DType::Bf16),
        (&[m], DType::F32),
        (&[m], DType::F32),
        (&[m, n], DType::Bf16),
        (&[m, n], DType::Bf16),
        (&[blocks, n], DType::F32),
        (&[blocks, n], DType::F32),
    ];
    let tensors = shapes
        .iter()
        .map(|(shape, dtype)| dev.alloc(*dtype, shape))
        .collect::<Result<Vec<_>, _>>()?;
    let args: Vec<Arg> = tensors
        .iter()
        .map(|t| {
            Arg::Tensor(TensorInfo {
                shape: t.shape().iter().map(|&n| n as i64).collect(),
                strides: t.strides().iter().map(|&n| n as i64).collect(),
                dtype: match t.dtype() {
                    DType::Bf16 => TorchDType::Bf16,
                    _ => TorchDType::Other("torch.float32".into()),
                },
                device: TorchDevice::Cuda(0),
                ptr: t.device_ptr(),
            })
        })
        .collect();
    let given: Vec<(String, Given)> = [
        ("BM", c.bm),
        ("BN", c.bn),
        ("RB", c.rb),
        ("NW", c.nw),
        ("OCC", c.occ),
    ]
    .iter()
    .map(|&(k, v)| (k.to_string(), Given::Int(v as i64)))
    .collect();
    let reg = generic::find("layer_norm_backward").expect("registered");
    let grid = [blocks as u32, 1, 1];
    let plan_us = host_us(dev, || {
        drop(generic::plan(reg, &args, &given).expect("plan"));
    });
    let launch_us = host_us(dev, || {
        let planned = generic::plan(reg, &args, &given).expect("plan");
        // SAFETY: the eight live allocations above, synchronised after every round; the
        // null stream of the device's primary context.
        unsafe { generic::launch(&planned, grid, 0) }.expect("launch");
    });
    println!(
        "generic path, layer_norm_backward bf16 {m}x{n} (8 tensors): plan {plan_us:.2} us, \
         plan + launch {launch_us:.1} us per call"
    );
    Ok(())
}

/// `module` with its entry's body replaced by `ret;`: the same `.entry` line, parameters and
/// performance directives, so it launches with the same arguments and geometry.
fn hollow_entry(module: &kiln::ptx::PtxModule) -> kiln::ptx::PtxModule {
    let entry = module.ptx.find(".entry").expect("an entry");
    let body = entry + module.ptx[entry..].find("\n{").expect("an entry body");
    kiln::ptx::PtxModule {
        ptx: format!("{}\n{{\n\tret;\n}}\n", &module.ptx[..body]),
        ..module.clone()
    }
}

/// Host microseconds per bare `cuLaunchKernel` of `hollow` (an entry with an empty body: its
/// parameters' values are never read), loaded again straight through the driver, on the null
/// stream, every parameter pointing at one zeroed, 64-byte-aligned 128-byte block (the widest
/// slot, a tensor map), packed once. `grid` is the logical grid; a persistent entry gets the
/// CTAs kiln launches for it.
fn bare_launch_us(
    dev: &kiln::runtime::Device,
    hollow: &kiln::runtime::LoadedKernel,
    grid: [u32; 3],
) -> f64 {
    use cudarc::driver::sys;
    let module = hollow.ptx();
    #[repr(C, align(64))]
    struct Slot([u8; 128]);
    let ctx = dev.cuda_context();
    ctx.bind_to_thread().expect("bind the context");
    let ptx = std::ffi::CString::new(module.ptx.clone()).expect("PTX without NUL");
    let name = std::ffi::CString::new(module.entry.clone()).expect("entry without NUL");
    let mut cu_module = std::ptr::null_mut();
    let mut function = std::ptr::null_mut();
    // SAFETY: a NUL-terminated PTX image and entry name; out-pointers to locals.
    unsafe {
        sys::cuModuleLoadData(&mut cu_module, ptx.as_ptr().cast())
            .result()
            .expect("cuModuleLoadData");
        sys::cuModuleGetFunction(&mut function, cu_module, name.as_ptr())
            .result()
            .expect("cuModuleGetFunction");
        sys::cuFuncSetAttribute(
            function,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            module.dynamic_smem_bytes as i32,
        )
        .result()
        .expect("cuFuncSetAttribute");
    }
    let header = &module.ptx[module.ptx.find(".entry").expect("an entry")..];
    let params = header[..header.find("\n{").expect("an entry body")]
        .matches(".param")
        .count();
    let mut slot = Slot([0; 128]);
    let mut ptrs = vec![(&mut slot as *mut Slot).cast::<std::ffi::c_void>(); params];
    let tiles = grid.iter().product::<u32>();
    let physical = if module.persistent {
        [tiles.min(hollow.resident_ctas()), 1, 1]
    } else {
        grid
    };
    let us = host_us(dev, || {
        // SAFETY: a hollow entry reads no parameter; every pointer addresses a live zeroed
        // block at least as wide as any slot; geometry as the module declares.
        unsafe {
            sys::cuLaunchKernel(
                function,
                physical[0],
                physical[1],
                physical[2],
                module.threads_per_block,
                1,
                1,
                module.dynamic_smem_bytes,
                std::ptr::null_mut(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .expect("cuLaunchKernel");
    });
    // SAFETY: loaded above; every launch of it has completed (host_us synchronises).
    unsafe { sys::cuModuleUnload(cu_module) }
        .result()
        .expect("cuModuleUnload");
    us
}
