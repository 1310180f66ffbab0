//! Slow and broken clients, and protocol abuse.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillway::proto::{self, upload_chunk::Chunk};
use tokio::io::AsyncWriteExt;

use crate::harness::*;

const IDLE_TIMEOUT_S: u64 = 2;

fn header_chunk(session: &str, name: &str) -> proto::UploadChunk {
    proto::UploadChunk {
        chunk: Some(Chunk::Header(proto::UploadHeader {
            session_id: session.into(),
            name: name.into(),
            ..Default::default()
        })),
    }
}

fn data_chunk(n: usize) -> proto::UploadChunk {
    proto::UploadChunk {
        chunk: Some(Chunk::Data(bytes::Bytes::from(vec![b'x'; n]))),
    }
}

/// A channel to `server` through a one-connection TCP proxy; aborting the
/// returned task cuts the connection at once, whatever is in flight.
async fn cuttable_channel(
    server: &Server,
) -> Result<(tonic::transport::Channel, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let front = listener.local_addr()?;
    let upstream = server.addr;
    let proxy = tokio::spawn(async move {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
            return;
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{front}"))?
        .connect()
        .await?;
    Ok((channel, proxy))
}

/// One round of stalled uploads, half-sent uploads and cancelled calls.
/// Returns how many stalled uploads the server ended by itself.
async fn broken_round(
    server: &Server,
    sid: &str,
    big: &str,
    per_kind: usize,
) -> Result<(usize, usize)> {
    // Stalled: header and one chunk, then silence with the stream open.
    let mut stalled = tokio::task::JoinSet::new();
    let mut senders = Vec::new();
    for i in 0..per_kind {
        let channel = server.channel().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(header_chunk(sid, &format!("stalled-{i}"))).await?;
        tx.send(data_chunk(64 << 10)).await?;
        senders.push(tx);
        stalled.spawn(async move {
            let mut p = payloads_on(channel);
            p.upload(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(|_| ())
        });
    }
    // Half-sent: some chunks, then the connection goes away mid-stream
    // (through a proxy that is cut: the server sees the TCP connection end
    // with the upload's stream still open).
    for i in 0..per_kind {
        let (channel, proxy) = cuttable_channel(server).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(header_chunk(sid, &format!("half-{i}"))).await?;
        let call = tokio::spawn(async move {
            let mut p = payloads_on(channel);
            let _ = p
                .upload(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await;
        });
        for _ in 0..4 {
            tx.send(data_chunk(256 << 10)).await?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        proxy.abort();
        let _ = proxy.await;
        call.abort();
        let _ = call.await;
        drop(tx);
    }
    // Cancelled: a Download after its first chunk, an Exec mid-run, a Search.
    let mut p = server.payloads().await?;
    let mut x = server.codemode().await?;
    for _ in 0..per_kind / 5 {
        let mut stream = p
            .download(proto::PayloadRequest {
                payload_id: big.into(),
            })
            .await?
            .into_inner();
        let _ = stream.message().await?;
        drop(stream);
        let _ = tokio::time::timeout(
            Duration::from_millis(300),
            x.exec(proto::ExecRequest {
                session_id: sid.into(),
                runtime: "javascript".into(),
                source: "for (;;) {}".into(),
                limits: Some(proto::ExecLimits {
                    timeout_ms: 10_000,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
        .await;
        let _ = tokio::time::timeout(
            Duration::from_millis(2),
            p.search(proto::SearchRequest {
                session_id: sid.into(),
                pattern: "x+y".into(),
                ..Default::default()
            }),
        )
        .await;
    }
    // The stalled uploads must end by the server's idle timeout.
    let deadline = Instant::now() + Duration::from_secs(IDLE_TIMEOUT_S + 10);
    let mut ended = 0;
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline.into(), stalled.join_next()).await {
        if matches!(r, Ok(Err(_))) {
            ended += 1;
        }
    }
    stalled.abort_all();
    drop(senders);
    Ok((ended, per_kind))
}

/// The server's open fds, with those that hold the exec directories it
/// keeps, emptied, for a tenant's next exec (a bounded pool, see
/// `sandbox::MAX_SPARE_DIRS`) told apart.
struct Fds {
    /// every fd's target (see [`Server::fd_targets`])
    targets: Vec<String>,
    /// the targets of the fds that are not a kept exec directory's
    unpooled: Vec<String>,
    /// exec directories with all four subdirectories open and empty
    spare_dirs: usize,
    /// fds under `exec/` that are not part of such a directory
    not_spare: Vec<String>,
}

impl Fds {
    fn of(server: &Server, data_dir: &Path) -> Self {
        let targets = server.fd_targets();
        let prefix = format!(
            "{}/exec/",
            data_dir.file_name().unwrap_or_default().to_string_lossy()
        );
        let mut by_dir: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        let mut not_spare = Vec::new();
        for t in &targets {
            let Some(rest) = t.strip_prefix(&prefix) else {
                continue;
            };
            match rest.split_once('/') {
                Some((name, sub)) if !sub.contains('/') => {
                    by_dir.entry(name).or_default().push(sub)
                }
                _ => not_spare.push(t.clone()),
            }
        }
        let mut spare_names = Vec::new();
        for (name, mut subs) in by_dir {
            subs.sort_unstable();
            let empty = |sub: &str| {
                std::fs::read_dir(data_dir.join("exec").join(name).join(sub))
                    .is_ok_and(|mut d| d.next().is_none())
            };
            if subs == ["out", "payloads", "spillway", "tmp"] && subs.iter().all(|s| empty(s)) {
                spare_names.push(format!("{prefix}{name}/"));
            } else {
                not_spare.extend(subs.iter().map(|s| format!("{prefix}{name}/{s}")));
            }
        }
        let unpooled = targets
            .iter()
            .filter(|t| !spare_names.iter().any(|n| t.starts_with(n.as_str())))
            .cloned()
            .collect();
        Self {
            targets,
            unpooled,
            spare_dirs: spare_names.len(),
            not_spare,
        }
    }

    /// Open fds that are not a kept exec directory's.
    fn unpooled(&self) -> usize {
        self.unpooled.len()
    }

    /// Fds on the subdirectories of kept exec directories.
    fn spare(&self) -> usize {
        self.targets.len() - self.unpooled.len()
    }
}

/// The fds in `now` beyond those in `before` (a multiset difference), as
/// `; opened since: …` for a check's line, or nothing.
fn opened_since(before: &[String], now: &[String]) -> String {
    let mut left = before.to_vec();
    let extra: Vec<&str> = now
        .iter()
        .filter(|t| match left.iter().position(|b| b == *t) {
            Some(i) => {
                left.swap_remove(i);
                false
            }
            None => true,
        })
        .map(String::as_str)
        .collect();
    match extra.is_empty() {
        true => String::new(),
        false => format!("; opened since: {}", extra.join(", ")),
    }
}

/// Waits until `count(&probe())` falls to `want` (or 10 s pass); returns
/// the last probe.
async fn settle<T>(probe: impl Fn() -> T, count: impl Fn(&T) -> usize, want: usize) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = probe();
        if count(&seen) <= want || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn slow_clients(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("slow-clients");
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let config = write_config(
        opts,
        dir.path(),
        &format!("[limits]\nupload_idle_timeout = \"{IDLE_TIMEOUT_S}s\"\n"),
    )?;
    let data_dir = dir.path().join("data");
    let server = Server::start(opts, &config, &data_dir, &dir.path().join("log")).await?;
    let sid = server.session(None).await?;
    let mut p = server.payloads().await?;
    let mut big = vec![0u8; 32 << 20];
    StdRng::seed_from_u64(opts.seed).fill_bytes(&mut big);
    let big = upload(&mut p, &sid, "big.bin", &big).await?.id;
    let (rounds, per_kind) = if opts.smoke { (2, 20) } else { (6, 50) };
    // Warm-up: one small round, so lazily opened files and pools exist.
    broken_round(&server, &sid, &big, 5).await?;
    drop(p);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = Fds::of(&server, &data_dir);
    let temps_before = temp_files(&data_dir).len();
    let mut rss_after_round = Vec::new();
    let mut stalled_ended = 0;
    let mut stalled_total = 0;
    for _ in 0..rounds {
        let (ended, total) = broken_round(&server, &sid, &big, per_kind).await?;
        stalled_ended += ended;
        stalled_total += total;
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_after_round.push(server.rss().0);
    }
    let after = settle(
        || Fds::of(&server, &data_dir),
        Fds::unpooled,
        before.unpooled(),
    )
    .await;
    let temps_after = temp_files(&data_dir);
    out.figure(format!(
        "{rounds} rounds × ({per_kind} stalled + {per_kind} half-sent uploads + {} cancelled Download/Exec/Search)",
        3 * (per_kind / 5)
    ));
    out.figure(format!(
        "fds {} → {}, of which kept exec directories' {} → {}",
        before.targets.len(),
        after.targets.len(),
        before.spare(),
        after.spare()
    ));
    out.figure(format!(
        "RSS after each round: {}",
        rss_after_round
            .iter()
            .map(|b| mib(*b))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.figure(format!("temp files {temps_before} → {}", temps_after.len()));
    out.check(
        stalled_ended == stalled_total,
        format!(
            "the server ended {stalled_ended} of {stalled_total} stalled uploads by its idle timeout ({IDLE_TIMEOUT_S} s)"
        ),
    );
    out.check(
        after.unpooled() <= before.unpooled(),
        format!(
            "open fds, less those of kept exec directories, back to the warm-up count ({} → {}{})",
            before.unpooled(),
            after.unpooled(),
            match after.unpooled() > before.unpooled() {
                true => opened_since(&before.unpooled, &after.unpooled),
                false => String::new(),
            }
        ),
    );
    out.check(
        after.spare_dirs <= spillway::sandbox::MAX_SPARE_DIRS && after.not_spare.is_empty(),
        format!(
            "exec directories kept for reuse: {} (at most {}), each with its 4 directories open and empty{}",
            after.spare_dirs,
            spillway::sandbox::MAX_SPARE_DIRS,
            match after.not_spare.is_empty() {
                true => String::new(),
                false => format!("; open but not a kept, empty exec directory: {}", after.not_spare.join(", ")),
            }
        ),
    );
    out.check(
        temps_after.is_empty(),
        format!("no temporary files left ({temps_after:?})"),
    );
    let orphans = orphan_check(&server).await?;
    out.check(orphans.is_empty(), format!("no orphan files ({orphans:?})"));
    let growth = rss_after_round
        .last()
        .unwrap_or(&0)
        .saturating_sub(rss_after_round[0]);
    out.check(
        growth <= 32 << 20,
        format!(
            "RSS does not grow from the first round to the last ({} ≤ 32 MiB)",
            mib(growth)
        ),
    );
    // Only the big payload remains: no stalled or half-sent upload was kept.
    let names: Vec<String> = list_all(&mut server.payloads().await?, &sid)
        .await?
        .into_iter()
        .map(|p| p.name)
        .collect();
    out.check(
        names == ["big.bin"],
        format!(
            "no broken upload was stored (session holds {} payloads)",
            names.len()
        ),
    );
    for l in server.log_problems() {
        out.notes.push(format!("server log: {l}"));
    }
    Ok(out)
}

pub async fn protocol_abuse(opts: &Opts) -> Result<Outcome> {
    let mut out = Outcome::new("protocol-abuse");
    let dir = tempfile::tempdir_in(&opts.work_dir)?;
    let config = write_config(opts, dir.path(), "")?;
    let mut server = Server::start(
        opts,
        &config,
        &dir.path().join("data"),
        &dir.path().join("log"),
    )
    .await?;
    let sid = server.session(None).await?;
    let mut p = server.payloads().await?;
    let target = upload(&mut p, &sid, "t.txt", &b"line\n".repeat(10_000))
        .await?
        .id;
    let fds_before = server.fds();
    // The canary: another client's Reads, which must all succeed throughout.
    let rec = Arc::new(Recorder::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let canary = {
        let mut p = server.payloads().await?;
        let rec = rec.clone();
        let stop = stop.clone();
        let target = target.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                match p
                    .read(proto::ReadRequest {
                        payload_id: target.clone(),
                        max_bytes: 4096,
                        range: None,
                    })
                    .await
                {
                    Ok(_) => rec.ok("canary Read", t.elapsed()),
                    Err(e) => rec.err("canary Read", &e),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let reps = if opts.smoke { 2 } else { 10 };
    let mut big_sender = payloads_on(server.channel().await?).max_encoding_message_size(256 << 20);
    // Oversize messages.
    let mut oversize = std::collections::BTreeMap::<String, u64>::new();
    for _ in 0..reps {
        // Sessions take at most limits.max_request_message_bytes (4 MiB).
        let r = server
            .sessions()
            .await?
            .create_session(proto::CreateSessionRequest {
                label: "a".repeat(5 << 20),
                ..Default::default()
            })
            .await;
        *oversize
            .entry(format!(
                "CreateSession 5 MiB: {:?}",
                r.err().map(|e| e.code())
            ))
            .or_default() += 1;
        let r = p
            .upload(tokio_stream::iter(vec![
                header_chunk(&sid, "over"),
                data_chunk(6 << 20),
            ]))
            .await;
        *oversize
            .entry(format!(
                "Upload 6 MiB chunk: {:?}",
                r.err().map(|e| e.code())
            ))
            .or_default() += 1;
        // Payloads take whole turns, up to limits.max_offload_request_bytes
        // (64 MiB); this client may send more than that.
        let r = big_sender
            .offload(proto::OffloadRequest {
                session_id: sid.clone(),
                results: vec![proto::ToolResult {
                    tool_call_id: "x".into(),
                    content: vec![b'x'; 70 << 20].into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await;
        *oversize
            .entry(format!("Offload 70 MiB: {:?}", r.err().map(|e| e.code())))
            .or_default() += 1;
    }
    out.check(
        oversize
            .keys()
            .all(|k| k.ends_with("Some(ResourceExhausted)")),
        format!("every oversize message got RESOURCE_EXHAUSTED {oversize:?}"),
    );
    // A flood of tiny streams: thousands of concurrent unary calls on a few
    // connections.
    let flood_calls = if opts.smoke { 2_000 } else { 20_000 };
    let mut flood = tokio::task::JoinSet::new();
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(server.channel().await?);
    }
    let flood_start = Instant::now();
    for i in 0..flood_calls {
        let mut c = payloads_on(channels[i % channels.len()].clone());
        let target = target.clone();
        flood.spawn(async move {
            c.stat(proto::PayloadRequest {
                payload_id: target.clone(),
            })
            .await
            .err()
            .map(|e| e.code())
        });
    }
    let mut flood_codes = std::collections::BTreeMap::<String, u64>::new();
    while let Some(r) = flood.join_next().await {
        *flood_codes
            .entry(format!("{:?}", r.ok().flatten()))
            .or_default() += 1;
    }
    out.figure(format!(
        "{flood_calls} tiny streams in {:.1} s: {flood_codes:?}",
        flood_start.elapsed().as_secs_f64()
    ));
    drop(channels);
    // Garbage on the port: random bytes, a valid preface then garbage,
    // and silent connections held open.
    let conns = if opts.smoke { 50 } else { 300 };
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut silent = Vec::new();
    for i in 0..conns {
        let Ok(mut s) = tokio::net::TcpStream::connect(server.addr).await else {
            continue;
        };
        match i % 3 {
            0 => {
                let mut junk = vec![0u8; 64 << 10];
                rng.fill_bytes(&mut junk);
                let _ = s.write_all(&junk).await;
            }
            1 => {
                let mut junk = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                let mut tail = vec![0u8; 16 << 10];
                rng.fill_bytes(&mut tail);
                junk.extend(tail);
                let _ = s.write_all(&junk).await;
            }
            _ => silent.push(s),
        }
    }
    out.figure(format!(
        "{conns} garbage connections ({} held silent)",
        silent.len()
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    out.check(
        serving(server.addr).await,
        "a new client is served while garbage connections are open",
    );
    drop(silent);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    canary.await?;
    let stats = rec.snapshot();
    let canary = stats.get("canary Read").cloned().unwrap_or_default();
    let mut v = canary.micros.clone();
    v.sort_unstable();
    out.figure(format!(
        "canary: {} Reads, p50/p99/max {}/{}/{}",
        v.len(),
        ms(pct(&v, 50.0)),
        ms(pct(&v, 99.0)),
        ms(v.last().copied().unwrap_or(0))
    ));
    out.check(
        canary.errors.is_empty() && !v.is_empty(),
        format!(
            "the canary client's Reads all succeeded ({:?})",
            canary.errors
        ),
    );
    out.check(server.alive(), "the server is still running");
    drop(p);
    let fds_after = settle(|| server.fds(), |n| *n, fds_before).await;
    out.figure(format!("fds {fds_before} → {fds_after}"));
    out.check(
        fds_after <= fds_before,
        format!("connections closed: fds back to {fds_before} ({fds_after})"),
    );
    for l in server.log_problems() {
        out.notes.push(format!("server log: {l}"));
    }
    Ok(out)
}
