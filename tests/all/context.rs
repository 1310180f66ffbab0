//! Context through gRPC: repair, a 12-turn compaction with recall of every
//! archived original, idempotence, and deletion.

use spillway::proto::{self, Role, block::Block};
use tonic::Code;

use crate::common::*;

fn assistant(id: &str, tool: &str) -> proto::Message {
    proto::Message {
        role: Role::Assistant as i32,
        blocks: vec![proto::Block {
            block: Some(Block::ToolUse(proto::ToolUseBlock {
                id: id.into(),
                name: tool.into(),
                input_json: "{}".into(),
            })),
        }],
    }
}

fn result(id: &str, content: &str) -> proto::Message {
    proto::Message {
        role: Role::Tool as i32,
        blocks: vec![proto::Block {
            block: Some(Block::ToolResult(proto::ToolResultBlock {
                tool_use_id: id.into(),
                content: content.into(),
                ..Default::default()
            })),
        }],
    }
}

fn content_of(m: &proto::Message) -> &str {
    match &m.blocks[0].block {
        Some(Block::ToolResult(r)) => &r.content,
        _ => panic!("not a result"),
    }
}

fn go_file(turn: usize, lines: usize) -> String {
    let mut s = format!("package turn{turn}\n\nimport \"fmt\"\n\n");
    for i in 0..lines {
        s.push_str(&format!(
            "func f{i}() {{ x := {i}; fmt.Println(x, {turn}) }}\n"
        ));
    }
    s
}

fn marker_key(s: &str) -> String {
    let start = s.find("<<ccr:").expect("a marker") + 6;
    s[start..start + 16].to_owned()
}

#[tokio::test]
async fn repair_history_reports_what_it_fixed() {
    let server = TestServer::start().await;
    let mut client = spillway::proto::context_client::ContextClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    );
    let messages = vec![
        assistant("a", "t"),
        proto::Message {
            role: Role::User as i32,
            blocks: vec![proto::Block {
                block: Some(Block::Text("hm".into())),
            }],
        },
        result("zzz", "stray"),
    ];
    let r = client
        .repair_history(proto::RepairHistoryRequest {
            messages,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let report = r.report.unwrap();
    assert_eq!(
        (
            report.synthetic_results_injected,
            report.orphan_results_removed
        ),
        (1, 1)
    );
    assert_eq!(report.missing_tool_use_ids, vec!["a"]);
    assert_eq!(r.messages.len(), 3);
    assert!(content_of(&r.messages[1]).starts_with("[Tool result missing"));
    let bad = vec![proto::Message {
        role: 0,
        blocks: vec![],
    }];
    let err = client
        .repair_history(proto::RepairHistoryRequest {
            messages: bad,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_12_turn_history_compacts_losslessly_idempotently_and_dies_with_its_session() {
    let server = TestServer::start().await;
    let session = create_session(&server, ALICE).await;
    let mut client = spillway::proto::context_client::ContextClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    )
    .max_decoding_message_size(64 << 20);
    let mut messages = Vec::new();
    let mut originals = Vec::new();
    for turn in 1..=12 {
        let tool = if turn == 5 { "bash_exec" } else { "read_file" };
        let body = if turn == 12 {
            go_file(turn, 700)
        } else {
            go_file(turn, 200)
        };
        messages.push(assistant(&format!("c{turn}"), tool));
        messages.push(result(&format!("c{turn}"), &body));
        originals.push(body);
    }
    let request = |messages: Vec<proto::Message>| proto::CompactHistoryRequest {
        session_id: session.id.clone(),
        messages,
        current_turn: 12,
        settings: None,
        ..Default::default()
    };
    let reply = client
        .compact_history(request(messages))
        .await
        .unwrap()
        .into_inner();
    let report = reply.report.clone().unwrap();
    let out = reply.messages.clone();
    for turn in 1..=12usize {
        let c = content_of(&out[2 * turn - 1]);
        let age = 12 - turn;
        match (turn, age) {
            (5, _) => assert_eq!(c, originals[4], "exec tools are exempt"),
            (12, _) => assert!(
                c.contains("the whole result is archived"),
                "turn 12 is over the 20 000-char budget: {}",
                &c[..200]
            ),
            (_, a) if a >= 4 => assert!(
                c.starts_with("[Old tool result cleared — 204 lines, ") && c.ends_with(">>"),
                "turn {turn}: {c}"
            ),
            (_, a) if a >= 2 => assert!(
                c.contains("chars omitted from old tool result"),
                "turn {turn}"
            ),
            _ => assert_eq!(c, originals[turn - 1], "turn {turn} is recent"),
        }
    }
    assert_eq!(
        (report.summarized, report.truncated, report.budget_offloaded),
        (7, 2, 1)
    );
    assert_eq!(report.archived_keys.len(), 10);
    assert_eq!(report.stored_keys.len(), 10, "all ten are new");

    // Every marker recalls the exact original.
    for turn in 1..=12usize {
        let c = content_of(&out[2 * turn - 1]);
        if !c.contains("<<ccr:") {
            continue;
        }
        let r = client
            .recall(proto::RecallRequest {
                session_id: session.id.clone(),
                key: marker_key(c),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.content, originals[turn - 1], "turn {turn}");
    }

    // A second compaction stores nothing new and changes nothing.
    let before = payloads_of(&server, &session.id).await.len();
    let again = client
        .compact_history(request(out.clone()))
        .await
        .unwrap()
        .into_inner();
    let again_report = again.report.unwrap();
    assert!(again_report.stored_keys.is_empty(), "{again_report:?}");
    assert_eq!(
        again_report.archived_keys, report.archived_keys,
        "a repeat compaction still reports every archived original it refers to"
    );
    assert_eq!(again.messages, out);
    let after = payloads_of(&server, &session.id).await.len();
    assert_eq!(before, after);

    // Unknown keys and bad keys.
    let err = client
        .recall(proto::RecallRequest {
            session_id: session.id.clone(),
            key: "0000000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains("live and die with their session"),
        "{}",
        err.message()
    );
    let err = client
        .recall(proto::RecallRequest {
            session_id: session.id.clone(),
            key: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Deleting the session makes every key unrecallable.
    let key = marker_key(content_of(&out[1]));
    server
        .sessions(ALICE)
        .await
        .delete_session(proto::DeleteSessionRequest {
            session_id: session.id.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap();
    let err = client
        .recall(proto::RecallRequest {
            session_id: session.id.clone(),
            key,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message()
            .contains("was deleted by alice (receipt rcpt_"),
        "{}",
        err.message()
    );
}

// Provider formats: the history goes in as the provider's JSON and comes back
// in it, through the same repair and compaction.

const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// A Chat Completions request body: a system prompt, a user image, two
/// parallel calls, one large old result and a recent small one.
fn openai_chat_history(big: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "gpt-4.1",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You are a code reviewer."},
            {"role": "user", "content": [
                {"type": "text", "text": "Review the change in this screenshot."},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}"), "detail": "high"}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/lib.rs\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "list_prs", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": big},
            {"role": "tool", "tool_call_id": "call_b", "content": "[{\"number\":7}]"},
            {"role": "assistant", "content": "Two more checks.", "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_c", "content": "fn a() {}"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_d", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"b\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_d", "content": "fn b() {}"},
            {"role": "assistant", "content": "Looks good."}
        ]
    })
}

/// A Responses request body: instructions, a developer prompt, an image,
/// a reasoning item and two parallel calls with their outputs.
fn openai_responses_history(big: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "o4-mini",
        "instructions": "You are a code reviewer.",
        "input": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [
                {"type": "input_text", "text": "Review this."},
                {"type": "input_image", "image_url": format!("data:image/png;base64,{PNG}"), "detail": "auto"}
            ]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAAB-opaque"},
            {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{\"path\":\"src/lib.rs\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "list_prs", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": big},
            {"type": "function_call_output", "call_id": "call_b", "output": "[{\"number\":7}]"},
            {"type": "function_call", "call_id": "call_c", "name": "read_file", "arguments": "{\"path\":\"a\"}"},
            {"type": "function_call_output", "call_id": "call_c", "output": "fn a() {}"},
            {"type": "function_call", "call_id": "call_d", "name": "read_file", "arguments": "{\"path\":\"b\"}"},
            {"type": "function_call_output", "call_id": "call_d", "output": "fn b() {}"},
            {"role": "assistant", "content": "Looks good."}
        ]
    })
}

/// A Messages request body: a cached system prompt, an image, a thinking
/// block, two parallel tool uses, and a tool result that returns an image.
fn anthropic_history(big: &str) -> serde_json::Value {
    let image = serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}});
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a code reviewer.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [image.clone(), {"type": "text", "text": "Review the change in this screenshot."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Read the file and the PRs.", "signature": "EqQBCkYIARgCIkB"},
                {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "src/lib.rs"}},
                {"type": "tool_use", "id": "toolu_b", "name": "screenshot", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": big},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "taken"}, image]}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_c", "name": "read_file", "input": {"path": "a"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_c", "content": "fn a() {}"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_d", "name": "read_file", "input": {"path": "b"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_d", "content": "fn b() {}", "is_error": true}]},
            {"role": "assistant", "content": "Looks good."}
        ]
    })
}

/// A format and a history of it around a given big result.
type FormatCase = (proto::HistoryFormat, fn(&str) -> serde_json::Value);

fn formats() -> [FormatCase; 3] {
    [
        (proto::HistoryFormat::OpenaiChat, openai_chat_history),
        (
            proto::HistoryFormat::OpenaiResponses,
            openai_responses_history,
        ),
        (proto::HistoryFormat::Anthropic, anthropic_history),
    ]
}

async fn context_client(
    server: &TestServer,
) -> spillway::proto::context_client::ContextClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
> {
    spillway::proto::context_client::ContextClient::with_interceptor(
        server.channel().await,
        Bearer(Some(ALICE.into())),
    )
    .max_decoding_message_size(64 << 20)
}

#[tokio::test]
async fn provider_histories_with_images_parallel_calls_and_system_prompts_come_back_unchanged_from_repair()
 {
    let server = TestServer::start().await;
    let mut client = context_client(&server).await;
    for (format, history) in formats() {
        let sent = history(&go_file(1, 50));
        let r = client
            .repair_history(proto::RepairHistoryRequest {
                format: format as i32,
                history_json: sent.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            r.messages.is_empty(),
            "{format:?}: the reply is in the format"
        );
        let back: serde_json::Value = serde_json::from_str(&r.history_json).unwrap();
        assert_eq!(back, sent, "{format:?}");
        let report = r.report.unwrap();
        assert_eq!(report.synthetic_results_injected, 0, "{format:?}");
    }
}

#[tokio::test]
async fn repair_in_a_provider_format_answers_a_missing_parallel_call_in_that_format() {
    let server = TestServer::start().await;
    let mut client = context_client(&server).await;
    // Drop the result of call_b / toolu_b from each history.
    let mut chat = openai_chat_history("x");
    chat["messages"].as_array_mut().unwrap().remove(4);
    let mut responses = openai_responses_history("x");
    responses["input"].as_array_mut().unwrap().remove(6);
    let mut anthropic = anthropic_history("x");
    anthropic["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    for (format, sent) in [
        (proto::HistoryFormat::OpenaiChat, chat),
        (proto::HistoryFormat::OpenaiResponses, responses),
        (proto::HistoryFormat::Anthropic, anthropic),
    ] {
        let r = client
            .repair_history(proto::RepairHistoryRequest {
                format: format as i32,
                history_json: sent.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let report = r.report.unwrap();
        assert_eq!(report.synthetic_results_injected, 1, "{format:?}");
        let back: serde_json::Value = serde_json::from_str(&r.history_json).unwrap();
        let synthetic = match format {
            proto::HistoryFormat::OpenaiChat => back["messages"][4].clone(),
            proto::HistoryFormat::OpenaiResponses => back["input"][6].clone(),
            _ => back["messages"][2]["content"][1].clone(),
        };
        match format {
            proto::HistoryFormat::OpenaiChat => {
                assert_eq!(synthetic["role"], "tool", "{back}");
                assert_eq!(synthetic["tool_call_id"], "call_b", "{back}");
            }
            proto::HistoryFormat::OpenaiResponses => {
                assert_eq!(synthetic["type"], "function_call_output", "{back}");
                assert_eq!(synthetic["call_id"], "call_b", "{back}");
            }
            _ => {
                assert_eq!(synthetic["type"], "tool_result", "{back}");
                assert_eq!(synthetic["tool_use_id"], "toolu_b", "{back}");
                assert_eq!(synthetic["is_error"], true, "{back}");
            }
        }
        // The rest of the request came back too.
        assert!(back.get("model").is_some(), "{format:?}");
    }
}

#[tokio::test]
async fn compaction_in_each_provider_format_archives_an_old_big_result_and_keeps_every_other_piece()
{
    let server = TestServer::start().await;
    let mut client = context_client(&server).await;
    let big = go_file(1, 2000);
    for (format, history) in formats() {
        // A session each: the same original is archived once per session.
        let session = create_session(&server, ALICE).await;
        let sent = history(&big);
        let r = client
            .compact_history(proto::CompactHistoryRequest {
                session_id: session.id.clone(),
                format: format as i32,
                history_json: sent.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.messages.is_empty());
        let report = r.report.unwrap();
        assert_eq!(report.archived_keys.len(), 1, "{format:?}: {report:?}");
        let back: serde_json::Value = serde_json::from_str(&r.history_json).unwrap();
        // The big result is a marker now; everything else is as it was.
        let (compacted, original_at) = match format {
            proto::HistoryFormat::OpenaiChat => ("/messages/3/content", back.clone()),
            proto::HistoryFormat::OpenaiResponses => ("/input/5/output", back.clone()),
            _ => ("/messages/2/content/0/content", back.clone()),
        };
        let text = original_at.pointer(compacted).unwrap().as_str().unwrap();
        assert!(text.contains("<<ccr:"), "{format:?}: {text}");
        assert!(text.len() < big.len() / 4, "{format:?}");
        let mut expected = sent.clone();
        *expected.pointer_mut(compacted).unwrap() = serde_json::Value::String(text.to_owned());
        assert_eq!(back, expected, "{format:?}");
        let recalled = client
            .recall(proto::RecallRequest {
                session_id: session.id.clone(),
                key: marker_key(text),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(recalled.content, big, "{format:?}");
    }
}

#[tokio::test]
async fn a_provider_history_over_the_size_limit_is_refused_naming_the_limit() {
    let server = TestServer::start().await;
    let mut client = context_client(&server).await;
    let limit = spillway::context::MAX_HISTORY_JSON_BYTES;
    let huge = openai_chat_history(&"x".repeat(limit)).to_string();
    let e = client
        .repair_history(proto::RepairHistoryRequest {
            format: proto::HistoryFormat::OpenaiChat as i32,
            history_json: huge,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("over the limit of {limit} bytes")),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn malformed_provider_requests_get_a_reason_and_the_fix() {
    let server = TestServer::start().await;
    let mut client = context_client(&server).await;
    let cases = [
        (
            proto::RepairHistoryRequest {
                format: proto::HistoryFormat::Anthropic as i32,
                history_json: "{\"messages\": [".into(),
                ..Default::default()
            },
            "history_json is not valid JSON",
        ),
        (
            proto::RepairHistoryRequest {
                format: proto::HistoryFormat::OpenaiChat as i32,
                history_json: "[{\"role\": \"robot\"}]".into(),
                ..Default::default()
            },
            "not a HISTORY_FORMAT_OPENAI_CHAT history: messages[0].role",
        ),
        (
            proto::RepairHistoryRequest {
                history_json: "[]".into(),
                ..Default::default()
            },
            "history_json is set but format is not",
        ),
        (
            proto::RepairHistoryRequest {
                format: 9,
                history_json: "[]".into(),
                ..Default::default()
            },
            "format 9 is not a HistoryFormat",
        ),
        (
            proto::RepairHistoryRequest {
                format: proto::HistoryFormat::OpenaiChat as i32,
                history_json: "[]".into(),
                messages: vec![result("a", "b")],
            },
            "both messages and history_json are set",
        ),
    ];
    for (request, want) in cases {
        let e = client.repair_history(request).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(want), "{}", e.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_a_responses_history_as_it_is_and_prints_the_repaired_json() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = ProcessServer::start(None, &data_dir, dir.path().join("server.log")).await;
    let mut history = openai_responses_history("small");
    // call_b loses its output: repair answers it, in Responses items.
    history["input"].as_array_mut().unwrap().remove(6);
    let file = dir.path().join("responses.json");
    std::fs::write(&file, history.to_string()).unwrap();
    let out = command()
        .args(["context", "repair", "--format", "openai-responses"])
        .arg(&file)
        .env("SPILLWAY_ADDR", server.addr.to_string())
        .env("SPILLWAY_DATA_DIR", &data_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back["instructions"], "You are a code reviewer.");
    assert_eq!(back["input"][2]["type"], "reasoning");
    assert_eq!(back["input"][6]["type"], "function_call_output");
    assert_eq!(back["input"][6]["call_id"], "call_b");
    let report: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(
        report["missingToolUseIds"],
        serde_json::json!(["call_b"]),
        "{report}"
    );
}
