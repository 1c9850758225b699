//! The in-memory caches a [`Device`](crate::Device) keeps, keyed by typed values: loaded
//! kernels by their [`Spec`] (one map per kernel name, comptime struct and target, so a
//! lookup hashes the launch's comptime struct itself and builds no key string), and the
//! autotuner's choices, each a kernel's comptime struct.
//!
//! Values of different comptime structs live side by side as `dyn Any` in [`Slots`], each
//! reached as the type its key implies; nothing outside this file sees the erasure.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use kiln_ir::Target;
use kiln_ir::dsl::{Comptime, Spec};

use crate::module::LoadedKernel;

/// One value per key, of the type the key implies, behind a lock.
struct Slots<K> {
    by_key: Mutex<HashMap<K, Box<dyn Any + Send>>>,
}

impl<K: Hash + Eq> Slots<K> {
    /// Runs `f` on the value under `key`, a `T::default()` put there first when there is none
    /// (or one of another type, which a key that implies its type never holds).
    fn with<T: Any + Send + Default, R>(&self, key: K, f: impl FnOnce(&mut T) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-insert; the map is valid.
        let mut by_key = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let slot = by_key.entry(key).or_insert_with(|| Box::new(T::default()));
        if !slot.is::<T>() {
            *slot = Box::new(T::default());
        }
        match slot.downcast_mut::<T>() {
            Some(value) => f(value),
            None => f(&mut T::default()),
        }
    }
}

impl<K> Default for Slots<K> {
    fn default() -> Slots<K> {
        Slots {
            by_key: Mutex::new(HashMap::new()),
        }
    }
}

impl<K> fmt::Debug for Slots<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by_key = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        write!(f, "{} entries", by_key.len())
    }
}

/// The loaded kernels of one kernel, comptime struct and target, by specialisation.
type SpecCache<C> = HashMap<Spec<C>, Arc<LoadedKernel>>;

/// Loaded kernels by kernel (its name and comptime struct), target and [`Spec`].
#[derive(Debug, Default)]
pub(crate) struct LoadedKernels(Slots<(&'static str, TypeId, Target)>);

impl LoadedKernels {
    /// The kernel `kernel` loaded for `target` and `spec`: the cached one, else `load`'s,
    /// which is cached. Loads one at a time (a second launch of a kernel being compiled
    /// waits for it rather than compiling it again).
    pub(crate) fn get_or_load<C: Comptime, E>(
        &self,
        kernel: &'static str,
        target: Target,
        spec: &Spec<C>,
        load: impl FnOnce() -> Result<LoadedKernel, E>,
    ) -> Result<Arc<LoadedKernel>, E> {
        let key = (kernel, TypeId::of::<C>(), target);
        self.0.with(key, |specs: &mut SpecCache<C>| {
            if let Some(k) = specs.get(spec) {
                return Ok(k.clone());
            }
            let k = Arc::new(load()?);
            specs.insert(spec.clone(), k.clone());
            Ok(k)
        })
    }
}

/// The autotuner's choices made in this process, by key (`crate::autotune`: the key names
/// the kernel, so its comptime struct).
#[derive(Debug, Default)]
pub(crate) struct Choices(Slots<String>);

impl Choices {
    /// The choice under `key`, if one of comptime struct `C` was made.
    pub(crate) fn get<C: Comptime>(&self, key: &str) -> Option<C> {
        self.0.with(key.to_string(), |c: &mut Option<C>| c.clone())
    }

    /// Keeps `choice` under `key`.
    pub(crate) fn insert<C: Comptime>(&self, key: String, choice: &C) {
        self.0
            .with(key, |c: &mut Option<C>| *c = Some(choice.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_one_value_per_key_of_the_type_asked_for() {
        let slots = Slots::<&str>::default();
        slots.with("a", |v: &mut Vec<u32>| v.push(1));
        slots.with("a", |v: &mut Vec<u32>| v.push(2));
        assert_eq!(slots.with("a", |v: &mut Vec<u32>| v.clone()), [1, 2]);
        // Another type under the same key starts afresh rather than misreading the value.
        assert_eq!(slots.with("a", |v: &mut Option<u8>| *v), None);
        assert_eq!(slots.with("b", |v: &mut Vec<u32>| v.len()), 0);
        assert_eq!(format!("{slots:?}"), "2 entries");
    }

    #[test]
    fn choices_come_back_as_their_type() {
        let choices = Choices::default();
        assert_eq!(choices.get::<()>("k"), None);
        choices.insert("k".into(), &());
        assert_eq!(choices.get::<()>("k"), Some(()));
    }
}
