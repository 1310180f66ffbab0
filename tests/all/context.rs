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
        .repair_history(proto::RepairHistoryRequest { messages })
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
        .repair_history(proto::RepairHistoryRequest { messages: bad })
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
    let mut payloads = server.payloads(ALICE).await;
    let count = |p: proto::ListPayloadsResponse| p.payloads.len();
    let before = count(
        payloads
            .list_payloads(proto::ListPayloadsRequest {
                session_id: session.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner(),
    );
    let again = client
        .compact_history(request(out.clone()))
        .await
        .unwrap()
        .into_inner();
    assert!(again.report.unwrap().archived_keys.is_empty());
    assert_eq!(again.messages, out);
    let after = count(
        payloads
            .list_payloads(proto::ListPayloadsRequest {
                session_id: session.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner(),
    );
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
