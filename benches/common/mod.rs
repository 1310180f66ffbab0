//! Shared by the benches: an in-process server on loopback with one bench
//! token, clients for it, and small timing helpers.

#![allow(dead_code)]

use std::time::Instant;

use spillway::config::{Config, TokenConfig};
use spillway::proto::{
    self, code_mode_client::CodeModeClient, payloads_client::PayloadsClient,
    sessions_client::SessionsClient,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub type Auth = fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;
pub type Svc = InterceptedService<Channel, Auth>;

pub fn auth(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    req.metadata_mut()
        .insert("authorization", "Bearer bench".parse().unwrap());
    Ok(req)
}

pub struct BenchServer {
    pub dir: tempfile::TempDir,
    /// Where it listens, for clients in other processes (token `bench`).
    pub addr: std::net::SocketAddr,
    pub channel: Channel,
    pub sessions: SessionsClient<Svc>,
    pub payloads: PayloadsClient<Svc>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), spillway::server::ServerError>>>,
}

impl BenchServer {
    /// Starts a server whose data dir is under `SPILLWAY_BENCH_DIR` (default
    /// `target`), so raw-disk references run on the same file system.
    ///
    /// It returns once every code-mode image is compiled: the server's
    /// background warm-up would otherwise run beside the first measurements
    /// (the Python image takes tens of seconds on 2 cores). Compiled images
    /// persist in `bench-sandbox-cache` there, so later runs only load them.
    pub async fn start(adjust: impl FnOnce(&mut Config)) -> Self {
        let base = std::path::PathBuf::from(
            std::env::var("SPILLWAY_BENCH_DIR").unwrap_or_else(|_| "target".into()),
        );
        // `target` need not exist when CARGO_TARGET_DIR points elsewhere.
        std::fs::create_dir_all(&base)
            .unwrap_or_else(|e| panic!("cannot make SPILLWAY_BENCH_DIR {}: {e}", base.display()));
        let dir = tempfile::tempdir_in(&base).unwrap();
        let mut config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        config.sandbox.cache_dir =
            Some(std::path::absolute(base.join("bench-sandbox-cache")).unwrap());
        config.auth.tokens = vec![TokenConfig {
            token: Some("bench".into()),
            token_sha256: None,
            principal: "bench".into(),
            tenant: "bench".into(),
            roles: vec![spillway::auth::Role::Agent],
        }];
        adjust(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(spillway::server::run(config, listener, async {
            let _ = stopped.await;
        }));
        let channel = loop {
            if let Ok(c) = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
            {
                break c;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let a: Auth = auth;
        images_ready(channel.clone(), a).await;
        Self {
            dir,
            addr,
            channel: channel.clone(),
            sessions: SessionsClient::with_interceptor(channel.clone(), a),
            payloads: PayloadsClient::with_interceptor(channel, a)
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Uploads `data` to `session` as `name`, in 1 MiB chunks.
    pub async fn upload(&mut self, session: &str, name: &str, data: &[u8]) -> proto::Payload {
        let header = proto::UploadChunk {
            chunk: Some(proto::upload_chunk::Chunk::Header(proto::UploadHeader {
                session_id: session.to_owned(),
                name: name.into(),
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
        self.payloads
            .upload(tokio_stream::iter(std::iter::once(header).chain(chunks)))
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.handle.take().unwrap().await.unwrap().unwrap();
    }
}

/// Runs one trivial exec in each image runtime, which waits for its image to
/// be compiled or loaded.
async fn images_ready(channel: Channel, a: Auth) {
    let mut sessions = SessionsClient::with_interceptor(channel.clone(), a);
    let mut code = CodeModeClient::with_interceptor(channel, a);
    let session = sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;
    let runtimes = code
        .list_runtimes(proto::ListRuntimesRequest {})
        .await
        .unwrap()
        .into_inner()
        .runtimes;
    for r in runtimes.iter().filter(|r| r.name != "wasm") {
        let source = match r.name.as_str() {
            "jq" => ".",
            "python" => "pass",
            _ => "0",
        };
        let reply = code
            .exec(proto::ExecRequest {
                session_id: session.clone(),
                runtime: r.name.clone(),
                source: source.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status,
            proto::ExecStatus::Ok as i32,
            "{}: {reply:?}",
            r.name
        );
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs `f` `rounds` times and returns the median seconds.
pub async fn time_async<F, Fut>(rounds: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut v = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed().as_secs_f64());
    }
    median(v)
}

pub fn time_sync(rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut v = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64());
    }
    median(v)
}

pub fn rounds() -> usize {
    std::env::var("SPILLWAY_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

pub fn machine() -> String {
    format!(
        "{} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    )
}

/// This process's resource usage so far (CPU time, page faults).
pub fn rusage() -> libc::rusage {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    #[allow(unsafe_code)]
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    }
}
