"""A deliberately faulty MCP server over stdio, for the proxy's fault tests.

It speaks raw JSON-RPC lines so that it can misbehave in ways a real SDK
would not let it: each tool is one fault.
"""

import json
import os
import sys
import time

COLLIDE = os.environ.get("FAKE_COLLIDE") == "1"

TOOLS = [
    {"name": "small", "description": "a tiny result", "inputSchema": {"type": "object"}},
    {"name": "garbage", "description": "answers with a frame that is not JSON", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "exits mid-call", "inputSchema": {"type": "object"}},
    {"name": "hang", "description": "never answers", "inputSchema": {"type": "object"}},
    {"name": "bulk", "description": "a large text, a 3 MiB image and large structuredContent", "inputSchema": {"type": "object", "properties": {"mb": {"type": "integer"}}}},
    {"name": "huge", "description": "a result of SIZE_MB megabytes", "inputSchema": {"type": "object", "properties": {"mb": {"type": "integer"}}}},
    {
        "name": "rows",
        "description": "structured rows with an outputSchema",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "outputSchema": {
            "type": "object",
            "properties": {"rows": {"type": "array", "items": {"type": "object"}}},
            "required": ["rows"],
            "additionalProperties": False,
        },
    },
    {"name": "failure", "description": "a large isError result", "inputSchema": {"type": "object"}},
    {
        "name": "words",
        "description": "N lines of words, tagged with TAG",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"type": "string"}, "delay_ms": {"type": "integer"}}},
    },
    {"name": "picture", "description": "a large PNG-typed image block", "inputSchema": {"type": "object"}},
]
if COLLIDE:
    TOOLS.append({"name": "spillway_read", "description": "collides", "inputSchema": {"type": "object"}})

out = sys.stdout.buffer


def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def result(id_, res):
    send({"jsonrpc": "2.0", "id": id_, "result": res})


for raw in sys.stdin.buffer:
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    method = msg.get("method")
    id_ = msg.get("id")
    if id_ is None:
        continue
    if method == "initialize":
        result(id_, {
            "protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake-upstream", "version": "1.0"},
        })
    elif method == "tools/list":
        result(id_, {"tools": TOOLS})
    elif method == "ping":
        result(id_, {})
    elif method == "tools/call":
        name = msg["params"]["name"]
        args = msg["params"].get("arguments") or {}
        if name == "small":
            result(id_, {"content": [{"type": "text", "text": "small answer"}]})
        elif name == "garbage":
            out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(id_).encode() + b',"result":{this is not json\n')
            out.flush()
        elif name == "crash":
            os._exit(3)
        elif name == "hang":
            time.sleep(3600)
        elif name == "huge":
            mb = int(args.get("mb", 300))
            # The TypeScript SDK's field order: the id comes last.
            chunk = b"x" * (1 << 20)
            out.write(b'{"result":{"content":[{"type":"text","text":"')
            for _ in range(mb):
                out.write(chunk)
            out.write(b'"}]},"jsonrpc":"2.0","id":' + json.dumps(id_).encode() + b"}\n")
            out.flush()
        elif name == "rows":
            n = int(args.get("n", 10))
            rows = [{"id": i, "name": f"row-{i}", "pad": "p" * 40} for i in range(n)]
            result(id_, {
                "content": [{"type": "text", "text": json.dumps({"rows": rows})}],
                "structuredContent": {"rows": rows},
            })
        elif name == "failure":
            lines = [f"Traceback line {i}: frame {i} of a very deep failure" for i in range(20000)]
            lines.append("END-OF-ERROR-7f3a: the last line of the error")
            result(id_, {"content": [{"type": "text", "text": "\n".join(lines)}], "isError": True})
        elif name == "words":
            n, tag = int(args.get("n", 10)), str(args.get("tag", "w"))
            time.sleep(int(args.get("delay_ms", 0)) / 1000)
            text = "\n".join(f"{tag} line {i} alpha beta gamma" for i in range(n))
            result(id_, {"content": [{"type": "text", "text": text}]})
        elif name == "bulk":
            import base64
            import bulk
            result(id_, {
                "content": [
                    {"type": "text", "text": bulk.text(int(args.get("mb", 64)))},
                    {"type": "image", "data": base64.b64encode(bulk.picture()).decode(), "mimeType": "image/png"},
                ],
                "structuredContent": bulk.rows(),
            })
        elif name == "picture":
            import base64
            data = bytes(range(256)) * 800  # 200 KiB of binary
            result(id_, {"content": [
                {"type": "text", "text": "here is the picture"},
                {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": "image/png"},
            ]})
        else:
            send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32602, "message": f"unknown tool {name}"}})
    else:
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": f"no method {method}"}})
