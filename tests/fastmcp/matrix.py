"""An agent on fastmcp 4.1.6's `Client` (default mode "auto": MCP
2026-07-28 when the gateway offers it) for the asker matrix
(tests/rounds_matrix.rs): calls `greet` and `ponder` on each named bundle
through the daemon's HTTP gateway, answering elicitation with the name
"Fern" and sampling with "forty-two from fastmcp".

Prints `protocol VERSION`, then `BUNDLE TOOL TEXT` for each call, or
`BUNDLE TOOL error: MESSAGE` when a call fails; one line each, flushed.

Usage: matrix.py URL TOKEN BUNDLE..."""
import asyncio
import sys

from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult


def say(*words: str) -> None:
    print(*words, flush=True)


def one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


async def sampling(messages, params, context):
    return "forty-two from fastmcp"


async def elicitation(message, response_type, params, context):
    return ElicitResult(action="accept", content={"name": "Fern"})


async def main(url: str, token: str, *bundles: str) -> None:
    client = Client(url, auth=token, sampling_handler=sampling, elicitation_handler=elicitation)
    async with client:
        say("protocol", client.protocol_version)
        for bundle in bundles:
            for tool, arguments in (("greet", {}), ("ponder", {"question": "six times seven?"})):
                try:
                    result = await client.call_tool(f"{bundle}__{tool}", arguments)
                    say(bundle, tool, " ".join(c.text for c in result.content if c.type == "text"))
                except Exception as error:  # noqa: BLE001 - the matrix reports every failure
                    say(bundle, tool, "error:", one_line(error))


asyncio.run(main(*sys.argv[1:]))
