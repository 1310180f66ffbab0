"""The agent kit: Spillway in a model's tool loop.

`kit = session.agent()` gives a :class:`Kit` that

- lists Spillway's tools for the model (`kit.tools("openai" | "anthropic")`),
- runs the model's calls of them (`kit.handle(call)`),
- offloads the oversized tool results of the last turn, replacing them with
  notices the model can follow up with those tools
  (`kit.offload_openai(messages)`, `kit.offload_anthropic(messages)`),
- and compacts a long history (`kit.compact(messages, format=...)`).

Histories stay in the provider's own shapes: plain dicts, or the official
SDKs' objects. Converting a history between formats is the server's job
(the Context API's format field); the kit only finds the tool results of
the last turn and swaps their text.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from . import _history
from .errors import SpillwayError
from .types import ExecResult, Outcome, ReadResult, SearchResult, Structure, ToolResult

if TYPE_CHECKING:
    from .aio import AsyncSession
    from .client import Session

_SPEC: dict[str, Any] = json.loads(resources.files(__package__).joinpath("tools.json").read_text("utf-8"))
TOOLS: dict[str, dict[str, Any]] = {t["name"]: t for t in _SPEC["tools"]}
"""Every Spillway tool by name: its description and input JSON Schema."""
DEFAULT_TOOLS: tuple[str, ...] = tuple(_SPEC["default"])
"""The tools `Kit.tools()` lists unless told otherwise."""

READ_MAX_BYTES = 64 << 10
"""Most bytes spillway_read returns to the model in one call."""


def tool_definitions(format: str = "openai", names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Function-tool definitions in a provider's shape: "openai" (Chat
    Completions), "openai-responses" or "anthropic"."""
    chosen = [TOOLS[n] for n in (names or DEFAULT_TOOLS)]
    kind = format.lower()
    if kind in ("openai", "openai-chat"):
        return [
            {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
            for t in chosen
        ]
    if kind in ("openai-responses", "responses"):
        return [
            {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
            for t in chosen
        ]
    if kind == "anthropic":
        return [{"name": t["name"], "description": t["description"], "input_schema": t["input_schema"]} for t in chosen]
    raise ValueError(f"format {format!r} is not known; use 'openai', 'openai-responses' or 'anthropic'")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


@dataclass(frozen=True)
class Call:
    """A tool call, whatever shape it came in."""

    name: str
    arguments: dict[str, Any]
    id: str


def parse_call(call: Any) -> Call:
    """Reads a Chat Completions tool call, a Responses function_call item, an
    Anthropic tool_use block (dicts or SDK objects), or a (name, arguments) pair."""
    if isinstance(call, tuple) and len(call) == 2:
        name, args = call
        return Call(str(name), _arguments(args), "")
    function = _get(call, "function")
    if function is not None:
        return Call(str(_get(function, "name", "")), _arguments(_get(function, "arguments", "{}")), str(_get(call, "id", "")))
    kind = _get(call, "type")
    if kind == "tool_use":
        return Call(str(_get(call, "name", "")), _arguments(_get(call, "input", {})), str(_get(call, "id", "")))
    if kind == "function_call":
        return Call(str(_get(call, "name", "")), _arguments(_get(call, "arguments", "{}")), str(_get(call, "call_id", "")))
    raise ValueError(
        f"{type(call).__name__} is not a tool call: pass a Chat Completions tool call, a Responses function_call "
        "item, an Anthropic tool_use block, or (name, arguments)"
    )


def _arguments(args: Any) -> dict[str, Any]:
    if isinstance(args, str):
        parsed = json.loads(args or "{}")
    else:
        parsed = _history.jsonable(args)
    if not isinstance(parsed, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return parsed


# What the tools return to the model: JSON in the shape of the MCP tools'
# structured output.


def _payload_entry(p: Any) -> dict[str, Any]:
    return {
        "payload_id": p.id,
        "name": p.name,
        "path": p.path,
        "size_bytes": p.size_bytes,
        "line_count": p.line_count,
        "estimated_tokens": p.estimated_tokens,
        "content_type": p.content_type,
        "tool_name": p.tool_name,
    }


def _structure(s: Structure) -> dict[str, Any]:
    structure: dict[str, Any] = {}
    if s.top_level is not None:
        structure.update(
            top_level=s.top_level,
            record_count=s.record_count,
            fields=[{"path": f.path, "types": list(f.types), "present": f.present_count, "example": f.example} for f in s.fields],
        )
    if s.columns:
        structure.update(columns=list(s.columns), row_count=s.row_count)
    if s.longest_line is not None:
        structure.update(longest_line=s.longest_line, sample_lines=list(s.sample_lines))
    return {
        "payload_id": s.payload_id,
        "detected_type": s.detected_type,
        "size_bytes": s.size_bytes,
        "line_count": s.line_count,
        "summary": s.summary,
        "structure": structure,
    }


def _search(r: SearchResult) -> dict[str, Any]:
    return {
        "matches": [
            {"payload_id": m.payload_id, "line_number": m.line_number, "line": m.line, "before": list(m.before), "after": list(m.after)}
            for m in r.matches
        ],
        "truncated": r.truncated,
        "total_matches_seen": r.total_matches_seen,
        "note": r.note,
    }


def _read(payload_id: str, r: ReadResult) -> dict[str, Any]:
    return {
        "payload_id": payload_id,
        "text": r.text,
        "first_line": r.first_line,
        "last_line": r.last_line,
        "start_offset": r.start_offset,
        "end_offset": r.end_offset,
        "total_bytes": r.total_bytes,
        "total_lines": r.total_lines,
        "eof": r.eof,
    }


def _exec(r: ExecResult) -> dict[str, Any]:
    out: dict[str, Any] = {"status": r.status, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr, "message": r.message}
    if r.stdout_payload is not None:
        out["stdout_payload_id"] = r.stdout_payload.id
    return out


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)


def _error(name: str, e: SpillwayError) -> str:
    code = e.code.name if e.code is not None else "INVALID_ARGUMENT"
    return _dump({"error": code, "tool": name, "message": e.message})


# Finding the last turn's results in a provider history.


@dataclass
class _Slot:
    """One tool result of the last turn: where it is and what it says."""

    index: int
    block: int | None
    """Index in an Anthropic message's content, or None."""
    call_id: str
    tool_name: str
    text: str
    is_error: bool
    content_key: str
    """"content" (Chat, Anthropic) or "output" (Responses)."""
    text_type: str
    """The type of a text part in this format: "text" or "input_text"."""


def _text_of(content: Any) -> tuple[str, bool]:
    """The text of a result's content, and whether it holds non-text parts."""
    if content is None:
        return "", False
    if isinstance(content, str):
        return content, False
    texts: list[str] = []
    other = False
    for part in content:
        if _get(part, "type") in ("text", "input_text", "output_text") and isinstance(_get(part, "text"), str):
            texts.append(_get(part, "text"))
        else:
            other = True
    return "\n".join(texts), other


def _with_text(content: Any, text: str, text_type: str) -> Any:
    """`content` with its text replaced by `text`, non-text parts kept."""
    if content is None or isinstance(content, str):
        return text
    others = [p for p in content if _get(p, "type") not in ("text", "input_text", "output_text")]
    if not others:
        return text
    return [{"type": text_type, "text": text}, *others]


def _replace(item: Any, key: str, value: Any) -> Any:
    """A copy of `item` (a dict or an SDK object) with `key` set."""
    if isinstance(item, dict):
        out = dict(item)
        out[key] = value
        return out
    model_copy = getattr(item, "model_copy", None)
    if callable(model_copy):
        return model_copy(update={key: value})
    clone = copy.copy(item)
    setattr(clone, key, value)
    return clone


def _openai_slots(messages: Sequence[Any]) -> list[_Slot]:
    """The trailing run of Chat `role: tool` messages or Responses
    `function_call_output` items: the results of the last turn."""
    start = len(messages)
    while start > 0:
        m = messages[start - 1]
        if _get(m, "role") == "tool" or _get(m, "type") == "function_call_output":
            start -= 1
        else:
            break
    names: dict[str, str] = {}
    for m in messages[:start]:
        for c in _get(m, "tool_calls", None) or ():
            names[str(_get(c, "id", ""))] = str(_get(_get(c, "function", {}), "name", ""))
        if _get(m, "type") == "function_call":
            names[str(_get(m, "call_id", ""))] = str(_get(m, "name", ""))
    slots = []
    for i in range(start, len(messages)):
        m = messages[i]
        if _get(m, "type") == "function_call_output":
            call_id, key, text_type = str(_get(m, "call_id", "")), "output", "input_text"
        else:
            call_id, key, text_type = str(_get(m, "tool_call_id", "")), "content", "text"
        text, _ = _text_of(_get(m, key))
        slots.append(_Slot(i, None, call_id, names.get(call_id, str(_get(m, "name", "") or "")), text, False, key, text_type))
    return slots


def _anthropic_slots(messages: Sequence[Any]) -> list[_Slot]:
    """The tool_result blocks of the last user message, if it follows an
    assistant message with tool_use blocks."""
    if not messages or _get(messages[-1], "role") != "user":
        return []
    content = _get(messages[-1], "content")
    if isinstance(content, str) or not content:
        return []
    names: dict[str, str] = {}
    for m in messages[:-1]:
        blocks = _get(m, "content")
        if _get(m, "role") == "assistant" and not isinstance(blocks, str):
            for b in blocks or ():
                if _get(b, "type") == "tool_use":
                    names[str(_get(b, "id", ""))] = str(_get(b, "name", ""))
    slots = []
    for j, b in enumerate(content):
        if _get(b, "type") != "tool_result":
            continue
        call_id = str(_get(b, "tool_use_id", ""))
        text, _ = _text_of(_get(b, "content"))
        slots.append(_Slot(len(messages) - 1, j, call_id, names.get(call_id, ""), text, bool(_get(b, "is_error", False)), "content", "text"))
    return slots


def _apply(messages: Sequence[Any], slots: list[_Slot], outcomes: list[Outcome]) -> list[Any]:
    """The messages with each slot's text replaced by its outcome's, when they differ."""
    out = list(messages)
    for slot, outcome in zip(slots, outcomes):
        if outcome.text == slot.text:
            continue
        if slot.block is None:
            item = out[slot.index]
            out[slot.index] = _replace(item, slot.content_key, _with_text(_get(item, slot.content_key), outcome.text, slot.text_type))
        else:
            message = out[slot.index]
            blocks = list(_get(message, "content"))
            block = blocks[slot.block]
            blocks[slot.block] = _replace(block, "content", _with_text(_get(block, "content"), outcome.text, "text"))
            out[slot.index] = _replace(message, "content", blocks)
    return out


def _results(slots: list[_Slot]) -> list[ToolResult]:
    return [ToolResult(s.call_id, s.tool_name, s.text, is_error=s.is_error) for s in slots]


class _Base:
    """What the sync and async kits share."""

    def __init__(self, names: Sequence[str] | None = None) -> None:
        self.names: tuple[str, ...] = tuple(names or DEFAULT_TOOLS)
        unknown = [n for n in self.names if n not in TOOLS]
        if unknown:
            raise ValueError(f"unknown tools {unknown}; Spillway's tools are {sorted(TOOLS)}")

    def tools(self, format: str = "openai") -> list[dict[str, Any]]:
        """The kit's tool definitions for the model, in the provider's shape."""
        return tool_definitions(format, self.names)

    def owns(self, call: Any) -> bool:
        """Whether a tool call is one of Spillway's tools."""
        try:
            return parse_call(call).name in TOOLS
        except ValueError:
            return False


class Kit(_Base):
    """The agent kit on a (synchronous) session."""

    def __init__(self, session: Session, names: Sequence[str] | None = None) -> None:
        super().__init__(names)
        self.session = session

    def handle(self, call: Any) -> str:
        """Runs a call of a Spillway tool; returns the tool-result content for
        the model (JSON). A failed call returns the server's message as an
        error object, so the model can act on it."""
        c = parse_call(call)
        try:
            return _dump(self._run(c))
        except SpillwayError as e:
            return _error(c.name, e)

    def _run(self, c: Call) -> dict[str, Any]:
        s, a = self.session, c.arguments
        if c.name == "spillway_list":
            return {"payloads": [_payload_entry(p) for p in s.payloads()]}
        if c.name == "spillway_inspect":
            return _structure(s.inspect(str(a.get("payload_id", ""))))
        if c.name == "spillway_search":
            return _search(
                s.search(
                    str(a.get("pattern", "")),
                    payload_ids=a.get("payload_ids"),
                    fixed_string=bool(a.get("fixed_string", False)),
                    case_insensitive=bool(a.get("case_insensitive", False)),
                    context_lines=int(a.get("context_lines", 0)),
                    max_matches=int(a.get("max_matches", 0)),
                )
            )
        if c.name == "spillway_read":
            pid, lines, byte_range, max_bytes = _read_args(a)
            return _read(pid, s.read(pid, lines=lines, byte_range=byte_range, max_bytes=max_bytes))
        if c.name == "spillway_exec":
            inputs = a.get("payload_ids")
            if inputs is None and a.get("runtime") == "jq":
                inputs = [p.id for p in s.payloads()]
            limits = _limits(a)
            return _exec(s.exec(str(a.get("runtime", "")), str(a.get("script", "")), inputs=inputs, args=a.get("args"), limits=limits))
        if c.name == "spillway_recall":
            r = s.recall(str(a.get("key", "")))
            return {"content": r.content, "payload_id": r.payload_id}
        raise ValueError(f"{c.name!r} is not a Spillway tool; check kit.owns(call) first")

    def offload_openai(self, messages: Sequence[Any]) -> list[Any]:
        """The history with the last turn's oversized results (Chat `role: tool`
        messages, or Responses `function_call_output` items) replaced by notices."""
        return self._offload(messages, _openai_slots(messages))

    def offload_anthropic(self, messages: Sequence[Any]) -> list[Any]:
        """The history with the last turn's oversized `tool_result` blocks
        replaced by notices."""
        return self._offload(messages, _anthropic_slots(messages))

    def _offload(self, messages: Sequence[Any], slots: list[_Slot]) -> list[Any]:
        if not slots:
            return list(messages)
        return _apply(messages, slots, self.session.offload(_results(slots)))

    def compact(self, messages: Any, format: str = "openai", *, current_turn: int = 0, settings: dict[str, Any] | None = None) -> Any:
        """The history compacted by the server (CompactHistory), in its format."""
        return self.session.compact(messages, format, current_turn=current_turn, settings=settings).history


class AsyncKit(_Base):
    """The agent kit on an async session; the same methods, awaited."""

    def __init__(self, session: AsyncSession, names: Sequence[str] | None = None) -> None:
        super().__init__(names)
        self.session = session

    async def handle(self, call: Any) -> str:
        """See Kit.handle."""
        c = parse_call(call)
        try:
            return _dump(await self._run(c))
        except SpillwayError as e:
            return _error(c.name, e)

    async def _run(self, c: Call) -> dict[str, Any]:
        s, a = self.session, c.arguments
        if c.name == "spillway_list":
            return {"payloads": [_payload_entry(p) for p in await s.payloads()]}
        if c.name == "spillway_inspect":
            return _structure(await s.inspect(str(a.get("payload_id", ""))))
        if c.name == "spillway_search":
            return _search(
                await s.search(
                    str(a.get("pattern", "")),
                    payload_ids=a.get("payload_ids"),
                    fixed_string=bool(a.get("fixed_string", False)),
                    case_insensitive=bool(a.get("case_insensitive", False)),
                    context_lines=int(a.get("context_lines", 0)),
                    max_matches=int(a.get("max_matches", 0)),
                )
            )
        if c.name == "spillway_read":
            pid, lines, byte_range, max_bytes = _read_args(a)
            return _read(pid, await s.read(pid, lines=lines, byte_range=byte_range, max_bytes=max_bytes))
        if c.name == "spillway_exec":
            inputs = a.get("payload_ids")
            if inputs is None and a.get("runtime") == "jq":
                inputs = [p.id for p in await s.payloads()]
            return _exec(await s.exec(str(a.get("runtime", "")), str(a.get("script", "")), inputs=inputs, args=a.get("args"), limits=_limits(a)))
        if c.name == "spillway_recall":
            r = await s.recall(str(a.get("key", "")))
            return {"content": r.content, "payload_id": r.payload_id}
        raise ValueError(f"{c.name!r} is not a Spillway tool; check kit.owns(call) first")

    async def offload_openai(self, messages: Sequence[Any]) -> list[Any]:
        """See Kit.offload_openai."""
        slots = _openai_slots(messages)
        return _apply(messages, slots, await self.session.offload(_results(slots))) if slots else list(messages)

    async def offload_anthropic(self, messages: Sequence[Any]) -> list[Any]:
        """See Kit.offload_anthropic."""
        slots = _anthropic_slots(messages)
        return _apply(messages, slots, await self.session.offload(_results(slots))) if slots else list(messages)

    async def compact(self, messages: Any, format: str = "openai", *, current_turn: int = 0, settings: dict[str, Any] | None = None) -> Any:
        """See Kit.compact."""
        return (await self.session.compact(messages, format, current_turn=current_turn, settings=settings)).history


def _read_args(a: dict[str, Any]) -> tuple[str, tuple[int, int] | None, tuple[int, int] | None, int]:
    pid = str(a.get("payload_id", ""))
    lines = None
    byte_range = None
    if "start_line" in a or "end_line" in a:
        lines = (int(a.get("start_line", 1)), int(a.get("end_line", 0)))
    elif "offset" in a or "length" in a:
        byte_range = (int(a.get("offset", 0)), int(a.get("length", 0)))
    max_bytes = min(int(a.get("max_bytes", READ_MAX_BYTES)), READ_MAX_BYTES)
    return pid, lines, byte_range, max_bytes


def _limits(a: dict[str, Any]) -> Any:
    from .types import ExecLimits

    timeout = a.get("timeout_ms")
    return ExecLimits(timeout_ms=int(timeout)) if timeout else None


Handler = Callable[[Any], str]
