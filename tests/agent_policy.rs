//! Issue 35: a token's own allow and deny rules, held on every path an
//! agent has to a bundle — the workspace endpoint, a per-bundle endpoint,
//! the search meta-tools, a 2026-07-28 stateless request, the stdio
//! gateway given the token — and the audit line of every call.

mod common;

use std::time::Duration;

use common::{free_port, http_agent, post_2026, wait_for, Daemon};
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use rmcp::ServiceExt;
use serde_json::{json, Map, Value};

const RULES: [&str; 6] = [
    "--allow",
    "tool:demo/*",
    "--deny",
    "tool:demo/add",
    "--deny",
    "resource:@files/*",
];

fn token(d: &Daemon, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", "--name", name];
    args.extend_from_slice(extra);
    d.ok(&args).trim().to_string()
}

fn arguments(value: Value) -> Option<Map<String, Value>> {
    value.as_object().cloned()
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `demo__add` is not listed to `peer` (a token with [`RULES`]) but
/// `demo__echo` is, and calling `demo__add` anyway is refused by its rule.
async fn hidden_and_refused(peer: &rmcp::Peer<rmcp::RoleClient>) {
    let names: Vec<String> = (peer.list_all_tools().await.unwrap())
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        names.contains(&"demo__echo".into()) && !names.contains(&"demo__add".into()),
        "{names:?}"
    );
    let add = CallToolRequestParams::new("demo__add")
        .with_arguments(arguments(json!({"a": 2, "b": 3})).unwrap());
    let refused = peer.call_tool(add).await.unwrap_err().to_string();
    assert!(refused.contains("--deny tool:demo/add"), "{refused}");
}

/// The audit lines of `token`, once `done` holds for them.
fn audit_of(d: &Daemon, token: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    wait_for(Duration::from_secs(10), "the audit lines", || {
        let out = d.ok(&["audit", "--json", "--token", token]);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        done(&lines).then_some(lines)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_rules_hold_on_every_http_path_and_every_call_is_audited() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[[profile]]\nname = \"finder\"\ndiscovery = \"search\"\n"
    ));
    let (limited, finder, file) = tokio::task::block_in_place(|| {
        d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
        let mut finder = RULES.to_vec();
        finder.extend(["--profile", "finder"]);
        (
            token(&d, "limited", &RULES),
            token(&d, "finder", &finder),
            d.put_file("notes.txt", b"workspace notes"),
        )
    });
    let shown = tokio::task::block_in_place(|| d.ok(&["token", "ls"]));
    assert!(
        shown.contains("--deny tool:demo/add") && shown.contains("--allow tool:demo/*"),
        "{shown}"
    );
    let base = format!("http://127.0.0.1:{port}/mcp/default");

    // The workspace endpoint: the refused tool is not listed, and refused
    // with its rule when called anyway.
    let client = http_agent(&base, &limited).await.unwrap();
    hidden_and_refused(client.peer()).await;
    let echo = CallToolRequestParams::new("demo__echo")
        .with_arguments(arguments(json!({"text": "hi"})).unwrap());
    assert!(text_of(&client.peer().call_tool(echo).await.unwrap()).contains("hi"));
    let read = client
        .peer()
        .read_resource(ReadResourceRequestParams::new(format!("files://{file}")))
        .await;
    let why = read.unwrap_err().to_string();
    assert!(why.contains("--deny resource:@files/*"), "{why}");

    let probe = CallToolRequestParams::new("demo__nosuch");
    assert!(client.peer().call_tool(probe).await.is_err());
    client.cancel().await.unwrap();

    // One bundle as itself: the same rule, by the bundle's own names.
    let client = http_agent(&format!("{base}/bundle/demo"), &limited)
        .await
        .unwrap();
    let own = CallToolRequestParams::new("add")
        .with_arguments(arguments(json!({"a": 2, "b": 3})).unwrap());
    let refused = client.peer().call_tool(own).await.unwrap_err().to_string();
    assert!(refused.contains("--deny tool:demo/add"), "{refused}");
    client.cancel().await.unwrap();

    // A 2026-07-28 agent, stateless, with a trace id the audit keeps.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let params = json!({"name": "demo__echo", "arguments": {"text": "traced"},
        "_meta": {"traceparent": format!("00-{trace}-00f067aa0ba902b7-01")}});
    let (_, answers) = post_2026(
        &base,
        &limited,
        "tools/call",
        "demo__echo",
        params,
        json!({}),
    )
    .await;
    assert!(
        answers.iter().any(|a| a["id"] == 7
            && a["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("traced"))),
        "{answers:?}"
    );
    let params = json!({"name": "demo__add", "arguments": {"a": 1, "b": 1}});
    let (_, answers) = post_2026(
        &base,
        &limited,
        "tools/call",
        "demo__add",
        params,
        json!({}),
    )
    .await;
    assert!(
        answers.iter().any(|a| a["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--deny tool:demo/add"))),
        "{answers:?}"
    );

    // The search meta-tools: what the token may not call is never found,
    // and refused through call_tool.
    let (_, answers) = post_2026(
        &format!("{base}/finder"),
        &finder,
        "tools/list",
        "",
        json!({}),
        json!({}),
    )
    .await;
    let listed: Vec<&str> = answers[0]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        listed,
        ["find_tools", "call_tool"],
        "a stateless agent pins nothing"
    );
    let client = http_agent(&format!("{base}/finder"), &finder)
        .await
        .unwrap();
    let find = CallToolRequestParams::new("find_tools")
        .with_arguments(arguments(json!({"query": "add two numbers", "limit": 10})).unwrap());
    let found = client.peer().call_tool(find).await.unwrap();
    let hits = found.structured_content.clone().unwrap()["tools"].clone();
    let hit_names: Vec<&str> = hits
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["name"].as_str())
        .collect();
    assert!(
        !hit_names.is_empty() && !hit_names.contains(&"demo__add"),
        "{hits}"
    );
    let call = CallToolRequestParams::new("call_tool").with_arguments(
        arguments(json!({"name": "demo__add", "arguments": {"a": 2, "b": 3}})).unwrap(),
    );
    let refused = client.peer().call_tool(call).await.unwrap_err().to_string();
    assert!(refused.contains("--deny tool:demo/add"), "{refused}");
    client.cancel().await.unwrap();

    // A per-bundle endpoint reached with a token of a searching profile
    // searches too, among that bundle's tools, by their own names.
    let client = http_agent(&format!("{base}/bundle/demo"), &finder)
        .await
        .unwrap();
    let listed: Vec<String> = (client.peer().list_all_tools().await.unwrap())
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(listed, ["find_tools", "call_tool", "pin_tools"]);
    let find = CallToolRequestParams::new("find_tools")
        .with_arguments(arguments(json!({"query": "echo the text back"})).unwrap());
    let found = client.peer().call_tool(find).await.unwrap();
    let first = found.structured_content.unwrap()["tools"][0]["name"].clone();
    assert_eq!(first, "echo");
    client.cancel().await.unwrap();

    // Every call audited under the token's name, never its text.
    let lines = tokio::task::block_in_place(|| {
        audit_of(&d, "limited", |l| {
            l.iter().any(|x| x["trace_id"] == trace) && l.len() >= 7
        })
    });
    let of = |name: &str, outcome: &str| {
        lines
            .iter()
            .any(|l| l["name"] == name && l["outcome"] == outcome)
    };
    assert!(
        of("echo", "ok") && of("add", "refused") && of(&format!("files://{file}"), "refused"),
        "{lines:#?}"
    );
    assert!(
        of("demo__nosuch", "error"),
        "a probe for a name that routes nowhere: {lines:#?}"
    );
    let refusal = lines
        .iter()
        .find(|l| l["outcome"] == "refused" && l["name"] == "add")
        .unwrap();
    assert!(
        refusal["reason"]
            .as_str()
            .unwrap()
            .contains("--deny tool:demo/add"),
        "{refusal}"
    );
    assert_eq!(refusal["permitted"], false);
    assert!(lines
        .iter()
        .all(|l| l["principal"] == "token:limited" && l["duration_ms"].is_number()));
    // The searches themselves too, as the meta-tool's calls.
    let finder_lines = tokio::task::block_in_place(|| {
        audit_of(&d, "finder", |l| {
            l.iter()
                .any(|x| x["bundle"] == "@gateway" && x["name"] == "find_tools")
        })
    });
    assert!(
        finder_lines
            .iter()
            .any(|l| l["name"] == "add" && l["outcome"] == "refused"),
        "{finder_lines:#?}"
    );
    for entry in std::fs::read_dir(d.root().join("state/audit"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        assert!(
            !text.contains(&limited) && !text.contains("bvt_"),
            "a token's text in the audit log"
        );
    }
}

/// The stdio gateway, given a token in `BUNDLEVISOR_TOKEN`, serves that
/// token's profile and rules and audits under its name; a token that does
/// not fit is refused before the session begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_agent_given_a_token_gets_its_rules_and_its_name_in_the_audit() {
    let d = Daemon::start();
    let (limited, other) = tokio::task::block_in_place(|| {
        d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
        (
            token(&d, "stdio-limited", &RULES),
            token(&d, "elsewhere", &["-w", "other"]),
        )
    });
    let mut child = d.spawn_mcp_with_env(&[], &[("BUNDLEVISOR_TOKEN", &limited)]);
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.unwrap();
    hidden_and_refused(client.peer()).await;
    // Revoked while the session lives: nothing is reached any more.
    tokio::task::block_in_place(|| d.ok(&["token", "revoke", "stdio-limited"]));
    let echo = CallToolRequestParams::new("demo__echo")
        .with_arguments(arguments(json!({"text": "x"})).unwrap());
    let refused = client.peer().call_tool(echo).await.unwrap_err().to_string();
    assert!(refused.contains("revoked or has expired"), "{refused}");
    client.cancel().await.unwrap();
    let lines = tokio::task::block_in_place(|| audit_of(&d, "stdio-limited", |l| !l.is_empty()));
    assert_eq!(lines[0]["outcome"], "refused", "{lines:#?}");

    // Without a token, the admitted uid is the principal.
    let mut child = d.spawn_mcp(&[]);
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.unwrap();
    let echo = CallToolRequestParams::new("demo__echo")
        .with_arguments(arguments(json!({"text": "x"})).unwrap());
    client.peer().call_tool(echo).await.unwrap();
    client.cancel().await.unwrap();
    let me = nix::unistd::getuid().as_raw();
    tokio::task::block_in_place(|| audit_of(&d, &format!("uid:{me}"), |l| !l.is_empty()));

    // A token of another workspace: refused, said on stderr.
    let child = d.spawn_mcp_with_env(&[], &[("BUNDLEVISOR_TOKEN", &other)]);
    let out = child.wait_with_output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("is for workspace \"other\""),
        "{said}"
    );
    assert!(!said.contains(&other), "the token's text on stderr: {said}");
}
