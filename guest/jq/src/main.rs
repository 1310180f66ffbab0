//! Spillway sandbox image `jq`: jaq (a jq clone) as a WASI preview1 command.
//!
//! The filter is read from `/spillway/script`; the inputs are the payloads
//! listed in `/spillway/payloads.json`, in order (see guest/README.md for the
//! whole host <-> guest contract).
//!
//! Exit codes: 0 success, 1 runtime error (jq error, bad input JSON, I/O),
//! 2 bad arguments, 3 the filter does not compile; `halt_error` and
//! `halt_error(n)` keep jq's codes (5 and n).

mod alloc;
mod inputs;
mod report;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOC: alloc::Classes = alloc::Classes::new();

use core::cell::RefCell;
use inputs::{Mode, PayloadInputs};
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

    let filter = match compile_filter(&code, &var_names) {
        Ok(f) => f,
        Err(msg) => {
            eprint!("{msg}");
            return 3;
        }
    };

    let mode = if cli.raw_input { Mode::Raw } else { Mode::Json };
    let filename = RefCell::new(Val::Null);
    let stream = PayloadInputs::new(payloads, mode, cli.slurp, &filename);
    let stream: Box<dyn Iterator<Item = Result<Val, String>> + '_> = Box::new(stream);
    let inputs = RcIter::new(stream);
    let data = Data {
        lut: &filter.lut,
        inputs: &inputs,
        filename: &filename,
    };
    let ctx = Ctx::<DataKind>::new(&data, Vars::new(var_vals));

    let pp = jaq_json::write::Pp {
        indent: cli.indent.clone(),
        sort_keys: cli.sort_keys,
        styles: Default::default(),
        sep_space: cli.indent.is_some(),
    };
    let raw = cli.raw_output || cli.join_output;
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let mut errors = 0usize;
    let mut last: Option<bool> = None;

    let null =
        RcIter::new(Box::new(core::iter::once(Ok(Val::Null)))
            as Box<dyn Iterator<Item = Result<Val, String>>>);
    let top: &RcIter<dyn Iterator<Item = Result<Val, String>> + '_> =
        if cli.null_input { &null } else { &inputs };

    let mut status: Option<u8> = None;
    'inputs: for input in top {
        let input = match input {
            Ok(v) => v,
            Err(e) => {
                eprintln!("jq: error: {e}");
                status = Some(1);
                break;
            }
        };
        for output in filter.id.run((ctx.clone(), input)) {
            match output {
                Ok(v) => {
                    last = Some(v.as_bool());
                    if let Err(e) = write_val(&mut out, &pp, raw, cli.join_output, &v) {
                        eprintln!("jq: error: cannot write output: {e}");
                        return 1;
                    }
                }
                Err(exn) => match exn.get_err() {
                    Ok(err) => {
                        errors += 1;
                        if errors <= MAX_REPORTED_ERRORS {
                            let at = filename.borrow();
                            report::runtime_error(&at, err);
                        }
                        // like jq: the next input is processed
                        continue 'inputs;
                    }
                    Err(exn) => {
                        let code = exn.get_halt().unwrap_or(5);
                        if let Err(e) = out.flush() {
                            eprintln!("jq: error: cannot write output: {e}");
                            return 1;
                        }
                        // halt / halt_error: jq's exit codes (clamped to a byte)
                        return code.clamp(0, 255) as u8;
                    }
                },
            }
        }
    }
    if let Err(e) = out.flush() {
        eprintln!("jq: error: cannot write output: {e}");
        return 1;
    }
    if errors > MAX_REPORTED_ERRORS {
        eprintln!("jq: {} more errors not shown", errors - MAX_REPORTED_ERRORS);
    }
    if let Some(s) = status {
        return s;
    }
    if errors > 0 {
        return 1;
    }
    if cli.exit_status {
        return match last {
            None => 4,
            Some(false) => 1,
            Some(true) => 0,
        };
    }
    0
}

type Defs = Vec<load::parse::Def<&'static str>>;

thread_local! {
    /// The standard library (jaq-core's, jaq-std's and jaq-json's definitions), parsed.
    /// Filled by `wizer-initialize` when `make images` pre-initializes the image, so
    /// a run takes it from the snapshot instead of lexing and parsing it again.
    static STD_DEFS: RefCell<Option<Defs>> = const { RefCell::new(None) };
}

fn parse_std_defs() -> Defs {
    jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .collect()
}

/// Wizer's initialization function (guest/build-images.sh): parse the standard
/// library into the snapshot. Pure computation: no WASI call, so the snapshot
/// holds nothing of the machine that built it.
#[unsafe(export_name = "wizer-initialize")]
pub extern "C" fn wizer_initialize() {
    let defs = parse_std_defs();
    STD_DEFS.with(|d| *d.borrow_mut() = Some(defs));
}

fn compile_filter(code: &str, vars: &[String]) -> Result<jaq_core::Filter<DataKind>, String> {
    let arena = load::Arena::default();
    // from the snapshot (taken: each instance runs once), else parsed now
    let defs = STD_DEFS
        .with(|d| d.borrow_mut().take())
        .unwrap_or_else(parse_std_defs);
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

/// `debug` and `stderr` (jaq-std logs them) go to stderr, as in jq.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let mut err = io::stderr().lock();
        let _ = match record.level() {
            // `stderr`: the value, raw, without newline
            log::Level::Error => write!(err, "{}", record.args()),
            // `debug`: ["DEBUG:",<value>]
            _ => writeln!(err, "[\"DEBUG:\",{}]", record.args()),
        };
    }
    fn flush(&self) {}
}
