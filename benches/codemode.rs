//! Code mode benches (issue 4), each against a reference in the same run:
//!
//! - warm exec latency, p50 and p99, of an empty script in each runtime,
//!   end to end over gRPC (goals: jq and JavaScript ≤ 2 ms, Python ≤ 5 ms);
//! - where a warm exec's server time goes, part by part (`ExecUsage`);
//! - a 50 MB NDJSON group-by-and-sum in the jq runtime against native `jaq`
//!   on the same file (goal ≤ 1.5×) and against C jq (goal: faster);
//! - the same question in JavaScript and Python against native Rust
//!   (`serde_json`, line by line), with native `node` and `python3` shown
//!   for context.
//!
//! `make bench` runs it (and installs `jaq`). Each image is compiled (or
//! loaded from the compile cache) before timing starts. Every reference
//! runs at the exec threads' nice value, as the guests do.
//!
//! `SPILLWAY_BENCH_BASELINE_IMAGES=DIR` adds a before/after table: a second
//! server runs the images in DIR (say, another checkout's `sandbox-images`),
//! and empty execs in each runtime alternate between the two in batches, so
//! both sides see the same machine state. `SPILLWAY_BENCH_BASELINE_KEEP_RESIDENT=M,T`
//! does the same with B's pool slots keeping `M` bytes of each memory and
//! `T` of each table resident (`sandbox.memory_keep_resident_bytes`,
//! `sandbox.table_keep_resident_bytes`), with this build's images unless
//! both are set; `SPILLWAY_BENCH_KEEP_RESIDENT=M,T` sets the same for A (the
//! server of every other table). `SPILLWAY_BENCH_SECTIONS` (comma
//! separated, default `warm,big,jq`) picks the parts: `warm` the empty-script
//! latencies (and the baseline table), `big` the 50 MB group-by (`bigjq`: its
//! jq rows only), `jq` the jq
//! runtime against C jq (Debian's `jq`, what users know) and native jaq on a
//! `select` over 3 MB of NDJSON and `.[] | .user` over a 35 MB array, and
//! the same `select` in the python runtime against native `python3`.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{BenchServer, machine, median, rounds};
use spillway::proto::{self, code_mode_client::CodeModeClient};

const EMPTY: &[(&str, &str, &[&str])] = &[
    ("jq", "empty", &["-n"]),
    ("javascript", ";", &[]),
    ("python", "pass", &[]),
    ("wasm", "(module (func (export \"_start\")))", &[]),
];

const JQ_AGG: &str =
    "reduce inputs as $r ({}; .[$r.status] |= [((.[0] // 0) + 1), ((.[1] // 0) + $r.amount)])";
const JS_AGG: &str = r#"const g = {};
for (const line of readLines(payloads[0].path)) {
  if (!line) continue;
  const r = JSON.parse(line);
  const e = g[r.status] || (g[r.status] = [0, 0]);
  e[0] += 1; e[1] += r.amount;
}
console.log(JSON.stringify(g));"#;
const PY_AGG: &str = r#"import json, spillway
g = {}
for line in spillway.read_lines(spillway.payloads[0]["path"]):
    if not line:
        continue
    r = json.loads(line)
    e = g.setdefault(r["status"], [0, 0])
    e[0] += 1
    e[1] += r["amount"]
print(json.dumps(g))"#;
/// The `select` case of the C jq table, in Python: in the runtime, and native.
const PY_SELECT: &str = r#"import json, spillway
for line in spillway.read_lines(spillway.payloads[0]["path"]):
    if line:
        r = json.loads(line)
        if r["status"] == "open":
            print(r["id"])"#;
const PY_NATIVE_SELECT: &str = r#"import json, sys
with open(sys.argv[1]) as f:
    for line in f:
        line = line.rstrip("\n")
        if line:
            r = json.loads(line)
            if r["status"] == "open":
                print(r["id"])"#;
const NODE_AGG: &str = r#"const fs = require('fs'); const rl = require('readline');
const g = {}; const it = rl.createInterface({input: fs.createReadStream(process.argv[1])});
it.on('line', (line) => { if (!line) return; const r = JSON.parse(line); const e = g[r.status] || (g[r.status] = [0, 0]); e[0] += 1; e[1] += r.amount; });
it.on('close', () => console.log(JSON.stringify(g)));"#;
const PY_NATIVE_AGG: &str = r#"import json, sys
g = {}
with open(sys.argv[1]) as f:
    for line in f:
        line = line.rstrip("\n")
        if not line:
            continue
        r = json.loads(line)
        e = g.setdefault(r["status"], [0, 0])
        e[0] += 1
        e[1] += r["amount"]
print(json.dumps(g))"#;

fn ndjson(total: usize) -> Vec<u8> {
    let statuses = ["open", "closed", "merged", "draft", "stale"];
    let mut data = Vec::with_capacity(total + 256);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut i = 0u64;
    while data.len() < total {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let status = statuses[(x % 5) as usize];
        let amount = (x >> 20) as i64 % 10_000 - 2_000;
        writeln!(
            data,
            "{{\"id\":{i},\"status\":\"{status}\",\"amount\":{amount},\"note\":\"record {i} of the big dump\"}}"
        )
        .unwrap();
        i += 1;
    }
    data
}

/// The native Rust reference: serde_json per line, as the guests do.
fn native_rust(path: &Path) -> BTreeMap<String, (u64, i64)> {
    let f = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open(path).unwrap());
    let mut g: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for line in f.lines() {
        let line = line.unwrap();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let e = g
            .entry(v["status"].as_str().unwrap().to_owned())
            .or_default();
        e.0 += 1;
        e.1 += v["amount"].as_i64().unwrap();
    }
    g
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The nice value the server's exec threads run at (`sandbox.exec_nice`).
/// The references run at it too: on a machine shared with other work, a
/// guest at nice 10 against a reference at nice 0 measures the scheduler
/// (a 0.22 s `select` took 4.1 s beside two busy loops at nice 0, native
/// jaq 0.50 s), not the runtime.
fn exec_nice() -> i32 {
    spillway::sandbox::SandboxConfig::default().exec_nice
}

/// `f` on a thread of its own at the exec threads' nice value.
fn at_exec_nice<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a plain syscall on the calling thread; failure only
            // leaves the priority as it was.
            #[allow(unsafe_code)]
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, exec_nice());
            }
            f()
        })
        .join()
        .expect("the reference thread panicked")
    })
}

/// The median wall time of `rounds` runs of `program` with `args`, at the
/// exec threads' nice value (through `nice`, so the command is only a
/// program and its arguments).
fn time_cmd(rounds: usize, program: &Path, args: &[&OsStr]) -> Option<f64> {
    let mut v = Vec::new();
    for _ in 0..rounds {
        let mut niced = Command::new("nice");
        niced
            .arg("-n")
            .arg(exec_nice().to_string())
            .arg(program)
            .args(args);
        let t = Instant::now();
        let out = niced.output().ok()?;
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        v.push(t.elapsed().as_secs_f64());
    }
    Some(median(v))
}

fn jaq_binary() -> Option<PathBuf> {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-images/build/tools/bin/jaq");
    if local.exists() {
        return Some(local);
    }
    Command::new("jaq")
        .arg("--version")
        .output()
        .ok()
        .map(|_| PathBuf::from("jaq"))
}

type Code = CodeModeClient<common::Svc>;

/// A code-mode client of `server` and a fresh session on it.
async fn code_client(server: &mut BenchServer) -> (Code, String) {
    let a: common::Auth = common::auth;
    let code = CodeModeClient::with_interceptor(server.channel.clone(), a)
        .max_decoding_message_size(64 << 20);
    let session = server
        .sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;
    (code, session)
}

fn empty_exec(session: &str, runtime: &str) -> proto::ExecRequest {
    let (_, source, args) = EMPTY.iter().find(|(r, _, _)| *r == runtime).unwrap();
    proto::ExecRequest {
        session_id: session.into(),
        runtime: runtime.into(),
        source: (*source).into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

/// Milliseconds of each of `n` execs of `req`: end to end, and the guest's
/// run as the server timed it.
async fn exec_ms(code: &mut Code, req: &proto::ExecRequest, n: usize) -> Vec<(f64, f64)> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = code.exec(req.clone()).await.unwrap().into_inner();
        let wall = t.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{r:?}");
        v.push((wall, r.usage.unwrap_or_default().run_us as f64 / 1000.0));
    }
    v
}

/// What server B of the before/after table runs: other images, other pool
/// settings, or both.
struct Baseline {
    images: PathBuf,
    /// Memory and table bytes B's pool slots keep resident.
    keep_resident: Option<(u64, u64)>,
}

impl Baseline {
    fn from_env(own_images: &Path) -> Option<Self> {
        let images = std::env::var_os("SPILLWAY_BENCH_BASELINE_IMAGES").map(PathBuf::from);
        let keep_resident = keep_resident_from_env("SPILLWAY_BENCH_BASELINE_KEEP_RESIDENT");
        if images.is_none() && keep_resident.is_none() {
            return None;
        }
        Some(Self {
            images: images.unwrap_or_else(|| own_images.to_path_buf()),
            keep_resident,
        })
    }

    fn describe(&self) -> String {
        let mut what = format!("the images in {}", self.images.display());
        if let Some((m, t)) = self.keep_resident {
            what.push_str(&format!(
                ", pool slots keeping {m} bytes of each memory and {t} of each table resident"
            ));
        }
        what
    }
}

/// `NAME=MEMORY,TABLE`: bytes of each memory and table a pool slot keeps
/// resident.
fn keep_resident_from_env(name: &str) -> Option<(u64, u64)> {
    let v = std::env::var(name).ok()?;
    let parse = |x: &str| -> u64 {
        x.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}=MEMORY,TABLE in bytes, not {v:?}"))
    };
    let (m, t) = v
        .split_once(',')
        .unwrap_or_else(|| panic!("{name}=MEMORY,TABLE in bytes, not {v:?}"));
    Some((parse(m), parse(t)))
}

/// Sets the bytes of each memory and table a pool slot keeps resident, if
/// given.
fn keep_resident(c: &mut spillway::config::Config, sizes: Option<(u64, u64)>) {
    if let Some((memory, table)) = sizes {
        c.sandbox.memory_keep_resident_bytes = memory;
        c.sandbox.table_keep_resident_bytes = table;
    }
}

/// This server (A) against the baseline (B): empty execs in each runtime,
/// alternating A and B in batches of 20.
async fn baseline_table(rounds: usize, code: &mut Code, session: &str, baseline: &Baseline) {
    let cache = tempfile::tempdir().unwrap();
    let mut other = BenchServer::start(|c| {
        c.sandbox.images_dir = baseline.images.clone();
        c.sandbox.cache_dir = Some(cache.path().to_path_buf());
        keep_resident(c, baseline.keep_resident);
    })
    .await;
    let (mut code_b, session_b) = code_client(&mut other).await;
    println!(
        "\n## Warm exec, empty script: this server (A) against {} (B)\n",
        baseline.describe()
    );
    println!("A and B alternate in batches of 20 execs on the same machine state.\n");
    println!(
        "| runtime | A p50 | A p99 | B p50 | B p99 | A/B p50 | guest run p50, A / B | minor faults per exec, A / B | runs each |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for runtime in ["jq", "javascript", "python"] {
        let (req_a, req_b) = (
            empty_exec(session, runtime),
            empty_exec(&session_b, runtime),
        );
        exec_ms(code, &req_a, 10).await;
        exec_ms(&mut code_b, &req_b, 10).await;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // Minor page faults of this process (client and both servers)
        // during each side's batches.
        let (mut faults_a, mut faults_b) = (0, 0);
        let minflt = || common::rusage().ru_minflt;
        for _ in 0..(10 * rounds) {
            let f0 = minflt();
            a.extend(exec_ms(code, &req_a, 20).await);
            let f1 = minflt();
            b.extend(exec_ms(&mut code_b, &req_b, 20).await);
            faults_a += f1 - f0;
            faults_b += minflt() - f1;
        }
        let sorted = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            let mut x: Vec<f64> = v.iter().map(f).collect();
            x.sort_by(|p, q| p.partial_cmp(q).unwrap());
            x
        };
        let (aw, bw) = (sorted(&a, |p| p.0), sorted(&b, |p| p.0));
        let (ar, br) = (sorted(&a, |p| p.1), sorted(&b, |p| p.1));
        let (a50, b50) = (percentile(&aw, 0.5), percentile(&bw, 0.5));
        println!(
            "| {runtime} | {a50:.2} ms | {:.2} ms | {b50:.2} ms | {:.2} ms | {:.2} | {:.2} / {:.2} ms | {:.0} / {:.0} | {} |",
            percentile(&aw, 0.99),
            percentile(&bw, 0.99),
            a50 / b50,
            percentile(&ar, 0.5),
            percentile(&br, 0.5),
            faults_a as f64 / a.len() as f64,
            faults_b as f64 / b.len() as f64,
            a.len()
        );
    }
    other.stop().await;
}

fn section(name: &str) -> bool {
    std::env::var("SPILLWAY_BENCH_SECTIONS")
        .unwrap_or_else(|_| "warm,big,jq".into())
        .split(',')
        .any(|s| s.trim() == name)
}

#[tokio::main]
async fn main() {
    let rounds = rounds();
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-images");
    let mut server = BenchServer::start(|c| {
        c.sandbox.images_dir = images.clone();
        c.sandbox.cache_dir = Some(images.join("build/compile-cache"));
        keep_resident(c, keep_resident_from_env("SPILLWAY_BENCH_KEEP_RESIDENT"));
    })
    .await;
    let (mut code, session) = code_client(&mut server).await;
    let load_before = load_average();

    println!("# Code mode ({}, wasmtime 48)\n", machine());
    if section("warm") {
        warm_table(rounds, &mut code, &session, server.dir.path()).await;
        if let Some(baseline) = Baseline::from_env(&images) {
            baseline_table(rounds, &mut code, &session, &baseline).await;
        }
    }
    if section("big") || section("bigjq") {
        big_tables(rounds, &mut server, &code, &session, section("big")).await;
    }
    if section("jq") {
        c_jq_table(rounds, &mut server, &code, &session).await;
    }
    server.stop().await;
    println!(
        "\nLoad average (1, 5, 15 min) {load_before} before these tables and {} after.",
        load_average()
    );
}

/// The first three fields of `/proc/loadavg`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

async fn warm_table(rounds: usize, code: &mut Code, session: &str, data: &Path) {
    println!("## Warm exec, empty script, end to end over gRPC\n");
    println!(
        "| runtime | p50 | p99 | max | server-side p50: directory / instantiate / guest run | runs |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let runs = 200 * rounds / 3;
    let mut parts = Vec::new();
    let mut commits = Vec::new();
    for (runtime, _, _) in EMPTY {
        let req = empty_exec(session, runtime);
        // Warm-up: compiles or loads the image, fills the instance pool.
        for _ in 0..10 {
            let r = code.exec(req.clone()).await.unwrap().into_inner();
            assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{runtime}: {r:?}");
        }
        let commits_before = audit_commits();
        let mut v = Vec::with_capacity(runs);
        let mut phases = Vec::with_capacity(runs);
        let mut usages = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let r = code.exec(req.clone()).await.unwrap().into_inner();
            v.push(t.elapsed().as_secs_f64() * 1000.0);
            let u = r.usage.unwrap_or_default();
            phases.push((u.setup_us, u.instantiate_us, u.run_us));
            usages.push((t.elapsed().as_micros() as u64, u));
        }
        let (seconds, count) = audit_commits();
        let count = count - commits_before.1;
        if count > 0.0 {
            commits.push(format!(
                "{runtime} {:.0}",
                (seconds - commits_before.0) / count * 1e6
            ));
        }
        parts.push((*runtime, usages));
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p50 = |f: fn(&(u64, u64, u64)) -> u64| {
            let mut x: Vec<f64> = phases.iter().map(|p| f(p) as f64 / 1000.0).collect();
            x.sort_by(|a, b| a.partial_cmp(b).unwrap());
            percentile(&x, 0.5)
        };
        println!(
            "| {runtime} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} / {:.2} / {:.2} ms | {runs} |",
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            v[v.len() - 1],
            p50(|p| p.0),
            p50(|p| p.1),
            p50(|p| p.2)
        );
    }
    parts_table(&parts);
    let sync = sync_floor(data, runs);
    let audit = |runtime: &str| {
        let (_, runs) = parts.iter().find(|(r, _)| *r == runtime)?;
        let mut x: Vec<f64> = runs.iter().map(|(_, u)| u.audit_us as f64).collect();
        x.sort_by(|a, b| a.partial_cmp(b).unwrap());
        Some(percentile(&x, 0.5))
    };
    let ratios: Vec<String> = EMPTY
        .iter()
        .filter_map(|(r, _, _)| audit(r).map(|a| format!("{r} {:.2}", a / sync)))
        .collect();
    println!(
        "\nThe floor of the audit part, measured after these runs on the same file system: one \
         4 KiB `pwrite` and `fdatasync` of a file in the server's directory, p50 of {runs}: \
         {sync:.0} µs. The audit part against it: {}.",
        ratios.join(", ")
    );
    println!(
        "\nInside the audit part, the engine's commit (mean µs, from the server's \
         `audit_append_duration_seconds`): {}. The rest of the audit part is the hand-off to \
         the audit writer's thread and back.",
        commits.join(", ")
    );
}

/// The server's audit commits so far: total seconds and count, from its
/// `audit_append_duration_seconds` histogram (the server runs in this
/// process).
fn audit_commits() -> (f64, f64) {
    let text = spillway::metrics::encode();
    let series = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("spillway_audit_append_duration_seconds_")?
                    .strip_prefix(name)?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    (series("sum"), series("count"))
}

/// The p50, in microseconds, of one 4 KiB overwrite and `fdatasync` of a
/// file under `dir`: what one durable commit cannot go below.
fn sync_floor(dir: &Path, runs: usize) -> f64 {
    use std::os::unix::fs::FileExt;
    let path = dir.join("sync-floor");
    let file = std::fs::File::create(&path).unwrap();
    let page = [7u8; 4096];
    file.write_all_at(&page, 0).unwrap();
    file.sync_all().unwrap();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            file.write_all_at(&page, 0).unwrap();
            file.sync_data().unwrap();
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    std::fs::remove_file(&path).unwrap();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    percentile(&t, 0.5)
}

/// Where a warm exec's time goes: the p50 of each part the server reports
/// in `ExecUsage`, in microseconds, against the end-to-end time.
fn parts_table(parts: &[(&str, Vec<(u64, proto::ExecUsage)>)]) {
    type Part = (&'static str, fn(&proto::ExecUsage) -> u64);
    const PARTS: &[Part] = &[
        ("prepare", |u| u.prepare_us),
        ("queue", |u| u.queue_us),
        ("module", |u| u.module_us),
        ("directory", |u| u.setup_us),
        ("instantiate", |u| u.instantiate_us),
        ("guest run", |u| u.run_us),
        ("output", |u| u.output_us),
        ("audit", |u| u.audit_us),
        ("cleanup", |u| u.cleanup_us),
    ];
    println!("\n### Where a warm empty exec's time goes (p50, µs)\n");
    println!(
        "Server-side parts from `ExecUsage`; \"in no part\" is the server's time not in any \
         other part (thread hops, encoding), and \"client and transport\" the end-to-end time \
         less the server's.\n"
    );
    let names: Vec<&str> = PARTS.iter().map(|p| p.0).collect();
    println!(
        "| runtime | {} | in no part | server | client and transport | end to end |",
        names.join(" | ")
    );
    println!("|{}", " --- |".repeat(PARTS.len() + 5));
    let p50 = |mut x: Vec<f64>| {
        x.sort_by(|a, b| a.partial_cmp(b).unwrap());
        percentile(&x, 0.5)
    };
    for (runtime, runs) in parts {
        let cells: Vec<String> = PARTS
            .iter()
            .map(|(_, f)| {
                format!(
                    "{:.0}",
                    p50(runs.iter().map(|(_, u)| f(u) as f64).collect())
                )
            })
            .collect();
        let rest = p50(runs
            .iter()
            .map(|(_, u)| {
                let sum: u64 = PARTS.iter().map(|(_, f)| f(u)).sum();
                u.server_us as f64 - sum as f64
            })
            .collect());
        let server = p50(runs.iter().map(|(_, u)| u.server_us as f64).collect());
        let client = p50(runs
            .iter()
            .map(|(e, u)| *e as f64 - u.server_us as f64)
            .collect());
        let e2e = p50(runs.iter().map(|(e, _)| *e as f64).collect());
        println!(
            "| {runtime} | {} | {rest:.0} | {server:.0} | {client:.0} | {e2e:.0} |",
            cells.join(" | ")
        );
    }
}

/// `n` records as an API returns them, `{"id", "user", "status", "amount", "tags"}`.
fn records(n: usize) -> impl Iterator<Item = String> {
    let statuses = ["open", "closed", "merged", "draft", "stale"];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n).map(move |i| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        format!(
            "{{\"id\":{i},\"user\":\"user{}\",\"status\":\"{}\",\"amount\":{},\"tags\":[\"t{}\",\"t{}\"]}}",
            x % 5000,
            statuses[(x >> 8) as usize % 5],
            (x >> 20) % 10_000,
            (x >> 32) % 50,
            (x >> 40) % 50
        )
    })
}

/// The jq runtime against C jq (and native jaq) on the same files.
async fn c_jq_table(rounds: usize, server: &mut BenchServer, code: &Code, session: &str) {
    // 100,000 short lines, about 3 MB
    let statuses = ["open", "closed", "merged", "draft", "stale"];
    let ndjson: String = (0..100_000)
        .map(|i| {
            format!(
                "{{\"id\":{i},\"status\":\"{}\"}}\n",
                statuses[(i * 7919) % 5]
            )
        })
        .collect();
    let array = format!(
        "[{}]",
        records(400_000)
            .map(|r| format!("{r:<85}"))
            .collect::<Vec<_>>()
            .join(",\n")
    );
    let cases = [
        (
            "select over NDJSON",
            "lines.ndjson",
            ndjson.as_bytes(),
            r#"select(.status == "open") | .id"#,
        ),
        (
            // `\|`: the name goes in a Markdown table
            r".[] \| .user over an array",
            "array.json",
            array.as_bytes(),
            ".[] | .user",
        ),
    ];
    let c_jq = Command::new("jq")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success());
    let c_jq_version = c_jq.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let jaq = jaq_binary();
    println!("\n## The jq runtime against C jq and native jaq (median of {rounds})\n");
    println!(
        "End to end over gRPC against a whole `{}` process, and native jaq, on the same file; output to a pipe; references at the guests' nice value ({}).\n",
        c_jq_version
            .as_deref()
            .unwrap_or("jq (not installed: apt-get install jq)"),
        exec_nice()
    );
    println!(
        "| case | input | jq runtime | guest run | guest peak memory | C jq | ratio | native jaq | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut select_input = None;
    for (what, name, data, filter) in cases {
        let payload = server.upload(session, name, data).await;
        let path = server.dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        if select_input.is_none() {
            select_input = Some((payload.id.clone(), path.clone(), data.len()));
        }
        let req = proto::ExecRequest {
            session_id: session.to_owned(),
            runtime: "jq".into(),
            source: filter.into(),
            args: vec!["-c".into()],
            inputs: vec![payload.id.clone()],
            limits: Some(proto::ExecLimits {
                timeout_ms: 300_000,
                memory_bytes: 2 << 30,
                max_stdout_bytes: 64 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        let (wall, run, peak) = timed_execs(rounds, code, &req, what).await;
        let reference = |program: &Path| {
            time_cmd(
                rounds,
                program,
                &["-c".as_ref(), filter.as_ref(), path.as_os_str()],
            )
        };
        let cell = |t: Option<f64>| match t {
            Some(t) => format!("{t:.3} s | {:.2}", wall / t),
            None => "- | -".into(),
        };
        let c = c_jq_version
            .as_ref()
            .and_then(|_| reference(Path::new("jq")));
        let n = jaq.as_deref().and_then(reference);
        println!(
            "| {what} | {:.1} MB | {wall:.3} s | {run:.3} s | {} MiB | {} | {} |",
            data.len() as f64 / 1e6,
            peak >> 20,
            cell(c),
            cell(n)
        );
    }
    if let Some((id, path, len)) = select_input {
        python_select(rounds, code, session, &id, &path, len).await;
    }
}

/// `rounds` runs of `req`, each of which must succeed: the median end-to-end
/// and guest-run seconds, and the highest peak memory.
async fn timed_execs(
    rounds: usize,
    code: &Code,
    req: &proto::ExecRequest,
    what: &str,
) -> (f64, f64, u64) {
    let mut code = code.clone();
    let (mut wall, mut run, mut peak) = (Vec::new(), Vec::new(), 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = code.exec(req.clone()).await.unwrap().into_inner();
        wall.push(t.elapsed().as_secs_f64());
        assert_eq!(
            r.status,
            proto::ExecStatus::Ok as i32,
            "{what}: {}",
            r.message
        );
        let u = r.usage.unwrap_or_default();
        run.push(u.run_us as f64 / 1e6);
        peak = peak.max(u.peak_memory_bytes);
    }
    (median(wall), median(run), peak)
}

/// The `select` over NDJSON in the python runtime, against native python3
/// running the same loop on the same file.
async fn python_select(
    rounds: usize,
    code: &Code,
    session: &str,
    id: &str,
    path: &Path,
    len: usize,
) {
    let req = proto::ExecRequest {
        session_id: session.to_owned(),
        runtime: "python".into(),
        source: PY_SELECT.into(),
        inputs: vec![id.to_owned()],
        limits: Some(proto::ExecLimits {
            timeout_ms: 300_000,
            max_stdout_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (wall, run, _) = timed_execs(rounds, code, &req, "python select").await;
    let native = time_cmd(
        rounds,
        Path::new("python3"),
        &["-c".as_ref(), PY_NATIVE_SELECT.as_ref(), path.as_os_str()],
    );
    println!(
        "\n### The same select in the python runtime, against native python3 (median of {rounds})\n"
    );
    println!("| case | input | python runtime | guest run | native python3 | ratio |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let reference = match native {
        Some(n) => format!("{n:.3} s | {:.2}", wall / n),
        None => "python3 not installed | -".into(),
    };
    println!(
        "| select over NDJSON, line by line | {:.1} MB | {wall:.3} s | {run:.3} s | {reference} |",
        len as f64 / 1e6
    );
}

/// The 50 MB question.
async fn big_tables(
    rounds: usize,
    server: &mut BenchServer,
    code: &Code,
    session: &str,
    all: bool,
) {
    let data = ndjson(50_000_000);
    let path = server.dir.path().join("dump.ndjson");
    std::fs::write(&path, &data).unwrap();
    let payload = server.upload(session, "dump.ndjson", &data).await;
    drop(data);

    let exec_time = |runtime: &str, source: &str, args: &[&str]| {
        let req = proto::ExecRequest {
            session_id: session.to_owned(),
            runtime: runtime.into(),
            source: source.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            inputs: vec![payload.id.clone()],
            limits: Some(proto::ExecLimits {
                timeout_ms: 300_000,
                memory_bytes: 2 << 30,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut code = code.clone();
        async move {
            let mut v = Vec::new();
            for _ in 0..rounds {
                let t = Instant::now();
                let r = code.exec(req.clone()).await.unwrap().into_inner();
                assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{r:?}");
                v.push(t.elapsed().as_secs_f64());
            }
            median(v)
        }
    };

    println!("\n## 50 MB NDJSON, group by status with count and sum (median of {rounds})\n");
    println!("References at the guests' nice value ({}).\n", exec_nice());
    println!("| measurement | time | reference | reference time | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    let jq = exec_time("jq", JQ_AGG, &["-n"]).await;
    let agg_args = [
        "-c".as_ref(),
        "-n".as_ref(),
        JQ_AGG.as_ref(),
        path.as_os_str(),
    ];
    match jaq_binary() {
        Some(jaq) => {
            let native = time_cmd(rounds, &jaq, &agg_args);
            match native {
                Some(n) => println!(
                    "| jq runtime (jaq in wasm) | {jq:.2} s | native jaq 3.1 on the same file | {n:.2} s | {:.2} |",
                    jq / n
                ),
                None => {
                    println!("| jq runtime (jaq in wasm) | {jq:.2} s | native jaq failed | - | - |")
                }
            }
        }
        None => println!(
            "| jq runtime (jaq in wasm) | {jq:.2} s | jaq not installed (make bench installs it) | - | - |"
        ),
    }
    let c_jq = time_cmd(rounds, Path::new("jq"), &agg_args);
    match c_jq {
        Some(c) => println!(
            "| jq runtime (jaq in wasm) | {jq:.2} s | C jq (Debian's jq) on the same file | {c:.2} s | {:.2} |",
            jq / c
        ),
        None => println!(
            "| jq runtime (jaq in wasm) | {jq:.2} s | C jq not installed (make bench installs it) | - | - |"
        ),
    }
    if !all {
        return;
    }
    let rust = {
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            std::hint::black_box(at_exec_nice(|| native_rust(&path)));
            v.push(t.elapsed().as_secs_f64());
        }
        median(v)
    };
    let js = exec_time("javascript", JS_AGG, &[]).await;
    let py = exec_time("python", PY_AGG, &[]).await;
    let row = |what: &str, t: f64, reference: &str, r: f64| {
        println!(
            "| {what} | {t:.2} s | {reference} | {r:.2} s | {:.2} |",
            t / r
        );
    };
    let (js_name, py_name) = (
        "javascript runtime (QuickJS in wasm)",
        "python runtime (CPython in wasm)",
    );
    row(js_name, js, "native Rust, serde_json per line", rust);
    row(py_name, py, "native Rust, serde_json per line", rust);
    let native = |program: &str, flag: &str, script: &str| {
        time_cmd(
            rounds,
            Path::new(program),
            &[flag.as_ref(), script.as_ref(), path.as_os_str()],
        )
    };
    if let Some(n) = native("node", "-e", NODE_AGG) {
        row(js_name, js, "native node (V8 JIT), for context", n);
    }
    if let Some(n) = native("python3", "-c", PY_NATIVE_AGG) {
        row(py_name, py, "native python3, for context", n);
    }
}
