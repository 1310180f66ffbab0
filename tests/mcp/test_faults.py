"""Bad input and faults: the client always gets a clear error, and the
proxy, the server and the stored payloads stay intact."""

import asyncio
import contextlib
import signal
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import BIN, connect, fake_upstream, handles, proxy, text_of

pytestmark = pytest.mark.anyio


async def test_an_upstream_tool_named_like_ours_is_refused_at_startup(server):
    r = subprocess.run(
        [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, "--", *fake_upstream()],
        env={**os.environ, "FAKE_COLLIDE": "1"}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0
    assert 'tool named "spillway_read"' in r.stderr, r.stderr
    assert "rename it upstream" in r.stderr


async def test_a_malformed_upstream_frame_is_an_error_result_and_the_proxy_keeps_serving(server):
    async with proxy(server, fake_upstream()) as c:
        r = await c.call_tool("garbage", {})
        assert r.is_error and "malformed" in text_of(r), text_of(r)
        ok = await c.call_tool("small", {})
        assert text_of(ok) == "small answer"


async def test_an_upstream_killed_mid_call_is_reported_and_restarted_on_the_next_call(server):
    async with proxy(server, fake_upstream()) as c:
        r = await c.call_tool("crash", {})
        assert r.is_error and "crash" in text_of(r) and "restarts it" in text_of(r), text_of(r)
        ok = await c.call_tool("small", {})
        assert text_of(ok) == "small answer"


async def test_an_upstream_that_never_answers_times_out_with_a_hang_error(server):
    async with proxy(server, fake_upstream(), "--call-timeout", "2") as c:
        t = time.monotonic()
        r = await c.call_tool("hang", {})
        assert time.monotonic() - t < 20
        assert r.is_error and "hang" in text_of(r) and "--call-timeout" in text_of(r), text_of(r)
        ok = await c.call_tool("small", {})
        assert text_of(ok) == "small answer"


async def test_a_300_mb_result_over_the_cap_names_the_limit_and_stores_nothing(server):
    async with proxy(server, fake_upstream(), "--call-timeout", "120") as c:
        before = (await c.call_tool("spillway_list", {})).structured_content["payloads"]
        r = await c.call_tool("huge", {"mb": 300})
        assert r.is_error
        assert "--max-message-bytes" in text_of(r) and "268435456" in text_of(r), text_of(r)
        after = (await c.call_tool("spillway_list", {})).structured_content["payloads"]
        assert after == before
        assert text_of(await c.call_tool("small", {})) == "small answer"
    assert server.alive()


async def test_malformed_client_frames_are_refused_or_ignored_and_the_proxy_keeps_serving(server):
    """Well-formed JSON that is not a JSON-RPC message gets an Invalid Request
    error; bytes that are not JSON at all carry no id to answer, and are
    ignored, as the official SDKs do (answering them invites error storms)."""
    p = subprocess.Popen(
        [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, "--", *fake_upstream()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    def send(obj):
        p.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n")
        p.stdin.flush()
    def recv():
        return json.loads(p.stdout.readline())
    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert recv()["result"]["serverInfo"]
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send('{"jsonrpc": "2.0", "id": 5, "method": 42}')
        err = recv()
        assert err["error"]["code"] == -32600, err
        send("{this is not json")
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "small", "arguments": {}}})
        ok = recv()
        assert ok["id"] == 2 and ok["result"]["content"][0]["text"] == "small answer", ok
    finally:
        p.kill()
        p.wait()


async def test_structured_content_with_an_output_schema_stays_valid_when_offloaded(server):
    async with proxy(server, fake_upstream()) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        schema = tools["rows"].output_schema
        assert schema["type"] == "object" and len(schema["anyOf"]) == 2
        # The SDK validates structuredContent against the relayed schema.
        r = await c.call_tool("rows", {"n": 2000})
        assert not r.is_error
        ids = handles(r)
        assert len(ids) == 2, r.structured_content  # text and structuredContent
        assert any(getattr(b, "type", "") == "resource_link" for b in r.content)
        assert "spillway_inspect" in text_of(r)
        ex = await c.call_tool("spillway_exec", {"runtime": "jq", "script": ".rows | length", "payload_ids": [ids[1]]})
        assert ex.structured_content["stdout"].strip() == "2000"
        small = await c.call_tool("rows", {"n": 3})
        assert small.structured_content == {"rows": [{"id": i, "name": f"row-{i}", "pad": "p" * 40} for i in range(3)]}


async def test_a_binary_image_block_is_stored_as_bytes(server):
    async with proxy(server, fake_upstream()) as c:
        r = await c.call_tool("picture", {})
        ids = handles(r)
        assert len(ids) == 1
        assert "here is the picture" in text_of(r)
        stat = server.cli("stat", ids[0])
        assert int(stat["sizeBytes"]) == 256 * 800
        assert stat["contentType"] == "image/png"


async def test_two_proxies_started_at_once_share_one_embedded_server(tmp_path):
    data = tmp_path / "xdg"
    env = {**os.environ, "XDG_DATA_HOME": str(data), "RUST_LOG": "warn",
           "SPILLWAY_SANDBOX__IMAGES_DIR": os.environ.get("SPILLWAY_SANDBOX__IMAGES_DIR", "")}
    env.pop("SPILLWAY_ADDR", None)
    if not env["SPILLWAY_SANDBOX__IMAGES_DIR"]:
        env.pop("SPILLWAY_SANDBOX__IMAGES_DIR")

    async def one():
        async with connect(BIN, ["mcp", "proxy", "--", *fake_upstream()], env=env) as c:
            r = await c.call_tool("small", {})
            assert text_of(r) == "small answer"
            listed = await c.call_tool("spillway_list", {})
            assert not listed.is_error, text_of(listed)

    d = data / "spillway"
    pids = []
    try:
        await asyncio.gather(one(), one(), one())
        addr = (d / "mcp-server.addr").read_text().strip()
        assert addr.startswith("127.0.0.1:")
        # Exactly one server process serves that data directory.
        ps = subprocess.run(["pgrep", "-f", f"serve --data-dir {d} "], capture_output=True, text=True)
        pids = [int(p) for p in ps.stdout.split()]
        assert len(pids) == 1, ps.stdout
        # A later proxy finds it again instead of starting another.
        await one()
        ps = subprocess.run(["pgrep", "-f", f"serve --data-dir {d} "], capture_output=True, text=True)
        assert [int(p) for p in ps.stdout.split()] == pids
    finally:
        # Stop the server this test started, by its pid.
        ps = subprocess.run(["pgrep", "-f", f"serve --data-dir {d} "], capture_output=True, text=True)
        for pid in {int(p) for p in ps.stdout.split()} | set(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _proxy_pids(server):
    """This test process's `spillway` children other than the server."""
    me, pids = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == me and comm == "spillway" and int(d) != server.proc.pid:
            pids.append(int(d))
    return pids


def _hwm_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_large_result_passes_in_bounded_memory_and_every_part_is_stored_whole(server):
    import hashlib

    import bulk

    mb = 96
    async with proxy(server, fake_upstream()) as c:
        (pid,) = _proxy_pids(server)
        await c.call_tool("small", {})
        before = _hwm_mib(pid)
        r = await c.call_tool("bulk", {"mb": mb})
        peak = _hwm_mib(pid)
        assert not r.is_error, text_of(r)
        ids = handles(r)
        assert len(ids) == 3, r.structured_content  # text, structuredContent, image
        # The proxy never held the result: not even one copy of the text.
        assert peak - before < mb / 2, f"proxy VmHWM {before:.0f} -> {peak:.0f} MiB for a {mb} MB result"
        want_text = bulk.text(mb).encode()
        want_rows = bulk.rows()
        want_picture = bulk.picture()
        parts = {h["part"]: server.cli("stat", h["payload_id"]) for h in r.structured_content["spillway"]["offloaded"]}
        assert set(parts) == {"text", "structuredContent", "content[1]"}, parts.keys()
        stat = parts["text"]
        assert int(stat["sizeBytes"]) == len(want_text)
        assert stat["sha256"] == hashlib.sha256(want_text).hexdigest()
        png = parts["content[1]"]
        assert png["contentType"] == "image/png"
        assert int(png["sizeBytes"]) == len(want_picture), "the image is stored decoded"
        assert png["sha256"] == hashlib.sha256(want_picture).hexdigest()
        ex = await c.call_tool("spillway_exec", {"runtime": "jq", "script": "(.rows | length), .rows[-1].note", "payload_ids": [parts["structuredContent"]["id"]]})
        assert not ex.is_error and ex.structured_content.get("status") in (None, "ok", "OK", "EXEC_STATUS_OK"), ex
        assert ex.structured_content["stdout"].split("\n")[:2] == [str(len(want_rows["rows"])), json.dumps("x\"}]")]
