//! Code mode: scripts in a wasmtime sandbox. This is the only module that
//! names wasmtime.
//!
//! - `engine`: the engines (pooling, CoW images, epochs; fuel on demand).
//! - `images`: runtime images, their manifests and the compile cache.
//! - `modules`: callers' own modules: caps checked before compiling, and
//!   the compiled ones cached by hash within a memory budget.
//! - `workdir`: the per-exec directory (`/payloads`, `/spillway`, `/tmp`,
//!   `/out`), built through cap-std.
//! - `pipe`: capped stdout and stderr.
//! - `run`: one run in a fresh store, and how it ended.
//! - `cpu`: turns on the exec threads, shared by tenant, then session.
//! - [`limits`]: defaults, ceilings and clamping.
//! - [`outcome`]: the status and the message for the model.
//!
//! Guests run on a dedicated tokio runtime, so a script that spins never
//! holds a thread the RPC path needs; at most `max_concurrent_execs` run at
//! once, and at most `max_queued_execs` wait. Each tenant (a plain key the
//! caller passes in [`ExecSpec::tenant`]) has its own share of both, so one
//! tenant at its bound is refused while the others still run. Among the
//! running guests, turns on the CPU are shared max-min fairly by tenant,
//! then round-robin by session, so a tenant running many scripts slows
//! only itself.
//!
//! A caller's module is checked (size, function count, estimated compile
//! memory) before it is compiled, and compiled on a thread of its own at
//! exec priority, under a compile slot of its tenant and within the exec's
//! deadline; no lock is shared between tenants' compiles.

mod cpu;
mod engine;
mod images;
pub mod limits;
mod modules;
pub mod outcome;
mod pipe;
mod run;
mod workdir;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, Semaphore, watch};

use crate::fairness::{Bound, KeyedSlots, Refused};
use cpu::CpuShare;
use engine::{PoolSize, TickingEngine};
use images::{Artifact, Manifest};
use limits::ExecLimits;
use modules::{Key as ModuleKey, ModuleCache, Shape};
use run::{Linkers, Prepared, RunSpec, ScratchLimit};
use workdir::WorkRoot;

pub use engine::PERF_MAP_ENV;
pub use run::{Ending, RunOutcome};
pub use workdir::{ExecInput, OutFile};

/// The runtime that runs caller-supplied modules.
pub const WASM_RUNTIME: &str = "wasm";

/// Most emptied exec directories kept for reuse.
pub const MAX_SPARE_DIRS: usize = 64;

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
    /// Execs one tenant may run at once (0: all of `max_concurrent_execs`
    /// but a reserve of a quarter, at least one, that other tenants always
    /// find; a single-tenant server keeps most of its capacity).
    pub max_concurrent_execs_per_tenant: usize,
    /// Execs one tenant may have waiting (0: half of `max_queued_execs`,
    /// at least one); beyond this, that tenant gets `RESOURCE_EXHAUSTED`.
    pub max_queued_execs_per_tenant: usize,
    /// Callers' module compiles at once, server-wide.
    pub max_concurrent_compiles: usize,
    /// Callers' module compiles one tenant may run at once; more wait
    /// (within their exec's deadline).
    pub max_concurrent_compiles_per_tenant: usize,
    /// Estimated memory all compiles in progress may take together (each
    /// module is charged 32 bytes per byte of binary); a compile waits for
    /// room, and a module that alone needs more is refused.
    pub compile_memory_bytes: u64,
    /// Compiled caller modules kept for reuse, by their compiled size;
    /// least recently used out first.
    pub module_cache_bytes: u64,
    /// Most functions a caller's module (with every nested module) may
    /// define.
    pub max_module_functions: u64,
    /// Guests running at once on the CPU (default: one per core); their
    /// runtime has one thread more, for the work around them.
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
    /// Bytes of each linear memory a finished exec's pool slot keeps
    /// resident: the pages it dirtied, up to this much, are restored by a
    /// copy from the image instead of being unmapped, so the next exec in
    /// the slot does not fault them in again. Memory, not a quota: at most
    /// this much per warm memory slot stays resident.
    pub memory_keep_resident_bytes: u64,
    /// The same for each table (a runtime's function tables).
    pub table_keep_resident_bytes: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            images_dir: PathBuf::from("./sandbox-images"),
            cache_dir: None,
            max_concurrent_execs: 8,
            max_queued_execs: 64,
            max_concurrent_execs_per_tenant: 0,
            max_queued_execs_per_tenant: 0,
            max_concurrent_compiles: 2,
            max_concurrent_compiles_per_tenant: 1,
            compile_memory_bytes: 1 << 30,
            module_cache_bytes: 256 << 20,
            max_module_functions: 20_000,
            exec_threads: 0,
            exec_nice: 10,
            wasm_defaults: ExecLimits::DEFAULTS,
            max_stderr_bytes: 256 << 10,
            max_scratch_bytes: 256 << 20,
            max_scratch_entries: 10_000,
            max_source_bytes: 1 << 20,
            max_module_bytes: 16 << 20,
            max_args_bytes: 64 << 10,
            memory_keep_resident_bytes: 1 << 20,
            table_keep_resident_bytes: 0,
        }
    }
}

/// The most a pool slot may keep resident per memory or table: a bound well
/// past any useful reset size, and far below what wasmtime rounds to pages.
pub const MAX_KEEP_RESIDENT_BYTES: u64 = 1 << 30;

impl SandboxConfig {
    /// Checks the keys whose bad values would otherwise surface only as an
    /// engine error at startup, which names no key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            (
                "sandbox.memory_keep_resident_bytes",
                self.memory_keep_resident_bytes,
            ),
            (
                "sandbox.table_keep_resident_bytes",
                self.table_keep_resident_bytes,
            ),
        ] {
            if value > MAX_KEEP_RESIDENT_BYTES {
                return Err(format!(
                    "{key} = {value} is above its bound of {MAX_KEEP_RESIDENT_BYTES} (1 GiB); \
                     it is memory each warm pool slot holds, so use a few MiB at most"
                ));
            }
        }
        Ok(())
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
    /// Every slot is busy and the queue is full, server-wide or for the
    /// caller's tenant; the message names the limit.
    #[error("{message}")]
    Busy {
        /// What is full, which limit, and what to do.
        message: String,
    },
    /// A request field is too large.
    #[error("{what} is {size} {unit}, over the limit of {limit} {unit} ({key}); {hint}")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
        /// What is counted (`bytes`, `functions`).
        unit: &'static str,
        /// The config key (or request field) of the limit.
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
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Inputs, in order.
    pub inputs: Vec<ExecInput>,
    /// Resolved limits.
    pub limits: ExecLimits,
    /// The caller's tenant: the key of its share of exec and compile slots,
    /// of the CPU and of its compiled modules.
    pub tenant: String,
    /// The session: within its tenant's share of the CPU, sessions take
    /// turns.
    pub session: String,
}

/// A finished exec: the run, and the files it left in `/out`, open (the
/// exec directory itself is already removed).
pub struct Finished {
    /// The run.
    pub outcome: RunOutcome,
    /// Time spent removing the exec directory.
    pub cleanup: Duration,
    /// Time spent waiting: for a compile slot, then for an exec slot.
    pub queued: Duration,
    /// Time spent compiling the caller's module (zero on a cache hit).
    pub compile: Duration,
    /// Time spent finding the compiled image or module (hash, cache
    /// lookup), `compile` included.
    pub module: Duration,
    /// Time from the task's start on the exec runtime to its end: what is
    /// not in it of the caller's wait is the hop there and back.
    pub inside: Duration,
    /// Time spent building the exec directory.
    pub setup: Duration,
    /// `/tmp` plus `/out` usage at exit: charged bytes.
    pub scratch_bytes: u64,
    /// `/tmp` plus `/out` usage at exit: entries.
    pub scratch_entries: u64,
    /// The regular files directly under `/out`, opened, by name.
    pub out_files: Vec<OutFile>,
    /// What `/out` held that is not kept, in words.
    pub out_skipped: Vec<String>,
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

/// A compile's result, shared by every exec waiting for it: the linked
/// module, or why it does not compile; and how long it took.
type Compiled = Option<(Result<Arc<Prepared>, String>, Duration)>;

/// Compiles in progress, by key, for execs of the same module to join.
type InFlight = Arc<Mutex<HashMap<ModuleKey, watch::Receiver<Compiled>>>>;

/// How a caller's module became ready, or did not.
enum ModuleReady {
    /// Linked, after waiting `waited` for a slot and `compiling` for the
    /// compile (both zero on a cache hit).
    Ready {
        prepared: Arc<Prepared>,
        waited: Duration,
        compiling: Duration,
    },
    /// It does not compile or link.
    Invalid(String),
    /// The exec's deadline passed first.
    TimedOut {
        waited: Duration,
        compiling: Duration,
    },
}

/// The sandbox: engines, images, slots and the exec runtime.
pub struct Sandbox {
    cfg: SandboxConfig,
    cache_dir: PathBuf,
    main: Arc<EngineSet>,
    fuel: OnceCell<Arc<EngineSet>>,
    images: HashMap<String, Arc<Image>>,
    missing: HashMap<String, String>,
    work: WorkRoot,
    /// Execs running or waiting, per tenant and in all.
    admission: KeyedSlots,
    /// Execs running, per tenant and in all.
    running: KeyedSlots,
    /// Compiles of callers' modules, per tenant and in all.
    compiles: KeyedSlots,
    /// Estimated compile memory, in KiB.
    compile_memory: Arc<Semaphore>,
    modules: Arc<Mutex<ModuleCache<Arc<Prepared>>>>,
    in_flight: InFlight,
    guest_log: GuestLog,
    /// Turns on the exec runtime's threads, by tenant, then session.
    cpu: CpuShare,
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
            memory_keep_resident: cfg.memory_keep_resident_bytes,
            table_keep_resident: cfg.table_keep_resident_bytes,
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
        // Guests hold at most `threads` workers (one per turn, see `cpu`);
        // the one more polls everything else on this runtime (admissions,
        // exec directories, waiting guests) without waiting for a guest's
        // tick to end.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads + 1)
            .thread_name("sandbox-exec")
            .on_thread_start(move || lower_priority(nice))
            .enable_time()
            .build()?;
        let cache_dir = cfg
            .cache_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("cache").join("sandbox"));
        let queued = cfg.max_queued_execs;
        let per_tenant_running = match cfg.max_concurrent_execs_per_tenant {
            0 => concurrent.saturating_sub((concurrent / 4).max(1)).max(1),
            n => n,
        };
        let per_tenant_queued = match cfg.max_queued_execs_per_tenant {
            0 => queued.div_ceil(2).max(1),
            n => n,
        };
        let admission = KeyedSlots::new(
            Bound {
                limit: concurrent + queued,
                key: "sandbox.max_queued_execs",
            },
            Bound {
                limit: per_tenant_running + per_tenant_queued,
                key: "sandbox.max_queued_execs_per_tenant",
            },
        );
        let running = KeyedSlots::new(
            Bound {
                limit: concurrent,
                key: "sandbox.max_concurrent_execs",
            },
            Bound {
                limit: per_tenant_running,
                key: "sandbox.max_concurrent_execs_per_tenant",
            },
        );
        let compiles = KeyedSlots::new(
            Bound {
                limit: cfg.max_concurrent_compiles.max(1),
                key: "sandbox.max_concurrent_compiles",
            },
            Bound {
                limit: cfg.max_concurrent_compiles_per_tenant.max(1),
                key: "sandbox.max_concurrent_compiles_per_tenant",
            },
        );
        let compile_kib = usize::try_from(cfg.compile_memory_bytes >> 10)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Ok(Self {
            admission,
            running,
            compiles,
            compile_memory: Arc::new(Semaphore::new(compile_kib)),
            modules: Arc::new(Mutex::new(ModuleCache::new(cfg.module_cache_bytes))),
            in_flight: InFlight::default(),
            guest_log: GuestLog::default(),
            cpu: CpuShare::new(threads, cpu::STALE),
            work: WorkRoot::open(data_dir, concurrent.saturating_mul(2).min(MAX_SPARE_DIRS))?,
            cache_dir,
            main,
            fuel: OnceCell::new(),
            images,
            missing,
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
                size: spec.source.len() as u64,
                limit: c.max_source_bytes as u64,
                unit: "bytes",
                key: "sandbox.max_source_bytes",
                hint: "keep scripts small and read data from /payloads instead of embedding it",
            });
        }
        if spec.module.len() > c.max_module_bytes {
            return Err(SandboxError::TooLarge {
                what: "module",
                size: spec.module.len() as u64,
                limit: c.max_module_bytes as u64,
                unit: "bytes",
                key: "sandbox.max_module_bytes",
                hint: "build the module in release mode and strip it",
            });
        }
        let args: usize = spec.args.iter().map(|a| a.len() + 1).sum();
        if args > c.max_args_bytes {
            return Err(SandboxError::TooLarge {
                what: "args",
                size: args as u64,
                limit: c.max_args_bytes as u64,
                unit: "bytes",
                key: "sandbox.max_args_bytes",
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

    /// Runs one exec: admits it within its tenant's share (or fails fast),
    /// then on the exec runtime compiles its module if it brings one, waits
    /// for an exec slot, builds its directory and runs it.
    pub async fn exec(
        self: &Arc<Self>,
        spec: ExecSpec,
    ) -> Result<Result<Finished, String>, SandboxError> {
        self.check_request(&spec)?;
        let asked = Instant::now();
        let admitted = self
            .admission
            .try_acquire(&spec.tenant)
            .map_err(|r| self.busy(&r))?;
        let this = self.clone();
        let mut task = AbortOnDrop(self.handle().spawn(async move {
            let _admitted = admitted;
            this.exec_admitted(spec, asked).await
        }));
        // If the caller goes away (a cancelled RPC), dropping `task` stops
        // the guest and frees its slots at once.
        match (&mut task.0).await {
            Ok(r) => r,
            Err(e) => Err(SandboxError::Setup(format!("exec task failed: {e}"))),
        }
    }

    /// A refusal in words, naming the limit that refused.
    fn busy(&self, r: &Refused) -> SandboxError {
        let running = self.running.per_key().limit;
        let waiting = self.admission.per_key().limit - running;
        let message = match r {
            Refused::Key { .. } => format!(
                "your tenant already has {} code-mode scripts running or waiting, its share (sandbox.max_concurrent_execs_per_tenant = {running} running plus sandbox.max_queued_execs_per_tenant = {waiting} waiting); other tenants are not affected. Wait for some to finish, or run fewer at once",
                self.admission.per_key().limit
            ),
            Refused::Global { .. } => format!(
                "code mode is at capacity: {} scripts are running and {} are waiting (limits sandbox.max_concurrent_execs and sandbox.max_queued_execs); retry in a few seconds",
                self.running.held(),
                self.admission.held().saturating_sub(self.running.held())
            ),
            Refused::Closed => "code mode is shutting down; retry against another server".into(),
        };
        SandboxError::Busy { message }
    }

    async fn exec_admitted(
        &self,
        spec: ExecSpec,
        asked: Instant,
    ) -> Result<Result<Finished, String>, SandboxError> {
        let inside = Instant::now();
        let fuel = spec.limits.fuel > 0;
        let image = spec.runtime != WASM_RUNTIME;
        let mut queued = Duration::ZERO;
        let mut compile = Duration::ZERO;
        let prepared = if image {
            let img = self
                .images
                .get(&spec.runtime)
                .ok_or_else(|| self.unknown(&spec.runtime))?;
            self.prepared_image(img, fuel).await?
        } else {
            let deadline = asked + spec.limits.timeout();
            match self.prepared_module(&spec, fuel, deadline).await? {
                ModuleReady::Ready {
                    prepared,
                    waited,
                    compiling,
                } => {
                    queued += waited;
                    compile = compiling;
                    prepared
                }
                ModuleReady::Invalid(why) => return Ok(Err(why)),
                ModuleReady::TimedOut { waited, compiling } => {
                    let removed = Instant::now();
                    drop(
                        self.work
                            .create(&self.exec_id(), &spec.tenant, &spec.inputs, "")?,
                    );
                    let cleanup = removed.elapsed();
                    let outcome = RunOutcome {
                        ending: Ending::CompileTimedOut { waited, compiling },
                        stdout: Bytes::new(),
                        stderr: Bytes::new(),
                        wall: Duration::ZERO,
                        instantiate: Duration::ZERO,
                        peak_memory_bytes: 0,
                        fuel_consumed: 0,
                        denied_socket_calls: 0,
                        cpu_wait: Duration::ZERO,
                        scratch: Default::default(),
                    };
                    return Ok(Ok(Finished {
                        outcome,
                        cleanup,
                        queued: waited,
                        compile: compiling,
                        module: inside.elapsed().saturating_sub(waited),
                        inside: inside.elapsed(),
                        setup: Duration::ZERO,
                        scratch_bytes: 0,
                        scratch_entries: 0,
                        out_files: Vec::new(),
                        out_skipped: Vec::new(),
                        image,
                    }));
                }
            }
        };
        // Waiting for a compile slot is queueing, not finding the module.
        let module = inside.elapsed().saturating_sub(queued);
        let waiting = Instant::now();
        let _running = self
            .running
            .acquire(&spec.tenant)
            .await
            .map_err(|_| SandboxError::Setup("the sandbox is shutting down".into()))?;
        queued += waiting.elapsed();
        let script = if image { spec.source.as_str() } else { "" };
        let setup_started = Instant::now();
        let work =
            Arc::new(
                self.work
                    .create(&self.exec_id(), &spec.tenant, &spec.inputs, script)?,
            );
        let setup = setup_started.elapsed();
        let mut argv = Vec::with_capacity(spec.args.len() + 1);
        argv.push(if image {
            spec.runtime.clone()
        } else {
            "main".to_owned()
        });
        argv.extend(spec.args.iter().cloned());
        let scratch = self.scratch_limit();
        // The compile is part of the exec's own time.
        let mut limits = spec.limits;
        limits.timeout_ms = limits
            .timeout_ms
            .saturating_sub(compile.as_millis() as u64)
            .max(1);
        let run_spec = RunSpec {
            argv,
            limits,
            max_stderr_bytes: self.cfg.max_stderr_bytes,
            scratch,
            seat: self.cpu.seat(&spec.tenant, &spec.session),
        };
        let engine = self.engines(fuel).await?.engine.engine().clone();
        let outcome = run::run(&engine, &prepared, work.clone(), run_spec).await?;
        self.guest_log.note(&spec.tenant, &outcome);
        let usage = outcome.scratch;
        // Listed here, where blocking is fine, rather than after a hop to a
        // blocking pool; the files stay open, so the directory can go now:
        // emptied for the tenant's next exec (a few unlinks), or, after a
        // timeout, removed in the background. Nothing to list when the walk
        // at the end of the run saw no entry at all.
        let (out_files, out_skipped) = if usage.entries == 0 && usage.incomplete.is_none() {
            (Vec::new(), Vec::new())
        } else {
            work.out_files()?
        };
        let removed = Instant::now();
        if outcome.ending == Ending::TimedOut {
            work.discard();
            drop(self.spawn_blocking(move || drop(work)));
        } else {
            drop(work);
        }
        let cleanup = removed.elapsed();
        Ok(Ok(Finished {
            outcome,
            cleanup,
            queued,
            compile,
            module,
            inside: inside.elapsed(),
            setup,
            scratch_bytes: usage.bytes,
            scratch_entries: usage.entries,
            out_files,
            out_skipped,
            image,
        }))
    }

    fn exec_id(&self) -> String {
        format!(
            "x{}-{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The `/tmp` plus `/out` caps.
    pub fn scratch_limit(&self) -> ScratchLimit {
        ScratchLimit {
            bytes: self.cfg.max_scratch_bytes,
            entries: self.cfg.max_scratch_entries,
        }
    }

    /// Runs blocking work an exec caused (redacting and storing a large
    /// stdout, its `/out` files) on the exec runtime's blocking pool,
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

    /// A caller's module or WAT, linked: from the tenant's cache, from a
    /// compile of the same module already in progress, or compiled now on
    /// a thread of its own under a compile slot of the tenant and a share
    /// of the compile memory budget; all within `deadline`.
    async fn prepared_module(
        &self,
        spec: &ExecSpec,
        fuel: bool,
        deadline: Instant,
    ) -> Result<ModuleReady, SandboxError> {
        let bytes: &[u8] = if spec.module.is_empty() {
            spec.source.as_bytes()
        } else {
            &spec.module
        };
        let key: ModuleKey = (
            spec.tenant.clone(),
            hex::encode(Sha256::digest(bytes)),
            fuel,
        );
        if let Some(prepared) = self.lock_modules().get(&key) {
            return Ok(ModuleReady::Ready {
                prepared,
                waited: Duration::ZERO,
                compiling: Duration::ZERO,
            });
        }
        let joined = self.lock_in_flight().get(&key).cloned();
        let mut rx = match joined {
            Some(rx) => rx,
            None => {
                // Parsing WAT and scanning sections is CPU work, on the
                // exec runtime (not the RPC threads).
                let shape = match tokio::task::block_in_place(|| modules::shape(bytes)) {
                    Ok(s) => s,
                    Err(why) => return Ok(ModuleReady::Invalid(why)),
                };
                self.check_shape(&shape, &spec.limits)?;
                self.start_compile(key, shape, fuel, deadline).await?
            }
        };
        let waiting = Instant::now();
        let wait = rx.wait_for(|c| c.is_some());
        let result = match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(done)) => done.clone(),
            Ok(Err(_)) => None,
            Err(_) => {
                return Ok(ModuleReady::TimedOut {
                    waited: Duration::ZERO,
                    compiling: waiting.elapsed(),
                });
            }
        };
        match result {
            Some((Ok(prepared), took)) => Ok(ModuleReady::Ready {
                prepared,
                waited: waiting.elapsed().saturating_sub(took),
                compiling: took,
            }),
            Some((Err(why), _)) => Ok(ModuleReady::Invalid(why)),
            // The compile gave up waiting for a slot at its deadline.
            None => Ok(ModuleReady::TimedOut {
                waited: waiting.elapsed(),
                compiling: Duration::ZERO,
            }),
        }
    }

    /// Refuses a module over the caps, before any compile.
    fn check_shape(&self, shape: &Shape, limits: &ExecLimits) -> Result<(), SandboxError> {
        let c = &self.cfg;
        if shape.functions > c.max_module_functions {
            return Err(SandboxError::TooLarge {
                what: "module",
                size: shape.functions,
                limit: c.max_module_functions,
                unit: "functions",
                key: "sandbox.max_module_functions",
                hint: "split it, or drop unused code (wasm-opt, or a release build with LTO)",
            });
        }
        let memory = shape.compile_memory();
        if memory > limits.memory_bytes {
            return Err(SandboxError::TooLarge {
                what: "the module's estimated compile memory",
                size: memory,
                limit: limits.memory_bytes,
                unit: "bytes",
                key: "the exec's limits.memory_bytes",
                hint: "send a smaller module, or raise limits.memory_bytes",
            });
        }
        if memory > c.compile_memory_bytes {
            return Err(SandboxError::TooLarge {
                what: "the module's estimated compile memory",
                size: memory,
                limit: c.compile_memory_bytes,
                unit: "bytes",
                key: "sandbox.compile_memory_bytes",
                hint: "send a smaller module",
            });
        }
        Ok(())
    }

    /// Registers a compile of `key` and starts it in the background: it
    /// waits (until `deadline`) for a compile slot of the tenant and for
    /// room in the compile memory budget, then compiles on a thread of its
    /// own at exec priority. A compile that has started runs to its end
    /// (wasmtime cannot stop one), holding its slot, and its result is
    /// cached for the next exec.
    async fn start_compile(
        &self,
        key: ModuleKey,
        shape: Shape,
        fuel: bool,
        deadline: Instant,
    ) -> Result<watch::Receiver<Compiled>, SandboxError> {
        let (tx, rx) = watch::channel::<Compiled>(None);
        {
            let mut in_flight = self.lock_in_flight();
            if let Some(rx) = in_flight.get(&key) {
                return Ok(rx.clone());
            }
            in_flight.insert(key.clone(), rx.clone());
        }
        let set = self.engines(fuel).await?;
        let compiles = self.compiles.clone();
        let memory = self.compile_memory.clone();
        let cache = self.modules.clone();
        let in_flight = self.in_flight.clone();
        let nice = self.cfg.exec_nice.clamp(0, 19);
        let kib = u32::try_from(shape.compile_memory() >> 10)
            .unwrap_or(u32::MAX)
            .max(1);
        self.handle().spawn(async move {
            let slots = async {
                let slot = compiles.acquire(&key.0).await.ok()?;
                let mem = memory.acquire_many_owned(kib).await.ok()?;
                Some((slot, mem))
            };
            let Ok(Some((slot, mem))) = tokio::time::timeout_at(deadline.into(), slots).await
            else {
                // Nobody got to compile it in time: forget it (waiters see
                // the channel close).
                in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                return;
            };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "sandbox-compile".into())
                .start_handler(move |_| lower_priority(nice))
                .build();
            let job = move || {
                let _held = (slot, mem);
                let started = Instant::now();
                let compiled = compile(&set, &shape);
                let took = started.elapsed();
                let result = compiled.map(|(prepared, cost)| {
                    let prepared = Arc::new(prepared);
                    cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
                        key.clone(),
                        prepared.clone(),
                        cost,
                    );
                    prepared
                });
                in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                let _ = tx.send(Some((result, took)));
            };
            match pool {
                Ok(pool) => pool.spawn(job),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a compile thread");
                    // Compile here instead: still off the RPC threads.
                    tokio::task::block_in_place(job);
                }
            }
        });
        Ok(rx)
    }

    fn lock_modules(&self) -> std::sync::MutexGuard<'_, ModuleCache<Arc<Prepared>>> {
        self.modules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_in_flight(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ModuleKey, watch::Receiver<Compiled>>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Compiles and links a checked module; returns it with its cost in the
/// cache (its compiled image plus its binary).
fn compile(set: &EngineSet, shape: &Shape) -> Result<(Prepared, u64), String> {
    let kind = if shape.component {
        images::Kind::Component
    } else {
        images::Kind::Module
    };
    let artifact = Artifact::compile(set.engine.engine(), kind, &shape.binary)
        .map_err(|e| format!("{e:#}"))?;
    let image = artifact.image_len();
    let prepared = set
        .linkers
        .prepare(&artifact)
        .map_err(|e| format!("{e:#}"))?;
    Ok((prepared, (image + shape.binary.len()) as u64))
}

/// Guest-triggered events for the server log: one line per exec at most,
/// and at most [`GUEST_LOG_BURST`] lines per minute over all execs; what is
/// held back is counted into the next line.
#[derive(Debug, Default)]
struct GuestLog {
    state: Mutex<GuestLogState>,
}

#[derive(Debug, Default)]
struct GuestLogState {
    window: Option<Instant>,
    lines: u32,
    held_execs: u64,
    held_calls: u64,
}

/// Lines of guest events per minute.
const GUEST_LOG_BURST: u32 = 10;

impl GuestLog {
    fn note(&self, tenant: &str, outcome: &RunOutcome) {
        let calls = outcome.denied_socket_calls;
        if calls == 0 {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if s.window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(60))
        {
            s.window = Some(now);
            s.lines = 0;
        }
        if s.lines >= GUEST_LOG_BURST {
            s.held_execs += 1;
            s.held_calls = s.held_calls.saturating_add(calls);
            return;
        }
        s.lines += 1;
        let (held_execs, held_calls) = (s.held_execs, s.held_calls);
        s.held_execs = 0;
        s.held_calls = 0;
        drop(s);
        tracing::info!(
            tenant,
            denied_socket_calls = calls,
            held_back_execs = held_execs,
            held_back_calls = held_calls,
            "guest socket calls refused"
        );
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

fn wasmtime_version() -> &'static str {
    "48"
}
