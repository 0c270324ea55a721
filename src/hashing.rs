//! A fast, fixed hasher for the caches on the planners' and the simulator's hot paths.
//!
//! The standard `HashMap` hashes with SipHash-1-3, keyed randomly per process: robust against
//! adversarial keys, which a cache of tile shapes never sees, and about 5% of `hybrid`'s quick
//! search at 256 ranks (`perf record` on `cargo bench --bench fcp_plan`). This hasher folds each
//! word in with a rotate, xor and multiply by an odd constant (the scheme of rustc's FxHash,
//! written here from its description). It is fixed, so the maps also behave the same in every
//! run.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed by [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher {
    hash: u64,
}

/// An odd constant with well-mixed bits (2⁶⁴ divided by the golden ratio, made odd).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.hash
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// A 64-bit FNV-1a hash of `bytes`: stable across Rust versions, platforms and runs (std's
/// hasher is not), for names and fingerprints written to files.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(x: &T) -> u64 {
        BuildHasherDefault::<FastHasher>::default().hash_one(x)
    }

    #[test]
    fn equal_keys_hash_equal_and_near_keys_differ() {
        assert_eq!(hash(&(1u8, 2u64, 3u64)), hash(&(1u8, 2u64, 3u64)));
        let mut seen = std::collections::BTreeSet::new();
        for q in 0..64u64 {
            for kv in 0..64u64 {
                seen.insert(hash(&(0u8, q, kv)));
            }
        }
        assert_eq!(seen.len(), 64 * 64, "tile shapes collide");
    }

    #[test]
    fn a_map_works_as_a_map() {
        let mut m: FastMap<(u64, u64), f64> = FastMap::default();
        for i in 0..10_000u64 {
            m.insert((i, i * 3), i as f64);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(&(77, 231)), Some(&77.0));
        assert_eq!(m.get(&(77, 230)), None);
    }
}
