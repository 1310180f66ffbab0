//! Error messages: compile errors with their position, and runtime errors.
use core::fmt::Write;
use jaq_core::{compile, load};
use jaq_json::Val;

/// One compile error: message, then the line of the filter with a caret under `found`.
fn located(out: &mut String, code: &str, found: &str, msg: &str) {
    let range = load::span(code, found);
    let start = range.start.min(code.len());
    let line_start = code[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = code[start..].find('\n').map_or(code.len(), |i| start + i);
    let line_no = code[..start].matches('\n').count() + 1;
    let col = code[line_start..start].chars().count() + 1;
    let line = &code[line_start..line_end];
    let width = code[start..range.end.clamp(start, line_end)]
        .chars()
        .count()
        .max(1);
    let _ = writeln!(out, "jq: error: {msg} at line {line_no}, column {col}:");
    let _ = writeln!(out, "    {}", line.replace('\t', " "));
    let _ = writeln!(out, "    {}{}", " ".repeat(col - 1), "^".repeat(width));
}

pub fn load_errors(code: &str, errs: load::Errors<&str, ()>) -> String {
    let mut out = String::new();
    for (file, err) in errs {
        // only the script itself is ever loaded (no module imports)
        let code = if file.code.is_empty() {
            code
        } else {
            file.code
        };
        match err {
            load::Error::Io(errs) => {
                for (path, e) in errs {
                    located(&mut out, code, path, &format!("cannot load {path}: {e}"));
                }
            }
            load::Error::Lex(errs) => {
                for (expected, found) in errs {
                    // point at the first character only
                    let found =
                        &found[..found.char_indices().nth(1).map_or(found.len(), |(i, _)| i)];
                    let got = if found.is_empty() {
                        "unexpected end of input".to_string()
                    } else {
                        format!("unexpected character {found:?}")
                    };
                    let msg = format!("syntax error: expected {}, {got}", expected.as_str());
                    located(&mut out, code, found, &msg);
                }
            }
            load::Error::Parse(errs) => {
                for (expected, found) in errs {
                    let got = if found.is_empty() {
                        "unexpected end of input".to_string()
                    } else {
                        format!("unexpected token {found:?}")
                    };
                    let msg = format!("syntax error: expected {}, {got}", expected.as_str());
                    located(&mut out, code, found, &msg);
                }
            }
        }
    }
    out.push_str("jq: the filter does not compile\n");
    out
}

pub fn compile_errors(code: &str, errs: compile::Errors<&str, ()>) -> String {
    let mut out = String::new();
    for (file, errs) in errs {
        let code = if file.code.is_empty() {
            code
        } else {
            file.code
        };
        for (found, undefined) in errs {
            let msg = match (found, &undefined) {
                ("reduce", compile::Undefined::Filter(a)) => {
                    format!("reduce takes 2 arguments, not {a}")
                }
                ("foreach", compile::Undefined::Filter(a)) => {
                    format!("foreach takes 2 or 3 arguments, not {a}")
                }
                (_, compile::Undefined::Filter(arity)) => {
                    format!("undefined function {found}/{arity}")
                }
                (_, u) => format!("undefined {} {found}", u.as_str()),
            };
            located(&mut out, code, found, &msg);
        }
    }
    out.push_str("jq: the filter does not compile\n");
    out
}

/// `jq: error (at data.json): <message>`; string errors are shown as they are.
pub fn runtime_error(at: &Val, err: jaq_core::Error<Val>) -> String {
    let at = match at {
        Val::TStr(s) | Val::BStr(s) => format!(" (at {})", String::from_utf8_lossy(s)),
        _ => String::new(),
    };
    let msg = match err.into_val() {
        Val::TStr(s) | Val::BStr(s) => String::from_utf8_lossy(&s).into_owned(),
        v => format!("{v} (not a string)"),
    };
    format!("jq: error{at}: {msg}")
}
