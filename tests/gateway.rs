//! `bundlevisor mcp`: the workspace gateway, driven by rmcp's client over
//! the gateway's stdio, against the real daemon and real bundles.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_for, write_bundle, Daemon, BIN, DEMO_MANIFEST};
use rmcp::model::{
    CallToolRequestParams, ClientRequest, ProgressNotificationParam, ProgressToken,
    ReadResourceRequestParams, RequestParamsMeta, ResourceContents,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};

/// What the agent was told, in order.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Recorder {
    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, what: &str) -> usize {
        self.seen().iter().filter(|s| s.as_str() == what).count()
    }
}

impl ClientHandler for Recorder {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.0.lock().unwrap().push("tools_changed".into());
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.0.lock().unwrap().push("resources_changed".into());
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(format!(
            "progress {} {}",
            params.progress,
            params.message.unwrap_or_default()
        ));
    }
}

/// An agent connected to `bundlevisor mcp` through its stdio.
struct Agent {
    rt: tokio::runtime::Runtime,
    client: Option<RunningService<RoleClient, Recorder>>,
    recorder: Recorder,
    _child: tokio::process::Child,
}

impl Agent {
    fn connect(d: &Daemon, extra: &[&str]) -> Agent {
        Agent::connect_logged(d, extra, None)
    }

    /// The same; `bundlevisor mcp`'s debug log written to `log`.
    fn connect_logged(d: &Daemon, extra: &[&str], log: Option<&Path>) -> Agent {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let recorder = Recorder::default();
        let (child, client) = rt.block_on(async {
            let mut child = match log {
                Some(log) => d.spawn_mcp_logged(extra, log),
                None => d.spawn_mcp(extra),
            };
            let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
            let client = recorder.clone().serve(io).await.unwrap();
            (child, client)
        });
        Agent {
            rt,
            client: Some(client),
            recorder,
            _child: child,
        }
    }

    fn peer(&self) -> &rmcp::Peer<RoleClient> {
        self.client.as_ref().unwrap().peer()
    }

    fn tool_names(&self) -> Vec<String> {
        let tools = self.rt.block_on(self.peer().list_all_tools()).unwrap();
        let mut names: Vec<String> = tools.into_iter().map(|t| t.name.to_string()).collect();
        names.sort();
        names
    }

    /// The text of a tool call, or the MCP error's message.
    fn call(&self, tool: &str, args: Value) -> Result<String, String> {
        self.rt.block_on(call(self.peer(), tool, args))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.rt.block_on(client.cancel());
        }
    }
}

async fn call(peer: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> Result<String, String> {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().unwrap().clone());
    match peer.call_tool(params).await {
        Ok(r) => Ok(r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("")),
        Err(e) => Err(e.to_string()),
    }
}

/// A demo bundle whose echo prefixes its own name, so routing is visible.
fn named_demo(dir: &Path, name: &str) {
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!(name);
    m["user_config"]["greeting"]["default"] = json!(format!("{name}:"));
    write_bundle(dir, name, &m);
}

fn install_demos(d: &Daemon, names: &[&str]) {
    let dir = d.root().join("bundles");
    for name in names {
        named_demo(&dir, name);
        d.ok(&["install", dir.join(name).to_str().unwrap()]);
    }
}

#[test]
fn aggregates_bundles_under_namespaced_names_and_routes_concurrent_calls() {
    let d = Daemon::start();
    install_demos(&d, &["alpha", "beta", "gamma"]);
    let agent = Agent::connect(&d, &[]);
    let names = agent.tool_names();
    assert_eq!(names.len(), 3 * common::DEMO_TOOLS, "{names:?}");
    for bundle in ["alpha", "beta", "gamma"] {
        for tool in ["echo", "add", "sleep", "progress", "host_read"] {
            assert!(names.contains(&format!("{bundle}__{tool}")), "{names:?}");
        }
    }

    // 30 calls at once, each answered by the bundle its name routes to,
    // while a slow call on alpha does not hold any of them up.
    let answers = agent.rt.block_on(async {
        let peer = agent.peer().clone();
        let slow = tokio::spawn({
            let peer = peer.clone();
            async move { call(&peer, "alpha__sleep", json!({"ms": 3000})).await }
        });
        let calls = (0..30).map(|i| {
            let peer = peer.clone();
            let bundle = ["alpha", "beta", "gamma"][i % 3];
            async move {
                let got = call(
                    &peer,
                    &format!("{bundle}__echo"),
                    json!({"text": format!("n{i}")}),
                )
                .await;
                (bundle, i, got)
            }
        });
        let fast = futures::future::join_all(calls).await;
        assert!(
            !slow.is_finished(),
            "the echoes must not wait for the slow call"
        );
        slow.abort();
        fast
    });
    for (bundle, i, got) in answers {
        assert_eq!(got.unwrap(), format!("{bundle}:n{i}"));
    }

    // Unknown tools are refused with a clear MCP error.
    let err = agent.call("delta__echo", json!({"text": "x"})).unwrap_err();
    assert!(err.contains("no \"delta__echo\""), "{err}");
}

#[test]
fn tool_list_changed_is_sent_when_bundles_come_and_go() {
    let d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let agent = Agent::connect(&d, &[]);
    assert_eq!(agent.tool_names().len(), common::DEMO_TOOLS);
    install_demos(&d, &["beta"]);
    wait_for(
        Duration::from_secs(10),
        "tools/list_changed after install",
        || (agent.recorder.count("tools_changed") >= 1).then_some(()),
    );
    assert!(agent.tool_names().contains(&"beta__echo".to_string()));
    let before = agent.recorder.count("tools_changed");
    d.ok(&["uninstall", "beta"]);
    wait_for(
        Duration::from_secs(10),
        "tools/list_changed after uninstall",
        || (agent.recorder.count("tools_changed") > before).then_some(()),
    );
    assert_eq!(agent.tool_names().len(), common::DEMO_TOOLS);
    wait_for(
        Duration::from_secs(10),
        "resources/list_changed twice",
        || (agent.recorder.count("resources_changed") >= 2).then_some(()),
    );
}

#[test]
fn progress_passes_through_and_cancellation_reaches_the_bundle() {
    let d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let agent = Agent::connect(&d, &[]);
    let text = agent.rt.block_on(async {
        let mut params = CallToolRequestParams::new("alpha__progress").with_arguments(
            json!({"steps": 3, "delay_ms": 10})
                .as_object()
                .unwrap()
                .clone(),
        );
        params.set_progress_token(ProgressToken(rmcp::model::NumberOrString::String(
            "agent-token".into(),
        )));
        let result = agent.peer().call_tool(params).await.unwrap();
        result.content[0].as_text().unwrap().text.clone()
    });
    assert_eq!(text, "done after 3 steps");
    wait_for(
        Duration::from_secs(5),
        "three progress notifications",
        || {
            let seen = agent.recorder.seen();
            let progress: Vec<&String> =
                seen.iter().filter(|s| s.starts_with("progress")).collect();
            (progress.len() == 3).then(|| {
                assert_eq!(progress[2], "progress 3 step 3 of 3");
            })
        },
    );

    // Cancel a long call: the bundle sees the cancellation.
    agent.rt.block_on(async {
        let params = CallToolRequestParams::new("alpha__sleep")
            .with_arguments(json!({"ms": 30000}).as_object().unwrap().clone());
        let handle = agent
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
                Default::default(),
            )
            .await
            .unwrap();
        // Cancel once the call has reached the bundle.
        let started = || {
            d.ok(&["logs", "alpha", "-n", "50"])
                .contains("sleeping 30000 ms")
                .then_some(())
        };
        wait_for(Duration::from_secs(10), "the sleep to start", started);
        handle.cancel(Some("test".into())).await.unwrap();
    });
    wait_for(
        Duration::from_secs(10),
        "the bundle to see the cancellation",
        || {
            d.ok(&["logs", "alpha", "-n", "50"])
                .contains("sleep of 30000 ms cancelled by the client")
                .then_some(())
        },
    );
}

#[test]
fn workspace_files_are_resources_with_truthful_mime_types() {
    let d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let root = d.root();
    let put = |name: &str, bytes: &[u8]| d.put_file(name, bytes);
    let text_id = put("notes.txt", b"plain words");
    let json_id = put("data.json", br#"{"k": [1, 2]}"#);
    let png = [
        0x89u8, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0xff, 0x00,
    ];
    let bin_id = put("pixel.png", &png);

    let agent = Agent::connect(&d, &[]);
    let resources = agent
        .rt
        .block_on(agent.peer().list_all_resources())
        .unwrap();
    let listed = |id: &str| {
        resources
            .iter()
            .find(|r| r.uri == format!("files://{id}"))
            .unwrap_or_else(|| panic!("files://{id} not listed: {resources:?}"))
            .clone()
    };
    for (id, name, mime, size) in [
        (&text_id, "notes.txt", "text/plain", 11u64),
        (&json_id, "data.json", "application/json", 13),
        (&bin_id, "pixel.png", "image/png", png.len() as u64),
    ] {
        let r = listed(id);
        assert_eq!(r.name, name);
        assert_eq!(r.mime_type.as_deref(), Some(mime), "{r:?}");
        assert_eq!(r.size, Some(size));
        let read = agent
            .rt
            .block_on(
                agent
                    .peer()
                    .read_resource(ReadResourceRequestParams::new(r.uri.clone())),
            )
            .unwrap();
        match &read.contents[0] {
            ResourceContents::TextResourceContents {
                mime_type, text, ..
            } => {
                assert_eq!(mime_type.as_deref(), Some(mime));
                assert_ne!(mime, "image/png", "a binary file must be a blob");
                let expected = std::fs::read_to_string(root.join(name)).unwrap();
                assert_eq!(text, &expected);
            }
            ResourceContents::BlobResourceContents {
                mime_type, blob, ..
            } => {
                use base64::Engine;
                assert_eq!(mime_type.as_deref(), Some(mime));
                assert_eq!(mime, "image/png", "a text file must be text");
                assert_eq!(
                    base64::engine::general_purpose::STANDARD
                        .decode(blob)
                        .unwrap(),
                    png
                );
            }
            other => panic!("unexpected contents {other:?}"),
        }
    }
    let err = agent
        .rt
        .block_on(
            agent
                .peer()
                .read_resource(ReadResourceRequestParams::new("files://fl_missing")),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("-32002") || err.to_string().to_lowercase().contains("not found"),
        "{err}"
    );
}

/// Issue 30, finding 16: bundle `a` lists a tool `b__sh`, which takes the
/// exposed name `a__b__sh` that bundle `a__b`'s tool `sh` would have had
/// (`sh` moves to `a__b__sh__2`). A profile that excludes `sh` of `a__b`
/// names the pair, and the pair is what is filtered, before names are
/// given: `sh` is neither listed nor callable under any name, while `a`'s
/// `b__sh` still is.
#[test]
fn a_profile_exclusion_follows_its_tool_through_a_name_collision() {
    let d = Daemon::start_with(
        "[[profile]]\nname = \"safe\"\nexclude_tools = [{ bundle = \"a__b\", tool = \"sh\" }]\n",
    );
    let dir = d.root().join("bundles");
    for (name, alias) in [("a", "b__sh"), ("a__b", "sh")] {
        let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
        m["name"] = json!(name);
        m["server"]["mcp_config"]["env"]["DEMO_TOOL_ALIASES"] = json!(alias);
        write_bundle(&dir, name, &m);
        d.ok(&["install", dir.join(name).to_str().unwrap()]);
    }

    // Without a profile, the collision rule: `a`'s tool first.
    let all = Agent::connect(&d, &[]);
    assert_eq!(all.call("a__b__sh", json!({})).unwrap(), "tool b__sh");
    assert_eq!(all.call("a__b__sh__2", json!({})).unwrap(), "tool sh");
    let every = all.tool_names();

    let safe = Agent::connect(&d, &["--profile", "safe"]);
    let names = safe.tool_names();
    let expected: Vec<String> = every
        .iter()
        .filter(|n| n.as_str() != "a__b__sh__2")
        .cloned()
        .collect();
    assert_eq!(names, expected, "only `sh` of `a__b` is hidden");
    assert_eq!(safe.call("a__b__sh", json!({})).unwrap(), "tool b__sh");
    for name in ["a__b__sh__2", "a__b__sh__3"] {
        let err = safe.call(name, json!({})).unwrap_err();
        assert!(err.contains(name), "{name}: {err}");
    }
}

#[test]
fn profiles_and_registration_exclusions_hide_and_refuse() {
    let d = Daemon::start_with(
        "[[exclude_tools]]\nbundle = \"alpha\"\ntools = [\"env\"]\n\n[[profile]]\nname = \"limited\"\nbundles = [\"alpha\"]\nexclude_tools = [\"alpha__crash\"]\n",
    );
    install_demos(&d, &["alpha", "beta"]);

    // Registration exclusion: gone everywhere, also from `tools` and `call`.
    let tools = d.ok(&["tools", "alpha", "--json"]);
    assert!(!tools.contains("\"env\""), "{tools}");
    let out = d.cli(&["call", "alpha", "env", r#"{"name":"HOME"}"#]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no tool \"env\""));

    let all = Agent::connect(&d, &[]);
    let names = all.tool_names();
    assert!(names.contains(&"beta__env".to_string()) && !names.contains(&"alpha__env".to_string()));

    let limited = Agent::connect(&d, &["--profile", "limited"]);
    let names = limited.tool_names();
    assert!(names.iter().all(|n| n.starts_with("alpha__")), "{names:?}");
    assert!(!names.contains(&"alpha__crash".to_string()), "{names:?}");
    assert!(names.contains(&"alpha__echo".to_string()));
    let err = limited.call("alpha__crash", json!({})).unwrap_err();
    assert!(
        err.contains("not available in this profile") || err.contains("no \"alpha__crash\""),
        "{err}"
    );
    let err = limited
        .call("beta__echo", json!({"text": "x"}))
        .unwrap_err();
    assert!(err.contains("beta__echo"), "{err}");
    assert_eq!(
        limited.call("alpha__echo", json!({"text": "ok"})).unwrap(),
        "alpha:ok"
    );
    assert_eq!(
        d.bundle("default", "alpha").unwrap()["restarts"],
        0,
        "the refused crash never reached the bundle"
    );

    // An unknown profile fails at start with the configured names.
    let out = std::process::Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["mcp", "--profile", "nope"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configured: limited"));
}

/// The call right after a crash may reach the bundle actor before it has
/// learned of the exit (the session's transport is closed, the status board
/// still says ready): it must wait for the restart all the same, however
/// the two race.
#[test]
fn a_call_right_after_a_crash_waits_for_the_restart() {
    let d = Daemon::start_with(
        "[supervision]\nbackoff_initial = \"1ms\"\nbackoff_max = \"1ms\"\nmax_restarts = 100\n",
    );
    install_demos(&d, &["alpha"]);
    let agent = Agent::connect(&d, &[]);
    for round in 0..25 {
        assert!(agent.call("alpha__crash", json!({"code": 3})).is_err());
        assert_eq!(
            agent.call("alpha__echo", json!({"text": "back"})),
            Ok("alpha:back".to_string()),
            "round {round}"
        );
    }
}

#[test]
fn a_call_to_a_restarting_bundle_waits_for_it() {
    let d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let agent = Agent::connect(&d, &[]);
    let pid = d.bundle("default", "alpha").unwrap()["pid"]
        .as_u64()
        .unwrap();
    // The crash call itself fails (the process dies under it) ...
    assert!(agent.call("alpha__crash", json!({"code": 3})).is_err());
    // ... and the next call waits for the restart instead of failing.
    assert_eq!(
        agent.call("alpha__echo", json!({"text": "back"})).unwrap(),
        "alpha:back"
    );
    assert_ne!(
        d.bundle("default", "alpha").unwrap()["pid"]
            .as_u64()
            .unwrap(),
        pid
    );

    // A bundle that cannot come back: the call waits (bounded), then fails
    // with a clear error instead of hanging. (A restart runs the manifest
    // the bundle runs, so what breaks is its server program.)
    let server = d.root().join("bundles/alpha/server/bundlevisor-demo");
    std::fs::remove_file(&server).unwrap();
    std::fs::write(&server, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&server, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let quick = Agent::connect(&d, &["--wait-ready", "1s"]);
    assert_eq!(quick.tool_names().len(), common::DEMO_TOOLS);
    assert!(quick.call("alpha__crash", json!({"code": 3})).is_err());
    let started = std::time::Instant::now();
    let err = quick.call("alpha__echo", json!({"text": "x"})).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "bounded wait");
    assert!(
        err.contains("bundle \"alpha\" did not become ready within 1s")
            || err.contains("bundle \"alpha\" is failed"),
        "{err}"
    );
}

/// A daemon restart under an agent of `bundlevisor mcp`: the call in
/// flight is answered with an error at once (not left hanging), and the
/// agent's session goes on with the new daemon — the same session, no new
/// `initialize` — and is told its lists may have changed.
#[test]
fn the_stdio_session_survives_a_daemon_restart() {
    // The daemon serves the session on the agent's own stdio.
    survives_a_daemon_restart(&[]);
}

#[test]
fn a_relayed_stdio_session_survives_a_daemon_restart() {
    survives_a_daemon_restart(&["--relay"]);
}

fn survives_a_daemon_restart(extra: &[&str]) {
    let mut d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let log = d.root().join("mcp.log");
    let agent = Agent::connect_logged(&d, extra, Some(&log));
    assert_eq!(
        agent.call("alpha__echo", json!({"text": "before"})),
        Ok("alpha:before".to_string())
    );
    let peer = agent.peer().clone();
    let in_flight = agent
        .rt
        .spawn(async move { call(&peer, "alpha__sleep", json!({"ms": 60000})).await });
    wait_for(
        Duration::from_secs(10),
        "the sleep call to reach the bundle",
        || {
            let out = d.cli(&["logs", "alpha"]);
            String::from_utf8_lossy(&out.stdout)
                .contains("sleeping 60000 ms")
                .then_some(())
        },
    );
    if extra.is_empty() {
        // The daemon has told `bundlevisor mcp` of the open request.
        wait_for(Duration::from_secs(10), "the request announced", || {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            log.contains("is open at the daemon").then_some(())
        });
    }
    let changed_before = agent.recorder.count("tools_changed");
    // Killed: nothing of the daemon answers; `bundlevisor mcp` does.
    d.signal(nix::sys::signal::Signal::SIGKILL);
    let err = agent.rt.block_on(in_flight).unwrap().unwrap_err();
    assert!(err.contains("daemon went away"), "{err}");
    d.launch();
    // The bundle comes back with the daemon; the session waits for it.
    wait_for(Duration::from_secs(20), "a call after the restart", || {
        agent
            .call("alpha__echo", json!({"text": "after"}))
            .ok()
            .filter(|t| t == "alpha:after")
    });
    assert!(agent.recorder.count("tools_changed") > changed_before);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.contains("relaying this session"),
        "the daemon refused the descriptors: {log}"
    );
}

#[test]
fn the_daemon_ends_a_handed_over_session_when_bundlevisor_mcp_goes() {
    let d = Daemon::start();
    install_demos(&d, &["alpha"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut child = d.spawn_mcp(&[]);
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        stdin
            .write_all(format!("{init}\n").as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).await.unwrap();
        assert!(line.contains("\"serverInfo\""), "{line}");
        // The agent's server process is gone; the agent keeps its pipes.
        child.kill().await.unwrap();
        // The daemon holds the agent's stdout no longer: end of file.
        let rest = tokio::time::timeout(Duration::from_secs(10), async {
            let mut rest = String::new();
            stdout.read_line(&mut rest).await.map(|_| rest)
        })
        .await
        .expect("the daemon still holds the agent's stdout");
        assert_eq!(rest.unwrap(), "");
        drop(stdin);
    });
}

#[test]
fn descriptors_the_daemon_cannot_serve_are_refused_and_closed() {
    use std::io::{BufRead, IoSlice};
    use std::os::fd::AsRawFd;
    let d = Daemon::start();
    let file = std::fs::File::create(d.root().join("not-a-pipe")).unwrap();
    // A pipe the wrong way round: its write end as stdin, its read end as
    // stdout (the daemon would reopen them with its own rights).
    let (read, write) = nix::unistd::pipe().unwrap();
    for fds in [
        vec![file.as_raw_fd(), file.as_raw_fd()],
        vec![write.as_raw_fd(), read.as_raw_fd()],
        vec![],
    ] {
        let mut raw = d.raw();
        raw.hello();
        let r = raw.request(1, "gateway.attach", json!({"handover": true}));
        assert!(r.get("result").is_some(), "{r}");
        let rights = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let rights: &[_] = if fds.is_empty() { &[] } else { &rights };
        nix::sys::socket::sendmsg::<()>(
            raw.stream.as_raw_fd(),
            &[IoSlice::new(b"\n")],
            rights,
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .unwrap();
        let mut line = String::new();
        raw.reader.read_line(&mut line).unwrap();
        let note: Value = serde_json::from_str(&line).unwrap();
        let why = note["refused"].as_str().unwrap_or_else(|| panic!("{note}"));
        assert!(why.contains("stdin and stdout"), "{why}");
    }
    // The daemon keeps no copy of the file.
    wait_for(Duration::from_secs(10), "the descriptors closed", || {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid())).ok()?;
        let held = fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|target| target.ends_with("not-a-pipe"));
        (!held).then_some(())
    });
}

/// Issue 33, point 1: `bundlevisor mcp --bundle NAME` serves one bundle
/// exactly as itself over stdio: its own tool names (`echo`, not
/// `demo__echo`), its own server info, none of another bundle's tools and
/// no workspace files; an unknown bundle is refused at start (exit 2,
/// naming it).
#[test]
fn bundlevisor_mcp_serves_one_bundle_as_itself() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    d.ok(&["install", d.demo_bundle("second").to_str().unwrap()]);
    let agent = Agent::connect(&d, &["--bundle", "demo"]);
    let names = agent.tool_names();
    assert!(
        names.contains(&"echo".to_string()) && !names.iter().any(|n| n.contains("__")),
        "{names:?}"
    );
    assert_eq!(
        agent.call("echo", json!({"text": "itself"})).as_deref(),
        Ok("itself")
    );
    let info = agent.peer().peer_info().unwrap();
    // The bundle's own server info, not the gateway's.
    let name = info.server_info.as_ref().map(|i| i.name.clone());
    assert!(
        name.as_deref().is_some_and(|n| n != "bundlevisor"),
        "{info:?}"
    );
    let resources = agent
        .rt
        .block_on(agent.peer().list_all_resources())
        .unwrap();
    assert!(
        !resources.iter().any(|r| r.uri.starts_with("files://")),
        "{resources:?}"
    );
    drop(agent);

    let out = d.cli(&["mcp", "--bundle", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("nosuch"), "{said}");
}
