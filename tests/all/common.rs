//! `TestServer`: a real server on a free loopback port, in process, with a
//! fixed cast of principals; plus `ProcessServer`, the real binary as a
//! child process, for crash and memory tests.
//!
//! The metadata engine comes from `SPILLWAY_TEST_ENGINE` (`redb` default,
//! `sled`, `postgres`), so `make test` runs the whole suite against each.
//! With `postgres`, every data directory gets its own database in the test
//! process's throwaway cluster (`spillway::testing::postgres`), kept for
//! the directory's lifetime so a restarted server finds its metadata.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway::auth::Role;
use spillway::config::{Config, EngineKind, TokenConfig};
use spillway::proto::{
    self, code_mode_client::CodeModeClient, payloads_client::PayloadsClient,
    sessions_client::SessionsClient, upload_chunk::Chunk,
};
use tokio::sync::oneshot;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Tokens of the cast: (token, principal, tenant, roles).
pub const CAST: &[(&str, &str, &str, &[Role])] = &[
    ("tok-alice", "alice", "acme", &[Role::Agent]),
    ("tok-bob", "bob", "acme", &[Role::Agent]),
    ("tok-admin", "ada", "acme", &[Role::Admin]),
    ("tok-carol", "carol", "acme", &[Role::Compliance]),
    ("tok-audrey", "audrey", "acme", &[Role::Auditor]),
    (
        "tok-mallory",
        "mallory",
        "other",
        &[Role::Agent, Role::Admin],
    ),
];

pub const ALICE: &str = "tok-alice";
pub const BOB: &str = "tok-bob";
pub const MALLORY: &str = "tok-mallory";

/// An engine a test binary chose for all its servers (the fleet tests run
/// on Postgres whatever `SPILLWAY_TEST_ENGINE` says).
static ENGINE: std::sync::OnceLock<EngineKind> = std::sync::OnceLock::new();

/// Makes every server of this test process use `kind`.
#[allow(dead_code)]
pub fn use_engine(kind: EngineKind) {
    let _ = ENGINE.set(kind);
}

pub fn engine() -> EngineKind {
    if let Some(kind) = ENGINE.get() {
        return *kind;
    }
    match std::env::var("SPILLWAY_TEST_ENGINE").as_deref() {
        Ok("sled") => EngineKind::Sled,
        Ok("postgres") => EngineKind::Postgres,
        _ => EngineKind::Redb,
    }
}

/// The Postgres database of the server whose data lives in `data_dir`:
/// made on first use and remembered in the directory, so a restart of
/// that server opens the same one (and replicas whose directories name the
/// same database share it).
pub fn postgres_url_for(data_dir: &Path) -> String {
    let file = data_dir.join("test-postgres-url");
    if let Ok(url) = std::fs::read_to_string(&file) {
        return url;
    }
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(data_dir)
            .unwrap();
    }
    let url = spillway::testing::postgres::database().url();
    std::fs::write(&file, &url).unwrap();
    url
}

pub fn cast_tokens() -> Vec<TokenConfig> {
    CAST.iter()
        .map(|(token, principal, tenant, roles)| TokenConfig {
            token: Some((*token).into()),
            token_sha256: None,
            principal: (*principal).into(),
            tenant: (*tenant).into(),
            roles: roles.to_vec(),
        })
        .collect()
}

#[derive(Clone)]
pub struct Bearer(pub Option<String>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(req)
    }
}

pub type Svc = InterceptedService<Channel, Bearer>;

/// True once the server reports SERVING on `grpc.health.v1`: the store is
/// open and the dev token written. (A TCP connect can succeed earlier, as
/// soon as the socket listens.)
pub async fn serving(addr: SocketAddr) -> bool {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let Ok(channel) = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
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

/// Client constructors shared by every kind of test server.
pub trait Connect {
    fn addr(&self) -> SocketAddr;

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr()))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    async fn sessions(&self, token: &str) -> SessionsClient<Svc> {
        SessionsClient::with_interceptor(self.channel().await, Bearer(Some(token.into())))
    }

    async fn payloads(&self, token: &str) -> PayloadsClient<Svc> {
        PayloadsClient::with_interceptor(self.channel().await, Bearer(Some(token.into())))
            .max_decoding_message_size(64 << 20)
    }

    async fn codemode(&self, token: &str) -> CodeModeClient<Svc> {
        CodeModeClient::with_interceptor(self.channel().await, Bearer(Some(token.into())))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }
}

/// The runtime images `make images` builds.
pub fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-images")
}

/// One compile cache for every test server of a run (and across runs), so
/// each image is compiled once, not once per test.
pub fn compile_cache() -> PathBuf {
    images_dir().join("build").join("compile-cache")
}

/// Fills the shared compile cache once per test process, before the first
/// server starts: otherwise every server of the first tests compiles the
/// 25 MB Python image at the same time, and timing tests measure that.
pub async fn warm_compile_cache() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = spillway::sandbox::SandboxConfig {
            images_dir: images_dir(),
            cache_dir: Some(compile_cache()),
            ..Default::default()
        };
        let sandbox = std::sync::Arc::new(
            spillway::sandbox::Sandbox::open(
                cfg,
                dir.path(),
                spillway::sandbox::limits::ExecLimits::CEILING,
            )
            .unwrap(),
        );
        // Missing images are reported by the tests that need them.
        let _ = sandbox.prepare_all().await;
    })
    .await;
}

/// The probe guest (`guest/probe`), as module bytes.
pub fn probe_module() -> Vec<u8> {
    let path = images_dir().join("probe.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `make images` first (make test does)",
            path.display()
        )
    })
}

impl Connect for TestServer {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Connect for ProcessServer {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The configuration of an in-process test server with data under `dir`.
pub fn test_config(dir: &Path) -> Config {
    let mut config = Config {
        data_dir: dir.join("data"),
        ..Config::default()
    };
    config.store.engine = engine();
    if engine() == EngineKind::Postgres {
        config.store.postgres_url = postgres_url_for(&config.data_dir);
    }
    config.auth.tokens = cast_tokens();
    config.sandbox.images_dir = images_dir();
    config.sandbox.cache_dir = Some(compile_cache());
    config
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config: Config,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), spillway::server::ServerError>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let (dir, config) = Self::config_with(adjust).await;
        Self::start_in(dir, config).await
    }

    /// The test configuration (the cast's tokens, the shared compile
    /// cache) in a fresh directory, adjusted.
    pub async fn config_with(adjust: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Config) {
        warm_compile_cache().await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        adjust(&mut config);
        (dir, config)
    }

    pub async fn start_in(dir: tempfile::TempDir, config: Config) -> Self {
        let server = Self::spawn(dir, config).await;
        server.wait_ready().await;
        server
    }

    /// A server whose time is `clock` (a `ManualClock` moves by hand).
    pub async fn start_clocked(
        dir: tempfile::TempDir,
        config: Config,
        clock: Arc<dyn spillway::clock::Clock>,
    ) -> Self {
        let server = Self::spawn_clocked(dir, config, clock).await;
        server.wait_ready().await;
        server
    }

    /// Starts the server without waiting until it serves (the caller
    /// probes readiness, e.g. over TLS).
    pub async fn spawn(dir: tempfile::TempDir, config: Config) -> Self {
        Self::spawn_clocked(dir, config, Arc::new(spillway::clock::SystemClock)).await
    }

    async fn spawn_clocked(
        dir: tempfile::TempDir,
        config: Config,
        clock: Arc<dyn spillway::clock::Clock>,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(spillway::server::run_with_clock(
            config.clone(),
            listener,
            clock,
            async {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            dir,
            config,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if serving(self.addr).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("test server did not come up");
    }

    pub async fn anonymous_payloads(&self) -> PayloadsClient<Svc> {
        PayloadsClient::with_interceptor(self.channel().await, Bearer(None))
    }

    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir.clone()
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop(mut self) -> (tempfile::TempDir, Config) {
        self.shutdown.take().unwrap().send(()).ok();
        self.handle.take().unwrap().await.unwrap().unwrap();
        let config = self.config.clone();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        (dir, config)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub async fn create_session(server: &TestServer, token: &str) -> proto::Session {
    server
        .sessions(token)
        .await
        .create_session(proto::CreateSessionRequest {
            label: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

pub fn header(session: &str, name: &str) -> proto::UploadHeader {
    proto::UploadHeader {
        session_id: session.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Uploads `data` in 64 KiB chunks.
pub async fn upload<I: tonic::service::Interceptor>(
    client: &mut PayloadsClient<InterceptedService<Channel, I>>,
    header: proto::UploadHeader,
    data: &[u8],
) -> Result<proto::Payload, tonic::Status> {
    let mut chunks = vec![proto::UploadChunk {
        chunk: Some(Chunk::Header(header)),
    }];
    chunks.extend(data.chunks(64 << 10).map(|c| proto::UploadChunk {
        chunk: Some(Chunk::Data(bytes::Bytes::copy_from_slice(c))),
    }));
    client
        .upload(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

/// A new session of `token`'s holding one payload, `name` with `data`.
pub async fn session_with_payload(
    server: &TestServer,
    token: &str,
    name: &str,
    data: &[u8],
) -> (proto::Session, proto::Payload) {
    let s = create_session(server, token).await;
    let p = upload(&mut server.payloads(token).await, header(&s.id, name), data)
        .await
        .unwrap();
    (s, p)
}

/// The bytes Alice's session `session` is charged, as GetSession reports.
pub async fn usage_bytes(server: &TestServer, session: &str) -> u64 {
    let s = server
        .sessions(ALICE)
        .await
        .get_session(proto::GetSessionRequest {
            session_id: session.into(),
        })
        .await
        .unwrap()
        .into_inner();
    s.usage.unwrap().bytes
}

/// The payloads of Alice's session `session`, as the first page of
/// ListPayloads lists them.
pub async fn payloads_of(server: &TestServer, session: &str) -> Vec<proto::Payload> {
    server
        .payloads(ALICE)
        .await
        .list_payloads(proto::ListPayloadsRequest {
            session_id: session.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .payloads
}

/// An upload stream that has sent its header (`name` in `session`) and a
/// first chunk of `first`, then stays open, sending nothing more, until
/// the sender is dropped. Hand the stream to `PayloadsClient::upload`.
pub async fn open_upload(
    session: &str,
    name: &str,
    first: &'static [u8],
) -> (
    tokio::sync::mpsc::Sender<proto::UploadChunk>,
    tokio_stream::wrappers::ReceiverStream<proto::UploadChunk>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(proto::UploadChunk {
        chunk: Some(Chunk::Header(header(session, name))),
    })
    .await
    .unwrap();
    tx.send(proto::UploadChunk {
        chunk: Some(Chunk::Data(bytes::Bytes::from_static(first))),
    })
    .await
    .unwrap();
    (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
}

pub async fn download<I: tonic::service::Interceptor>(
    client: &mut PayloadsClient<InterceptedService<Channel, I>>,
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
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(data))
}

/// Files in a session's directory, sorted.
pub fn session_files(data_dir: &Path, session: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("sessions").join(session))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A command for the binary with no `SPILLWAY_*` variable of the test
/// process (the server treats unknown ones as config errors).
pub fn command() -> Command {
    let mut cmd = Command::new(binary());
    for (var, _) in std::env::vars() {
        if var.starts_with("SPILLWAY_") {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// The real binary as a child process.
pub struct ProcessServer {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_spillway")
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes a config file with the cast's tokens.
pub fn write_config(dir: &Path) -> PathBuf {
    let mut text = format!(
        "[sandbox]\nimages_dir = {:?}\ncache_dir = {:?}\n\n",
        images_dir(),
        compile_cache()
    );
    for (token, principal, tenant, roles) in CAST {
        let roles: Vec<String> = roles.iter().map(|r| format!("\"{}\"", r.name())).collect();
        text.push_str(&format!(
            "[[auth.tokens]]\ntoken = \"{token}\"\nprincipal = \"{principal}\"\ntenant = \"{tenant}\"\nroles = [{}]\n\n",
            roles.join(", ")
        ));
    }
    let path = dir.join("spillway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl ProcessServer {
    /// Starts `spillway serve` and waits until it accepts connections.
    pub async fn start(config: Option<&Path>, data_dir: &Path, log: PathBuf) -> Self {
        Self::start_with_env(config, data_dir, log, &[]).await
    }

    /// [`ProcessServer::start`] with more environment variables (for
    /// example `RUST_LOG`, which defaults to `info`).
    pub async fn start_with_env(
        config: Option<&Path>,
        data_dir: &Path,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> Self {
        warm_compile_cache().await;
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut cmd = command();
        // Every server of a test run shares the warm compile cache.
        cmd.env("SPILLWAY_SANDBOX__CACHE_DIR", compile_cache());
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--engine")
            .arg(engine().name())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        if engine() == EngineKind::Postgres {
            cmd.env("SPILLWAY_STORE__POSTGRES_URL", postgres_url_for(data_dir));
        }
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().unwrap();
        let mut server = Self { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "server exited with {status}: {}",
                    std::fs::read_to_string(&server.log).unwrap_or_default()
                );
            }
            if serving(addr).await {
                return server;
            }
            assert!(Instant::now() < deadline, "server did not start");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the server's log has `needle`.
    pub fn wait_for_log(&self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains(needle)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server never logged {needle:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Resident set size of the server, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }
}

impl Drop for ProcessServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Samples a process's resident set size every 20 ms until stopped, and
/// returns the peak.
pub struct RssSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0u64;
            while !flag.load(Ordering::Relaxed) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(kb) = status
                        .lines()
                        .find(|l| l.starts_with("VmRSS:"))
                        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                {
                    peak = peak.max(kb * 1024);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        Self { stop, thread }
    }

    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}
