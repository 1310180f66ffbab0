//! Rough redaction throughput: 100 MB of mixed text (JSON log lines, prose,
//! numbers, a secret every few KB) through the five built-ins, streamed in
//! 1 MiB chunks as uploads arrive, and in one shot; then inputs that are
//! hard on one rule, and each rule alone. Not a test: it asserts nothing
//! about speed.
//!
//! `cargo run --release --example redact_throughput`

use std::time::{Duration, Instant};

use spillway::redact::Redactor;

const SIZE: usize = 100_000_000;

fn mixed() -> Vec<u8> {
    let lines: [&[u8]; 8] = [
        b"{\"ts\": 1796031106334, \"level\": \"info\", \"msg\": \"request served\", \"path\": \"/api/v1/items/42\", \"ms\": 12}\n",
        b"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.\n",
        b"2026-11-30 09:31:46 WARN  worker-3 retrying job 81723 after 250 ms (attempt 2 of 5)\n",
        b"    fn handle(&self, req: Request) -> Result<Response, Error> { self.inner.call(req) }\n",
        b"id,name,amount,currency\n1001,Widget,19.99,EUR\n1002,Gadget,5.00,USD\n",
        b"commit 3f0c9a1b2d4e5f60 Author: Jane Doe  Date: Mon Nov 30 09:31:46 2026 +0000\n",
        b"| 12 | 345 | 6789 | 1234 5678 | 2026-11-30 | ok |\n",
        b"caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80 done\n",
    ];
    let secrets: [&[u8]; 5] = [
        b"contact: jane.doe@example.com\n",
        b"aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n",
        b"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc\n",
        b"card 4111 1111 1111 1111 exp 12/29\n",
        b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n",
    ];
    let mut out = Vec::with_capacity(SIZE + 1000);
    let mut i = 0usize;
    while out.len() < SIZE {
        out.extend_from_slice(lines[i % lines.len()]);
        if i % 40 == 39 {
            out.extend_from_slice(secrets[(i / 40) % secrets.len()]);
        }
        i += 1;
    }
    out.truncate(SIZE);
    out
}

/// This thread's time on a CPU so far (Linux), so that the figures hold on a
/// busy machine too.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = stat
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Wall-clock and CPU MB/s of a run over `bytes` bytes.
struct Rate(f64, f64);

impl Rate {
    fn measure<T>(bytes: usize, f: impl FnOnce() -> T) -> (Rate, T) {
        let (wall, cpu) = (Instant::now(), cpu_time());
        let out = f();
        let mb = bytes as f64 / 1e6;
        let cpu = (cpu_time() - cpu).as_secs_f64();
        (Rate(mb / wall.elapsed().as_secs_f64(), mb / cpu), out)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.0} MB/s ({:.0} MB per CPU-second)", self.0, self.1)
    }
}

/// Streams `input` through `r` in 1 MiB chunks, the output going to a reused
/// buffer (as it would to a file); returns the matches.
fn stream(r: &Redactor, input: &[u8]) -> u64 {
    let mut s = r.stream();
    let mut out = Vec::with_capacity(2 << 20);
    for chunk in input.chunks(1 << 20) {
        out.clear();
        s.push(chunk, &mut out);
    }
    out.clear();
    s.finish(&mut out).total
}

fn main() {
    let builtins: Vec<String> = spillway::redact::BUILTIN_NAMES
        .iter()
        .map(|n| format!("builtin:{n}"))
        .collect();
    let all = Redactor::compile(&builtins).expect("built-ins compile");
    let input = mixed();
    let mb = input.len() / 1_000_000;
    let (_, expected) = all.redact(&input);
    for round in 1..=3 {
        let (streamed, matches) = Rate::measure(input.len(), || stream(&all, &input));
        assert_eq!(matches, expected.total);
        let (one_shot, _) = Rate::measure(input.len(), || all.redact(&input).1);
        println!("round {round}: {mb} MB, 5 built-ins, {matches} matches");
        println!("  streamed {streamed}; one-shot {one_shot}");
    }
    // Inputs that make a rule work hard: every group, `@` or prefix a
    // candidate that fails.
    for worst in [&b"1234 "[..], b"0 1 ", b"a@b.", b"Bearer ", b"AKIA"] {
        let input = worst.repeat(20_000_000 / worst.len());
        let (rate, _) = Rate::measure(input.len(), || stream(&all, &input));
        println!(
            "  {:?} repeated: streamed {rate}",
            String::from_utf8_lossy(worst)
        );
    }
    for rule in &builtins {
        let r = Redactor::compile(std::slice::from_ref(rule)).expect("built-in compiles");
        let (rate, matches) = Rate::measure(input.len(), || stream(&r, &input));
        println!("  {rule} alone: streamed {rate}, {matches} matches");
    }
}
