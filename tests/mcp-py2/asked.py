"""An agent on the Python SDK `mcp` 2.3.0 `Client` (MCP 2026-07-28), with
elicitation and sampling callbacks and log messages opted in, against the
HTTP gateway: the demo bundle (on 2025-11-25) asks while serving its call,
the gateway hands its request to the agent as `input_required`, the SDK
answers and retries, and the call ends with its real result. Prints one
line per step; tests/rounds.rs checks them.

With MODE (`legacy`: a 2025-11-25 session; `auto`: 2026-07-28) it calls
the py-asker bundle (tests/mcp-py2/bundle, on 2026-07-28) instead: its
`input_required` reaches the agent through the gateway either way.

Usage: asked.py URL TOKEN [MODE]"""
import asyncio
import sys

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

asked = []
logs = []


async def elicitation(context, params):
    asked.append(params.message)
    content = {"name": "Grace"} if "name" in params.message else {"ok": True}
    return types.ElicitResult(action="accept", content=content)


async def sampling(context, params):
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="forty-two from python"),
        model="py-model-3",
    )


async def logged(params):
    logs.append(str(params.data))


async def main(url: str, token: str) -> None:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    async with Client(
        streamable_http_client(url, http_client=http),
        elicitation_callback=elicitation,
        sampling_callback=sampling,
        logging_callback=logged,
        log_level="info",
    ) as client:
        print("protocol", client.protocol_version)
        result = await client.call_tool("demo__confirm", {"times": 2})
        print("confirm", result.content[0].text)
        print("asked", " | ".join(asked))
        prompt = await client.get_prompt("demo__ask", {"question": "six times seven?"})
        print("prompt", prompt.messages[0].content.text)
        print("logs", " | ".join(logs))


async def py_asker(url: str, token: str, mode: str) -> None:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    async with Client(
        streamable_http_client(url, http_client=http),
        mode=mode,
        elicitation_callback=elicitation,
        sampling_callback=sampling,
    ) as client:
        print("protocol", client.protocol_version)
        result = await client.call_tool("py-asker__greet", {})
        print("greet", result.content[0].text)
        result = await client.call_tool("py-asker__ponder", {"question": "six times seven?"})
        print("ponder", result.content[0].text)
        print("asked", " | ".join(asked))


if len(sys.argv) > 3:
    asyncio.run(py_asker(*sys.argv[1:4]))
else:
    asyncio.run(main(*sys.argv[1:3]))
