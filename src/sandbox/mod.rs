//! Code mode: scripts in a wasmtime sandbox. This is the only module that
//! names wasmtime.
//!
//! - [`engine`]: the engines (pooling, CoW images, epochs; fuel on demand).
//! - [`images`]: runtime images, their manifests and the compile cache.
//! - [`workdir`]: the per-exec directory (`/payloads`, `/spillway`, `/tmp`,
//!   `/out`), built through cap-std.
//! - [`pipe`]: capped stdout and stderr.
//! - [`run`]: one run in a fresh store, and how it ended.
//! - [`limits`]: defaults, ceilings and clamping.
//! - [`outcome`]: the status and the message for the model.
//!
//! Guests run on a dedicated tokio runtime, so a script that spins never
//! holds a thread the RPC path needs; at most `max_concurrent_execs` run at
//! once, and at most `max_queued_execs` wait.

pub mod engine;
pub mod images;
pub mod limits;
pub mod outcome;
pub mod pipe;
pub mod run;
pub mod workdir;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, Semaphore};

use engine::{PoolSize, TickingEngine};
use images::{Artifact, Manifest};
use limits::ExecLimits;
use run::{Linkers, Prepared, RunOutcome, RunSpec, ScratchLimit};
use workdir::{ExecInput, WorkDir, WorkRoot};

/// The runtime that runs caller-supplied modules.
pub const WASM_RUNTIME: &str = "wasm";

/// The `[sandbox]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Where `make images` put the runtime images and manifests.
    pub images_dir: PathBuf,
    /// Compiled-image cache; default `<data_dir>/cache/sandbox`.
    pub cache_dir: Option<PathBuf>,
    /// Execs running at once, server-wide.
    pub max_concurrent_execs: usize,
    /// Execs waiting for a slot; beyond this, `RESOURCE_EXHAUSTED`.
    pub max_queued_execs: usize,
    /// Threads of the runtime that runs guests (default: one per core).
    pub exec_threads: usize,
    /// Nice value of those threads (Linux, 0–19): spinning scripts then
    /// yield the CPU to the RPC threads (default 10).
    pub exec_nice: i32,
    /// Limits of a `wasm` exec that names none.
    pub wasm_defaults: ExecLimits,
    /// Bytes of stderr kept.
    pub max_stderr_bytes: usize,
    /// Bytes `/tmp` and `/out` may hold together.
    pub max_scratch_bytes: u64,
    /// Files and directories `/tmp` and `/out` may hold together.
    pub max_scratch_entries: u64,
    /// Largest script source.
    pub max_source_bytes: usize,
    /// Largest caller-supplied module.
    pub max_module_bytes: usize,
    /// Largest argument list, in bytes.
    pub max_args_bytes: usize,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            images_dir: PathBuf::from("./sandbox-images"),
            cache_dir: None,
            max_concurrent_execs: 8,
            max_queued_execs: 64,
            exec_threads: 0,
            exec_nice: 10,
            wasm_defaults: ExecLimits::DEFAULTS,
            max_stderr_bytes: 256 << 10,
            max_scratch_bytes: 256 << 20,
            max_scratch_entries: 10_000,
            max_source_bytes: 1 << 20,
            max_module_bytes: 32 << 20,
            max_args_bytes: 64 << 10,
        }
    }
}

/// Sandbox failures that are not a script's own (those are results).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A runtime image is missing or broken.
    #[error("runtime image {name} is unavailable: {why}")]
    Image {
        /// Image name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// No such runtime.
    #[error("unknown runtime {0:?}; use one of: {1}")]
    UnknownRuntime(String, String),
    /// Every slot is busy and the queue is full.
    #[error(
        "code mode is at capacity: {running} scripts are running and {queued} are waiting (limits sandbox.max_concurrent_execs and sandbox.max_queued_execs); retry in a few seconds"
    )]
    Busy {
        /// Running execs.
        running: usize,
        /// Waiting execs.
        queued: usize,
    },
    /// A request field is too large.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes (sandbox.{key}); {hint}")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
        /// The config key.
        key: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// An input payload was deleted after the exec resolved it.
    #[error(
        "payload {0} was deleted while the exec was being set up; list the session's payloads and run the script again"
    )]
    InputGone(String),
    /// The sandbox could not be set up (host-side failure).
    #[error("could not set up the sandbox: {0}")]
    Setup(String),
    /// Host I/O.
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// One exec, as the API layer hands it over.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    /// Runtime name.
    pub runtime: String,
    /// Script source, or WAT text.
    pub source: String,
    /// A binary module or component (runtime `wasm`).
    pub module: Bytes,
    /// Arguments after argv[0].
    pub args: Vec<String>,
    /// Inputs, in order.
    pub inputs: Vec<ExecInput>,
    /// Resolved limits.
    pub limits: ExecLimits,
}

/// A finished exec: the run, and the directory holding `/out` until the
/// caller has kept what it wants.
pub struct Finished {
    /// The run.
    pub outcome: RunOutcome,
    /// The exec directory (removed on drop).
    pub work: Arc<WorkDir>,
    /// Time spent waiting for a slot.
    pub queued: Duration,
    /// Time spent building the exec directory.
    pub setup: Duration,
    /// `/tmp` plus `/out` usage at exit.
    pub scratch_bytes: u64,
    /// Whether the runtime is a built-in image (exit codes 2 and 3 mean
    /// invalid arguments or script).
    pub image: bool,
}

/// A runtime, as ListRuntimes shows it.
#[derive(Debug, Clone)]
pub struct RuntimeInfo {
    /// Name requests use.
    pub name: String,
    /// Language and version.
    pub language_version: String,
    /// For an LLM choosing a runtime.
    pub description: String,
    /// Default limits.
    pub default_limits: ExecLimits,
    /// Image hash (empty for `wasm`).
    pub sha256: String,
}

struct Image {
    manifest: Manifest,
    artifact: PathBuf,
    main: OnceCell<Arc<Prepared>>,
    fueled: OnceCell<Arc<Prepared>>,
}

/// An engine with its WASI linkers.
struct EngineSet {
    engine: TickingEngine,
    linkers: Linkers,
}

impl EngineSet {
    fn new(engine: TickingEngine) -> Result<Self, SandboxError> {
        let linkers = Linkers::new(engine.engine())
            .map_err(|e| SandboxError::Setup(format!("linker: {e}")))?;
        Ok(Self { engine, linkers })
    }
}

/// Caller modules compiled recently, by sha256 and engine.
const MODULE_CACHE: usize = 32;

/// The sandbox: engines, images, slots and the exec runtime.
pub struct Sandbox {
    cfg: SandboxConfig,
    cache_dir: PathBuf,
    main: Arc<EngineSet>,
    fuel: OnceCell<Arc<EngineSet>>,
    images: HashMap<String, Arc<Image>>,
    missing: HashMap<String, String>,
    work: WorkRoot,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    modules: Mutex<HashMap<(String, bool), Arc<Prepared>>>,
    /// One caller-module compile at a time: concurrent execs of the same
    /// new module then compile it once, and compiles cannot pile up.
    compiling: tokio::sync::Mutex<()>,
    runtime: Option<tokio::runtime::Runtime>,
    seq: AtomicUsize,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("images", &self.images.keys().collect::<Vec<_>>())
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Builds the engine, loads the image manifests (a missing image makes
    /// its runtime unavailable, with the reason), and clears leftovers of
    /// earlier execs. `ceiling` sizes the memory pool.
    pub fn open(
        cfg: SandboxConfig,
        data_dir: &Path,
        ceiling: ExecLimits,
    ) -> Result<Self, SandboxError> {
        let concurrent = cfg.max_concurrent_execs.max(1);
        let main = TickingEngine::pooled(PoolSize {
            concurrent: u32::try_from(concurrent).unwrap_or(u32::MAX),
            max_memory_bytes: ceiling.memory_bytes,
        })
        .map_err(|e| SandboxError::Setup(format!("engine: {e}")))?;
        let main = Arc::new(EngineSet::new(main)?);
        let mut images = HashMap::new();
        let mut missing = HashMap::new();
        for name in images::RUNTIMES {
            match images::load_manifest(&cfg.images_dir, name) {
                Ok((manifest, artifact)) => {
                    images.insert(
                        manifest.runtime.clone(),
                        Arc::new(Image {
                            manifest,
                            artifact,
                            main: OnceCell::new(),
                            fueled: OnceCell::new(),
                        }),
                    );
                }
                Err(e) => {
                    tracing::warn!(runtime = name, error = %e, "runtime unavailable");
                    let why = match e {
                        SandboxError::Image { why, .. } => why,
                        other => other.to_string(),
                    };
                    missing.insert((*name).to_owned(), why);
                }
            }
        }
        let threads = match cfg.exec_threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let nice = cfg.exec_nice.clamp(0, 19);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sandbox-exec")
            .on_thread_start(move || lower_priority(nice))
            .enable_time()
            .build()?;
        let cache_dir = cfg
            .cache_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("cache").join("sandbox"));
        Ok(Self {
            slots: Arc::new(Semaphore::new(concurrent)),
            work: WorkRoot::open(data_dir)?,
            cache_dir,
            main,
            fuel: OnceCell::new(),
            images,
            missing,
            waiting: AtomicUsize::new(0),
            modules: Mutex::new(HashMap::new()),
            compiling: tokio::sync::Mutex::new(()),
            runtime: Some(runtime),
            seq: AtomicUsize::new(0),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.cfg
    }

    /// Compiles (or loads from the cache) every image in the background, so
    /// the first exec of each does not pay for it.
    pub fn warm_up(self: &Arc<Self>) {
        let this = self.clone();
        self.handle().spawn(async move {
            let mut ready = 0;
            for image in this.images.values() {
                match this.prepared_image(image, false).await {
                    Ok(_) => ready += 1,
                    Err(e) => {
                        tracing::warn!(runtime = %image.manifest.runtime, error = %e, "image warm-up failed");
                    }
                }
            }
            tracing::info!(ready, images = this.images.len(), "code mode images ready");
        });
    }

    /// Compiles (or loads from the cache) every image now, and waits: for
    /// tools and tests that want a warm compile cache before they start.
    pub async fn prepare_all(self: &Arc<Self>) -> Result<(), SandboxError> {
        let this = self.clone();
        let task = self.handle().spawn(async move {
            for image in this.images.values() {
                this.prepared_image(image, false).await?;
            }
            Ok(())
        });
        task.await
            .map_err(|e| SandboxError::Setup(format!("image preparation failed: {e}")))?
    }

    /// The runtimes on offer.
    pub fn runtimes(&self) -> Vec<RuntimeInfo> {
        let mut out: Vec<RuntimeInfo> = self
            .images
            .values()
            .map(|i| RuntimeInfo {
                name: i.manifest.runtime.clone(),
                language_version: i.manifest.language_version.clone(),
                description: i.manifest.description.clone(),
                default_limits: i.manifest.default_limits,
                sha256: i.manifest.sha256.clone(),
            })
            .collect();
        out.sort_by_key(|r| images::RUNTIMES.iter().position(|n| *n == r.name));
        out.push(RuntimeInfo {
            name: WASM_RUNTIME.to_owned(),
            language_version: format!("WASI preview1 modules and wasi:cli/command components (wasmtime {})", wasmtime_version()),
            description: "Your own WebAssembly: a WASI command module as bytes (`module`) or WAT text (`source`), or a wasi:cli/command component. Inputs are under /payloads, scratch in /tmp, outputs in /out.".to_owned(),
            default_limits: self.cfg.wasm_defaults,
            sha256: String::new(),
        });
        out
    }

    /// Default limits of a runtime; an error names the runtimes on offer.
    pub fn defaults(&self, runtime: &str) -> Result<ExecLimits, SandboxError> {
        if runtime == WASM_RUNTIME {
            return Ok(self.cfg.wasm_defaults);
        }
        match self.images.get(runtime) {
            Some(i) => Ok(i.manifest.default_limits),
            None => Err(self.unknown(runtime)),
        }
    }

    fn unknown(&self, runtime: &str) -> SandboxError {
        if let Some(why) = self.missing.get(runtime) {
            return SandboxError::Image {
                name: runtime.to_owned(),
                why: why.clone(),
            };
        }
        let names: Vec<String> = self.runtimes().into_iter().map(|r| r.name).collect();
        SandboxError::UnknownRuntime(runtime.to_owned(), names.join(", "))
    }

    /// Validates sizes before anything is queued.
    pub fn check_request(&self, spec: &ExecSpec) -> Result<(), SandboxError> {
        let c = &self.cfg;
        if spec.source.len() > c.max_source_bytes {
            return Err(SandboxError::TooLarge {
                what: "source",
                size: spec.source.len(),
                limit: c.max_source_bytes,
                key: "max_source_bytes",
                hint: "keep scripts small and read data from /payloads instead of embedding it",
            });
        }
        if spec.module.len() > c.max_module_bytes {
            return Err(SandboxError::TooLarge {
                what: "module",
                size: spec.module.len(),
                limit: c.max_module_bytes,
                key: "max_module_bytes",
                hint: "build the module in release mode and strip it",
            });
        }
        let args: usize = spec.args.iter().map(|a| a.len() + 1).sum();
        if args > c.max_args_bytes {
            return Err(SandboxError::TooLarge {
                what: "args",
                size: args,
                limit: c.max_args_bytes,
                key: "max_args_bytes",
                hint: "put large values in a payload and read it from /payloads",
            });
        }
        if spec.runtime == WASM_RUNTIME {
            if spec.module.is_empty() == spec.source.trim().is_empty() {
                return Err(SandboxError::BadRequest(
                    "runtime wasm needs exactly one of `module` (binary) or `source` (WAT text)"
                        .into(),
                ));
            }
        } else {
            self.defaults(&spec.runtime)?;
            if !spec.module.is_empty() {
                return Err(SandboxError::BadRequest(format!(
                    "`module` is only for runtime wasm; runtime {} takes its script in `source`",
                    spec.runtime
                )));
            }
            if spec.source.trim().is_empty() {
                return Err(SandboxError::BadRequest(format!(
                    "`source` is empty: give the {} script to run",
                    spec.runtime
                )));
            }
        }
        Ok(())
    }

    /// Runs one exec: waits for a slot (or fails fast when the queue is
    /// full), builds its directory, runs it on the exec runtime.
    pub async fn exec(
        self: &Arc<Self>,
        spec: ExecSpec,
    ) -> Result<Result<Finished, String>, SandboxError> {
        self.check_request(&spec)?;
        let asked = Instant::now();
        let permit = {
            let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
            let guard = Waiting(&self.waiting);
            if self.slots.available_permits() == 0 && waiting >= self.cfg.max_queued_execs {
                drop(guard);
                return Err(SandboxError::Busy {
                    running: self.cfg.max_concurrent_execs,
                    queued: waiting,
                });
            }
            let permit = self
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| SandboxError::Setup("the sandbox is shutting down".into()))?;
            drop(guard);
            permit
        };
        let queued = asked.elapsed();
        let this = self.clone();
        let mut task = AbortOnDrop(self.handle().spawn(async move {
            let _permit = permit;
            this.exec_now(spec, queued).await
        }));
        // If the caller goes away (a cancelled RPC), dropping `task` stops
        // the guest and frees its slot at once.
        match (&mut task.0).await {
            Ok(r) => r,
            Err(e) => Err(SandboxError::Setup(format!("exec task failed: {e}"))),
        }
    }

    async fn exec_now(
        &self,
        spec: ExecSpec,
        queued: Duration,
    ) -> Result<Result<Finished, String>, SandboxError> {
        let fuel = spec.limits.fuel > 0;
        let image = spec.runtime != WASM_RUNTIME;
        let prepared = if image {
            let img = self
                .images
                .get(&spec.runtime)
                .ok_or_else(|| self.unknown(&spec.runtime))?;
            self.prepared_image(img, fuel).await?
        } else {
            match self
                .prepared_module(&spec.source, &spec.module, fuel)
                .await?
            {
                Ok(p) => p,
                Err(why) => return Ok(Err(why)),
            }
        };
        let id = format!(
            "x{}-{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        let script = if image { spec.source.as_str() } else { "" };
        let setup_started = Instant::now();
        let work = Arc::new(self.work.create(&id, &spec.inputs, script)?);
        let setup = setup_started.elapsed();
        let mut argv = Vec::with_capacity(spec.args.len() + 1);
        argv.push(if image {
            spec.runtime.clone()
        } else {
            "main".to_owned()
        });
        argv.extend(spec.args.iter().cloned());
        let scratch = self.scratch_limit();
        let run_spec = RunSpec {
            argv,
            limits: spec.limits,
            max_stderr_bytes: self.cfg.max_stderr_bytes,
            scratch,
        };
        let engine = self.engines(fuel).await?.engine.engine().clone();
        let outcome = run::run(&engine, &prepared, work.clone(), run_spec).await?;
        let scratch_bytes = work.usage(scratch.entries).map(|u| u.bytes).unwrap_or(0);
        Ok(Ok(Finished {
            outcome,
            work,
            queued,
            setup,
            scratch_bytes,
            image,
        }))
    }

    /// The `/tmp` plus `/out` caps.
    pub fn scratch_limit(&self) -> ScratchLimit {
        ScratchLimit {
            bytes: self.cfg.max_scratch_bytes,
            entries: self.cfg.max_scratch_entries,
        }
    }

    /// Runs blocking work an exec caused (storing its stdout and `/out`
    /// files, removing its directory) on the exec runtime's blocking pool,
    /// whose threads run at the exec priority: a session that floods its
    /// output pays for it at exec priority, not at the RPC threads' expense.
    /// The pool keeps tokio's default bound (512 threads): guests' WASI file
    /// streams use it too, and must not queue behind this work.
    pub fn spawn_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.handle().spawn_blocking(f)
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the exec runtime lives as long as the sandbox")
            .handle()
            .clone()
    }

    /// The main engine, or the fuel engine (built on first use).
    async fn engines(&self, fuel: bool) -> Result<Arc<EngineSet>, SandboxError> {
        if !fuel {
            return Ok(self.main.clone());
        }
        self.fuel
            .get_or_try_init(|| async {
                let engine = TickingEngine::fueled()
                    .map_err(|e| SandboxError::Setup(format!("fuel engine: {e}")))?;
                Ok(Arc::new(EngineSet::new(engine)?))
            })
            .await
            .cloned()
    }

    async fn prepared_image(
        &self,
        image: &Arc<Image>,
        fuel: bool,
    ) -> Result<Arc<Prepared>, SandboxError> {
        let cell = if fuel { &image.fueled } else { &image.main };
        cell.get_or_try_init(|| async {
            let set = self.engines(fuel).await?;
            // Compilation is CPU-bound: run it where blocking is fine.
            let compiled = tokio::task::block_in_place(|| {
                images::compile_cached(
                    &set.engine,
                    &image.manifest,
                    &image.artifact,
                    &self.cache_dir,
                )
            })?;
            let prepared = set
                .linkers
                .prepare(&compiled)
                .map_err(|e| SandboxError::Image {
                    name: image.manifest.name.clone(),
                    why: format!("does not link against WASI: {e}"),
                })?;
            Ok(Arc::new(prepared))
        })
        .await
        .cloned()
    }

    /// Compiles a caller's module or WAT; `Ok(Err(why))` when it does not
    /// compile or link (an invalid script, reported as a result).
    async fn prepared_module(
        &self,
        source: &str,
        module: &Bytes,
        fuel: bool,
    ) -> Result<Result<Arc<Prepared>, String>, SandboxError> {
        let bytes: &[u8] = if module.is_empty() {
            source.as_bytes()
        } else {
            module
        };
        let key = (hex::encode(Sha256::digest(bytes)), fuel);
        if let Some(p) = self.lock_modules().get(&key) {
            return Ok(Ok(p.clone()));
        }
        let _compiling = self.compiling.lock().await;
        if let Some(p) = self.lock_modules().get(&key) {
            return Ok(Ok(p.clone()));
        }
        let set = self.engines(fuel).await?;
        let engine = &set.engine;
        let compiled = tokio::task::block_in_place(|| {
            if is_component(bytes) {
                wasmtime::component::Component::new(engine.engine(), bytes).map(Artifact::Component)
            } else {
                wasmtime::Module::new(engine.engine(), bytes).map(Artifact::Module)
            }
        });
        let prepared = match compiled.and_then(|a| set.linkers.prepare(&a)) {
            Ok(p) => Arc::new(p),
            Err(e) => return Ok(Err(format!("{e:#}"))),
        };
        let mut cache = self.lock_modules();
        if cache.len() >= MODULE_CACHE {
            cache.clear();
        }
        cache.insert(key, prepared.clone());
        Ok(Ok(prepared))
    }

    fn lock_modules(&self) -> std::sync::MutexGuard<'_, HashMap<(String, bool), Arc<Prepared>>> {
        self.modules.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Dropping a runtime inside an async context panics; this does not
        // wait for guests, which the epoch deadline ends anyway.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Lowers the calling thread's scheduling priority. On Linux,
/// `setpriority(PRIO_PROCESS, 0, …)` applies to the calling thread only.
fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: a plain syscall on the calling thread; failure only leaves
    // the priority as it was.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        tracing::debug!(nice, "could not lower the exec thread's priority");
    }
}

/// A task handle that aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether bytes are a component: binary layer 1, or WAT `(component`.
fn is_component(bytes: &[u8]) -> bool {
    if bytes.starts_with(b"\0asm") {
        return bytes.get(6..8) == Some(&[1, 0]);
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]);
    let mut rest = text.trim_start();
    // Skip line comments before the first form.
    while let Some(r) = rest.strip_prefix(";;") {
        rest = r.split_once('\n').map_or("", |x| x.1).trim_start();
    }
    rest.starts_with("(component")
}

fn wasmtime_version() -> &'static str {
    "48"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_told_apart_from_modules() {
        assert!(is_component(b"\0asm\x0d\0\x01\0"));
        assert!(!is_component(b"\0asm\x01\0\0\0"));
        assert!(is_component(b";; a comment\n  (component)"));
        assert!(!is_component(b"(module (func))"));
    }
}
