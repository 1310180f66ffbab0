//! A run's ending in the contract's terms: a status and one message the
//! model can act on.

use super::limits::ExecLimits;
use super::run::{Ending, RunOutcome, ScratchLimit};

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
    let verdict = |status, exit_code, message: String| Verdict {
        status,
        exit_code,
        message,
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
        Ending::OutputLimit("stdout") => verdict(
            Status::OutputLimit,
            -1,
            format!(
                "stdout passed its limit of {} and the script was stopped, so its output is incomplete and was not kept as a payload. Print a summary instead, write bulk results to /out with keep_outputs, or raise limits.max_stdout_bytes (up to {})",
                bytes(limits.max_stdout_bytes),
                bytes(ceiling.max_stdout_bytes)
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
        Ending::Trapped(why) => {
            verdict(Status::Trap, -1, format!("{runtime} guest trapped: {why}"))
        }
    }
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
        }
    }

    const SCRATCH: ScratchLimit = ScratchLimit {
        bytes: 1 << 20,
        entries: 10,
    };

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

    #[test]
    fn exit_code_three_of_an_image_is_an_invalid_script() {
        let v = judge(
            "javascript",
            true,
            &outcome(Ending::Exited(3)),
            &ExecLimits::DEFAULTS,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(v.status, Status::InvalidScript);
        assert_eq!(v.exit_code, 3);
    }

    #[test]
    fn exit_code_three_of_a_user_module_is_just_nonzero() {
        let v = judge(
            "wasm",
            false,
            &outcome(Ending::Exited(3)),
            &ExecLimits::DEFAULTS,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(v.status, Status::ExitNonzero);
    }

    #[test]
    fn the_marker_line_marks_an_invalid_python_script() {
        let mut o = outcome(Ending::Exited(1));
        o.stderr = bytes::Bytes::from_static(
            b"spillway: invalid script\n  File \"script\", line 1\nSyntaxError: x",
        );
        let v = judge(
            "python",
            true,
            &o,
            &ExecLimits::DEFAULTS,
            &ExecLimits::CEILING,
            SCRATCH,
        );
        assert_eq!(v.status, Status::InvalidScript);
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(bytes(512 << 20), "512 MiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(7), "7 bytes");
    }
}
