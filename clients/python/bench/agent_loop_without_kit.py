"""The example's agent loop written without the kit: generated stubs, tool
definitions and dispatch by hand, and the offload step by hand. Counted by
offload_overhead.py against examples/python/agent_loop.py's agent_loop()
(both run, with the scripted model, to prove they do the same work)."""

from __future__ import annotations

import json
from typing import Any

import grpc

from spillway.v1 import codemode_pb2, codemode_pb2_grpc, payloads_pb2, payloads_pb2_grpc


# --- the loop a user writes without the kit ---
def agent_loop_without_kit(addr: str, token: str, session_id: str, model: Any, events: str, run_tool: Any, question: str, fetch_tool: dict[str, Any]) -> str:
    channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
    payloads, codemode = payloads_pb2_grpc.PayloadsStub(channel), codemode_pb2_grpc.CodeModeStub(channel)
    md = [("authorization", f"Bearer {token}")]
    tools = [
        {"type": "function", "function": {"name": fetch_tool["name"], "description": fetch_tool["description"], "parameters": fetch_tool["input_schema"]}},
        {"type": "function", "function": {"name": "spillway_inspect", "description": "Describe a saved payload's structure.",
                                          "parameters": {"type": "object", "properties": {"payload_id": {"type": "string"}}, "required": ["payload_id"]}}},
        {"type": "function", "function": {"name": "spillway_exec", "description": "Run a jq, javascript or python script over saved payloads.",
                                          "parameters": {"type": "object", "properties": {"runtime": {"type": "string"}, "script": {"type": "string"},
                                                                                         "payload_ids": {"type": "array", "items": {"type": "string"}}},
                                                         "required": ["runtime", "script"]}}},
    ]
    messages: list[Any] = [{"role": "user", "content": question}]
    for _ in range(8):
        msg = model(messages, tools)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return str(msg.get("content"))
        names = {}
        for call in msg["tool_calls"]:
            name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            names[call["id"]] = name
            try:
                if name == "spillway_inspect":
                    s = payloads.Inspect(payloads_pb2.PayloadRequest(payload_id=args["payload_id"]), metadata=md)
                    fields = [{"path": f.path, "types": list(f.types), "present": f.present_count, "example": f.example} for f in s.json.fields]
                    content = json.dumps({"payload_id": s.payload_id, "detected_type": s.detected_type, "size_bytes": s.size_bytes,
                                          "line_count": s.line_count, "summary": s.summary,
                                          "structure": {"top_level": s.json.top_level, "record_count": s.json.record_count, "fields": fields}})
                elif name == "spillway_exec":
                    r = codemode.Exec(codemode_pb2.ExecRequest(session_id=session_id, runtime=args["runtime"], source=args["script"],
                                                               inputs=args.get("payload_ids", [])), metadata=md)
                    content = json.dumps({"status": codemode_pb2.ExecStatus.Name(r.status).removeprefix("EXEC_STATUS_").lower(),
                                          "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr, "message": r.message})
                else:
                    content = run_tool(name, args, events)
            except grpc.RpcError as e:
                content = json.dumps({"error": e.code().name, "message": e.details()})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        start = len(messages) - len(msg["tool_calls"])
        results = [payloads_pb2.ToolResult(tool_call_id=m["tool_call_id"], tool_name=names[m["tool_call_id"]], content=m["content"].encode())
                   for m in messages[start:]]
        reply = payloads.Offload(payloads_pb2.OffloadRequest(session_id=session_id, results=results), metadata=md)
        for m, outcome in zip(messages[start:], reply.outcomes):
            m["content"] = outcome.content
    return "no answer within the step limit"
# --- end ---
