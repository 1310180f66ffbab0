"""`spillway mcp proxy --upstream-url`: the upstream is a real MCP server
over Streamable HTTP (http_upstream.py, built on the official Python SDK),
started by each test on a free loopback port. Its oversized results are
offloaded, audio is stored as the decoded bytes, and list-changed
notifications, cancellation and ping pass through in both directions."""

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import anyio
import pytest

import mcp.types as types
from conftest import BIN, HERE, connect, free_port, text_of
from http_upstream import wav

pytestmark = pytest.mark.anyio


class HttpUpstream:
    def __init__(self, log_dir, port=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = open(log_dir / "http-upstream.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "http_upstream.py"), str(self.port)],
            stdout=self.log, stderr=self.log,
        )
        deadline = time.time() + 30
        import socket
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, "the HTTP upstream exited at startup"
                time.sleep(0.05)
        raise RuntimeError("the HTTP upstream did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def upstream(tmp_path):
    u = HttpUpstream(tmp_path)
    yield u
    u.stop()


def via_url(server, url, *extra, **callbacks):
    args = ["--token", server.token, "mcp", "proxy", "--server", server.addr, "--upstream-url", url, *extra]
    return connect(BIN, args, **callbacks)


def offloaded(result, part=None):
    """The handles of a replacement result (from its `_meta`, where the
    proxy puts them whatever the tool's outputSchema), of one part or all."""
    meta = result.meta or {}
    return [h["payload_id"] for h in meta.get("spillway/offloaded", {}).get("offloaded", [])
            if part is None or h["part"] == part]


async def record(c):
    return json.loads(text_of(await c.call_tool("record", {})))


async def test_an_oversized_http_upstream_result_is_offloaded_and_answered_from_the_payload(server, upstream):
    async with via_url(server, upstream.url) as c:
        small = await c.call_tool("lines", {"n": 3, "tag": "s"})
        assert text_of(small) == "s 0 alpha beta gamma delta\ns 1 alpha beta gamma delta\ns 2 alpha beta gamma delta"
        assert offloaded(small) == []
        r = await c.call_tool("lines", {"n": 60000, "tag": "row"})
        assert not r.is_error, text_of(r)[:500]
        assert len(text_of(r)) < 20_000
        assert "spillway_inspect" in text_of(r)
        assert any(getattr(b, "type", "") == "resource_link" for b in r.content)
        # MCPServer sends a str result as text and as structuredContent
        # {"result": ...}: both parts are offloaded.
        assert len(offloaded(r)) == 2
        ids = offloaded(r, "text")
        assert len(ids) == 1
        full = "\n".join(f"row {i} alpha beta gamma delta" for i in range(60000))
        assert int(server.cli("stat", ids[0])["sizeBytes"]) == len(full.encode())
        found = await c.call_tool("spillway_search", {"pattern": "row 43210 alpha", "payload_ids": ids, "fixed_string": True})
        assert [m["line_number"] for m in found.structured_content["matches"]] == [43211]


async def test_an_audio_block_is_stored_as_its_decoded_bytes_and_a_small_one_passes_unchanged(server, upstream, tmp_path):
    async with via_url(server, upstream.url) as c:
        tiny = await c.call_tool("audio", {"kb": 1})
        blocks = [b for b in tiny.content if getattr(b, "type", "") == "audio"]
        assert len(blocks) == 1 and blocks[0].mime_type == "audio/wav"
        assert base64.b64decode(blocks[0].data) == wav(1)
        assert offloaded(tiny) == []

        r = await c.call_tool("audio", {"kb": 400})
        clip = wav(400)
        assert f"clip sha256={hashlib.sha256(clip).hexdigest()}" in text_of(r), "the small text part stays inline"
        assert not [b for b in r.content if getattr(b, "type", "") == "audio"], "the large clip is replaced by a notice"
        links = [b for b in r.content if getattr(b, "type", "") == "resource_link"]
        assert len(links) == 1 and links[0].mime_type == "audio/wav"
        ids = offloaded(r)
        assert len(ids) == 1
        stat = server.cli("stat", ids[0])
        assert stat["contentType"] == "audio/wav" and int(stat["sizeBytes"]) == len(clip)
        out = tmp_path / "clip.wav"
        subprocess.run([BIN, "--addr", server.addr, "--token", server.token, "download", ids[0], "-o", str(out)], check=True)
        assert out.read_bytes() == clip


async def test_a_tools_list_changed_reaches_the_client_and_the_proxy_rereads_the_tools(server, upstream):
    seen = []

    async def on_message(m):
        seen.append(m)

    async with via_url(server, upstream.url, "--per-call-tokens", "2000", message_handler=on_message) as c:
        before = {t.name for t in (await c.list_tools()).tools}
        assert "report" not in before
        await c.call_tool("add_report_tool", {})
        with anyio.fail_after(10):
            while not any(isinstance(m, types.ToolListChangedNotification) for m in seen):
                await anyio.sleep(0.05)
        # Called before any new tools/list: only the proxy's own re-read
        # tells it that `report` declares an outputSchema with no room for
        # extra keys, so its inline structuredContent must stay untouched.
        r = await c.call_tool("report", {"n": 3000})
        assert not r.is_error, text_of(r)[:500]
        assert r.structured_content == {"count": 3000}
        assert len(offloaded(r)) == 1, "the large text is offloaded"
        tools = {t.name: t for t in (await c.list_tools()).tools}
        schema = tools["report"].output_schema
        assert schema["anyOf"][0]["additionalProperties"] is False


async def test_prompt_and_resource_list_changes_reach_the_client_and_the_new_items_are_relayed(server, upstream):
    seen = []

    async def on_message(m):
        seen.append(type(m))

    async with via_url(server, upstream.url, message_handler=on_message) as c:
        await c.call_tool("add_prompt_and_resource", {})
        with anyio.fail_after(10):
            while not {types.PromptListChangedNotification, types.ResourceListChangedNotification} <= set(seen):
                await anyio.sleep(0.05)
        assert "later" in {p.name for p in (await c.list_prompts()).prompts}
        got = await c.get_prompt("later", {})
        assert "the later prompt" in got.messages[0].content.text
        assert "test://later" in {str(r.uri) for r in (await c.list_resources()).resources}
        body = await c.read_resource("test://later")
        assert body.contents[0].text == "the later resource"


async def test_a_call_the_client_cancels_is_cancelled_upstream(server, upstream):
    async with via_url(server, upstream.url) as c:
        with anyio.move_on_after(2):
            await c.call_tool("slow", {"seconds": 120})
            pytest.fail("the slow call returned")
        with anyio.fail_after(15):
            while True:
                rec = await record(c)
                if rec["cancelled"]:
                    break
                await anyio.sleep(0.1)
        assert rec["slow_started"] == 1 and len(rec["cancelled"]) == 1, rec
        assert text_of(await c.call_tool("lines", {"n": 1, "tag": "after"})) == "after 0 alpha beta gamma delta"


async def test_a_client_ping_is_relayed_to_the_upstream(server, upstream):
    async with via_url(server, upstream.url) as c:
        before = (await record(c))["pings"]
        await c.send_ping()
        await c.send_ping()
        assert (await record(c))["pings"] == before + 2


async def test_a_ping_while_the_upstream_is_stopped_fails_with_the_hang_error_and_the_next_call_reconnects(server, upstream):
    async with via_url(server, upstream.url, "--call-timeout", "2") as c:
        await c.send_ping()
        upstream.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(Exception) as err:
                with anyio.fail_after(30):
                    await c.send_ping()
            assert "did not answer within 2 s (hang" in str(err.value), err.value
        finally:
            upstream.proc.send_signal(signal.SIGCONT)
        with anyio.fail_after(30):
            r = await c.call_tool("lines", {"n": 1, "tag": "back"})
        assert text_of(r) == "back 0 alpha beta gamma delta"


async def test_an_http_upstream_that_dies_mid_session_gives_a_clear_error_and_the_next_call_reconnects(server, upstream, tmp_path):
    async with via_url(server, upstream.url, "--call-timeout", "10") as c:
        assert text_of(await c.call_tool("lines", {"n": 1, "tag": "one"})) == "one 0 alpha beta gamma delta"
        upstream.proc.kill()
        upstream.proc.wait()
        r = await c.call_tool("lines", {"n": 1, "tag": "two"})
        assert r.is_error
        assert upstream.url in text_of(r) and "retry" in text_of(r), text_of(r)
        again = HttpUpstream(tmp_path, upstream.port)
        try:
            r = await c.call_tool("lines", {"n": 1, "tag": "three"})
            assert text_of(r) == "three 0 alpha beta gamma delta", text_of(r)
        finally:
            again.stop()


async def test_the_proxy_over_streamable_http_relays_an_http_upstream_with_one_session_per_client(server, upstream, tmp_path):
    """Both hops over Streamable HTTP: `spillway mcp proxy --listen` in front
    of the HTTP upstream, two clients of the official SDK at once."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    log = open(tmp_path / "proxy.log", "ab")
    p = subprocess.Popen(
        [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, "--listen", f"127.0.0.1:{port}",
         "--upstream-url", upstream.url],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        import socket
        with anyio.fail_after(60):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert p.poll() is None, "the proxy exited at startup"
                    await anyio.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        seen = []

        async def on_message(m):
            seen.append(type(m))

        async with streamable_http_client(url) as (r1, w1, *_), streamable_http_client(url) as (r2, w2, *_):
            async with ClientSession(r1, w1, message_handler=on_message) as a, ClientSession(r2, w2) as b:
                await a.initialize()
                await b.initialize()
                big = await a.call_tool("lines", {"n": 60000, "tag": "h"})
                assert len(text_of(big)) < 20_000 and offloaded(big, "text")
                small = await b.call_tool("lines", {"n": 2, "tag": "b"})
                assert offloaded(small) == []
                sa = (await a.call_tool("spillway_list", {})).structured_content
                sb = (await b.call_tool("spillway_list", {})).structured_content
                # One Spillway session per client connection: b's is empty.
                assert {x["payload_id"] for x in sa["payloads"]} == set(offloaded(big))
                assert sb["payloads"] == []
                pings = json.loads(text_of(await a.call_tool("record", {})))["pings"]
                await a.send_ping()
                assert json.loads(text_of(await a.call_tool("record", {})))["pings"] == pings + 1
                await a.call_tool("add_report_tool", {})
                with anyio.fail_after(10):
                    while types.ToolListChangedNotification not in seen:
                        await anyio.sleep(0.05)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


async def test_an_upstream_ping_is_answered_by_the_client_behind_the_proxy(server, upstream):
    """A raw JSON-RPC client, so the test sees the ping request arrive."""
    p = subprocess.Popen(
        [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, "--upstream-url", upstream.url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )

    def send(obj):
        p.stdin.write(json.dumps(obj).encode() + b"\n")
        p.stdin.flush()

    def recv():
        line = p.stdout.readline()
        assert line, "the proxy closed its stdout"
        return json.loads(line)

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert recv()["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ping_client", "arguments": {}}})
        pings = 0
        while True:
            msg = recv()
            if msg.get("method") == "ping":
                pings += 1
                send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            elif msg.get("id") == 2:
                break
        assert pings == 1
        assert msg["result"]["content"][0]["text"] == "client answered the ping", msg
    finally:
        p.kill()
        p.wait()


async def test_a_2026_07_28_client_gets_complete_results_and_list_changes_on_its_subscription(server, upstream):
    """The SDK's high-level Client negotiates 2026-07-28 with the proxy (no
    initialize; every result needs `resultType`; list changes travel only on
    subscriptions/listen), while the proxy reaches the upstream on 2025-11-25."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=BIN, args=[
        "--token", server.token, "mcp", "proxy", "--server", server.addr, "--upstream-url", upstream.url],
        env={**os.environ, "RUST_LOG": "warn"})
    async with Client(params) as c:
        assert c.session.protocol_version == "2026-07-28"
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"lines", "spillway_exec"} <= names
        big = await c.call_tool("lines", {"n": 60000, "tag": "m"})
        assert len(text_of(big)) < 20_000 and offloaded(big, "text")
        async with c.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed
            await c.call_tool("add_report_tool", {})
            with anyio.fail_after(10):
                async for event in sub:
                    assert type(event).__name__ == "ToolsListChanged"
                    break
        assert "report" in {t.name for t in (await c.list_tools()).tools}
