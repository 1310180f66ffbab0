//! cargo-fuzz target `line_index`: the checks are [`spillway_fuzz::line_index`], which
//! the corpus replay (`tests/fuzz_corpus.rs` in the main package) runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: spillway_fuzz::line_index::Input<'_>| spillway_fuzz::line_index::check(input));
