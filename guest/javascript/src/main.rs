//! Spillway sandbox image `javascript`: QuickJS-ng (through rquickjs) as a
//! WASI preview1 command.
//!
//! The user's script (/spillway/script) runs as a global script, after
//! src/prelude.js has set up the globals (see guest/README.md).
//!
//! `make images` pre-initializes the image with Wizer: `wizer-initialize`
//! builds the runtime, the context and the prelude's globals, and the image
//! starts from that snapshot. Each run then only reseeds `Math.random`,
//! restarts `performance`, and binds its payloads and arguments.
//!
//! Exit codes: 0 success, 1 uncaught exception or unhandled rejection,
//! 3 the script does not compile; `process.exit(n)` exits n.

use rquickjs::{Context, Ctx, Exception, Function, Object, Persistent, Runtime, Value, qjs};
use std::cell::RefCell;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::process::ExitCode;

const SCRIPT: &str = "/spillway/script";
const PAYLOADS_JSON: &str = "/spillway/payloads.json";
const OUT_DIR: &str = "/out";
/// QuickJS's stack limit (enabled by the patch in cc-wasm32-wasip1.sh), in bytes of the
/// 8 MiB shadow stack (.cargo/config.toml): about 3,500 nested JavaScript calls.
const JS_STACK: usize = 1 << 20;
/// readLines hands lines to JavaScript in batches of at most this many lines or bytes.
const LINES_BATCH: usize = 1024;
const LINES_BATCH_BYTES: usize = 256 << 10;

thread_local! {
    static STDOUT: RefCell<BufWriter<io::Stdout>> = RefCell::new(BufWriter::with_capacity(64 << 10, io::stdout()));
    static LINES: RefCell<Vec<Option<BufReader<File>>>> = const { RefCell::new(Vec::new()) };
    /// rejected promises without a handler (yet), with the formatted reason
    static REJECTIONS: RefCell<Vec<(Persistent<Value<'static>>, String)>> = const { RefCell::new(Vec::new()) };
    static INSPECT: RefCell<Option<Persistent<Function<'static>>>> = const { RefCell::new(None) };
    /// The runtime, context and prelude: from the snapshot when the image was
    /// pre-initialized, else built by `main`.
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

unsafe extern "C" {
    /// cc-wasm32-wasip1.sh appends it to quickjs.c: sets the context's
    /// `Math.random` state (private to quickjs.c) to `seed`.
    fn spillway_js_seed_random(ctx: *mut qjs::JSContext, seed: u64);
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
unsafe extern "C" {
    /// WASI's `random_get(buf, len) -> errno`, called directly: std's
    /// `RandomState` keys are drawn once and would come from the snapshot.
    #[link_name = "random_get"]
    fn wasi_random_get(buf: *mut u8, len: usize) -> i32;
}

/// Eight bytes from WASI's random source, now.
fn fresh_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is valid for writes of its length.
    let errno = unsafe { wasi_random_get(b.as_mut_ptr(), b.len()) };
    if errno != 0 {
        eprintln!("javascript: no random source (WASI errno {errno})");
        std::process::exit(1);
    }
    u64::from_le_bytes(b)
}

/// A ready QuickJS: runtime, context, and the prelude's `bind`.
struct Engine {
    rt: Runtime,
    context: Context,
    bind: Persistent<Function<'static>>,
}

/// The runtime, the context and the prelude's globals: everything that does
/// not depend on the run. Pure computation except for a clock read (QuickJS
/// seeds `Math.random` and `performance` from it, both redone per run by
/// `per_run`) and std's hash keys (rquickjs keeps a `HashMap`).
fn new_engine() -> Result<Engine, String> {
    let rt = Runtime::new().map_err(|e| format!("QuickJS runtime: {e}"))?;
    rt.set_max_stack_size(JS_STACK);
    rt.set_host_promise_rejection_tracker(Some(Box::new(|ctx, promise, reason, handled| {
        if handled {
            REJECTIONS.with(|r| {
                r.borrow_mut()
                    .retain(|(p, _)| p.clone().restore(&ctx).ok() != Some(promise.clone()))
            });
        } else {
            let msg = uncaught(&ctx, reason, "Uncaught (in promise)");
            REJECTIONS.with(|r| r.borrow_mut().push((Persistent::save(&ctx, promise), msg)));
        }
    })));
    let context = Context::full(&rt).map_err(|e| format!("QuickJS context: {e}"))?;
    let bind = context.with(|ctx| {
        setup(&ctx).map_err(|e| match e {
            rquickjs::Error::Exception => uncaught(&ctx, ctx.catch(), "javascript: setup failed:"),
            e => format!("javascript: setup failed: {e}"),
        })
    })?;
    rt.run_gc();
    Ok(Engine { rt, context, bind })
}

/// Wizer's initialization function (guest/build-images.sh): the engine into the
/// snapshot. Wizer links only a fixed clock (time 0) and a fixed random source
/// (zeros) and traps on any other WASI call, so the snapshot holds nothing of
/// the machine that built it.
#[unsafe(export_name = "wizer-initialize")]
pub extern "C" fn wizer_initialize() {
    match new_engine() {
        Ok(engine) => ENGINE.with(|e| *e.borrow_mut() = Some(engine)),
        Err(msg) => {
            eprintln!("{msg}");
            std::process::abort()
        }
    }
}

/// What a snapshot must not share between runs: a fresh `Math.random` seed (from
/// WASI's random source), `performance` with this run's time origin, and
/// QuickJS's stack top at this run's stack pointer.
fn per_run(ctx: &Ctx<'_>) {
    let seed = fresh_seed();
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: a valid context of this thread; the functions only set fields of
    // the context and runtime, and define `performance` on the global object.
    unsafe {
        spillway_js_seed_random(raw, seed);
        qjs::JS_AddPerformance(raw);
        qjs::JS_UpdateStackTop(qjs::JS_GetRuntime(raw));
    }
}

fn flush_stdout() -> io::Result<()> {
    STDOUT.with(|out| out.borrow_mut().flush())
}

/// Leave now: flush stdout, skip the teardown of the JavaScript heap.
fn exit(code: u8) -> ! {
    if let Err(e) = flush_stdout() {
        eprintln!("javascript: cannot write output: {e}");
        std::process::exit(1);
    }
    std::process::exit(code.into())
}

fn write(fd: i32, text: String) {
    let r = if fd == 2 {
        // stdout and stderr are separate streams: no need to flush stdout first
        io::stderr().write_all(text.as_bytes())
    } else {
        STDOUT.with(|out| out.borrow_mut().write_all(text.as_bytes()))
    };
    if let Err(e) = r {
        eprintln!("javascript: cannot write output: {e}");
        std::process::exit(1);
    }
}

/// `No such file or directory (os error 44)` -> `No such file or directory`
fn io_msg(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn read_text(ctx: Ctx<'_>, path: String) -> rquickjs::Result<String> {
    match std::fs::read(&path) {
        Ok(bytes) => Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }),
        Err(e) => Err(Exception::throw_message(
            &ctx,
            &format!("readText: {path}: {}", io_msg(&e)),
        )),
    }
}

fn lines_open(ctx: Ctx<'_>, path: String) -> rquickjs::Result<u32> {
    let f = File::open(&path).map_err(|e| {
        Exception::throw_message(&ctx, &format!("readLines: {path}: {}", io_msg(&e)))
    })?;
    if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Exception::throw_message(
            &ctx,
            &format!("readLines: {path}: Is a directory"),
        ));
    }
    LINES.with(|l| {
        let mut l = l.borrow_mut();
        l.push(Some(BufReader::with_capacity(64 << 10, f)));
        Ok((l.len() - 1) as u32)
    })
}

/// The next batch of lines (without `\n` / `\r\n`), or undefined at the end.
fn lines_next(ctx: Ctx<'_>, handle: u32) -> rquickjs::Result<Option<Vec<String>>> {
    LINES.with(|l| {
        let mut l = l.borrow_mut();
        let Some(Some(r)) = l.get_mut(handle as usize) else {
            return Ok(None);
        };
        let mut lines = Vec::new();
        let mut bytes = 0;
        let mut buf = Vec::new();
        while lines.len() < LINES_BATCH && bytes < LINES_BATCH_BYTES {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    bytes += n;
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                        if buf.last() == Some(&b'\r') {
                            buf.pop();
                        }
                    }
                    lines.push(String::from_utf8_lossy(&buf).into_owned());
                }
                Err(e) => {
                    return Err(Exception::throw_message(
                        &ctx,
                        &format!("readLines: {}", io_msg(&e)),
                    ));
                }
            }
        }
        if lines.is_empty() {
            l[handle as usize] = None;
            return Ok(None);
        }
        Ok(Some(lines))
    })
}

fn lines_close(handle: u32) {
    LINES.with(|l| {
        if let Some(slot) = l.borrow_mut().get_mut(handle as usize) {
            *slot = None;
        }
    })
}

fn write_out(ctx: Ctx<'_>, name: String, text: String) -> rquickjs::Result<String> {
    if name.is_empty() || name.contains('/') || name.contains("..") || name.contains('\0') {
        let msg =
            format!("writeOut: invalid name {name:?}: a plain file name, without '/' or '..'");
        return Err(Exception::throw_type(&ctx, &msg));
    }
    let path = format!("{OUT_DIR}/{name}");
    std::fs::write(&path, text.as_bytes()).map_err(|e| {
        Exception::throw_message(&ctx, &format!("writeOut: {path}: {}", io_msg(&e)))
    })?;
    Ok(path)
}

fn native_exit(code: i32) {
    exit((code & 0xff) as u8)
}

fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    o.set("write", Function::new(ctx.clone(), write)?)?;
    o.set("readText", Function::new(ctx.clone(), read_text)?)?;
    o.set("linesOpen", Function::new(ctx.clone(), lines_open)?)?;
    o.set("linesNext", Function::new(ctx.clone(), lines_next)?)?;
    o.set("linesClose", Function::new(ctx.clone(), lines_close)?)?;
    o.set("writeOut", Function::new(ctx.clone(), write_out)?)?;
    o.set("exit", Function::new(ctx.clone(), native_exit)?)?;
    Ok(o)
}

/// Format a thrown value with the prelude's `inspect`.
fn inspect<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> String {
    let f = INSPECT
        .with(|i| i.borrow().clone())
        .and_then(|p| p.restore(ctx).ok());
    let s = f.and_then(|f| f.call::<_, String>((v.clone(), false)).ok());
    s.unwrap_or_else(|| "(a value that cannot be shown)".into())
}

/// `Uncaught Error: message` and the stack.
fn uncaught<'js>(ctx: &Ctx<'js>, v: Value<'js>, prefix: &str) -> String {
    if let Some(e) = v.as_exception() {
        let name: String = e.get("name").unwrap_or_else(|_| "Error".into());
        let message = e.message().unwrap_or_default();
        let stack = e.stack().unwrap_or_default();
        let stack = stack.trim_end_matches('\n');
        let mut s = format!("{prefix} {name}: {message}");
        if !stack.is_empty() {
            s.push('\n');
            s.push_str(stack);
        }
        s
    } else {
        format!("{prefix} {}", inspect(ctx, v))
    }
}

/// Runs the prelude; returns its `bind`.
fn setup<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Persistent<Function<'static>>> {
    let prelude: Function = ctx.eval(include_str!("prelude.js"))?;
    let exports: Object = prelude.call((natives(ctx)?,))?;
    let inspect: Function = exports.get("inspect")?;
    let bind: Function = exports.get("bind")?;
    INSPECT.with(|i| *i.borrow_mut() = Some(Persistent::save(ctx, inspect)));
    Ok(Persistent::save(ctx, bind))
}

/// Compile the script (3 on a syntax error), then run it (1 on an uncaught exception).
fn run_script(ctx: &Ctx<'_>, source: &str) -> Result<(), u8> {
    let raw = ctx.as_raw().as_ptr();
    let Ok(src) = CString::new(source) else {
        eprintln!("SyntaxError: the script contains a NUL character");
        return Err(3);
    };
    let filename = CString::new(SCRIPT).unwrap();
    let flags = (qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_COMPILE_ONLY) as i32;
    // SAFETY: valid context and NUL-terminated strings; the result is owned by us.
    let fun = unsafe {
        qjs::JS_Eval(
            raw,
            src.as_ptr(),
            source.len() as _,
            filename.as_ptr(),
            flags,
        )
    };
    if unsafe { qjs::JS_IsException(fun) } {
        let e = ctx.catch();
        let msg = match e.as_exception() {
            Some(x) => {
                let name: String = x.get("name").unwrap_or_else(|_| "SyntaxError".into());
                let stack = x.stack().unwrap_or_default();
                format!(
                    "{name}: {}\n{}",
                    x.message().unwrap_or_default(),
                    stack.trim_end_matches('\n')
                )
            }
            None => inspect(ctx, e),
        };
        eprintln!("{}", msg.trim_end());
        return Err(3);
    }
    // SAFETY: JS_EvalFunction takes ownership of `fun`; its result is owned by us.
    let result = unsafe { qjs::JS_EvalFunction(raw, fun) };
    if unsafe { qjs::JS_IsException(result) } {
        let e = ctx.catch();
        eprintln!("{}", uncaught(ctx, e, "Uncaught"));
        return Err(1);
    }
    // SAFETY: owned value, freed on drop
    drop(unsafe { Value::from_raw(ctx.clone(), result) });
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let source = match std::fs::read(SCRIPT) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(_) => {
                eprintln!("SyntaxError: the script is not valid UTF-8");
                return ExitCode::from(3);
            }
        },
        Err(e) => {
            eprintln!("javascript: cannot read {SCRIPT}: {e}");
            return ExitCode::from(1);
        }
    };
    let payloads = match std::fs::read_to_string(PAYLOADS_JSON) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("javascript: cannot read {PAYLOADS_JSON}: {e}");
            return ExitCode::from(1);
        }
    };

    let engine = match ENGINE.with(|e| e.borrow_mut().take()).map_or_else(new_engine, Ok) {
        Ok(engine) => engine,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(1);
        }
    };
    let Engine { rt, context, bind } = engine;

    let status = context.with(|ctx| {
        per_run(&ctx);
        let bound = bind
            .restore(&ctx)
            .and_then(|bind| bind.call::<_, ()>((payloads, args)));
        if let Err(e) = bound {
            let detail = match e {
                rquickjs::Error::Exception => {
                    uncaught(&ctx, ctx.catch(), "javascript: setup failed:")
                }
                e => format!("javascript: setup failed: {e}"),
            };
            eprintln!("{detail}");
            return Err(1);
        }
        run_script(&ctx, &source)
    });
    if let Err(code) = status {
        exit(code);
    }

    // promise jobs (async functions, then callbacks)
    loop {
        match rt.execute_pending_job() {
            Ok(true) => continue,
            Ok(false) => break,
            Err(job) => {
                let msg = job.0.with(|ctx| uncaught(&ctx, ctx.catch(), "Uncaught"));
                eprintln!("{msg}");
                exit(1);
            }
        }
    }
    let unhandled = REJECTIONS.with(|r| {
        r.borrow()
            .iter()
            .map(|(_, m)| m.clone())
            .collect::<Vec<_>>()
    });
    if let Some(msg) = unhandled.first() {
        eprintln!("{msg}");
        exit(1);
    }
    exit(0)
}
