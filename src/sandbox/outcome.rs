//! A run's ending in the contract's terms: a status and one message the
//! model can act on.

use super::limits::ExecLimits;
use super::run::{Ending, RunOutcome, ScratchLimit};
use super::workdir::Incomplete;

/// The first stderr line a componentized guest writes when the script does
/// not compile (it cannot exit with a code above 1).
pub const INVALID_SCRIPT_MARKER: &str = "spillway: invalid script";

/// The contract's `ExecStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Exit code 0.
    Ok,
    /// A nonzero exit.
    ExitNonzero,
    /// Wall time or fuel ran out.
    Timeout,
    /// The memory limit was hit.
    MemoryLimit,
    /// stdout, stderr, `/tmp` or `/out` went past a cap.
    OutputLimit,
    /// A trap.
    Trap,
    /// The script or module does not compile.
    InvalidScript,
}

impl Status {
    /// The status as audit details spell it: `ok`, `exit_nonzero`, …
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::ExitNonzero => "exit_nonzero",
            Status::Timeout => "timeout",
            Status::MemoryLimit => "memory_limit",
            Status::OutputLimit => "output_limit",
            Status::Trap => "trap",
            Status::InvalidScript => "invalid_script",
        }
    }
}

/// The status, the exit code and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Status.
    pub status: Status,
    /// Exit code (-1 when the guest did not exit).
    pub exit_code: i32,
    /// What happened, for the model.
    pub message: String,
}

/// Judges a run of `runtime`. `images` is true for the built-in runtimes,
/// whose exit codes 2 and 3 mean bad arguments and a script that does not
/// compile.
pub fn judge(
    runtime: &str,
    images: bool,
    out: &RunOutcome,
    limits: &ExecLimits,
    ceiling: &ExecLimits,
    scratch: ScratchLimit,
) -> Verdict {
    // Whatever the ending, refused socket calls are said after it.
    let verdict = |status, exit_code, mut message: String| {
        if out.denied_socket_calls > 0 {
            message.push_str(&format!(
                "; the script made {} socket call(s), each refused: code mode has no network",
                group(out.denied_socket_calls)
            ));
        }
        Verdict {
            status,
            exit_code,
            message,
        }
    };
    let secs = |ms: u64| format_secs(ms);
    match &out.ending {
        Ending::Exited(0) => verdict(
            Status::Ok,
            0,
            format!("{runtime} script finished in {} ms", out.wall.as_millis()),
        ),
        Ending::Exited(code)
            if images
                && ((*code == 3 || *code == 2)
                    || String::from_utf8_lossy(&out.stderr).starts_with(INVALID_SCRIPT_MARKER)) =>
        {
            let what = if *code == 2 {
                "its arguments are invalid"
            } else {
                "the script does not compile"
            };
            verdict(
                Status::InvalidScript,
                *code,
                format!(
                    "{runtime} did not run: {what}; stderr has the parser's message and position. Fix the script and run it again"
                ),
            )
        }
        Ending::Exited(code) => verdict(
            Status::ExitNonzero,
            *code,
            format!(
                "{runtime} script exited with code {code}; stderr says why (for an uncaught error, the message and where it was thrown)"
            ),
        ),
        Ending::TimedOut => verdict(
            Status::Timeout,
            -1,
            format!(
                "timed out after {}; narrow the input with Search or a smaller range first, or raise limits.timeout_ms (up to {})",
                secs(limits.timeout_ms),
                group(ceiling.timeout_ms)
            ),
        ),
        Ending::OutOfFuel => verdict(
            Status::Timeout,
            -1,
            format!(
                "ran out of fuel after {} units; simplify the script or raise limits.fuel",
                group(limits.fuel)
            ),
        ),
        Ending::MemoryLimit => verdict(
            Status::MemoryLimit,
            -1,
            format!(
                "hit the memory limit of {}; stream the input (readLines / read_lines, jq without -s) instead of loading it whole, or raise limits.memory_bytes (up to {})",
                bytes(limits.memory_bytes),
                bytes(ceiling.memory_bytes)
            ),
        ),
        Ending::OutputLimit("stdout") if limits.max_stdout_bytes < ceiling.max_stdout_bytes => {
            verdict(
                Status::OutputLimit,
                -1,
                format!(
                    "stdout passed the limit of {} this request set (limits.max_stdout_bytes) and the script was stopped, so its output is incomplete and was not kept as a payload. Print a summary or fewer fields instead, or raise limits.max_stdout_bytes (up to {}, or leave it 0 for the ceiling): output within the limit that is too large to show is offloaded as a payload",
                    bytes(limits.max_stdout_bytes),
                    bytes(ceiling.max_stdout_bytes)
                ),
            )
        }
        Ending::OutputLimit("stdout") => verdict(
            Status::OutputLimit,
            -1,
            format!(
                "stdout passed {}, the most one Exec may print (the policy's exec_ceiling.max_stdout_bytes), and the script was stopped as a runaway, so its output is incomplete and was not kept as a payload. Print a summary, counts or fewer fields instead, or write bulk results to /out with keep_outputs",
                bytes(limits.max_stdout_bytes),
            ),
        ),
        Ending::OutputLimit(stream) => verdict(
            Status::OutputLimit,
            -1,
            format!(
                "{stream} passed its limit of {} and the script was stopped; print less to {stream}",
                bytes(out.stderr.len() as u64)
            ),
        ),
        Ending::ScratchLimit(usage) if usage.incomplete == Some(Incomplete::TooDeep) => verdict(
            Status::OutputLimit,
            -1,
            format!(
                "/tmp and /out hold a directory tree so deep and branched that measuring it costs more than its {} entries allow, and the script was stopped; keep scratch directories shallow",
                scratch.entries
            ),
        ),
        Ending::ScratchLimit(usage) if matches!(usage.incomplete, Some(Incomplete::Unreadable(_))) => verdict(
            Status::OutputLimit,
            -1,
            "/tmp and /out could not be measured (the script left something there that cannot be read), and the script was stopped; keep only plain files and directories there".to_owned(),
        ),
        Ending::ScratchLimit(usage) => verdict(
            Status::OutputLimit,
            -1,
            format!(
                "/tmp and /out together passed their limit ({} in {} entries; the limit is {} in {} entries) and the script was stopped; write less, or delete scratch files as you go",
                bytes(usage.bytes),
                usage.entries,
                bytes(scratch.bytes),
                scratch.entries
            ),
        ),
        Ending::CompileTimedOut { waited, compiling } => verdict(
            Status::Timeout,
            -1,
            format!(
                "timed out after {} before the module finished compiling ({} ms waiting for a compile slot, {} ms compiling), so nothing ran. A compile that started goes on, and an exec of the same module after it ends uses it; or send a smaller module (fewer, smaller functions), or raise limits.timeout_ms (up to {})",
                secs(limits.timeout_ms),
                waited.as_millis(),
                compiling.as_millis(),
                group(ceiling.timeout_ms)
            ),
        ),
        Ending::Trapped(why) => {
            verdict(Status::Trap, -1, format!("{runtime} guest trapped: {why}"))
        }
    }
}

/// A guest's stderr as the model should read it: the Rust panic hint
/// ("run with `RUST_BACKTRACE=1`", which a model cannot do) is dropped, and
/// jq's usage text after a bad flag is cut to the error line and a pointer
/// to `--help`, so a typo does not cost hundreds of tokens.
pub fn tidy_stderr(runtime: &str, stderr: &str) -> String {
    let mut out: String = stderr
        .split_inclusive('\n')
        .filter(|l| !l.contains("RUST_BACKTRACE"))
        .collect();
    if runtime == "jq"
        && let Some(at) = out.find("\nusage: jq [OPTIONS]")
    {
        out.truncate(at);
        out.push_str(
            "\n(jq's usage text left out: run jq with args [\"--help\"] for the list of flags)\n",
        );
    }
    out
}

fn format_secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// `300000` → `300 000 ms`.
fn group(ms: u64) -> String {
    let s = ms.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// Bytes in the largest whole binary unit.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn outcome(ending: Ending) -> RunOutcome {
        RunOutcome {
            ending,
            stdout: bytes::Bytes::new(),
            stderr: bytes::Bytes::new(),
            wall: Duration::from_millis(12),
            instantiate: Duration::from_millis(1),
            peak_memory_bytes: 0,
            fuel_consumed: 0,
            denied_socket_calls: 0,
            cpu_wait: Duration::ZERO,
            scratch: Default::default(),
        }
    }

    const SCRATCH: ScratchLimit = ScratchLimit {
        bytes: 1 << 20,
        entries: 10,
    };

    /// A run judged at the default limits.
    fn judged(runtime: &str, images: bool, out: &RunOutcome) -> Verdict {
        judge(
            runtime,
            images,
            out,
            &ExecLimits::DEFAULTS,
            &ExecLimits::CEILING,
            SCRATCH,
        )
    }

    #[test]
    fn a_timeout_names_the_limit_the_ceiling_and_what_to_do() {
        let limits = ExecLimits {
            timeout_ms: 10_000,
            ..ExecLimits::DEFAULTS
        };
        let v = judge(
            "jq",
            true,
            &outcome(Ending::TimedOut),
            &limits,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(v.status, Status::Timeout);
        assert_eq!(
            v.message,
            "timed out after 10 s; narrow the input with Search or a smaller range first, or raise limits.timeout_ms (up to 300 000)"
        );
    }

    /// The exact words the model reads when stdout is stopped: below the
    /// ceiling the request's own limit is to blame and can be raised; at
    /// the ceiling the output is a runaway.
    #[test]
    fn a_stdout_stop_says_which_limit_and_what_to_do_next() {
        let asked = ExecLimits {
            max_stdout_bytes: 2 << 20,
            ..ExecLimits::DEFAULTS
        };
        let v = judge(
            "jq",
            true,
            &outcome(Ending::OutputLimit("stdout")),
            &asked,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(v.status, Status::OutputLimit);
        assert_eq!(
            v.message,
            "stdout passed the limit of 2 MiB this request set (limits.max_stdout_bytes) and the script was stopped, so its output is incomplete and was not kept as a payload. Print a summary or fewer fields instead, or raise limits.max_stdout_bytes (up to 64 MiB, or leave it 0 for the ceiling): output within the limit that is too large to show is offloaded as a payload"
        );
        let v = judge(
            "jq",
            true,
            &outcome(Ending::OutputLimit("stdout")),
            &ExecLimits::CEILING,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(
            v.message,
            "stdout passed 64 MiB, the most one Exec may print (the policy's exec_ceiling.max_stdout_bytes), and the script was stopped as a runaway, so its output is incomplete and was not kept as a payload. Print a summary, counts or fewer fields instead, or write bulk results to /out with keep_outputs"
        );
    }

    #[test]
    fn stderr_loses_the_backtrace_hint_and_jqs_usage_text() {
        let panic = "memory allocation of 1073741824 bytes failed\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            tidy_stderr("jq", panic),
            "memory allocation of 1073741824 bytes failed\n"
        );
        let usage = "jq: error: unknown option: --slurpy\nusage: jq [OPTIONS] [--args STRING...]\n\nThe filter is the script; ...\n  -n, --null-input  ...\n";
        assert_eq!(
            tidy_stderr("jq", usage),
            "jq: error: unknown option: --slurpy\n(jq's usage text left out: run jq with args [\"--help\"] for the list of flags)\n"
        );
        assert_eq!(tidy_stderr("python", "Traceback ...\n"), "Traceback ...\n");
    }

    #[test]
    fn exit_code_three_of_an_image_is_an_invalid_script() {
        let v = judged("javascript", true, &outcome(Ending::Exited(3)));
        assert_eq!(v.status, Status::InvalidScript);
        assert_eq!(v.exit_code, 3);
    }

    #[test]
    fn exit_code_three_of_a_user_module_is_just_nonzero() {
        let v = judged("wasm", false, &outcome(Ending::Exited(3)));
        assert_eq!(v.status, Status::ExitNonzero);
    }

    #[test]
    fn the_marker_line_marks_an_invalid_python_script() {
        let mut o = outcome(Ending::Exited(1));
        o.stderr = bytes::Bytes::from_static(
            b"spillway: invalid script\n  File \"script\", line 1\nSyntaxError: x",
        );
        let v = judged("python", true, &o);
        assert_eq!(v.status, Status::InvalidScript);
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(bytes(512 << 20), "512 MiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(7), "7 bytes");
    }
}
