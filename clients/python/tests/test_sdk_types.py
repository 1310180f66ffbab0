"""Round trips with the official SDKs' own types (installed by
`make test-python`; skipped only where an SDK is not installed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import spillway
from spillway._history import jsonable

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pydantic = pytest.importorskip("pydantic")

BIG = json.dumps([{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(5000)])


def valid(type_: Any, value: Any) -> None:
    pydantic.TypeAdapter(type_).validate_python(jsonable(value))


def test_openai_chat_sdk_objects_go_through_offload_and_compact(session: spillway.Session) -> None:
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageParam

    assistant = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "list_items", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "spillway_inspect", "arguments": "{\"payload_id\": \"x\"}"}},
        ]}
    )
    messages: list[Any] = [
        {"role": "user", "content": "Count the items."},
        assistant,
        {"role": "tool", "tool_call_id": "call_1", "content": BIG},
        {"role": "tool", "tool_call_id": "call_2", "content": "{}"},
    ]
    kit = session.agent()
    assert kit.owns(assistant.tool_calls[1]) and not kit.owns(assistant.tool_calls[0])  # type: ignore[index]
    out = kit.offload_openai(messages)
    assert out[1] is assistant and "pl_" in out[2]["content"]
    valid(list[ChatCompletionMessageParam], out)
    compacted = kit.compact(out + [{"role": "assistant", "content": "5000"}], format="openai")
    valid(list[ChatCompletionMessageParam], compacted)
    assert compacted[1]["tool_calls"][0]["function"]["name"] == "list_items"
    assert spillway.agent.tool_definitions("openai")[0]["function"]["name"] == "spillway_inspect"


def test_openai_responses_sdk_items_go_through_offload_and_compact(session: spillway.Session) -> None:
    from openai.types.responses import ResponseFunctionToolCall, ResponseInputItemParam

    call = ResponseFunctionToolCall.model_validate(
        {"type": "function_call", "call_id": "call_1", "name": "list_items", "arguments": "{}", "id": "fc_1", "status": "completed"}
    )
    items: list[Any] = [{"role": "user", "content": "Count the items."}, call, {"type": "function_call_output", "call_id": "call_1", "output": BIG}]
    kit = session.agent()
    out = kit.offload_openai(items)
    assert out[1] is call and "pl_" in out[2]["output"]
    valid(list[ResponseInputItemParam], out)
    compacted = kit.compact(out, format="openai")
    valid(list[ResponseInputItemParam], compacted)
    assert compacted[1] == {"type": "function_call", "call_id": "call_1", "name": "list_items", "arguments": "{}"}
    assert spillway.agent.parse_call(call).name == "list_items"


def test_anthropic_sdk_blocks_go_through_offload_and_compact(session: spillway.Session) -> None:
    from anthropic.types import Message, MessageParam

    reply = Message.model_validate(
        {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "stop_reason": "tool_use",
         "usage": {"input_tokens": 1, "output_tokens": 1},
         "content": [{"type": "text", "text": "Listing."}, {"type": "tool_use", "id": "toolu_1", "name": "list_items", "input": {}}]}
    )
    messages: list[Any] = [
        {"role": "user", "content": "Count the items."},
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": BIG}]},
    ]
    kit = session.agent()
    out = kit.offload_anthropic(messages)
    assert out[1] is messages[1] and "pl_" in out[2]["content"][0]["content"]
    valid(list[MessageParam], out)
    compacted = kit.compact(out + [{"role": "assistant", "content": "5000"}], format="anthropic")
    valid(list[MessageParam], compacted)
    assert compacted[1]["content"][1] == {"type": "tool_use", "id": "toolu_1", "name": "list_items", "input": {}}
    assert kit.owns(reply.content[1]) is False
