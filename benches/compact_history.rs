//! CompactHistory on a 200-message history totalling 20 MB, end to end over
//! gRPC (repair, budgets, microcompaction, archiving into the session), with
//! the process's allocations counted during the call. The reference is the
//! same history's repair alone, which is the floor every call pays.
//!
//! `make bench` runs it; each round uses a fresh session, so every original
//! is archived (nothing is found already stored).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use common::{BenchServer, machine, median, rounds};
use spillway::proto::{self, Role, block::Block, context_client::ContextClient};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the counters only observe.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn history(salt: usize) -> (Vec<proto::Message>, usize) {
    // 100 turns: an assistant call and a ~200 KB result each.
    let mut messages = Vec::new();
    let mut bytes = 0;
    for turn in 0..100 {
        let id = format!("call_{turn}");
        messages.push(proto::Message {
            role: Role::Assistant as i32,
            blocks: vec![proto::Block {
                block: Some(Block::ToolUse(proto::ToolUseBlock {
                    id: id.clone(),
                    name: "read_file".into(),
                    input_json: "{}".into(),
                })),
            }],
        });
        let content: String = (0..5000)
            .map(|i| {
                format!("{{\"turn\":{turn},\"salt\":{salt},\"line\":{i},\"v\":\"abcdefgh\"}}\n")
            })
            .collect();
        bytes += content.len();
        messages.push(proto::Message {
            role: Role::Tool as i32,
            blocks: vec![proto::Block {
                block: Some(Block::ToolResult(proto::ToolResultBlock {
                    tool_use_id: id,
                    content,
                    ..Default::default()
                })),
            }],
        });
    }
    (messages, bytes)
}

#[tokio::main]
async fn main() {
    let rounds = rounds();
    let server = BenchServer::start(|_| {}).await;
    let mut sessions = server.sessions.clone();
    let auth: common::Auth = common::auth;
    let mut client = ContextClient::with_interceptor(server.channel.clone(), auth)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20);
    let (mut compact_t, mut repair_t, mut allocs, mut alloc_bytes) =
        (vec![], vec![], vec![], vec![]);
    let mut size = 0;
    let mut saved = 0;
    for round in 0..rounds {
        let (messages, bytes) = history(round);
        size = bytes;
        let session = sessions
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .into_inner()
            .id;

        let t = std::time::Instant::now();
        client
            .repair_history(proto::RepairHistoryRequest {
                messages: messages.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        repair_t.push(t.elapsed().as_secs_f64());

        let (a0, b0) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        let t = std::time::Instant::now();
        let reply = client
            .compact_history(proto::CompactHistoryRequest {
                session_id: session,
                messages,
                current_turn: 100,
                settings: None,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        compact_t.push(t.elapsed().as_secs_f64());
        allocs.push((ALLOCS.load(Ordering::Relaxed) - a0) as f64);
        alloc_bytes.push((BYTES.load(Ordering::Relaxed) - b0) as f64);
        let r = reply.report.unwrap();
        assert_eq!(
            r.archived_keys.len(),
            100,
            "every result is over a budget or old"
        );
        saved = r.chars_saved;
    }
    let (c, r) = (median(compact_t), median(repair_t));
    println!(
        "# CompactHistory ({}, median of {rounds} rounds)\n",
        machine()
    );
    println!(
        "| measurement | time | allocations | allocated bytes | reference | reference time | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| CompactHistory, 200 messages, {:.1} MB, {} chars saved | {:.0} ms | {:.0} | {:.0} MB | RepairHistory round trip of the same history | {:.0} ms | {:.2} |",
        size as f64 / 1e6,
        saved,
        c * 1e3,
        median(allocs),
        median(alloc_bytes) / 1e6,
        r * 1e3,
        r / c
    );
    println!(
        "\nallocations count the whole process (client and server) during the call; ratio = reference time / CompactHistory time."
    );
    server.stop().await;
}
