"""The real `@modelcontextprotocol/server-everything` behind the proxy:
every capability passes through (tools, resources, prompts, completions,
progress, logging, sampling, elicitation)."""

import asyncio

import pytest

import mcp.types as types
from conftest import NODE_BIN, proxy, text_of

pytestmark = pytest.mark.anyio

EVERYTHING = [str(NODE_BIN / "mcp-server-everything")]


def names(items):
    return {i.name for i in items}


async def test_tools_are_relayed_with_ours_added(server):
    async with proxy(server, EVERYTHING) as c:
        tools = names((await c.list_tools()).tools)
        assert "echo" in tools and "spillway_exec" in tools
        r = await c.call_tool("echo", {"message": "hello through spillway"})
        assert "hello through spillway" in text_of(r)


async def test_resources_prompts_and_completions_are_relayed(server):
    async with proxy(server, EVERYTHING) as c:
        res = await c.list_resources()
        assert res.resources, "upstream resources missing"
        first = res.resources[0]
        body = await c.read_resource(str(first.uri))
        assert body.contents
        templates = await c.list_resource_templates()
        assert any("spillway://payloads/" in t.uri_template for t in templates.resource_templates)
        prompts = (await c.list_prompts()).prompts
        assert prompts
        simple = [p for p in prompts if not p.arguments] or prompts
        got = await c.get_prompt(simple[0].name, {})
        assert got.messages


async def test_progress_and_logging_notifications_reach_the_client(server):
    seen = []
    logs = []

    async def on_log(params):
        logs.append(params)

    async with proxy(server, EVERYTHING, logging_callback=on_log) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        name = next(n for n in tools if "long" in n.lower() or "progress" in n.lower())

        async def progress(p, total, message):
            seen.append(p)

        props = tools[name].input_schema.get("properties", {})
        args = {k: v for k, v in {"duration": 1, "steps": 3}.items() if k in props}
        r = await c.call_tool(name, args, progress_callback=progress)
        assert not r.is_error, text_of(r)
        assert len(seen) >= 2, seen
        await c.set_logging_level("debug")
        await c.call_tool("toggle-simulated-logging", {})
        # server-everything logs every 5 seconds once toggled.
        for _ in range(120):
            if logs:
                break
            await asyncio.sleep(0.1)
        assert logs, "no logging notification relayed"


async def test_roots_requests_and_small_images_pass_through_unchanged(server):
    asked = []

    async def roots(ctx):
        asked.append(True)
        return types.ListRootsResult(roots=[types.Root(uri="file:///spillway-test-root", name="test root")])

    async with proxy(server, EVERYTHING, list_roots_callback=roots) as c:
        r = await c.call_tool("get-roots-list", {})
        assert asked, "the roots/list request did not reach the client"
        assert "spillway-test-root" in text_of(r)
        img = await c.call_tool("get-tiny-image", {})
        images = [b for b in img.content if getattr(b, "type", "") == "image"]
        assert images and images[0].data, "a small image must stay inline"
        assert not (img.structured_content or {}).get("spillway")


async def test_sampling_requests_go_to_the_client(server):
    asked = []

    async def sampling(ctx, params):
        asked.append(params)
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="sampled answer 42"), model="test-model")

    async with proxy(server, EVERYTHING, sampling_callback=sampling) as c:
        tools = {t.name for t in (await c.list_tools()).tools}
        name = next(n for n in tools if "sampl" in n.lower())
        r = await c.call_tool(name, {"prompt": "say 42", "maxTokens": 10})
        assert asked, "the sampling request did not reach the client"
        assert "sampled answer 42" in text_of(r)


async def test_elicitation_requests_go_to_the_client(server):
    asked = []

    async def elicit(ctx, params):
        asked.append(params)
        return types.ElicitResult(action="decline")

    async with proxy(server, EVERYTHING, elicitation_callback=elicit) as c:
        tools = {t.name for t in (await c.list_tools()).tools}
        name = next(n for n in tools if "elicit" in n.lower())
        r = await c.call_tool(name, {})
        assert asked, "the elicitation request did not reach the client"
        assert "decline" in text_of(r).lower() or r.content
