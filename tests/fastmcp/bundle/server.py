"""A bundle on fastmcp 4.1.6's `FastMCP` server: `greet` elicits a name and
`ponder` samples the client's model. On MCP 2026-07-28 a tool asks by
returning an `InputRequiredResult` and reads the answer from
`ctx.input_responses` when the client retries (fastmcp's guard pattern;
its `ctx.elicit()` refuses that revision); on 2025-11-25 it sends the
request mid-call. `greet` says which revision it served. Built into
target/fastmcp-asker-bundle by `make asker-bundles`; tests/rounds_matrix.rs
runs it as a bundle (the daemon is its client)."""
from fastmcp import Context, FastMCP
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

server = FastMCP("fastmcp-asker")

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def revision(ctx: Context) -> str:
    return ctx.request_context.protocol_version


def answer(ctx: Context, key: str):
    """The client's answer to the input request `key`, or None."""
    return (ctx.input_responses or {}).get(key)


@server.tool()
async def greet(ctx: Context) -> str | InputRequiredResult:
    """Ask the client for a name (elicitation), then greet it."""
    message = "what is your name?"
    if revision(ctx) in MODERN_PROTOCOL_VERSIONS:
        reply = answer(ctx, "name")
        if not isinstance(reply, ElicitResult):
            params = ElicitRequestFormParams(message=message, requested_schema=NAME_SCHEMA)
            return InputRequiredResult(input_requests={"name": ElicitRequest(params=params)})
    else:
        reply = await ctx.session.elicit(
            message=message, requested_schema=NAME_SCHEMA, related_request_id=ctx.request_id
        )
    if reply.action != "accept":
        return f"no name ({reply.action}) (on {revision(ctx)})"
    return f"hello {reply.content['name']} (on {revision(ctx)})"


@server.tool()
async def ponder(question: str, ctx: Context) -> str | InputRequiredResult:
    """Ask the client's model the question (sampling), then answer with its reply."""
    messages = [SamplingMessage(role="user", content=TextContent(type="text", text=question))]
    if revision(ctx) in MODERN_PROTOCOL_VERSIONS:
        reply = answer(ctx, "model")
        if not isinstance(reply, CreateMessageResult):
            params = CreateMessageRequestParams(messages=messages, max_tokens=50)
            return InputRequiredResult(input_requests={"model": CreateMessageRequest(params=params)})
    else:
        reply = await ctx.session.create_message(
            messages, max_tokens=50, related_request_id=ctx.request_id
        )
    return f"the model said {reply.content.text}"


if __name__ == "__main__":
    server.run("stdio", show_banner=False)
