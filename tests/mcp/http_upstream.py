"""A real MCP server over Streamable HTTP, built with the official Python SDK
(`mcp` on PyPI, `MCPServer`), for the proxy's `--upstream-url` tests.

Run as `python http_upstream.py PORT`; it serves http://127.0.0.1:PORT/mcp.
Each tool exercises one thing the proxy must relay, and the server keeps a
record (pings received, calls cancelled) that tools report back, so a test
can see what actually reached the upstream:

- `lines(n, tag)`: n lines of text (an oversized result when n is large);
- `audio(kb)`: a WAV clip of kb KiB as an audio content block;
- `slow(seconds)`: waits; a cancellation that reaches it is recorded;
- `record()`: what reached this server: pings, cancelled calls, slow starts;
- `add_report_tool()`: registers `report` (with an `outputSchema` that
  forbids extra keys) and announces it with notifications/tools/list_changed;
- `add_prompt_and_resource()`: registers the prompt `later` and the resource
  `test://later`, and announces both list changes;
- `ping_client()`: pings the client (the proxy) and says how it went.
"""

import base64
import hashlib
import struct
import sys
from typing import Annotated

import anyio
import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import AudioContent, CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict

server = MCPServer("spillway-test-http-upstream", version="1.0", log_level="WARNING")
RECORD = {"pings": 0, "cancelled": [], "slow_started": 0}


def wav(kb: int) -> bytes:
    """A deterministic 8 kHz mono 8-bit WAV clip of about kb KiB."""
    samples = bytes((i * 7 + (i >> 8)) & 0xFF for i in range(kb * 1024))
    header = b"RIFF" + struct.pack("<I", 36 + len(samples)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8)
    header += b"data" + struct.pack("<I", len(samples))
    return header + samples


async def counting_ping(ctx, params):
    RECORD["pings"] += 1
    return types.EmptyResult()


server._lowlevel_server.add_request_handler("ping", types.RequestParams, counting_ping)


@server.tool()
def lines(n: int, tag: str = "line") -> str:
    """n numbered lines of text, each tagged."""
    return "\n".join(f"{tag} {i} alpha beta gamma delta" for i in range(n))


@server.tool()
def audio(kb: int) -> CallToolResult:
    """A WAV clip of kb KiB, with its SHA-256 in the text."""
    data = wav(kb)
    return CallToolResult(content=[
        TextContent(type="text", text=f"clip sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}"),
        AudioContent(type="audio", data=base64.b64encode(data).decode(), mime_type="audio/wav"),
    ])


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Waits for the given time; a cancellation that arrives is recorded."""
    RECORD["slow_started"] += 1
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        RECORD["cancelled"].append(str(ctx.request_id))
        raise
    return "slept"


@server.tool()
def record() -> dict:
    """What reached this server so far."""
    return dict(RECORD)


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int


def report(n: int) -> Annotated[CallToolResult, Report]:
    """A report: n lines of text, and the count as structured content."""
    text = "\n".join(f"report row {i} with some padding text" for i in range(n))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"count": n})


@server.tool()
async def add_report_tool(ctx: Context) -> str:
    """Registers the `report` tool and announces the change."""
    server.add_tool(report, name="report")
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return "added report"


def later_prompt() -> str:
    """A prompt registered at run time."""
    return "the later prompt"


def later_resource() -> str:
    return "the later resource"


@server.tool()
async def add_prompt_and_resource(ctx: Context) -> str:
    """Registers the prompt `later` and the resource test://later, and
    announces both changes."""
    server.prompt(name="later")(later_prompt)
    server.resource("test://later", name="later", mime_type="text/plain")(later_resource)
    await ctx.session.send_prompt_list_changed()
    await ctx.session.send_resource_list_changed()
    return "added"


@server.tool()
async def ping_client(ctx: Context) -> str:
    """Pings this server's client and reports the outcome."""
    try:
        with anyio.fail_after(10):
            await ctx.session.send_ping()
    except Exception as e:  # noqa: BLE001 - the outcome is the answer
        return f"ping failed: {type(e).__name__}: {e}"
    return "client answered the ping"


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
