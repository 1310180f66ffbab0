//! Code mode benches (issue 4), each against a reference in the same run:
//!
//! - warm exec latency, p50 and p99, of an empty script in each runtime,
//!   end to end over gRPC (goals: jq and JavaScript ≤ 2 ms, Python ≤ 5 ms);
//! - a 50 MB NDJSON group-by-and-sum in the jq runtime against native `jaq`
//!   on the same file (goal ≤ 1.5×);
//! - the same question in JavaScript and Python against native Rust
//!   (`serde_json`, line by line), with native `node` and `python3` shown
//!   for context.
//!
//! `make bench` runs it (and installs `jaq`). Each image is compiled (or
//! loaded from the compile cache) before timing starts.

mod common;

use std::collections::BTreeMap;
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

fn time_cmd(rounds: usize, mut cmd: impl FnMut() -> Command) -> Option<f64> {
    let mut v = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let out = cmd().output().ok()?;
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

#[tokio::main]
async fn main() {
    let rounds = rounds();
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-images");
    let mut server = BenchServer::start(|c| {
        c.sandbox.images_dir = images.clone();
        c.sandbox.cache_dir = Some(images.join("build/compile-cache"));
    })
    .await;
    let a: common::Auth = common::auth;
    let mut code = CodeModeClient::with_interceptor(server.channel.clone(), a)
        .max_decoding_message_size(64 << 20);
    let session = server
        .sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;

    println!("# Code mode ({}, wasmtime 48)\n", machine());
    println!("## Warm exec, empty script, end to end over gRPC\n");
    println!(
        "| runtime | p50 | p99 | max | server-side p50: directory / instantiate / guest run | runs |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let runs = 200 * rounds / 3;
    for (runtime, source, args) in EMPTY {
        let req = proto::ExecRequest {
            session_id: session.clone(),
            runtime: (*runtime).into(),
            source: (*source).into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        };
        // Warm-up: compiles or loads the image, fills the instance pool.
        for _ in 0..10 {
            let r = code.exec(req.clone()).await.unwrap().into_inner();
            assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{runtime}: {r:?}");
        }
        let mut v = Vec::with_capacity(runs);
        let mut phases = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let r = code.exec(req.clone()).await.unwrap().into_inner();
            v.push(t.elapsed().as_secs_f64() * 1000.0);
            let u = r.usage.unwrap_or_default();
            phases.push((u.setup_us, u.instantiate_us, u.run_us));
        }
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

    // The 50 MB question.
    let data = ndjson(50_000_000);
    let path = server.dir.path().join("dump.ndjson");
    std::fs::write(&path, &data).unwrap();
    let header = proto::UploadChunk {
        chunk: Some(proto::upload_chunk::Chunk::Header(proto::UploadHeader {
            session_id: session.clone(),
            name: "dump.ndjson".into(),
            ..Default::default()
        })),
    };
    let chunks: Vec<_> = data
        .chunks(1 << 20)
        .map(|c| proto::UploadChunk {
            chunk: Some(proto::upload_chunk::Chunk::Data(
                bytes::Bytes::copy_from_slice(c),
            )),
        })
        .collect();
    let payload = server
        .payloads
        .upload(tokio_stream::iter(std::iter::once(header).chain(chunks)))
        .await
        .unwrap()
        .into_inner();
    drop(data);

    let exec_time = |runtime: &str, source: &str, args: &[&str]| {
        let req = proto::ExecRequest {
            session_id: session.clone(),
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
    println!("| measurement | time | reference | reference time | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    let jq = exec_time("jq", JQ_AGG, &["-n"]).await;
    match jaq_binary() {
        Some(jaq) => {
            let native = time_cmd(rounds, || {
                let mut c = Command::new(&jaq);
                c.arg("-c").arg("-n").arg(JQ_AGG).arg(&path);
                c
            });
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
    let rust = {
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            std::hint::black_box(native_rust(&path));
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
        time_cmd(rounds, || {
            let mut c = Command::new(program);
            c.arg(flag).arg(script).arg(&path);
            c
        })
    };
    if let Some(n) = native("node", "-e", NODE_AGG) {
        row(js_name, js, "native node (V8 JIT), for context", n);
    }
    if let Some(n) = native("python3", "-c", PY_NATIVE_AGG) {
        row(py_name, py, "native python3, for context", n);
    }
    server.stop().await;
}
