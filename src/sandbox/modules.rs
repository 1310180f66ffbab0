//! Callers' own modules (runtime `wasm`): their shape checked against the
//! caps before anything is compiled, and the compiled results kept by hash
//! within a memory budget.
//!
//! - [`shape`]: WAT to binary, then a section scan (no compile) that counts
//!   functions, so a module over `sandbox.max_module_functions` is refused
//!   in milliseconds.
//! - [`ModuleCache`]: compiled modules by (tenant, sha256, engine), least
//!   recently used first out once their compiled size passes
//!   `sandbox.module_cache_bytes`. A tenant's modules are its own: whether
//!   another tenant ran the same module is not visible from compile times.

use std::collections::HashMap;

/// Linear estimate of what compiling a module takes in memory, per byte of
/// binary. Measured with cranelift (wasmtime 48) on generated modules of
/// 1 to 30 MB: peak RSS grew 20 to 27 bytes per module byte; rounded up.
pub const COMPILE_BYTES_PER_MODULE_BYTE: u64 = 32;

/// What [`shape`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The binary (WAT converted).
    pub binary: Vec<u8>,
    /// Function bodies over the module and every nested module.
    pub functions: u64,
    /// Whether it is a component.
    pub component: bool,
}

impl Shape {
    /// Estimated peak memory of compiling it.
    pub fn compile_memory(&self) -> u64 {
        (self.binary.len() as u64).saturating_mul(COMPILE_BYTES_PER_MODULE_BYTE)
    }
}

/// Converts WAT text to binary (binary input is kept as it is) and counts
/// its functions without compiling anything. `Err` is the parser's message:
/// the module is invalid.
pub fn shape(bytes: &[u8]) -> Result<Shape, String> {
    let binary = if bytes.starts_with(b"\0asm") {
        bytes.to_vec()
    } else {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| "the WAT source is not valid UTF-8".to_owned())?;
        wat::parse_str(text).map_err(|e| format!("{e}"))?
    };
    let mut functions = 0u64;
    let mut component = false;
    for payload in wasmparser::Parser::new(0).parse_all(&binary) {
        match payload.map_err(|e| format!("{e}"))? {
            wasmparser::Payload::Version {
                encoding: wasmparser::Encoding::Component,
                ..
            } => component = true,
            wasmparser::Payload::CodeSectionStart { count, .. } => {
                functions = functions.saturating_add(u64::from(count));
            }
            _ => {}
        }
    }
    Ok(Shape {
        binary,
        functions,
        component,
    })
}

/// The key of a compiled module: tenant, sha256 of what was sent, and
/// whether it was compiled for the fuel engine.
pub type Key = (String, String, bool);

struct Entry<V> {
    prepared: V,
    cost: u64,
    used: u64,
}

/// Compiled caller modules within a byte budget, least recently used out
/// first.
pub struct ModuleCache<V> {
    budget: u64,
    total: u64,
    clock: u64,
    entries: HashMap<Key, Entry<V>>,
}

impl<V> std::fmt::Debug for ModuleCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("budget", &self.budget)
            .field("total", &self.total)
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl<V: Clone> ModuleCache<V> {
    /// An empty cache of `budget` bytes (zero keeps nothing).
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            total: 0,
            clock: 0,
            entries: HashMap::new(),
        }
    }

    /// A hit, now the most recently used.
    pub fn get(&mut self, key: &Key) -> Option<V> {
        self.clock += 1;
        let e = self.entries.get_mut(key)?;
        e.used = self.clock;
        Some(e.prepared.clone())
    }

    /// Keeps `prepared` at `cost` bytes, evicting the least recently used
    /// until it fits. One larger than the whole budget is not kept.
    pub fn insert(&mut self, key: Key, prepared: V, cost: u64) {
        if cost > self.budget {
            return;
        }
        if let Some(old) = self.entries.remove(&key) {
            self.total -= old.cost;
        }
        while self.total + cost > self.budget {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.total -= e.cost;
            }
        }
        self.clock += 1;
        self.total += cost;
        self.entries.insert(
            key,
            Entry {
                prepared,
                cost,
                used: self.clock,
            },
        );
    }

    /// Bytes held.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.total
    }

    /// Modules held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wat_is_converted_and_its_functions_counted() {
        let s = shape(b"(module (func) (func) (func (export \"_start\")))").unwrap();
        assert!(s.binary.starts_with(b"\0asm"));
        assert_eq!(s.functions, 3);
        assert!(!s.component);
        let again = shape(&s.binary).unwrap();
        assert_eq!(again.functions, 3);
    }

    #[test]
    fn functions_of_nested_modules_count_too() {
        let s = shape(b"(component (core module (func) (func)) (core module (func)))").unwrap();
        assert!(s.component);
        assert_eq!(s.functions, 3);
    }

    fn key(n: u32) -> Key {
        ("t".into(), n.to_string(), false)
    }

    #[test]
    fn the_least_recently_used_module_is_evicted_to_stay_within_the_budget() {
        let mut c = ModuleCache::new(100);
        c.insert(key(1), 1, 40);
        c.insert(key(2), 2, 40);
        assert_eq!(c.get(&key(1)), Some(1)); // 2 is now the oldest
        c.insert(key(3), 3, 40);
        assert_eq!(c.get(&key(2)), None);
        assert_eq!((c.get(&key(1)), c.get(&key(3))), (Some(1), Some(3)));
        assert_eq!((c.bytes(), c.len()), (80, 2));
        // Larger than the whole budget: not kept, nothing evicted.
        c.insert(key(4), 4, 101);
        assert_eq!((c.get(&key(4)), c.len()), (None, 2));
        // Tenants do not share entries.
        assert_eq!(c.get(&("u".into(), "1".into(), false)), None);
    }

    #[test]
    fn broken_input_is_an_error_in_words() {
        assert!(shape(b"(module (func").is_err());
        assert!(shape(b"\0asm\x01\0\0\0\x0a\xff").is_err());
    }
}
