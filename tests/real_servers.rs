//! Real third-party MCP servers, pinned and built by `make servers`, run
//! unmodified as bundles: the official filesystem server with two
//! configured directories (a `multiple` user_config value, granted by the
//! sandbox read-write).

mod common;

use std::path::PathBuf;

use common::Daemon;
use serde_json::Value;

fn server(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/servers")
        .join(name);
    assert!(
        dir.join("manifest.json").is_file()
            && (dir.join("node_modules").is_dir() || dir.join(".venv").is_dir()),
        "the {name} server is not built at {}; run `make servers` (make test does)",
        dir.display()
    );
    dir
}

/// The text of a tool result, and whether it is an error.
fn call(d: &Daemon, tool: &str, args: Value) -> (String, bool) {
    let out = d.cli(&["call", "filesystem", tool, &args.to_string(), "--json"]);
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{tool}: {}", String::from_utf8_lossy(&out.stderr)));
    let text = result["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    (text, result["isError"] == true)
}

/// Issue 18: `@modelcontextprotocol/server-filesystem` with two configured
/// directories reads in one, writes in the other, and refuses a path
/// outside both.
#[test]
fn the_official_filesystem_server_works_in_two_configured_directories() {
    let d = Daemon::start();
    let root = d.root().join("data");
    let (docs, out, secret) = (root.join("docs"), root.join("out"), root.join("secret"));
    for dir in [&docs, &out, &secret] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(docs.join("hello.txt"), "hello from docs").unwrap();
    std::fs::write(secret.join("key.txt"), "do not read").unwrap();
    // The bundle runs under a uid of its own: the folder it writes is open
    // to it, as an operator would chown it.
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    let bundle = server("filesystem");
    let installed = d.cli(&["install", bundle.to_str().unwrap()]);
    assert!(
        !installed.status.success(),
        "installed without its directories"
    );
    assert_eq!(
        d.bundle("default", "filesystem").unwrap()["state"],
        "needs_config"
    );

    let set_docs = format!("allowed_directories={}", docs.display());
    let set_out = format!("allowed_directories={}", out.display());
    let configured = d.cli(&["configure", "filesystem", &set_docs, &set_out]);
    assert!(
        configured.status.success(),
        "{}{}",
        String::from_utf8_lossy(&configured.stdout),
        String::from_utf8_lossy(&configured.stderr)
    );
    let b = d.wait_state("default", "filesystem", "ready");
    let write = b["sandbox"]["write"].as_array().unwrap();
    for dir in [&docs, &out] {
        assert!(
            write.iter().any(|p| p == dir.to_str().unwrap()),
            "{} not granted: {write:?}",
            dir.display()
        );
    }

    let (text, error) = call(
        &d,
        "read_text_file",
        serde_json::json!({"path": docs.join("hello.txt")}),
    );
    assert!(!error && text.contains("hello from docs"), "{text}");
    let (text, error) = call(
        &d,
        "write_file",
        serde_json::json!({"path": out.join("new.txt"), "content": "written by the server"}),
    );
    assert!(!error, "{text}");
    assert_eq!(
        std::fs::read_to_string(out.join("new.txt")).unwrap(),
        "written by the server"
    );
    let (text, error) = call(
        &d,
        "read_text_file",
        serde_json::json!({"path": secret.join("key.txt")}),
    );
    assert!(error, "read outside the configured directories: {text}");
    assert!(!text.contains("do not read"), "{text}");
}

/// Issue 18, point 4: `[sandbox] pass_env` passes chosen daemon variables
/// (a proxy) through the scrub, and `read_write_paths` is granted; nothing
/// else is loosened.
#[test]
fn pass_env_and_read_write_paths_reach_the_bundle_and_nothing_else() {
    let mut d = Daemon::unlaunched(
        "[sandbox]\npass_env = [\"HTTPS_PROXY\"]\nread_write_paths = [\"shared\"]\n",
    );
    std::fs::create_dir_all(d.root().join("shared")).unwrap();
    d.env
        .push(("HTTPS_PROXY".into(), "http://proxy.example:3128".into()));
    d.env.push(("SECRET_TOKEN".into(), "never-passed".into()));
    d.launch();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let env = |name: &str| {
        d.ok(&[
            "call",
            "demo",
            "env",
            &serde_json::json!({ "name": name }).to_string(),
        ])
        .trim()
        .to_string()
    };
    assert_eq!(env("HTTPS_PROXY"), "http://proxy.example:3128");
    assert_eq!(env("SECRET_TOKEN"), "(unset)");
    let b = d.bundle("default", "demo").unwrap();
    let shared = d.root().join("shared");
    assert!(
        b["sandbox"]["write"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == shared.to_str().unwrap()),
        "{b}"
    );
}

/// Issue 18, point 6: a Node.js crash is reported by its exception line,
/// not by the runtime's closing banner (`Node.js v20…`).
#[test]
fn a_node_crash_is_reported_by_its_exception() {
    let d = Daemon::start_with("[supervision]\nmax_restarts = 1\nbackoff_initial = \"10ms\"\n");
    let b = common::shell_wrapped_demo(
        &d.root().join("bundles"),
        "throws",
        "node -e 'throw new TypeError(\"boom\")' || exit 1;",
    );
    let out = d.cli(&["install", b.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TypeError: boom"), "{err}");
    let failed = d.wait_state("default", "throws", "failed");
    let why = failed["last_error"].as_str().unwrap();
    assert!(why.contains("TypeError: boom"), "{why}");
    assert!(!why.ends_with("Node.js v20.20.2"), "{why}");
}

/// Issue 18, point 2: `@modelcontextprotocol/server-memory` with its
/// default `${HOME}/memory.jsonl` keeps what it learned across a daemon
/// restart: `${HOME}` is the bundle's own writable home.
#[test]
fn the_official_memory_server_keeps_its_graph_in_its_default_file() {
    let mut d = Daemon::start();
    let bundle = server("memory");
    d.ok(&["install", bundle.to_str().unwrap()]);
    let created = d.cli(&[
        "call",
        "memory",
        "create_entities",
        &serde_json::json!({"entities": [
            {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}
        ]})
        .to_string(),
        "--json",
    ]);
    let result: Value = serde_json::from_slice(&created.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&created.stderr)));
    assert_ne!(result["isError"], true, "{result}");
    let file = d.state.join("sandboxes/default/memory/data/memory.jsonl");
    assert!(
        std::fs::read_to_string(&file).is_ok_and(|t| t.contains("Ada")),
        "{} holds no Ada",
        file.display()
    );

    assert!(d.signal(nix::sys::signal::Signal::SIGTERM).success());
    d.launch();
    d.wait_state("default", "memory", "ready");
    let graph = d.ok(&["call", "memory", "read_graph", "{}"]);
    assert!(graph.contains("wrote the first program"), "{graph}");
}

/// Issue 18: `mcp-server-time` from PyPI, pinned, runs as a python bundle.
#[test]
fn the_official_time_server_runs_as_a_python_bundle() {
    let d = Daemon::start();
    let bundle = server("time");
    d.ok(&["install", bundle.to_str().unwrap()]);
    let now = d.ok(&[
        "call",
        "time",
        "get_current_time",
        r#"{"timezone":"Europe/Paris"}"#,
    ]);
    assert!(
        now.contains("Europe/Paris") && now.contains("datetime"),
        "{now}"
    );
    let converted = d.ok(&[
        "call",
        "time",
        "convert_time",
        r#"{"source_timezone":"UTC","time":"12:00","target_timezone":"Asia/Tokyo"}"#,
    ]);
    assert!(converted.contains("21:00"), "{converted}");
}

/// Issue 18, point 4: `[[sandbox.bundle]] configured_read_only` grants one
/// bundle's configured directories read-only — the kernel (Landlock), not
/// the server, refuses the write.
#[test]
fn one_bundles_configured_directories_can_be_read_only() {
    let d = Daemon::start_with(
        "[sandbox]\n[[sandbox.bundle]]\nbundle = \"filesystem\"\nconfigured_read_only = true\n",
    );
    let docs = d.root().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::set_permissions(&docs, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(docs.join("a.txt"), "readable").unwrap();
    let bundle = server("filesystem");
    let _ = d.cli(&["install", bundle.to_str().unwrap()]);
    let set = format!("allowed_directories={}", docs.display());
    d.ok(&["configure", "filesystem", &set]);
    let b = d.wait_state("default", "filesystem", "ready");
    let dir = docs.to_str().unwrap();
    assert!(
        b["sandbox"]["read"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == dir),
        "{b}"
    );
    assert!(
        !b["sandbox"]["write"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == dir),
        "{b}"
    );

    let (text, error) = call(
        &d,
        "read_text_file",
        serde_json::json!({"path": docs.join("a.txt")}),
    );
    assert!(!error && text.contains("readable"), "{text}");
    // The folder is writable by anyone (0777), so only Landlock stops this.
    let (text, error) = call(
        &d,
        "write_file",
        serde_json::json!({"path": docs.join("b.txt"), "content": "no"}),
    );
    assert!(error, "{text}");
    assert!(!docs.join("b.txt").exists());
}

/// Issue 18 with issue 15's rule: an admitted user other than the
/// daemon's may configure only directories it owns — each value of a
/// `multiple` key is checked.
#[test]
fn each_configured_directory_must_be_the_admitted_users_own() {
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        return; // acting as another user needs root
    }
    let d = Daemon::start_with(&format!("[control]\nallowed_gids = [{NOBODY}]\n"));
    let _ = d.cli(&["install", server("filesystem").to_str().unwrap()]);
    let (mine, also_mine, theirs) = (
        d.root().join("mine"),
        d.root().join("also-mine"),
        d.root().join("theirs"),
    );
    for dir in [&mine, &also_mine, &theirs] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for dir in [&mine, &also_mine] {
        nix::unistd::chown(dir, Some(nix::unistd::Uid::from_raw(NOBODY)), None).unwrap();
    }
    let as_nobody = |dirs: &[&PathBuf]| {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.arg("--socket")
            .arg(&d.socket)
            .args(["configure", "filesystem"]);
        for dir in dirs {
            cmd.arg(format!("allowed_directories={}", dir.display()));
        }
        cmd.uid(NOBODY)
            .gid(NOBODY)
            .current_dir("/")
            .output()
            .unwrap()
    };
    let refused = as_nobody(&[&mine, &theirs]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains(theirs.to_str().unwrap()) && err.contains("owned by uid 65534"),
        "{err}"
    );
    let ok = as_nobody(&[&mine, &also_mine]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
