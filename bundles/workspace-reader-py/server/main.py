"""workspace-reader: a FastMCP bundle that reads its workspace's files
through bundlevisor with the published nimblebrain-bundle-sdk.

Each tool returns JSON text so that callers (and bundlevisor's tests) see
exactly what the SDK received, errors included.
"""

from __future__ import annotations

import json

from fastmcp import Context, FastMCP
from mcp.shared.exceptions import MCPError
from nimblebrain_bundle_sdk import host

mcp = FastMCP("workspace-reader")


def _error(e: MCPError) -> str:
    return json.dumps({"error": {"code": e.error.code, "message": e.error.message, "data": e.error.data}})


@mcp.tool
async def capability(ctx: Context) -> str:
    """What the host advertised: read/list availability and the files scheme."""
    h = host(ctx)
    return json.dumps({"read": h.available, "list": h.list_available, "files": h.supports_scheme("files")})


@mcp.tool
async def read_file(uri: str, ctx: Context) -> str:
    """Read a workspace file by URI (files://fl_...)."""
    try:
        result = await host(ctx).read(uri)
    except MCPError as e:
        return _error(e)
    content = result.contents[0]
    out = {"uri": str(content.uri), "mimeType": content.mimeType}
    if getattr(content, "text", None) is not None:
        out["text"] = content.text
    else:
        out["blob"] = content.blob
    return json.dumps(out)


@mcp.tool
async def list_files(ctx: Context, mime_type: str | None = None, tags: list[str] | None = None) -> str:
    """List workspace files, optionally filtered by MIME type and tags (AND)."""
    try:
        result = await host(ctx).list(mime_type=mime_type, tags=tags)
    except MCPError as e:
        return _error(e)
    return json.dumps(
        {"resources": [{"uri": str(r.uri), "name": r.name, "mimeType": r.mimeType, "size": r.size} for r in result.resources]}
    )


if __name__ == "__main__":
    mcp.run(show_banner=False)
