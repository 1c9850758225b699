//! The tensor maps a loaded kernel's launches encoded, kept so a launch over the same tensors
//! reuses them. A map is a pure function of what it is encoded from: the tensor's address,
//! allocation and layout, and the entry's box and swizzle (fixed per loaded kernel). So an
//! entry is reused only when all of the tensor's inputs are equal, and a stale map cannot be
//! handed out: a tensor that moved, grew or changed strides misses and is encoded again.
//!
//! Encoding costs about 0.35 us of host time per map in the driver library (four a launch in
//! the attention entry, which repeated small calls from PyTorch pay every time).

use std::collections::VecDeque;
use std::sync::Mutex;

use cudarc::driver::sys;

use crate::layout::Layout;
use crate::tensor::DeviceTensor;

/// Maps kept per loaded kernel: enough for a few rotating sets of a kernel's tensors (a
/// benchmark's, a training step's); the oldest goes first.
const CAPACITY: usize = 32;

/// Everything a map depends on besides the entry's box and swizzle, for tensor parameter
/// `param`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MapInputs {
    param: usize,
    address: u64,
    /// The allocation's start and size, which the encoder's bounds checks read.
    allocation: (u64, usize),
    layout: Layout,
}

impl MapInputs {
    /// The inputs of the map of `tensor`, passed as parameter `param`.
    pub(crate) fn of(param: usize, tensor: &DeviceTensor) -> MapInputs {
        MapInputs {
            param,
            address: tensor.device_ptr(),
            allocation: (tensor.alloc_ptr(), tensor.alloc_bytes()),
            layout: tensor.layout().clone(),
        }
    }
}

/// The most recently encoded maps of one loaded kernel, by their inputs.
#[derive(Debug, Default)]
pub(crate) struct TensorMapCache {
    maps: Mutex<VecDeque<(MapInputs, sys::CUtensorMap)>>,
}

impl TensorMapCache {
    /// The map encoded before from `inputs`, if it is still kept.
    pub(crate) fn get(&self, inputs: &MapInputs) -> Option<sys::CUtensorMap> {
        // A poisoned lock only means another thread panicked mid-insert; the list is valid.
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.iter().find(|(k, _)| k == inputs).map(|&(_, map)| map)
    }

    /// Keeps `map`, encoded from `inputs`, dropping the oldest map when full.
    pub(crate) fn insert(&self, inputs: MapInputs, map: sys::CUtensorMap) {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if maps.iter().any(|(k, _)| *k == inputs) {
            return;
        }
        if maps.len() == CAPACITY {
            maps.pop_front();
        }
        maps.push_back((inputs, map));
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::DType;

    use super::*;

    fn inputs(param: usize, address: u64, shape: &[usize]) -> MapInputs {
        let layout = Layout::contiguous(DType::Bf16, shape);
        MapInputs {
            param,
            address,
            allocation: (address, 2 * shape.iter().product::<usize>()),
            layout,
        }
    }

    fn map(tag: u64) -> sys::CUtensorMap {
        sys::CUtensorMap { opaque: [tag; 16] }
    }

    #[test]
    fn a_map_is_reused_only_for_equal_inputs() {
        let cache = TensorMapCache::default();
        let a = inputs(0, 0x1000, &[4, 64]);
        cache.insert(a.clone(), map(1));
        assert_eq!(cache.get(&a).map(|m| m.opaque), Some([1; 16]));
        // Another parameter, address, shape, stride, offset or allocation: a miss each.
        let mut others = vec![
            inputs(1, 0x1000, &[4, 64]),
            inputs(0, 0x2000, &[4, 64]),
            inputs(0, 0x1000, &[8, 64]),
        ];
        let mut strided = a.clone();
        strided.layout.strides[0] = 128;
        let mut offset = a.clone();
        offset.layout.offset = 64;
        let mut bigger = a.clone();
        bigger.allocation.1 *= 2;
        others.extend([strided, offset, bigger]);
        for other in &others {
            assert!(cache.get(other).is_none(), "{other:?} hit {a:?}'s map");
        }
    }

    #[test]
    fn the_oldest_map_goes_first_when_full() {
        let cache = TensorMapCache::default();
        let key = |i: usize| inputs(0, 0x1000 * (i as u64 + 1), &[4, 64]);
        for i in 0..=CAPACITY {
            cache.insert(key(i), map(i as u64));
        }
        assert!(cache.get(&key(0)).is_none());
        for i in 1..=CAPACITY {
            assert_eq!(cache.get(&key(i)).map(|m| m.opaque[0]), Some(i as u64));
        }
        // Inserting a kept map again neither duplicates it nor evicts another.
        cache.insert(key(1), map(99));
        assert_eq!(cache.get(&key(1)).map(|m| m.opaque[0]), Some(1));
        assert_eq!(cache.get(&key(2)).map(|m| m.opaque[0]), Some(2));
    }
}
