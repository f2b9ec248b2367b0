"""A stdio MCP server of revision 2026-07-28 only that answers tools/call
with a task (SEP-2663, the `io.modelcontextprotocol/tasks` extension) when
the request declares the extension, and in full otherwise. Written on the
standard library alone from the specification, for tests/tasks.rs: no SDK
of the ones pinned here has a task runtime.

`slow_sum` adds `a` and `b`. Its task is `working` until the first
`tasks/get`, then `completed` with the tool's result inline; `tasks/cancel`
cancels a working one. `tasks/get` of an unknown id answers -32602."""
import datetime
import json
import sys
import uuid

TASKS = "io.modelcontextprotocol/tasks"
tasks = {}


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def fields(task):
    return {
        "taskId": task["id"],
        "status": task["status"],
        "createdAt": task["created"],
        "lastUpdatedAt": task["updated"],
        "ttlMs": 60000,
        "pollIntervalMs": 50,
    }


def answer(method, params):
    meta = params.get("_meta") or {}
    declared = (meta.get("io.modelcontextprotocol/clientCapabilities") or {}).get("extensions") or {}
    if method == "server/discover":
        return {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "extensions": {TASKS: {}}},
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "tasker", "version": "1.0.0"}},
        }
    if method == "tools/list":
        schema = {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        }
        tool = {"name": "slow_sum", "description": "Adds a and b, as a task when the client takes tasks", "inputSchema": schema}
        return {"resultType": "complete", "tools": [tool], "ttlMs": 0, "cacheScope": "private"}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        result = {"content": [{"type": "text", "text": str(arguments["a"] + arguments["b"])}], "isError": False}
        if TASKS not in declared:
            return {"resultType": "complete", **result}
        task = {"id": str(uuid.uuid4()), "status": "working", "created": now(), "updated": now(), "result": result}
        tasks[task["id"]] = task
        return {"resultType": "task", **fields(task)}
    if method == "tasks/get":
        task = tasks.get(params.get("taskId"))
        if task is None:
            raise LookupError(f"no task {params.get('taskId')!r}")
        if task["status"] == "working":
            task["status"], task["updated"] = "completed", now()
        out = {"resultType": "complete", **fields(task)}
        if task["status"] == "completed":
            out["result"] = task["result"]
        return out
    if method == "tasks/cancel":
        task = tasks.get(params.get("taskId"))
        if task is None:
            raise LookupError(f"no task {params.get('taskId')!r}")
        if task["status"] == "working":
            task["status"], task["updated"] = "cancelled", now()
        return {"resultType": "complete"}
    raise NotImplementedError(method)


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message or "method" not in message:
        continue
    try:
        send({"jsonrpc": "2.0", "id": message["id"], "result": answer(message["method"], message.get("params") or {})})
    except LookupError as e:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32602, "message": str(e)}})
    except NotImplementedError as e:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"method not found: {e}"}})
