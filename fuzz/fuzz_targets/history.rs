//! cargo-fuzz target `history`: the checks are [`spillway_fuzz::history`], which
//! the corpus replay (`tests/fuzz_corpus.rs` in the main package) runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: spillway_fuzz::history::Input<'_>| spillway_fuzz::history::check(input));
