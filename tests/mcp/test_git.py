"""The real `mcp-server-git` (PyPI) over a generated repository of 5 000
commits: git_log is offloaded, and a question about an author is answered
with spillway_search, checked against git itself."""

import subprocess

import pytest

from conftest import VENV_BIN, handles, proxy, text_of

pytestmark = pytest.mark.anyio

AUTHORS = [f"Author {i}" for i in range(40)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("gitrepo")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    # fast-import builds 5 000 commits in well under a second.
    lines = []
    for i in range(5000):
        a = AUTHORS[(i * 7) % len(AUTHORS)]
        email = a.lower().replace(" ", ".") + "@example.org"
        msg = f"change {i}: touch file {i % 50}\n"
        data = f"content {i}\n"
        lines.append("commit refs/heads/main")
        lines.append(f"author {a} <{email}> {1700000000 + i * 60} +0000")
        lines.append(f"committer {a} <{email}> {1700000000 + i * 60} +0000")
        lines.append(f"data {len(msg.encode())}")
        lines.append(msg.rstrip("\n"))
        if i > 0:
            pass
        lines.append(f"M 644 inline f{i % 50}.txt")
        lines.append(f"data {len(data.encode())}")
        lines.append(data.rstrip("\n"))
        lines.append("")
    stream = "\n".join(lines) + "\n"
    subprocess.run(["git", "-C", str(root), "fast-import", "--quiet"], input=stream.encode(), check=True)
    subprocess.run(["git", "-C", str(root), "checkout", "-q", "main"], check=True)
    count = int(subprocess.check_output(["git", "-C", str(root), "rev-list", "--count", "HEAD"]).strip())
    assert count == 5000
    return root


async def test_git_log_of_5000_commits_is_offloaded_and_an_author_is_found_by_search(server, repo):
    async with proxy(server, [str(VENV_BIN / "mcp-server-git"), "--repository", str(repo)]) as c:
        r = await c.call_tool("git_log", {"repo_path": str(repo), "max_count": 5000})
        assert not r.is_error, text_of(r)[:400]
        assert len(text_of(r)) < 20_000
        pid = handles(r)[0]
        who = "Author 13"
        truth = int(subprocess.check_output(
            ["git", "-C", str(repo), "rev-list", "--count", f"--author={who} <", "HEAD"]).strip())
        # mcp-server-git writes one "Author: <name>" line per commit.
        found = await c.call_tool("spillway_search", {
            "pattern": f"^Author: {who}$", "payload_ids": [pid], "max_matches": 10000})
        assert not found.is_error, text_of(found)
        assert len(found.structured_content["matches"]) == truth > 0
