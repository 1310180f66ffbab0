//! Running one guest: a fresh `Store` with its WASI context, memory
//! limiter, output pipes and epoch callback, then `_start` (modules) or
//! `wasi:cli/run` (components), and a classification of how it ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime::component::Linker as ComponentLinker;
use wasmtime::{Caller, Engine, InstancePre, Linker, ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder, WasiCtxView, WasiView};

use super::SandboxError;
use super::cpu::Seat;
use super::images::Artifact;
use super::limits::ExecLimits;
use super::pipe::{CappedPipe, OutputLimit};
use super::workdir::{Mount, Usage, WorkDir};

/// Shortest time between two checks of `/tmp` and `/out`.
const SCRATCH_CHECK_EVERY: Duration = Duration::from_millis(10);
/// A check that took `t` is followed by at least `t` times this much
/// running: a tree that is costly to walk is walked less often, so the
/// walks take at most a fifth of the exec's time.
const SCRATCH_CHECK_SPACING: u32 = 4;
/// Largest table a guest may grow to (elements).
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// How long past its deadline a guest blocked in a host call is given
/// before its future is dropped.
const HOST_CALL_GRACE: Duration = Duration::from_millis(250);

/// What a store holds.
pub struct Host {
    wasi: WasiP1Ctx,
    memory: MemoryLimiter,
    deadline: Instant,
    next_scratch_check: Instant,
    work: Arc<WorkDir>,
    scratch: ScratchLimit,
    timed_out: bool,
    scratch_over: Option<Usage>,
    instantiated: Option<Instant>,
    denied_socket_calls: u64,
    seat: Arc<Seat>,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.wasi.ctx()
    }
}

/// Caps on what a guest may leave in `/tmp` and `/out` together.
#[derive(Debug, Clone, Copy)]
pub struct ScratchLimit {
    /// Bytes.
    pub bytes: u64,
    /// Files, directories and links.
    pub entries: u64,
}

/// Counts linear memory across all of a store's memories.
#[derive(Debug)]
struct MemoryLimiter {
    limit: usize,
    total: usize,
    peak: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let next = self.total.saturating_sub(current).saturating_add(desired);
        if next > self.limit {
            // Refuse the growth: `memory.grow` returns -1 and the guest's
            // allocator reports out-of-memory its own way (CPython raises
            // MemoryError, Rust aborts). The flag decides the status.
            self.hit = true;
            return Ok(false);
        }
        self.total = next;
        self.peak = self.peak.max(next);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The linkers of one engine, with WASI preview1 and preview2 added.
pub struct Linkers {
    module: Linker<Host>,
    component: ComponentLinker<Host>,
}

impl Linkers {
    /// Links WASI into fresh linkers for `engine`.
    pub fn new(engine: &Engine) -> wasmtime::Result<Self> {
        let mut module = Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut module, |h: &mut Host| &mut h.wasi)?;
        deny_sockets(&mut module)?;
        let mut component = ComponentLinker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut component)?;
        Ok(Self { module, component })
    }

    /// Pre-links an artifact, so each exec only instantiates.
    pub fn prepare(&self, artifact: &Artifact) -> wasmtime::Result<Prepared> {
        match artifact {
            Artifact::Module(m) => {
                if m.get_export("_start").is_none() {
                    return Err(wasmtime::format_err!(
                        "the module exports no `_start` function; build it as a WASI command \
                         (for Rust: a bin crate built with --target wasm32-wasip1)"
                    ));
                }
                Ok(Prepared::Module(self.module.instantiate_pre(m)?))
            }
            Artifact::Component(c) => Ok(Prepared::Component(CommandPre::new(
                self.component.instantiate_pre(c)?,
            )?)),
        }
    }
}

/// WASI's `errno::notsock`.
const ERRNO_NOTSOCK: i32 = 57;

/// Replaces preview1's socket calls (wasmtime-wasi logs a warning on every
/// one, so a guest could write to the server log at will) with ones that
/// count the call in the store and return `notsock`: there are no sockets
/// in code mode. The exec reports the count once.
fn deny_sockets(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    const WASI: &str = "wasi_snapshot_preview1";
    fn deny(caller: &mut Caller<'_, Host>) -> i32 {
        let host = caller.data_mut();
        host.denied_socket_calls = host.denied_socket_calls.saturating_add(1);
        ERRNO_NOTSOCK
    }
    linker.allow_shadowing(true);
    linker.func_wrap(
        WASI,
        "sock_accept",
        |mut c: Caller<'_, Host>, _fd: i32, _flags: i32, _fd_out: i32| deny(&mut c),
    )?;
    linker.func_wrap(
        WASI,
        "sock_recv",
        |mut c: Caller<'_, Host>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| deny(&mut c),
    )?;
    linker.func_wrap(
        WASI,
        "sock_send",
        |mut c: Caller<'_, Host>, _: i32, _: i32, _: i32, _: i32, _: i32| deny(&mut c),
    )?;
    linker.func_wrap(
        WASI,
        "sock_shutdown",
        |mut c: Caller<'_, Host>, _fd: i32, _how: i32| deny(&mut c),
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A linked artifact, ready to instantiate.
#[derive(Clone)]
pub enum Prepared {
    /// A preview1 command module.
    Module(InstancePre<Host>),
    /// A `wasi:cli/command` component.
    Component(CommandPre<Host>),
}

/// Everything one run needs besides the code.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// argv, starting with the bare program name.
    pub argv: Vec<String>,
    /// The resolved limits.
    pub limits: ExecLimits,
    /// Bytes of stderr kept.
    pub max_stderr_bytes: usize,
    /// `/tmp` plus `/out` caps.
    pub scratch: ScratchLimit,
    /// Its place at the CPU, shared by tenant, then session.
    pub seat: Arc<Seat>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest exited with this code.
    Exited(i32),
    /// The wall-clock limit passed.
    TimedOut,
    /// The fuel ran out.
    OutOfFuel,
    /// A memory growth past the limit was refused, and the guest failed.
    MemoryLimit,
    /// stdout or stderr went past its cap.
    OutputLimit(&'static str),
    /// `/tmp` and `/out` went past their caps.
    ScratchLimit(Usage),
    /// A trap, or an instantiation failure, in words.
    Trapped(String),
    /// The caller's module was not compiled by the exec's deadline, after
    /// waiting so long for a compile slot and compiling so long; nothing
    /// ran.
    CompileTimedOut {
        /// Time waiting for a compile slot.
        waited: Duration,
        /// Time compiling.
        compiling: Duration,
    },
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// How it ended.
    pub ending: Ending,
    /// stdout, capped.
    pub stdout: Bytes,
    /// stderr, capped.
    pub stderr: Bytes,
    /// Wall time of instantiation plus run.
    pub wall: Duration,
    /// The part of `wall` spent building the WASI context, the store and
    /// the instance, before the guest's first instruction.
    pub instantiate: Duration,
    /// Peak linear memory.
    pub peak_memory_bytes: u64,
    /// Fuel consumed (zero without fuel).
    pub fuel_consumed: u64,
    /// Socket calls the guest made, each refused (never logged one by one).
    pub denied_socket_calls: u64,
    /// The part of `wall` spent waiting for a turn on the CPU while other
    /// guests ran.
    pub cpu_wait: Duration,
    /// What `/tmp` and `/out` held once the guest was done.
    pub scratch: Usage,
}

/// Runs `prepared` once in a fresh store.
pub async fn run(
    engine: &Engine,
    prepared: &Prepared,
    work: Arc<WorkDir>,
    spec: RunSpec,
) -> Result<RunOutcome, SandboxError> {
    let started = Instant::now();
    let limits = spec.limits;
    let stdout = CappedPipe::new(
        "stdout",
        usize::try_from(limits.max_stdout_bytes).unwrap_or(usize::MAX),
    );
    let stderr = CappedPipe::new("stderr", spec.max_stderr_bytes);

    let mut b = WasiCtxBuilder::new();
    // No environment, no stdin, no network: only what is set here.
    b.args(&spec.argv)
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        // The exec runtime is dedicated to guests, so file I/O may run on
        // its threads directly instead of hopping to the blocking pool.
        .allow_blocking_current_thread(true);
    for (mount, perms) in [
        (Mount::Payloads, FsPerms::ReadOnly),
        (Mount::Spillway, FsPerms::ReadOnly),
        (Mount::Tmp, FsPerms::ReadWrite),
        (Mount::Out, FsPerms::ReadWrite),
    ] {
        b.preopened_dir(work.preopen_path(mount), mount.guest_path(), perms)
            .map_err(|e| SandboxError::Setup(format!("preopen {}: {e}", mount.guest_path())))?;
    }
    let host = Host {
        wasi: b.build_p1(),
        memory: MemoryLimiter {
            limit: usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX),
            total: 0,
            peak: 0,
            hit: false,
        },
        deadline: started + limits.timeout(),
        next_scratch_check: started + SCRATCH_CHECK_EVERY,
        work,
        scratch: spec.scratch,
        timed_out: false,
        scratch_over: None,
        instantiated: None,
        denied_socket_calls: 0,
        seat: spec.seat.clone(),
    };
    let mut store = Store::new(engine, host);
    store.limiter(|h| &mut h.memory);
    if limits.fuel > 0 {
        store
            .set_fuel(limits.fuel)
            .map_err(|e| SandboxError::Setup(format!("fuel: {e}")))?;
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut cx| {
        let host = cx.data_mut();
        let now = Instant::now();
        if now >= host.deadline {
            host.timed_out = true;
            return Ok(UpdateDeadline::Interrupt);
        }
        if now >= host.next_scratch_check {
            let over = host.scratch_exceeded();
            let took = now.elapsed();
            host.next_scratch_check =
                Instant::now() + SCRATCH_CHECK_EVERY.max(took * SCRATCH_CHECK_SPACING);
            if let Some(over) = over {
                host.scratch_over = Some(over);
                return Ok(UpdateDeadline::Interrupt);
            }
        }
        // Hand the turn on if others wait for one (fair by tenant).
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(host.seat.clone().pass()),
        ))
    });

    let budget = limits.timeout() + HOST_CALL_GRACE;
    let first_turn_and_call = async {
        spec.seat.clone().take_turn().await;
        call(&mut store, prepared).await
    };
    let (result, store) = match tokio::time::timeout(budget, first_turn_and_call).await {
        Ok(r) => (Some(r), store),
        // Blocked in a host call past the deadline: the call is dropped.
        Err(_) => (None, store),
    };
    spec.seat.leave();
    let host = store.data();
    let fuel_consumed = if limits.fuel > 0 {
        limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0))
    } else {
        0
    };
    // What /tmp and /out hold now that the guest is done: one walk for the
    // limit check and the usage the exec reports.
    let scratch = host.work.usage(host.scratch.entries);
    let scratch_over = host.scratch_over.or_else(|| host.over(scratch));
    let ending = match result {
        None => Ending::TimedOut,
        Some(_) if host.timed_out => Ending::TimedOut,
        Some(_) if stdout.overflowed() => Ending::OutputLimit("stdout"),
        Some(_) if stderr.overflowed() => Ending::OutputLimit("stderr"),
        Some(_) if scratch_over.is_some() => Ending::ScratchLimit(scratch_over.unwrap_or_default()),
        Some(Ok(0)) => Ending::Exited(0),
        Some(_) if host.memory.hit => Ending::MemoryLimit,
        Some(Ok(code)) => Ending::Exited(code),
        Some(Err(e)) => classify_error(&e),
    };
    Ok(RunOutcome {
        ending,
        stdout: stdout.contents(),
        stderr: stderr.contents(),
        wall: started.elapsed(),
        instantiate: host
            .instantiated
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(started)),
        peak_memory_bytes: host.memory.peak as u64,
        fuel_consumed,
        denied_socket_calls: host.denied_socket_calls,
        cpu_wait: spec.seat.waited(),
        scratch,
    })
}

impl Host {
    /// The usage when it is over the limits (an incomplete walk is over).
    fn scratch_exceeded(&self) -> Option<Usage> {
        self.over(self.work.usage(self.scratch.entries))
    }

    /// `u`, when it is over the limits.
    fn over(&self, u: Usage) -> Option<Usage> {
        (u.bytes > self.scratch.bytes || u.incomplete.is_some()).then_some(u)
    }
}

/// Instantiates and runs; `Ok(exit code)` or the error that ended it.
async fn call(store: &mut Store<Host>, prepared: &Prepared) -> wasmtime::Result<i32> {
    let ran = match prepared {
        Prepared::Module(pre) => {
            let instance = pre.instantiate_async(&mut *store).await?;
            store.data_mut().instantiated = Some(Instant::now());
            let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
            start.call_async(&mut *store, ()).await.map(|()| 0)
        }
        Prepared::Component(pre) => {
            let command = pre.instantiate_async(&mut *store).await?;
            store.data_mut().instantiated = Some(Instant::now());
            command
                .wasi_cli_run()
                .call_run(&mut *store)
                .await
                .map(|r| if r.is_ok() { 0 } else { 1 })
        }
    };
    match ran {
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => Ok(exit.0),
            None => Err(e),
        },
        ok => ok,
    }
}

fn classify_error(e: &wasmtime::Error) -> Ending {
    if e.downcast_ref::<OutputLimit>().is_some() {
        // Unreachable in practice (the overflow flag is checked first).
        return Ending::OutputLimit("stdout");
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Ending::OutOfFuel,
        Some(Trap::Interrupt) => Ending::TimedOut,
        Some(trap) => Ending::Trapped(trap.to_string()),
        None => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("").trim();
            Ending::Trapped(first.chars().take(300).collect())
        }
    }
}
