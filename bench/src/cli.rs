//! The benchmarks' command line: `--out PATH` (JSON results), `--iters N`, `--warmup N`,
//! `--quick` (a reduced sweep for a smoke run), `--target sm_80|sm_90a|sm_100a` (default: the
//! runtime's default, the GPU's own target), `--b-col-major` (gemm only: B stored column-major).

use std::path::PathBuf;

use kiln_ir::Target;

/// Parsed options.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// Where to write the JSON results; none means print only.
    pub out: Option<PathBuf>,
    /// Timed runs per configuration (the median is reported).
    pub iters: usize,
    /// Untimed runs before timing (JIT, clocks, caches).
    pub warmup: usize,
    /// Run a reduced sweep.
    pub quick: bool,
    /// The target to compile kiln kernels for; `None` keeps the runtime's default.
    pub target: Option<Target>,
    /// gemm: B stored column-major (`b: [N, K]`, the kernel's `b_col_major`).
    pub b_col_major: bool,
    /// attention: run only these `(s, d, causal)` points of the sweep (`--only 8192:128:false,...`).
    pub only: Vec<(usize, usize, bool)>,
    /// Extra comptime values for the kiln kernel (`--set block_n=128`), over the sweep's.
    pub set: Vec<(String, String)>,
}

/// A command-line error, with the usage line.
#[derive(Debug, thiserror::Error)]
#[error(
    "{message}\nusage: {program} [--out PATH] [--iters N] [--warmup N] [--quick] [--target NAME] \
     [--b-col-major] [--only S:D:CAUSAL,...] [--set NAME=VALUE]"
)]
pub struct ArgsError {
    program: String,
    message: String,
}

impl Args {
    /// Parses `std::env::args()`.
    pub fn from_env() -> Result<Args, ArgsError> {
        let mut it = std::env::args();
        let program = it.next().unwrap_or_else(|| "bench".into());
        Args::parse(&program, it)
    }

    /// Parses `args` (without the program name).
    pub fn parse(program: &str, args: impl IntoIterator<Item = String>) -> Result<Args, ArgsError> {
        let err = |message: String| ArgsError {
            program: program.to_string(),
            message,
        };
        let mut out = Args {
            out: None,
            iters: 30,
            warmup: 5,
            quick: false,
            target: None,
            b_col_major: false,
            only: Vec::new(),
            set: Vec::new(),
        };
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .ok_or_else(|| err(format!("{name} needs a value")))
            };
            match flag.as_str() {
                "--out" => out.out = Some(PathBuf::from(value("--out")?)),
                "--iters" | "--warmup" => {
                    let v = value(&flag)?;
                    let n: usize = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        err(format!("{flag} expects a positive integer, got `{v}`"))
                    })?;
                    if flag == "--iters" {
                        out.iters = n;
                    } else {
                        out.warmup = n;
                    }
                }
                "--quick" => out.quick = true,
                "--b-col-major" => out.b_col_major = true,
                "--set" => {
                    let v = value("--set")?;
                    let (k, x) = v
                        .split_once('=')
                        .ok_or_else(|| err(format!("--set expects NAME=VALUE, got `{v}`")))?;
                    out.set.push((k.to_string(), x.to_string()));
                }
                "--only" => {
                    let v = value("--only")?;
                    for point in v.split(',') {
                        let parsed = match point.split(':').collect::<Vec<_>>()[..] {
                            [s, d, c] => s.parse().ok().zip(d.parse().ok()).zip(c.parse().ok()),
                            _ => None,
                        };
                        let ((s, d), c) = parsed.ok_or_else(|| {
                            err(format!("--only expects S:D:CAUSAL points, got `{point}`"))
                        })?;
                        out.only.push((s, d, c));
                    }
                }
                "--target" => {
                    let v = value("--target")?;
                    out.target = Some(v.parse().map_err(|e| err(format!("{e}")))?);
                }
                other => return Err(err(format!("unknown option `{other}`"))),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse("b", args.iter().map(|s| s.to_string()))
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
        ])
        .expect("valid");
        assert_eq!(a.out, Some(PathBuf::from("r.json")));
        assert_eq!(
            (a.iters, a.warmup, a.quick, a.b_col_major),
            (7, 2, true, true)
        );
        assert!(!parse(&[]).expect("defaults").b_col_major);
    }

    #[test]
    fn rejects_bad_values_by_name() {
        let e = parse(&["--iters", "0"]).expect_err("zero");
        assert!(
            e.to_string()
                .starts_with("--iters expects a positive integer, got `0`"),
            "{e}"
        );
        let e = parse(&["--out"]).expect_err("missing");
        assert!(e.to_string().starts_with("--out needs a value"), "{e}");
        let e = parse(&["--fast"]).expect_err("unknown");
        assert!(e.to_string().contains("usage: b"), "{e}");
    }
}
