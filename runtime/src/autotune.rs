//! Autotuning: a kernel declares candidates for comptime parameters
//! (`#[comptime(tune = [64, 128])]`); on first use per shape bucket, [`Device::autotune`] times
//! every combination of them (CUDA events, after warm-up, the median of several runs), keeps
//! the fastest in memory and in the disk cache (`autotune/<key>.json` under its directory), and
//! reuses it. A candidate that does not compile (over a shared-memory or register budget) is
//! skipped. `KILN_AUTOTUNE=0` turns it off: the spec is used as given. A progress bar shows
//! the search.
//!
//! The key hashes everything the choice depends on: kiln's version, the kernel, its spec
//! without the tuned values, the caller's shape bucket, the target, the GPU and the driver.

use std::collections::BTreeMap;

use kiln_ir::dsl::{ComptimeValue, KernelDef, Spec};
use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::disk_cache::{hash_parts, write_atomic};
use crate::error::{LaunchError, RuntimeError};

/// Untimed runs of each candidate before it is timed.
const WARMUP: usize = 2;
/// Timed runs of each candidate; the median counts.
const RUNS: usize = 7;

/// One candidate's measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The tuned values, `name=value,...`.
    pub candidate: String,
    /// Median milliseconds, or why the candidate was skipped.
    pub result: Result<f64, String>,
}

/// What the autotuner chose for one key, as stored on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// The kernel.
    pub kernel: String,
    /// The caller's shape bucket.
    pub bucket: String,
    /// The winning value of each tuned parameter, as text.
    pub winner: BTreeMap<String, String>,
    /// Every candidate's measurement.
    pub timings: Vec<Timing>,
}

/// Whether autotuning is on (`KILN_AUTOTUNE` is not `0`).
pub fn enabled() -> bool {
    std::env::var_os("KILN_AUTOTUNE").is_none_or(|v| v != "0")
}

/// Every combination of the tuned parameters' candidates, each over `spec` (in declaration
/// order, the first parameter varying slowest); just `spec` when nothing is tuned.
pub fn candidates(def: &dyn KernelDef, spec: &Spec) -> Vec<Spec> {
    let mut out = vec![spec.clone()];
    for p in def.comptime_params().iter().filter(|p| !p.tune.is_empty()) {
        out = out
            .iter()
            .flat_map(|s| {
                p.tune.iter().map(move |&v| {
                    let mut s = s.clone();
                    s.comptime.insert(p.name.to_string(), v);
                    s
                })
            })
            .collect();
    }
    out
}

/// The tuned values of `spec`, `name=value,...`.
fn tuned_text(def: &dyn KernelDef, spec: &Spec) -> String {
    tuned(def, spec)
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The values of `spec`'s tuned parameters.
fn tuned(def: &dyn KernelDef, spec: &Spec) -> BTreeMap<String, ComptimeValue> {
    def.comptime_params()
        .iter()
        .filter(|p| !p.tune.is_empty())
        .filter_map(|p| spec.comptime.get(p.name).map(|v| (p.name.to_string(), *v)))
        .collect()
}

/// The key of a choice (see the module doc); `device` names the GPU, target and driver.
pub fn key(def: &dyn KernelDef, spec: &Spec, bucket: &str, device: &str) -> String {
    let mut untuned = spec.clone();
    for p in def.comptime_params().iter().filter(|p| !p.tune.is_empty()) {
        untuned.comptime.remove(p.name);
    }
    hash_parts(&[
        env!("CARGO_PKG_VERSION"),
        def.name(),
        &untuned.key(),
        bucket,
        device,
    ])
}

/// `spec` with the winner of `choice`, or `None` when the choice does not fit `def` (a value
/// that no longer parses, a parameter no longer tuned).
fn apply(def: &dyn KernelDef, spec: &Spec, choice: &Choice) -> Option<Spec> {
    let mut out = spec.clone();
    for p in def.comptime_params().iter().filter(|p| !p.tune.is_empty()) {
        let v = ComptimeValue::parse(p.kind, choice.winner.get(p.name)?)?;
        p.tune.contains(&v).then_some(())?;
        out.comptime.insert(p.name.to_string(), v);
    }
    Some(out)
}

impl Device {
    /// The fastest specialisation of `def` over `spec`'s tuned parameters for shape bucket
    /// `bucket` (see the module doc): from memory, from the disk cache, or timed now with
    /// `run`, which launches the kernel for a candidate spec on the inputs to tune with (its
    /// outputs are overwritten by every run).
    pub fn autotune(
        &self,
        def: &dyn KernelDef,
        spec: &Spec,
        bucket: &str,
        run: &mut dyn FnMut(&Spec) -> Result<(), LaunchError>,
    ) -> Result<Spec, LaunchError> {
        if !enabled() || def.comptime_params().iter().all(|p| p.tune.is_empty()) {
            return Ok(spec.clone());
        }
        let key = self.tuning_key(def, spec, bucket);
        if let Some(s) = self.tuned_choice(&key) {
            return Ok(s);
        }
        let path = self.disk_cache().map(|d| d.autotune_path(&key));
        let stored = self.stored_choice(&key).and_then(|c| apply(def, spec, &c));
        let chosen = match stored {
            Some(s) => s,
            None => {
                let (winner, choice) = self.search(def, spec, bucket, run)?;
                if let Some(p) = &path {
                    // Best effort: an unwritable cache only costs the next process a search.
                    let _ = serde_json::to_vec_pretty(&choice).map(|b| write_atomic(p, &b));
                }
                winner
            }
        };
        self.remember_choice(key, &chosen);
        Ok(chosen)
    }

    /// The record of the search behind [`Device::autotune`]'s choice for the same arguments:
    /// every candidate's median time, or why it was skipped. From the disk cache, so `None`
    /// without one, or when the choice was never searched for on this GPU and driver.
    pub fn autotune_record(
        &self,
        def: &dyn KernelDef,
        spec: &Spec,
        bucket: &str,
    ) -> Option<Choice> {
        self.stored_choice(&self.tuning_key(def, spec, bucket))
    }

    /// The search record under `key` in the disk cache, if there is one that parses.
    fn stored_choice(&self, key: &str) -> Option<Choice> {
        let path = self.disk_cache()?.autotune_path(key);
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// The key of `def`'s choice over `spec` for `bucket` on this GPU, target and driver.
    fn tuning_key(&self, def: &dyn KernelDef, spec: &Spec, bucket: &str) -> String {
        let device = format!(
            "{} {} driver {}",
            self.name(),
            self.target().name(),
            self.driver_version()
        );
        key(def, spec, bucket, &device)
    }

    /// Times every candidate; the fastest and the record of the search.
    fn search(
        &self,
        def: &dyn KernelDef,
        spec: &Spec,
        bucket: &str,
        run: &mut dyn FnMut(&Spec) -> Result<(), LaunchError>,
    ) -> Result<(Spec, Choice), LaunchError> {
        let all = candidates(def, spec);
        let bar = indicatif::ProgressBar::new(all.len() as u64)
            .with_message(format!("autotuning {} for {bucket}", def.name()));
        let mut timings = Vec::new();
        let mut best: Option<(f64, Spec)> = None;
        for c in all {
            bar.set_message(format!(
                "autotuning {} ({})",
                def.name(),
                tuned_text(def, &c)
            ));
            let result = self.time_candidate(def, &c, run);
            if let Ok(ms) = result
                && best.as_ref().is_none_or(|(b, _)| ms < *b)
            {
                best = Some((ms, c.clone()));
            }
            timings.push(Timing {
                candidate: tuned_text(def, &c),
                result: result.map_err(|e| e.to_string()),
            });
            bar.inc(1);
        }
        bar.finish_and_clear();
        let Some((_, winner)) = best else {
            return Err(RuntimeError::Autotune {
                kernel: def.name().to_string(),
                bucket: bucket.to_string(),
                timings: timings
                    .iter()
                    .map(|t| format!("{}: {:?}", t.candidate, t.result))
                    .collect(),
            }
            .into());
        };
        let choice = Choice {
            kernel: def.name().to_string(),
            bucket: bucket.to_string(),
            winner: tuned(def, &winner)
                .into_iter()
                .map(|(n, v)| (n, v.to_string()))
                .collect(),
            timings,
        };
        Ok((winner, choice))
    }

    /// The median time of `run` on candidate `c` after warm-up; an error when it does not
    /// compile or launch.
    fn time_candidate(
        &self,
        def: &dyn KernelDef,
        c: &Spec,
        run: &mut dyn FnMut(&Spec) -> Result<(), LaunchError>,
    ) -> Result<f64, LaunchError> {
        self.compile(def, c)?;
        for _ in 0..WARMUP {
            run(c)?;
        }
        let mut ms = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let ((), t) = self.time(|| run(c))?;
            ms.push(f64::from(t));
        }
        ms.sort_by(f64::total_cmp);
        Ok(ms[RUNS / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::dsl::{ComptimeKind, ComptimeParam, ParamSig};
    use kiln_ir::{Diagnostic, Kernel};

    struct Tuned;

    const COMPTIME: &[ComptimeParam] = &[
        ComptimeParam {
            name: "d",
            kind: ComptimeKind::Usize,
            default: Some(ComptimeValue::Usize(64)),
            tune: &[],
        },
        ComptimeParam {
            name: "bn",
            kind: ComptimeKind::Usize,
            default: Some(ComptimeValue::Usize(0)),
            tune: &[ComptimeValue::Usize(64), ComptimeValue::Usize(128)],
        },
        ComptimeParam {
            name: "fast",
            kind: ComptimeKind::Bool,
            default: Some(ComptimeValue::Bool(false)),
            tune: &[ComptimeValue::Bool(false), ComptimeValue::Bool(true)],
        },
    ];

    impl KernelDef for Tuned {
        fn name(&self) -> &'static str {
            "tuned"
        }
        fn comptime_params(&self) -> &'static [ComptimeParam] {
            COMPTIME
        }
        fn signature(&self) -> &'static [ParamSig] {
            &[]
        }
        fn build(&self, _: &Spec) -> Result<Kernel, Diagnostic> {
            Err(Diagnostic::internal(
                Default::default(),
                "not built in these tests",
            ))
        }
    }

    fn spec() -> Spec {
        Spec::from_defaults(&Tuned, &[]).expect("defaults")
    }

    #[test]
    fn candidates_cover_every_combination_over_the_spec() {
        let all = candidates(&Tuned, &spec());
        let texts: Vec<String> = all.iter().map(|s| tuned_text(&Tuned, s)).collect();
        assert_eq!(
            texts,
            [
                "bn=64,fast=false",
                "bn=64,fast=true",
                "bn=128,fast=false",
                "bn=128,fast=true"
            ]
        );
        assert!(
            all.iter()
                .all(|s| s.comptime["d"] == ComptimeValue::Usize(64))
        );
    }

    #[test]
    fn the_key_ignores_tuned_values_but_not_the_rest() {
        let base = key(&Tuned, &spec(), "s=1024", "gpu");
        let mut other_bn = spec();
        other_bn
            .comptime
            .insert("bn".into(), ComptimeValue::Usize(128));
        assert_eq!(key(&Tuned, &other_bn, "s=1024", "gpu"), base);
        let mut other_d = spec();
        other_d
            .comptime
            .insert("d".into(), ComptimeValue::Usize(128));
        for k in [
            key(&Tuned, &other_d, "s=1024", "gpu"),
            key(&Tuned, &spec(), "s=2048", "gpu"),
            key(&Tuned, &spec(), "s=1024", "other gpu"),
        ] {
            assert_ne!(k, base);
        }
    }

    #[test]
    fn stored_choices_apply_only_when_they_still_fit() {
        let choice = |bn: &str| Choice {
            kernel: "tuned".into(),
            bucket: "b".into(),
            winner: [
                ("bn".to_string(), bn.to_string()),
                ("fast".into(), "true".into()),
            ]
            .into_iter()
            .collect(),
            timings: vec![Timing {
                candidate: "bn=128,fast=true".into(),
                result: Ok(0.5),
            }],
        };
        let applied = apply(&Tuned, &spec(), &choice("128")).expect("fits");
        assert_eq!(applied.comptime["bn"], ComptimeValue::Usize(128));
        assert_eq!(applied.comptime["fast"], ComptimeValue::Bool(true));
        // Not a candidate any more, or not a number: searched again.
        assert!(apply(&Tuned, &spec(), &choice("256")).is_none());
        assert!(apply(&Tuned, &spec(), &choice("x")).is_none());
        let json = serde_json::to_string(&choice("64")).expect("json");
        let back: Choice = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, choice("64"));
    }
}
