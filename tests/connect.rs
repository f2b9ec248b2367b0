//! Issue 36, point 4: `bundlevisor connect CLIENT` adds the gateway to an
//! agent's MCP client beside its other servers — and the entry it writes
//! works: run as the client would run it (stdio), or reached with the
//! token it carries (HTTP).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::{free_port, http_agent, Daemon, BIN};
use serde_json::{json, Value};

fn read(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The tools an MCP client sees through a stdio server entry: its command
/// run with its args, initialize, then tools/list (JSON lines).
fn tools_through(entry: &Value) -> Vec<String> {
    let args: Vec<String> = serde_json::from_value(entry["args"].clone()).unwrap();
    let mut child = Command::new(entry["command"].as_str().unwrap())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ask =
        |stdin: &mut std::process::ChildStdin, id: u64, method: &str, params: Value| -> Value {
            let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            writeln!(stdin, "{line}").unwrap();
            loop {
                let v: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        };
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "connect-test", "version": "1"}});
    assert!(ask(&mut stdin, 1, "initialize", init)["result"].is_object());
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let listed = ask(&mut stdin, 2, "tools/list", json!({}));
    drop(stdin);
    let _ = child.wait();
    (listed["result"]["tools"].as_array().unwrap().iter())
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_stdio_entry_is_added_beside_the_clients_others_and_works() {
    let d = Daemon::start_with("[[profile]]\nname = \"p\"\n");
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let file = d.root().join("project/.vscode/mcp.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let theirs = json!({
        "inputs": [{"type": "promptString", "id": "key", "password": true}],
        "servers": {"other": {"type": "stdio", "command": "other-server"}}
    });
    std::fs::write(&file, theirs.to_string()).unwrap();
    let path = file.to_str().unwrap();
    d.ok(&["connect", "vscode", "--file", path]);
    let config = read(&file);
    assert_eq!(config["inputs"], theirs["inputs"], "the rest is kept");
    assert_eq!(config["servers"]["other"], theirs["servers"]["other"]);
    let entry = &config["servers"]["bundlevisor-default"];
    assert_eq!(entry["type"], "stdio", "{config}");
    assert_eq!(entry["command"], BIN);
    assert!(tools_through(entry).contains(&"demo__echo".to_string()));

    // A profile the daemon does not have is refused at once, naming the
    // ones it has, and the file is left as it was.
    let before = std::fs::read(&file).unwrap();
    let out = d.cli(&[
        "connect",
        "vscode",
        "--file",
        path,
        "--profile",
        "nope",
        "--name",
        "x",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no profile \"nope\""), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), before);

    // The same name again is refused and the file left as it was; --force
    // replaces the entry.
    let before = std::fs::read(&file).unwrap();
    let out = d.cli(&["connect", "vscode", "--file", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("already has a server named \"bundlevisor-default\"")
            && said.contains("--force"),
        "{said}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), before);
    d.ok(&[
        "connect",
        "vscode",
        "--file",
        path,
        "--force",
        "--profile",
        "p",
        "--name",
        "bundlevisor-default",
    ]);
    let args = read(&file)["servers"]["bundlevisor-default"]["args"].clone();
    assert!(
        args.as_array().unwrap().contains(&json!("--profile")),
        "{args}"
    );

    // A file that is not JSON is not touched.
    let broken = d.root().join("broken.json");
    std::fs::write(&broken, "{ not json").unwrap();
    let out = d.cli(&["connect", "cursor", "--file", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not JSON"));
    assert_eq!(std::fs::read_to_string(&broken).unwrap(), "{ not json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_entry_carries_a_token_of_its_own_that_reaches_the_gateway() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let file = d.root().join(".mcp.json");
    std::fs::write(&file, r#"{"mcpServers": {"mine": {"command": "x"}}}"#).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    d.ok(&[
        "connect",
        "claude-code",
        "--http",
        &base,
        "--file",
        file.to_str().unwrap(),
    ]);
    let config = read(&file);
    assert_eq!(config["mcpServers"]["mine"], json!({"command": "x"}));
    let entry = &config["mcpServers"]["bundlevisor-default"];
    assert_eq!(entry["type"], "http");
    assert_eq!(entry["url"], format!("{base}/mcp/default"));
    let header = entry["headers"]["Authorization"].as_str().unwrap();
    let token = header.strip_prefix("Bearer ").unwrap();
    let agent = http_agent(entry["url"].as_str().unwrap(), token)
        .await
        .unwrap();
    let tools = agent.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "demo__echo"));
    agent.cancel().await.unwrap();
    let listed = d.ok(&["token", "ls"]);
    assert!(listed.contains("bundlevisor-default-"), "{listed}");
    assert!(!listed.contains(token), "the text never listed");
    // A file holding a token is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let fresh = d.root().join("fresh/mcp.json");
    d.ok(&[
        "connect",
        "cursor",
        "--http",
        &base,
        "--file",
        fresh.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // Claude Desktop's file runs local servers only: said, nothing made.
    let tokens = d.ok(&["token", "ls"]).lines().count();
    let desktop = d.root().join("claude_desktop_config.json");
    let out = d.cli(&[
        "connect",
        "claude-desktop",
        "--http",
        &base,
        "--file",
        desktop.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("runs local servers only"));
    assert!(!desktop.exists());
    assert_eq!(d.ok(&["token", "ls"]).lines().count(), tokens);
    // An entry that cannot be written takes its token back: /proc takes
    // no new file, even from root.
    let out = d.cli(&[
        "connect",
        "cursor",
        "--http",
        &base,
        "--file",
        "/proc/bv-connect.json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write /proc/bv-connect.json"));
    assert_eq!(
        d.ok(&["token", "ls"]).lines().count(),
        tokens,
        "the token revoked"
    );
    // A link is followed: the file it names gets the entry, the link stays.
    let target = d.root().join("dotfiles/cursor.json");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, "{}").unwrap();
    let link = d.root().join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    d.ok(&["connect", "cursor", "--file", link.to_str().unwrap()]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        read(&target)["mcpServers"]["bundlevisor-default"]["command"],
        BIN
    );
    // --print writes nothing and shows the client's own shape.
    let printed: Value =
        serde_json::from_str(&d.ok(&["connect", "claude-desktop", "--print"])).unwrap();
    assert_eq!(printed["mcpServers"]["bundlevisor-default"]["command"], BIN);
}
