//! Issue 33, point 2: the Tasks extension (SEP-2663, MCP 2026-07-28)
//! through the gateway. The bundle (tests/tasks, a 2026-07-28 server on
//! Python's standard library) answers a tool call with a task when the
//! request declares the extension. A 2026-07-28 agent that declares it gets
//! the task under an id of the gateway's (never the bundle's), polls it
//! with `tasks/get` to the tool's result, and may cancel it; another
//! token cannot use that id; an agent that does not declare the extension
//! gets the result in full. Before, the extension was not declared and
//! `tasks/get` answered -32601.

mod common;

use std::path::PathBuf;

use common::{free_port, Daemon};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, GetTaskParams,
    ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::json;

/// A 2026-07-28 agent, declaring the Tasks extension or not.
struct TaskAgent(bool);

impl ClientHandler for TaskAgent {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.0 {
            capabilities.extensions = Some(
                [(
                    rmcp::model::TASKS_EXTENSION_ID.to_string(),
                    Default::default(),
                )]
                .into(),
            );
        }
        rmcp::model::ClientConfig::new(
            capabilities,
            rmcp::model::Implementation::new("task-agent", "1"),
        )
    }
}

async fn agent(url: &str, token: &str, tasks: bool) -> RunningService<RoleClient, TaskAgent> {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .auth_header(token.to_string());
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let discover = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    TaskAgent(tasks)
        .serve_with_lifecycle(transport, discover)
        .await
        .unwrap()
}

fn sum(a: i64, b: i64, tool: &str) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_string())
        .with_arguments(json!({"a": a, "b": b}).as_object().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundles_task_reaches_the_agent_under_an_id_of_the_gateways() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tasks");
    tokio::task::block_in_place(|| d.ok(&["install", dir.to_str().unwrap()]));
    let status = tokio::task::block_in_place(|| d.bundle("default", "tasker")).unwrap();
    assert_eq!(status["mcp"]["revision"], "2026-07-28", "{status}");
    let (mine, theirs) = tokio::task::block_in_place(|| {
        (
            d.ok(&["token", "create", "--name", "mine"])
                .trim()
                .to_string(),
            d.ok(&["token", "create", "--name", "theirs"])
                .trim()
                .to_string(),
        )
    });
    let url = format!("http://127.0.0.1:{port}/mcp/default");

    let taker = agent(&url, &mine, true).await;
    let declared = taker.peer().peer_info().unwrap();
    assert!(declared.capabilities.supports_tasks(), "{declared:?}");
    let created = match taker
        .peer()
        .call_tool_once(sum(2, 3, "tasker__slow_sum"))
        .await
    {
        Ok(CallToolResponse::Task(created)) => created,
        other => panic!("not a task: {other:?}"),
    };
    let id = created.task.task_id.clone();
    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "the gateway's own id, not the bundle's uuid: {id}"
    );
    assert_eq!(created.task.status, TaskStatus::Working);

    // Another token cannot use it.
    let other = agent(&url, &theirs, true).await;
    let refused = other
        .peer()
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .expect_err("another token's task");
    assert!(refused.to_string().contains("no task"), "{refused}");

    let got = taker
        .peer()
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .unwrap();
    assert_eq!(got.task.task.task_id, id);
    match &got.task.payload {
        TaskPayload::Completed { result, .. } => {
            let text = serde_json::to_value(result).unwrap()["content"][0]["text"].clone();
            assert_eq!(text, "5", "{result:?}");
        }
        other => panic!("not completed: {other:?}"),
    }

    // A second task, cancelled.
    let second = match taker
        .peer()
        .call_tool_once(sum(1, 1, "tasker__slow_sum"))
        .await
    {
        Ok(CallToolResponse::Task(created)) => created.task.task_id,
        other => panic!("not a task: {other:?}"),
    };
    taker
        .peer()
        .cancel_task(CancelTaskParams::new(second.clone()))
        .await
        .unwrap();
    let cancelled = taker
        .peer()
        .get_task(GetTaskParams::new(second))
        .await
        .unwrap();
    assert_eq!(cancelled.task.status(), TaskStatus::Cancelled);

    // Without the extension, the result in full.
    let plain = agent(&url, &mine, false).await;
    match plain
        .peer()
        .call_tool_once(sum(20, 22, "tasker__slow_sum"))
        .await
    {
        Ok(CallToolResponse::Complete(result)) => {
            let text = serde_json::to_value(&result).unwrap()["content"][0]["text"].clone();
            assert_eq!(text, "42");
        }
        other => panic!("not complete: {other:?}"),
    }

    // The bundle as itself: its own tool name, the same task handling.
    let own = agent(&format!("{url}/bundle/tasker"), &mine, true).await;
    let id = match own.peer().call_tool_once(sum(4, 4, "slow_sum")).await {
        Ok(CallToolResponse::Task(created)) => created.task.task_id,
        other => panic!("not a task: {other:?}"),
    };
    let got = own.peer().get_task(GetTaskParams::new(id)).await.unwrap();
    assert_eq!(got.task.status(), TaskStatus::Completed);

    for client in [taker, other, own] {
        client.cancel().await.unwrap();
    }
    plain.cancel().await.unwrap();
}
