//! Spillway sandbox image `jq`: jaq (a jq clone) as a WASI preview1 command.
//!
//! The filter is read from `/spillway/script`; the inputs are the payloads
//! listed in `/spillway/payloads.json`, in order (see guest/README.md for the
//! whole host <-> guest contract).
//!
//! Exit codes: 0 success, 1 runtime error (jq error, bad input JSON, I/O),
//! 2 bad arguments, 3 the filter does not compile; `halt_error` and
//! `halt_error(n)` keep jq's codes (5 and n).

#[cfg(target_arch = "wasm32")]
mod alloc;
mod inputs;
mod report;
mod stream;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOC: alloc::Classes = alloc::Classes::new();

use core::cell::{OnceCell, RefCell};
use inputs::{ArrayInput, Input, Mode, PayloadInputs, Shared};
use jaq_core::{Ctx, DataT, Lut, Native, ValT, Vars, compile, load, native};
use jaq_json::Val;
use jaq_std::input::{HasInputs, Inputs, RcIter};
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

const SCRIPT: &str = "/spillway/script";
const PAYLOADS_JSON: &str = "/spillway/payloads.json";
const PAYLOADS_DIR: &str = "/payloads";
/// At most this many jq errors are printed; later ones are only counted.
const MAX_REPORTED_ERRORS: usize = 20;
/// Output of `.[] | f` held back per top-level array before the rest of the
/// array is parsed ahead (see `Run::each`); also the most log lines held.
const HOLD_MAX: usize = 8 << 20;

const USAGE: &str = "\
usage: jq [OPTIONS] [--args STRING...]

The filter is the script; the input is the stream of payloads, in order.
  -n, --null-input      run the filter once on null (use `input`/`inputs` to read)
  -R, --raw-input       each line of each payload is a string input
  -s, --slurp           all inputs as one array (with -R: one string)
  -r, --raw-output      print strings without quotes
  -j, --join-output     like -r, without a newline after each output
  -a, -C, -M            accepted, no effect (ASCII, colours)
  -c, --compact-output  compact output (the default)
      --indent N        pretty-print with N spaces (0 = compact)
      --tab             pretty-print with tabs
  -S, --sort-keys       sort object keys
  -e, --exit-status     exit 1 if the last output is false or null, 4 if none
      --arg NAME VALUE  $NAME is the string VALUE
      --argjson NAME J  $NAME is the JSON value J
      --slurpfile NAME F  $NAME is the array of JSON values in file F
      --rawfile NAME F  $NAME is the text of file F
      --args            the remaining arguments are strings in $ARGS.positional
      --jsonargs        the remaining arguments are JSON values in $ARGS.positional
  FILE                  read only these payloads (a name or id under /payloads, or a path)";

/// The kind of data our filters run on.
struct DataKind;

impl DataT for DataKind {
    type V<'a> = Val;
    type Data<'a> = &'a Data<'a>;
}

struct Data<'a> {
    lut: &'a Lut<DataKind>,
    inputs: Inputs<'a, Val>,
    filename: &'a RefCell<Val>,
}

impl<'a> jaq_core::data::HasLut<'a, DataKind> for &'a Data<'a> {
    fn lut(&self) -> &'a Lut<DataKind> {
        self.lut
    }
}

impl<'a> HasInputs<'a, Val> for &'a Data<'a> {
    fn inputs(&self) -> Inputs<'a, Val> {
        self.inputs
    }
}

type Fun = native::Filter<Native<DataKind>>;

fn funs() -> impl Iterator<Item = Fun> {
    let run = native::run::<DataKind>;
    let input = jaq_std::input::funs::<DataKind>()
        .into_vec()
        .into_iter()
        .map(run);
    let input_filename = run(("input_filename", native::v(0), |cv| {
        let name = cv.0.data().filename.borrow().clone();
        Box::new(core::iter::once(Ok(name)))
    }));
    jaq_core::funs::<DataKind>()
        .chain(jaq_std::funs::<DataKind>())
        .chain(jaq_json::funs::<DataKind>())
        .chain(input)
        .chain([input_filename])
}

#[derive(Default)]
struct Cli {
    null_input: bool,
    raw_input: bool,
    slurp: bool,
    raw_output: bool,
    join_output: bool,
    indent: Option<String>,
    sort_keys: bool,
    exit_status: bool,
    /// `--arg`, `--argjson`, `--slurpfile`, `--rawfile`, in order
    named: Vec<(String, Val)>,
    positional: Vec<Val>,
    files: Vec<String>,
    help: bool,
}

/// Bad command line: exit 2.
struct Usage(String);

fn parse_args(args: &[String]) -> Result<Cli, Usage> {
    let mut cli = Cli::default();
    let mut it = args.iter();
    let mut rest: Option<bool> = None; // Some(json?) after --args / --jsonargs
    let value = |it: &mut std::slice::Iter<String>, flag: &str, what: &str| {
        it.next()
            .cloned()
            .ok_or_else(|| Usage(format!("{flag} takes {what}")))
    };
    while let Some(arg) = it.next() {
        if let Some(json) = rest
            && arg != "--args"
            && arg != "--jsonargs"
        {
            let v = if json {
                jaq_json::read::parse_single(arg.as_bytes()).map_err(|e| {
                    Usage(format!(
                        "invalid JSON text passed to --jsonargs: {arg:?}: {e}"
                    ))
                })?
            } else {
                Val::from(arg.clone())
            };
            cli.positional.push(v);
            continue;
        }
        match arg.as_str() {
            "--null-input" => cli.null_input = true,
            "--raw-input" => cli.raw_input = true,
            "--slurp" => cli.slurp = true,
            "--raw-output" => cli.raw_output = true,
            "--join-output" => cli.join_output = true,
            "--compact-output" => cli.indent = None,
            // no effect here: output is ASCII-safe JSON, never coloured, flushed at the end
            "--ascii-output" | "--monochrome-output" | "--color-output" | "--unbuffered" => {}
            "--sort-keys" => cli.sort_keys = true,
            "--exit-status" => cli.exit_status = true,
            "--tab" => cli.indent = Some("\t".into()),
            "--indent" => {
                let n = value(&mut it, arg, "a number")?;
                let n: usize = n.parse().ok().filter(|n| *n <= 7).ok_or_else(|| {
                    Usage(format!("--indent takes a number from 0 to 7, not {n:?}"))
                })?;
                cli.indent = (n > 0).then(|| " ".repeat(n));
            }
            "--arg" => {
                let name = value(&mut it, arg, "a name and a value")?;
                let v = value(&mut it, arg, "a name and a value")?;
                cli.named.push((name, Val::from(v)));
            }
            "--argjson" => {
                let name = value(&mut it, arg, "a name and a JSON text")?;
                let text = value(&mut it, arg, "a name and a JSON text")?;
                let v = jaq_json::read::parse_single(text.as_bytes()).map_err(|e| {
                    Usage(format!("invalid JSON text passed to --argjson {name}: {e}"))
                })?;
                cli.named.push((name, v));
            }
            "--slurpfile" | "--rawfile" => {
                let name = value(&mut it, arg, "a name and a file")?;
                let file = value(&mut it, arg, "a name and a file")?;
                let path = inputs::resolve(&file);
                let bytes = std::fs::read(&path)
                    .map_err(|e| Usage(format!("{arg} {name}: cannot read {file:?}: {e}")))?;
                let v = if arg == "--rawfile" {
                    Val::utf8_str(bytes)
                } else {
                    jaq_json::read::parse_many(&bytes)
                        .collect::<Result<Val, _>>()
                        .map_err(|e| {
                            Usage(format!("{arg} {name}: invalid JSON in {file:?}: {e}"))
                        })?
                };
                cli.named.push((name, v));
            }
            "--args" => rest = Some(false),
            "--jsonargs" => rest = Some(true),
            "--help" => cli.help = true,
            "-" => {
                return Err(Usage(
                    "stdin is empty here: the inputs are the payloads".into(),
                ));
            }
            long if long.starts_with("--") => {
                return Err(Usage(format!("unknown option: {long}")));
            }
            short if short.starts_with('-') && short.len() > 1 => {
                for c in short[1..].chars() {
                    match c {
                        'n' => cli.null_input = true,
                        'R' => cli.raw_input = true,
                        's' => cli.slurp = true,
                        'r' => cli.raw_output = true,
                        'j' => cli.join_output = true,
                        'c' => cli.indent = None,
                        'a' | 'M' | 'C' => {}
                        'S' => cli.sort_keys = true,
                        'e' => cli.exit_status = true,
                        'h' => cli.help = true,
                        c => {
                            let which = if short.len() > 2 {
                                format!("-{c} (in {short})")
                            } else {
                                short.to_string()
                            };
                            return Err(Usage(format!("unknown option: {which}")));
                        }
                    }
                }
            }
            file => cli.files.push(file.to_string()),
        }
    }
    Ok(cli)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = match parse_args(&args) {
        Ok(cli) => cli,
        Err(Usage(msg)) => {
            eprintln!("jq: error: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if cli.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    log::set_logger(&StderrLogger).ok();
    log::set_max_level(log::LevelFilter::Debug);
    ExitCode::from(real_main(cli))
}

fn real_main(cli: Cli) -> u8 {
    let code = match std::fs::read(SCRIPT) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(code) => code,
            Err(_) => {
                eprintln!("jq: error: the script is not valid UTF-8");
                return 3;
            }
        },
        Err(e) => {
            eprintln!("jq: error: cannot read the script {SCRIPT}: {e}");
            return 1;
        }
    };

    let payloads = match cli.files.is_empty() {
        true => match inputs::read_payloads_json(PAYLOADS_JSON) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("jq: error: {e}");
                return 1;
            }
        },
        false => match cli.files.iter().map(|f| inputs::file_payload(f)).collect() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("jq: error: {e}");
                return 2;
            }
        },
    };

    // global variables: named arguments, then $ARGS and $ENV (empty: no environment)
    let mut var_names: Vec<String> = cli.named.iter().map(|(k, _)| format!("${k}")).collect();
    let mut var_vals: Vec<Val> = cli.named.iter().map(|(_, v)| v.clone()).collect();
    let named = cli
        .named
        .iter()
        .map(|(k, v)| (Val::from(k.clone()), v.clone()));
    let args_obj = [
        (
            Val::from("positional".to_string()),
            cli.positional.iter().cloned().collect(),
        ),
        (Val::from("named".to_string()), Val::obj(named.collect())),
    ];
    var_names.push("$ARGS".into());
    var_vals.push(Val::obj(args_obj.into_iter().collect()));
    var_names.push("$ENV".into());
    var_vals.push(Val::obj(Default::default()));

    // `.[] | f`: `f` runs on each element of a top-level array as it is parsed
    let per_element = match cli.null_input || cli.raw_input || cli.slurp {
        true => None,
        false => stream::per_element(&code),
    };
    let filter = match compile_filter(per_element.as_deref().unwrap_or(&code), &var_names) {
        Ok(f) => f,
        Err(msg) => {
            // the same positions; the message is the one for the filter as written
            let msg = match per_element {
                Some(_) => compile_filter(&code, &var_names).err().unwrap_or(msg),
                None => msg,
            };
            eprint!("{msg}");
            return 3;
        }
    };

    let mode = if cli.raw_input { Mode::Raw } else { Mode::Json };
    let filename = RefCell::new(Val::Null);
    let arrays = per_element.is_some();
    let stream = RefCell::new(PayloadInputs::new(
        payloads, mode, cli.slurp, arrays, &filename,
    ));
    let inputs = RcIter::new(Shared(&stream));
    let data = Data {
        lut: &filter.lut,
        inputs: &inputs,
        filename: &filename,
    };
    let ctx = Ctx::<DataKind>::new(&data, Vars::new(var_vals.clone()));
    // with `per_element`, `filter` is `f`; the filter as written runs on the
    // inputs that are not arrays, compiled when the first one comes
    let whole = OnceCell::new();
    let whole_data = OnceCell::new();
    let whole_ctx = OnceCell::new();

    let mut run = Run {
        pp: jaq_json::write::Pp {
            indent: cli.indent.clone(),
            sort_keys: cli.sort_keys,
            styles: Default::default(),
            sep_space: cli.indent.is_some(),
        },
        raw: cli.raw_output || cli.join_output,
        join: cli.join_output,
        errors: 0,
        last: None,
        filename: &filename,
    };
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let mut status: Option<u8> = None;
    let mut null = cli.null_input.then_some(Val::Null);
    loop {
        let next = match null.take() {
            Some(v) => Some(Ok(Input::Val(v))),
            None if cli.null_input => None,
            None => stream.borrow_mut().next_input(),
        };
        let ended = match next {
            None => break,
            Some(Err(e)) => {
                eprintln!("jq: error: {e}");
                status = Some(1);
                break;
            }
            Some(Ok(Input::Val(v))) if arrays => {
                let f = match whole.get_or_init(|| compile_filter(&code, &var_names)) {
                    Ok(f) => f,
                    Err(msg) => {
                        eprint!("{msg}");
                        return 3;
                    }
                };
                let ctx = whole_ctx.get_or_init(|| {
                    let data = whole_data.get_or_init(|| Data {
                        lut: &f.lut,
                        inputs: &inputs,
                        filename: &filename,
                    });
                    Ctx::<DataKind>::new(data, Vars::new(var_vals.clone()))
                });
                run.one(f, ctx, v, &mut out)
            }
            Some(Ok(Input::Val(v))) => run.one(&filter, &ctx, v, &mut out),
            Some(Ok(Input::Array(a))) => match run.each(&filter, &ctx, &a, &mut out) {
                Ok(Err(invalid)) => {
                    eprintln!("jq: error: {invalid}");
                    status = Some(1);
                    break;
                }
                Ok(Ok(ended)) => Ok(ended),
                Err(e) => Err(e),
            },
        };
        match ended {
            Ok(Ended::Done) => {}
            // like jq: the next input is processed
            Ok(Ended::Error(msg)) => run.error(msg),
            Ok(Ended::Halt(code)) => {
                if let Err(e) = out.flush() {
                    eprintln!("jq: error: cannot write output: {e}");
                    return 1;
                }
                return code;
            }
            Err(e) => {
                eprintln!("jq: error: cannot write output: {e}");
                return 1;
            }
        }
    }
    if let Err(e) = out.flush() {
        eprintln!("jq: error: cannot write output: {e}");
        return 1;
    }
    if run.errors > MAX_REPORTED_ERRORS {
        eprintln!(
            "jq: {} more errors not shown",
            run.errors - MAX_REPORTED_ERRORS
        );
    }
    if let Some(s) = status {
        return s;
    }
    if run.errors > 0 {
        return 1;
    }
    if cli.exit_status {
        return match run.last {
            None => 4,
            Some(false) => 1,
            Some(true) => 0,
        };
    }
    0
}

type Filter = jaq_core::Filter<DataKind>;

/// How outputs are written, and what the run has come to so far.
struct Run<'p> {
    pp: jaq_json::write::Pp,
    raw: bool,
    join: bool,
    /// jq errors so far
    errors: usize,
    /// the truth of the last output (for `-e`)
    last: Option<bool>,
    filename: &'p RefCell<Val>,
}

/// How running the filter on one input ended.
enum Ended {
    /// every output was written
    Done,
    /// a jq error stopped this input; its message
    Error(String),
    /// `halt` or `halt_error`: exit with this code
    Halt(u8),
}

impl Run<'_> {
    /// `f` on `input`, its outputs written to `out`.
    fn one(
        &mut self,
        f: &Filter,
        ctx: &Ctx<DataKind>,
        input: Val,
        out: &mut impl Write,
    ) -> io::Result<Ended> {
        for output in f.id.run((ctx.clone(), input)) {
            match output {
                Ok(v) => {
                    self.last = Some(v.as_bool());
                    write_val(out, &self.pp, self.raw, self.join, &v)?;
                }
                Err(exn) => {
                    return Ok(match exn.get_err() {
                        Ok(err) => {
                            Ended::Error(report::runtime_error(&self.filename.borrow(), err))
                        }
                        // halt / halt_error: jq's exit codes (clamped to a byte)
                        Err(exn) => Ended::Halt(exn.get_halt().unwrap_or(5).clamp(0, 255) as u8),
                    });
                }
            }
        }
        Ok(Ended::Done)
    }

    /// `f` on each element of `input`, as jq's `.[] | f` on the whole array.
    /// The outputs, and what `debug` and `stderr` write, are held until
    /// every element has parsed: jq parses an input whole before running
    /// the filter, so for an invalid array it prints no output, only the
    /// JSON error (the `Err`), even when a jq error or `halt` came first.
    /// Past [`HOLD_MAX`] bytes held, the rest of the array is parsed ahead
    /// (and dropped) to know it now, and the outputs flow from then on: what
    /// is held stays bounded, and a flood meets the stdout limit, not the
    /// memory limit. Log lines past [`HOLD_MAX`] go out as they come (see
    /// [`StderrLogger`]).
    fn each(
        &mut self,
        f: &Filter,
        ctx: &Ctx<DataKind>,
        input: &ArrayInput,
        out: &mut impl Write,
    ) -> io::Result<Result<Ended, String>> {
        hold_stderr(true);
        let mut hold = Hold {
            out,
            held: Some(Vec::new()),
            input,
            taken: 0,
            invalid: false,
        };
        let mut ended = Ended::Done;
        for elem in input.array.elements() {
            hold.taken += 1;
            let Ok(v) = elem else {
                // only while holding: once settled, the rest had parsed
                hold_stderr(false);
                return Ok(Err(input.error()));
            };
            ended = match self.one(f, ctx, v, &mut hold) {
                Ok(ended) => ended,
                Err(_) if hold.invalid => return Ok(Err(input.error())),
                Err(e) => return Err(e),
            };
            if !matches!(ended, Ended::Done) {
                break;
            }
        }
        Ok(match hold.settle()? {
            true => Ok(ended),
            false => Err(input.error()),
        })
    }

    /// Report a jq error (the first [`MAX_REPORTED_ERRORS`] only).
    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.errors <= MAX_REPORTED_ERRORS {
            eprintln!("{msg}");
        }
    }
}

type Defs = Vec<load::parse::Def<&'static str>>;

/// The standard library (jaq-core's, jaq-std's and jaq-json's definitions),
/// parsed, with the names each definition's body calls.
struct StdLib {
    defs: Defs,
    /// `calls[i]`: every filter name `defs[i]`'s body calls, itself included
    /// when it recurses.
    calls: Vec<Vec<&'static str>>,
}

thread_local! {
    /// Filled by `wizer-initialize` when `make images` pre-initializes the image, so
    /// a run takes it from the snapshot instead of lexing and parsing it again.
    static STD_LIB: RefCell<Option<StdLib>> = const { RefCell::new(None) };
}

fn parse_std_lib() -> StdLib {
    let defs: Defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .collect();
    let calls = defs
        .iter()
        .map(|d| {
            let mut out = Vec::new();
            calls_of(&d.body, &mut out);
            out.sort_unstable();
            out.dedup();
            out
        })
        .collect();
    StdLib { defs, calls }
}

/// Every filter name `t` calls, including string formats (`@base64`), the
/// calls inside local definitions, and arguments.
fn calls_of(t: &load::parse::Term<&'static str>, out: &mut Vec<&'static str>) {
    use jaq_core::load::lex::StrPart;
    use jaq_core::load::parse::{BinaryOp, Term};
    use jaq_core::path::Part;
    match t {
        Term::Id | Term::Recurse | Term::Num(_) | Term::Break(_) | Term::Var(_) => {}
        Term::Str(fmt, parts) => {
            out.extend(fmt.iter().copied());
            for part in parts {
                if let StrPart::Term(t) = part {
                    calls_of(t, out);
                }
            }
        }
        Term::Arr(t) => t.iter().for_each(|t| calls_of(t, out)),
        Term::Obj(entries) => {
            for (k, v) in entries {
                calls_of(k, out);
                v.iter().for_each(|v| calls_of(v, out));
            }
        }
        Term::Neg(t) | Term::Label(_, t) => calls_of(t, out),
        Term::BinOp(l, op, r) => {
            if let BinaryOp::Pipe(Some(p)) = op {
                pattern_calls(p, out);
            }
            calls_of(l, out);
            calls_of(r, out);
        }
        Term::Fold(_, xs, p, args) => {
            calls_of(xs, out);
            pattern_calls(p, out);
            args.iter().for_each(|t| calls_of(t, out));
        }
        Term::TryCatch(t, catch) => {
            calls_of(t, out);
            catch.iter().for_each(|t| calls_of(t, out));
        }
        Term::IfThenElse(branches, otherwise) => {
            for (cond, then) in branches {
                calls_of(cond, out);
                calls_of(then, out);
            }
            otherwise.iter().for_each(|t| calls_of(t, out));
        }
        Term::Def(defs, t) => {
            defs.iter().for_each(|d| calls_of(&d.body, out));
            calls_of(t, out);
        }
        Term::Call(name, args) => {
            out.push(name);
            args.iter().for_each(|t| calls_of(t, out));
        }
        Term::Path(t, path) => {
            calls_of(t, out);
            for (part, _) in &path.0 {
                match part {
                    Part::Index(i) => calls_of(i, out),
                    Part::Range(from, to) => {
                        from.iter().chain(to).for_each(|t| calls_of(t, out));
                    }
                }
            }
        }
    }
}

/// The terms inside a destructuring pattern (`. as {(f): $x}`).
fn pattern_calls(p: &load::parse::Pattern<&'static str>, out: &mut Vec<&'static str>) {
    use jaq_core::load::parse::Pattern;
    match p {
        Pattern::Var(_) => {}
        Pattern::Arr(ps) => ps.iter().for_each(|p| pattern_calls(p, out)),
        Pattern::Obj(entries) => {
            for (k, p) in entries {
                calls_of(k, out);
                pattern_calls(p, out);
            }
        }
    }
}

/// The standard definitions `code` can reach: those named by any word in
/// `code` (a superset of what it calls: words in strings and comments
/// count too), and, transitively, those their bodies call. A definition
/// only calls earlier ones (or itself), so one pass from the last to the
/// first finds them all; the kept ones stay in their order. Compiling only
/// these, instead of the whole library, is most of an empty filter's start.
fn reachable(std: &StdLib, code: &str) -> Defs {
    let mut needed: std::collections::HashSet<&str> = words(code).collect();
    let mut keep = vec![false; std.defs.len()];
    for (i, def) in std.defs.iter().enumerate().rev() {
        if needed.contains(def.name) {
            keep[i] = true;
            needed.extend(std.calls[i].iter().copied());
        }
    }
    std.defs
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(d, _)| d.clone())
        .collect()
}

/// Every run of identifier characters in `code`, and of a run with an `@`
/// inside, each piece, with and without its `@` (string formats are filters
/// named `@base64` and so on): a superset of the names it can call.
fn words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '@'))
        .flat_map(|w| {
            let formats = w.match_indices('@').map(move |(i, _)| &w[i..]);
            core::iter::once(w).chain(w.split('@')).chain(formats)
        })
        .filter(|w| !w.is_empty())
}

/// Wizer's initialization function (guest/build-images.sh): parse the standard
/// library into the snapshot. Pure computation: no WASI call, so the snapshot
/// holds nothing of the machine that built it.
#[unsafe(export_name = "wizer-initialize")]
pub extern "C" fn wizer_initialize() {
    let std = parse_std_lib();
    STD_LIB.with(|d| *d.borrow_mut() = Some(std));
}

fn compile_filter(code: &str, vars: &[String]) -> Result<Filter, String> {
    // from the snapshot, else parsed now (and kept for a second filter)
    let defs = STD_LIB.with(|d| {
        let mut d = d.borrow_mut();
        reachable(d.get_or_insert_with(parse_std_lib), code)
    });
    compile_with(defs, code, vars)
}

fn compile_with(
    defs: Defs,
    code: &str,
    vars: &[String],
) -> Result<jaq_core::Filter<DataKind>, String> {
    let arena = load::Arena::default();
    let loader = load::Loader::new(defs);
    let file = load::File { path: (), code };
    let modules = loader
        .load(&arena, file)
        .map_err(|errs| report::load_errors(code, errs))?;
    load::import(&modules, |_| {
        Err("module and data imports are not supported".into())
    })
    .map_err(|errs| report::load_errors(code, errs))?;
    compile::Compiler::default()
        .with_funs(funs())
        .with_global_vars(vars.iter().map(|v| &**v))
        .compile(modules)
        .map_err(|errs| report::compile_errors(code, errs))
}

fn write_val(
    w: &mut impl Write,
    pp: &jaq_json::write::Pp,
    raw: bool,
    join: bool,
    v: &Val,
) -> io::Result<()> {
    match v {
        Val::TStr(s) | Val::BStr(s) if raw => w.write_all(s)?,
        _ => jaq_json::write::write(w, pp, 0, v)?,
    }
    if !join {
        w.write_all(b"\n")?;
    }
    Ok(())
}

/// Where `.[] | f` writes its outputs (see [`Run::each`]): held back until
/// the array is known to parse, then straight through.
struct Hold<'o, W> {
    out: &'o mut W,
    /// `Some` while holding
    held: Option<Vec<u8>>,
    input: &'o ArrayInput,
    /// elements of the array taken so far
    taken: usize,
    /// the rest of the array, parsed ahead, does not parse
    invalid: bool,
}

impl<W: Write> Hold<'_, W> {
    /// Parses the rest of the array ahead (if still holding): `false` if it
    /// does not parse, and what was held is dropped; else it goes out, log
    /// lines too, and outputs flow from now on.
    fn settle(&mut self) -> io::Result<bool> {
        let Some(held) = self.held.take() else {
            return Ok(!self.invalid);
        };
        if self
            .input
            .array
            .elements_from(self.taken)
            .any(|e| e.is_err())
        {
            self.invalid = true;
            hold_stderr(false);
            return Ok(false);
        }
        release_stderr();
        self.out.write_all(&held)?;
        Ok(true)
    }
}

impl<W: Write> Write for Hold<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(held) = &mut self.held else {
            return match self.invalid {
                true => Err(io::Error::other("the array does not parse")),
                false => self.out.write(buf),
            };
        };
        held.extend_from_slice(buf);
        // bounded: past this, know now whether the array parses
        if held.len() > HOLD_MAX && !self.settle()? {
            return Err(io::Error::other("the array does not parse"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.held {
            None => self.out.flush(),
            Some(_) => Ok(()),
        }
    }
}

/// `debug` and `stderr` (jaq-std logs them) go to stderr, as in jq, or,
/// while [`hold_stderr`] holds them, to a buffer.
struct StderrLogger;

thread_local! {
    /// Log output held back (see [`hold_stderr`]).
    static HELD_STDERR: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// From `true`: what `debug` and `stderr` write is held back; `false`
/// drops what was held and writes through again.
fn hold_stderr(hold: bool) {
    HELD_STDERR.with(|h| *h.borrow_mut() = hold.then(Vec::new));
}

/// Writes what was held back to stderr, and writes through again.
fn release_stderr() {
    if let Some(held) = HELD_STDERR.with(|h| h.borrow_mut().take()) {
        let _ = io::stderr().lock().write_all(&held);
    }
}

impl log::Log for StderrLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let mut line = Vec::new();
        let _ = match record.level() {
            // `stderr`: the value, raw, without newline
            log::Level::Error => write!(line, "{}", record.args()),
            // `debug`: ["DEBUG:",<value>]
            _ => writeln!(line, "[\"DEBUG:\",{}]", record.args()),
        };
        let mut held = HELD_STDERR.with(|h| h.borrow_mut().take());
        match &mut held {
            // bounded: past HOLD_MAX, log lines go out even if the array
            // later turns out not to parse (they are diagnostics, and a
            // flood of them then meets the stderr limit)
            Some(h) if h.len() + line.len() <= HOLD_MAX => h.extend_from_slice(&line),
            Some(h) => {
                let mut err = io::stderr().lock();
                let _ = err.write_all(h).and_then(|()| err.write_all(&line));
                held = None;
            }
            None => {
                let _ = io::stderr().lock().write_all(&line);
            }
        }
        HELD_STDERR.with(|h| *h.borrow_mut() = held);
    }
    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each standard definition, called with `.` for each argument.
    fn every_std_call() -> Vec<String> {
        let std = parse_std_lib();
        let mut calls: Vec<String> = std
            .defs
            .iter()
            .map(|d| match d.args.len() {
                0 => d.name.to_string(),
                n => format!("{}({})", d.name, vec!["."; n].join("; ")),
            })
            .collect();
        calls.dedup();
        calls
    }

    #[test]
    fn every_standard_definition_compiles_with_only_what_it_reaches() {
        let calls = every_std_call();
        assert!(calls.len() > 100, "{} definitions", calls.len());
        for code in &calls {
            let kept = reachable(&parse_std_lib(), code);
            assert!(
                kept.len() < parse_std_lib().defs.len(),
                "{code} kept everything"
            );
            if let Err(e) = compile_with(kept, code, &[]) {
                panic!("{code}: {e}");
            }
        }
    }

    #[test]
    fn a_format_in_a_string_reaches_its_definition() {
        for code in [r#"@base64d "\(.)""#, "@html", ".[]|@sh", "@text \"a\\(.)\""] {
            let kept = reachable(&parse_std_lib(), code);
            if let Err(e) = compile_with(kept, code, &[]) {
                panic!("{code}: {e}");
            }
        }
    }

    #[test]
    fn a_name_outside_the_library_is_refused_as_with_the_whole_library() {
        let code = "map(.a) | no_such_filter";
        let full = compile_with(parse_std_lib().defs, code, &[]).err();
        let kept = compile_with(reachable(&parse_std_lib(), code), code, &[]).err();
        assert!(
            full.as_deref()
                .is_some_and(|e| e.contains("no_such_filter")),
            "{full:?}"
        );
        assert_eq!(full, kept);
    }

    #[test]
    fn an_empty_filter_compiles_none_of_the_library() {
        assert!(reachable(&parse_std_lib(), ".").is_empty());
    }
}
