//! The benchmarks' command line (clap): `--out PATH` (JSON results), `--iters N`,
//! `--warmup N`, `--quick` (a reduced sweep for a smoke run), `--target sm_80|sm_90a|sm_100a`
//! (default: the runtime's default, the GPU's own target), `--b-col-major` (gemm only: B
//! stored column-major), `--only S:D:CAUSAL,...` (attention only), `--shapes M:N:K,...` (gemm only) and
//! `--set NAME=VALUE`.

use std::path::PathBuf;

use clap::Parser;
use kiln_ir::Target;

/// Options every benchmark binary takes.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(version)]
pub struct Args {
    /// Where to write the JSON results; none means print only.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Timed runs per configuration (the median is reported).
    #[arg(long, default_value_t = 30, value_parser = positive)]
    pub iters: usize,
    /// Untimed runs before timing (JIT, clocks, caches).
    #[arg(long, default_value_t = 5, value_parser = positive)]
    pub warmup: usize,
    /// Run a reduced sweep.
    #[arg(long)]
    pub quick: bool,
    /// The target to compile kiln kernels for; none keeps the runtime's default.
    #[arg(long)]
    pub target: Option<Target>,
    /// gemm: B stored column-major (`b: [N, K]`, the kernel's `b_col_major`).
    #[arg(long)]
    pub b_col_major: bool,
    /// attention: run only these `(s, d, causal)` points of the sweep, `S:D:CAUSAL,...`.
    #[arg(long, value_delimiter = ',', value_parser = point)]
    pub only: Vec<(usize, usize, bool)>,
    /// gemm: run these shapes instead of the sweep, `M:N:K,...`.
    #[arg(long, value_delimiter = ',', value_parser = gemm_shape)]
    pub shapes: Vec<[usize; 3]>,
    /// Extra comptime values for the kiln kernel, `NAME=VALUE` (repeatable), over the sweep's.
    #[arg(long, value_parser = setting)]
    pub set: Vec<(String, String)>,
    /// attention: the autotuner picks the kernel's tuned comptime values (`block_n`) per
    /// configuration, instead of the sweep's choice.
    #[arg(long)]
    pub autotune: bool,
}

/// A positive integer.
fn positive(s: &str) -> Result<usize, String> {
    s.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("expected a positive integer, got `{s}`"))
}

/// `S:D:CAUSAL`, for example `8192:128:false`.
fn point(s: &str) -> Result<(usize, usize, bool), String> {
    let parsed = match s.split(':').collect::<Vec<_>>()[..] {
        [n, d, c] => n.parse().ok().zip(d.parse().ok()).zip(c.parse().ok()),
        _ => None,
    };
    parsed
        .map(|((n, d), c)| (n, d, c))
        .ok_or_else(|| format!("expected S:D:CAUSAL (8192:128:false), got `{s}`"))
}

/// `M:N:K`, for example `4096:4096:64`.
fn gemm_shape(s: &str) -> Result<[usize; 3], String> {
    let dims: Option<Vec<usize>> = s.split(':').map(|x| x.parse().ok()).collect();
    match dims.as_deref() {
        Some(&[m, n, k]) if m > 0 && n > 0 && k > 0 => Ok([m, n, k]),
        _ => Err(format!(
            "expected M:N:K of positive integers (4096:4096:64), got `{s}`"
        )),
    }
}

/// `NAME=VALUE`; the value is parsed as the kernel's parameter type when its comptime struct
/// is made (`Comptime::with_defines`).
fn setting(s: &str) -> Result<(String, String), String> {
    kiln_ir::dsl::split_define(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("b").chain(args.iter().copied()))
    }

    #[test]
    fn parses_every_option() {
        let a = parse(&[
            "--out",
            "r.json",
            "--iters",
            "7",
            "--warmup",
            "2",
            "--quick",
            "--b-col-major",
            "--target",
            "sm_90a",
            "--only",
            "8192:128:false,1024:64:true",
            "--set",
            "block_n=128",
            "--shapes",
            "4096:4096:64,1000:3000:777",
        ])
        .expect("valid");
        assert_eq!(a.out, Some(PathBuf::from("r.json")));
        assert_eq!(
            (a.iters, a.warmup, a.quick, a.b_col_major, a.target),
            (7, 2, true, true, Some(Target::Sm90a))
        );
        assert_eq!(a.only, [(8192, 128, false), (1024, 64, true)]);
        assert_eq!(a.set, [("block_n".to_string(), "128".to_string())]);
        assert_eq!(a.shapes, [[4096, 4096, 64], [1000, 3000, 777]]);
        let d = parse(&[]).expect("defaults");
        assert_eq!((d.iters, d.warmup, d.b_col_major), (30, 5, false));
    }

    #[test]
    fn rejects_bad_values_by_name() {
        let e = parse(&["--iters", "0"]).expect_err("zero").to_string();
        assert!(
            e.contains("--iters") && e.contains("expected a positive integer, got `0`"),
            "{e}"
        );
        let e = parse(&["--out"]).expect_err("missing").to_string();
        assert!(e.contains("--out"), "{e}");
        let e = parse(&["--only", "8192:128"])
            .expect_err("short")
            .to_string();
        assert!(e.contains("expected S:D:CAUSAL"), "{e}");
        let e = parse(&["--shapes", "4096:0:64"])
            .expect_err("zero")
            .to_string();
        assert!(e.contains("expected M:N:K"), "{e}");
        let e = parse(&["--target", "sm_75"])
            .expect_err("target")
            .to_string();
        assert!(e.contains("unknown target `sm_75`"), "{e}");
        let e = parse(&["--fast"]).expect_err("unknown").to_string();
        assert!(e.contains("--fast"), "{e}");
    }
}
