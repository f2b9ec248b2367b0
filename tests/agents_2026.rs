//! Issue 32, "Tests: agents": real third-party MCP agents against the
//! daemon's HTTP gateway. Each one lists the tools, calls `demo__echo`,
//! reads a workspace file (`files://ID`), gets the demo's prompt `ask` (the
//! bundle samples the agent while serving it), calls the demo's `confirm`
//! tool (the bundle elicits twice), then hears that the tool list changed
//! when the test installs a second bundle.
//!
//! On 2026-07-28 the bundle's requests reach the agent as `input_required`
//! results that the agent's SDK answers and retries, and the change comes on
//! a `subscriptions/listen` stream; on 2025-11-25 they are requests and a
//! notification on the agent's session.
//!
//! The agents, each pinned and installed by a make target that `make test`
//! runs:
//! - fastmcp 4.1.6's `Client` (PyPI, tests/fastmcp, `make fastmcp`), in its
//!   default mode ("auto"), which takes 2026-07-28;
//! - the MCP TypeScript SDK 2 client (npm `@modelcontextprotocol/client`
//!   2.4.0, tests/ts-sdk2, `make ts-sdk2`), whose default is the 2025
//!   handshake (2025-11-25), and which takes 2026-07-28 when told to
//!   negotiate (`versionNegotiation` "auto" or a pinned version).
//!
//! Each agent prints one line per step; the test reads them as they come
//! and installs the second bundle once the agent says it is listening.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use common::{free_port, Daemon};
use serde_json::Value;

/// How long one step of an agent may take (a Python agent imports its SDK
/// before its first line, on a machine that may be building).
const STEP: Duration = Duration::from_secs(60);

/// A daemon with the HTTP gateway and the demo bundle, a file in its
/// workspace, and a token: the daemon, the workspace's MCP URL, the token
/// and the file's id.
fn gateway(file: &[u8]) -> (Daemon, String, String, String) {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let id = d.put_file("for-the-agent.txt", file);
    let token = d.ok(&["token", "create"]).trim().to_string();
    (d, format!("http://127.0.0.1:{port}/mcp/default"), token, id)
}

use common::installed;

/// A running agent: its stdout lines as they come, its stderr in a file of
/// the daemon's folder. Killed when dropped, so a failed test leaves no
/// agent waiting.
struct Agent {
    child: Child,
    lines: Receiver<String>,
    stderr: PathBuf,
    daemon_log: PathBuf,
}

impl Agent {
    fn start(d: &Daemon, command: &mut Command) -> Agent {
        let stderr = d.root().join("agent.stderr");
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Agent {
            child,
            lines,
            stderr,
            daemon_log: d.root().join("daemon.log"),
        }
    }

    /// What the agent and the daemon wrote to their logs.
    fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "agent's stderr:\n{}\ndaemon log:\n{}",
            read(&self.stderr),
            read(&self.daemon_log)
        )
    }

    /// The agent's next line, which tells `what`.
    fn next(&self, what: &str) -> String {
        match self.lines.recv_timeout(STEP) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                panic!(
                    "the agent said nothing about {what} in {STEP:?}\n{}",
                    self.logs()
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the agent ended before it said {what}\n{}", self.logs())
            }
        }
    }

    /// The agent's next line as JSON.
    fn next_json(&self, what: &str) -> Value {
        let line = self.next(what);
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}\n{}", self.logs()))
    }

    /// Waits for the agent to end, and checks it ended well.
    fn finish(mut self) {
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the agent exited {status}\n{}",
            self.logs()
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The demo's `confirm` answer: both replies accepted with `{"ok": true}`.
fn assert_two_accepts(text: &str) {
    let replies: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the confirm result is not JSON ({e}): {text}"));
    let replies = replies.as_array().expect("an array of replies");
    assert_eq!(replies.len(), 2, "{text}");
    for reply in replies {
        assert_eq!(reply["action"], "accept", "{text}");
        assert_eq!(reply["content"]["ok"], true, "{text}");
    }
}

#[test]
fn a_fastmcp_4_agent_on_2026_07_28_lists_calls_reads_is_asked_and_hears_of_changes() {
    let python = installed("target/fastmcp/venv/bin/python", "fastmcp");
    let script = installed("tests/fastmcp/agent.py", "fastmcp");
    let (d, url, token, id) = gateway(b"a workspace file, read by fastmcp");
    let agent = Agent::start(
        &d,
        Command::new(python).arg(script).args([&url, &token, &id]),
    );

    assert_eq!(agent.next("the protocol"), "protocol 2026-07-28");
    let tools = agent.next("tools/list");
    let names: Vec<&str> = tools.split(' ').collect();
    assert_eq!(names[0], "tools", "{tools}");
    assert!(names.contains(&"demo__echo"), "{tools}");
    assert!(names.contains(&"demo__confirm"), "{tools}");
    assert_eq!(agent.next("tools/call"), "call from fastmcp 4.1.6");
    assert_eq!(
        agent.next("resources/read"),
        "read a workspace file, read by fastmcp"
    );
    let prompt = agent.next("prompts/get");
    assert!(
        prompt.starts_with("prompt the client's answer: ")
            && prompt.contains("forty-two from fastmcp"),
        "{prompt}"
    );
    let confirm = agent.next("the confirm call");
    let replies = confirm
        .strip_prefix("confirm ")
        .unwrap_or_else(|| panic!("{confirm}"));
    assert_two_accepts(replies);
    assert_eq!(agent.next("the questions"), "asked confirm 1? | confirm 2?");
    assert_eq!(agent.next("its subscription"), "listening tools");

    d.ok(&["install", d.demo_bundle("demo2").to_str().unwrap()]);
    assert_eq!(agent.next("the list change"), "tools changed");
    let after = agent.next("the new list");
    assert!(after.split(' ').any(|t| t == "demo2__echo"), "{after}");
    agent.finish();
}

/// The TypeScript SDK 2 agent in `mode` ("default", "auto" or a version to
/// pin): it must negotiate `protocol` in `era`, do every step, and hear of
/// the change on `listening` ("subscriptions/listen" or "session").
fn typescript_sdk_2_agent(mode: &str, protocol: &str, era: &str, listening: &str) {
    let script = installed("target/ts-sdk2/agent.mjs", "ts-sdk2");
    let (d, url, token, id) = gateway(b"a workspace file, read by the TypeScript SDK 2");
    let agent = Agent::start(
        &d,
        Command::new("node")
            .arg(script)
            .args([&url, &token, &id])
            .arg(mode),
    );

    let hello = agent.next_json("the protocol");
    assert_eq!(hello["protocol"], protocol, "{hello}");
    assert_eq!(hello["era"], era, "{hello}");
    let tools = agent.next_json("tools/list");
    let names = tools["tools"].as_array().expect("tools");
    assert!(names.iter().any(|t| t == "demo__echo"), "{tools}");
    assert!(names.iter().any(|t| t == "demo__confirm"), "{tools}");
    assert_eq!(
        agent.next_json("tools/call")["call"],
        "from the TypeScript SDK 2"
    );
    let read = agent.next_json("resources/read");
    assert_eq!(
        read["read"], "a workspace file, read by the TypeScript SDK 2",
        "{read}"
    );
    assert_eq!(read["mime"], "text/plain", "{read}");
    let prompt = agent.next_json("prompts/get");
    let text = prompt["prompt"].as_str().expect("the prompt's text");
    assert!(
        text.starts_with("the client's answer: ") && text.contains("forty-two from typescript"),
        "{prompt}"
    );
    let confirm = agent.next_json("the confirm call");
    assert_eq!(confirm["error"], false, "{confirm}");
    assert_two_accepts(confirm["confirm"].as_str().expect("the confirm result"));
    assert_eq!(
        confirm["asked"],
        serde_json::json!(["confirm 1?", "confirm 2?"]),
        "{confirm}"
    );
    let listen = agent.next_json("its subscription");
    assert_eq!(listen["listening"], listening, "{listen}");
    if listening == "subscriptions/listen" {
        assert_eq!(listen["honored"]["toolsListChanged"], true, "{listen}");
    }

    d.ok(&["install", d.demo_bundle("demo2").to_str().unwrap()]);
    assert_eq!(agent.next_json("the list change")["tools_changed"], true);
    let after = agent.next_json("the new list");
    assert!(
        after["tools_after"]
            .as_array()
            .expect("tools_after")
            .iter()
            .any(|t| t == "demo2__echo"),
        "{after}"
    );
    agent.finish();
}

/// Its default (no `versionNegotiation`: "legacy") is the 2025 handshake.
#[test]
fn the_typescript_sdk_2_agent_by_default_speaks_2025_11_25_and_does_every_step() {
    typescript_sdk_2_agent("default", "2025-11-25", "legacy", "session");
}

/// `versionNegotiation: {mode: "auto"}`: it probes `server/discover` and
/// takes 2026-07-28.
#[test]
fn the_typescript_sdk_2_agent_negotiating_auto_takes_2026_07_28_and_does_every_step() {
    typescript_sdk_2_agent("auto", "2026-07-28", "modern", "subscriptions/listen");
}

/// `versionNegotiation: {mode: {pin: "2026-07-28"}}`.
#[test]
fn the_typescript_sdk_2_agent_pinned_to_2026_07_28_does_every_step() {
    typescript_sdk_2_agent("2026-07-28", "2026-07-28", "modern", "subscriptions/listen");
}
