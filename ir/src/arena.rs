//! Typed arenas and handles: every IR entity lives in an [`Arena`] and is named by a
//! [`Handle`], a non-zero `u32` so that `Option<Handle<T>>` costs nothing.

use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;

/// An index into an [`Arena<T>`]. Prints as the IR printer names the entity (`%12`, `op3`).
pub struct Handle<T> {
    index: NonZeroU32,
    _marker: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The zero-based position of the entity in its arena.
    pub fn index(self) -> usize {
        self.index.get() as usize - 1
    }

    /// The handle of the entity at zero-based position `index`.
    pub fn from_index(index: usize) -> Self {
        let raw = u32::try_from(index + 1).expect("arena larger than u32::MAX entries");
        Handle {
            index: NonZeroU32::new(raw).expect("index + 1 is never zero"),
            _marker: PhantomData,
        }
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index
    }
}
impl<T> Eq for Handle<T> {}
impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Handle<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index.cmp(&other.index)
    }
}
impl<T> std::hash::Hash for Handle<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.index.hash(state)
    }
}

/// Names the prefix an entity prints with, so handles, dumps and diagnostics agree.
pub trait EntityName {
    /// The printed prefix, e.g. `%` for values.
    const PREFIX: &'static str;
}

impl<T: EntityName> fmt::Display for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", T::PREFIX, self.index())
    }
}
impl<T: EntityName> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A growable store of `T`, addressed by [`Handle<T>`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arena<T> {
    data: Vec<T>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { data: Vec::new() }
    }
}

impl<T> Arena<T> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `value` and returns its handle.
    pub fn append(&mut self, value: T) -> Handle<T> {
        self.data.push(value);
        Handle::from_index(self.data.len() - 1)
    }

    /// The number of entities stored.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the arena holds nothing.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The entity `h` names, or `None` for a handle of another arena (a malformed kernel).
    pub fn get(&self, h: Handle<T>) -> Option<&T> {
        self.data.get(h.index())
    }

    /// Every handle with its entity, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (Handle<T>, &T)> {
        self.data
            .iter()
            .enumerate()
            .map(|(i, v)| (Handle::from_index(i), v))
    }

    /// Every handle with its entity, mutably, in insertion order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Handle<T>, &mut T)> {
        self.data
            .iter_mut()
            .enumerate()
            .map(|(i, v)| (Handle::from_index(i), v))
    }
}

impl<T> std::ops::Index<Handle<T>> for Arena<T> {
    type Output = T;
    fn index(&self, h: Handle<T>) -> &T {
        &self.data[h.index()]
    }
}

impl<T> std::ops::IndexMut<Handle<T>> for Arena<T> {
    fn index_mut(&mut self, h: Handle<T>) -> &mut T {
        &mut self.data[h.index()]
    }
}
