//! A minimal wasmtime 48 host that runs one sandbox image the way Spillway's
//! host does, for `guest/test-images.mjs` (`SPILLWAY_TEST_HOST`):
//!
//!     spillway-testhost WASM SPILLWAY PAYLOADS TMP OUT ARGV0 [ARGS...]
//!
//! Preopens /spillway and /payloads read-only, /tmp and /out read-write; no
//! environment, empty stdin, inherited stdout/stderr; 8 MiB of wasm stack
//! (like src/sandbox/engine.rs). Exits with the guest's exit code, 101 on a trap.
//! Core modules run with WASI preview1, components as `wasi:cli/command`.
use wasmtime::component::{Component, Linker as ComponentLinker, ResourceTable};
use wasmtime::{Config, Engine, Linker, Module, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::bindings::sync::Command;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

const MAX_WASM_STACK: usize = 8 << 20;

struct State {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

fn wasi(a: &[String]) -> wasmtime::Result<WasiCtxBuilder> {
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdout().inherit_stderr().args(&a[6..]);
    b.preopened_dir(&a[2], "/spillway", FsPerms::ReadOnly)?;
    b.preopened_dir(&a[3], "/payloads", FsPerms::ReadOnly)?;
    b.preopened_dir(&a[4], "/tmp", FsPerms::ReadWrite)?;
    b.preopened_dir(&a[5], "/out", FsPerms::ReadWrite)?;
    Ok(b)
}

fn exit_code(e: wasmtime::Error) -> i32 {
    match e.downcast_ref::<I32Exit>() {
        Some(I32Exit(code)) => *code,
        None => {
            eprintln!("[testhost] trap: {e:?}");
            101
        }
    }
}

fn run(a: &[String]) -> wasmtime::Result<i32> {
    let mut cfg = Config::new();
    cfg.cache(Some(wasmtime::Cache::from_file(None)?));
    cfg.max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(MAX_WASM_STACK + (2 << 20));
    let engine = Engine::new(&cfg)?;
    let bytes = std::fs::read(&a[1])?;
    if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
        let module = Module::new(&engine, &bytes)?;
        let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
        p1::add_to_linker_sync(&mut linker, |t| t)?;
        let mut store = Store::new(&engine, wasi(a)?.build_p1());
        let instance = linker.instantiate(&mut store, &module)?;
        let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
        Ok(match start.call(&mut store, ()) {
            Ok(()) => 0,
            Err(e) => exit_code(e),
        })
    } else {
        let component = Component::new(&engine, &bytes)?;
        let mut linker = ComponentLinker::<State>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        let state = State {
            ctx: wasi(a)?.build(),
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&engine, state);
        let command = Command::instantiate(&mut store, &component, &linker)?;
        Ok(match command.wasi_cli_run().call_run(&mut store) {
            Ok(Ok(())) => 0,
            Ok(Err(())) => 1,
            Err(e) => exit_code(e),
        })
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        eprintln!("usage: spillway-testhost WASM SPILLWAY PAYLOADS TMP OUT ARGV0 [ARGS...]");
        std::process::exit(2);
    }
    // wasm frames run on this thread's stack: give it more than MAX_WASM_STACK
    let worker = std::thread::Builder::new().stack_size(MAX_WASM_STACK + (8 << 20));
    let code = worker
        .spawn(move || run(&a))
        .expect("thread")
        .join()
        .expect("join");
    match code {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("[testhost] {e:?}");
            std::process::exit(102);
        }
    }
}
