"""`spillway mcp serve`: Spillway's tools and payload resources over MCP."""

import json

import pytest

from conftest import BIN, serve, text_of

pytestmark = pytest.mark.anyio

NDJSON = "".join(json.dumps({"id": i, "user": f"user{i % 7}", "ok": i % 3 == 0}) + "\n" for i in range(3000))


@pytest.fixture(scope="module")
def seeded(server, tmp_path_factory):
    s = server.cli("session", "create", "--label", "mcp-serve-test")
    f = tmp_path_factory.mktemp("seed") / "events.ndjson"
    f.write_text(NDJSON)
    p = server.cli("upload", "--session", s["id"], str(f), "--content-type", "application/x-ndjson")
    return s["id"], p["id"]


async def test_serve_lists_six_tools_with_input_and_output_schemas(server, seeded):
    session, _ = seeded
    async with serve(server, "--session", session) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == {"spillway_list", "spillway_inspect", "spillway_search", "spillway_read", "spillway_exec", "spillway_recall"}
        for t in tools.values():
            assert t.input_schema["type"] == "object"
            assert t.output_schema and t.output_schema["type"] == "object"
            assert len(t.description) > 80, t.name
        assert tools["spillway_exec"].input_schema["properties"]["runtime"]["enum"] == ["jq", "javascript", "python"]


async def test_tools_answer_from_the_stored_payload(server, seeded):
    session, pid = seeded
    async with serve(server, "--session", session) as c:
        listed = await c.call_tool("spillway_list", {})
        assert pid in [p["payload_id"] for p in listed.structured_content["payloads"]]

        ins = await c.call_tool("spillway_inspect", {"payload_id": pid})
        assert not ins.is_error
        assert ins.structured_content["line_count"] == 3000

        found = await c.call_tool("spillway_search", {"pattern": '"id": 2999,', "payload_ids": [pid]})
        m = found.structured_content["matches"]
        assert len(m) == 1 and m[0]["line_number"] == 3000

        read = await c.call_tool("spillway_read", {"payload_id": pid, "start_line": 10, "end_line": 11})
        assert read.structured_content["text"] == "".join(NDJSON.splitlines(True)[9:11])

        ex = await c.call_tool("spillway_exec", {"runtime": "jq", "script": 'select(.user == "user3") | .id', "payload_ids": [pid], "args": ["-c"]})
        assert not ex.is_error, text_of(ex)
        got = [int(x) for x in ex.structured_content["stdout"].split()]
        assert got == [i for i in range(3000) if i % 7 == 3]


async def test_a_refusal_is_an_error_result_with_the_status_message(server, seeded):
    session, _ = seeded
    async with serve(server, "--session", session) as c:
        r = await c.call_tool("spillway_inspect", {"payload_id": "pl_00000000000000000000000000000000"})
        assert r.is_error
        assert "NotFound" in text_of(r), text_of(r)
        bad = await c.call_tool("spillway_exec", {"runtime": "cobol", "script": "x"})
        assert bad.is_error and "jq, javascript or python" in text_of(bad)
        # The connection is still usable.
        assert not (await c.call_tool("spillway_list", {})).is_error


async def test_payloads_are_resources_with_bounded_reads(server, seeded):
    session, pid = seeded
    async with serve(server, "--session", session) as c:
        res = await c.list_resources()
        uris = [str(r.uri) for r in res.resources]
        assert f"spillway://payloads/{pid}" in uris
        body = await c.read_resource(f"spillway://payloads/{pid}")
        assert body.contents[0].text == NDJSON


async def test_each_connection_gets_its_own_session_labelled_from_client_info(server):
    async with serve(server) as c:
        r = await c.call_tool("spillway_list", {})
        sid = r.content[0].text.split("session ")[1].split()[0]
    sessions = server.cli("session", "ls")["sessions"]
    mine = [s for s in sessions if s["id"] == sid]
    assert mine and mine[0]["label"].startswith("mcp: ")
    # Closed when the client went away.
    assert mine[0]["state"] == "SESSION_STATE_CLOSED", mine[0]
