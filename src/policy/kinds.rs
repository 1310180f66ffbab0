//! How each kind of policy field behaves: its value in a complete policy,
//! its value in one level, how a level tightens a policy, how two levels
//! combine, how a level is validated, and how a level is checked against
//! what it may only tighten. The field list in [`super::fields`] names a
//! kind per field; everything per field is generated from that.

use std::fmt::Debug;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ceiling::ExecCeiling;
use super::{MAX_DURATION_MS, PolicyError, fmt_duration, fmt_ms};
use crate::redact::{self, Redactor};

/// Which comparison a check makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Session overrides against the tenant's effective policy: absent
    /// values defer, so they never loosen.
    Overrides,
    /// A new tenant policy against the locked one it replaces: an absent
    /// value hands the decision back to the server default, which loosens.
    Locked,
}

/// What a check compares against, and how it words a refusal.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    /// Overrides or locked.
    pub mode: Mode,
    /// "tenant's effective policy" or "locked tenant policy".
    pub what: &'static str,
    /// What may be done instead.
    pub rule: &'static str,
}

impl Check {
    fn absent_loosens(&self) -> bool {
        self.mode == Mode::Locked
    }

    /// A refusal of `field`.
    pub fn loosens(&self, field: &'static str, asked: String, current: String) -> PolicyError {
        PolicyError::Loosens {
            field,
            asked,
            current,
            what: self.what,
            rule: self.rule,
        }
    }

    /// A quota where zero is "none": larger, or none, is looser.
    fn quota(
        &self,
        field: &'static str,
        current: u64,
        asked: Option<u64>,
    ) -> Result<(), PolicyError> {
        if current == 0 {
            return Ok(());
        }
        match asked.unwrap_or(0) {
            0 if self.absent_loosens() => {
                Err(self.loosens(field, "no quota".into(), current.to_string()))
            }
            0 => Ok(()),
            n if n > current => Err(self.loosens(field, n.to_string(), current.to_string())),
            _ => Ok(()),
        }
    }
}

/// One kind of policy field.
pub trait Kind {
    /// Its value in a complete policy.
    type Value: Clone + Debug + PartialEq;
    /// Its value in one level (absent, or empty, defers to the others).
    type Level: Clone + Debug + PartialEq + Default + Serialize + DeserializeOwned;
    /// What a check compares a level against.
    type Current;

    /// `value` made as strict as `level` too.
    fn tighten(value: Self::Value, level: &Self::Level) -> Self::Value;
    /// One level as strict as both.
    fn combine(a: &Self::Level, b: &Self::Level) -> Self::Level;
    /// Checks a level's value on its own.
    fn validate(_field: &'static str, _level: &Self::Level) -> Result<(), PolicyError> {
        Ok(())
    }
    /// What a complete policy's value is compared as.
    fn current_of_value(value: &Self::Value) -> Self::Current;
    /// What a level's value is compared as.
    fn current_of_level(level: &Self::Level) -> Self::Current;
    /// Refuses `asked` when it would loosen `current`.
    fn check(
        check: &Check,
        field: &'static str,
        current: Self::Current,
        asked: &Self::Level,
    ) -> Result<(), PolicyError>;
}

/// How two levels of an optional field combine: where both set it, the
/// `stricter` of the two; where one does, that one (absent defers).
fn stricter_of_either<T: Copy>(
    a: &Option<T>,
    b: &Option<T>,
    stricter: impl FnOnce(T, T) -> T,
) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(stricter(*a, *b)),
        (a, b) => a.or(*b),
    }
}

/// A maximum age: the shorter wins. Stored in milliseconds.
#[derive(Debug)]
pub enum Age {}

impl Kind for Age {
    type Value = Duration;
    type Level = Option<u64>;
    type Current = Option<Duration>;

    fn tighten(value: Duration, level: &Option<u64>) -> Duration {
        level.map_or(value, |ms| value.min(Duration::from_millis(ms)))
    }

    fn combine(a: &Option<u64>, b: &Option<u64>) -> Option<u64> {
        stricter_of_either(a, b, u64::min)
    }

    fn validate(field: &'static str, level: &Option<u64>) -> Result<(), PolicyError> {
        match *level {
            Some(0) => Err(PolicyError::Invalid {
                field,
                message: "must be longer than zero; leave it unset to defer to the other levels"
                    .into(),
            }),
            Some(ms) if ms > MAX_DURATION_MS => Err(PolicyError::Invalid {
                field,
                message: format!(
                    "{} is longer than the most a policy may name ({})",
                    fmt_ms(ms),
                    fmt_ms(MAX_DURATION_MS)
                ),
            }),
            _ => Ok(()),
        }
    }

    fn current_of_value(value: &Duration) -> Option<Duration> {
        Some(*value)
    }

    fn current_of_level(level: &Option<u64>) -> Option<Duration> {
        level.map(Duration::from_millis)
    }

    fn check(
        check: &Check,
        field: &'static str,
        current: Option<Duration>,
        asked: &Option<u64>,
    ) -> Result<(), PolicyError> {
        let Some(current) = current else {
            return Ok(());
        };
        match *asked {
            Some(ms) if Duration::from_millis(ms) > current => {
                Err(check.loosens(field, fmt_ms(ms), fmt_duration(current)))
            }
            None if check.absent_loosens() => {
                Err(check.loosens(field, "unset".into(), fmt_duration(current)))
            }
            _ => Ok(()),
        }
    }
}

/// A quota: the smaller nonzero one wins; zero (or absent) is "none".
#[derive(Debug)]
pub enum Quota {}

/// The smaller of two quotas, where zero (or absent) means "none".
pub fn min_quota(a: u64, b: Option<u64>) -> u64 {
    match (a, b.unwrap_or(0)) {
        (a, 0) => a,
        (0, b) => b,
        (a, b) => a.min(b),
    }
}

impl Kind for Quota {
    type Value = u64;
    type Level = Option<u64>;
    type Current = u64;

    fn tighten(value: u64, level: &Option<u64>) -> u64 {
        min_quota(value, *level)
    }

    fn combine(a: &Option<u64>, b: &Option<u64>) -> Option<u64> {
        let q = min_quota(a.unwrap_or(0), *b);
        (q != 0).then_some(q)
    }

    fn current_of_value(value: &u64) -> u64 {
        *value
    }

    fn current_of_level(level: &Option<u64>) -> u64 {
        level.unwrap_or(0)
    }

    fn check(
        check: &Check,
        field: &'static str,
        current: u64,
        asked: &Option<u64>,
    ) -> Result<(), PolicyError> {
        check.quota(field, current, *asked)
    }
}

/// A flag whose strict value is `STRICT`: any level that says `STRICT`
/// wins (`delete_on_close` is ORed, `allow_*` are ANDed).
#[derive(Debug)]
pub enum Flag<const STRICT: bool> {}

impl<const STRICT: bool> Flag<STRICT> {
    fn strictest(a: bool, b: bool) -> bool {
        if a == STRICT || b == STRICT {
            STRICT
        } else {
            !STRICT
        }
    }
}

impl<const STRICT: bool> Kind for Flag<STRICT> {
    type Value = bool;
    type Level = Option<bool>;
    type Current = Option<bool>;

    fn tighten(value: bool, level: &Option<bool>) -> bool {
        Self::strictest(value, level.unwrap_or(!STRICT))
    }

    fn combine(a: &Option<bool>, b: &Option<bool>) -> Option<bool> {
        stricter_of_either(a, b, Self::strictest)
    }

    fn current_of_value(value: &bool) -> Option<bool> {
        Some(*value)
    }

    fn current_of_level(level: &Option<bool>) -> Option<bool> {
        *level
    }

    fn check(
        check: &Check,
        field: &'static str,
        current: Option<bool>,
        asked: &Option<bool>,
    ) -> Result<(), PolicyError> {
        if current != Some(STRICT) {
            return Ok(());
        }
        match *asked {
            Some(v) if v != STRICT => Err(check.loosens(field, v.to_string(), STRICT.to_string())),
            None if check.absent_loosens() => {
                Err(check.loosens(field, "unset".into(), STRICT.to_string()))
            }
            _ => Ok(()),
        }
    }
}

/// The exec ceiling: the lower wins, field by field; a zero field is "no
/// ceiling".
#[derive(Debug)]
pub enum Ceiling {}

impl Kind for Ceiling {
    type Value = ExecCeiling;
    type Level = Option<ExecCeiling>;
    type Current = Option<ExecCeiling>;

    fn tighten(value: ExecCeiling, level: &Option<ExecCeiling>) -> ExecCeiling {
        level.map_or(value, |c| value.stricter(c))
    }

    fn combine(a: &Option<ExecCeiling>, b: &Option<ExecCeiling>) -> Option<ExecCeiling> {
        stricter_of_either(a, b, ExecCeiling::stricter)
    }

    fn current_of_value(value: &ExecCeiling) -> Option<ExecCeiling> {
        Some(*value)
    }

    fn current_of_level(level: &Option<ExecCeiling>) -> Option<ExecCeiling> {
        *level
    }

    fn check(
        check: &Check,
        _field: &'static str,
        current: Option<ExecCeiling>,
        asked: &Option<ExecCeiling>,
    ) -> Result<(), PolicyError> {
        let Some(c) = current else {
            return Ok(());
        };
        let a = asked.map(|a| {
            [
                Some(a.timeout_ms),
                Some(a.memory_bytes),
                Some(a.max_stdout_bytes),
                Some(a.fuel),
            ]
        });
        let a = a.unwrap_or([None; 4]);
        check.quota("policy.exec_ceiling.timeout_ms", c.timeout_ms, a[0])?;
        check.quota("policy.exec_ceiling.memory_bytes", c.memory_bytes, a[1])?;
        check.quota(
            "policy.exec_ceiling.max_stdout_bytes",
            c.max_stdout_bytes,
            a[2],
        )?;
        check.quota("policy.exec_ceiling.fuel", c.fuel, a[3])
    }
}

/// Redaction rules: every level's rules apply (the union).
#[derive(Debug)]
pub enum Rules {}

impl Kind for Rules {
    type Value = Vec<String>;
    type Level = Vec<String>;
    type Current = Vec<String>;

    fn tighten(value: Vec<String>, level: &Vec<String>) -> Vec<String> {
        redact::union(&value, level)
    }

    fn combine(a: &Vec<String>, b: &Vec<String>) -> Vec<String> {
        redact::union(a, b)
    }

    fn validate(field: &'static str, level: &Vec<String>) -> Result<(), PolicyError> {
        match Redactor::compile(level) {
            Ok(_) => Ok(()),
            Err(e) => Err(PolicyError::Invalid {
                field,
                message: e.to_string(),
            }),
        }
    }

    fn current_of_value(value: &Vec<String>) -> Vec<String> {
        value.clone()
    }

    fn current_of_level(level: &Vec<String>) -> Vec<String> {
        level.clone()
    }

    /// Adding rules only tightens; a locked policy may not drop one.
    fn check(
        check: &Check,
        field: &'static str,
        current: Vec<String>,
        asked: &Vec<String>,
    ) -> Result<(), PolicyError> {
        if check.mode != Mode::Locked {
            return Ok(());
        }
        match current.iter().find(|r| !asked.contains(r)) {
            Some(dropped) => Err(check.loosens(
                field,
                format!("dropping rule {dropped:?}"),
                format!("{} rules", current.len()),
            )),
            None => Ok(()),
        }
    }
}
