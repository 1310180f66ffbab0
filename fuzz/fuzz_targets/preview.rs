//! cargo-fuzz target `preview`: the checks are [`spillway_fuzz::preview`], which
//! the corpus replay (`tests/fuzz_corpus.rs` in the main package) runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: spillway_fuzz::preview::Input<'_>| spillway_fuzz::preview::check(input));
