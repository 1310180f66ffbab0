//! `probe`: a WASI preview1 command the integration tests and benches run
//! through the `wasm` runtime.
//!
//! - `probe escape NAME` tries every way out of the sandbox it knows against
//!   the input payload `/payloads/NAME`, and prints one line per attempt:
//!   `<attempt> refused <error>` or `<attempt> ALLOWED <detail>`.
//! - `probe aggregate PATH` groups NDJSON records by `status` and sums
//!   `amount`, printing `{"status":[count,sum],...}` with sorted keys.
//! - `probe spin`, `probe alloc`, `probe flood`, `probe fill` hit the
//!   time, memory, stdout and `/tmp` limits.
//! - `probe out NAME TEXT` writes `/out/NAME`.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    let code = match cmd {
        "escape" => escape(args.get(2).map(String::as_str).unwrap_or("")),
        "aggregate" => aggregate(args.get(2).map(String::as_str).unwrap_or("")),
        "spin" => spin(),
        "alloc" => alloc(),
        "flood" => flood(),
        "fill" => fill(),
        "out" => out(&args[2], &args[3]),
        "args" => {
            println!("{}", args.join(" "));
            0
        }
        _ => {
            eprintln!("usage: probe escape|aggregate|spin|alloc|flood|fill|out|args");
            2
        }
    };
    std::process::exit(code);
}

fn report(attempt: &str, r: io::Result<String>) {
    match r {
        Ok(detail) => println!("{attempt} ALLOWED {detail}"),
        Err(e) => println!("{attempt} refused {:?}", e.kind()),
    }
}

fn read(path: &str) -> io::Result<String> {
    let mut s = Vec::new();
    fs::File::open(path)?.read_to_end(&mut s)?;
    Ok(format!("read {} bytes", s.len()))
}

fn escape(name: &str) -> i32 {
    let payload = format!("/payloads/{name}");
    report("read-etc-passwd", read("/etc/passwd"));
    report("dotdot-from-payloads", read("/payloads/../../../../etc/passwd"));
    report("dotdot-from-tmp", read("/tmp/../../../../etc/passwd"));
    report("dotdot-tmp-to-payloads", read(&format!("/tmp/../payloads/{name}")));
    report("absolute-proc", read("/proc/self/environ"));
    report("absolute-root-dir", fs::read_dir("/").map(|d| format!("{} entries", d.count())));
    report(
        "symlink-absolute",
        symlink_in_tmp("/etc/passwd", "abs").and_then(|()| read("/tmp/abs")),
    );
    report(
        "symlink-relative-out",
        symlink_in_tmp("../../../../etc/passwd", "rel")
            .and_then(|()| read("/tmp/rel")),
    );
    report(
        "symlink-to-payload-then-write",
        symlink_in_tmp(format!("../payloads/{name}"), "p").and_then(|()| {
            OpenOptions::new().write(true).open("/tmp/p")?.write_all(b"X")?;
            Ok("wrote through the link".into())
        }),
    );
    report(
        "hardlink-payload-into-tmp",
        fs::hard_link(&payload, "/tmp/hard").and_then(|()| {
            OpenOptions::new().write(true).open("/tmp/hard")?.write_all(b"X")?;
            Ok("wrote through the link".into())
        }),
    );
    report(
        "rename-payload-into-tmp",
        fs::rename(&payload, "/tmp/moved").map(|()| "renamed".into()),
    );
    report(
        "open-payload-for-write",
        OpenOptions::new()
            .write(true)
            .open(&payload)
            .and_then(|mut f| f.write_all(b"X"))
            .map(|()| "wrote".into()),
    );
    report(
        "open-payload-truncate",
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&payload)
            .map(|_| "truncated".into()),
    );
    report(
        "open-payload-truncate-readonly",
        OpenOptions::new()
            .read(true)
            .truncate(true)
            .open(&payload)
            .map(|_| "opened".into()),
    );
    report(
        "open-payload-append",
        OpenOptions::new()
            .append(true)
            .open(&payload)
            .and_then(|mut f| f.write_all(b"X"))
            .map(|()| "appended".into()),
    );
    report("unlink-payload", fs::remove_file(&payload).map(|()| "removed".into()));
    report(
        "create-in-payloads",
        fs::write("/payloads/new", b"x").map(|()| "created".into()),
    );
    report(
        "write-spillway-script",
        OpenOptions::new()
            .write(true)
            .open("/spillway/script")
            .map(|_| "opened".into()),
    );
    report(
        "set-payload-times",
        fs::File::open(&payload).and_then(|f| {
            f.set_modified(std::time::SystemTime::UNIX_EPOCH)?;
            Ok("changed mtime".into())
        }),
    );
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    report(
        "environment",
        if env.is_empty() {
            Err(io::Error::new(io::ErrorKind::NotFound, "empty"))
        } else {
            Ok(env.join(","))
        },
    );
    report(
        "tcp-connect",
        std::net::TcpStream::connect("127.0.0.1:22").map(|_| "connected".into()),
    );
    report(
        "argv0",
        match std::env::args().next() {
            Some(a) if a.contains('/') => Ok(a),
            _ => Err(io::Error::new(io::ErrorKind::NotFound, "bare name")),
        },
    );
    0
}

/// Creates `/tmp/<link>` pointing at `target`, through raw WASI (std's
/// helper is unstable).
fn symlink_in_tmp(target: impl AsRef<str>, link: &str) -> io::Result<()> {
    let fd = preopen("/tmp").ok_or_else(|| io::Error::other("no /tmp preopen"))?;
    // SAFETY: plain WASI call on a preopened directory descriptor.
    unsafe { wasi::path_symlink(target.as_ref(), fd, link) }
        .map_err(|e| io::Error::from_raw_os_error(i32::from(e.raw())))
}

fn preopen(name: &str) -> Option<wasi::Fd> {
    for fd in 3..32u32 {
        // SAFETY: querying a descriptor's prestat; errors end the scan.
        let stat = unsafe { wasi::fd_prestat_get(fd) }.ok()?;
        let len = unsafe { stat.u.dir.pr_name_len };
        let mut buf = vec![0u8; len];
        unsafe { wasi::fd_prestat_dir_name(fd, buf.as_mut_ptr(), len) }.ok()?;
        if buf == name.as_bytes() {
            return Some(fd);
        }
    }
    None
}

fn aggregate(path: &str) -> i32 {
    let f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot open {path}: {e}");
            return 1;
        }
    };
    let mut groups: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for line in BufReader::with_capacity(1 << 16, f).lines() {
        let line = line.expect("readable line");
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON line");
        let status = v["status"].as_str().unwrap_or("").to_owned();
        let g = groups.entry(status).or_default();
        g.0 += 1;
        g.1 += v["amount"].as_i64().unwrap_or(0);
    }
    let out: serde_json::Map<String, serde_json::Value> = groups
        .into_iter()
        .map(|(k, (c, s))| (k, serde_json::json!([c, s])))
        .collect();
    println!("{}", serde_json::Value::Object(out));
    0
}

fn spin() -> i32 {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn alloc() -> i32 {
    let mut keep: Vec<Vec<u8>> = Vec::new();
    loop {
        keep.push(vec![1u8; 16 << 20]);
    }
}

fn flood() -> i32 {
    let line = [b'x'; 8191];
    let mut out = io::stdout().lock();
    loop {
        if out.write_all(&line).and_then(|()| out.write_all(b"\n")).is_err() {
            return 1;
        }
    }
}

fn fill() -> i32 {
    let chunk = vec![0u8; 1 << 20];
    let mut f = fs::File::create("/tmp/fill").expect("create /tmp/fill");
    loop {
        if f.write_all(&chunk).is_err() {
            return 1;
        }
    }
}

fn out(name: &str, text: &str) -> i32 {
    match fs::write(format!("/out/{name}"), text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cannot write /out/{name}: {e}");
            1
        }
    }
}
