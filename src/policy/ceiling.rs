//! The exec ceiling a policy carries, as stored and configured. The sandbox
//! has its own runtime limits type; the one conversion is here.

use serde::{Deserialize, Serialize};

/// The most an exec may ask for, as a policy level stores it; a zero field
/// sets no ceiling at that level. The sandbox has its own runtime type
/// ([`crate::sandbox::limits::ExecLimits`]); [`From`] converts, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecCeiling {
    /// Wall-clock time, in milliseconds.
    pub timeout_ms: u64,
    /// Linear memory, summed over the guest's memories.
    pub memory_bytes: u64,
    /// Bytes of stdout kept.
    pub max_stdout_bytes: u64,
    /// Fuel units (instructions, roughly); zero means no fuel metering.
    pub fuel: u64,
}

impl Default for ExecCeiling {
    /// The sandbox's request defaults: what a field missing from a stored
    /// or configured ceiling has always decoded as.
    fn default() -> Self {
        Self {
            timeout_ms: 30_000,
            memory_bytes: 512 << 20,
            max_stdout_bytes: 1 << 20,
            fuel: 0,
        }
    }
}

impl ExecCeiling {
    /// The default tenant ceiling of the contract: 5 min, 4 GiB, 64 MiB.
    pub const CEILING: ExecCeiling = ExecCeiling {
        timeout_ms: 300_000,
        memory_bytes: 4 << 30,
        max_stdout_bytes: 64 << 20,
        fuel: 1_000_000_000_000_000,
    };

    /// Every field zero: no ceiling of its own at this level.
    pub const ZERO: ExecCeiling = ExecCeiling {
        timeout_ms: 0,
        memory_bytes: 0,
        max_stdout_bytes: 0,
        fuel: 0,
    };

    /// The field-wise minimum (the stricter of two ceilings). A zero field
    /// means "no ceiling of its own".
    pub fn stricter(self, other: ExecCeiling) -> ExecCeiling {
        fn min(a: u64, b: u64) -> u64 {
            match (a, b) {
                (0, b) => b,
                (a, 0) => a,
                (a, b) => a.min(b),
            }
        }
        ExecCeiling {
            timeout_ms: min(self.timeout_ms, other.timeout_ms),
            memory_bytes: min(self.memory_bytes, other.memory_bytes),
            max_stdout_bytes: min(self.max_stdout_bytes, other.max_stdout_bytes),
            fuel: min(self.fuel, other.fuel),
        }
    }
}

impl From<ExecCeiling> for crate::sandbox::limits::ExecLimits {
    fn from(c: ExecCeiling) -> Self {
        Self {
            timeout_ms: c.timeout_ms,
            memory_bytes: c.memory_bytes,
            max_stdout_bytes: c.max_stdout_bytes,
            fuel: c.fuel,
        }
    }
}
