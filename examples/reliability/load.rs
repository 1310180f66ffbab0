//! Load, and load with a hostile neighbour.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use spillway::proto::{self, ExecStatus};
use tonic::Code;

use crate::harness::*;

/// What one load run measured.
#[derive(Clone)]
pub struct LoadRun {
    pub secs: f64,
    pub ops: u64,
    pub stats: BTreeMap<&'static str, RpcStats>,
    pub peak_rss: u64,
    pub hwm: u64,
    /// Each timed Exec's server-side parts, from its `ExecUsage`.
    pub exec_parts: Vec<ExecParts>,
}

/// Where an Exec's server time went (µs): waiting for an exec slot, waiting
/// for a turn on the CPU while running, the run itself (CPU wait included),
/// and all of it.
#[derive(Clone, Copy, Default)]
pub struct ExecParts {
    pub queue: u64,
    pub cpu_wait: u64,
    pub run: u64,
    pub server: u64,
}

impl LoadRun {
    /// The p50 of each Exec part, in words.
    pub fn exec_parts_p50(&self) -> String {
        let p50 = |f: fn(&ExecParts) -> u64| {
            let mut v: Vec<u64> = self.exec_parts.iter().map(f).collect();
            v.sort_unstable();
            ms(pct(&v, 50.0))
        };
        format!(
            "Exec server-side p50: queue {}, run {} (of which waiting for a CPU turn {}), server {}",
            p50(|p| p.queue),
            p50(|p| p.run),
            p50(|p| p.cpu_wait),
            p50(|p| p.server)
        )
    }

    pub fn p99(&self, rpc: &str) -> u64 {
        self.stats
            .get(rpc)
            .map(|s| {
                let mut v = s.micros.clone();
                v.sort_unstable();
                pct(&v, 99.0)
            })
            .unwrap_or(0)
    }

    /// Errors other than RESOURCE_EXHAUSTED, and the count of those.
    pub fn errors(&self) -> (Vec<String>, u64) {
        let mut bad = Vec::new();
        let mut exhausted = 0;
        for (rpc, s) in &self.stats {
            for (e, n) in &s.errors {
                if e.starts_with("ResourceExhausted") {
                    exhausted += n;
                } else {
                    bad.push(format!("{rpc}: {n} × {e}"));
                }
            }
        }
        (bad, exhausted)
    }

    pub fn table(&self, title: &str) -> String {
        let mut t = format!(
            "\n**{title}**: {} calls in {:.0} s = {:.0} calls/s; server peak RSS {} (VmHWM {})\n\n\
             | RPC | calls | p50 | p99 | max | RESOURCE_EXHAUSTED | other errors |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.ops,
            self.secs,
            self.ops as f64 / self.secs,
            mib(self.peak_rss),
            mib(self.hwm)
        );
        for (rpc, s) in &self.stats {
            let mut v = s.micros.clone();
            v.sort_unstable();
            let exhausted: u64 = s
                .errors
                .iter()
                .filter(|(e, _)| e.starts_with("ResourceExhausted"))
                .map(|(_, n)| n)
                .sum();
            let other: u64 = s.errors.values().sum::<u64>() - exhausted;
            t.push_str(&format!(
                "| {rpc} | {} | {} | {} | {} | {exhausted} | {other} |\n",
                v.len(),
                ms(pct(&v, 50.0)),
                ms(pct(&v, 99.0)),
                ms(v.last().copied().unwrap_or(0)),
            ));
        }
        t
    }
}

/// An NDJSON payload of about `bytes`, with a findable word on some lines.
fn seed_payload(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 200);
    let mut i = 0u64;
    while out.len() < bytes {
        let status = ["ok", "error", "retry"][(i % 3) as usize];
        let word = if i.is_multiple_of(97) {
            "needle"
        } else {
            "hay"
        };
        out.extend_from_slice(
            format!(
                "{{\"id\":{i},\"status\":\"{status}\",\"ms\":{},\"msg\":\"{word} request handled by worker {}\"}}\n",
                i * 7 % 1000,
                i % 16
            )
            .as_bytes(),
        );
        i += 1;
    }
    out
}

/// Which window a load client's call falls in: the hostile scenario
/// alternates windows without and with the attack on one server, so that
/// both are measured in the same minutes (a drift in the shared machine's
/// load then weighs on both alike).
pub struct Phases {
    now: AtomicU8,
    /// Calls made wholly inside a quiet window ([`QUIET`]) and wholly
    /// inside an attacked one ([`ATTACKED`]).
    recs: [Recorder; 2],
    /// The parts of Execs made wholly inside a window, by window.
    exec_parts: [std::sync::Mutex<Vec<ExecParts>>; 2],
}

/// No attack runs: calls count for the no-attack figures.
const QUIET: u8 = 0;
/// The attack runs at full force: calls count for the attacked figures.
const ATTACKED: u8 = 1;
/// The attack is starting or draining: calls are made but not timed.
const GAP: u8 = 2;
/// The clients stop.
const DONE: u8 = 3;

impl Phases {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            now: AtomicU8::new(QUIET),
            recs: [Recorder::default(), Recorder::default()],
            exec_parts: Default::default(),
        })
    }

    fn set(&self, phase: u8) {
        self.now.store(phase, Ordering::SeqCst);
    }

    fn get(&self) -> u8 {
        self.now.load(Ordering::SeqCst)
    }

    /// Records a call that started in phase `before` and ended in `after`.
    /// Its time counts only when both are the same timed window; an error
    /// always counts, in the attacked figures unless the call was wholly
    /// quiet.
    fn record(&self, before: u8, after: u8, rpc: &'static str, r: Result<Duration, tonic::Status>) {
        let wholly = (before == after).then_some(before);
        match r {
            Ok(took) => {
                if let Some(p @ (QUIET | ATTACKED)) = wholly {
                    self.recs[p as usize].ok(rpc, took);
                }
            }
            Err(e) => {
                let p = if wholly == Some(QUIET) {
                    QUIET
                } else {
                    ATTACKED
                };
                self.recs[p as usize].err(rpc, &e);
            }
        }
    }

    /// Keeps an Exec's parts when it ran wholly inside a timed window.
    fn exec_parts(&self, before: u8, after: u8, parts: ExecParts) {
        if before == after && (before == QUIET || before == ATTACKED) {
            let mut v = self.exec_parts[before as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            v.push(parts);
        }
    }

    fn run(&self, phase: u8, secs: f64, peak_rss: u64, hwm: u64) -> LoadRun {
        let rec = &self.recs[phase as usize];
        let exec_parts = self.exec_parts[phase as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        LoadRun {
            secs,
            ops: rec.ops.load(Ordering::Relaxed),
            stats: rec.snapshot(),
            peak_rss,
            hwm,
            exec_parts,
        }
    }
}

/// The load's target payloads: one per session, warmed up.
async fn prepare(server: &Server) -> Result<Arc<Vec<(String, String)>>> {
    let sessions = 8;
    let mut targets = Vec::new();
    let mut p = server.payloads().await?;
    for _ in 0..sessions {
        let sid = server.session(None).await?;
        let payload = upload(&mut p, &sid, "seed.ndjson", &seed_payload(256 << 10)).await?;
        targets.push((sid, payload.id));
    }
    // Warm up before the clock starts: the first Inspect of a payload infers
    // its structure (later ones hit the cache), and the first jq exec loads
    // the image. With 8 targets, those 8 cold calls would otherwise be the
    // p99 of any run with fewer than 800 Inspects, whatever else happened.
    let mut x = server.codemode().await?;
    for (sid, pid) in &targets {
        p.inspect(proto::PayloadRequest {
            payload_id: pid.clone(),
        })
        .await?;
        x.exec(proto::ExecRequest {
            session_id: sid.clone(),
            runtime: "jq".into(),
            source: "length".into(),
            inputs: vec![pid.clone()],
            ..Default::default()
        })
        .await?;
    }
    Ok(Arc::new(targets))
}

/// Starts `clients` load clients mixing Offload, Read, Search, Inspect and
/// Exec against `server`, each recording into `phases` until it says
/// [`DONE`].
async fn spawn_clients(
    server: &Server,
    clients: usize,
    seed: u64,
    targets: Arc<Vec<(String, String)>>,
    phases: Arc<Phases>,
) -> Result<tokio::task::JoinSet<()>> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let channel = server.channel().await?;
        let targets = targets.clone();
        let phases = phases.clone();
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (c as u64) << 32);
            let mut p = payloads_on(channel.clone());
            let mut x = codemode_on(channel);
            let (sid, pid) = targets[c % targets.len()].clone();
            let mut n = 0u64;
            loop {
                let before = phases.get();
                if before == DONE {
                    break;
                }
                n += 1;
                let op = rng.random_range(0..100u32);
                let t = Instant::now();
                let (rpc, r): (&'static str, Result<(), tonic::Status>) = match op {
                    0..25 => {
                        let big: String = "offloaded tool output line\n".repeat(160);
                        let req = proto::OffloadRequest {
                            session_id: sid.clone(),
                            turn: n as u32,
                            results: vec![
                                proto::ToolResult {
                                    tool_call_id: format!("c{c}-{n}-a"),
                                    tool_name: "load".into(),
                                    content: b"small result".to_vec().into(),
                                    ..Default::default()
                                },
                                proto::ToolResult {
                                    tool_call_id: format!("c{c}-{n}-b"),
                                    tool_name: "load".into(),
                                    content: big.into_bytes().into(),
                                    ..Default::default()
                                },
                            ],
                            settings: Some(proto::OffloadSettings {
                                per_call_tokens: Some(500),
                                aggregate_tokens: Some(1000),
                                ..Default::default()
                            }),
                        };
                        ("Offload", p.offload(req).await.map(|_| ()))
                    }
                    25..50 => {
                        let start = rng.random_range(1..2000u64);
                        let req = proto::ReadRequest {
                            payload_id: pid.clone(),
                            max_bytes: 16 << 10,
                            range: Some(proto::read_request::Range::LineRange(proto::LineRange {
                                start_line: start,
                                end_line: start + 50,
                            })),
                        };
                        ("Read", p.read(req).await.map(|_| ()))
                    }
                    50..70 => {
                        let req = proto::SearchRequest {
                            session_id: sid.clone(),
                            payload_ids: vec![pid.clone()],
                            pattern: "needle".into(),
                            fixed_string: true,
                            max_matches: 20,
                            ..Default::default()
                        };
                        ("Search", p.search(req).await.map(|_| ()))
                    }
                    70..85 => {
                        let req = proto::PayloadRequest {
                            payload_id: pid.clone(),
                        };
                        ("Inspect", p.inspect(req).await.map(|_| ()))
                    }
                    _ => {
                        let req = proto::ExecRequest {
                            session_id: sid.clone(),
                            runtime: "jq".into(),
                            source: "select(.status == \"error\") | .id".into(),
                            inputs: vec![pid.clone()],
                            ..Default::default()
                        };
                        let r = x.exec(req).await.and_then(|r| {
                            let r = r.into_inner();
                            let u = r.usage.unwrap_or_default();
                            phases.exec_parts(
                                before,
                                phases.get(),
                                ExecParts {
                                    queue: u.queue_us,
                                    cpu_wait: u.cpu_wait_us,
                                    run: u.run_us,
                                    server: u.server_us,
                                },
                            );
                            if r.status == ExecStatus::Ok as i32 {
                                Ok(())
                            } else {
                                Err(tonic::Status::unknown(format!(
                                    "exec status {}: {}",
                                    r.status, r.message
                                )))
                            }
                        });
                        ("Exec", r)
                    }
                };
                let took = t.elapsed();
                phases.record(before, phases.get(), rpc, r.map(|()| took));
            }
        });
    }
    Ok(tasks)
}

/// 64 clients (16 in smoke) mixing Offload, Read, Search, Inspect and Exec
/// against `server` for `duration`.
pub async fn run_load(
    server: &Server,
    clients: usize,
    duration: Duration,
    seed: u64,
) -> Result<LoadRun> {
    let targets = prepare(server).await?;
    let phases = Phases::new();
    let sampler = RssSampler::start(server.pid());
    let started = Instant::now();
    let mut tasks = spawn_clients(server, clients, seed, targets, phases.clone()).await?;
    tokio::time::sleep(duration).await;
    phases.set(DONE);
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    let secs = started.elapsed().as_secs_f64();
    let peak_rss = sampler.stop();
    let (_, hwm) = server.rss();
    Ok(phases.run(QUIET, secs, peak_rss, hwm))
}

pub fn load_params(opts: &Opts) -> (usize, Duration) {
    // 40 s even in smoke: each p99 needs enough calls that a passing stall
    // of the shared machine (a second of slow fsyncs) stays under the 1%
    // it measures. At 20 s, with about 900 calls per RPC, one such stall
    // made the 2x comparison fail once in seven runs on a debug build.
    if opts.smoke {
        (16, Duration::from_secs(40))
    } else {
        (64, Duration::from_secs(60))
    }
}

pub async fn load(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("load");
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let config = write_config(opts, dir.path(), "")?;
    let server = Server::start(
        opts,
        &config,
        &dir.path().join("data"),
        &dir.path().join("log"),
    )
    .await?;
    let (clients, duration) = load_params(opts);
    let run = run_load(&server, clients, duration, opts.seed).await?;
    let (bad, exhausted) = run.errors();
    out.figure(format!(
        "{clients} clients, {:.0} s: {:.0} calls/s",
        run.secs,
        run.ops as f64 / run.secs
    ));
    for rpc in ["Offload", "Read", "Search", "Inspect", "Exec"] {
        let mut v = run
            .stats
            .get(rpc)
            .map(|s| s.micros.clone())
            .unwrap_or_default();
        v.sort_unstable();
        out.figure(format!(
            "{rpc} p50/p99/max {}/{}/{}",
            ms(pct(&v, 50.0)),
            ms(pct(&v, 99.0)),
            ms(v.last().copied().unwrap_or(0))
        ));
        out.check(!v.is_empty(), format!("{rpc} succeeded {} times", v.len()));
    }
    out.figure(run.exec_parts_p50());
    out.figure(format!("peak RSS {}", mib(run.peak_rss.max(run.hwm))));
    out.figure(format!("{exhausted} RESOURCE_EXHAUSTED"));
    out.check(
        bad.is_empty(),
        format!("no error but RESOURCE_EXHAUSTED ({})", bad.join("; ")),
    );
    out.detail = run.table("Load");
    for l in server.log_problems() {
        out.notes.push(format!("server log: {l}"));
    }
    Ok(out)
}

/// The hostile session's attacks: an infinite loop, a memory bomb, and a
/// 100 MB stdout flood.
pub const ATTACKS: [&str; 3] = ["loop", "bomb", "flood"];

/// The same load on one server, in windows alternately without and with
/// one hostile session running infinite loops, memory bombs and 100 MB
/// stdout floods in parallel (or those of `--attacks`): quiet, attacked,
/// attacked, quiet, and again, so that a drift in the shared machine's
/// load weighs on both sides alike. Each side gets `duration` in all.
pub async fn hostile(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("hostile");
    let (clients, duration) = load_params(opts);
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let config = write_config(opts, dir.path(), "")?;
    let server = Server::start(
        opts,
        &config,
        &dir.path().join("data"),
        &dir.path().join("log"),
    )
    .await?;
    let hostile_sid = server.session(None).await?;
    let mut p = server.payloads().await?;
    upload(&mut p, &hostile_sid, "x.json", b"[1]").await?;
    let cap: u64 = 256 << 20;
    let stdout_ask: u64 = 100_000_000;
    // The attackers run while `attacking` is set, until `stop`; `in_flight`
    // counts their calls, so that a quiet window starts only once every
    // attack has ended.
    let attacking = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let outcomes: Arc<std::sync::Mutex<BTreeMap<String, u64>>> = Arc::default();
    let mut attackers = tokio::task::JoinSet::new();
    // (kind, runtime, script, timeout): the loop is stopped by its timeout,
    // the others must meet their memory or output cap well before theirs.
    let attacks: [(&str, &str, &str, u64); 3] = [
        ("loop", "javascript", "for (;;) {}", 3_000),
        (
            "bomb",
            "python",
            "a = []\nwhile True:\n    a.append(bytearray(16 << 20))",
            30_000,
        ),
        (
            "flood",
            "python",
            "import sys\nline = 'x' * 8191 + '\\n'\nfor _ in range(12800):\n    sys.stdout.write(line)",
            30_000,
        ),
    ];
    let attacks = attacks
        .into_iter()
        .filter(|(kind, ..)| opts.attacks.iter().any(|a| a == kind));
    for (kind, runtime, source, timeout_ms) in attacks {
        let mut x = server.codemode().await?;
        let mut p = server.payloads().await?;
        let sid = hostile_sid.clone();
        let outcomes = outcomes.clone();
        let (attacking, stop, in_flight) = (attacking.clone(), stop.clone(), in_flight.clone());
        attackers.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                in_flight.fetch_add(1, Ordering::SeqCst);
                if !attacking.load(Ordering::SeqCst) {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                let r = x
                    .exec(proto::ExecRequest {
                        session_id: sid.clone(),
                        runtime: runtime.into(),
                        source: source.into(),
                        limits: Some(proto::ExecLimits {
                            timeout_ms,
                            memory_bytes: cap,
                            max_stdout_bytes: stdout_ask,
                            fuel: 0,
                        }),
                        ..Default::default()
                    })
                    .await;
                let key = match r {
                    Ok(r) => {
                        let r = r.into_inner();
                        if let Some(pl) = &r.stdout_payload {
                            let _ = p
                                .delete_payload(proto::DeletePayloadRequest {
                                    payload_id: pl.id.clone(),
                                    reason: "flood".into(),
                                })
                                .await;
                        }
                        format!(
                            "{kind}: {:?}",
                            ExecStatus::try_from(r.status).unwrap_or(ExecStatus::Unspecified)
                        )
                    }
                    Err(e) if e.code() == Code::ResourceExhausted => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        format!("{kind}: RESOURCE_EXHAUSTED")
                    }
                    // Execs of the hostile session take all its payloads as
                    // inputs, and the flood's stdout payloads are deleted as
                    // they come: an exec may find an input gone (NOT_FOUND).
                    Err(e) if e.code() == Code::NotFound => {
                        format!("{kind}: NOT_FOUND (input deleted)")
                    }
                    Err(e) => format!("{kind}: error {:?}: {}", e.code(), e.message()),
                };
                *outcomes.lock().unwrap().entry(key).or_default() += 1;
                in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        });
    }
    let targets = prepare(&server).await?;
    let phases = Phases::new();
    let mut tasks = spawn_clients(&server, clients, opts.seed, targets, phases.clone()).await?;
    let window = duration / 4;
    let sampler = RssSampler::start(server.pid());
    let (mut quiet_secs, mut attacked_secs) = (0.0, 0.0);
    let mut base_peak = None;
    let mut previous = QUIET;
    for phase in [
        QUIET, ATTACKED, ATTACKED, QUIET, QUIET, ATTACKED, ATTACKED, QUIET,
    ] {
        if phase != previous {
            phases.set(GAP);
            if phase == ATTACKED {
                // Let the attack reach full force before timing.
                attacking.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                // Let every attack end (the loop's is the longest, 3 s).
                attacking.store(false, Ordering::SeqCst);
                let drained = Instant::now() + Duration::from_secs(60);
                while in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < drained {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                anyhow::ensure!(
                    in_flight.load(Ordering::SeqCst) == 0,
                    "the hostile session's execs were still running 60 s after it stopped attacking"
                );
            }
            previous = phase;
        }
        phases.set(phase);
        let t = Instant::now();
        tokio::time::sleep(window).await;
        let secs = t.elapsed().as_secs_f64();
        if phase == QUIET {
            quiet_secs += secs;
        } else {
            attacked_secs += secs;
        }
        if base_peak.is_none() {
            // The first window is before any attack: the no-attack peak.
            let (rss, hwm) = server.rss();
            base_peak = Some(rss.max(hwm));
        }
    }
    phases.set(DONE);
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    while let Some(r) = attackers.join_next().await {
        r?;
    }
    let peak_rss = sampler.stop();
    let (_, hwm) = server.rss();
    let base_peak = base_peak.unwrap_or(0);
    let baseline = phases.run(QUIET, quiet_secs, base_peak, base_peak);
    let attacked = phases.run(ATTACKED, attacked_secs, peak_rss, hwm);
    let (bad, _) = attacked.errors();
    out.check(
        bad.is_empty(),
        format!(
            "neighbours saw no error but RESOURCE_EXHAUSTED ({})",
            bad.join("; ")
        ),
    );
    let outcomes = outcomes.lock().unwrap().clone();
    let summary: Vec<String> = outcomes.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    out.figure(format!("attacks: {}", summary.join(", ")));
    for (kind, want) in [
        ("loop", "loop: Timeout"),
        ("bomb", "bomb: MemoryLimit"),
        ("flood", "flood: OutputLimit"),
    ] {
        if !opts.attacks.iter().any(|a| a == kind) {
            continue;
        }
        out.check(
            outcomes.contains_key(want),
            format!("the hostile session's attacks were stopped as intended ({want})"),
        );
    }
    out.check(
        outcomes.keys().all(|k| !k.contains("error")),
        "no attack failed with a gRPC error",
    );
    for rpc in ["Offload", "Read", "Search", "Inspect", "Exec"] {
        let (b, a) = (baseline.p99(rpc), attacked.p99(rpc));
        let ratio = a as f64 / b.max(1) as f64;
        out.figure(format!("{rpc} p99 {} vs {} ({ratio:.2}×)", ms(a), ms(b)));
        out.check(
            ratio <= 2.0,
            format!("{rpc} p99 under attack within 2× of the no-attack windows ({ratio:.2}×)"),
        );
    }
    let peak = attacked.peak_rss.max(attacked.hwm);
    // Bound: the no-attack peak plus what the three attacks may hold by
    // their own caps (memory each, plus the 64 MiB stdout ceiling).
    let bound = base_peak + 3 * cap + (64 << 20);
    out.figure(format!(
        "peak RSS {} (no attack {}, bound {})",
        mib(peak),
        mib(base_peak),
        mib(bound)
    ));
    out.check(
        peak <= bound,
        format!(
            "server RSS stayed under no-attack peak + 3 × 256 MiB + 64 MiB ({})",
            mib(bound)
        ),
    );
    out.detail = format!(
        "{}{}",
        baseline.table("No attack (quiet windows)"),
        attacked.table("Under attack (attacked windows, neighbours' calls only)")
    );
    for l in server.log_problems() {
        out.notes.push(format!("server log: {l}"));
    }
    Ok(out)
}
