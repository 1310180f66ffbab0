//! The Prometheus endpoint: real calls show up in its counters, with
//! bounded labels and no IDs.

use std::io::{Read as _, Write as _};

use spillway::proto;

use crate::common::*;

/// `GET /metrics` over plain HTTP/1.1, off the runtime (the server runs on
/// it in this process).
async fn scrape(port: u16) -> String {
    tokio::task::spawn_blocking(move || scrape_blocking(port))
        .await
        .unwrap()
}

fn scrape_blocking(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("application/openmetrics-text"), "{out}");
    out
}

/// The value of one series (0 when absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_metrics_endpoint_counts_rpcs_execs_and_stored_bytes_without_ids() {
    let port = free_port();
    let server = TestServer::start_with(|c| {
        c.metrics.listen = Some(format!("127.0.0.1:{port}").parse().unwrap());
    })
    .await;
    let created =
        "spillway_rpc_requests_total{method=\"/spillway.v1.Sessions/CreateSession\",code=\"0\"}";
    let missing = "spillway_rpc_requests_total{method=\"/spillway.v1.Payloads/Stat\",code=\"5\"}";
    let jq_ok = "spillway_exec_runs_total{runtime=\"jq\",status=\"ok\"}";
    let stored = "spillway_stored_bytes_total{tenant=\"acme\"}";
    let before = scrape(port).await;

    let data = b"{\"a\":1}\n".repeat(1000);
    let (session, _) = session_with_payload(&server, ALICE, "a.ndjson", &data).await;
    let e = server
        .payloads(ALICE)
        .await
        .stat(proto::PayloadRequest {
            payload_id: "pl_00000000000000000000000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let r = server
        .codemode(ALICE)
        .await
        .exec(proto::ExecRequest {
            session_id: session.id.clone(),
            runtime: "jq".into(),
            source: "1".into(),
            args: vec!["-n".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{r:?}");

    let after = scrape(port).await;
    // Other tests of this process count too, so these are lower bounds.
    assert!(
        value(&after, created) >= value(&before, created) + 1.0,
        "{after}"
    );
    assert!(
        value(&after, missing) >= value(&before, missing) + 1.0,
        "{after}"
    );
    assert!(
        value(&after, jq_ok) >= value(&before, jq_ok) + 1.0,
        "{after}"
    );
    assert!(
        value(&after, stored) >= value(&before, stored) + data.len() as f64,
        "{after}"
    );
    assert!(
        after.contains("spillway_rpc_duration_seconds_bucket{"),
        "{after}"
    );
    assert!(
        after.contains("spillway_audit_append_duration_seconds_count"),
        "{after}"
    );
    // No session or payload ID is ever a label.
    let id = regex::Regex::new(r"(ses|pl)_[0-9a-f]{32}").unwrap();
    assert!(!id.is_match(&after), "{after}");
}
