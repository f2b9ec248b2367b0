"""An agent on the Python SDK `mcp` 2.3.0 `Client` (default mode: it picks
MCP 2026-07-28 when the server offers it) against the HTTP gateway: lists
the tools, calls one, reads a workspace file. Prints one line per step;
tests/http_gateway.rs checks them. Usage: agent.py URL TOKEN FILE_ID"""
import asyncio
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, token: str, file_id: str) -> None:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http)) as client:
        print("protocol", client.protocol_version)
        tools = await client.list_tools()
        print("tools", " ".join(sorted(t.name for t in tools.tools)))
        result = await client.call_tool("demo__echo", {"text": "from mcp 2.3.0"})
        print("call", result.content[0].text)
        read = await client.read_resource(f"files://{file_id}")
        print("read", read.contents[0].text)


asyncio.run(main(*sys.argv[1:4]))
