"""The real `@modelcontextprotocol/server-filesystem` behind the proxy: a
20 MB NDJSON file and a 20 000-entry directory tree are offloaded, then
questions about them are answered with spillway_exec (jq) and
spillway_search, checked against the truth computed here."""

import json
import random

import pytest

from conftest import NODE_BIN, handles, proxy, text_of

pytestmark = pytest.mark.anyio

REGIONS = ["eu", "us", "apac", "latam"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdata")
    rng = random.Random(15)
    records = []
    lines = []
    size = 0
    i = 0
    while size < 20_000_000:
        r = {"id": i, "user": f"user{rng.randrange(5000)}", "region": rng.choice(REGIONS),
             "amount": rng.randrange(1000), "note": "x" * rng.randrange(20, 80)}
        line = json.dumps(r)
        lines.append(line)
        records.append(r)
        size += len(line) + 1
        i += 1
    (root / "events.ndjson").write_text("\n".join(lines) + "\n")
    tree = root / "tree"
    n = 0
    for d in range(200):
        sub = tree / f"dir{d:03}"
        sub.mkdir(parents=True)
        n += 1
        for f in range(99):
            ext = "log" if (d * 99 + f) % 13 == 0 else "txt"
            (sub / f"file{f:02}.{ext}").touch()
            n += 1
    assert n == 20_000
    return root, records


def fs_server(root):
    return [str(NODE_BIN / "mcp-server-filesystem"), str(root)]


async def test_a_20_mb_ndjson_read_is_offloaded_and_answered_with_jq_and_search(server, data):
    root, records = data
    async with proxy(server, fs_server(root)) as c:
        r = await c.call_tool("read_text_file", {"path": str(root / "events.ndjson")})
        assert not r.is_error, text_of(r)[:500]
        text = text_of(r)
        assert len(text) < 20_000, len(text)
        assert "spillway_inspect" in text and '"payload_id"' in text
        ids = handles(r)
        assert ids
        pid = ids[0]
        truth = sum(1 for x in records if x["region"] == "eu" and x["amount"] >= 990)
        ex = await c.call_tool("spillway_exec", {
            "runtime": "jq", "script": 'select(.region == "eu" and .amount >= 990) | .id',
            "payload_ids": [pid], "args": ["-c"]})
        assert not ex.is_error, text_of(ex)
        assert len(ex.structured_content["stdout"].split()) == truth
        target = records[len(records) // 2]
        found = await c.call_tool("spillway_search", {"pattern": f'"id": {target["id"]},', "payload_ids": [pid], "fixed_string": True})
        m = found.structured_content["matches"]
        assert len(m) == 1 and json.loads(m[0]["line"]) == target
        assert m[0]["line_number"] == target["id"] + 1


async def test_a_directory_tree_of_20000_entries_is_offloaded_and_counted_with_jq(server, data):
    root, _ = data
    async with proxy(server, fs_server(root)) as c:
        r = await c.call_tool("directory_tree", {"path": str(root / "tree")})
        assert not r.is_error, text_of(r)[:500]
        assert len(text_of(r)) < 20_000
        pid = handles(r)[0]
        ex = await c.call_tool("spillway_exec", {
            "runtime": "jq",
            "script": '[.. | objects | select(.type == "file" and (.name | endswith(".log")))] | length',
            "payload_ids": [pid]})
        assert not ex.is_error, text_of(ex)
        truth = sum(1 for k in range(200 * 99) if k % 13 == 0)
        assert int(ex.structured_content["stdout"].strip()) == truth
        found = await c.call_tool("spillway_search", {"pattern": "dir137", "payload_ids": [pid], "fixed_string": True})
        assert found.structured_content["matches"], text_of(found)
