"""What the proxy does with results: large errors are kept whole, and calls
in flight together share the aggregate threshold, largest first."""

import asyncio

import pytest

from conftest import fake_upstream, handles, proxy, text_of

pytestmark = pytest.mark.anyio


async def test_a_large_error_result_is_offloaded_whole_and_stays_an_error(server):
    async with proxy(server, fake_upstream()) as c:
        r = await c.call_tool("failure", {})
        assert r.is_error, "the replacement must keep isError"
        ids = handles(r)
        assert len(ids) == 1, r.structured_content
        assert "spillway_inspect" in text_of(r)
        stat = server.cli("stat", ids[0])
        assert stat["isError"] is True
        full = "\n".join(
            [f"Traceback line {i}: frame {i} of a very deep failure" for i in range(20000)]
            + ["END-OF-ERROR-7f3a: the last line of the error"]
        )
        assert int(stat["sizeBytes"]) == len(full.encode())
        found = await c.call_tool("spillway_search", {"pattern": "END-OF-ERROR-7f3a", "payload_ids": ids})
        matches = found.structured_content["matches"]
        assert [m["line_number"] for m in matches] == [20001], matches


async def test_calls_in_flight_together_share_the_aggregate_threshold_largest_first(server):
    # About 2000 and 1200 tokens: each is under the per-call threshold,
    # together they are over the aggregate one.
    limits = ["--per-call-tokens", "2500", "--aggregate-tokens", "2800"]
    big = {"n": 250, "tag": "big"}
    small = {"n": 150, "tag": "small"}
    async with proxy(server, fake_upstream(), *limits) as c:
        for args in (big, small):
            alone = await c.call_tool("words", args)
            assert handles(alone) == [], "alone, each result stays inline"
        # The upstream answers each after 300 ms, so both calls are in
        # flight together and form one turn.
        rb, rs = await asyncio.gather(
            c.call_tool("words", {**big, "delay_ms": 300}),
            c.call_tool("words", {**small, "delay_ms": 300}),
        )
        assert len(handles(rb)) == 1, "the largest result of the turn is offloaded"
        assert handles(rs) == [], "the rest fits under the aggregate threshold and stays inline"
        assert "small line 149 alpha beta gamma" in text_of(rs)
        assert "combined limit of 2 800 tokens" in text_of(rb), text_of(rb)[:600]
