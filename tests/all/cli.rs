//! The `spillway` binary as a newcomer uses it: dev mode, token discovery,
//! the CLI tour, and config errors.

use std::process::Output;

use crate::common::*;

fn cli(server: &ProcessServer, data_dir: &std::path::Path, args: &[&str]) -> Output {
    command()
        .args(args)
        .env("SPILLWAY_ADDR", server.addr.to_string())
        .env("SPILLWAY_DATA_DIR", data_dir)
        .env_remove("SPILLWAY_TOKEN")
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_mode_tour_create_upload_read_delete_with_discovered_token() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = ProcessServer::start(None, &data_dir, dir.path().join("server.log")).await;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data_dir.join("dev-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        log.contains("dev-token"),
        "the log must say where the dev token is: {log}"
    );

    let created: serde_json::Value = serde_json::from_str(&ok(cli(
        &server,
        &data_dir,
        &["--json", "session", "create", "--label", "tour"],
    )))
    .unwrap();
    let session = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["tenant"], "dev");

    let file = dir.path().join("prs.json");
    std::fs::write(
        &file,
        "[\n  {\"id\": 1},\n  {\"id\": 2},\n  {\"id\": 3}\n]\n",
    )
    .unwrap();
    let uploaded: serde_json::Value = serde_json::from_str(&ok(cli(
        &server,
        &data_dir,
        &[
            "--json",
            "upload",
            "--session",
            &session,
            file.to_str().unwrap(),
        ],
    )))
    .unwrap();
    let payload = uploaded["id"].as_str().unwrap().to_owned();
    assert_eq!(uploaded["name"], "prs.json");
    assert_eq!(uploaded["lineCount"], "5");

    // Code mode from the CLI: stdout on stdout, the status on stderr.
    let out = cli(
        &server,
        &data_dir,
        &[
            "exec",
            "--session",
            &session,
            "--runtime",
            "jq",
            "--source",
            ".[].id",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n2\n3\n",
        "{stderr}"
    );
    assert!(stderr.contains("EXEC_STATUS_OK"), "{stderr}");
    let out = cli(
        &server,
        &data_dir,
        &[
            "exec",
            "--session",
            &session,
            "--runtime",
            "jq",
            "--source",
            ".[] |",
        ],
    );
    assert!(!out.status.success(), "a failed script exits nonzero");
    assert!(String::from_utf8_lossy(&out.stderr).contains("EXEC_STATUS_INVALID_SCRIPT"));

    let lines = ok(cli(
        &server,
        &data_dir,
        &["read", &payload, "--lines", "2:3"],
    ));
    assert_eq!(lines, "  {\"id\": 1},\n  {\"id\": 2},\n");

    let human = ok(cli(&server, &data_dir, &["stat", &payload]));
    assert!(
        human.contains("/payloads/prs.json") && human.contains("5 lines"),
        "{human}"
    );
    let listing = ok(cli(&server, &data_dir, &["ls", "--session", &session]));
    assert!(listing.contains(&payload), "{listing}");

    let out_file = dir.path().join("copy.json");
    ok(cli(
        &server,
        &data_dir,
        &["download", &payload, "-o", out_file.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read(&out_file).unwrap(),
        std::fs::read(&file).unwrap()
    );

    // Deletion gives a signed receipt that verifies, and stops verifying
    // once changed.
    let receipt_json = ok(cli(
        &server,
        &data_dir,
        &["--json", "rm", &payload, "--reason", "tour"],
    ));
    let receipt: serde_json::Value = serde_json::from_str(&receipt_json).unwrap();
    assert!(receipt["id"].as_str().unwrap().starts_with("rcpt_"));
    assert_eq!(receipt["signature"].as_str().unwrap().len(), 64);
    let receipt_file = dir.path().join("receipt.json");
    std::fs::write(&receipt_file, &receipt_json).unwrap();
    let verified = ok(cli(
        &server,
        &data_dir,
        &["audit", "verify-receipt", receipt_file.to_str().unwrap()],
    ));
    assert!(verified.contains("verifies"), "{verified}");
    let mut forged = receipt.clone();
    forged["reason"] = serde_json::Value::String("something else".into());
    std::fs::write(&receipt_file, forged.to_string()).unwrap();
    let out = cli(
        &server,
        &data_dir,
        &["audit", "verify-receipt", receipt_file.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does NOT verify"));

    let failed = cli(&server, &data_dir, &["stat", &payload]);
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("NotFound") && stderr.contains(&payload),
        "{stderr}"
    );

    // One turn of two files: the small one stays inline, the big one is
    // offloaded with a notice.
    let small = dir.path().join("status.txt");
    std::fs::write(&small, "all green\n").unwrap();
    let big = dir.path().join("github_list_prs.json");
    let items: Vec<String> = (0..3000)
        .map(|i| format!("{{\"id\":{i},\"title\":\"pr {i}\"}}"))
        .collect();
    std::fs::write(&big, format!("[{}]", items.join(","))).unwrap();
    let out = ok(cli(
        &server,
        &data_dir,
        &[
            "offload",
            "--session",
            &session,
            small.to_str().unwrap(),
            big.to_str().unwrap(),
        ],
    ));
    assert!(out.contains("== call_1: inline"), "{out}");
    assert!(
        out.contains("== call_2: offloaded (per-call limit)"),
        "{out}"
    );
    assert!(
        out.contains("/payloads/github_list_prs-call_2.json"),
        "{out}"
    );
    assert!(out.contains("JSON array of 3 000 records"), "{out}");

    // History hygiene on an OpenAI file: repair, then compact and recall.
    let history = dir.path().join("history.json");
    let big = "func f() { x := 1 }\n".repeat(400);
    let mut msgs = vec![serde_json::json!({"role": "user", "content": "go"})];
    for t in 1..=5 {
        msgs.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{t}"), "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}));
        if t != 3 {
            msgs.push(serde_json::json!({"role": "tool", "tool_call_id": format!("c{t}"), "content": format!("{t}{big}")}));
        }
    }
    std::fs::write(
        &history,
        serde_json::to_string(&serde_json::json!({"model": "m", "messages": msgs})).unwrap(),
    )
    .unwrap();
    let out = cli(
        &server,
        &data_dir,
        &[
            "context",
            "repair",
            "--format",
            "openai",
            history.to_str().unwrap(),
        ],
    );
    let stdout = ok(out.clone());
    let repaired: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(repaired["model"], "m");
    assert!(
        repaired["messages"][6]["content"]
            .as_str()
            .unwrap()
            .starts_with("[Tool result missing")
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"missingToolUseIds\":[\"c3\"]"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let compacted: serde_json::Value = serde_json::from_str(&ok(cli(
        &server,
        &data_dir,
        &[
            "context",
            "compact",
            "--format",
            "openai",
            "--session",
            &session,
            history.to_str().unwrap(),
        ],
    )))
    .unwrap();
    let stub = compacted["messages"][2]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stub.starts_with("[Old tool result cleared — 400 lines"),
        "{stub}"
    );
    let key = &stub[stub.find("<<ccr:").unwrap()..];
    let recalled = ok(cli(
        &server,
        &data_dir,
        &["context", "recall", "--session", &session, key],
    ));
    assert_eq!(recalled, format!("1{big}"));

    ok(cli(&server, &data_dir, &["session", "rm", &session]));
}

#[test]
fn dev_mode_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let out = command()
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}

#[test]
fn unknown_config_key_stops_the_server_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\n[store]\nengnie = \"redb\"\n",
    )
    .unwrap();
    let out = command()
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("engnie"));
}

#[test]
fn cli_without_any_token_says_how_to_get_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = command()
        .args(["session", "ls"])
        .env("SPILLWAY_DATA_DIR", dir.path())
        .env_remove("SPILLWAY_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SPILLWAY_TOKEN") && stderr.contains("dev-token"),
        "{stderr}"
    );
}

/// `spillway … | head -1`: whatever the command, a reader that goes away
/// early ends it quietly (exit 0, no panic, nothing on stderr about it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_panics_when_its_stdout_is_closed_early() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = ProcessServer::start(None, &data_dir, dir.path().join("server.log")).await;
    let created: serde_json::Value = serde_json::from_str(&ok(cli(
        &server,
        &data_dir,
        &["--json", "session", "create", "--label", "pipes"],
    )))
    .unwrap();
    let session = created["id"].as_str().unwrap().to_owned();
    // Large enough that every command writes more than a pipe holds.
    let file = dir.path().join("prs.ndjson");
    let lines: String = (0..20_000)
        .map(|i| format!("{{\"id\": {i}, \"state\": \"open\"}}\n"))
        .collect();
    std::fs::write(&file, &lines).unwrap();
    let uploaded: serde_json::Value = serde_json::from_str(&ok(cli(
        &server,
        &data_dir,
        &[
            "--json",
            "upload",
            "--session",
            &session,
            file.to_str().unwrap(),
        ],
    )))
    .unwrap();
    let payload = uploaded["id"].as_str().unwrap().to_owned();
    let history = dir.path().join("history.json");
    let messages: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"role": "user", "content": format!("message {i}")}))
        .collect();
    std::fs::write(&history, serde_json::to_string(&messages).unwrap()).unwrap();
    let h = history.to_str().unwrap();
    let f = file.to_str().unwrap();

    let commands: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["session", "ls"],
        vec!["session", "get", &session],
        vec!["ls", "--session", &session],
        vec!["stat", &payload],
        vec!["read", &payload, "--lines", "1:"],
        vec!["read", &payload, "--bytes", "0:", "--max-bytes", "400000"],
        vec!["download", &payload],
        vec!["inspect", &payload],
        vec!["grep", "--session", &session, "open"],
        vec!["offload", "--session", &session, f],
        vec!["runtimes"],
        vec![
            "exec",
            "--session",
            &session,
            "--runtime",
            "jq",
            "--source",
            ".id",
            "--",
            "-c",
        ],
        vec!["context", "repair", "--format", "openai", h],
        vec![
            "context",
            "compact",
            "--format",
            "openai",
            "--session",
            &session,
            h,
        ],
        vec!["policy", "get", "--session", &session],
        vec!["audit", "query"],
        vec!["audit", "export"],
        vec!["audit", "verify"],
    ];
    for args in commands {
        for json in [false, true] {
            let mut cmd = command();
            if json {
                cmd.arg("--json");
            }
            let mut child = cmd
                .args(&args)
                .env("SPILLWAY_ADDR", server.addr.to_string())
                .env("SPILLWAY_DATA_DIR", &data_dir)
                .env_remove("SPILLWAY_TOKEN")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // The reader goes away before the first byte.
            drop(child.stdout.take());
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success()
                    && !stderr.contains("panicked")
                    && !stderr.contains("Broken pipe"),
                "spillway {}{args:?} | head: {}: {stderr}",
                if json { "--json " } else { "" },
                out.status
            );
        }
    }
}
