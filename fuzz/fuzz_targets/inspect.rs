//! cargo-fuzz target `inspect`: the checks are [`spillway_fuzz::inspect`], which
//! the corpus replay (`tests/fuzz_corpus.rs` in the main package) runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: spillway_fuzz::inspect::Input<'_>| spillway_fuzz::inspect::check(input));
