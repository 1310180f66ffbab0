"""MCP proxy benches, printed as Markdown (`make mcp-bench`, part of `make bench`):

- a small tools/call through `spillway mcp proxy` against the same call made
  directly to the upstream (median over many calls, ratio and difference),
  for a stdio upstream and for a Streamable HTTP one (`--upstream-url`, the
  official Python SDK's server in tests/mcp/http_upstream.py);
- a 50 MB result through the proxy against direct;
- the proxy's peak RSS (VmHWM) while a 200 MB result passes through;
- for the filesystem scenario (a 20 MB NDJSON file read with
  @modelcontextprotocol/server-filesystem), the tokens (chars / 4) that reach
  the client through the proxy, including the follow-up spillway_exec, against
  direct, with the answer checked.
"""

import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_harness import BIN, NODE_BIN, ROOT, Server, free_port, wait_port  # noqa: E402

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

FAKE = [sys.executable, str(ROOT / "tests" / "mcp" / "fake_upstream.py")]


@contextlib.asynccontextmanager
async def connect(cmd):
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ, RUST_LOG="warn"))
    with open(os.devnull, "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                yield s


@contextlib.asynccontextmanager
async def connect_http(url):
    async with streamable_http_client(url) as (r, w, *_):
        async with ClientSession(r, w) as s:
            await s.initialize()
            yield s


@contextlib.contextmanager
def http_upstream():
    import subprocess
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "mcp" / "http_upstream.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, "the HTTP upstream")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def via_proxy(server, upstream, *extra):
    return [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, *extra, "--", *upstream]


def via_proxy_url(server, url, *extra):
    return [BIN, "--token", server.token, "mcp", "proxy", "--server", server.addr, *extra, "--upstream-url", url]


def text(r):
    return "".join(c.text for c in r.content if getattr(c, "type", "") == "text")


async def timed(session, name, args, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await session.call_tool(name, args)
        out.append(time.perf_counter() - t)
    return out


def children_named(name):
    me = os.getpid()
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == me and comm == name:
            pids.append(int(p.name))
    return pids


def hwm_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def main():
    server = Server()
    rows = []
    try:
        # 1. Small call latency.
        n = 300
        async with connect(FAKE) as d:
            await timed(d, "small", {}, 20)
            direct = await timed(d, "small", {}, n)
        async with connect(via_proxy(server, FAKE)) as p:
            await timed(p, "small", {}, 20)
            proxied = await timed(p, "small", {}, n)
        md, mp = statistics.median(direct) * 1e3, statistics.median(proxied) * 1e3
        rows.append(("small tools/call, stdio upstream, median of 300", f"{mp:.3f} ms", f"{md:.3f} ms",
                     f"{mp / md:.2f}x, +{mp - md:.3f} ms", "within 1 ms or at most 1.1x"))

        # 1b. The same over a Streamable HTTP upstream: the direct client
        # speaks HTTP to it; through the proxy, the client speaks stdio to
        # the proxy and the proxy HTTP to the upstream.
        with http_upstream() as url:
            args = {"n": 1, "tag": "small"}
            async with connect_http(url) as d:
                await timed(d, "lines", args, 20)
                direct = await timed(d, "lines", args, n)
            async with connect(via_proxy_url(server, url)) as p:
                await timed(p, "lines", args, 20)
                proxied = await timed(p, "lines", args, n)
        md, mp = statistics.median(direct) * 1e3, statistics.median(proxied) * 1e3
        rows.append(("small tools/call, Streamable HTTP upstream (--upstream-url), median of 300", f"{mp:.3f} ms", f"{md:.3f} ms",
                     f"{mp / md:.2f}x, {mp - md:+.3f} ms", "within 1 ms or at most 1.1x"))

        # 2. 50 MB result.
        async with connect(FAKE) as d:
            t = time.perf_counter()
            r = await d.call_tool("huge", {"mb": 50})
            td = time.perf_counter() - t
            assert len(text(r)) == 50 << 20
        async with connect(via_proxy(server, FAKE)) as p:
            t = time.perf_counter()
            r = await p.call_tool("huge", {"mb": 50})
            tp = time.perf_counter() - t
            assert r.structured_content["spillway"]["offloaded"]
        rows.append(("50 MB result (proxy stores it, client gets a notice)", f"{tp:.2f} s", f"{td:.2f} s", f"{tp / td:.2f}x", ""))

        # 3. Peak RSS of the proxy for a 200 MB result.
        # Our children named spillway are the server and the proxy; the
        # server's own figure is reported beside the proxy's, not mixed in.
        async with connect(via_proxy(server, FAKE)) as p:
            pids = [x for x in children_named("spillway") if x != server.proc.pid]
            assert len(pids) == 1, f"expected one proxy process, found {pids}"
            proxy = pids[0]
            await p.call_tool("small", {})
            base = hwm_kib(proxy)
            server_base = hwm_kib(server.proc.pid)
            r = await p.call_tool("huge", {"mb": 200})
            assert r.structured_content["spillway"]["offloaded"]
            peak = hwm_kib(proxy)
            server_peak = hwm_kib(server.proc.pid)
        rows.append(("proxy peak RSS (VmHWM), 200 MB result", f"{peak / 1024:.0f} MiB", "",
                     f"{peak / 1024 / 200:.2f}x the result (idle {base / 1024:.0f} MiB; "
                     f"the server's peak {server_peak / 1024:.0f} MiB, {server_base / 1024:.0f} MiB before)", "bounded"))

        # 4. Tokens reaching the client, filesystem scenario.
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            rng = random.Random(15)
            recs, size, lines = [], 0, []
            while size < 20_000_000:
                rec = {"id": len(recs), "region": rng.choice(["eu", "us", "apac"]), "amount": rng.randrange(1000), "note": "x" * rng.randrange(20, 80)}
                recs.append(rec)
                s = json.dumps(rec)
                lines.append(s)
                size += len(s) + 1
            f = root / "events.ndjson"
            f.write_text("\n".join(lines) + "\n")
            truth = sum(1 for x in recs if x["region"] == "eu" and x["amount"] >= 990)
            fs = [str(NODE_BIN / "mcp-server-filesystem"), str(root)]
            async with connect(fs) as d:
                r = await d.call_tool("read_text_file", {"path": str(f)})
                direct_chars = len(json.dumps(r.model_dump(by_alias=True, exclude_none=True)))
            async with connect(via_proxy(server, fs)) as p:
                r = await p.call_tool("read_text_file", {"path": str(f)})
                pid = r.structured_content["spillway"]["offloaded"][0]["payload_id"]
                ex = await p.call_tool("spillway_exec", {"runtime": "jq", "script": 'select(.region == "eu" and .amount >= 990) | .id', "payload_ids": [pid], "args": ["-c"]})
                answer = len(ex.structured_content["stdout"].split())
                proxy_chars = len(json.dumps(r.model_dump(by_alias=True, exclude_none=True))) + len(json.dumps(ex.model_dump(by_alias=True, exclude_none=True)))
            assert answer == truth, (answer, truth)
        dt, pt = direct_chars / 4, proxy_chars / 4
        rows.append(("tokens reaching the client, 20 MB NDJSON read + jq answer (chars/4 of the JSON results)",
                     f"{pt:,.0f}", f"{dt:,.0f}", f"{(1 - pt / dt) * 100:.2f}% fewer (answer correct: {answer} records)", "at least 98% fewer"))
    finally:
        server.stop()
    print("# MCP proxy benchmarks\n")
    load = os.getloadavg()
    print(f"Measured with `make mcp-bench` ({os.environ.get('MCP_BENCH_BUILD', 'release')} binary, `spillway mcp proxy` in front of a stdio upstream unless said otherwise; the client is the official Python SDK). {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n")
    print(f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min) when the run ended. The client, the proxy, the upstream and the Spillway server share these CPUs, so small-call figures move by tens of percent from run to run on a busy machine; compare the ratio, not the absolute times.\n")
    print("| what | through the proxy | direct | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    asyncio.run(main())
