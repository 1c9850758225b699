//! Autotuning: a kernel declares candidates for comptime parameters (`#[comptime(tune = [64,
//! 128])]`); on first use per shape bucket, [`Device::autotune`] times every combination under a
//! progress bar (CUDA events after warm-up, the median), skips one that does not compile (over a
//! shared-memory or register budget), keeps the fastest in memory and in the disk cache
//! (`autotune/<key>.json`) and reuses it. `KILN_AUTOTUNE=0` uses the spec as given. The key
//! hashes all the choice depends on: kiln's version, the kernel, its spec without the tuned
//! values, the shape bucket, the target, the GPU and the driver.

use std::collections::BTreeMap;

use kiln_ir::dsl::{Comptime, ComptimeValue, KernelDef, Spec};
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

/// What the autotuner chose for one key, as stored on disk (values as `-D` text, so a record
/// outlives the struct it was made for: one that no longer fits is searched again).
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

/// Every combination of the tuned parameters' candidates over `base` (declaration order, the
/// first parameter varying slowest); just `base` when nothing is tuned.
pub fn candidates<C: Comptime>(base: &C) -> Vec<C> {
    base.tuning_candidates()
}

/// Whether `C` has a parameter the autotuner searches.
fn is_tuned<C: Comptime>() -> bool {
    C::PARAMS.iter().any(|p| !p.tune.is_empty())
}

/// The tuned parameters of `c` and their values, in declaration order.
fn tuned<C: Comptime>(c: &C) -> Vec<(&'static str, ComptimeValue)> {
    C::PARAMS
        .iter()
        .zip(c.values())
        .filter(|(p, _)| !p.tune.is_empty())
        .map(|(p, v)| (p.name, v))
        .collect()
}

/// The tuned values of `c`, `name=value,...`.
fn tuned_text<C: Comptime>(c: &C) -> String {
    tuned(c)
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The key of a choice (see the module doc); `device` names the GPU, target and driver.
pub fn key<C: Comptime>(kernel: &str, spec: &Spec<C>, bucket: &str, device: &str) -> String {
    let untuned = spec.key_of(|p| p.tune.is_empty());
    hash_parts(&[env!("CARGO_PKG_VERSION"), kernel, &untuned, bucket, device])
}

/// `base` with the winner of `choice`, or `None` when the choice does not fit `C` (a value
/// that no longer parses, a parameter no longer tuned or no longer a candidate).
fn apply<C: Comptime>(base: &C, choice: &Choice) -> Option<C> {
    let mut values = base.values();
    for (v, p) in values.iter_mut().zip(C::PARAMS) {
        if p.tune.is_empty() {
            continue;
        }
        let won = ComptimeValue::parse(p.kind, choice.winner.get(p.name)?)?;
        p.tune.contains(&won).then_some(())?;
        *v = won;
    }
    C::from_values(&values)
}

impl Device {
    /// The fastest specialisation of `def` over `spec`'s tuned parameters for shape bucket
    /// `bucket` (see the module doc), as its comptime struct: from memory, from the disk
    /// cache, or timed now with `run`, which launches the kernel with a candidate's comptime
    /// values on the inputs to tune with (its outputs are overwritten by every run).
    pub fn autotune<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
        bucket: &str,
        run: &mut dyn FnMut(&K::Comptime) -> Result<(), LaunchError>,
    ) -> Result<K::Comptime, LaunchError> {
        if !enabled() || !is_tuned::<K::Comptime>() {
            return Ok(spec.comptime.clone());
        }
        let key = self.tuning_key(def, spec, bucket);
        if let Some(c) = self.tuned_choices().get::<K::Comptime>(&key) {
            return Ok(c);
        }
        let path = self.disk_cache().map(|d| d.autotune_path(&key));
        let stored = self
            .stored_choice(&key)
            .and_then(|c| apply(&spec.comptime, &c));
        let chosen = match stored {
            Some(c) => c,
            None => {
                let (winner, choice) = self.search(def, spec, bucket, run)?;
                if let Some(p) = &path {
                    // Best effort: an unwritable cache only costs the next process a search.
                    let _ = serde_json::to_vec_pretty(&choice).map(|b| write_atomic(p, &b));
                }
                winner
            }
        };
        self.tuned_choices().insert(key, &chosen);
        Ok(chosen)
    }

    /// The record of the search behind [`Device::autotune`]'s choice for the same arguments:
    /// every candidate's median time, or why it was skipped. From the disk cache, so `None`
    /// without one, or when the choice was never searched for on this GPU and driver.
    pub fn autotune_record<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
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
    fn tuning_key<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
        bucket: &str,
    ) -> String {
        let device = format!(
            "{} {} driver {}",
            self.name(),
            self.target().name(),
            self.driver_version()
        );
        key(def.name(), spec, bucket, &device)
    }

    /// Times every candidate; the fastest and the record of the search.
    fn search<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        spec: &Spec<K::Comptime>,
        bucket: &str,
        run: &mut dyn FnMut(&K::Comptime) -> Result<(), LaunchError>,
    ) -> Result<(K::Comptime, Choice), LaunchError> {
        let all = candidates(&spec.comptime);
        let bar = indicatif::ProgressBar::new(all.len() as u64)
            .with_message(format!("autotuning {} for {bucket}", def.name()));
        let mut timings = Vec::new();
        let mut best: Option<(f64, K::Comptime)> = None;
        for c in all {
            bar.set_message(format!("autotuning {} ({})", def.name(), tuned_text(&c)));
            let candidate = Spec {
                comptime: c,
                aligned16: spec.aligned16.clone(),
            };
            let result = self.time_candidate(def, &candidate, run);
            if let Ok(ms) = result
                && best.as_ref().is_none_or(|(b, _)| ms < *b)
            {
                best = Some((ms, candidate.comptime.clone()));
            }
            timings.push(Timing {
                candidate: tuned_text(&candidate.comptime),
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
            winner: tuned(&winner)
                .into_iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            timings,
        };
        Ok((winner, choice))
    }

    /// The median time of `run` on candidate `c` after warm-up; an error when it does not
    /// compile or launch.
    fn time_candidate<K: KernelDef + ?Sized>(
        &self,
        def: &K,
        c: &Spec<K::Comptime>,
        run: &mut dyn FnMut(&K::Comptime) -> Result<(), LaunchError>,
    ) -> Result<f64, LaunchError> {
        self.compile(def, c)?;
        for _ in 0..WARMUP {
            run(&c.comptime)?;
        }
        let mut ms = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let ((), t) = self.time(|| run(&c.comptime))?;
            ms.push(f64::from(t));
        }
        ms.sort_by(f64::total_cmp);
        Ok(ms[RUNS / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::dsl::{ComptimeArg, ComptimeKind, ComptimeParam};

    /// What `#[comptime]` generates for `d` (untuned), `bn` and `fast` (tuned), written out.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct Tuned {
        d: usize,
        bn: usize,
        fast: bool,
    }

    impl Comptime for Tuned {
        const PARAMS: &'static [ComptimeParam] = &[
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

        fn values(&self) -> Vec<ComptimeValue> {
            vec![self.d.to_value(), self.bn.to_value(), self.fast.to_value()]
        }

        fn from_values(values: &[ComptimeValue]) -> Option<Tuned> {
            let [d, bn, fast] = values else {
                return None;
            };
            Some(Tuned {
                d: usize::from_value(*d)?,
                bn: usize::from_value(*bn)?,
                fast: bool::from_value(*fast)?,
            })
        }
    }

    fn base() -> Tuned {
        Tuned::from_defines(&[]).expect("defaults")
    }

    #[test]
    fn candidates_cover_every_combination_over_the_spec() {
        let all = candidates(&base());
        let texts: Vec<String> = all.iter().map(tuned_text).collect();
        assert_eq!(
            texts,
            [
                "bn=64,fast=false",
                "bn=64,fast=true",
                "bn=128,fast=false",
                "bn=128,fast=true"
            ]
        );
        assert!(all.iter().all(|c| c.d == 64));
    }

    #[test]
    fn the_key_ignores_tuned_values_but_not_the_rest() {
        let spec = |c| Spec::new(c).with_aligned16(&["q"]);
        let base_key = key("tuned", &spec(base()), "s=1024", "gpu");
        let other_bn = Tuned { bn: 128, ..base() };
        assert_eq!(key("tuned", &spec(other_bn), "s=1024", "gpu"), base_key);
        let other_d = Tuned { d: 128, ..base() };
        for k in [
            key("tuned", &spec(other_d), "s=1024", "gpu"),
            key("tuned", &spec(base()), "s=2048", "gpu"),
            key("tuned", &spec(base()), "s=1024", "other gpu"),
            key("tuned", &Spec::new(base()), "s=1024", "gpu"),
        ] {
            assert_ne!(k, base_key);
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
        let applied = apply(&base(), &choice("128")).expect("fits");
        assert_eq!(
            applied,
            Tuned {
                d: 64,
                bn: 128,
                fast: true
            }
        );
        // Not a candidate any more, or not a number: searched again.
        assert!(apply(&base(), &choice("256")).is_none());
        assert!(apply(&base(), &choice("x")).is_none());
        let json = serde_json::to_string(&choice("64")).expect("json");
        let back: Choice = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, choice("64"));
    }
}
