//! Pre-initializes a sandbox image with Wizer (the `wasmtime-wizer` crate of
//! wasmtime 48): instantiates the module, calls its `wizer-initialize` export,
//! and writes a module whose memory and globals start where that call left
//! them. guest/build-images.sh runs it on the jq and javascript images:
//!
//!     cargo run --locked --example wizer -- IN.wasm OUT.wasm
//!
//! The initialization must not depend on the machine that builds the image:
//! every import traps, naming itself, except WASI's `clock_time_get`, which
//! reads a fixed time 0 (QuickJS reads the clock when it makes a context; the
//! image reseeds what it derived from it on every run), and `random_get`,
//! which gives zeros (Rust std's hash keys, for a `HashMap` in rquickjs). So
//! the output is a function of the input alone, and nothing of the host is in
//! the snapshot.

use std::process::ExitCode;

use wasmtime::{Caller, Config, Engine, Extern, Instance, Linker, Module, Store, Val};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

const INIT_FUNC: &str = "wizer-initialize";
/// WASI errnos.
const OK: i32 = 0;
const EFAULT: i32 = 21;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: wizer IN.wasm OUT.wasm");
        return ExitCode::from(2);
    };
    match wizen(input, output).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wizer: {input}: {e:?}");
            ExitCode::FAILURE
        }
    }
}

async fn wizen(input: &str, output: &str) -> wasmtime::Result<()> {
    let wasm = std::fs::read(input)?;
    let mut wizer = Wizer::new();
    wizer.init_func(INIT_FUNC);
    let (cx, instrumented) = wizer.instrument(&wasm)?;

    let engine = Engine::new(&Config::new())?;
    let module = Module::new(&engine, &instrumented)?;
    let mut linker: Linker<()> = Linker::new(&engine);
    for import in module.imports() {
        let (m, n) = (import.module().to_owned(), import.name().to_owned());
        let Some(ty) = import.ty().func().cloned() else {
            wasmtime::bail!("imports {m}::{n}, which is not a function");
        };
        let wasi = m == "wasi_snapshot_preview1";
        if wasi && n == "clock_time_get" {
            linker.func_wrap(&m, &n, fixed_clock)?;
        } else if wasi && n == "random_get" {
            linker.func_wrap(&m, &n, zero_random)?;
        } else {
            let what = format!("{m}::{n}");
            linker.func_new(&m, &n, ty, move |_, _, _| {
                wasmtime::bail!(
                    "{INIT_FUNC} called the import {what}: a snapshot must not depend on the host"
                )
            })?;
        }
    }
    let mut store = Store::new(&engine, ());
    let instance = linker.instantiate(&mut store, &module)?;
    let init = instance.get_typed_func::<(), ()>(&mut store, INIT_FUNC)?;
    init.call(&mut store, ())?;

    let snapshot = wizer
        .snapshot(
            &cx,
            &mut Snapshot {
                store: &mut store,
                instance,
            },
        )
        .await?;
    let tmp = format!("{output}.tmp");
    std::fs::write(&tmp, &snapshot)?;
    std::fs::rename(&tmp, output)?;
    eprintln!(
        "wizer: {input}: {} bytes -> {output}: {} bytes",
        wasm.len(),
        snapshot.len()
    );
    Ok(())
}

/// WASI preview1 `clock_time_get(id, precision, *time) -> errno`: time 0.
fn fixed_clock(mut caller: Caller<'_, ()>, _id: i32, _precision: i64, at: i32) -> i32 {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return EFAULT;
    };
    let at = at as u32 as usize;
    match memory.write(&mut caller, at, &0u64.to_le_bytes()) {
        Ok(()) => OK,
        Err(_) => EFAULT,
    }
}

/// WASI preview1 `random_get(*buf, len) -> errno`: zeros.
fn zero_random(mut caller: Caller<'_, ()>, at: i32, len: i32) -> i32 {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return EFAULT;
    };
    let zeros = vec![0u8; len as u32 as usize];
    match memory.write(&mut caller, at as u32 as usize, &zeros) {
        Ok(()) => OK,
        Err(_) => EFAULT,
    }
}

/// The instance's state, as Wizer reads it (globals and memories are exported
/// by name in the instrumented module).
struct Snapshot<'a> {
    store: &'a mut Store<()>,
    instance: Instance,
}

impl InstanceState for Snapshot<'_> {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let global = self
            .instance
            .get_global(&mut *self.store, name)
            .expect("wizer exports every global it snapshots");
        match global.get(&mut *self.store) {
            Val::I32(x) => SnapshotVal::I32(x),
            Val::I64(x) => SnapshotVal::I64(x),
            Val::F32(x) => SnapshotVal::F32(x),
            Val::F64(x) => SnapshotVal::F64(x),
            Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            other => panic!("a global of an unsupported type: {other:?}"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut *self.store, name)
            .expect("wizer exports every memory it snapshots");
        contents(memory.data(&*self.store))
    }
}
