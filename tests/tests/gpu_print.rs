//! In-kernel print on the GPU: the lines `vprintf` writes match the interpreter's, on every
//! target the GPU runs. The driver writes device printf output to the process's stdout, so
//! the test runs the kernel in a child process (this binary, with `KILN_PRINT_CHILD` naming
//! the target) and reads what it printed.

mod gpu_common;
mod printing;

use std::process::{Command, ExitCode};

use gpu_common::Needs;
use kiln::ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln::ir::interp::{HostArg, run_captured};
use kiln::ir::{DType, HostTensor, Target};
use kiln_runtime::Device;
use printing::{COLS, ROWS, input, print_probe};

/// Set in the child: the target to compile for.
const CHILD: &str = "KILN_PRINT_CHILD";
/// Blocks of the probe's grid.
const BLOCKS: usize = 3;
/// The probe's scale.
const SCALE: f32 = 0.75;

fn main() -> ExitCode {
    if let Ok(target) = std::env::var(CHILD) {
        return child(&target);
    }
    gpu_common::run(&[(
        "gpu_print_matches_the_interpreter",
        Needs::Gpu,
        gpu_print_matches_the_interpreter,
    )])
}

/// Runs the probe on the GPU for `target`; the driver prints its lines at the synchronise.
fn child(target: &str) -> ExitCode {
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let target: Target = target.parse()?;
        let dev = Device::new(0)?.with_target(target);
        let x = dev.upload(&input(BLOCKS))?;
        let y = dev.alloc(DType::F32, &[BLOCKS * ROWS, COLS])?;
        print_probe.launch(&dev, [BLOCKS as u32, 1, 1], &x, &y, SCALE)?;
        dev.synchronize()?;
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("print child: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gpu_print_matches_the_interpreter() {
    let spec = Spec::uniform((), print_probe.signature(), true);
    let kernel = print_probe.build(&spec).expect("build");
    let x = input(BLOCKS);
    let mut y = HostTensor::full(&[BLOCKS * ROWS, COLS], DType::F32, 0.0);
    let mut want = run_captured(
        &kernel,
        [BLOCKS as u32, 1, 1],
        &mut [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut y),
            HostArg::F32(SCALE),
        ],
    )
    .expect("interpret");
    // Blocks print in any order on the GPU; within a block, in program order.
    want.sort();
    let dev = Device::new(0).expect("device");
    let mut targets = vec![Target::Sm80];
    if dev.compute_capability() == (9, 0) {
        targets.push(Target::Sm90a);
    }
    for target in targets {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .env(CHILD, target.name())
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{target}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut got: Vec<String> = stdout
            .lines()
            .filter(|l| l.starts_with("[block"))
            .map(str::to_string)
            .collect();
        got.sort();
        assert_eq!(got, want, "{target}");
    }
}
