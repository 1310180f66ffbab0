//! Limits and inputs that one caller could use against the others: quotas
//! that match deduplication, requests that do not decode, and ambiguous
//! credentials.

use bytes::{Buf as _, BufMut as _};
use spillway::proto;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::common::*;

/// A session of alice's with a byte quota.
async fn session_with_quota(server: &TestServer, max_session_bytes: u64) -> proto::Session {
    server
        .sessions(ALICE)
        .await
        .create_session(proto::CreateSessionRequest {
            policy: Some(proto::Policy {
                max_session_bytes,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn identical_bytes_count_once_against_the_session_quota_for_upload_and_offload() {
    let server = TestServer::start().await;
    let session = session_with_quota(&server, 1500).await;
    let mut p = server.payloads(ALICE).await;
    let same = vec![b'a'; 1000];
    upload(&mut p, header(&session.id, "one.txt"), &same)
        .await
        .unwrap();
    // The second copy adds no bytes: it is linked, so it fits.
    let again = upload(&mut p, header(&session.id, "two.txt"), &same).await;
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(usage_bytes(&server, &session.id).await, 1000);
    // Offload of the same bytes, large enough to be offloaded, fits too.
    let turn = proto::OffloadRequest {
        session_id: session.id.clone(),
        results: vec![proto::ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "t".into(),
            content: same.clone().into(),
            ..Default::default()
        }],
        settings: Some(proto::OffloadSettings {
            per_call_tokens: Some(10),
            ..Default::default()
        }),
        ..Default::default()
    };
    let reply = p.offload(turn).await.unwrap().into_inner();
    assert!(reply.outcomes[0].payload.is_some(), "{reply:?}");
    assert_eq!(usage_bytes(&server, &session.id).await, 1000);
    // Distinct bytes of the same size do not fit, and say why.
    let other = upload(&mut p, header(&session.id, "three.txt"), &[b'b'; 1000])
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::ResourceExhausted);
    assert!(other.message().contains("max_session_bytes"), "{other:?}");
    assert_eq!(usage_bytes(&server, &session.id).await, 1000);
}

#[tokio::test]
async fn identical_and_distinct_uploads_racing_at_the_quota_keep_it_exact() {
    let server = TestServer::start().await;
    let session = session_with_quota(&server, 1500).await;
    let mut p = server.payloads(ALICE).await;
    let same = vec![b's'; 300];
    upload(&mut p, header(&session.id, "seed.txt"), &same)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..20u8 {
        let mut p = server.payloads(ALICE).await;
        let sid = session.id.clone();
        // Even: the stored bytes again; odd: 300 bytes of their own.
        let data = if i % 2 == 0 {
            same.clone()
        } else {
            vec![b'A' + i; 300]
        };
        tasks.push(tokio::spawn(async move {
            let name = format!("f{i}.txt");
            (i, upload(&mut p, header(&sid, &name), &data).await)
        }));
    }
    let mut distinct_stored = 0;
    for t in tasks {
        let (i, r) = t.await.unwrap();
        match (i % 2 == 0, r) {
            (true, r) => assert!(r.is_ok(), "a duplicate was refused: {r:?}"),
            (false, Ok(_)) => distinct_stored += 1,
            (false, Err(e)) => assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}"),
        }
    }
    // 300 seeded; 1200 more fit: exactly four distinct uploads.
    assert_eq!(distinct_stored, 4);
    assert_eq!(usage_bytes(&server, &session.id).await, 1500);
}

/// Sends request bytes as they are, and returns the reply bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_call(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(body);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(req, path, RawCodec).await.unwrap_err()
}

#[tokio::test]
async fn undecodable_requests_are_invalid_argument_naming_the_field() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    // SearchRequest { session_id, pattern: invalid UTF-8 }.
    let mut body = vec![0x0a, session.id.len() as u8];
    body.extend_from_slice(session.id.as_bytes());
    body.extend_from_slice(&[0x1a, 3, b'a', 0xff, 0xfe]);
    let s = raw_call(&server, "/spillway.v1.Payloads/Search", body).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("pattern"), "{s:?}");
    assert!(s.message().contains("nothing was done"), "{s:?}");
    // Garbage: a field of a wire type that cannot be.
    let s = raw_call(
        &server,
        "/spillway.v1.Sessions/GetSession",
        vec![0x0f, 0xff, 0xff, 0xff, 0xff, 0xff],
    )
    .await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
}

#[tokio::test]
async fn two_authorization_headers_are_refused_even_when_both_are_valid() {
    let server = TestServer::start().await;
    let mut client = proto::sessions_client::SessionsClient::with_interceptor(
        server.channel().await,
        Bearer(None),
    );
    let mut req = tonic::Request::new(proto::CreateSessionRequest::default());
    for token in [ALICE, BOB] {
        req.metadata_mut()
            .append("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let err = client.create_session(req).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("more than one"), "{err:?}");
}

/// Runs python in `session` over `inputs`; prints `path<TAB>content` for
/// every entry of `/spillway/payloads.json`.
async fn guest_view(server: &TestServer, session: &str, inputs: &[&str]) -> Vec<(String, String)> {
    let source = "import json\nfor e in json.load(open('/spillway/payloads.json')):\n    print(e['id'] + '\\t' + e['path'] + '\\t' + open(e['path']).read())\n";
    let r = server
        .codemode(ALICE)
        .await
        .exec(proto::ExecRequest {
            session_id: session.into(),
            runtime: "python".into(),
            source: source.into(),
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, proto::ExecStatus::Ok as i32, "{r:?}");
    r.stdout
        .lines()
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            let (id, path, content) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            (format!("{id} {path}"), content.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn a_name_equal_to_an_id_cannot_shadow_that_payload_in_either_order() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let y = upload(&mut p, header(&session.id, "y.txt"), b"Y")
        .await
        .unwrap();
    let x = upload(&mut p, header(&session.id, &y.id), b"X")
        .await
        .unwrap();
    assert_ne!(x.name, y.id, "a name of the ID shape is never given");
    for order in [[&x.id, &y.id], [&y.id, &x.id]] {
        let seen = guest_view(&server, &session.id, &[order[0], order[1]]).await;
        let by_id: std::collections::HashMap<_, _> = seen.into_iter().collect();
        // What Payload.path says is where the script finds the bytes.
        assert_eq!(by_id[&format!("{} {}", x.id, x.path)], "X", "{by_id:?}");
        assert_eq!(by_id[&format!("{} {}", y.id, y.path)], "Y", "{by_id:?}");
    }
}

#[tokio::test]
async fn equal_and_prefix_names_each_reach_their_own_bytes_at_their_payload_path() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut p = server.payloads(ALICE).await;
    let a = upload(&mut p, header(&session.id, "a"), b"first")
        .await
        .unwrap();
    let b = upload(&mut p, header(&session.id, "a"), b"second")
        .await
        .unwrap();
    let c = upload(&mut p, header(&session.id, "a.json"), b"third")
        .await
        .unwrap();
    assert_ne!(a.path, b.path, "two equal names get two paths");
    let seen = guest_view(&server, &session.id, &[&c.id, &b.id, &a.id]).await;
    let by_id: std::collections::HashMap<_, _> = seen.into_iter().collect();
    for (rec, want) in [(&a, "first"), (&b, "second"), (&c, "third")] {
        assert_eq!(
            by_id[&format!("{} {}", rec.id, rec.path)],
            want,
            "{by_id:?}"
        );
    }
}
