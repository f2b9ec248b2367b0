"""An agent on fastmcp 4.1.6's `Client` (default mode "auto": it probes
`server/discover` and takes MCP 2026-07-28 when the server offers it)
against the HTTP gateway, with sampling and elicitation handlers: lists the
tools, calls one, reads a workspace file, gets the demo's prompt (which
samples the client), calls the demo's confirm tool (which elicits twice),
then opens a `subscriptions/listen` stream for tool list changes and waits
(20 s at most) to hear one, which the test causes.

fastmcp has no listen call of its own: the stream is opened with the MCP
SDK's `mcp.client.subscriptions.listen` on fastmcp's session, and the
change reaches fastmcp's `MessageHandler.on_tool_list_changed`.

Prints one line per step, flushed; tests/agents_2026.rs reads them as they
come. Usage: agent.py URL TOKEN FILE_ID"""
import asyncio
import sys

from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.messages import MessageHandler
from mcp.client.subscriptions import listen

asked = []
tools_changed = asyncio.Event()


def say(*words: str) -> None:
    print(*words, flush=True)


async def sampling(messages, params, context):
    return "forty-two from fastmcp"


async def elicitation(message, response_type, params, context):
    asked.append(message)
    return ElicitResult(action="accept", content={"ok": True})


class Changes(MessageHandler):
    async def on_tool_list_changed(self, message):
        tools_changed.set()


async def main(url: str, token: str, file_id: str) -> None:
    client = Client(
        url,
        auth=token,
        sampling_handler=sampling,
        elicitation_handler=elicitation,
        message_handler=Changes(),
    )
    async with client:
        say("protocol", client.protocol_version)
        tools = await client.list_tools()
        say("tools", " ".join(sorted(t.name for t in tools)))
        called = await client.call_tool("demo__echo", {"text": "from fastmcp 4.1.6"})
        say("call", called.content[0].text)
        read = await client.read_resource(f"files://{file_id}")
        say("read", read[0].text)
        prompt = await client.get_prompt("demo__ask", {"question": "six times seven?"})
        say("prompt", prompt.messages[0].content.text)
        confirmed = await client.call_tool("demo__confirm", {"times": 2})
        say("confirm", confirmed.content[0].text)
        say("asked", " | ".join(asked))
        async with listen(client.session, tools_list_changed=True) as subscription:
            say("listening", "tools" if subscription.honored.tools_list_changed else "nothing")
            try:
                await asyncio.wait_for(tools_changed.wait(), 20)
            except TimeoutError:
                say("no notifications/tools/list_changed within 20 s")
                sys.exit(1)
            say("tools changed")
        after = await client.list_tools()
        say("tools after", " ".join(sorted(t.name for t in after)))


asyncio.run(main(*sys.argv[1:4]))
