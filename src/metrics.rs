//! Prometheus metrics: one registry per process (prometheus-client), fed by
//! the rooms through the functions here, and served as OpenMetrics text on
//! `metrics.listen` ([`serve`]; off unless configured).
//!
//! **Bounded labels.** RPC methods (a method the server does not have is
//! counted as `unknown`), gRPC codes, runtimes (the configured images),
//! exec statuses and tenants (the configured tokens' tenants). Never a
//! session or payload ID, a name or a path.
//!
//! **What an RPC's figures mean.** The count and code come from the
//! response's headers, where tonic puts the status of every unary call; a
//! stream's status sent after its messages counts as OK. The latency runs
//! from the request to the response headers: the whole call for unary
//! RPCs, the time to the first message for streams.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

/// The `[metrics]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `GET /metrics` is served (`0.0.0.0:9464`); unset (the
    /// default, in dev mode too) serves nothing.
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecLabels {
    runtime: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of the process.
struct Metrics {
    registry: Registry,
    rpcs: Family<RpcLabels, Counter>,
    rpc_seconds: Histograms<MethodLabel>,
    execs: Family<ExecLabels, Counter>,
    stored_bytes: Family<TenantLabel, Counter>,
    stored_payloads: Family<TenantLabel, Counter>,
    cache_hits: Counter,
    cache_misses: Counter,
    cache_fetched_bytes: Counter,
    cache_evictions: Counter,
    audit_append_seconds: Histogram,
    pool_wait_seconds: Histogram,
    postgres_round_trips: Counter,
    reaper_lag_seconds: Gauge<f64, AtomicU64>,
}

/// Buckets from 0.5 ms to about 16 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("spillway");
        let m = Metrics {
            registry: Registry::default(),
            rpcs: Family::default(),
            rpc_seconds: Family::new_with_constructor(seconds),
            execs: Family::default(),
            stored_bytes: Family::default(),
            stored_payloads: Family::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_fetched_bytes: Counter::default(),
            cache_evictions: Counter::default(),
            audit_append_seconds: seconds(),
            pool_wait_seconds: seconds(),
            postgres_round_trips: Counter::default(),
            reaper_lag_seconds: Gauge::default(),
        };
        registry.register(
            "rpc_requests",
            "gRPC calls by method and status code",
            m.rpcs.clone(),
        );
        registry.register(
            "rpc_duration_seconds",
            "gRPC call latency to the response headers, by method",
            m.rpc_seconds.clone(),
        );
        registry.register(
            "exec_runs",
            "Code-mode runs by runtime and status",
            m.execs.clone(),
        );
        registry.register(
            "stored_bytes",
            "Payload bytes stored, by tenant",
            m.stored_bytes.clone(),
        );
        registry.register(
            "stored_payloads",
            "Payloads stored, by tenant",
            m.stored_payloads.clone(),
        );
        registry.register(
            "cache_hits",
            "Reads served by a local copy of a bucket's payload",
            m.cache_hits.clone(),
        );
        registry.register(
            "cache_misses",
            "Reads that fetched a payload from the bucket",
            m.cache_misses.clone(),
        );
        registry.register(
            "cache_fetched_bytes",
            "Bytes fetched from the bucket into local copies",
            m.cache_fetched_bytes.clone(),
        );
        registry.register(
            "cache_evictions",
            "Local copies evicted to stay under store.local_cache_bytes",
            m.cache_evictions.clone(),
        );
        registry.register(
            "audit_append_duration_seconds",
            "Time for an audit append to be durable",
            m.audit_append_seconds.clone(),
        );
        registry.register(
            "postgres_pool_wait_seconds",
            "Time waiting for a Postgres connection",
            m.pool_wait_seconds.clone(),
        );
        registry.register(
            "postgres_round_trips",
            "Round trips to Postgres: statements executed, statements prepared, BEGIN and COMMIT",
            m.postgres_round_trips.clone(),
        );
        registry.register(
            "reaper_lag_seconds",
            "How far behind its due time the oldest entry the reaper found was",
            m.reaper_lag_seconds.clone(),
        );
        Metrics { registry, ..m }
    })
}

/// Counts one RPC.
pub fn rpc(method: &str, code: i32, elapsed: Duration) {
    let method = if code == tonic::Code::Unimplemented as i32 {
        "unknown".to_owned()
    } else {
        method.to_owned()
    };
    let m = metrics();
    m.rpcs
        .get_or_create(&RpcLabels {
            method: method.clone(),
            code: code.to_string(),
        })
        .inc();
    m.rpc_seconds
        .get_or_create(&MethodLabel { method })
        .observe(elapsed.as_secs_f64());
}

/// Counts one code-mode run.
pub fn exec(runtime: &str, status: &str) {
    metrics()
        .execs
        .get_or_create(&ExecLabels {
            runtime: runtime.to_owned(),
            status: status.to_owned(),
        })
        .inc();
}

/// Counts a payload stored for `tenant`.
pub fn stored(tenant: &str, bytes: u64) {
    let m = metrics();
    let label = TenantLabel {
        tenant: tenant.to_owned(),
    };
    m.stored_bytes.get_or_create(&label).inc_by(bytes);
    m.stored_payloads.get_or_create(&label).inc();
}

/// Counts a read served by a local copy.
pub fn cache_hit() {
    metrics().cache_hits.inc();
}

/// Counts a fetch of `bytes` from the bucket.
pub fn cache_miss(bytes: u64) {
    let m = metrics();
    m.cache_misses.inc();
    m.cache_fetched_bytes.inc_by(bytes);
}

/// Counts `n` local copies evicted.
pub fn cache_evicted(n: u64) {
    metrics().cache_evictions.inc_by(n);
}

/// Records how long an audit append took to be durable.
pub fn audit_append(elapsed: Duration) {
    metrics()
        .audit_append_seconds
        .observe(elapsed.as_secs_f64());
}

/// Records a wait for a Postgres connection.
pub fn pool_wait(elapsed: Duration) {
    metrics().pool_wait_seconds.observe(elapsed.as_secs_f64());
}

/// Counts `n` round trips to Postgres.
pub fn postgres_round_trip(n: u64) {
    metrics().postgres_round_trips.inc_by(n);
}

/// Round trips to Postgres so far in this process (what
/// `spillway_postgres_round_trips_total` says), for tests and benches.
pub fn postgres_round_trips() -> u64 {
    metrics().postgres_round_trips.get()
}

/// Sets the reaper's lag.
pub fn reaper_lag(lag: Duration) {
    metrics().reaper_lag_seconds.set(lag.as_secs_f64());
}

/// Every metric, as OpenMetrics text.
pub fn encode() -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &metrics().registry)
        .expect("writing to a String cannot fail");
    out
}

/// Serves `GET /metrics` on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    http::header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                encode(),
            )
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// A tower layer that counts every gRPC call ([`rpc`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcLayer;

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics { inner }
    }
}

/// The service [`RpcLayer`] wraps around the gRPC routes.
#[derive(Debug, Clone)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_owned();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let code = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            rpc(&method, code, start.elapsed());
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    #[test]
    fn counts_carry_bounded_labels_and_unknown_methods_fold_together() {
        let series = "spillway_rpc_requests_total{method=\"unknown\",code=\"12\"} ";
        let before = value(&encode(), series);
        rpc("/spillway.v1.Nope/Random1", 12, Duration::from_millis(1));
        rpc("/spillway.v1.Nope/Random2", 12, Duration::from_millis(1));
        let text = encode();
        assert_eq!(value(&text, series), before + 2.0, "{text}");
        assert!(!text.contains("Random1"), "{text}");
        stored("metrics-test-tenant", 100);
        stored("metrics-test-tenant", 23);
        let text = encode();
        assert_eq!(
            value(
                &text,
                "spillway_stored_bytes_total{tenant=\"metrics-test-tenant\"} "
            ),
            123.0
        );
        assert_eq!(
            value(
                &text,
                "spillway_stored_payloads_total{tenant=\"metrics-test-tenant\"} "
            ),
            2.0
        );
    }
}
