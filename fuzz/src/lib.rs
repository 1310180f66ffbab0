//! The fuzz targets' checks, one module per target, so that two harnesses
//! run the same code: cargo-fuzz (`fuzz_targets/`, nightly, `make fuzz`)
//! explores new inputs, and the main package's `tests/fuzz_corpus.rs`
//! (stable, part of `make test`) replays every committed corpus input.
//!
//! Each module has the target's `Input` type and its `check`, which panics
//! on a finding.

use arbitrary::{Arbitrary, Unstructured};

pub mod history;
pub mod inspect;
pub mod line_index;
pub mod policy_merge;
pub mod preview;

/// Runs `check` on `bytes` decoded the way libfuzzer-sys 0.4's
/// `fuzz_target!` decodes them (`arbitrary_take_rest`); returns whether it
/// ran. Input too short for the type, or that does not decode, is skipped,
/// as libFuzzer skips it.
pub fn replay<'a, T: Arbitrary<'a>>(bytes: &'a [u8], check: impl FnOnce(T)) -> bool {
    if bytes.len() < T::size_hint(0).0 {
        return false;
    }
    match T::arbitrary_take_rest(Unstructured::new(bytes)) {
        Ok(input) => {
            check(input);
            true
        }
        Err(_) => false,
    }
}
