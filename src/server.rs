//! Builds and runs the gRPC server: Sessions, Payloads, Context, CodeMode,
//! Audit and Policies behind the authenticating interceptor, plus `grpc.health.v1`
//! and reflection (v1 and v1alpha). One list (`Served`) feeds the router
//! and health, so every served service reports its status.
//!
//! Shutdown: when the shutdown future resolves, health turns NOT_SERVING,
//! the listener closes, in-flight calls get `shutdown_grace` to finish, and
//! the store is flushed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus::{self, NotServing, Serving};

use crate::api::{
    AuditService, Authenticator, CodeModeService, ContextService, PayloadsService, PoliciesService,
    SessionsService,
};
use crate::audit::{AuditLog, AuditWriter};
use crate::auth::TokenTable;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::map_decode_status;
use crate::inspect::StructureCache;
use crate::proto::{
    audit_server::AuditServer, code_mode_server::CodeModeServer, context_server::ContextServer,
    payloads_server::PayloadsServer, policies_server::PoliciesServer,
    sessions_server::SessionsServer,
};
use crate::sandbox::{Sandbox, SandboxError};
use crate::service::Service;
use crate::store::{Store, StoreError, StoreSettings};

/// HTTP/2 receive window of one stream. Large bodies (an Offload turn, an
/// upload) then flow without a round trip per 64 KiB; measured: a 50 MB
/// Offload went from 842 ms to 358 ms.
const STREAM_WINDOW: u32 = 8 << 20;
/// HTTP/2 receive window of one connection: the most a client can have in
/// flight towards the server on one connection.
const CONNECTION_WINDOW: u32 = 32 << 20;
/// Largest HTTP/2 frame the server accepts: fewer frames per large message.
const MAX_FRAME: u32 = 1 << 20;
/// The audit journal's file in the data directory (see `audit::journal`).
pub const AUDIT_JOURNAL: &str = "audit.journal";
/// The served services, authenticated, and their names: the one list that
/// the router and health are built from.
struct Served {
    auth: Authenticator,
    routes: tonic::service::Routes,
    names: Names,
}

/// The names of the served services, for health.
#[derive(Clone, Default)]
struct Names(Vec<&'static str>);

impl Names {
    /// Reports every name, and the server as a whole (`""`), as `status`.
    async fn report(&self, reporter: &tonic_health::server::HealthReporter, status: ServingStatus) {
        reporter.set_service_status("", status).await;
        for name in &self.0 {
            reporter.set_service_status(*name, status).await;
        }
    }
}

impl Served {
    fn new(auth: Authenticator) -> Self {
        Self {
            auth,
            routes: tonic::service::Routes::default(),
            names: Names::default(),
        }
    }

    /// Serves `svc` behind the authenticating interceptor.
    fn add<S>(&mut self, svc: S)
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.names.0.push(S::NAME);
        let routes = std::mem::take(&mut self.routes);
        self.routes = routes.add_service(InterceptedService::new(svc, self.auth.clone()));
    }

    async fn report(&self, reporter: &tonic_health::server::HealthReporter, status: ServingStatus) {
        self.names.report(reporter, status).await;
    }
}

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Dev mode refuses non-loopback addresses.
    #[error(
        "no [[auth.tokens]] are configured, so the server runs in dev mode with a generated token, and dev mode listens on loopback only; {0} is not loopback. Configure tokens, or listen on 127.0.0.1"
    )]
    DevModeNotLoopback(SocketAddr),
    /// The data directory or dev token could not be written.
    #[error("cannot prepare the data directory: {0}")]
    DataDir(#[source] std::io::Error),
    /// The store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    /// The audit writer's thread could not be started.
    #[error("cannot start the audit writer thread: {0}")]
    AuditWriter(#[source] std::io::Error),
    /// The code-mode sandbox could not be set up.
    #[error("cannot start code mode: {0}")]
    Sandbox(#[from] SandboxError),
    /// Reflection could not be built.
    #[error("cannot build reflection: {0}")]
    Reflection(String),
    /// The TLS files could not be loaded.
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The console could not start.
    #[error("cannot start the console: {0}")]
    Console(#[from] crate::console::ConsoleError),
    /// A startup task panicked.
    #[error("startup task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// `metrics.listen` could not be bound.
    #[error(
        "cannot listen on metrics.listen: {0}; pick a free address or leave metrics.listen unset"
    )]
    MetricsListen(#[source] std::io::Error),
}

/// Bounds glibc's malloc arenas to two per core (its default is eight per
/// core). Each upload holds a blocking thread while it streams, and every
/// new thread may get an arena of its own, which stays fragmented after the
/// thread goes: under waves of stalled and broken uploads the resident set
/// grew about 35 MiB in six rounds of a hundred (`make reliability`,
/// slow-clients) and then stayed flat with four arenas. Keeps an explicit
/// `MALLOC_ARENA_MAX` from the environment. Does nothing on other libcs.
pub fn bound_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = libc::c_int::try_from(2 * cores).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a glibc tunable; it is called before
        // the runtime starts any thread.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Runs the server on `listener` until `shutdown` resolves.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    run_with_clock(config, listener, Arc::new(SystemClock), shutdown).await
}

/// [`run`] with an explicit clock (tests move time by hand).
pub async fn run_with_clock(
    config: Config,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let local = listener.local_addr().map_err(ServerError::DataDir)?;
    // Before anything is opened: a bad certificate is a config error.
    let tls = crate::tls::server_config(&config.tls)?;
    crate::fsutil::create_private_dir_all(&config.data_dir).map_err(ServerError::DataDir)?;
    let tokens = if config.dev_mode() {
        if !local.ip().is_loopback() {
            return Err(ServerError::DevModeNotLoopback(local));
        }
        let (table, dev) =
            TokenTable::with_dev_token(&config.data_dir).map_err(ServerError::DataDir)?;
        tracing::warn!(
            token_file = %dev.path.display(),
            "dev mode: no tokens configured; generated an admin token for tenant \"dev\" (the CLI finds it by itself)"
        );
        table
    } else {
        TokenTable::from_config(&config.auth.tokens)
    };
    let tokens = Arc::new(tokens);
    // Bound before anything is opened: a taken address is a startup error.
    let console_listener = crate::console::bind(&config).await?;
    let metrics_listener = match config.metrics.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(ServerError::MetricsListen)?,
        ),
        None => None,
    };

    let settings = StoreSettings {
        engine: config.store.engine,
        max_payload_bytes: config.limits.max_payload_bytes,
        retention: config.policy.retention,
        session_ttl: config.policy.session_ttl,
        cache_bytes: config.store.cache_bytes,
        postgres: (config.store.engine == crate::store::EngineKind::Postgres).then(|| {
            crate::store::PostgresSettings {
                pool_size: config.store.postgres_pool_size,
                lock_pool_size: config.store.postgres_pool_size,
                ..crate::store::PostgresSettings::new(config.store.postgres_url.clone())
            }
        }),
        objects: (!config.store.blobs.is_empty()).then(|| crate::store::ObjectSettings {
            url: config.store.blobs.clone(),
            s3: config.store.s3.clone(),
            local_cache_bytes: config.store.local_cache_bytes,
            purge_confirm_timeout: config.store.purge_confirm_timeout,
        }),
    };
    let data_dir = config.data_dir.clone();
    // The store and the audit log share one engine; deletions a crash
    // interrupted are audited as the store finishes them.
    let inspect_cache = Arc::new(StructureCache::new());
    let content_cache = inspect_cache.clone();
    let (store, audit_log, report) = tokio::task::spawn_blocking(move || {
        let engine = crate::store::open_engine(&data_dir, &settings)?;
        let (audit_log, replayed) =
            AuditLog::with_journal(engine.clone(), clock.clone(), &data_dir.join(AUDIT_JOURNAL))?;
        if replayed > 0 {
            tracing::warn!(
                records = replayed,
                "audit events the store lost in a crash were replayed from the audit journal"
            );
        }
        let (store, report) = Store::open(
            engine,
            &data_dir,
            settings,
            clock,
            content_cache,
            &mut |r| {
                audit_log
                    .append(crate::audit::deletion_finished_after_crash(r))
                    .map(drop)
            },
        )?;
        Ok::<_, crate::store::StoreError>((store, audit_log, report))
    })
    .await??;
    let store = Arc::new(store);
    let audit_log = Arc::new(audit_log);
    tracing::info!(
        engine = store.engine_name(),
        repaired = !report.is_clean(),
        deletions_finished = report.deletions_finished,
        "store open"
    );

    let sandbox = {
        let (cfg, dir, ceiling) = (
            config.sandbox.clone(),
            config.data_dir.clone(),
            config.policy.exec_ceiling,
        );
        Arc::new(tokio::task::spawn_blocking(move || Sandbox::open(cfg, &dir, ceiling)).await??)
    };
    sandbox.warm_up();

    let audit_writer = AuditWriter::start(&audit_log).map_err(ServerError::AuditWriter)?;
    let (reaper, _reaper_guard) =
        crate::reaper::spawn(store.clone(), audit_writer.clone(), config.reaper.clone());
    let reaper_holder = reaper.holder().to_owned();
    let _purger_guard = (!config.store.blobs.is_empty())
        .then(|| crate::reaper::spawn_purger(store.clone(), config.store.purge_interval));
    let config = Arc::new(config);
    let state = Service::new(
        store.clone(),
        audit_log,
        audit_writer,
        inspect_cache,
        config.clone(),
        sandbox,
        reaper,
    );
    let auth = Authenticator::new(tokens.clone());
    let limits = &config.limits;

    let sessions = SessionsServer::new(SessionsService::new(state.clone()))
        .max_decoding_message_size(limits.max_request_message_bytes)
        .max_encoding_message_size(limits.max_response_message_bytes);
    // Offload carries a whole turn in one message, so Payloads accepts up
    // to the Offload limit; Upload enforces the chunk limit itself.
    let offload_request = limits
        .max_offload_request_bytes
        .max(limits.max_request_message_bytes);
    let payloads = PayloadsServer::new(PayloadsService::new(state.clone()))
        .max_decoding_message_size(offload_request)
        // An Offload reply carries the turn's inline results and notices:
        // bounded by the request plus the previews.
        .max_encoding_message_size(
            limits.max_offload_request_bytes + limits.max_response_message_bytes,
        );

    // Histories are large: Context takes and returns messages up to the
    // Offload limit.
    let context = ContextServer::new(ContextService::new(state.clone()))
        .max_decoding_message_size(offload_request)
        .max_encoding_message_size(
            limits
                .max_offload_request_bytes
                .max(limits.max_response_message_bytes),
        );

    // An Exec carries at most a module and a script; its reply is bounded
    // by the stdout notice and the stderr cap.
    let codemode = CodeModeServer::new(CodeModeService::new(state.clone()))
        .max_decoding_message_size(
            (config.sandbox.max_module_bytes + config.sandbox.max_source_bytes + (1 << 20))
                .max(limits.max_request_message_bytes),
        )
        .max_encoding_message_size(limits.max_response_message_bytes);

    let audit = AuditServer::new(AuditService::new(state.clone()))
        .max_decoding_message_size(limits.max_request_message_bytes)
        .max_encoding_message_size(limits.max_response_message_bytes);
    let policies = PoliciesServer::new(PoliciesService::new(state.clone()))
        .max_decoding_message_size(limits.max_request_message_bytes)
        .max_encoding_message_size(limits.max_response_message_bytes);

    // The one list of served services: it feeds the router and health.
    let mut served = Served::new(auth);
    served.add(sessions);
    served.add(payloads);
    served.add(context);
    served.add(codemode);
    served.add(audit);
    served.add(policies);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    served.report(&health_reporter, Serving).await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // v1 and v1alpha both: older tools (grpcurl 1.8) ask for v1alpha.
    let reflection_alpha = reflection()
        .build_v1alpha()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    let reflection = reflection()
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    served.add(reflection);
    served.add(reflection_alpha);

    let decode_limits = limits.clone();
    let oversize =
        tower::util::MapResponseLayer::new(move |mut resp: http::Response<tonic::body::Body>| {
            if let Some(status) = tonic::Status::from_header_map(resp.headers()) {
                let mapped = map_decode_status(status.clone(), &decode_limits);
                if mapped.code() != status.code() {
                    let _ = mapped.add_header(resp.headers_mut());
                }
            }
            resp
        });

    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(listener) = metrics_listener {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "serving Prometheus metrics at /metrics");
        }
        tokio::spawn(async move {
            let stop = async {
                let _ = metrics_stopped.await;
            };
            if let Err(e) = crate::metrics::serve(listener, stop).await {
                tracing::error!(error = %e, "the metrics endpoint stopped");
            }
        });
    }

    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    // The console stops when this sender goes: at shutdown, or with the
    // server if it fails.
    let (console_stop, console_rx) = tokio::sync::watch::channel(());
    let console = match console_listener {
        Some(l) => Some(crate::console::spawn(
            l,
            config.clone(),
            tokens.clone(),
            state.clone(),
            console_rx,
        )?),
        None => None,
    };
    let (reporter, names) = (health_reporter.clone(), served.names.clone());
    let signal = async move {
        shutdown.await;
        drop(console_stop);
        names.report(&reporter, NotServing).await;
        let _ = drain_tx.send(());
    };

    tracing::info!(
        addr = %local,
        tls = tls.is_some(),
        client_certs = config.tls.client_ca.is_some(),
        "listening"
    );
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| crate::tls::TlsError::rejected(&e))?;
    }
    let serve = builder
        .max_concurrent_streams(limits.max_concurrent_streams)
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .max_frame_size(Some(MAX_FRAME))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .layer(oversize)
        .layer(crate::metrics::RpcLayer)
        .add_routes(served.routes)
        .add_service(health)
        // TCP_NODELAY: without it, a reply that follows a small write of
        // ours (a WINDOW_UPDATE for a large request) waits for the client's
        // delayed ACK, 40 ms on Linux.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            signal,
        );
    tokio::pin!(serve);

    let grace = config.shutdown_grace;
    tokio::select! {
        r = &mut serve => r?,
        _ = async { if drain_rx.await.is_ok() { tokio::time::sleep(grace).await } else { std::future::pending().await } } => {
            tracing::warn!(grace_secs = grace.as_secs(), "in-flight calls did not finish within the shutdown grace; stopping anyway");
        }
    }
    if let Some(console) = console
        && tokio::time::timeout(std::time::Duration::from_secs(5), console)
            .await
            .is_err()
    {
        tracing::warn!("the console did not stop within 5 s; leaving it");
    }
    let _ = metrics_stop.send(());
    // Reaping stops here; in fleet mode another replica takes the lease at
    // once instead of waiting for it to lapse.
    drop(_reaper_guard);
    let holder = reaper_holder;
    tokio::task::spawn_blocking(move || {
        if let Err(e) = store.release_reaper_lease(&holder) {
            tracing::warn!(error = %e, "could not release the reaper's lease; another replica takes it once it lapses");
        }
        store.flush()
    })
    .await??;
    tracing::info!("stopped; storage flushed");
    Ok(())
}
