//! Issue 32, "Tests: bundles": bundles on four MCP SDKs ask their client for
//! input, and agents on four SDKs, in each revision they speak, answer them
//! through the daemon's gateway. Every bundle has `greet`, which elicits a
//! `name` and answers `hello NAME` (with ` (on REVISION)` where the SDK tells
//! the tool the revision it served), and `ponder`, which samples the
//! client's model and answers `the model said TEXT`.
//!
//! The daemon speaks to each bundle in the newest revision the bundle speaks
//! (`status --json` `mcp.revision`). A bundle on 2026-07-28 asks by
//! `input_required`, one on 2025-11-25 by a request during the call; an
//! agent on 2026-07-28 is asked by the gateway's `input_required`, one on
//! 2025-11-25 by a request on its session. Every pairing is a different
//! path through the bridge, and each must end with the bundle's answer
//! carrying what the agent said.
//!
//! The bundles, each pinned and built by a make target that `make test`
//! runs:
//! - py-asker: the Python SDK `mcp` 2.3.0 `MCPServer` (`make mcp-py2-bundle`);
//! - fastmcp-asker: fastmcp 4.1.6's `FastMCP` (tests/fastmcp/bundle);
//! - ts1-asker: the TypeScript SDK 1.32.2's `McpServer` (tests/ts-sdk/bundle);
//! - ts2-asker: the TypeScript SDK 2 server 2.4.0's `McpServer` served by
//!   `serveStdio` (tests/ts-sdk2/bundle);
//!
//! the last three by `make asker-bundles`. The agents (one script each, in
//! the folder of its SDK's pin) print one line per call.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Daemon};

/// How long one agent may take for all its calls (a Python agent imports
/// its SDK first, on a machine that may be building).
const AGENT_LIMIT: Duration = Duration::from_secs(120);

/// A bundle of the matrix: where `make` builds it, and what its SDK says.
struct Asker {
    name: &'static str,
    dir: &'static str,
    make: &'static str,
    /// The revision the daemon speaks to it in: the newest its SDK speaks.
    revision: &'static str,
    /// Whether `greet` names the revision (the SDK tells the tool).
    greet_says_revision: bool,
    /// Whether `ponder` names the revision too (py-asker's does).
    ponder_says_revision: bool,
}

const ASKERS: [Asker; 4] = [
    Asker {
        name: "py-asker",
        dir: "target/mcp-py2-bundle",
        make: "mcp-py2-bundle",
        revision: "2026-07-28",
        greet_says_revision: true,
        ponder_says_revision: true,
    },
    Asker {
        name: "fastmcp-asker",
        dir: "target/fastmcp-asker-bundle",
        make: "asker-bundles",
        revision: "2026-07-28",
        greet_says_revision: true,
        ponder_says_revision: false,
    },
    Asker {
        name: "ts1-asker",
        dir: "target/ts1-asker-bundle",
        make: "asker-bundles",
        revision: "2025-11-25",
        greet_says_revision: false,
        ponder_says_revision: false,
    },
    Asker {
        name: "ts2-asker",
        dir: "target/ts2-asker-bundle",
        make: "asker-bundles",
        revision: "2026-07-28",
        greet_says_revision: true,
        ponder_says_revision: false,
    },
];

impl Asker {
    /// What `tool` answers an agent that gives `name` and whose model says
    /// `said`.
    fn answer(&self, tool: &str, name: &str, said: &str) -> String {
        let (text, says_revision) = match tool {
            "greet" => (format!("hello {name}"), self.greet_says_revision),
            "ponder" => (format!("the model said {said}"), self.ponder_says_revision),
            _ => unreachable!("the matrix calls greet and ponder"),
        };
        if says_revision {
            format!("{text} (on {})", self.revision)
        } else {
            text
        }
    }
}

/// An agent configuration of the matrix.
struct Agent {
    label: &'static str,
    /// The revision it takes with the gateway.
    protocol: &'static str,
    /// The name it gives when elicited, and what its model says.
    name: &'static str,
    said: &'static str,
    /// Its command line, given the daemon, the gateway URL and a token;
    /// the bundles' names follow.
    command: fn(&Daemon, &str, &str) -> Command,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `path` under the crate, which `make TARGET` installs.
fn installed(path: &str, target: &str) -> PathBuf {
    let path = root().join(path);
    assert!(
        path.exists(),
        "{} is not installed; run `make {target}` (make test does)",
        path.display()
    );
    path
}

fn python(venv: &str, make: &str, script: &str) -> Command {
    let mut command = Command::new(installed(&format!("{venv}/bin/python"), make));
    command.arg(root().join(script));
    command
}

/// The Python SDK 2.3 agent in `mode` on the HTTP gateway.
fn py2_http(mode: &str, url: &str, token: &str) -> Command {
    let mut command = python("target/mcp-py2/venv", "mcp-py2", "tests/mcp-py2/matrix.py");
    command.args([mode, "http", url, token]);
    command
}

/// The Python SDK 2.3 agent in `mode` on `bundlevisor --socket SOCKET mcp`.
fn py2_stdio(mode: &str, d: &Daemon) -> Command {
    let mut command = python("target/mcp-py2/venv", "mcp-py2", "tests/mcp-py2/matrix.py");
    command
        .args([mode, "stdio", env!("CARGO_BIN_EXE_bundlevisor")])
        .arg(&d.socket);
    command
}

fn node(dir: &str, make: &str, args: &[&str]) -> Command {
    let script = installed(&format!("{dir}/matrix.mjs"), make);
    let mut command = Command::new("node");
    command.arg(script).args(args);
    command
}

const AGENTS: [Agent; 8] = [
    Agent {
        label: "Python mcp 2.3.0, legacy, HTTP",
        protocol: "2025-11-25",
        name: "Ada",
        said: "forty-two from python",
        command: |_, url, token| py2_http("legacy", url, token),
    },
    Agent {
        label: "Python mcp 2.3.0, auto, HTTP",
        protocol: "2026-07-28",
        name: "Ada",
        said: "forty-two from python",
        command: |_, url, token| py2_http("auto", url, token),
    },
    Agent {
        label: "Python mcp 2.3.0, legacy, bundlevisor mcp (stdio)",
        protocol: "2025-11-25",
        name: "Ada",
        said: "forty-two from python",
        command: |d, _, _| py2_stdio("legacy", d),
    },
    Agent {
        label: "Python mcp 2.3.0, auto, bundlevisor mcp (stdio)",
        protocol: "2026-07-28",
        name: "Ada",
        said: "forty-two from python",
        command: |d, _, _| py2_stdio("auto", d),
    },
    Agent {
        label: "fastmcp 4.1.6, HTTP",
        protocol: "2026-07-28",
        name: "Fern",
        said: "forty-two from fastmcp",
        command: |_, url, token| {
            let mut command = python("target/fastmcp/venv", "fastmcp", "tests/fastmcp/matrix.py");
            command.args([url, token]);
            command
        },
    },
    Agent {
        label: "TypeScript SDK 2.4.0, default, HTTP",
        protocol: "2025-11-25",
        name: "Tess",
        said: "forty-two from typescript 2",
        command: |_, url, token| node("target/ts-sdk2", "asker-bundles", &[url, token, "default"]),
    },
    Agent {
        label: "TypeScript SDK 2.4.0, versionNegotiation auto, HTTP",
        protocol: "2026-07-28",
        name: "Tess",
        said: "forty-two from typescript 2",
        command: |_, url, token| node("target/ts-sdk2", "asker-bundles", &[url, token, "auto"]),
    },
    Agent {
        label: "TypeScript SDK 1.32.2, HTTP",
        protocol: "2025-11-25",
        name: "Theo",
        said: "forty-two from typescript 1",
        command: |_, url, token| node("target/ts-sdk", "asker-bundles", &[url, token]),
    },
];

/// A daemon with the HTTP gateway and the four asker bundles: the daemon,
/// the workspace's MCP URL and a token.
fn daemon_with_askers() -> (Daemon, String, String) {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    for asker in &ASKERS {
        let dir = installed(&format!("{}/.installed", asker.dir), asker.make);
        d.ok(&["install", dir.parent().unwrap().to_str().unwrap()]);
    }
    let token = d.ok(&["token", "create"]).trim().to_string();
    (d, format!("http://127.0.0.1:{port}/mcp/default"), token)
}

/// What an agent printed, and how it ended; an agent still running after
/// [`AGENT_LIMIT`] is killed and says so.
fn run(d: &Daemon, agent: &Agent, url: &str, token: &str) -> (Vec<String>, String) {
    let out = d.root().join("agent.stdout");
    let err = d.root().join("agent.stderr");
    let mut command = (agent.command)(d, url, token);
    command
        .args(ASKERS.iter().map(|a| a.name))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let deadline = Instant::now() + AGENT_LIMIT;
    let ended = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.to_string();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break format!("killed after {AGENT_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let lines = said.lines().map(str::to_string).collect();
    (lines, format!("{ended}\n{stderr}"))
}

/// The revision of each bundle is the newest its SDK speaks; then every
/// agent configuration calls `greet` and `ponder` on every bundle, and each
/// answer carries the agent's name and its model's words. Every mismatch is
/// reported at once, with the whole matrix.
#[test]
fn every_agent_answers_every_bundles_elicitation_and_sampling() {
    let started = Instant::now();
    let (d, url, token) = daemon_with_askers();
    let mut found = String::new();
    for asker in &ASKERS {
        let mcp = d.bundle("default", asker.name).expect(asker.name)["mcp"].clone();
        writeln!(found, "{:<14} speaks {}", asker.name, mcp["revision"]).unwrap();
        assert_eq!(mcp["revision"], asker.revision, "{}: {mcp}", asker.name);
    }
    println!("bundles (set up in {:?}):\n{found}", started.elapsed());

    let mut matrix = String::new();
    let mut wrong = Vec::new();
    for agent in &AGENTS {
        let began = Instant::now();
        let (lines, ended) = run(&d, agent, &url, &token);
        let mut expected = vec![format!("protocol {}", agent.protocol)];
        for asker in &ASKERS {
            for tool in ["greet", "ponder"] {
                let answer = asker.answer(tool, agent.name, agent.said);
                expected.push(format!("{} {tool} {answer}", asker.name));
            }
        }
        writeln!(matrix, "{} ({:?}):", agent.label, began.elapsed()).unwrap();
        for (i, want) in expected.iter().enumerate() {
            let got = lines.get(i).map(String::as_str).unwrap_or("(nothing)");
            let mark = if got == want { "ok  " } else { "FAIL" };
            writeln!(matrix, "  {mark} {got}").unwrap();
            if got != want {
                wrong.push(format!("{}: expected {want:?}, got {got:?}", agent.label));
            }
        }
        if lines.len() != expected.len() || !ended.starts_with("exit status: 0") {
            wrong.push(format!(
                "{}: {} lines, ended {ended}",
                agent.label,
                lines.len()
            ));
        }
    }
    println!("matrix:\n{matrix}");
    println!("whole test: {:?}", started.elapsed());
    assert!(
        wrong.is_empty(),
        "{} of the matrix failed:\n{}\n\nmatrix:\n{matrix}\ndaemon log:\n{}",
        wrong.len(),
        wrong.join("\n"),
        d.log()
    );
}
