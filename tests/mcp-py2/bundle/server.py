"""A bundle on the Python SDK `mcp` 2.3.0 `MCPServer`, which speaks MCP
2026-07-28 and 2025-11-25: `greet` elicits a name and `ponder` samples the
client's model, `both` asks for both in one round, `chatty` logs, `note`
adds a line to the resource test://notes and announces the change (on
2026-07-28 only on `subscriptions/listen` streams), `hang_up` ends every
listen stream gracefully (as a server that restarts its streams would),
through the SDK's resolvers (on 2026-07-28 they answer
`input_required` and resume on the retry; on 2025-11-25 they send a request
mid-call). tests/rounds.rs runs it as a bundle (the daemon is its client)."""
from typing import Annotated

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.server.mcpserver.resolve import Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel

server = MCPServer("py-asker")


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("what is your name?", Name)


def ask_model(question: str) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text=question))],
        max_tokens=50,
    )


@server.tool()
async def greet(name: Annotated[Name, Resolve(ask_name)], ctx: Context) -> str:
    """Ask the client for a name (elicitation), then greet it."""
    return f"hello {name.name} (on {ctx.protocol_version})"


@server.tool()
async def ponder(question: str, reply: Annotated[CreateMessageResult, Resolve(ask_model)], ctx: Context) -> str:
    """Ask the client's model the question (sampling), then answer with its reply."""
    return f"the model said {reply.content.text} (on {ctx.protocol_version})"


@server.tool()
async def both(
    question: str,
    name: Annotated[Name, Resolve(ask_name)],
    reply: Annotated[CreateMessageResult, Resolve(ask_model)],
) -> str:
    """Ask for a name and the client's model at once (one round of two input requests)."""
    return f"hello {name.name}; the model said {reply.content.text}"


@server.tool()
async def chatty(ctx: Context) -> str:
    """Log a message at info (on 2026-07-28 only when the request asks for logs), then answer."""
    await ctx.log("info", "chatty: a log message")
    return f"said it (on {ctx.protocol_version})"


notes: list[str] = []


@server.resource("test://notes")
def read_notes() -> str:
    """The lines written with `note`."""
    return "\n".join(notes)


@server.tool()
async def note(text: str, ctx: Context) -> str:
    """Add a line to test://notes, then tell whoever follows it."""
    notes.append(text)
    await ctx.notify_resource_updated("test://notes")
    return f"{len(notes)} notes"


@server.tool()
async def hang_up() -> str:
    """End every subscriptions/listen stream (the SDK's graceful closure)."""
    import gc

    from mcp.server.subscriptions import ListenHandler

    handlers = [o for o in gc.get_objects() if isinstance(o, ListenHandler)]
    for handler in handlers:
        handler.close()
    return f"closed the streams of {len(handlers)} handler(s)"


if __name__ == "__main__":
    server.run("stdio")
