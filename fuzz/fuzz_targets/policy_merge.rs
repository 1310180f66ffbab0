//! cargo-fuzz target `policy_merge`: the checks are [`spillway_fuzz::policy_merge`], which
//! the corpus replay (`tests/fuzz_corpus.rs` in the main package) runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: spillway_fuzz::policy_merge::Input| spillway_fuzz::policy_merge::check(input));
