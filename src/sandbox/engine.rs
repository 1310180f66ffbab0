//! The wasmtime engines: one for ordinary execs, and one with fuel metering
//! built on first use (fuel needs its own compiled code).
//!
//! Both use epoch interruption, driven by one ticker thread per engine, so a
//! running guest yields to the executor every tick and its wall deadline is
//! checked without signals. The main engine uses the pooling allocator with
//! copy-on-write memory images, so instantiating a 19 MB image is a few
//! page-table operations rather than a copy.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the granularity of timeouts, yields and
/// scratch-quota checks.
pub const TICK: Duration = Duration::from_millis(5);

/// Largest wasm stack a guest gets (CPython recurses deeply).
const MAX_WASM_STACK: usize = 8 << 20;

/// Sizes of the instance pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    /// Execs that may run at once.
    pub concurrent: u32,
    /// The largest memory any guest may have.
    pub max_memory_bytes: u64,
    /// Bytes of each linear memory a freed slot keeps resident.
    pub memory_keep_resident: u64,
    /// Bytes of each table a freed slot keeps resident.
    pub table_keep_resident: u64,
}

/// An engine and the thread that ticks its epoch.
#[derive(Debug)]
pub struct TickingEngine {
    engine: Engine,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl TickingEngine {
    /// The main engine: pooling allocator, CoW images, epochs.
    pub fn pooled(pool: PoolSize) -> wasmtime::Result<Self> {
        let mut cfg = base_config();
        let n = pool.concurrent.max(1);
        let mut p = PoolingAllocationConfig::default();
        // A componentize-py image has a few dozen core instances and a
        // handful of memories and tables; size the pool for `n` of those.
        p.total_component_instances(n * 2)
            .total_core_instances(n * 64)
            .total_memories(n * 8)
            .total_tables(n * 64)
            .total_stacks(n * 2)
            .max_core_instances_per_component(64)
            .max_memories_per_component(8)
            .max_tables_per_component(64)
            .max_memories_per_module(2)
            .max_tables_per_module(4)
            .table_elements(200_000)
            .max_core_instance_size(1 << 20)
            .max_component_instance_size(1 << 20)
            .max_memory_size(usize::try_from(pool.max_memory_bytes).unwrap_or(usize::MAX))
            .max_unused_warm_slots(n * 2)
            .linear_memory_keep_resident(
                usize::try_from(pool.memory_keep_resident).unwrap_or(usize::MAX),
            )
            .table_keep_resident(usize::try_from(pool.table_keep_resident).unwrap_or(usize::MAX))
            // Reset a freed slot by what the guest dirtied (Linux 6.7+'s
            // PAGEMAP_SCAN; without it, as before): a warm jq exec 1.31 ->
            // 1.18 ms, python 3.98 -> 3.67 ms (make bench's warm section, 3
            // alternating runs). The scan reports what was dirtied up to
            // the keep-resident size (and in at most 32 runs of pages);
            // the rest of the slot is unmapped, and faulted in again by
            // the next exec.
            .pagemap_scan(wasmtime::Enabled::Auto);
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(p));
        Self::start(Engine::new(&cfg)?)
    }

    /// The fuel engine: on-demand allocation (fuel requests are rare),
    /// fuel metering on.
    pub fn fueled() -> wasmtime::Result<Self> {
        let mut cfg = base_config();
        cfg.consume_fuel(true);
        Self::start(Engine::new(&cfg)?)
    }

    fn start(engine: Engine) -> wasmtime::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("sandbox-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(wasmtime::Error::new)?
        };
        Ok(Self {
            engine,
            stop,
            ticker: Some(ticker),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A stable fingerprint of everything that makes compiled code
    /// compatible with this engine (wasmtime version, target, settings):
    /// part of the on-disk cache key.
    pub fn fingerprint(&self) -> String {
        // `DefaultHasher::new` has fixed keys, so the value is stable across
        // processes of the same build; the wasmtime version and settings
        // are inside the compatibility hash itself.
        let mut h = std::hash::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        format!("{:016x}", h.finish())
    }
}

impl Drop for TickingEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

fn base_config() -> Config {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true)
        .memory_init_cow(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(MAX_WASM_STACK + (2 << 20))
        .parallel_compilation(true)
        .wasm_component_model(true);
    // A developer's switch, off by default: name the guests' compiled
    // functions in /tmp/perf-<pid>.map, so `perf report` shows them.
    if std::env::var_os(PERF_MAP_ENV).is_some() {
        cfg.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    cfg
}

/// Set (to anything) to write wasmtime's perf map (see `base_config`).
/// Not a config key: the config loader passes it by.
pub const PERF_MAP_ENV: &str = "SPILLWAY_WASM_PERF_MAP";
