//! Issue 34's operator scenario, repeated with real third-party servers
//! (pinned and built by `make servers` and `make uv`): a root daemon
//! watches a folder, and the operator drops into it the official
//! filesystem server (a required folder, prepared for the user the
//! operator chose), the official everything server with a required
//! secret, and the official time server as a uv bundle — each a `.mcpb`
//! packed by the official CLI — and the time server in a venv (a folder:
//! a venv's links lead outside it, which an archive may not hold). Every
//! bundle runs under a uid of its own, answers through the CLI and the
//! HTTP gateway, and leaves nothing behind once its file is removed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{free_port, wait_for, Daemon};
use serde_json::{json, Value};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const SECRET: &str = "sk-scenario-7f3a91";

fn built(name: &str) -> PathBuf {
    let dir = Path::new(REPO).join("target/servers").join(name);
    assert!(
        dir.join("manifest.json").is_file(),
        "the {name} server is not built at {}; run `make servers` (make test does)",
        dir.display()
    );
    dir
}

/// `cp -a from to`: links, modes and owners kept, as an operator copies.
fn copy(from: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The state a bundle reaches within `limit` (a uv build may download).
fn settles(d: &Daemon, name: &str, state: &str, limit: Duration) -> Value {
    wait_for(limit, &format!("{name} to be {state}"), || {
        d.bundle("default", name).filter(|b| b["state"] == state)
    })
}

/// The text of the answer to a stateless tool call through the gateway.
async fn gateway_call(url: &str, token: &str, tool: &str, arguments: Value) -> String {
    let params = json!({"name": tool, "arguments": arguments});
    let (status, messages) =
        common::post_2026(url, token, "tools/call", tool, params, json!({})).await;
    let answer = messages.iter().find(|m| m["id"] == 7).cloned();
    let answer = answer.unwrap_or_else(|| panic!("{tool}: {status} {messages:?}"));
    assert_ne!(answer["result"]["isError"], true, "{tool}: {answer}");
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{tool}: {answer}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_servers_dropped_into_a_watched_folder_run_as_root_and_leave_nothing() {
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("a user named nobody");
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n{}\
         [sandbox]\n[[sandbox.bundle]]\nbundle = \"filesystem\"\nuser = \"nobody\"\n",
        common::uv_config()
    ));
    let (work, watched) = (d.root().join("work"), d.root().join("watched"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&watched).unwrap();

    // Packed by the official CLI; the everything server given a required
    // secret its process gets in its environment.
    common::mcpb_pack(&built("filesystem"), &work.join("filesystem.mcpb"));
    copy(&built("everything"), &work.join("everything"));
    let manifest_file = work.join("everything/manifest.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_file).unwrap()).unwrap();
    manifest["user_config"] = json!({"api_key": {"type": "string", "title": "API key",
        "description": "The service's key", "required": true, "sensitive": true}});
    manifest["server"]["mcp_config"]["env"] = json!({"SCENARIO_API_KEY": "${user_config.api_key}"});
    std::fs::write(&manifest_file, manifest.to_string()).unwrap();
    common::mcpb_pack(&work.join("everything"), &work.join("everything.mcpb"));
    copy(
        &Path::new(REPO).join("tests/servers/time-uv"),
        &work.join("time-uv"),
    );
    common::mcpb_pack(&work.join("time-uv"), &work.join("time-uv.mcpb"));
    copy(&built("time"), &work.join("time"));
    for dropped in ["filesystem.mcpb", "everything.mcpb", "time-uv.mcpb", "time"] {
        std::fs::rename(work.join(dropped), watched.join(dropped)).unwrap();
    }

    let minute = Duration::from_secs(60);
    settles(&d, "filesystem", "needs_config", minute);
    settles(&d, "everything", "needs_config", minute);
    settles(&d, "time", "ready", minute);
    settles(&d, "time-uv", "ready", Duration::from_secs(180));

    // The folder is prepared for the user the operator chose, before the
    // bundle's uid is known; what the server writes is that user's.
    let notes = d.root().join("srv/notes");
    std::fs::create_dir_all(&notes).unwrap();
    nix::unistd::chown(&notes, Some(nobody.uid), Some(nobody.gid)).unwrap();
    std::fs::set_permissions(&notes, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    d.ok(&[
        "configure",
        "filesystem",
        &format!("allowed_directories={}", notes.display()),
    ]);
    let out = d.cli_with_stdin(&["configure", "everything", "api_key=-"], SECRET);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let everything = settles(&d, "everything", "ready", minute);
    let filesystem = settles(&d, "filesystem", "ready", minute);
    assert_eq!(
        filesystem["sandbox"]["uid"],
        nobody.uid.as_raw(),
        "{filesystem}"
    );

    // Each runs under a uid of its own, none of them root.
    let status = d.status();
    let bundles = status["bundles"].as_array().unwrap();
    let mut uids: Vec<u64> = bundles
        .iter()
        .map(|b| b["sandbox"]["uid"].as_u64().unwrap_or(0))
        .collect();
    uids.sort();
    uids.dedup();
    assert!(uids.len() == 4 && !uids.contains(&0), "{status}");

    // The secret reaches the process, and nothing the operator reads.
    let pid = everything["pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let wanted = format!("SCENARIO_API_KEY={SECRET}");
    assert!(
        environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()),
        "the secret is not in the bundle's environment"
    );
    for (what, text) in [
        ("status", status.to_string()),
        ("the daemon log", d.log()),
        ("configure's listing", d.ok(&["configure", "everything"])),
    ] {
        assert!(!text.contains(SECRET), "the secret is in {what}");
    }

    // Through the CLI and through the HTTP gateway.
    let today = notes.join("today.md");
    let args = json!({"path": today, "content": "written by the filesystem server"});
    d.ok(&["call", "filesystem", "write_file", &args.to_string()]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&today).unwrap().uid(),
        nobody.uid.as_raw()
    );
    let token = d.ok(&["token", "create"]).trim().to_string();
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let read = gateway_call(
        &url,
        &token,
        "filesystem__read_text_file",
        json!({"path": today}),
    )
    .await;
    assert!(read.contains("written by the filesystem server"), "{read}");
    let echo = gateway_call(&url, &token, "everything__echo", json!({"message": "hi"})).await;
    assert!(echo.contains("hi"), "{echo}");
    for time in ["time", "time-uv"] {
        let tool = format!("{time}__get_current_time");
        let now = gateway_call(&url, &token, &tool, json!({"timezone": "Asia/Tokyo"})).await;
        assert!(now.contains("Asia/Tokyo"), "{time}: {now}");
        let now = d.ok(&["call", time, "get_current_time", r#"{"timezone":"UTC"}"#]);
        assert!(now.contains("UTC"), "{time}: {now}");
    }

    // Removed from the folder: uninstalled, and no process of theirs left.
    for dropped in ["filesystem.mcpb", "everything.mcpb", "time-uv.mcpb"] {
        std::fs::remove_file(watched.join(dropped)).unwrap();
    }
    std::fs::remove_dir_all(watched.join("time")).unwrap();
    wait_for(minute, "every dropped bundle uninstalled", || {
        d.status()["bundles"]
            .as_array()
            .unwrap()
            .is_empty()
            .then_some(())
    });
    wait_for(minute, "no bundle process left", || {
        d.bundle_processes().is_empty().then_some(())
    });
    let ours = |uid: u32| {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .any(|m| m.is_dir() && m.uid() == uid)
    };
    for uid in uids
        .iter()
        .filter(|u| **u != u64::from(nobody.uid.as_raw()))
    {
        assert!(
            !ours(*uid as u32),
            "a process of uid {uid} outlived its bundle"
        );
    }
}
