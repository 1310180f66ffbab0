//! Optional TLS and mutual TLS: certificates made at test time with rcgen
//! (a CA, a server certificate for 127.0.0.1, a client certificate).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use spillway::config::TlsConfig;
use spillway::proto::{self, sessions_client::SessionsClient};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::common::*;

struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "spillway test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>, usage| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(vec!["alice".into()], ExtendedKeyUsagePurpose::ClientAuth);
        Self {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            _dir: dir,
        }
    }

    fn server(&self, client_ca: bool) -> TlsConfig {
        TlsConfig {
            cert: Some(self.server_cert.clone()),
            key: Some(self.server_key.clone()),
            client_ca: client_ca.then(|| self.ca.clone()),
        }
    }

    fn client(&self, with_cert: bool) -> ClientTlsConfig {
        let pem = |p: &Path| std::fs::read(p).unwrap();
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(&self.ca)));
        if with_cert {
            tls = tls.identity(Identity::from_pem(
                pem(&self.client_cert),
                pem(&self.client_key),
            ));
        }
        tls
    }
}

fn https(server: &TestServer, tls: ClientTlsConfig) -> Channel {
    Endpoint::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

async fn health(channel: Channel) -> Result<(), tonic::Status> {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(drop)
}

/// Starts a TLS server and waits until a client with `tls` gets a health
/// answer from it.
async fn tls_server(pki: &Pki, client_ca: bool) -> TestServer {
    let (dir, config) = TestServer::config_with(|c| c.tls = pki.server(client_ca)).await;
    let server = TestServer::spawn(dir, config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while health(https(&server, pki.client(true))).await.is_err() {
        assert!(Instant::now() < deadline, "the TLS server did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_a_client_certificate_and_refuses_no_certificate_and_plaintext() {
    let pki = Pki::new();
    let server = tls_server(&pki, true).await;

    // With the client certificate: the whole API, bearer tokens as ever.
    let channel = https(&server, pki.client(true));
    let mut sessions = SessionsClient::with_interceptor(channel, Bearer(Some(ALICE.into())));
    let created = sessions
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.owner, "alice");

    // TLS without a client certificate: the server refuses the handshake
    // (the client sees the CertificateRequired alert, or just the closed
    // connection, depending on timing), every time.
    for _ in 0..3 {
        let answer = health(https(&server, pki.client(false))).await;
        assert!(answer.is_err(), "served a client without a certificate");
    }

    // Plaintext gRPC to the TLS port gets no answer.
    let plain = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let answer = tokio::time::timeout(Duration::from_secs(10), health(plain))
        .await
        .expect("a plaintext call fails at once");
    assert!(answer.is_err(), "plaintext was served on the TLS port");

    // The CLI: --ca and --cert/--key, and a clear refusal without --ca.
    let (ca, cert, key) = (
        pki.ca.clone(),
        pki.client_cert.clone(),
        pki.client_key.clone(),
    );
    let addr = server.addr.to_string();
    let (with_cert, without_ca) = tokio::task::spawn_blocking(move || {
        let run = |extra: &[&Path]| {
            let mut cmd = command();
            cmd.args(["--addr", &addr, "--token", ALICE]);
            if let [ca, rest @ ..] = extra {
                cmd.arg("--ca").arg(ca);
                if let [cert, key] = rest {
                    cmd.arg("--cert").arg(cert).arg("--key").arg(key);
                }
            }
            cmd.args(["session", "ls"]).output().unwrap()
        };
        (run(&[&ca, &cert, &key]), run(&[]))
    })
    .await
    .unwrap();
    assert!(
        with_cert.status.success(),
        "{}",
        String::from_utf8_lossy(&with_cert.stderr)
    );
    assert!(
        String::from_utf8_lossy(&with_cert.stdout).contains(&created.id),
        "{}",
        String::from_utf8_lossy(&with_cert.stdout)
    );
    assert!(!without_ca.status.success());
    let stderr = String::from_utf8_lossy(&without_ca.stderr);
    assert!(stderr.contains("pass --ca"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_client_ca_serves_clients_without_certificates() {
    let pki = Pki::new();
    let server = tls_server(&pki, false).await;
    health(https(&server, pki.client(false))).await.unwrap();
    let https_addr = format!("https://{}", server.addr);
    let ca = pki.ca.clone();
    let out = tokio::task::spawn_blocking(move || {
        command()
            .args(["--addr", &https_addr, "--token", ALICE, "--ca"])
            .arg(ca)
            .args(["session", "ls"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_missing_or_malformed_certificate_stops_startup_naming_the_key() {
    let pki = Pki::new();
    let bad = pki._dir.path().join("bad.pem");
    std::fs::write(&bad, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    for (tls, want) in [
        (
            TlsConfig {
                cert: Some(pki._dir.path().join("missing.pem")),
                ..pki.server(true)
            },
            "tls.cert: cannot read",
        ),
        (
            TlsConfig {
                key: Some(pki.server_cert.clone()),
                ..pki.server(true)
            },
            "tls.key: ",
        ),
        (
            TlsConfig {
                client_ca: Some(bad.clone()),
                ..pki.server(true)
            },
            "tls.client_ca: ",
        ),
        (
            TlsConfig {
                key: Some(pki.client_key.clone()),
                ..pki.server(true)
            },
            "were refused",
        ),
    ] {
        let (_dir, config) = TestServer::config_with(|c| c.tls = tls).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = spillway::server::run(config, listener, std::future::pending())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot set up TLS: ") && err.contains(want),
            "{err}"
        );
    }
}
