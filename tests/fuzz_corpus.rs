//! Every committed fuzz corpus input (`fuzz/corpus/<target>/`) through its
//! target's checks, on stable: the properties `make fuzz` explores on
//! nightly hold on every input it has kept, in every `make test`.
//!
//! The checks are the fuzz crate's own source (`fuzz/src/`), included
//! here, so the two harnesses cannot drift apart.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code, missing_docs)]
mod checks;

use std::path::Path;

/// Replays each file of `fuzz/corpus/<target>`; returns how many decoded
/// and ran.
fn replay_corpus(target: &str, run: impl Fn(&[u8]) -> bool) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the {target} corpus is empty");
    let mut ran = 0;
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        // A panic names the input, so `cargo fuzz run {target} FILE`
        // reproduces it.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&bytes))) {
            Ok(true) => ran += 1,
            Ok(false) => {}
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or(e.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic without a message");
                panic!("fuzz target {target} fails on {}: {why}", f.display())
            }
        }
    }
    ran
}

macro_rules! corpus_test {
    ($name:ident, $target:ident) => {
        #[test]
        fn $name() {
            let ran = replay_corpus(stringify!($target), |bytes| {
                checks::replay(bytes, checks::$target::check)
            });
            // A corpus none of whose inputs decode would guard nothing.
            assert!(
                ran > 0,
                "no input of the {} corpus decoded",
                stringify!($target)
            );
        }
    };
}

corpus_test!(every_preview_corpus_input_keeps_the_cut_contracts, preview);
corpus_test!(
    every_inspect_corpus_input_is_inferred_without_a_panic,
    inspect
);
corpus_test!(
    every_line_index_corpus_input_agrees_with_a_plain_scan,
    line_index
);
corpus_test!(
    every_policy_merge_corpus_input_is_never_looser_than_a_level,
    policy_merge
);
corpus_test!(
    every_history_corpus_input_round_trips_and_repairs_idempotently,
    history
);
