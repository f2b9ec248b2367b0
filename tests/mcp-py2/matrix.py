"""An agent on the Python SDK `mcp` 2.3.0 `Client` for the asker matrix
(tests/rounds_matrix.rs): calls `greet` and `ponder` on each named bundle
through the daemon's gateway, answering elicitation with the name "Ada"
and sampling with "forty-two from python".

MODE is the client's `mode`: `legacy` (the 2025-11-25 initialize
handshake) or `auto` (2026-07-28 when the gateway offers it). The gateway
is the HTTP one (`http URL TOKEN`) or `bundlevisor mcp` over stdio
(`stdio BUNDLEVISOR SOCKET`: the binary is run with `--socket SOCKET mcp`).

Prints `protocol VERSION`, then `BUNDLE TOOL TEXT` for each call, or
`BUNDLE TOOL error: MESSAGE` when a call fails; one line each, flushed.

Usage: matrix.py MODE http URL TOKEN BUNDLE...
       matrix.py MODE stdio BUNDLEVISOR SOCKET BUNDLE..."""
import asyncio
import sys

import httpx2
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def say(*words: str) -> None:
    print(*words, flush=True)


def one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


async def elicitation(context, params):
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def sampling(context, params):
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="forty-two from python"),
        model="py-model-3",
    )


def transport(kind: str, first: str, second: str):
    if kind == "http":
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {second}"})
        return streamable_http_client(first, http_client=http)
    if kind == "stdio":
        return stdio_client(StdioServerParameters(command=first, args=["--socket", second, "mcp"]))
    raise SystemExit(f"unknown gateway {kind!r}: http or stdio")


async def main(mode: str, kind: str, first: str, second: str, *bundles: str) -> None:
    async with Client(
        transport(kind, first, second),
        mode=mode,
        elicitation_callback=elicitation,
        sampling_callback=sampling,
    ) as client:
        say("protocol", client.protocol_version)
        for bundle in bundles:
            for tool, arguments in (("greet", {}), ("ponder", {"question": "six times seven?"})):
                try:
                    result = await client.call_tool(f"{bundle}__{tool}", arguments)
                    text = " ".join(c.text for c in result.content if c.type == "text")
                    say(bundle, tool, f"error: {text}" if result.is_error else text)
                except Exception as error:  # noqa: BLE001 - the matrix reports every failure
                    say(bundle, tool, "error:", one_line(error))


asyncio.run(main(*sys.argv[1:]))
