//! Issue 32, points 2 and 6: a bundle on MCP 2025-11-25 asks for input
//! (`elicitation/create`, `sampling/createMessage`) while serving the call
//! of an agent on 2026-07-28, which cannot be sent a request. The gateway
//! answers the agent `input_required` with the bundle's request, and the
//! agent's retry (`inputResponses`, `requestState`) answers the bundle,
//! whose call goes on to its real result. Before, the bundle was refused
//! ("no stream to send it a request on") and the agent never asked.
//!
//! The bundle is the demo: its `confirm` tool elicits TIMES times (0:
//! until declined), logging each question first; its `ask` prompt samples.
//! The agents are raw HTTP (to see and forge the wire) and the Python SDK
//! `mcp` 2.3.0 `Client` (pinned in tests/mcp-py2, `make mcp-py2`).

mod common;

use common::{free_port, post_2026, Daemon};
use serde_json::{json, Value};

fn daemon(http: &str) -> (Daemon, String) {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{http}\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    (d, format!("http://127.0.0.1:{port}/mcp/default"))
}

fn token(d: &Daemon) -> String {
    d.ok(&["token", "create"]).trim().to_string()
}

const ELICITS: &str = r#"{"elicitation": {}}"#;

/// What a `demo__confirm` request answers: the JSON-RPC answer (id 7) and
/// the log messages that came before it on its stream.
async fn confirm(url: &str, token: &str, params: Value) -> (Value, Vec<String>) {
    let capabilities: Value = serde_json::from_str(ELICITS).unwrap();
    let name = params["name"].as_str().unwrap().to_string();
    let (_, messages) = post_2026(url, token, "tools/call", &name, params, capabilities).await;
    let logs = messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| m["params"]["data"].to_string())
        .collect();
    let answer = messages
        .into_iter()
        .find(|m| m["id"] == 7)
        .expect("an answer to the call");
    (answer, logs)
}

fn first_call(times: u32) -> Value {
    first_call_of("demo", times)
}

/// `BUNDLE__confirm` asking `times` times.
fn first_call_of(bundle: &str, times: u32) -> Value {
    json!({"name": format!("{bundle}__confirm"), "arguments": {"times": times}})
}

fn retry(times: u32, state: &Value, responses: Value) -> Value {
    retry_of("demo", times, state, responses)
}

fn retry_of(bundle: &str, times: u32, state: &Value, responses: Value) -> Value {
    json!({
        "name": format!("{bundle}__confirm"),
        "arguments": {"times": times},
        "requestState": state,
        "inputResponses": responses,
    })
}

/// The message of a JSON-RPC error answer ("" for a result).
fn error_of(answer: &Value) -> &str {
    answer["error"]["message"].as_str().unwrap_or_default()
}

fn accept() -> Value {
    json!({"action": "accept", "content": {"ok": true}})
}

/// The `requestState` of an `input_required` answer, checking it asks for
/// exactly the elicitation `message` under `key`.
fn asks(answer: &Value, key: &str, message: &str) -> Value {
    let result = &answer["result"];
    assert_eq!(result["resultType"], "input_required", "{answer}");
    let requests = result["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{answer}");
    assert_eq!(requests[key]["method"], "elicitation/create", "{answer}");
    assert_eq!(requests[key]["params"]["message"], message, "{answer}");
    result["requestState"].clone()
}

/// Two rounds and the result: each `input_required` carries the bundle's
/// elicitation and a new state; each retry's answer reaches the bundle;
/// the call ends with both replies. A state is used once. Log messages go
/// only to a request that asked for them (`_meta` `logLevel`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundles_elicitation_reaches_a_2026_agent_as_input_required_and_the_call_goes_on() {
    let (d, url) = daemon("");
    let t = token(&d);
    let mut first = first_call(2);
    first["_meta"] = json!({"io.modelcontextprotocol/logLevel": "info"});
    let (answer, logs) = confirm(&url, &t, first).await;
    let state1 = asks(&answer, "1", "confirm 1?");
    assert_eq!(logs, vec![r#""demo: asking confirm 1?""#], "{answer}");

    let (answer, logs) = confirm(&url, &t, retry(2, &state1, json!({"1": accept()}))).await;
    let state2 = asks(&answer, "2", "confirm 2?");
    assert_ne!(state1, state2);
    assert!(logs.is_empty(), "no logLevel, no log messages: {logs:?}");

    let declined = json!({"2": {"action": "decline"}});
    let (answer, _) = confirm(&url, &t, retry(2, &state2, declined.clone())).await;
    let result = &answer["result"];
    assert_eq!(result["resultType"], "complete", "{answer}");
    let replies: Value =
        serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(replies[0]["action"], "accept", "{answer}");
    assert_eq!(replies[0]["content"]["ok"], true, "{answer}");
    assert_eq!(replies[1]["action"], "decline", "{answer}");

    // Used once: the same state again names nothing.
    let (answer, _) = confirm(&url, &t, retry(2, &state2, declined)).await;
    let error = error_of(&answer);
    assert!(error.contains("names no request waiting"), "{answer}");
}

/// An agent that declared no elicitation is not asked: the bundle is told
/// why at once, and the call ends with the bundle's own answer to that.
/// Issue 37: such a plain call is answered below rmcp without the rounds'
/// machinery (nothing can be asked of its agent); the same call asking
/// for log messages goes through rmcp and its rounds, and is answered
/// the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_elicitation_is_not_asked() {
    let (d, url) = daemon("");
    let t = token(&d);
    let answer_to = |params: Value| {
        let (url, t) = (url.clone(), t.clone());
        async move {
            let (_, messages) =
                post_2026(&url, &t, "tools/call", "demo__confirm", params, json!({})).await;
            messages.into_iter().find(|m| m["id"] == 7).unwrap()
        }
    };
    let direct_before = common::answered_by(&d).0;
    let answer = answer_to(first_call(1)).await;
    assert_eq!(common::answered_by(&d).0, direct_before + 1, "{answer}");
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("did not declare the elicitation capability"),
        "{text}"
    );
    let mut logged = first_call(1);
    logged["_meta"] = json!({"io.modelcontextprotocol/logLevel": "emergency"});
    let in_rounds = answer_to(logged).await;
    assert_eq!(common::answered_by(&d).0, direct_before + 1, "{in_rounds}");
    assert_eq!(in_rounds["result"], answer["result"]);
}

/// Issue 37: a plain call on a 2025-11-25 session, answered below rmcp,
/// to a bundle on 2026-07-28 that needs input its agent cannot give
/// (`input_required` for an elicitation; the agent declared none): the
/// bundle's need is an error in a 200, as on rmcp's stream of a session
/// (a stateless agent's is a 400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_agent_that_cannot_be_asked_hears_why_in_a_200() {
    let (d, url) = daemon("");
    tokio::task::block_in_place(|| with_py_asker(&d));
    let t = token(&d);
    let id = common::session_below_rmcp(&d, &url, &t).await;
    let (direct, _) = tokio::task::block_in_place(|| common::answered_by(&d));
    let greet = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "py-asker__greet", "arguments": {}}});
    let (status, headers, answer) = common::posted(&url, &t, Some(&id), &greet).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(common::answered_by(&d).0, direct + 1);
    let error = &answer[0]["error"];
    assert_eq!(error["code"], -32021, "{answer:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("elicitation"),
        "{answer:?}"
    );
}

/// Installs copies of the demo named `names` beside the first one. Over
/// stdio nothing ties a bundle's request to one of several calls in flight
/// on it (each 2026-07-28 request is a caller of its own), so calls that
/// wait at once are made on bundles of their own.
fn more_demos(d: &Daemon, names: &[&str]) {
    for name in names {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
    }
}

/// Point 6: another agent's state, a forged one, and an answer that is not
/// an elicitation result are refused with a clear error. Another agent
/// cannot end the call; a bad answer ends it, and its place in the
/// agent's allowance is free again ([http] max_waiting_for_input).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_agents_forged_state_and_bad_answers_are_refused_and_hold_nothing() {
    let (d, url) = daemon("max_waiting_for_input = 2");
    more_demos(&d, &["demo2", "demo3"]);
    let (a, b) = (token(&d), token(&d));
    let (answer, _) = confirm(&url, &a, first_call(1)).await;
    let state = asks(&answer, "1", "confirm 1?");

    let (answer, _) = confirm(&url, &b, retry(1, &state, json!({"1": accept()}))).await;
    let error = error_of(&answer);
    assert!(error.contains("not handed to this agent"), "{answer}");
    let forged = json!("00000000000000000000000000000000");
    let (answer, _) = confirm(&url, &a, retry(1, &forged, json!({"1": accept()}))).await;
    assert!(
        error_of(&answer).contains("names no request waiting"),
        "{answer}"
    );
    let (answer, _) = confirm(
        &url,
        &a,
        json!({"name": "demo__confirm", "inputResponses": {"1": accept()}}),
    )
    .await;
    assert!(
        error_of(&answer).contains("inputResponses without requestState"),
        "{answer}"
    );

    // A's allowance: this one and a second; a third is refused.
    let (answer, _) = confirm(&url, &a, first_call_of("demo2", 1)).await;
    let second = asks(&answer, "1", "confirm 1?");
    let (answer, _) = confirm(&url, &a, first_call_of("demo3", 1)).await;
    let error = error_of(&answer);
    assert!(
        error.contains("already has 2 requests waiting") && error.contains("max_waiting_for_input"),
        "{answer}"
    );

    // B's attempt did not end A's call: A resumes it.
    let bad = json!({"1": {"action": 42}});
    let (answer, _) = confirm(&url, &a, retry(1, &state, bad)).await;
    let error = error_of(&answer);
    assert!(
        error.contains(r#"inputResponses["1"]"#) && error.contains("elicitation/create"),
        "{answer}"
    );
    // That ended it: its state is gone, and its place is free.
    let (answer, _) = confirm(&url, &a, retry(1, &state, json!({"1": accept()}))).await;
    assert!(
        error_of(&answer).contains("names no request waiting"),
        "{answer}"
    );
    let (answer, _) = confirm(&url, &a, first_call_of("demo3", 1)).await;
    asks(&answer, "1", "confirm 1?");
    let (answer, _) = confirm(
        &url,
        &a,
        retry_of("demo2", 1, &second, json!({"1": accept()})),
    )
    .await;
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
}

/// A call whose agent does not come back expires ([http] input_timeout):
/// its place is free again and its state names nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_agent_does_not_retry_expires() {
    let (d, url) = daemon("max_waiting_for_input = 1\ninput_timeout = \"1s\"");
    more_demos(&d, &["demo2"]);
    let t = token(&d);
    let (answer, _) = confirm(&url, &t, first_call(1)).await;
    let state = asks(&answer, "1", "confirm 1?");
    let (answer, _) = confirm(&url, &t, first_call_of("demo2", 1)).await;
    assert!(
        error_of(&answer).contains("already has 1 requests waiting"),
        "{answer}"
    );
    // Refused until the first expires; then the new call is parked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (answer, _) = confirm(&url, &t, first_call_of("demo2", 1)).await;
        if answer["result"]["resultType"] == "input_required" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never expired: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (answer, _) = confirm(&url, &t, retry(1, &state, json!({"1": accept()}))).await;
    let error = error_of(&answer);
    assert!(
        error.contains("names no request waiting") && error.contains("expired (1s"),
        "{answer}"
    );
}

/// A bundle that asks forever is ended after 32 rounds, with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_that_asks_forever_is_ended() {
    let (d, url) = daemon("");
    let t = token(&d);
    let (mut answer, _) = confirm(&url, &t, first_call(0)).await;
    let mut rounds = 0;
    while answer["result"]["resultType"] == "input_required" {
        rounds += 1;
        let key = rounds.to_string();
        let state = asks(&answer, &key, &format!("confirm {rounds}?"));
        answer = confirm(&url, &t, retry(0, &state, json!({ key: accept() })))
            .await
            .0;
    }
    assert_eq!(rounds, 32, "{answer}");
    let error = error_of(&answer);
    assert!(error.contains("asked for input 32 times"), "{answer}");
}

/// The operator's `bundlevisor call` cannot be asked: the bundle is told
/// so, and the CLI shows it.
#[test]
fn the_cli_says_when_a_bundle_needs_input_it_cannot_give() {
    let (d, _) = daemon("");
    let out = d.cli(&["call", "demo", "confirm", r#"{"times": 1}"#]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("from the operator's control socket") && text.contains("nobody to ask"),
        "{text}"
    );
}

/// A real agent: the Python SDK 2.3 `Client` (2026-07-28) answers the
/// bundle's elicitation (a tool) and sampling (a prompt) through its
/// callbacks and its own input_required loop, and hears the log messages
/// it opted in to.
#[test]
fn the_python_sdk_2_3_client_answers_a_2025_bundles_requests() {
    let (d, url) = daemon("");
    let t = token(&d);
    let said = common::mcp_py2("tests/mcp-py2/asked.py", &[&url, &t]);
    let stdout = said.join("\n");
    assert_eq!(said[0], "protocol 2026-07-28", "{stdout}");
    assert!(
        said[1].starts_with("confirm ") && said[1].matches("accept").count() == 2,
        "{stdout}"
    );
    assert_eq!(said[2], "asked confirm 1? | confirm 2?", "{stdout}");
    assert!(
        said[3].contains("the client's answer") && said[3].contains("forty-two from python"),
        "{stdout}"
    );
    assert_eq!(
        said[4], "logs demo: asking confirm 1? | demo: asking confirm 2?",
        "{stdout}"
    );
}

/// Issue 32, point 3: a bundle that speaks MCP 2026-07-28 (the Python SDK
/// `mcp` 2.3.0 `MCPServer`, `make mcp-py2-bundle`) is spoken to in it
/// (`server/discover`), and `status` says so; one whose manifest declares
/// host-resources (the demo) is kept on 2025-11-25, and `status` says why.
fn with_py_asker(d: &Daemon) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-py2-bundle");
    assert!(
        dir.join(".installed").exists(),
        "{} is not built; run `make mcp-py2-bundle` (make test does)",
        dir.display()
    );
    d.ok(&["install", dir.to_str().unwrap()]);
}

#[test]
fn a_bundle_on_2026_07_28_is_spoken_to_in_it_and_status_says_each_revision() {
    let (d, _) = daemon("");
    with_py_asker(&d);
    let mcp = |name: &str| d.bundle("default", name).expect(name)["mcp"].clone();
    assert_eq!(
        mcp("py-asker")["revision"],
        "2026-07-28",
        "{}",
        mcp("py-asker")
    );
    assert!(mcp("py-asker")["why"].is_null(), "{}", mcp("py-asker"));
    assert_eq!(mcp("demo")["revision"], "2025-11-25", "{}", mcp("demo"));
    let why = mcp("demo")["why"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("ai.nimblebrain/host-resources"), "{why}");
}

/// The time an agent takes to answer a bundle's request (a person filling
/// in a form) does not count against the call's own timeout, up to
/// `[http] input_timeout`: with a 1 s call timeout, an agent that takes
/// 0.7 s per answer gets both of the demo's questions answered (before,
/// the call timed out at 1 s); one that keeps answering past the bound is
/// timed out all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_time_to_answer_does_not_count_against_the_calls_timeout() {
    use rmcp::model::{
        CallToolRequestParams, ClientCapabilities, ElicitRequestParams, ElicitResult,
        ElicitationAction,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};

    /// A person: 0.7 s to answer each question, always yes.
    struct Slow;
    impl ClientHandler for Slow {
        fn get_info(&self) -> rmcp::model::ClientConfig {
            rmcp::model::ClientConfig::new(
                ClientCapabilities::builder().enable_elicitation().build(),
                rmcp::model::Implementation::new("slow-agent", "1"),
            )
        }
        async fn create_elicitation(
            &self,
            _: ElicitRequestParams,
            _: RequestContext<RoleClient>,
        ) -> Result<ElicitResult, ErrorData> {
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"ok": true})))
        }
    }

    for (input_timeout, times, finishes) in [("30s", 2, true), ("1s", 0, false)] {
        let (d, url) = daemon(&format!(
            "input_timeout = \"{input_timeout}\"\n[bundles]\ncall_timeout = \"1s\"\n"
        ));
        let t = token(&d);
        let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(t);
        let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
        let agent = Slow.serve(transport).await.unwrap();
        let params = CallToolRequestParams::new("demo__confirm")
            .with_arguments(json!({"times": times}).as_object().unwrap().clone());
        let answer = agent.peer().call_tool(params).await;
        if finishes {
            let text = serde_json::to_value(answer.unwrap()).unwrap()["content"][0]["text"].clone();
            let replies: Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
            assert_eq!(replies.as_array().map(Vec::len), Some(2), "{replies}");
        } else {
            let refused = answer.expect_err("timed out").to_string();
            assert!(
                refused.contains(r#"tool "confirm" of bundle "demo" did not answer within 1s"#),
                "{refused}"
            );
        }
        agent.cancel().await.unwrap();
    }
}

/// A 2025-11-25 stdio server that dies at the unknown `server/discover`
/// (the demo with `DEMO_EXIT_ON_DISCOVER=1`, no host-resources declared so
/// the daemon tries the new revision first) is started again at once with
/// `initialize` and runs, `status` saying why; before, it crash-looped.
#[test]
fn a_2025_server_that_exits_at_server_discover_is_started_again_with_initialize() {
    let (d, _) = daemon("");
    let mut manifest: Value = serde_json::from_str(common::DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("old");
    manifest["_meta"] = json!({});
    manifest["server"]["mcp_config"]["env"]["DEMO_EXIT_ON_DISCOVER"] = json!("1");
    let dir = common::write_bundle(&d.root().join("bundles"), "old", &manifest);
    d.ok(&["install", dir.to_str().unwrap()]);
    let status = d.wait_state("default", "old", "ready");
    assert_eq!(status["mcp"]["revision"], "2025-11-25", "{status}");
    let why = status["mcp"]["why"].as_str().unwrap_or_default();
    assert!(
        why.contains("failed the MCP 2026-07-28 handshake (bundle exited during start")
            && why.contains("spoken to with initialize"),
        "{status}"
    );
    assert_eq!(status["restarts"], 0, "{status}");
    assert_eq!(
        d.ok(&["call", "old", "echo", r#"{"text": "hi"}"#]).trim(),
        "hi"
    );
}

/// Point 2, the other way: the bundle answers `input_required`. The
/// operator's `bundlevisor call` cannot give input and says so (the
/// bundle, told its caller declares no elicitation, refuses with -32021,
/// and the daemon says what it needs); an agent on
/// a 2025-11-25 session is asked by requests on its session, and one on
/// 2026-07-28 by the gateway's own `input_required`; the daemon retries the
/// bundle with the answers and its `requestState`, and the call completes.
#[test]
fn a_2026_bundles_input_required_reaches_agents_of_both_revisions() {
    let (d, url) = daemon("");
    with_py_asker(&d);
    let out = d.cli(&["call", "py-asker", "greet", "{}"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("the bundle needs input (the elicitation capability)")
            && text.contains("nobody to ask"),
        "{text}"
    );
    let t = token(&d);
    for (mode, protocol) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let said = common::mcp_py2("tests/mcp-py2/asked.py", &[&url, &t, mode]);
        let stdout = said.join("\n");
        assert_eq!(said[0], format!("protocol {protocol}"), "{stdout}");
        assert_eq!(said[1], "greet hello Grace (on 2026-07-28)", "{stdout}");
        assert_eq!(
            said[2], "ponder the model said forty-two from python (on 2026-07-28)",
            "{stdout}"
        );
        assert_eq!(said[3], "asked what is your name?", "{stdout}");
    }
}

/// Issue 32, point 1: a 2026-07-28 bundle's resources are followed,
/// though that revision has no `resources/subscribe`: the daemon hears the
/// URIs agents follow on one `subscriptions/listen` stream to the bundle.
/// A 2025-11-25 agent's subscription and a 2026-07-28 agent's listen both
/// hear the bundle's update; when the first leaves, the second still
/// hears. Before, the subscription was refused and the listen left the
/// URI out. A URI that cannot be followed is refused saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(deprecated)] // resources/subscribe: what a 2025-11-25 agent sends
async fn a_2026_bundles_resources_are_followed_by_agents_of_both_revisions() {
    use rmcp::model::{
        ProtocolVersion, ResourceUpdatedNotificationParam, ServerNotification,
        SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
    };
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServiceExt};
    use tokio::sync::mpsc;

    /// A 2025-11-25 agent that hears the updates of what it follows.
    struct Updates(mpsc::UnboundedSender<String>);
    impl ClientHandler for Updates {
        async fn on_resource_updated(
            &self,
            params: ResourceUpdatedNotificationParam,
            _: rmcp::service::NotificationContext<rmcp::RoleClient>,
        ) {
            let _ = self.0.send(params.uri);
        }
    }

    let (d, url) = daemon("");
    tokio::task::block_in_place(|| with_py_asker(&d));
    let t = token(&d);
    let uri = "bundle://py-asker/test%3A%2F%2Fnotes";
    let transport = || {
        let config =
            StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(t.clone());
        StreamableHttpClientTransport::with_client(reqwest::Client::new(), config)
    };
    let (tx, mut heard) = mpsc::unbounded_channel();
    let legacy = Updates(tx).serve(transport()).await.unwrap();
    for (wrong, why) in [
        (
            "files://notes.txt",
            "files://notes.txt cannot be subscribed to: the workspace's files:// resources do not announce changes",
        ),
        (
            "test://notes",
            "test://notes cannot be subscribed to: not a resource of this gateway",
        ),
        ("bundle://nosuch/x", "no bundle \"nosuch\" in workspace \"default\""),
    ] {
        let refused = legacy
            .peer()
            .subscribe(SubscribeRequestParams::new(wrong))
            .await
            .expect_err(wrong)
            .to_string();
        assert!(refused.contains(why), "{refused}");
    }
    legacy
        .peer()
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    let discover = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let modern = ().serve_with_lifecycle(transport(), discover).await.unwrap();
    let filter = SubscriptionFilter::builder()
        .resource_subscriptions([uri])
        .build();
    let mut stream = modern.peer().listen(filter).await.unwrap();
    assert_eq!(
        stream.acknowledged().resource_subscriptions,
        Some(vec![uri.to_string()]),
        "{:?}",
        stream.acknowledged()
    );
    let note = |text: &str| {
        let params = rmcp::model::CallToolRequestParams::new("py-asker__note")
            .with_arguments(json!({"text": text}).as_object().unwrap().clone());
        modern.peer().call_tool(params)
    };
    async fn next_update(stream: &mut rmcp::service::Subscription) -> String {
        match tokio::time::timeout(std::time::Duration::from_secs(20), stream.next()).await {
            Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(n)))) => n.params.uri,
            other => panic!("no update on the listen stream: {other:?}"),
        }
    }
    note("first").await.unwrap();
    assert_eq!(heard.recv().await.as_deref(), Some(uri));
    assert_eq!(next_update(&mut stream).await, uri);

    legacy
        .peer()
        .unsubscribe(UnsubscribeRequestParams::new(uri))
        .await
        .unwrap();
    note("second").await.unwrap();
    assert_eq!(next_update(&mut stream).await, uri);
    assert!(heard.try_recv().is_err(), "the agent that left still heard");
    let read = modern
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    let text = serde_json::to_value(&read).unwrap()["contents"][0]["text"].clone();
    assert_eq!(text, "first\nsecond", "{read:?}");

    // The bundle ends its stream: the daemon opens it again, and updates
    // still reach the agent that follows.
    let params = rmcp::model::CallToolRequestParams::new("py-asker__hang_up");
    let closed = modern.peer().call_tool(params).await.unwrap();
    let said = serde_json::to_value(&closed).unwrap()["content"][0]["text"].clone();
    assert_eq!(said, "closed the streams of 1 handler(s)", "{closed:?}");
    common::wait_for(
        std::time::Duration::from_secs(20),
        "the bundle's listen stream opened again",
        || {
            d.log()
                .contains("the bundle's subscriptions/listen stream ended; opening it again")
                .then_some(())
        },
    );
    // Notes until one is heard (the new stream opens a second after the
    // old one ended).
    let mut heard_again = false;
    for n in 0..40 {
        note(&format!("after {n}")).await.unwrap();
        if let Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(u)))) =
            tokio::time::timeout(std::time::Duration::from_millis(500), stream.next()).await
        {
            assert_eq!(u.params.uri, uri);
            heard_again = true;
            break;
        }
    }
    assert!(heard_again, "no update after the bundle ended its stream");
    drop(stream);
    legacy.cancel().await.unwrap();
    modern.cancel().await.unwrap();
}

/// A bundle on 2026-07-28 logs only for a request that asks it to: the
/// daemon passes on the level the agent asked for (a 2026-07-28 request's
/// `logLevel`), and the log message reaches that request; a request
/// without it hears none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_bundle_logs_to_the_agent_that_asked_for_logs() {
    let (d, url) = daemon("");
    tokio::task::block_in_place(|| with_py_asker(&d));
    let t = token(&d);
    let call = |level: Option<&str>| {
        let mut params = json!({"name": "py-asker__chatty", "arguments": {}});
        if let Some(level) = level {
            params["_meta"] = json!({"io.modelcontextprotocol/logLevel": level});
        }
        let (url, t) = (url.clone(), t.clone());
        async move {
            let (_, messages) = post_2026(
                &url,
                &t,
                "tools/call",
                "py-asker__chatty",
                params,
                json!({}),
            )
            .await;
            let answer = messages.iter().find(|m| m["id"] == 7).cloned().unwrap();
            assert_eq!(
                answer["result"]["content"][0]["text"], "said it (on 2026-07-28)",
                "{answer}"
            );
            messages
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .map(|m| m["params"]["data"].to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(call(Some("info")).await, vec![r#""chatty: a log message""#]);
    assert!(call(None).await.is_empty());
    assert!(call(Some("error")).await.is_empty());
}

/// A 2026-07-28 bundle that asks for two things in one round (the Python
/// SDK batches a tool's resolvers) reaches a 2026-07-28 agent as one
/// `input_required` with both requests, and one retry answers both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_of_one_round_reach_the_agent_together() {
    let (d, url) = daemon("");
    tokio::task::block_in_place(|| with_py_asker(&d));
    let t = token(&d);
    let caps = json!({"elicitation": {}, "sampling": {}});
    let first = json!({"name": "py-asker__both", "arguments": {"question": "six times seven?"}});
    let (_, messages) = post_2026(
        &url,
        &t,
        "tools/call",
        "py-asker__both",
        first,
        caps.clone(),
    )
    .await;
    let answer = messages.into_iter().find(|m| m["id"] == 7).unwrap();
    assert_eq!(answer["result"]["resultType"], "input_required", "{answer}");
    let requests = answer["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .clone();
    let mut methods: Vec<&str> = requests
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    methods.sort();
    assert_eq!(
        methods,
        ["elicitation/create", "sampling/createMessage"],
        "{answer}"
    );
    let responses: serde_json::Map<String, Value> = requests
        .iter()
        .map(|(key, r)| {
            let response = match r["method"].as_str() {
                Some("elicitation/create") => json!({"action": "accept", "content": {"name": "Ada"}}),
                _ => json!({"role": "assistant", "content": {"type": "text", "text": "42"}, "model": "m"}),
            };
            (key.clone(), response)
        })
        .collect();
    let retry = json!({
        "name": "py-asker__both",
        "arguments": {"question": "six times seven?"},
        "requestState": answer["result"]["requestState"],
        "inputResponses": responses,
    });
    let (_, messages) = post_2026(&url, &t, "tools/call", "py-asker__both", retry, caps).await;
    let answer = messages.into_iter().find(|m| m["id"] == 7).unwrap();
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "hello Ada; the model said 42",
        "{answer}"
    );
}
