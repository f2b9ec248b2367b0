#!/usr/bin/env bash
# Install the pinned MCP servers whose tool lists make up tools.json.
# Each server gets its own prefix/venv under $SEARCH_SERVERS_DIR
# (default: <repo>/target/search-servers) so their dependency trees don't mix.
# Needs node >= 18 with npm, and python3 >= 3.10 with venv.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${SEARCH_SERVERS_DIR:-$HERE/../../target/search-servers}"
PY="${PYTHON:-/usr/bin/python3}"
mkdir -p "$DIR/npm" "$DIR/py"
# Nothing here needs a browser binary: tools/list works without one.
export PUPPETEER_SKIP_DOWNLOAD=1 PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

npm_pkg() { # short package@version [extra pins...]
  local short="$1"; shift
  mkdir -p "$DIR/npm/$short"
  npm install --no-audit --no-fund --prefix "$DIR/npm/$short" "$@"
}
npm_pkg filesystem          @modelcontextprotocol/server-filesystem@2026.8.31
npm_pkg memory              @modelcontextprotocol/server-memory@2026.8.31
npm_pkg everything          @modelcontextprotocol/server-everything@2026.8.31
npm_pkg sequential-thinking @modelcontextprotocol/server-sequential-thinking@2026.8.31
npm_pkg github              @modelcontextprotocol/server-github@2025.4.8
# server-gitlab imports zod without depending on it; today npm hoists zod 4 (via
# zod-to-json-schema's peer range), which makes every inputSchema empty. Pin the
# zod 3 its SDK (1.0.1) uses, as when the package was published.
npm_pkg gitlab              @modelcontextprotocol/server-gitlab@2025.4.25 zod@3.25.76
npm_pkg slack               @modelcontextprotocol/server-slack@2025.4.25
npm_pkg brave-search        @modelcontextprotocol/server-brave-search@0.6.2
npm_pkg google-maps         @modelcontextprotocol/server-google-maps@0.6.2
npm_pkg puppeteer           @modelcontextprotocol/server-puppeteer@2025.5.12
npm_pkg postgres            @modelcontextprotocol/server-postgres@0.6.2
npm_pkg redis               @modelcontextprotocol/server-redis@2025.4.25
npm_pkg everart             @modelcontextprotocol/server-everart@0.6.2
npm_pkg desktop-commander   @wonderwhy-er/desktop-commander@0.2.52
npm_pkg playwright          @playwright/mcp@0.0.83
npm_pkg kubernetes          mcp-server-kubernetes@4.1.7
npm_pkg notion              @notionhq/notion-mcp-server@2.5.2

py_pkg() { # short pkg==version [extra pins...]
  local short="$1"; shift
  mkdir -p "$DIR/py/$short"
  [ -x "$DIR/py/$short/.venv/bin/pip" ] || "$PY" -m venv "$DIR/py/$short/.venv"
  "$DIR/py/$short/.venv/bin/pip" install -q "$@"
}
py_pkg time   mcp-server-time==2026.10.19
py_pkg fetch  mcp-server-fetch==2026.10.24
py_pkg git    mcp-server-git==2026.10.19
# mcp-server-sqlite 2025.4.25 uses Server.list_resources(), removed in mcp 2.x.
py_pkg sqlite mcp-server-sqlite==2025.4.25 mcp==1.30.0
echo "installed into $DIR"
