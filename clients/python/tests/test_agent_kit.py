"""The agent kit on OpenAI (Chat Completions and Responses) and Anthropic
histories, compared with golden outputs (tests/golden/, checked by hand once;
regenerate with SPILLWAY_UPDATE_GOLDEN=1 and review the diff)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

import spillway
from spillway.agent import TOOLS, tool_definitions

GOLDEN = Path(__file__).parent / "golden"

PRS = json.dumps(
    [
        {"number": n, "title": f"Fix flaky test {n}", "user": {"login": f"dev{n % 7}"}, "state": "open" if n % 4 else "closed", "labels": [{"name": "ci"}] if n % 5 == 0 else []}
        for n in range(1, 1501)
    ]
)
README = "# Service\n\nRun `make` to build.\n"


def normalize(value: Any) -> Any:
    """The output with random IDs replaced, so that it can be compared."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    text = re.sub(r"pl_[0-9a-f]{32}", "pl_<ID>", text)
    text = re.sub(r"ses_[0-9a-f]{32}", "ses_<ID>", text)
    return json.loads(text)


# Read at import: the autouse fixture clears SPILLWAY_* before each test.
UPDATE_GOLDEN = bool(os.environ.get("SPILLWAY_UPDATE_GOLDEN"))


def golden(name: str, value: Any) -> None:
    path = GOLDEN / f"{name}.json"
    got = normalize(value)
    if UPDATE_GOLDEN or not path.exists():
        path.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
        if not UPDATE_GOLDEN:
            pytest.fail(f"{path} did not exist and was written; check it by hand, then run again")
    assert got == json.loads(path.read_text()), f"differs from {path}"


def chat_history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You triage pull requests."},
        {"role": "user", "content": "Which open PRs touch CI?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_prs", "type": "function", "function": {"name": "list_prs", "arguments": "{\"state\":\"all\"}"}},
            {"id": "call_readme", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"README.md\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_prs", "content": PRS},
        {"role": "tool", "tool_call_id": "call_readme", "content": README},
    ]


def responses_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Which open PRs touch CI?"},
        {"type": "function_call", "call_id": "call_prs", "name": "list_prs", "arguments": "{\"state\":\"all\"}"},
        {"type": "function_call", "call_id": "call_readme", "name": "read_file", "arguments": "{\"path\":\"README.md\"}"},
        {"type": "function_call_output", "call_id": "call_prs", "output": PRS},
        {"type": "function_call_output", "call_id": "call_readme", "output": README},
    ]


def anthropic_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Which open PRs touch CI?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Listing them."},
            {"type": "tool_use", "id": "toolu_prs", "name": "list_prs", "input": {"state": "all"}},
            {"type": "tool_use", "id": "toolu_readme", "name": "read_file", "input": {"path": "README.md"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_prs", "content": [{"type": "text", "text": PRS}]},
            {"type": "tool_result", "tool_use_id": "toolu_readme", "content": README},
        ]},
    ]


def test_tools_come_in_each_providers_shape_with_one_set_of_descriptions() -> None:
    names = ["spillway_inspect", "spillway_search", "spillway_read", "spillway_exec"]
    chat = tool_definitions("openai")
    assert [t["function"]["name"] for t in chat] == names
    assert all(t["type"] == "function" and t["function"]["description"] == TOOLS[t["function"]["name"]]["description"] for t in chat)
    responses = tool_definitions("openai-responses")
    assert [t["name"] for t in responses] == names and responses[0]["parameters"] == TOOLS["spillway_inspect"]["input_schema"]
    anthropic = tool_definitions("anthropic")
    assert [t["name"] for t in anthropic] == names and "input_schema" in anthropic[0]
    golden("tools_anthropic", anthropic)


def test_offload_openai_replaces_the_big_chat_result_with_a_notice(session: spillway.Session) -> None:
    kit = session.agent()
    history = chat_history()
    out = kit.offload_openai(history)
    assert out[:4 - 1] == history[:3] and out[4] is history[4]
    notice = out[3]["content"]
    assert notice != PRS and "pl_" in notice and len(notice) < len(PRS) // 10
    assert history[3]["content"] == PRS, "the input is not changed"
    golden("offload_openai_chat", out)


def test_offload_openai_works_on_responses_function_call_outputs(session: spillway.Session) -> None:
    out = session.agent().offload_openai(responses_history())
    assert out[3]["type"] == "function_call_output" and out[3]["output"] != PRS and "pl_" in out[3]["output"]
    assert out[4]["output"] == README
    golden("offload_openai_responses", out)


def test_offload_anthropic_replaces_the_big_tool_result(session: spillway.Session) -> None:
    out = session.agent().offload_anthropic(anthropic_history())
    blocks = out[2]["content"]
    assert blocks[0]["type"] == "tool_result" and blocks[0]["tool_use_id"] == "toolu_prs"
    assert isinstance(blocks[0]["content"], str) and "pl_" in blocks[0]["content"]
    assert blocks[1]["content"] == README
    golden("offload_anthropic", out)


def test_only_the_last_turn_is_offloaded(session: spillway.Session) -> None:
    history = chat_history() + [{"role": "assistant", "content": "Let me look."}, {"role": "user", "content": "go on"}]
    assert session.agent().offload_openai(history) == history


def test_handle_runs_each_tool_from_each_providers_call_shape(session: spillway.Session) -> None:
    kit = session.agent()
    out = kit.offload_openai(chat_history())
    pid = re.search(r"pl_[0-9a-f]{32}", out[3]["content"]).group(0)  # type: ignore[union-attr]
    inspect = json.loads(kit.handle({"id": "c1", "type": "function", "function": {"name": "spillway_inspect", "arguments": json.dumps({"payload_id": pid})}}))
    assert inspect["detected_type"] == "json" and inspect["structure"]["record_count"] == 1500
    search = json.loads(kit.handle({"type": "function_call", "call_id": "c2", "name": "spillway_search", "arguments": json.dumps({"pattern": "Fix flaky test 1499\"", "fixed_string": True})}))
    assert len(search["matches"]) == 1 and search["matches"][0]["payload_id"] == pid
    read = json.loads(kit.handle({"type": "tool_use", "id": "t3", "name": "spillway_read", "input": {"payload_id": pid, "offset": 0, "length": 12}}))
    assert read["text"] == PRS[:12] and read["eof"] is False
    ex = json.loads(kit.handle(("spillway_exec", {"runtime": "jq", "script": '[.[] | select(.state == "open" and (.labels | length) > 0)] | length', "payload_ids": [pid]})))
    want = sum(1 for n in range(1, 1501) if n % 4 and n % 5 == 0)
    assert ex["status"] == "ok" and ex["stdout"].strip() == str(want)
    listed = json.loads(kit.handle(("spillway_list", {})))
    assert pid in [p["payload_id"] for p in listed["payloads"]]
    assert kit.owns(("spillway_read", {})) and not kit.owns(("list_prs", {}))
    err = json.loads(kit.handle(("spillway_inspect", {"payload_id": "pl_" + "0" * 32})))
    assert err["error"] == "NOT_FOUND" and err["message"].startswith("payload pl_")


def test_compact_returns_provider_messages_in_each_format(session: spillway.Session) -> None:
    kit = session.agent()
    big = "\n".join(f"{i:05d} GET /api/v1/items/{i} 200 {i % 97}ms" for i in range(4000))

    def chat_turns() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": "You read logs."}]
        for t in range(5):
            out += [
                {"role": "user", "content": f"step {t}"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{t}", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"c{t}", "content": big if t == 0 else f"small {t}"},
            ]
        return out + [{"role": "assistant", "content": "done"}]

    chat = kit.compact(chat_turns(), format="openai")
    assert "<<ccr:" in chat[3]["content"] and chat[0] == {"role": "system", "content": "You read logs."}
    golden("compact_openai_chat", chat)

    anthropic = [
        {"role": "user", "content": "step 0"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "read_log", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": big}]},
    ]
    for t in range(1, 5):
        anthropic += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{t}", "name": "read_log", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{t}", "content": f"small {t}"}]},
        ]
    anthropic.append({"role": "assistant", "content": "done"})
    compacted = kit.compact({"system": "You read logs.", "messages": anthropic}, format="anthropic")
    assert compacted["system"] == "You read logs."
    assert "<<ccr:" in compacted["messages"][2]["content"][0]["content"]
    golden("compact_anthropic", compacted)
    key = re.search(r"<<ccr:([0-9a-f]{16})>>", compacted["messages"][2]["content"][0]["content"]).group(1)  # type: ignore[union-attr]
    assert json.loads(kit.handle(("spillway_recall", {"key": key})))["content"] == big
