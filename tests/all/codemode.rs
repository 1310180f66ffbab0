//! CodeMode: the four runtimes against a 50 MB payload, escapes, limits,
//! concurrency and the result contract.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spillway::proto::{self, ExecStatus};
use tonic::Code;

use crate::common::*;

fn exec(session: &str, runtime: &str, source: &str) -> proto::ExecRequest {
    proto::ExecRequest {
        session_id: session.into(),
        runtime: runtime.into(),
        source: source.into(),
        ..Default::default()
    }
}

fn probe(session: &str, args: &[&str]) -> proto::ExecRequest {
    proto::ExecRequest {
        session_id: session.into(),
        runtime: "wasm".into(),
        module: probe_module().into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn limits(timeout_ms: u64, memory_bytes: u64, max_stdout_bytes: u64) -> Option<proto::ExecLimits> {
    Some(proto::ExecLimits {
        timeout_ms,
        memory_bytes,
        max_stdout_bytes,
        fuel: 0,
    })
}

fn status(r: &proto::ExecResult) -> ExecStatus {
    ExecStatus::try_from(r.status).unwrap()
}

/// Alice's exec, which must be answered (a failed script is an answer).
async fn exec_as_alice(server: &TestServer, req: proto::ExecRequest) -> proto::ExecResult {
    server
        .codemode(ALICE)
        .await
        .exec(req)
        .await
        .unwrap()
        .into_inner()
}

async fn session_with(server: &TestServer, name: &str, data: &[u8]) -> (String, proto::Payload) {
    let (s, p) = session_with_payload(server, ALICE, name, data).await;
    (s.id, p)
}

#[tokio::test]
async fn list_runtimes_offers_jq_javascript_python_and_wasm_with_defaults() {
    let server = TestServer::start().await;
    let r = server
        .codemode(ALICE)
        .await
        .list_runtimes(proto::ListRuntimesRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = r.runtimes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["jq", "javascript", "python", "wasm"],
        "run `make images` if images are missing"
    );
    for rt in &r.runtimes {
        let l = rt.default_limits.unwrap();
        assert_eq!(
            (l.timeout_ms, l.memory_bytes),
            (30_000, 512 << 20),
            "{}",
            rt.name
        );
        assert!(!rt.description.is_empty() && !rt.language_version.is_empty());
    }
}

#[tokio::test]
async fn every_escape_attempt_is_refused_and_the_payload_is_unchanged() {
    let server = TestServer::start().await;
    let data = br#"{"secret": "payload bytes"}"#;
    let (sid, p) = session_with(&server, "target.json", data).await;
    let r = exec_as_alice(&server, probe(&sid, &["escape", "target.json"])).await;
    assert_eq!(status(&r), ExecStatus::Ok, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 22, "{}", r.stdout);
    for line in &lines {
        assert!(line.contains(" refused "), "escape succeeded: {line}");
    }
    let back = download(&mut server.payloads(ALICE).await, &p.id).await;
    assert_eq!(back.unwrap(), data);
    // Nothing the probe tried left a file in the session directory.
    assert_eq!(
        session_files(&server.data_dir(), &sid),
        vec!["target.json".to_owned()]
    );
}

#[tokio::test]
async fn scripts_cannot_reach_the_host_environment_files_or_network() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let py = c
        .exec(exec(
            &sid,
            "python",
            r#"
import os
out = []
for path in ["/etc/passwd", "/payloads/../../etc/passwd", "/tmp/../../etc/passwd"]:
    try:
        open(path).read(); out.append("ALLOWED " + path)
    except OSError as e:
        out.append("refused " + path)
out.append("env " + str(len(os.environ)))
try:
    import socket
    socket.create_connection(("127.0.0.1", 22), timeout=2); out.append("ALLOWED socket")
except (ImportError, OSError):
    out.append("refused socket")
try:
    open("/payloads/d.json", "w"); out.append("ALLOWED write")
except OSError:
    out.append("refused write")
print("\n".join(out))
"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&py), ExecStatus::Ok, "{py:?}");
    assert!(!py.stdout.contains("ALLOWED"), "{}", py.stdout);
    assert!(py.stdout.contains("env 0"), "{}", py.stdout);
    assert_eq!(py.stdout.matches("refused").count(), 5, "{}", py.stdout);

    let js = c
        .exec(exec(
            &sid,
            "javascript",
            r#"
const out = [];
for (const p of ["/etc/passwd", "/payloads/../../etc/passwd"]) {
  try { readText(p); out.push("ALLOWED " + p); } catch (e) { out.push("refused " + p); }
}
try { writeOut("../payloads/d.json", "x"); out.push("ALLOWED writeOut"); } catch (e) { out.push("refused writeOut"); }
console.log(out.join("\n"));
"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&js), ExecStatus::Ok, "{js:?}");
    assert!(!js.stdout.contains("ALLOWED"), "{}", js.stdout);
    assert_eq!(js.stdout.matches("refused").count(), 3, "{}", js.stdout);
}

#[tokio::test]
async fn another_sessions_payload_is_not_found_by_id_or_path() {
    let server = TestServer::start().await;
    let (mine, _) = session_with(&server, "mine.json", b"[1]").await;
    let (_, theirs) = session_with(&server, "theirs.json", b"[2]").await;
    let mut c = server.codemode(ALICE).await;
    let mut req = exec(&mine, "jq", ".");
    req.inputs = vec![theirs.id.clone()];
    let err = c.exec(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains(&theirs.id));
    // By path: only the session's own payloads are under /payloads.
    let r = c
        .exec(exec(
            &mine,
            "python",
            &format!(
                "import os\nprint(sorted(os.listdir('/payloads')))\ntry:\n    open('/payloads/{}')\n    print('ALLOWED')\nexcept OSError:\n    print('refused')",
                theirs.id
            ),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.stdout.contains("refused") && !r.stdout.contains("theirs"),
        "{r:?}"
    );
    // Another tenant cannot exec in the session at all.
    let err = server
        .codemode(MALLORY)
        .await
        .exec(exec(&mine, "jq", "."))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn an_infinite_loop_stops_within_the_timeout_plus_half_a_second() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    for (runtime, source) in [
        ("jq", "def f: f; f"),
        ("javascript", "for (;;) {}"),
        ("python", "while True:\n    pass"),
        ("wasm", "(module (func (export \"_start\") (loop br 0)))"),
    ] {
        let mut req = exec(&sid, runtime, source);
        req.limits = limits(1000, 0, 0);
        let started = Instant::now();
        let r = c.exec(req).await.unwrap().into_inner();
        let took = started.elapsed();
        assert_eq!(status(&r), ExecStatus::Timeout, "{runtime}: {r:?}");
        // From its start to its stop, measured by the server (end to end
        // also counts the queue and, for wasm, compiling the module).
        let ran = Duration::from_millis(r.usage.unwrap().wall_ms);
        assert!(ran < Duration::from_millis(1500), "{runtime} ran {ran:?}");
        assert!(
            took < Duration::from_secs(10),
            "{runtime} took {took:?} end to end"
        );
        assert!(
            r.message.starts_with("timed out after 1 s"),
            "{}",
            r.message
        );
    }
}

#[tokio::test]
async fn a_memory_bomb_is_stopped_at_its_limit() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let cap = 128u64 << 20;
    for (runtime, req) in [
        ("wasm", probe(&sid, &["alloc"])),
        (
            "javascript",
            exec(
                &sid,
                "javascript",
                "const a = []; for (;;) a.push(new Array(1e6).fill(7));",
            ),
        ),
        (
            "python",
            exec(
                &sid,
                "python",
                "a = []\nwhile True:\n    a.append(bytearray(16 << 20))",
            ),
        ),
        (
            "jq",
            exec(
                &sid,
                "jq",
                "[limit(100000000; repeat(\"xxxxxxxxxxxxxxxx\"))] | length",
            ),
        ),
    ] {
        let mut req = req;
        req.limits = limits(20_000, cap, 0);
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(status(&r), ExecStatus::MemoryLimit, "{runtime}: {r:?}");
        let peak = r.usage.unwrap().peak_memory_bytes;
        assert!(peak <= cap, "{runtime}: peak {peak}");
        assert!(
            r.message.contains("memory limit of 128 MiB"),
            "{}",
            r.message
        );
    }
}

#[tokio::test]
async fn a_stdout_flood_is_capped_stopped_and_only_its_head_is_shown() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let mut p = server.payloads(ALICE).await;
    // Unstopped, these would print gigabytes.
    for (runtime, req) in [
        ("wasm", probe(&sid, &["flood"])),
        (
            "python",
            exec(&sid, "python", "while True:\n    print('x' * 8191)"),
        ),
    ] {
        let mut req = req;
        req.limits = limits(30_000, 0, 2 << 20);
        let started = Instant::now();
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(
            status(&r),
            ExecStatus::OutputLimit,
            "{runtime}: {}",
            r.message
        );
        let usage = r.usage.unwrap();
        assert!(
            Duration::from_millis(usage.wall_ms) < Duration::from_secs(10),
            "{runtime} was stopped only after {} ms",
            usage.wall_ms
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{runtime}");
        assert_eq!(usage.stdout_bytes, 2 << 20, "{runtime}");
        // The cut-off output is not kept: no payload, only its head, and
        // the message says so and how to proceed.
        assert!(r.stdout_payload.is_none(), "{runtime}: {r:?}");
        assert!(
            !r.stdout.is_empty() && r.stdout.len() <= 8192,
            "{runtime}: the model gets the head of the flood, {} bytes",
            r.stdout.len()
        );
        assert!(
            r.message.contains("not kept as a payload")
                && r.message.contains(&format!(
                    "the stdout field holds its first {} bytes",
                    r.stdout.len()
                ))
                && r.message.contains("raise limits.max_stdout_bytes"),
            "{runtime}: {}",
            r.message
        );
    }
    let listed = p
        .list_payloads(proto::ListPayloadsRequest {
            session_id: sid.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.payloads.len(),
        1,
        "only the input remains: {:?}",
        listed.payloads
    );
}

#[tokio::test]
async fn a_tmp_fill_is_capped() {
    let server = TestServer::start_with(|c| c.sandbox.max_scratch_bytes = 32 << 20).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let r = exec_as_alice(&server, probe(&sid, &["fill"])).await;
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{r:?}");
    assert!(
        r.message
            .contains("/tmp and /out together passed their limit"),
        "{}",
        r.message
    );
    assert!(r.message.contains("the limit is 32 MiB"), "{}", r.message);
    // By the reply, the exec directory is emptied (and kept, empty, for
    // the tenant's next exec).
    let exec_dir = server.data_dir().join("exec");
    let kept: Vec<_> = std::fs::read_dir(&exec_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(kept.len() <= 1, "{kept:?}");
    for dir in &kept {
        for sub in ["payloads", "spillway", "tmp", "out"] {
            let left: Vec<_> = std::fs::read_dir(dir.join(sub)).unwrap().collect();
            assert!(left.is_empty(), "{sub} still holds {left:?}");
        }
    }
}

#[tokio::test]
async fn twenty_spinning_scripts_do_not_slow_a_concurrent_stat() {
    let server = TestServer::start_with(|c| c.sandbox.max_concurrent_execs = 20).await;
    let (sid, p) = session_with(&server, "d.json", b"[1]").await;
    let module = probe_module();
    // Warm the connection and the store's caches: this measures
    // interference, not a cold start.
    let mut owner = server.payloads(ALICE).await;
    let stat = proto::PayloadRequest {
        payload_id: p.id.clone(),
    };
    owner.stat(stat.clone()).await.unwrap();
    let mut spinners = Vec::new();
    for _ in 0..20 {
        let mut c = server.codemode(ALICE).await;
        let mut req = probe(&sid, &["spin"]);
        req.module = module.clone().into();
        req.limits = limits(4_000, 0, 0);
        spinners.push(tokio::spawn(async move { c.exec(req).await }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Two rounds of 20 Stats at most. Spinners that held a thread the RPC
    // path needs would slow every Stat of both rounds; a neighbouring test
    // that loads both cores for a moment slows one Stat of one round.
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let mut all = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            owner.stat(stat.clone()).await.unwrap();
            all.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        all.sort();
        let (median, worst) = (all[all.len() / 2], all[all.len() - 1]);
        assert!(
            median < Duration::from_millis(25),
            "the median Stat took {median:?} while 20 scripts spun (sorted: {all:?})"
        );
        rounds.push(all);
        if worst < Duration::from_millis(50) {
            break;
        }
    }
    assert!(
        rounds.len() == 1 || rounds[1][19] < Duration::from_millis(50),
        "Stat took 50 ms or more in two rounds while 20 scripts spun (sorted: {rounds:?})"
    );
    for s in spinners {
        let r = s.await.unwrap();
        let r = r.unwrap_or_else(|e| panic!("a spinner's exec failed: {e:?}"));
        assert_eq!(status(&r.into_inner()), ExecStatus::Timeout);
    }
}

#[tokio::test]
async fn a_full_exec_queue_is_refused_with_resource_exhausted() {
    let server = TestServer::start_with(|c| {
        c.sandbox.max_concurrent_execs = 1;
        c.sandbox.max_queued_execs = 1;
    })
    .await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let mut c = server.codemode(ALICE).await;
        let mut req = probe(&sid, &["spin"]);
        req.limits = limits(2_000, 0, 0);
        running.push(tokio::spawn(async move { c.exec(req).await }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let err = server
        .codemode(ALICE)
        .await
        .exec(probe(&sid, &["args"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("sandbox.max_concurrent_execs"),
        "{}",
        err.message()
    );
    for r in running {
        assert_eq!(
            status(&r.await.unwrap().unwrap().into_inner()),
            ExecStatus::Timeout
        );
    }
}

#[tokio::test]
async fn files_in_out_become_derived_payloads_only_when_kept() {
    let server = TestServer::start().await;
    let (sid, input) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let mut req = probe(&sid, &["out", "result.txt", "forty-two"]);
    let r = c.exec(req.clone()).await.unwrap().into_inner();
    assert_eq!(status(&r), ExecStatus::Ok);
    assert!(r.outputs.is_empty());
    assert!(
        r.message.contains("result.txt") && r.message.contains("keep_outputs"),
        "{}",
        r.message
    );

    req.keep_outputs = true;
    let r = c.exec(req).await.unwrap().into_inner();
    assert_eq!(r.outputs.len(), 1, "{r:?}");
    let out = &r.outputs[0];
    assert_eq!(out.name, "result.txt");
    assert_eq!(out.derived_from, vec![input.id.clone()]);
    let bytes = download(&mut server.payloads(ALICE).await, &out.id).await;
    assert_eq!(bytes.unwrap(), b"forty-two");
}

#[tokio::test]
async fn failures_are_results_and_bad_requests_are_errors() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"{\"a\": 1}").await;
    let mut c = server.codemode(ALICE).await;

    let err = c.exec(exec(&sid, "ruby", "puts 1")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("jq, javascript, python, wasm"),
        "{}",
        err.message()
    );

    let err = c.exec(exec(&sid, "jq", "  ")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    for (runtime, source, want) in [
        ("jq", ".a |", ExecStatus::InvalidScript),
        ("javascript", "let = ;", ExecStatus::InvalidScript),
        ("python", "def f(:\n", ExecStatus::InvalidScript),
        (
            "wasm",
            "(module (func $f (export \"_start\") (i32.add)))",
            ExecStatus::InvalidScript,
        ),
        (
            "javascript",
            "throw new TypeError('no such field')",
            ExecStatus::ExitNonzero,
        ),
        (
            "python",
            "raise KeyError('status')",
            ExecStatus::ExitNonzero,
        ),
        ("jq", "error(\"bad record\")", ExecStatus::ExitNonzero),
        (
            "wasm",
            "(module (func (export \"_start\") unreachable))",
            ExecStatus::Trap,
        ),
    ] {
        let r = c
            .exec(exec(&sid, runtime, source))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status(&r), want, "{runtime} {source:?}: {r:?}");
        assert!(!r.message.is_empty());
        if want == ExecStatus::ExitNonzero {
            let needle = match runtime {
                "javascript" => "no such field",
                "python" => "KeyError",
                _ => "bad record",
            };
            assert!(r.stderr.contains(needle), "{runtime}: {}", r.stderr);
        }
        if runtime == "python" && want == ExecStatus::InvalidScript {
            assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);
            assert!(
                !r.stderr.starts_with("spillway:"),
                "the marker is stripped: {}",
                r.stderr
            );
        }
    }
}

#[tokio::test]
async fn limits_above_the_ceiling_are_clamped_and_reported() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut req = exec(&sid, "jq", ".");
    req.limits = limits(3_600_000, 64 << 30, 0);
    let r = exec_as_alice(&server, req).await;
    assert_eq!(status(&r), ExecStatus::Ok);
    assert_eq!(
        r.clamped,
        vec![
            "timeout_ms: 3600000 -> 300000".to_owned(),
            format!("memory_bytes: {} -> {}", 64u64 << 30, 4u64 << 30)
        ]
    );
    let eff = r.effective_limits.unwrap();
    assert_eq!((eff.timeout_ms, eff.memory_bytes), (300_000, 4 << 30));
}

#[tokio::test]
async fn compliance_cannot_exec_and_a_disabled_policy_refuses() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let err = server
        .codemode("tok-carol")
        .await
        .exec(exec(&sid, "jq", "."))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    let server = TestServer::start_with(|c| c.policy.allow_exec = false).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let err = server
        .codemode(ALICE)
        .await
        .exec(exec(&sid, "jq", "."))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("allow_exec"));
}

#[tokio::test]
async fn jq_reads_its_inputs_as_a_stream_and_takes_its_flags() {
    let server = TestServer::start().await;
    let (sid, p) = session_with(
        &server,
        "rows.ndjson",
        b"{\"n\":1,\"s\":\"a\"}\n{\"n\":2,\"s\":\"b\"}\n",
    )
    .await;
    let mut c = server.codemode(ALICE).await;
    let mut req = exec(&sid, "jq", ".s");
    req.args = vec!["-r".into()];
    let r = c.exec(req).await.unwrap().into_inner();
    assert_eq!(r.stdout, "a\nb\n", "{r:?}");

    // args[0] may name the input, by name or by ID.
    for first in ["rows.ndjson", p.id.as_str()] {
        let mut req = exec(&sid, "jq", "[inputs | .n] | add");
        req.args = vec![first.into(), "-n".into()];
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(r.stdout, "3\n", "{first}: {r:?}");
    }

    let mut req = exec(&sid, "jq", "[inputs] | length");
    req.args = vec!["-nR".into()];
    let r = c.exec(req).await.unwrap().into_inner();
    assert_eq!(r.stdout, "2\n", "{r:?}");

    let mut req = exec(&sid, "jq", "{k: $k, v: $v}");
    req.args = vec![
        "-n".into(),
        "--arg".into(),
        "k".into(),
        "x".into(),
        "--argjson".into(),
        "v".into(),
        "[1]".into(),
    ];
    let r = c.exec(req).await.unwrap().into_inner();
    assert_eq!(r.stdout, "{\"k\":\"x\",\"v\":[1]}\n", "{r:?}");
}

/// jq's stdout, stderr and exit code for `source` (with `args`) over the
/// session's payloads.
async fn jq_answer(
    server: &TestServer,
    sid: &str,
    source: &str,
    args: &[&str],
) -> (String, String, i32) {
    let mut req = exec(sid, "jq", source);
    req.args = args.iter().map(|a| a.to_string()).collect();
    let r = exec_as_alice(server, req).await;
    (r.stdout, r.stderr, r.exit_code)
}

/// `.[] | f` runs `f` on each element of a top-level array as it is parsed;
/// `(.[] | f)` is the same filter run on the whole parsed array. Every
/// answer, error and exit code is the same, over arrays mixed with other
/// values, strings holding brackets and commas, comments, jq errors,
/// `halt_error`, `input`, `$__loc__` and invalid JSON.
#[tokio::test]
async fn a_leading_iteration_answers_element_by_element_as_jq_does_on_the_whole_array() {
    let server = TestServer::start().await;
    let payloads: [(&str, &str); 5] = [
        (
            "mixed.json",
            "[{\"n\":1,\"s\":\"a,]\\\"b\"},{\"n\":2,\"s\":\"[{\"}] # a comment, ]\n\
             {\"k\":{\"n\":3}}\n[]\n[[1,2],{\"n\":4,\"s\":null}]\n\"str\"\n[{\"n\":5}]\n",
        ),
        (
            "errors.json",
            "[{\"n\":1},{\"n\":\"x\"},{\"n\":3}]\n[{\"n\":4}]\n",
        ),
        (
            "bad-late.json",
            "[{\"n\":1},{\"n\":\"x\"},{\"n\":3},{bad}]\n",
        ),
        (
            "bad-first.json",
            "[{\"n\":1}]\n[{\"n\":2},{\"n\" 3}]\n[{\"n\":4}]\n",
        ),
        ("unclosed.json", "[{\"n\":1},{\"n\":2}"),
    ];
    let cases: [(&str, &[&str]); 11] = [
        (".n", &[]),
        ("select(.n > 1)? | .s", &["-r"]),
        (".n + 1", &[]),
        ("if .n == 2 then halt_error(\"two\\n\") else .n end", &[]),
        ("[., input]", &["-c"]),
        ("first(.n, 9)", &[]),
        ("input_filename", &[]),
        ("tostring", &[]),
        (".n == 4", &["-e"]),
        ("empty", &["-e"]),
        (".", &["--indent", "3"]),
    ];
    for (name, text) in payloads {
        let (sid, _) = session_with(&server, name, text.as_bytes()).await;
        for (f, args) in cases {
            let streamed = jq_answer(&server, &sid, &format!(".[] | {f}"), args).await;
            let whole = jq_answer(&server, &sid, &format!("(.[] | {f})"), args).await;
            assert_eq!(streamed, whole, "{name}: .[] | {f} {args:?}");
        }
        let streamed = jq_answer(&server, &sid, ".[]", &[]).await;
        let whole = jq_answer(&server, &sid, "(.[])", &[]).await;
        assert_eq!(streamed, whole, "{name}: .[]");
    }
    // the cases above do reach the interesting paths
    let (sid, _) = session_with(&server, "bad-late.json", payloads[2].1.as_bytes()).await;
    let (out, err, code) = jq_answer(&server, &sid, ".[] | .n + 1", &[]).await;
    assert_eq!((out.as_str(), code), ("", 1), "{err}");
    assert!(
        err.contains("invalid JSON at byte offset 28") && err.contains("line 1, column 29"),
        "{err}"
    );
    let (sid, _) = session_with(&server, "errors.json", payloads[1].1.as_bytes()).await;
    let (out, err, code) = jq_answer(&server, &sid, ".[] | .n + 1", &[]).await;
    assert_eq!((out.as_str(), code), ("2\n5\n", 1), "{err}");
    assert!(err.contains(r#"cannot calculate "x" + 1"#), "{err}");
}

/// Past what `.[] | f` holds back for one array (8 MiB of output), the rest
/// of the array is parsed ahead: a JSON error late in a large array still
/// prints nothing but the error, a valid one prints every output, and a
/// flood meets the stdout limit, as any flood does, not the memory limit
/// (and a flood of `debug` lines the stderr limit).
#[tokio::test]
async fn a_leading_iteration_with_large_outputs_stays_exact_and_bounded() {
    let server = TestServer::start().await;
    let records: Vec<String> = (0..100_000)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "p".repeat(80)))
        .collect();
    let valid = format!("[{}]", records.join(","));
    let invalid = format!("[{},{{bad}}]", records.join(","));
    for (name, data) in [("valid.json", &valid), ("invalid.json", &invalid)] {
        let (sid, input) = session_with(&server, name, data.as_bytes()).await;
        let mut answers = Vec::new();
        for source in [".[] | .", "(.[] | .)"] {
            let mut req = exec(&sid, "jq", source);
            req.inputs = vec![input.id.clone()];
            let r = exec_as_alice(&server, req).await;
            let usage = r.usage.unwrap();
            answers.push((
                status(&r),
                r.exit_code,
                usage.stdout_bytes,
                r.stderr.clone(),
            ));
        }
        assert_eq!(answers[0], answers[1], "{name}");
        let bytes = answers[0].2;
        match name {
            "valid.json" => assert!(bytes > 8 << 20, "{bytes}"),
            _ => assert!(
                bytes == 0 && answers[0].3.contains("invalid JSON"),
                "{:?}",
                answers[0]
            ),
        }
    }

    let (sid, input) = session_with(&server, "two.json", b"[1, 2]").await;
    let mut req = exec(&sid, "jq", ".[] | range(100000000)");
    req.inputs = vec![input.id.clone()];
    req.limits = limits(60_000, 64 << 20, 1 << 20);
    let r = exec_as_alice(&server, req).await;
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{}", r.message);
    assert!(r.message.starts_with("stdout passed"), "{}", r.message);

    // log lines held back are bounded too: a `debug` flood meets stderr's limit
    let mut req = exec(&sid, "jq", ".[] | range(100000000) | debug | empty");
    req.inputs = vec![input.id];
    req.limits = limits(60_000, 64 << 20, 1 << 20);
    let r = exec_as_alice(&server, req).await;
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{}", r.message);
    assert!(r.message.starts_with("stderr passed"), "{}", r.message);
}

/// `.[] | .user` over an array holds one element at a time, not the whole
/// array as values: the guest's peak memory stays under three times the
/// payload, where parsing it whole (`(.[] | .user)`) takes far more.
#[tokio::test]
async fn a_leading_iteration_over_a_large_array_stays_near_the_payloads_size_in_memory() {
    let server = TestServer::start().await;
    let records: Vec<String> = (0..100_000)
        .map(|i| {
            format!(
                "{{\"id\":{i},\"user\":\"user-{i}\",\"state\":\"open\",\"n\":{}}}",
                i % 7
            )
        })
        .collect();
    let data = format!("[{}]", records.join(",\n"));
    let (sid, input) = session_with(&server, "big.json", data.as_bytes()).await;
    let mut c = server.codemode(ALICE).await;
    let mut peak = Vec::new();
    for source in [".[] | .user", "(.[] | .user)"] {
        let mut req = exec(&sid, "jq", source);
        // not the first answer, kept as a payload of the session
        req.inputs = vec![input.id.clone()];
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(
            status(&r),
            ExecStatus::Ok,
            "{source}: {} {}",
            r.message,
            r.stderr
        );
        let usage = r.usage.unwrap();
        assert_eq!(
            usage.stdout_bytes,
            records
                .iter()
                .enumerate()
                .map(|(i, _)| format!("\"user-{i}\"\n").len() as u64)
                .sum::<u64>()
        );
        peak.push(usage.peak_memory_bytes);
    }
    // what the image takes before any input: the same filter over one record
    let (sid, tiny) = session_with(&server, "tiny.json", b"[{\"user\":\"a\"}]").await;
    let mut req = exec(&sid, "jq", ".[] | .user");
    req.inputs = vec![tiny.id];
    let base = c
        .exec(req)
        .await
        .unwrap()
        .into_inner()
        .usage
        .unwrap()
        .peak_memory_bytes;
    let size = data.len() as u64;
    eprintln!(
        "base {base} streamed {} whole {} size {size}",
        peak[0], peak[1]
    );
    assert!(
        peak[0] - base < 2 * size,
        "streamed: {} bytes of memory over the image's {base}, for {size} bytes",
        peak[0]
    );
    assert!(
        peak[1] - base > 4 * size,
        "whole: {} bytes over the image's {base}, for {size} bytes",
        peak[1]
    );
}

#[tokio::test]
async fn javascript_and_python_helpers_see_the_payload_list() {
    let server = TestServer::start().await;
    let (sid, p) = session_with(&server, "rows.ndjson", b"{\"n\":1}\n{\"n\":2}\n").await;
    let mut c = server.codemode(ALICE).await;
    let js = c
        .exec(exec(
            &sid,
            "javascript",
            "const p = payloads[0]; let s = 0; for (const l of readLines(p.path)) s += JSON.parse(l).n; console.log(p.id, p.name, p.size, s);",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        js.stdout.trim(),
        format!("{} rows.ndjson 16 3", p.id),
        "{js:?}"
    );
    let py = c
        .exec(exec(
            &sid,
            "python",
            "import spillway, json\np = spillway.payloads[0]\nprint(p['id'], p['name'], p['size'], sum(json.loads(l)['n'] for l in spillway.read_lines(p['path'])))",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        py.stdout.trim(),
        format!("{} rows.ndjson 16 3", p.id),
        "{py:?}"
    );
}

#[tokio::test]
async fn python_read_json_reads_a_payload_of_several_reads_and_a_missing_path_is_named() {
    let server = TestServer::start().await;
    // About 4.5 MB: more than one of the helper's 1 MiB positioned reads.
    let items: Vec<String> = (0..150_000)
        .map(|i| format!("{{\"i\":{i},\"pad\":\"xxxxxxxx\"}}"))
        .collect();
    let body = format!("[{}]", items.join(","));
    let (sid, _) = session_with(&server, "big.json", body.as_bytes()).await;
    let mut c = server.codemode(ALICE).await;
    let py = c
        .exec(exec(
            &sid,
            "python",
            "import spillway\nrows = spillway.read_json(spillway.payloads[0]['path'])\nprint(len(rows), sum(r['i'] for r in rows))\ntry:\n    spillway.read_json('/payloads/nope.json')\nexcept FileNotFoundError as e:\n    print('missing', e.filename)",
        ))
        .await
        .unwrap()
        .into_inner();
    let sum: u64 = (0..150_000u64).sum();
    assert_eq!(
        py.stdout.trim(),
        format!("150000 {sum}\nmissing /payloads/nope.json"),
        "{py:?}"
    );
}

/// `spillway.read_lines` reads 1 MiB at a time and splits whole chunks:
/// its lines are the file's, split on `\n` only, without their `\n` or
/// `\r\n`, however they fall across reads. The payload has a `\r\n` and a
/// multi-byte character straddling the first 1 MiB boundary, a line of
/// 2.5 MiB, empty lines, an invalid byte, and a last line with no newline
/// that ends in a lone `\r` (kept, as before).
#[tokio::test]
async fn python_read_lines_splits_lines_across_reads_as_the_file_has_them() {
    let mut data = Vec::new();
    while data.len() < (1 << 20) - 3 {
        data.extend_from_slice(b"line of text\r\n");
    }
    data.truncate((1 << 20) - 3);
    data.extend_from_slice("é🌍\r\n".as_bytes()); // straddles byte 1 MiB
    data.extend_from_slice(&vec![b'x'; 5 << 19]);
    data.extend_from_slice(b"\n\n\nbad \xff byte\r\nlast\r");
    let expected: Vec<String> = {
        let mut lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
        let last = lines.pop().unwrap();
        let mut v: Vec<String> = lines
            .iter()
            .map(|l| String::from_utf8_lossy(l.strip_suffix(b"\r").unwrap_or(l)).into_owned())
            .collect();
        v.push(String::from_utf8_lossy(last).into_owned());
        v
    };
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "lines.txt", &data).await;
    let mut c = server.codemode(ALICE).await;
    let script = "import hashlib, spillway\n\
                  lines = list(spillway.read_lines(spillway.payloads[0]['path']))\n\
                  print(len(lines), hashlib.sha256('\\x00'.join(lines).encode()).hexdigest())";
    let py = c
        .exec(exec(&sid, "python", script))
        .await
        .unwrap()
        .into_inner();
    let digest = sha256_hex(expected.join("\0").as_bytes());
    assert_eq!(
        py.stdout.trim(),
        format!("{} {digest}", expected.len()),
        "{py:?}"
    );
}

/// 50 MB of NDJSON records `{"id":…,"status":…,"amount":…,"note":…}`, and
/// the true per-status count and sum.
fn fifty_megabytes() -> (Vec<u8>, BTreeMap<String, (u64, i64)>) {
    let statuses = ["open", "closed", "merged", "draft", "stale"];
    let mut data = Vec::with_capacity(51 << 20);
    let mut truth: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut i = 0u64;
    while data.len() < 50_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let status = statuses[(x % 5) as usize];
        let amount = (x >> 20) as i64 % 10_000 - 2_000;
        data.extend_from_slice(
            format!(
                "{{\"id\":{i},\"status\":\"{status}\",\"amount\":{amount},\"note\":\"record {i} of the big dump\"}}\n"
            )
            .as_bytes(),
        );
        let t = truth.entry(status.to_owned()).or_default();
        t.0 += 1;
        t.1 += amount;
        i += 1;
    }
    (data, truth)
}

#[tokio::test]
async fn the_same_question_in_all_four_runtimes_gets_the_true_answer() {
    let server = TestServer::start().await;
    let (data, truth) = fifty_megabytes();
    let (sid, _) = session_with(&server, "dump.ndjson", &data).await;
    let expected: serde_json::Value = truth
        .iter()
        .map(|(k, (c, s))| (k.clone(), serde_json::json!([c, s])))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let mut c = server.codemode(ALICE).await;
    let jq = exec(
        &sid,
        "jq",
        "reduce inputs as $r ({}; .[$r.status] |= [((.[0] // 0) + 1), ((.[1] // 0) + $r.amount)]) | to_entries | sort_by(.key) | from_entries",
    );
    let mut jq = jq;
    jq.args = vec!["-n".into()];
    let js = exec(
        &sid,
        "javascript",
        r#"const g = {};
for (const line of readLines(payloads[0].path)) {
  if (!line) continue;
  const r = JSON.parse(line);
  const e = g[r.status] || (g[r.status] = [0, 0]);
  e[0] += 1; e[1] += r.amount;
}
const out = {};
for (const k of Object.keys(g).sort()) out[k] = g[k];
console.log(JSON.stringify(out));"#,
    );
    let py = exec(
        &sid,
        "python",
        r#"import json, spillway
g = {}
for line in spillway.read_lines(spillway.payloads[0]["path"]):
    if not line:
        continue
    r = json.loads(line)
    e = g.setdefault(r["status"], [0, 0])
    e[0] += 1
    e[1] += r["amount"]
print(json.dumps(dict(sorted(g.items())), separators=(",", ":")))"#,
    );
    let wasm = probe(&sid, &["aggregate", "/payloads/dump.ndjson"]);
    for (runtime, mut req) in [
        ("jq", jq),
        ("javascript", js),
        ("python", py),
        ("wasm", wasm),
    ] {
        req.limits = limits(120_000, 1 << 30, 0);
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(status(&r), ExecStatus::Ok, "{runtime}: {r:?}");
        let got: serde_json::Value = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("{runtime} printed {:?}: {e}", r.stdout));
        assert_eq!(got, expected, "{runtime}");
    }
}

#[tokio::test]
async fn fuel_is_metered_only_when_asked_for_and_stops_a_loop() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let mut req = exec(
        &sid,
        "wasm",
        "(module (func (export \"_start\") (loop br 0)))",
    );
    req.limits = Some(proto::ExecLimits {
        timeout_ms: 20_000,
        fuel: 5_000_000,
        ..Default::default()
    });
    let r = c.exec(req).await.unwrap().into_inner();
    assert_eq!(status(&r), ExecStatus::Timeout, "{r:?}");
    assert!(r.message.contains("ran out of fuel"), "{}", r.message);
    assert_eq!(r.usage.unwrap().fuel_consumed, 5_000_000);

    let r = c
        .exec(exec(&sid, "wasm", "(module (func (export \"_start\")))"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r), ExecStatus::Ok);
    assert_eq!(
        r.usage.unwrap().fuel_consumed,
        0,
        "no fuel unless asked for"
    );
}

#[tokio::test]
async fn a_cancelled_exec_stops_its_script_and_frees_its_slot() {
    let server = TestServer::start_with(|c| c.sandbox.max_concurrent_execs = 1).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let mut spin = probe(&sid, &["spin"]);
    spin.limits = limits(60_000, 0, 0);
    // The client gives up after 300 ms; the server must not keep spinning
    // for the remaining minute.
    let gave_up = tokio::time::timeout(Duration::from_millis(300), c.exec(spin)).await;
    assert!(gave_up.is_err());
    let started = Instant::now();
    let r = c.exec(probe(&sid, &["args"])).await.unwrap().into_inner();
    assert_eq!(status(&r), ExecStatus::Ok);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the only slot was still taken after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn oversized_scripts_and_stderr_floods_hit_their_named_limits() {
    let server = TestServer::start_with(|c| c.sandbox.max_stderr_bytes = 64 << 10).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let huge = format!("# {}\npass", "x".repeat(2 << 20));
    let err = c.exec(exec(&sid, "python", &huge)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("sandbox.max_source_bytes"),
        "{}",
        err.message()
    );

    let r = c
        .exec(exec(
            &sid,
            "python",
            "import sys\nwhile True:\n    sys.stderr.write('e' * 8191)",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{}", r.message);
    assert!(
        r.message.starts_with("stderr passed its limit of 64 KiB"),
        "{}",
        r.message
    );
    assert_eq!(r.usage.unwrap().stderr_bytes, 64 << 10);
}

#[tokio::test]
async fn input_output_module_args_and_scratch_entry_limits_are_each_named_when_hit() {
    let server = TestServer::start_with(|c| {
        c.sandbox.max_module_bytes = 64 << 10;
        c.sandbox.max_scratch_entries = 50;
    })
    .await;
    let (sid, p) = session_with(&server, "d.json", b"[1]").await;
    let mut c = server.codemode(ALICE).await;
    let named = |err: &tonic::Status, key: &str| {
        assert!(err.message().contains(key), "{key}: {}", err.message());
    };

    // More than 1000 inputs: refused before any is looked up.
    let mut many = exec(&sid, "jq", ".");
    many.inputs = (0..1001).map(|_| p.id.clone()).collect();
    let err = c.exec(many).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    named(&err, "at most 1000 payloads");

    // A module over sandbox.max_module_bytes (the probe is larger than 64 KiB).
    assert!(probe_module().len() > 64 << 10);
    let err = c.exec(probe(&sid, &["args"])).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    named(&err, "max_module_bytes");

    // Args over sandbox.max_args_bytes (64 KiB by default).
    let mut long = exec(&sid, "jq", ".");
    long.args = vec![p.id.clone(), "a".repeat(70 << 10)];
    let err = c.exec(long).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    named(&err, "max_args_bytes");

    // More scratch entries than sandbox.max_scratch_entries: stopped.
    let r = c
        .exec(exec(
            &sid,
            "python",
            "import time\nfor i in range(100000):\n    open(f'/tmp/f{i}', 'w').close()\n    time.sleep(0.001)",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{}", r.message);
    assert!(
        r.message.contains("50 entries"),
        "the message names the entry limit: {}",
        r.message
    );

    // More than 100 files in /out: the first 100 by name are kept, and the
    // message says so.
    let mut keep = exec(
        &sid,
        "python",
        "for i in range(105):\n    open(f'/out/o{i:03}.txt', 'w').write(str(i))",
    );
    keep.keep_outputs = true;
    let server_big = TestServer::start().await;
    let (sid2, _) = session_with(&server_big, "d.json", b"[1]").await;
    keep.session_id = sid2;
    let r = exec_as_alice(&server_big, keep).await;
    assert_eq!(status(&r), ExecStatus::Ok, "{}", r.message);
    assert_eq!(r.outputs.len(), 100);
    assert!(
        r.message.contains("held 105 files and only the first 100"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn a_closed_sessions_large_stdout_is_cut_to_what_a_reply_holds_and_the_message_says_so() {
    let server = TestServer::start_with(|c| c.limits.max_response_message_bytes = 256 << 10).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    server
        .sessions(ALICE)
        .await
        .close_session(proto::CloseSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap();
    let mut req = exec(&sid, "python", "print('x' * 300000)");
    req.limits = Some(proto::ExecLimits {
        max_stdout_bytes: 1 << 20,
        ..Default::default()
    });
    let r = exec_as_alice(&server, req).await;
    assert_eq!(status(&r), ExecStatus::Ok, "{}", r.message);
    assert!(
        r.stdout_payload.is_none(),
        "a closed session takes no payload"
    );
    assert_eq!(r.stdout.len(), 128 << 10);
    assert!(
        r.message
            .contains("stdout was 300001 bytes and the session is closed"),
        "{}",
        r.message
    );
}

/// `.[] | .user` over a big array prints megabytes: an ordinary answer,
/// larger than a reply should carry inline and well within the ceiling.
/// With no stdout limit named it is offloaded as a payload with a notice,
/// not stopped.
#[tokio::test]
async fn a_plain_projection_past_the_old_1_mib_default_is_offloaded_with_a_notice() {
    let server = TestServer::start().await;
    let records: Vec<String> = (0..40_000)
        .map(|i| format!("{{\"id\":{i},\"user\":{{\"login\":\"user-{i}\",\"site_admin\":false}},\"body\":\"{}\"}}", "b".repeat(40)))
        .collect();
    let data = format!("[{}]", records.join(","));
    let (sid, input) = session_with(&server, "prs.json", data.as_bytes()).await;
    let mut req = exec(&sid, "jq", ".[] | .user");
    req.inputs = vec![input.id.clone()];
    let r = exec_as_alice(&server, req).await;
    assert_eq!(status(&r), ExecStatus::Ok, "{}", r.message);
    let usage = r.usage.unwrap();
    assert!(usage.stdout_bytes > 1 << 20, "{}", usage.stdout_bytes);
    let kept = r.stdout_payload.clone().expect("the answer is offloaded");
    assert_eq!(kept.size_bytes, usage.stdout_bytes);
    assert_eq!(kept.derived_from, vec![input.id.clone()]);
    assert!(
        r.stdout.starts_with("[Saved to file] exec:jq")
            && r.stdout.contains(&kept.id)
            && r.stdout.contains("Next: "),
        "{}",
        r.stdout
    );
    assert!(!r.message.contains("not kept"), "{}", r.message);
}

/// A flood with no limit named runs to the policy's ceiling, and is then
/// stopped with the typed status and a message naming the ceiling.
#[tokio::test]
async fn a_flood_with_no_limit_named_is_stopped_at_the_policy_ceiling() {
    let server = TestServer::start_with(|c| c.policy.exec_ceiling.max_stdout_bytes = 3 << 20).await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let r = exec_as_alice(
        &server,
        exec(&sid, "python", "while True:\n    print('x' * 8191)"),
    )
    .await;
    assert_eq!(status(&r), ExecStatus::OutputLimit, "{}", r.message);
    assert_eq!(r.usage.unwrap().stdout_bytes, 3 << 20);
    assert!(r.stdout_payload.is_none());
    assert!(
        r.message.starts_with(
            "stdout passed 3 MiB, the most one Exec may print (the policy's exec_ceiling.max_stdout_bytes), and the script was stopped as a runaway"
        ),
        "{}",
        r.message
    );
}

/// A mistyped jq flag costs the model one line, not the usage text.
#[tokio::test]
async fn a_bad_jq_flag_shows_the_error_and_a_pointer_to_help_only() {
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "d.json", b"[1]").await;
    let mut req = exec(&sid, "jq", ".");
    req.args = vec!["--slurpy".into()];
    let r = exec_as_alice(&server, req).await;
    assert_eq!(
        r.stderr,
        "jq: error: unknown option: --slurpy\n(jq's usage text left out: run jq with args [\"--help\"] for the list of flags)\n"
    );
    assert!(!r.stderr.contains("RUST_BACKTRACE"));
}

/// A freed memory slot is reset to the module's image before an exec
/// reuses it (wasmtime resets the pages a guest dirtied, found with Linux's
/// PAGEMAP_SCAN where the kernel has it): what one exec writes into its data
/// segment, into the first MiB (kept resident) and far past it, the next
/// exec of the same module does not see.
#[tokio::test]
async fn a_reused_memory_slot_starts_from_the_modules_image() {
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "fd_write"
        (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 128)
      (data (i32.const 1024) "A")
      (func (export "_start")
        ;; print the bytes at 1024 (the image), 512 KiB and 6 MiB (zero pages)
        (i32.store8 (i32.const 64) (i32.load8_u (i32.const 1024)))
        (i32.store8 (i32.const 65) (i32.load8_u (i32.const 524288)))
        (i32.store8 (i32.const 66) (i32.load8_u (i32.const 6291456)))
        (i32.store8 (i32.const 67) (i32.const 10))
        (i32.store (i32.const 0) (i32.const 64))
        (i32.store (i32.const 4) (i32.const 4))
        (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
        ;; then dirty all three
        (i32.store8 (i32.const 1024) (i32.const 90))
        (i32.store8 (i32.const 524288) (i32.const 90))
        (i32.store8 (i32.const 6291456) (i32.const 90))))"#;
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "x.txt", b"x").await;
    let mut c = server.codemode(ALICE).await;
    for round in 0..4 {
        let mut req = exec(&sid, "wasm", "");
        req.module = wat.as_bytes().to_vec().into();
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(status(&r), ExecStatus::Ok, "{r:?}");
        assert_eq!(r.stdout, "A\0\0\n", "round {round}");
    }
}

/// The jq and javascript images start from a Wizer snapshot (`make images`),
/// python from componentize-py's: each exec is a fresh instance of it, so
/// nothing one exec does to the snapshot's globals or heap is seen by the
/// next, and what QuickJS derived from the clock at build time
/// (`Math.random`'s state, `performance`'s time origin) is redone per exec.
#[tokio::test]
async fn pre_initialized_images_carry_no_state_from_one_exec_into_the_next() {
    for image in ["jq.wasm", "javascript.wasm"] {
        let wasm = std::fs::read(images_dir().join(image)).unwrap();
        assert!(
            !wasm
                .windows(b"wizer-initialize".len())
                .any(|w| w == b"wizer-initialize"),
            "{image} still exports wizer-initialize: it was not pre-initialized (run `make images`)"
        );
    }
    let server = TestServer::start().await;
    let (sid, _) = session_with(&server, "rows.ndjson", b"{\"n\":1}\n").await;
    let mut c = server.codemode(ALICE).await;
    let mut run = async |runtime: &str, source: &str, args: &[&str]| {
        let mut req = exec(&sid, runtime, source);
        req.args = args.iter().map(|a| a.to_string()).collect();
        let r = c.exec(req).await.unwrap().into_inner();
        assert_eq!(status(&r), ExecStatus::Ok, "{runtime} {source}: {r:?}");
        r.stdout
    };

    // JavaScript: globals, prototypes, the prelude's own objects and the
    // heap, changed by the first exec, are as built in the second.
    let taint = r#"
        globalThis.leaked = 'from the first exec';
        Object.prototype.polluted = true;
        Array.prototype.push = function () { return 'hijacked'; };
        console.log = () => {};
        process.argv.push('stale');
        payloads.length = 0;
        globalThis.big = new Array(100000).fill('heap');
        print(JSON.stringify([Math.random(), Math.random()]));
    "#;
    let look = r#"
        console.log(JSON.stringify({
            leaked: typeof leaked, polluted: ({}).polluted, big: typeof big,
            push: [].push(1), argv: process.argv, payloads: payloads.length, args,
            perf: performance.now() < 60000,
        }));
        print(JSON.stringify([Math.random(), Math.random()]));
    "#;
    let first = run("javascript", taint, &["one"]).await;
    let second = run("javascript", look, &["two"]).await;
    let mut lines = second.lines();
    assert_eq!(
        lines.next().unwrap(),
        r#"{"leaked":"undefined","big":"undefined","push":1,"argv":["javascript","/spillway/script","two"],"payloads":1,"args":["two"],"perf":true}"#,
        "{second}"
    );
    let third = run("javascript", look, &["two"]).await;
    let (r1, r2, r3) = (
        first.trim(),
        lines.next().unwrap(),
        third.lines().nth(1).unwrap(),
    );
    assert!(
        r1 != r2 && r2 != r3 && r1 != r3,
        "Math.random must be seeded per exec, not by the snapshot: {r1} {r2} {r3}"
    );

    // jq: a filter that redefines standard-library names does not change
    // the standard library the next exec compiles against.
    let out = run(
        "jq",
        r#"def map(f): "hijacked"; def select(f): "hijacked"; [([1, 2] | map(. + 1)), select(true)]"#,
        &["-nc"],
    )
    .await;
    assert_eq!(out, "[\"hijacked\",\"hijacked\"]\n");
    let out = run(
        "jq",
        "[([1, 2] | map(. + 1)), (.n | select(. == 1))]",
        &["-c"],
    )
    .await;
    assert_eq!(out, "[[2,3],1]\n");

    // Python (a componentize-py snapshot): `spillway.payloads`, read on
    // first use and then kept in the module, and the environment, emptied
    // at build time, start over in every exec.
    let taint = r#"
import os, spillway
spillway.payloads.append({"id": "forged"})
spillway.planted = 1
os.environ["LEAK"] = "from the first exec"
print(len(spillway.payloads))
"#;
    let look = r#"
import os, spillway
print(len(spillway.payloads), spillway.payloads[0]["name"], hasattr(spillway, "planted"), dict(os.environ))
"#;
    assert_eq!(run("python", taint, &[]).await, "2\n");
    assert_eq!(run("python", look, &[]).await, "1 rows.ndjson False {}\n");
}

/// With pool slots that keep what a guest dirtied resident (restored by a
/// copy from the image instead of unmapped), an exec still starts from the
/// pristine image: what one exec wrote to the interpreter's heap, its
/// modules and its globals is gone in the next one in the same slot.
#[tokio::test]
async fn slots_that_keep_dirtied_memory_resident_still_start_each_exec_from_the_image() {
    let server = TestServer::start_with(|c| {
        c.sandbox.max_concurrent_execs = 1;
        c.sandbox.memory_keep_resident_bytes = 64 << 20;
        c.sandbox.table_keep_resident_bytes = 1 << 20;
    })
    .await;
    let (sid, _) = session_with(&server, "rows.ndjson", b"{\"n\":1}\n").await;
    let mut c = server.codemode(ALICE).await;
    let mut run = async |runtime: &str, source: &str| {
        let r = c
            .exec(exec(&sid, runtime, source))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status(&r), ExecStatus::Ok, "{runtime} {source}: {r:?}");
        r.stdout
    };
    let taint = r#"
import builtins, json, sys
builtins.leaked = "from the first exec"
json.dumps = lambda *a, **k: "hijacked"
sys.modules["planted"] = sys
heap = [bytearray(b"x" * 4096) for _ in range(4096)]  # 16 MiB over many pages
print(len(heap))
"#;
    let look = r#"
import builtins, json, sys
print(hasattr(builtins, "leaked"), json.dumps([1]), "planted" in sys.modules)
"#;
    let js_taint = "globalThis.leaked = 1; JSON.stringify = () => 'hijacked'; \
                    globalThis.big = new Array(1 << 20).fill('heap'); print(4096);";
    let js_look = "print(typeof leaked, JSON.stringify([1]), typeof big);";
    let cases = [
        ("python", taint, look, "False [1] False\n"),
        ("javascript", js_taint, js_look, "undefined [1] undefined\n"),
    ];
    for (runtime, taint, look, pristine) in cases {
        for round in 0..3 {
            assert_eq!(
                run(runtime, taint).await,
                "4096\n",
                "{runtime} round {round}"
            );
            assert_eq!(
                run(runtime, look).await,
                pristine,
                "{runtime} round {round}: the last exec's state was seen"
            );
        }
    }
}
