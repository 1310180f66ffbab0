//! What a newcomer reads matches what the code does.
//!
//! - The README's command blocks run, in order, in one bash against the real
//!   binary in dev mode, exactly as written: every ```sh block carries a
//!   marker, `<!-- readme-test: run -->` or `<!-- readme-test: skip: why -->`.
//!   Under a command, lines starting `#   ` are what it prints (stdout and
//!   stderr, as a terminal shows them): each must match a line of the
//!   output, in order, with `…` standing for any text, so every figure the
//!   README quotes is checked.
//! - Every field of the protos says what it does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::common::*;

const RUN: &str = "<!-- readme-test: run -->";
const SKIP: &str = "<!-- readme-test: skip";

/// One command of a README block and what the README says it prints.
#[derive(Debug)]
struct Step {
    /// 1-based README line of the command.
    line: usize,
    command: String,
    expected: Vec<String>,
}

/// The steps of every block marked to run, in README order. A shell block
/// without a marker is an error: each must say whether it runs.
fn runnable_steps(readme: &str) -> anyhow::Result<Vec<Step>> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        let Some(lang) = fence.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let shell = matches!(lang.trim(), "sh" | "bash" | "shell" | "console");
        let end = (i + 1..lines.len())
            .find(|&k| lines[k].trim_start().starts_with("```"))
            .with_context(|| format!("README line {}: unclosed code block", i + 1))?;
        if shell {
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim());
            match marker {
                Some(RUN) => steps.extend(block_steps(&lines, i + 1, end)?),
                Some(m) if m.starts_with(SKIP) => {}
                _ => bail!(
                    "README line {}: a shell block needs {RUN} or {SKIP}: why -->) just above it",
                    i + 1
                ),
            }
        }
        i = end + 1;
    }
    Ok(steps)
}

/// Commands (with `\` continuations) and the `#   ` output lines under them.
fn block_steps(lines: &[&str], start: usize, end: usize) -> anyhow::Result<Vec<Step>> {
    let mut steps: Vec<Step> = Vec::new();
    let mut k = start;
    while k < end {
        let line = lines[k];
        if let Some(out) = line.strip_prefix("#   ") {
            let step = steps
                .last_mut()
                .with_context(|| format!("README line {}: output before any command", k + 1))?;
            step.expected.push(out.to_owned());
        } else if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            let mut command = line.to_owned();
            let first = k;
            while command.ends_with('\\') && k + 1 < end {
                k += 1;
                command.push('\n');
                command.push_str(lines[k]);
            }
            steps.push(Step {
                line: first + 1,
                command,
                expected: Vec::new(),
            });
        }
        k += 1;
    }
    Ok(steps)
}

/// `expected` against one output line: `…` stands for any text, and runs
/// of spaces compare as one.
fn line_matches(expected: &str, actual: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (expected, actual) = (squeeze(expected), squeeze(actual));
    let parts: Vec<&str> = expected.split('…').map(str::trim).collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return expected == actual;
    }
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.trim_end().ends_with(last)
}

/// Each expected line matches a line of `output`, in order. A lone `…`
/// (lines left out) matches nothing by itself.
fn check_output(expected: &[String], output: &str) -> Result<(), String> {
    let actual: Vec<&str> = output.lines().collect();
    let mut at = 0;
    for e in expected.iter().filter(|e| e.trim() != "…") {
        match (at..actual.len()).find(|&k| line_matches(e, actual[k])) {
            Some(k) => at = k + 1,
            None => return Err(format!("the README shows {e:?}, which is not printed")),
        }
    }
    Ok(())
}

#[test]
fn readme_output_lines_must_match_what_is_printed_figure_for_figure() {
    let shown = ["-- lines 50000-50002 of 100000, bytes 1538863-1538956 of 3088895".to_owned()];
    assert!(
        check_output(
            &shown,
            "x\n-- lines 50000-50002 of 100000, bytes 1538863-1538956 of 3088895\n"
        )
        .is_ok()
    );
    assert!(
        check_output(
            &shown,
            "-- lines 50000-50002 of 100000, bytes 1538863-1538957 of 3088895\n"
        )
        .is_err()
    );
    let elided = [
        "pl_9a1b…  prs.ndjson".to_owned(),
        "…".to_owned(),
        "3088895 bytes  100000 lines  ~772224 tokens  application/x-ndjson".to_owned(),
    ];
    let printed = "pl_0d3c6e  prs.ndjson\n  3088895 bytes  100000 lines  ~772224 tokens  application/x-ndjson\n";
    assert!(
        check_output(&elided, printed).is_err(),
        "the ID's prefix is a figure too"
    );
    let elided = [
        "pl_… prs.ndjson".to_owned(),
        "3088895 bytes 100000 lines ~772224 tokens …".to_owned(),
    ];
    assert!(check_output(&elided, printed).is_ok());
    assert!(check_output(&elided[1..], "3088895 bytes 99999 lines ~772224 tokens x\n").is_err());
}

#[test]
fn every_shell_block_of_the_readme_says_whether_it_runs() {
    assert!(runnable_steps("```sh\nls\n```\n").is_err());
    assert!(
        runnable_steps(&format!("{SKIP}: no -->\n```sh\nls\n```\n"))
            .unwrap()
            .is_empty()
    );
    let steps = runnable_steps(&format!(
        "{RUN}\n\n```sh\n# narration\nls \\\n  -l\n#   total 0\n```\n```toml\nx = 1\n```\n"
    ))
    .unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (steps[0].line, steps[0].command.as_str()),
        (5, "ls \\\n  -l")
    );
    assert_eq!(steps[0].expected, ["total 0"]);
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    if let Err(e) = runnable_steps(&readme) {
        panic!("{e:#}");
    }
}

/// A directory that looks like the repository's root to the README's
/// commands (its files are links to the real ones), with
/// `target/release/spillway` the binary under test and nothing written into
/// the real repository.
fn checkout(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = dir.join("checkout");
    std::fs::create_dir_all(root.join("target/release"))?;
    for entry in std::fs::read_dir(env!("CARGO_MANIFEST_DIR"))? {
        let entry = entry?;
        let name = entry.file_name();
        if ["target", "spillway-data", ".git"].contains(&name.to_str().unwrap_or("")) {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), root.join(&name))?;
    }
    std::os::unix::fs::symlink(binary(), root.join("target/release/spillway"))?;
    Ok(root)
}

/// Every block marked to run, as one bash script: each step's output (both
/// streams) goes to `<n>.out` and its exit code to `<n>.rc`; the script
/// stops after the first step that fails.
fn script(steps: &[Step], results: &Path) -> String {
    let mut s = String::from("set -o pipefail\n");
    for (n, step) in steps.iter().enumerate() {
        let out = results.join(format!("{n}.out"));
        let rc = results.join(format!("{n}.rc"));
        s.push_str(&format!(
            "{{ {}\n}} > '{}' 2>&1\necho $? > '{}'\n[ \"$(cat '{}')\" = 0 ] || exit 0\n",
            step.command,
            out.display(),
            rc.display(),
            rc.display()
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readme_command_runs_in_dev_mode_and_prints_what_the_readme_shows()
-> anyhow::Result<()> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))?;
    let steps = runnable_steps(&readme)?;
    ensure!(
        steps.len() >= 20,
        "the tour and its sections: {} steps",
        steps.len()
    );

    let dir = tempfile::tempdir()?;
    let root = checkout(dir.path())?;
    // `make run`, on a free port instead of 50051, and without the console
    // (its dev-mode port may be taken by another test).
    let server = ProcessServer::start_with_env(
        None,
        &root.join("spillway-data"),
        dir.path().join("server.log"),
        &[("SPILLWAY_CONSOLE__ENABLED", "false")],
    )
    .await;
    let results = dir.path().join("results");
    let scratch = dir.path().join("tmp");
    std::fs::create_dir_all(&results)?;
    std::fs::create_dir_all(&scratch)?;

    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(script(&steps, &results))
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // What a user of `make run` has by default: the server at its
        // address, the dev token found in ./spillway-data; `mktemp` in
        // the test's directory.
        .env("SPILLWAY_ADDR", server.addr.to_string())
        .env("TMPDIR", &scratch);
    for (var, _) in std::env::vars() {
        if var.starts_with("SPILLWAY_") {
            bash.env_remove(var);
        }
    }
    let mut child = bash.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            bail!("the README's commands did not finish within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    for (n, step) in steps.iter().enumerate() {
        let rc = std::fs::read_to_string(results.join(format!("{n}.rc")))
            .with_context(|| format!("README line {}: `{}` never ran", step.line, step.command))?;
        let output = std::fs::read_to_string(results.join(format!("{n}.out")))?;
        ensure!(
            rc.trim() == "0",
            "README line {}: `{}` exited with {}:\n{output}",
            step.line,
            step.command,
            rc.trim()
        );
        if let Err(e) = check_output(&step.expected, &output) {
            bail!(
                "README line {}: `{}`: {e}; it printed:\n{output}",
                step.line,
                step.command
            );
        }
    }
    Ok(())
}

/// Every field of every proto carries a comment on the line above it.
#[test]
fn every_proto_field_says_what_it_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/spillway/v1");
    let mut missing = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // What encloses each line: message, enum, oneof or service.
        let mut stack: Vec<&str> = Vec::new();
        let mut previous = "";
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            let opens = ["message ", "enum ", "oneof ", "service "]
                .into_iter()
                .find(|k| t.starts_with(k) && t.ends_with('{'));
            let in_fields = matches!(stack.last(), Some(&"message ") | Some(&"oneof "));
            let is_field = in_fields
                && opens.is_none()
                && t.ends_with(';')
                && t.contains(" = ")
                && !t.starts_with("//")
                && !t.starts_with("reserved");
            if is_field && !previous.starts_with("//") {
                missing.push(format!(
                    "{}:{}: {t}",
                    path.file_name().unwrap().to_string_lossy(),
                    n + 1
                ));
            }
            if let Some(k) = opens {
                stack.push(k);
            } else if t.starts_with('}') {
                stack.pop();
            }
            previous = t;
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a comment:\n{}",
        missing.join("\n")
    );
}
