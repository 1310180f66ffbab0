"""Every ergonomic method of the sync client, against the real server."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import spillway
from conftest import ADMIN, AUDREY, CAROL, Server

BIG = json.dumps([{"id": i, "user": {"login": f"user{i}"}, "state": "open" if i % 3 else "closed"} for i in range(4000)])


def test_connection_settings_come_from_arguments_then_environment(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLWAY_ADDR", server.addr)
    monkeypatch.setenv("SPILLWAY_TOKEN", "tok-alice")
    with spillway.Client() as c:
        assert c.settings.endpoint == f"http://{server.addr}"
        with c.session(label="env") as s:
            assert s.info.owner == "alice"
    # An argument wins over the environment.
    with spillway.Client(token="tok-bob") as c, c.session() as s:
        assert s.info.owner == "bob"


def test_dev_token_discovery_mirrors_the_cli(dev_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPILLWAY_ADDR", dev_server.addr)
    monkeypatch.setenv("SPILLWAY_DATA_DIR", str(dev_server.data_dir))
    with spillway.Client() as c, c.session(label="dev") as s:
        assert (s.info.owner, s.info.tenant) == ("dev", "dev")
    # Without SPILLWAY_DATA_DIR: ./spillway-data, as the CLI.
    monkeypatch.delenv("SPILLWAY_DATA_DIR")
    (tmp_path / "spillway-data").mkdir()
    (tmp_path / "spillway-data" / "dev-token").write_text((dev_server.data_dir / "dev-token").read_text())
    monkeypatch.chdir(tmp_path)
    with spillway.Client() as c:
        assert c.settings.token.startswith("spw_dev_")
        assert c.runtimes()
    (tmp_path / "spillway-data" / "dev-token").unlink()
    with pytest.raises(spillway.ConfigError, match="no token: pass token= or set SPILLWAY_TOKEN"):
        spillway.Client()


def test_tls_settings_are_checked_as_the_cli_checks_them(tmp_path: Path) -> None:
    with pytest.raises(spillway.ConfigError, match="is a TLS address"):
        spillway.Client("https://127.0.0.1:1", token="t")
    with pytest.raises(spillway.ConfigError, match="plaintext"):
        spillway.Client("http://127.0.0.1:1", token="t", ca=tmp_path / "ca.pem")
    with pytest.raises(spillway.ConfigError, match="cert and key go together"):
        spillway.Client("127.0.0.1:1", token="t", ca=tmp_path / "ca.pem", cert=tmp_path / "c.pem")
    c = spillway.Client("127.0.0.1:1", token="t", ca=tmp_path / "ca.pem") if False else None
    assert c is None


def test_a_session_is_a_context_manager_that_closes_on_exit(client: spillway.Client) -> None:
    with client.session(label="cm", labels={"team": "infra"}) as s:
        assert s.info.state == "open"
        assert s.info.labels == {"team": "infra"}
        sid = s.id
    assert client.get_session(sid).info.state == "closed"
    assert any(x.id == sid for x in client.sessions(state="closed"))


def test_offload_returns_outcomes_in_order_with_text_offloaded_and_payload_id(session: spillway.Session) -> None:
    outcomes = session.offload(
        [("call_small", "get_user", '{"login": "octocat"}'), spillway.ToolResult("call_big", "list_prs", BIG)]
    )
    small, big = outcomes
    assert (small.call_id, small.offloaded, small.payload_id) == ("call_small", False, None)
    assert small.text == '{"login": "octocat"}'
    assert (big.call_id, big.offloaded) == ("call_big", True)
    assert big.payload_id is not None and big.payload_id.startswith("pl_")
    assert big.payload_id in big.text and len(big.text) < len(BIG) // 10
    assert big.reason in ("per_call", "aggregate")
    stored = session.client.stat(big.payload_id)
    assert stored.size_bytes == len(BIG) and stored.tool_name == "list_prs"


def test_inspect_search_read_and_exec_reach_into_a_payload(session: spillway.Session) -> None:
    (big,) = session.offload([("c1", "list_prs", BIG)])
    assert big.payload_id
    st = session.inspect(big.payload_id)
    assert st.detected_type == "json" and st.record_count == 4000
    assert any(f.path == "user.login" for f in st.fields)
    hits = session.search("user3999", fixed_string=True)
    assert len(hits.matches) == 1 and hits.matches[0].payload_id == big.payload_id
    part = session.read(big.payload_id, byte_range=(0, 40))
    assert part.data == BIG.encode()[:40] and part.total_bytes == len(BIG) and not part.eof
    r = session.exec("jq", '[.[] | select(.state == "closed")] | length', inputs=[big.payload_id])
    assert r.ok and r.status == "ok" and r.stdout.strip() == str(len(range(0, 4000, 3)))
    assert r.stderr == "" and r.message.startswith("jq script finished")


def test_read_lines_and_a_4_mib_read_fit_the_client(session: spillway.Session) -> None:
    text = "".join(f"line {i}\n" for i in range(1, 800_001))
    p = session.upload(text.encode(), name="lines.txt")
    r = session.read(p.id, lines=(2, 3))
    assert r.text == "line 2\nline 3\n" and (r.first_line, r.last_line) == (2, 3)
    # The documented 4 MiB maximum: the reply, framing included, stays within
    # grpcio's default 4 MiB receive limit, so its data is 4 MiB less 256 bytes.
    r = session.read(p.id, byte_range=(0, 4 << 20), max_bytes=4 << 20)
    assert len(r.data) == (4 << 20) - 256 and r.end_offset == len(r.data) and not r.eof


def test_upload_streams_paths_bytes_and_iterables_with_progress(session: spillway.Session, tmp_path: Path) -> None:
    f = tmp_path / "report.csv"
    f.write_bytes(b"a,b\n" + b"1,2\n" * 600_000)
    seen: list[tuple[int, int | None]] = []
    p = session.upload(f, content_type="text/csv", progress=lambda sent, total: seen.append((sent, total)))
    assert p.name == "report.csv" and p.size_bytes == f.stat().st_size
    assert seen[-1] == (f.stat().st_size, f.stat().st_size) and len(seen) == 3
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    p2 = session.upload(iter([b"x" * 10, b"y" * 5]), name="it.txt")
    assert p2.size_bytes == 15
    p3 = session.upload(b"hello", name="b.txt", sha256=spillway._requests.hashlib.sha256(b"hello").hexdigest())
    assert p3.sha256 == spillway._requests.hashlib.sha256(b"hello").hexdigest()
    assert {x.id for x in session.payloads()} >= {p.id, p2.id, p3.id}


def test_download_streams_into_a_file(session: spillway.Session, tmp_path: Path) -> None:
    data = bytes(range(256)) * 20_000
    p = session.upload(data, name="bin.dat")
    out = tmp_path / "copy.dat"
    assert session.download(p.id, to=out) == len(data)
    assert out.read_bytes() == data
    assert b"".join(session.download_chunks(p.id)) == data


def test_recall_returns_what_compaction_archived(session: spillway.Session) -> None:
    big = "\n".join(f"func f{i}() {{ return {i} }}" for i in range(3000))
    history = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "done"},
    ]
    result = session.compact(history, "openai")
    compacted = result.history[2]["content"]
    assert "<<ccr:" in compacted and len(compacted) < len(big)
    assert len(result.compact["archived_keys"]) == 1
    key = compacted.split("<<ccr:")[1][:16]
    assert session.recall(key).content == big
    assert session.recall(f"<<ccr:{key}>>").content == big


def test_repair_answers_a_missing_result_in_the_history_format(client: spillway.Client) -> None:
    history = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
        {"role": "user", "content": "next"},
    ]
    r = client.repair(history, "anthropic")
    assert r.repair["synthetic_results_injected"] == 1
    assert r.history[2]["content"][0]["type"] == "tool_result"
    assert r.history[2]["content"][0]["tool_use_id"] == "t1"


def test_runtimes_close_and_delete_with_a_receipt(client: spillway.Client) -> None:
    names = {r.name for r in client.runtimes()}
    assert {"jq", "javascript", "python"} <= names
    s = client.session(label="to-delete")
    p = s.upload(b"secret", name="s.txt")
    assert s.close().state == "closed"
    receipt = s.delete(reason="test")
    assert receipt.target_id == s.id and p.id in receipt.deleted_payload_ids and receipt.signature
    with pytest.raises(spillway.NotFound):
        client.stat(p.id)


def test_delete_payload_returns_its_receipt(session: spillway.Session) -> None:
    p = session.upload(b"x" * 100, name="gone.txt")
    receipt = session.client.delete_payload(p.id, reason="cleanup")
    assert receipt.deleted_payload_ids == (p.id,) and receipt.bytes_deleted == 100
    # Embedded mode: no replicas to confirm a purge.
    assert receipt.purge_confirmed_at is None and receipt.purge_replicas == 0


def test_policy_and_audit_for_compliance_work(server: Server) -> None:
    with server.client(ADMIN) as admin:
        policy = admin.policy.set("acme", spillway.Policy(retention=dt.timedelta(days=3), redact=("builtin:email",)))
        assert policy.retention == dt.timedelta(days=3)
        assert admin.policy.get(tenant="acme").redact == ("builtin:email",)
        with admin.session(label="held") as s:
            assert admin.policy.get(session_id=s.id).retention == dt.timedelta(days=3)
            # Redaction applies to what is stored.
            (o,) = s.offload([("c", "t", "mail a@b.io")])
            assert o.text == "mail [REDACTED:email]" and o.redactions == {"email": 1}
        admin.policy.set("acme", spillway.Policy())
    with server.client(CAROL) as carol:
        assert carol.policy.hold(s.id, reason="litigation").legal_hold
        with pytest.raises(spillway.LegalHold, match="under legal hold"):
            carol.delete_session(s.id)
        assert not carol.policy.release(s.id).legal_hold
        receipt = carol.delete_session(s.id, reason="done")
    with server.client(AUDREY) as audrey:
        events = list(audrey.audit.query(session_id=s.id))
        assert {"session.create", "hold.set", "session.delete"} <= {e.action for e in events}
        assert all(e.session_id == s.id for e in events)
        v = audrey.audit.verify()
        assert v.ok and v.events_checked > 0
        exported = list(audrey.audit.export())
        # The chain links, and its head at verification is in the export.
        assert all(b.prev_hash == a.hash for a, b in zip(exported, exported[1:]))
        assert exported[v.head_seq - 1].hash == v.head_hash
        assert audrey.audit.receipt(receipt_id=receipt.id).target_id == s.id
