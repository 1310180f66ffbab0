"""A 1 GiB streamed upload and download in bounded client memory, and the
async client under 50 concurrent calls."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import spillway
from conftest import ALICE, Server

GIB = 1 << 30
LINE = b"".join(b"%07d the quick brown fox jumps over the lazy dog\n" % i for i in range(1000))


def gib_of_lines() -> Iterator[bytes]:
    """1 GiB of text lines, made on the fly."""
    sent = 0
    while sent < GIB:
        piece = LINE[: GIB - sent]
        sent += len(piece)
        yield piece


class PeakRss:
    """Samples this process's RSS every 10 ms while running."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


def test_a_1_gib_upload_and_download_stream_in_bounded_client_memory(session: spillway.Session, tmp_path: Path) -> None:
    want = hashlib.sha256()
    for piece in gib_of_lines():
        want.update(piece)
    progress: list[int] = []
    with PeakRss() as up:
        p = session.upload(gib_of_lines(), name="gib.log", progress=lambda sent, total: progress.append(sent))
    assert p.size_bytes == GIB and p.sha256 == want.hexdigest()
    assert progress[-1] == GIB
    out = tmp_path / "gib.log"
    with PeakRss() as down:
        assert session.download(p.id, to=out) == GIB
    got = hashlib.sha256()
    with out.open("rb") as f:
        while chunk := f.read(1 << 20):
            got.update(chunk)
    out.unlink()
    assert got.hexdigest() == want.hexdigest()
    print(f"RSS growth: upload {up.growth / 2**20:.1f} MiB, download {down.growth / 2**20:.1f} MiB")
    assert up.growth < 64 << 20, f"upload grew RSS by {up.growth / 2**20:.1f} MiB"
    assert down.growth < 64 << 20, f"download grew RSS by {down.growth / 2**20:.1f} MiB"
    session.client.delete_payload(p.id)


def test_the_async_client_serves_50_concurrent_calls(server: Server) -> None:
    async def main() -> None:
        async with spillway.AsyncClient(server.addr, token=ALICE) as client:
            async with await client.session(label="async") as s:
                contents = [("%d " % i) * (2000 * (i % 5 + 1)) for i in range(50)]
                outcomes = await asyncio.gather(
                    *(s.offload([(f"call_{i}", "tool", c)]) for i, c in enumerate(contents))
                )
                assert [o[0].call_id for o in outcomes] == [f"call_{i}" for i in range(50)]
                offloaded = [o[0] for o in outcomes if o[0].offloaded]
                assert offloaded, "some results are over the threshold"
                # 50 concurrent reads of different kinds, all answered.
                tasks = []
                for i in range(50):
                    o = offloaded[i % len(offloaded)]
                    assert o.payload_id
                    if i % 3 == 0:
                        tasks.append(s.inspect(o.payload_id))
                    elif i % 3 == 1:
                        tasks.append(s.read(o.payload_id, byte_range=(0, 10)))
                    else:
                        tasks.append(s.search(o.call_id.split("_")[1] + " ", fixed_string=True, payload_ids=[o.payload_id]))
                results = await asyncio.gather(*tasks)
                assert len(results) == 50
                assert all(not isinstance(r, BaseException) for r in results)
                # Async errors are typed too.
                with pytest.raises(spillway.NotFound):
                    await client.stat("pl_" + "0" * 32)
                up = await s.upload(b"async bytes", name="a.txt")
                chunks = [c async for c in s.download_chunks(up.id)]
                assert b"".join(chunks) == b"async bytes"
                r = await s.exec("jq", "length", inputs=[up.id], args=["-R"])
                assert r.status == "ok"
            assert (await client.get_session(s.id)).info.state == "closed"

    asyncio.run(main())
