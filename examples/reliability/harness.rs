//! The pieces every scenario uses: the real binary as a child process on a
//! free loopback port, authenticated clients, latency recording, and what
//! `/proc` says about the server (RSS, open files).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use spillway::proto::{
    self, audit_client::AuditClient, code_mode_client::CodeModeClient,
    payloads_client::PayloadsClient, sessions_client::SessionsClient, upload_chunk::Chunk,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Token of the agent every scenario works as.
pub const AGENT: &str = "rel-agent";
/// Token of an auditor, for VerifyAudit.
pub const AUDITOR: &str = "rel-auditor";

/// What the harness was told on the command line.
#[derive(Debug, Clone)]
pub struct Opts {
    pub binary: PathBuf,
    pub images_dir: PathBuf,
    pub cache_dir: PathBuf,
    pub engine: String,
    pub smoke: bool,
    pub work_dir: PathBuf,
    pub seed: u64,
    /// The hostile scenario's attacks to run.
    pub attacks: Vec<String>,
    /// The tenants scenario's attacks to run.
    pub tenant_attacks: Vec<String>,
}

/// A scenario's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skipped,
}

/// What one scenario reports: a verdict, its figures in a line, notes (why
/// it failed, what was checked), and optional extra markdown (a table).
#[derive(Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub verdict: Verdict,
    pub figures: Vec<String>,
    pub notes: Vec<String>,
    pub detail: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            verdict: Verdict::Pass,
            figures: Vec::new(),
            notes: Vec::new(),
            detail: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Records a check: a failed one fails the scenario and says why.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.notes.push(format!("ok: {what}"));
        } else {
            self.verdict = Verdict::Fail;
            self.notes.push(format!("FAILED: {what}"));
        }
    }

    pub fn figure(&mut self, f: impl Into<String>) {
        self.figures.push(f.into());
    }

    pub fn skip(mut self, why: impl Into<String>) -> Self {
        self.verdict = Verdict::Skipped;
        self.notes.push(format!("skipped: {}", why.into()));
        self
    }
}

#[derive(Clone)]
pub struct Bearer(pub Option<String>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| tonic::Status::internal("bad token"))?,
            );
        }
        Ok(req)
    }
}

pub type Svc = InterceptedService<Channel, Bearer>;

/// The real binary, serving on a free loopback port.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    config: PathBuf,
    opts: Opts,
}

/// Writes the config file: the two tokens, the images, and `extra` TOML
/// (whole sections, e.g. `[limits]\nupload_idle_timeout = "2s"\n`).
pub fn write_config(opts: &Opts, dir: &Path, extra: &str) -> Result<PathBuf> {
    let text = format!(
        "version = 1\n\n[[auth.tokens]]\ntoken = \"{AGENT}\"\nprincipal = \"rel\"\ntenant = \"rel\"\nroles = [\"agent\"]\n\n\
         [[auth.tokens]]\ntoken = \"{AUDITOR}\"\nprincipal = \"rel-auditor\"\ntenant = \"rel\"\nroles = [\"auditor\"]\n\n\
         {extra}\n\n[sandbox]\nimages_dir = {:?}\ncache_dir = {:?}\n",
        opts.images_dir, opts.cache_dir
    );
    let path = dir.join("spillway.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Server {
    /// Starts `spillway serve` with `config` on `data_dir` and waits until
    /// it reports SERVING.
    pub async fn start(opts: &Opts, config: &Path, data_dir: &Path, log: &Path) -> Result<Self> {
        let port = free_port()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        Self::start_at(opts, config, data_dir, log, addr).await
    }

    /// [`Server::start`] on a given address.
    pub async fn start_at(
        opts: &Opts,
        config: &Path,
        data_dir: &Path,
        log: &Path,
        addr: SocketAddr,
    ) -> Result<Self> {
        let mut cmd = Command::new(&opts.binary);
        for (var, _) in std::env::vars() {
            if var.starts_with("SPILLWAY_") {
                cmd.env_remove(var);
            }
        }
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--engine")
            .arg(&opts.engine)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", opts.binary.display()))?;
        let mut server = Self {
            child,
            addr,
            data_dir: data_dir.to_owned(),
            log: log.to_owned(),
            config: config.to_owned(),
            opts: opts.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "server exited with {status}: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            if serving(addr).await {
                return Ok(server);
            }
            if Instant::now() > deadline {
                bail!("server did not come up within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Starts a new server on the same config, data dir and address (after
    /// a kill), so its clients' channels reconnect to it.
    pub async fn restart(&self, log: &Path) -> Result<Self> {
        Self::start_at(&self.opts, &self.config, &self.data_dir, log, self.addr).await
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until the server is idle, at most `within`: under a fifth of
    /// a core over a quarter of a second. An error when it is still busy
    /// then, with no client of ours calling it.
    pub async fn settle(&self, within: Duration) -> Result<()> {
        const SAMPLE: Duration = Duration::from_millis(250);
        let end = Instant::now() + within;
        let mut before = proc_cpu(self.pid());
        loop {
            tokio::time::sleep(SAMPLE).await;
            let now = proc_cpu(self.pid());
            if now.saturating_sub(before) < SAMPLE / 5 {
                return Ok(());
            }
            before = now;
            anyhow::ensure!(
                Instant::now() < end,
                "the server was still busy {within:?} after its clients stopped"
            );
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Graceful stop (SIGTERM), then SIGKILL after 30 s.
    pub fn stop(&mut self) {
        // SAFETY: a plain syscall that signals our own child process; it
        // touches no memory of ours.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
    }

    pub async fn channel(&self) -> Result<Channel> {
        Ok(Channel::from_shared(format!("http://{}", self.addr))?
            .connect()
            .await?)
    }

    pub async fn sessions(&self) -> Result<SessionsClient<Svc>> {
        Ok(SessionsClient::with_interceptor(
            self.channel().await?,
            Bearer(Some(AGENT.into())),
        ))
    }

    pub async fn payloads(&self) -> Result<PayloadsClient<Svc>> {
        Ok(payloads_on(self.channel().await?))
    }

    pub async fn codemode(&self) -> Result<CodeModeClient<Svc>> {
        Ok(codemode_on(self.channel().await?))
    }

    pub async fn audit(&self) -> Result<AuditClient<Svc>> {
        Ok(AuditClient::with_interceptor(
            self.channel().await?,
            Bearer(Some(AUDITOR.into())),
        ))
    }

    /// VmRSS and VmHWM of the server, in bytes.
    pub fn rss(&self) -> (u64, u64) {
        proc_rss(self.pid())
    }

    /// Open file descriptors of the server.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// What the server's open fds point to, sorted: `socket:`, `pipe:` and
    /// `anon_inode:` kinds without their inode numbers, files by their path
    /// under the data dir's parent (the scenario's temporary directory), so
    /// a leak names its kind and two listings can be compared.
    pub fn fd_targets(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid())) else {
            return Vec::new();
        };
        let root = self.data_dir.parent().unwrap_or(&self.data_dir).to_owned();
        let mut targets: Vec<String> = dir
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|t| match t.strip_prefix(&root) {
                Ok(rel) => rel.display().to_string(),
                Err(_) => {
                    let t = t.display().to_string();
                    match t.split_once(":[") {
                        Some((kind, _)) => format!("{kind}:"),
                        None => t,
                    }
                }
            })
            .collect();
        targets.sort();
        targets
    }

    /// Creates a session and returns its ID.
    pub async fn session(&self, policy: Option<proto::Policy>) -> Result<String> {
        Ok(self
            .sessions()
            .await?
            .create_session(proto::CreateSessionRequest {
                label: "reliability".into(),
                policy,
                ..Default::default()
            })
            .await?
            .into_inner()
            .id)
    }

    /// Log lines that say ERROR or panicked, for the notes.
    pub fn log_problems(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("panicked"))
            .take(5)
            .map(|l| l.chars().take(300).collect())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

pub fn payloads_on(channel: Channel) -> PayloadsClient<Svc> {
    PayloadsClient::with_interceptor(channel, Bearer(Some(AGENT.into())))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

pub fn codemode_on(channel: Channel) -> CodeModeClient<Svc> {
    CodeModeClient::with_interceptor(channel, Bearer(Some(AGENT.into())))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// True once the server reports SERVING on `grpc.health.v1`.
pub async fn serving(addr: SocketAddr) -> bool {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let Ok(endpoint) = Channel::from_shared(format!("http://{addr}")) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
    else {
        return false;
    };
    matches!(
        HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await,
        Ok(r) if r.get_ref().status == ServingStatus::Serving as i32
    )
}

/// CPU time a process has used (all its threads, live and ended).
pub fn proc_cpu(pid: u32) -> Duration {
    /// The unit of utime and stime in /proc/<pid>/stat: USER_HZ, which
    /// Linux fixes at 100 for user space.
    const TICK: Duration = Duration::from_millis(10);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces: state is the
    // first, utime and stime the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u32>().ok())
            .unwrap_or(0)
    };
    TICK * (ticks(11) + ticks(12))
}

pub fn proc_rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Samples a process's VmRSS every 20 ms until stopped; returns the peak.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(proc_rss(pid).0);
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        Self { stop, thread }
    }

    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Uploads `data` in 64 KiB chunks.
pub async fn upload(
    client: &mut PayloadsClient<Svc>,
    session: &str,
    name: &str,
    data: &[u8],
) -> Result<proto::Payload, tonic::Status> {
    let mut chunks = vec![proto::UploadChunk {
        chunk: Some(Chunk::Header(proto::UploadHeader {
            session_id: session.into(),
            name: name.into(),
            ..Default::default()
        })),
    }];
    chunks.extend(data.chunks(64 << 10).map(|c| proto::UploadChunk {
        chunk: Some(Chunk::Data(bytes::Bytes::copy_from_slice(c))),
    }));
    client
        .upload(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

pub async fn download(
    client: &mut PayloadsClient<Svc>,
    id: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .download(proto::PayloadRequest {
            payload_id: id.into(),
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(c) = stream.message().await? {
        out.extend_from_slice(&c.data);
    }
    Ok(out)
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// Every payload of a session, through ListPayloads.
pub async fn list_all(
    client: &mut PayloadsClient<Svc>,
    session: &str,
) -> Result<Vec<proto::Payload>, tonic::Status> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_payloads(proto::ListPayloadsRequest {
                session_id: session.into(),
                page_size: 1000,
                page_token: token,
            })
            .await?
            .into_inner();
        out.extend(page.payloads);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Every session the agent sees (any state).
pub async fn list_sessions(server: &Server) -> Result<Vec<proto::Session>> {
    let mut c = server.sessions().await?;
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_sessions(proto::ListSessionsRequest {
                page_size: 1000,
                page_token: token,
                state: 0,
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.sessions);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Files on disk that belong to no finished payload: upload temp files
/// anywhere under `sessions/`, and leftover exec directories.
pub fn temp_files(data_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(data_dir.join("sessions")) {
        for s in rd.flatten() {
            if let Ok(files) = std::fs::read_dir(s.path()) {
                for f in files.flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if name.starts_with(".upload-") {
                        out.push(format!(
                            "sessions/{}/{name}",
                            s.file_name().to_string_lossy()
                        ));
                    }
                }
            }
        }
    }
    // An exec directory the server keeps for its tenant's next exec is its
    // four directories, empty; anything else under `exec/` is left over.
    if let Ok(rd) = std::fs::read_dir(data_dir.join("exec")) {
        for e in rd.flatten() {
            let name = format!("exec/{}", e.file_name().to_string_lossy());
            let Ok(subs) = std::fs::read_dir(e.path()) else {
                out.push(name);
                continue;
            };
            for sub in subs.flatten() {
                let sub_name = sub.file_name().to_string_lossy().into_owned();
                let kept = ["payloads", "spillway", "tmp", "out"].contains(&sub_name.as_str())
                    && std::fs::read_dir(sub.path()).is_ok_and(|mut d| d.next().is_none());
                if !kept {
                    out.push(format!("{name}/{sub_name}"));
                }
            }
        }
    }
    out
}

/// Compares every session directory with its metadata: the files must be
/// exactly the payloads ListPayloads names, and no directory may exist
/// for a session the server does not list. Returns the differences that
/// persist over a few seconds: the listing and the directory are read one
/// after the other, so a deletion in progress (the reaper's first pass
/// after a restart removes files, then metadata) can show for a moment as
/// metadata without its file; an orphan does not go away.
pub async fn orphan_check(server: &Server) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for attempt in 0..10 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        problems = orphan_scan(server).await?;
        if problems.is_empty() {
            break;
        }
    }
    Ok(problems)
}

async fn orphan_scan(server: &Server) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let sessions = list_sessions(server).await?;
    let mut p = server.payloads().await?;
    let mut known = std::collections::BTreeSet::new();
    for s in &sessions {
        known.insert(s.id.clone());
        let mut names: Vec<String> = if s.state == proto::SessionState::Deleted as i32 {
            Vec::new()
        } else {
            list_all(&mut p, &s.id)
                .await?
                .into_iter()
                .map(|x| x.name)
                .collect()
        };
        names.sort();
        let mut files: Vec<String> =
            std::fs::read_dir(server.data_dir.join("sessions").join(&s.id))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
        files.sort();
        if files != names {
            let extra: Vec<_> = files.iter().filter(|f| !names.contains(f)).collect();
            let missing: Vec<_> = names.iter().filter(|n| !files.contains(n)).collect();
            problems.push(format!(
                "session {}: files not in metadata {extra:?}, metadata without file {missing:?}",
                s.id
            ));
        }
    }
    if let Ok(rd) = std::fs::read_dir(server.data_dir.join("sessions")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                problems.push(format!(
                    "directory sessions/{name} belongs to no listed session"
                ));
            }
        }
    }
    Ok(problems)
}

/// VerifyAudit as the auditor: (ok, events checked, first bad seq).
pub async fn verify_audit(server: &Server) -> Result<proto::VerifyAuditResponse> {
    Ok(server
        .audit()
        .await?
        .verify_audit(proto::VerifyAuditRequest {})
        .await?
        .into_inner())
}

/// Latencies and error codes per RPC, from many tasks.
#[derive(Default)]
pub struct Recorder {
    inner: Mutex<BTreeMap<&'static str, RpcStats>>,
    pub ops: AtomicU64,
}

#[derive(Default, Clone)]
pub struct RpcStats {
    pub micros: Vec<u64>,
    pub errors: BTreeMap<String, u64>,
}

impl Recorder {
    pub fn ok(&self, rpc: &'static str, took: Duration) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let mut m = self.inner.lock().unwrap();
        m.entry(rpc)
            .or_default()
            .micros
            .push(took.as_micros() as u64);
    }

    pub fn err(&self, rpc: &'static str, status: &tonic::Status) {
        let mut m = self.inner.lock().unwrap();
        let key = format!("{:?}: {}", status.code(), {
            let msg: String = status.message().chars().take(120).collect();
            msg
        });
        *m.entry(rpc).or_default().errors.entry(key).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<&'static str, RpcStats> {
        self.inner.lock().unwrap().clone()
    }
}

/// The p-th percentile (0..=100) of sorted values.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn ms(micros: u64) -> String {
    format!("{:.1} ms", micros as f64 / 1000.0)
}

pub fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}
