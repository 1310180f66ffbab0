"""Provider histories on their way to the Context API: the format's proto
value, and the JSON text. The conversion itself is the server's (the
`format` field of RepairHistory and CompactHistory); this module only
serializes what the caller holds, including the official SDKs' objects."""

from __future__ import annotations

import json
from typing import Any

from .errors import ConfigError

FORMATS = {
    "openai-chat": "HISTORY_FORMAT_OPENAI_CHAT",
    "openai-responses": "HISTORY_FORMAT_OPENAI_RESPONSES",
    "anthropic": "HISTORY_FORMAT_ANTHROPIC",
}
"""Format names and their HistoryFormat enum names; "openai" picks one of the
first two from the history's shape, "responses" is "openai-responses"."""

_RESPONSES_ITEM_TYPES = {
    "function_call",
    "function_call_output",
    "reasoning",
    "message",
    "input_text",
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "item_reference",
}


def jsonable(value: Any) -> Any:
    """Plain JSON values from dicts, lists and SDK objects (pydantic models)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump(mode="json", exclude_none=True))
    raise TypeError(
        f"{type(value).__name__} is not a JSON value or an SDK message; pass dicts, lists or the SDK's objects"
    )


def is_responses(history: Any) -> bool:
    """Whether an OpenAI history is Responses input items rather than Chat messages."""
    if isinstance(history, dict):
        return "input" in history and "messages" not in history
    for item in history:
        kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
        if kind in _RESPONSES_ITEM_TYPES:
            return True
    return False


def format_value(format: str, history: Any) -> str:
    """The HistoryFormat enum name of a format name."""
    name = format.lower()
    if name == "responses":
        name = "openai-responses"
    if name == "openai":
        name = "openai-responses" if is_responses(history) else "openai-chat"
    if name not in FORMATS:
        raise ConfigError(
            f"format {format!r} is not known; use 'openai' (Chat Completions or Responses, told apart by shape), "
            "'openai-chat', 'openai-responses' or 'anthropic'"
        )
    return FORMATS[name]


def dumps(history: Any) -> str:
    """The JSON text of a history."""
    return json.dumps(jsonable(history), ensure_ascii=False, separators=(",", ":"))


def report(message: Any) -> dict[str, Any]:
    """A report message as a dict of its fields (repeated fields as lists)."""
    out: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if hasattr(value, "items"):
            value = dict(value.items())
        elif hasattr(value, "extend"):
            value = list(value)
        out[f.name] = value
    return out
