//! `kiln`: the bundled command over the example kernels. It is the one line any crate writes
//! to inspect its own kernels (`kiln::cli`, whose documentation says how), linked with
//! `kiln-examples`, whose kernels register themselves. `kiln --help` (and `kiln COMMAND
//! --help`) says what it does.

use std::process::ExitCode;

// Named so that the examples' crate, and with it their registered kernels, is linked in.
use kiln_examples as _;

fn main() -> ExitCode {
    kiln::cli::main()
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kiln::cli::{Cli, Command, KernelArgs};
    use kiln::ir::dsl::{Comptime, DefineError};
    use kiln::ir::{DType, Target};
    use kiln::prelude::{block_id, kernel};
    use kiln_examples::attention::AttentionParams;

    /// A kernel under `#[cfg(test)]`: registered in this test binary only.
    #[kernel(grid = [128, 1, 1])]
    fn negated_in_unit_tests(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let i = block_id().x * 128;
        y.tile([128], [i]).store(-x.tile([128], [i]).load());
    }

    #[test]
    fn a_kernel_under_cfg_test_is_seen_beside_the_examples() {
        let run = |args: &[&str]| {
            Cli::try_parse_from(["kiln"].iter().chain(args))
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.run())
        };
        let list = run(&["list"]).expect("list");
        assert!(list.contains("\nnegated_in_unit_tests\n"), "{list}");
        assert!(list.contains("\ngemm\n"), "{list}");
        let ptx = run(&["ptx", "negated_in_unit_tests", "--target", "sm_90a"]).expect("ptx");
        assert!(
            ptx.contains(".target sm_90a") && ptx.contains(".entry negated_in_unit_tests"),
            "{ptx}"
        );
        // The examples' own list is the examples crate's kernels alone.
        assert!(
            !kiln_examples::registry()
                .iter()
                .any(|k| k.name() == "negated_in_unit_tests")
        );
    }

    /// The `-D` values of `kiln ptx attention ARGS..`, parsed into attention's comptime struct.
    fn attention_params(args: &[&str]) -> Result<AttentionParams, String> {
        let cli = Cli::try_parse_from(["kiln", "ptx", "attention"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        let Command::Ptx {
            kernel: KernelArgs { defines, .. },
            ..
        } = cli.command
        else {
            return Err("not `kiln ptx`".into());
        };
        AttentionParams::from_defines(&defines).map_err(|e| e.to_string())
    }

    #[test]
    fn defines_parse_into_the_kernels_comptime_struct() {
        let p = attention_params(&[
            "-D",
            "d=64",
            "-D",
            "causal=true",
            "-D",
            "dtype=f16",
            "-D",
            "window_left=-3",
            "-D",
            "softcap=-0.0",
            "-D",
            "d=96",
        ])
        .expect("valid defines");
        assert_eq!(
            p,
            AttentionParams {
                d: 96,
                causal: true,
                dtype: DType::F16,
                window_left: -3,
                softcap: -0.0,
                ..AttentionParams::default()
            }
        );
        // The sign of a zero is a specialisation of its own.
        assert_ne!(p.softcap.to_bits(), 0.0f32.to_bits());
        assert_eq!(attention_params(&[]), Ok(AttentionParams::default()));
    }

    #[test]
    fn a_bad_value_names_the_parameter_and_its_type() {
        let err = attention_params(&["-D", "d=x"]).expect_err("not a usize");
        assert_eq!(err, "comptime parameter `d` is a usize, and `x` is not one");
        let err = attention_params(&["-D", "dtype=f64"]).expect_err("not a DType");
        assert_eq!(
            err,
            "comptime parameter `dtype` is a DType, and `f64` is not one"
        );
        let err = attention_params(&["-D", "causal=1"]).expect_err("not a bool");
        assert!(err.contains("`causal` is a bool"), "{err}");
    }

    #[test]
    fn an_unknown_name_lists_the_parameters() {
        let err = attention_params(&["-D", "heads=3"]).expect_err("no such parameter");
        let known: Vec<&str> = AttentionParams::PARAMS.iter().map(|p| p.name).collect();
        assert_eq!(
            err,
            DefineError::UnknownParam {
                name: "heads".into(),
                known,
            }
            .to_string()
        );
        assert!(
            err.starts_with("no comptime parameter `heads`; the parameters are: d, dv, causal")
        );
        let err = attention_params(&["-D", "d"]).expect_err("no `=`");
        assert!(err.contains("`d`: expected NAME=VALUE"), "{err}");
    }

    #[test]
    fn the_cli_builds_with_defines_and_reports_bad_ones_by_kernel() {
        let args = |defines: &[&str]| KernelArgs {
            name: "attention".into(),
            target: Some(Target::Sm80),
            defines: defines
                .iter()
                .map(|d| kiln::cli::define(d).expect("NAME=VALUE"))
                .collect(),
        };
        assert!(args(&["d=64"]).build().is_ok());
        let err = args(&["d=64", "bn=3"]).build().expect_err("unknown");
        assert!(
            err.starts_with("kernel `attention`: no comptime parameter `bn`"),
            "{err}"
        );
    }
}
