"""A complete agent loop with Spillway: the model calls a tool that returns a
huge result, Spillway offloads it into the session and gives the model a
notice, and the model follows up with spillway_inspect and spillway_exec.

    python examples/python/agent_loop.py            # a scripted model
    OPENAI_API_KEY=... python examples/python/agent_loop.py
    ANTHROPIC_API_KEY=... python examples/python/agent_loop.py

With a dev server running (`make run`), spillway.Client() needs no settings.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from typing import Any

import spillway

QUESTION = "How many error events did the billing service log? Answer with the number."

FETCH_EVENTS = {
    "name": "fetch_events",
    "description": "Fetch every event of the last day from the event store, as a JSON array.",
    "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
}


def make_events(target_bytes: int, seed: int = 7) -> str:
    """A JSON array of events of about `target_bytes` (a large tool result)."""
    rng = random.Random(seed)
    services = ["billing", "search", "auth", "checkout", "mailer"]
    levels = ["info"] * 8 + ["warn", "error"]
    parts, size, i = [], 2, 0
    while size < target_bytes:
        event = json.dumps(
            {"id": i, "service": rng.choice(services), "level": rng.choice(levels), "latency_ms": rng.randint(1, 900),
             "message": f"request {i} handled by worker {rng.randint(1, 64)}"}
        )
        parts.append(event)
        size += len(event) + 1
        i += 1
    return "[" + ",".join(parts) + "]"


def run_tool(name: str, args: dict[str, Any], events: str) -> str:
    """The application's own tools."""
    if name == "fetch_events":
        return events
    return json.dumps({"error": f"unknown tool {name}"})


class ScriptedModel:
    """Stands in for an LLM without a key: it follows the notices, as a model
    would: inspect the saved payload, then count with jq, then answer."""

    def __call__(self, messages: list[Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1]
        if last["role"] == "user":
            return self._call("fetch_events", {})
        text = last["content"]
        handle = re.search(r"pl_[0-9a-f]{32}", text)
        if text.startswith("[Saved to file]") and handle:
            return self._call("spillway_inspect", {"payload_id": handle.group(0)})
        reply = json.loads(text)
        if "detected_type" in reply:
            assert any(f["path"] == "service" for f in reply["structure"]["fields"]), reply
            script = '[.[] | select(.service == "billing" and .level == "error")] | length'
            return self._call("spillway_exec", {"runtime": "jq", "script": script, "payload_ids": [reply["payload_id"]]})
        if "stdout" in reply:
            return {"role": "assistant", "content": f"The billing service logged {reply['stdout'].strip()} error events."}
        return {"role": "assistant", "content": f"I could not follow the tool reply: {text[:200]}"}

    def _call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.n = getattr(self, "n", 0) + 1
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{self.n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def openai_model(model: str = "gpt-4.1-mini") -> Any:
    """A real OpenAI model (Chat Completions), as a callable like ScriptedModel."""
    import openai

    llm = openai.OpenAI()

    def call(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        message = llm.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message
        return message.model_dump(exclude_none=True)

    return call


def agent_loop(session: spillway.Session, model: Any, events: str, max_steps: int = 8) -> str:
    """The loop: the lines a user writes with the kit."""
    kit = session.agent()
    tools = [{"type": "function", "function": {"name": FETCH_EVENTS["name"], "description": FETCH_EVENTS["description"],
                                               "parameters": FETCH_EVENTS["input_schema"]}}] + kit.tools("openai")
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    for _ in range(max_steps):
        msg = model(messages, tools)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return str(msg.get("content"))
        for call in msg["tool_calls"]:
            name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            content = kit.handle(call) if kit.owns(call) else run_tool(name, args, events)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        messages = kit.offload_openai(messages)
    return "no answer within the step limit"


def anthropic_loop(session: spillway.Session, events: str, model: str = "claude-sonnet-4-5") -> str:
    """The same loop on Anthropic Messages."""
    import anthropic

    llm, kit = anthropic.Anthropic(), session.agent()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    for _ in range(8):
        reply = llm.messages.create(model=model, max_tokens=1024, messages=messages, tools=[FETCH_EVENTS] + kit.tools("anthropic"))
        messages.append({"role": "assistant", "content": reply.content})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            return "".join(b.text for b in reply.content if b.type == "text")
        results = [{"type": "tool_result", "tool_use_id": b.id,
                    "content": kit.handle(b) if kit.owns(b) else run_tool(b.name, dict(b.input), events)} for b in calls]
        messages = kit.offload_anthropic(messages + [{"role": "user", "content": results}])
    return "no answer within the step limit"


def main() -> int:
    events = make_events(int(os.environ.get("EVENTS_BYTES", 30_000_000)))
    with spillway.Client() as client, client.session(label="agent-loop") as session:
        if os.environ.get("ANTHROPIC_API_KEY") and not os.environ.get("OPENAI_API_KEY"):
            answer = anthropic_loop(session, events)
        else:
            model = openai_model() if os.environ.get("OPENAI_API_KEY") else ScriptedModel()
            answer = agent_loop(session, model, events)
    print(answer)
    truth = sum(1 for e in json.loads(events) if e["service"] == "billing" and e["level"] == "error")
    print(f"(truth: {truth})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
