//! In-kernel print (`kprint!`) without a GPU: the line format on the interpreter, the PTX
//! (`vprintf`, ptxas-clean on every target) and the diagnostics for bad prints.

mod printing;

use kiln::ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln::ir::interp::{HostArg, run_captured};
use kiln::ir::{DType, HostTensor, Target};
use printing::{COLS, ROWS, input, print_probe};

#[test]
fn the_interpreter_prints_one_line_per_block_in_the_gpu_format() {
    let kernel = print_probe
        .build(&Spec::uniform((), print_probe.signature(), true))
        .unwrap();
    let x = input(2);
    let mut y = HostTensor::full(&[2 * ROWS, COLS], DType::F32, 0.0);
    let lines = run_captured(
        &kernel,
        [2, 1, 1],
        &mut [
            HostArg::Tensor(&x),
            HostArg::TensorMut(&mut y),
            HostArg::F32(0.5),
        ],
    )
    .unwrap();
    // Block 1, row 3 is global row 67: s[3, 5] = 0.5 * (67 - 2.5); the row maximum of row 7
    // (71) is at column 0; h[63, 62] = 0.5 * (127 - 31) = 48.
    assert_eq!(
        lines,
        [
            "[block (0, 0, 0)] block 0 scale 0.500000 s[3, 5] = 0.250000",
            "[block (0, 0, 0)] m[7] = 3.500000 (100% of the rows), {braces}",
            "[block (0, 0, 0)] bf16 h[63, 62] = 16.000000, positive: 1",
            "[block (1, 0, 0)] block 1 scale 0.500000 s[3, 5] = 32.250000",
            "[block (1, 0, 0)] m[7] = 35.500000 (101% of the rows), {braces}",
            "[block (1, 0, 0)] bf16 h[63, 62] = 48.000000, positive: 1",
        ]
    );
}

#[test]
fn prints_become_vprintf_calls_that_ptxas_accepts() {
    let kernel = print_probe
        .build(&Spec::uniform((), print_probe.signature(), true))
        .unwrap();
    let have_ptxas = kiln::ptx::ptxas::find_ptxas().is_ok();
    for target in [Target::Sm80, Target::Sm90a] {
        let m = kiln::ptx::compile(&kernel, target).unwrap();
        assert_eq!(m.ptx.matches("call.uni (kiln_status), vprintf").count(), 3);
        assert!(m.ptx.contains(".extern .func (.param .b32 status) vprintf"));
        // `%` in the text is escaped for printf; `{}` became conversions.
        assert!(m.ptx.contains(".local .align 8 .b8 kiln_print_buf["));
        let fmt: String = "(%d%% of the rows)".to_string();
        let bytes: Vec<String> = fmt.bytes().map(|b| b.to_string()).collect();
        assert!(
            m.ptx.contains(&bytes.join(", ")),
            "{target}: escaped format"
        );
        if have_ptxas {
            let report = kiln::ptx::ptxas::check(&m.ptx, target).unwrap();
            assert!(!report.spills(), "{target}: {report:?}");
        }
    }
}

#[test]
fn bad_prints_are_diagnostics_at_the_call() {
    use kiln::prelude::*;

    #[kernel(num_warps = 1)]
    fn too_few(x: Tensor<f32, 1>) {
        let t = x.tile([32], [0]).load();
        kprint!("{} and {}", at(&t, [0]));
    }
    #[kernel(num_warps = 1)]
    fn debug_format(x: Tensor<f32, 1>) {
        let t = x.tile([32], [0]).load();
        kprint!("{:?}", at(&t, [0]));
    }
    #[kernel(num_warps = 1)]
    fn whole_tile(x: Tensor<f32, 1>) {
        let t = x.tile([32], [0]).load();
        kprint!("{}", t);
    }
    #[kernel(num_warps = 1)]
    fn outside(x: Tensor<f32, 1>) {
        let t = x.tile([32], [0]).load();
        kprint!("{}", at(&t, [32]));
    }
    let cases: [(&dyn KernelDef<Comptime = ()>, &str); 4] = [
        (&too_few, "has 2 placeholder(s) but 1 argument(s)"),
        (&debug_format, "only `{}` placeholders"),
        (&whole_tile, "print one element with `at(&tile, [..])`"),
        (&outside, "element [32] is outside"),
    ];
    for (def, want) in cases {
        let spec = Spec::uniform((), def.signature(), true);
        let err = match def.build(&spec) {
            Ok(k) => kiln::ir::verify::verify(&k).expect_err(want).to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{}: {err}", def.name());
        assert!(
            err.contains("tests/tests/device_print.rs"),
            "{}: located: {err}",
            def.name()
        );
    }
}
