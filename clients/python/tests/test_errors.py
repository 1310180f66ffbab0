"""Each exception class, raised by the real condition that causes it, with
the server's message unchanged."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import spillway
from conftest import AUDREY, BOB, CAROL, Server, free_port, start_server

UNKNOWN_PAYLOAD = "pl_" + "0" * 32


def test_every_status_maps_to_its_own_class() -> None:
    # INTERNAL, UNKNOWN, ALREADY_EXISTS and ABORTED have no condition a test
    # can cause on this server; their mapping is checked here.
    seen = set()
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        e = spillway.errors.from_status(code, "words")
        assert e.code == code and str(e) == "words" and e.message == "words"
        seen.add(type(e))
    assert len(seen) == 16
    # tonic reports a client deadline it saw pass as CANCELLED "Timeout expired".
    late = spillway.errors.from_status(grpc.StatusCode.CANCELLED, "Timeout expired")
    assert isinstance(late, spillway.DeadlineExceeded) and late.message == "Timeout expired"


def test_invalid_argument_for_a_malformed_id(client: spillway.Client) -> None:
    with pytest.raises(spillway.InvalidArgument) as e:
        client.stat("pl_nope")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "pl_nope" in e.value.message


def test_not_found_for_an_unknown_payload_carries_the_server_message(client: spillway.Client) -> None:
    with pytest.raises(spillway.NotFound) as e:
        client.stat(UNKNOWN_PAYLOAD)
    assert str(e.value).startswith(f"payload {UNKNOWN_PAYLOAD} not found")


def test_not_found_for_another_principals_unshared_session(server: Server, session: spillway.Session) -> None:
    p = session.upload(b"mine", name="m.txt")
    with server.client(BOB) as bob, pytest.raises(spillway.NotFound):
        bob.read(p.id)


def test_permission_denied_outside_the_role(server: Server, session: spillway.Session) -> None:
    with pytest.raises(spillway.PermissionDenied) as e:
        session.client.policy.set("acme", spillway.Policy(retention=None))
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    with server.client(AUDREY) as audrey, pytest.raises(spillway.PermissionDenied):
        audrey.session(label="auditors do not create sessions")


def test_unauthenticated_with_an_unknown_token(server: Server) -> None:
    with server.client("tok-nobody") as c, pytest.raises(spillway.Unauthenticated):
        c.runtimes()


def test_quota_exceeded_names_the_limit_and_stores_nothing(client: spillway.Client) -> None:
    with client.session(policy=spillway.Policy(max_session_bytes=1000)) as s:
        s.upload(b"x" * 600, name="a.txt")
        with pytest.raises(spillway.QuotaExceeded) as e:
            s.upload(b"y" * 600, name="b.txt")
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.limit == "max_session_bytes"
        assert "Nothing was stored" in e.value.message
        assert [p.name for p in s.payloads()] == ["a.txt"]
    assert spillway.ResourceExhausted is spillway.QuotaExceeded


def test_session_closed_when_writing_to_a_closed_session(client: spillway.Client) -> None:
    s = client.session()
    s.close()
    with pytest.raises(spillway.SessionClosed) as e:
        s.offload([("c", "t", "x" * 10)])
    assert isinstance(e.value, spillway.FailedPrecondition) and "is closed and read-only" in str(e.value)
    with pytest.raises(spillway.SessionClosed):
        s.upload(b"late")


def test_legal_hold_blocks_a_deletion(server: Server, client: spillway.Client) -> None:
    s = client.session()
    with server.client(CAROL) as carol:
        carol.policy.hold(s.id, reason="audit")
        with pytest.raises(spillway.LegalHold) as e:
            carol.delete_session(s.id)
        assert isinstance(e.value, spillway.FailedPrecondition) and "SetLegalHold hold=false" in e.value.message
        carol.policy.release(s.id)


def test_out_of_range_past_the_end(session: spillway.Session) -> None:
    p = session.upload(b"0123456789", name="ten.txt")
    with pytest.raises(spillway.OutOfRange, match="past the end of the payload"):
        session.read(p.id, byte_range=(11, 1))


def test_deadline_exceeded_when_the_clients_deadline_passes(server: Server) -> None:
    # A script that runs for seconds (stopped by its own 3 s limit on the
    # server) against a client deadline of 50 ms.
    with server.client() as c, c.session() as s:
        c.timeout = 0.05
        with pytest.raises(spillway.DeadlineExceeded):
            s.exec("jq", "[range(0; 100000000)] | length", args=["-n"], limits=spillway.ExecLimits(timeout_ms=3000))
        c.timeout = None


def test_unavailable_when_nothing_listens() -> None:
    with spillway.Client(f"127.0.0.1:{free_port()}", token="t", timeout=5) as c, pytest.raises(spillway.Unavailable):
        c.runtimes()


def test_unimplemented_for_a_method_the_server_lacks(client: spillway.Client) -> None:
    call = client.channel.unary_unary("/spillway.v1.Payloads/NoSuchMethod")
    with pytest.raises(spillway.Unimplemented):
        spillway.client._call(call, b"")


def test_cancelled_when_a_download_is_cancelled(session: spillway.Session) -> None:
    p = session.upload(b"z" * (8 << 20), name="big.bin")
    stream = session.client.stubs.payloads.Download(spillway.v1.payloads_pb2.PayloadRequest(payload_id=p.id))
    chunks = spillway.client._stream(stream)
    next(chunks)
    stream.cancel()
    with pytest.raises(spillway.Cancelled):
        for _ in chunks:
            pass


def test_data_loss_when_a_payloads_bytes_are_gone(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        with server.client() as c:
            s = c.session()
            p = s.upload(b"precious bytes\n" * 100, name="precious.txt")
    finally:
        server.stop()
    files = [f for f in (tmp_path / "data").rglob("*") if f.is_file() and f.read_bytes() == b"precious bytes\n" * 100]
    assert len(files) == 1
    files[0].unlink()
    server = start_server(tmp_path)
    try:
        with server.client() as c, pytest.raises(spillway.DataLoss, match="missing from disk"):
            c.read(p.id)
    finally:
        server.stop()


def test_config_errors_are_spillway_errors_without_a_status() -> None:
    with pytest.raises(spillway.SpillwayError) as e:
        spillway.Client("https://127.0.0.1:1", token="t")
    assert e.value.code is None
