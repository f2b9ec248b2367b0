//! Bad manifests and the host-capability gate, through the real CLI and daemon.

mod common;

use common::{write_bundle, Daemon, DEMO_MANIFEST};
use serde_json::{json, Value};

#[test]
fn a_manifest_with_several_errors_reports_all_of_them() {
    let d = Daemon::start();
    let manifest = json!({
        "manifest_version": "0.3",
        "name": "broken",
        "version": 1,
        "author": {},
        "server": {"type": "binary", "entry_point": "x", "mcp_config": {"command": "${nope}", "args": [true]}}
    });
    let folder = write_bundle(&d.root().join("bundles"), "broken", &manifest);
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for path in [
        "$.version",
        "$.description",
        "$.author.name",
        "$.server.mcp_config.command",
        "$.server.mcp_config.args[0]",
    ] {
        assert!(stderr.contains(path), "{path} missing from:\n{stderr}");
    }
    assert!(stderr.contains("5 problem(s)"), "{stderr}");
    assert!(d.bundle("default", "broken").is_none());

    // The same failure over the socket carries the problems as data.
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "bundle.install", json!({"path": folder}));
    assert_eq!(r["error"]["data"]["kind"], "manifest_invalid");
    assert_eq!(
        r["error"]["data"]["problems"].as_array().unwrap().len(),
        5,
        "{r}"
    );
}

#[test]
fn invalid_json_and_missing_paths_are_clear_errors() {
    let d = Daemon::start();
    let folder = d.root().join("bundles/badjson");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("manifest.json"), "{\n  \"name\": \"x\",\n}").unwrap();
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not valid JSON (line 3"), "{stderr}");

    let out = d.cli(&["install", d.root().join("nowhere").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("nothing to install at") && stderr.contains("manifest.json"),
        "{stderr}"
    );
}

#[test]
fn gate_refusal_names_bundle_and_capability_and_spawns_nothing() {
    let d = Daemon::start();
    // The bundle can write only its sandbox's data dir.
    let marker = d.state.join("sandboxes/default/needy/data/spawned.marker");
    let folder = common::shell_wrapped_demo(
        &d.root().join("bundles"),
        "needy",
        "touch \"$BUNDLEVISOR_DATA_DIR/spawned.marker\";",
    );
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("manifest.json")).unwrap())
            .unwrap();
    manifest["_meta"]["ai.nimblebrain/host"]["host_capabilities"] = json!({
        "ai.nimblebrain/host-resources": {"required": true},
        "ai.nimblebrain/teleport": {"required": true}
    });
    let folder = write_bundle(&d.root().join("bundles"), "needy", &manifest);

    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"needy\"") && stderr.contains("ai.nimblebrain/teleport"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("host-resources,"),
        "a provided capability was reported missing: {stderr}"
    );
    assert!(!marker.exists(), "the gate let a process spawn");
    assert!(d.bundle_processes().is_empty());
    assert!(d.bundle("default", "needy").is_none());

    // Without the unknown requirement the same bundle installs and runs the wrapper.
    manifest["_meta"]["ai.nimblebrain/host"]["host_capabilities"] =
        json!({"ai.nimblebrain/host-resources": {"required": true}});
    write_bundle(&d.root().join("bundles"), "needy", &manifest);
    d.ok(&["install", folder.to_str().unwrap()]);
    assert!(marker.exists());
}

#[test]
fn a_bundle_that_cannot_start_fails_install_with_the_reason() {
    let d = Daemon::start();
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("dies");
    manifest["server"]["mcp_config"]["command"] = json!("/bin/sh");
    manifest["server"]["mcp_config"]["args"] =
        json!(["-c", "echo 'cannot find my config' >&2; exit 9"]);
    let folder = write_bundle(&d.root().join("bundles"), "dies", &manifest);
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("exit code 9") && stderr.contains("cannot find my config"),
        "{stderr}"
    );
    assert!(stderr.contains("restarting in"), "{stderr}");
    // It stays installed and is retried with backoff until the breaker
    // (5 restarts within 60s) leaves it visibly failed.
    let b = d.wait_state("default", "dies", "failed");
    let reason = b["last_error"].as_str().unwrap();
    assert!(
        reason.contains("crash loop: 5 restarts") && reason.contains("exit code 9"),
        "{reason}"
    );
    assert_eq!(b["restarts"], 5);
}

/// Issue 18, point 1: the entry point must be in the bundle folder.
#[test]
fn a_bundle_without_its_entry_point_is_refused_at_install() {
    let d = Daemon::start();
    let folder = d.demo_bundle("partial");
    std::fs::remove_file(folder.join("server/bundlevisor-demo")).unwrap();
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "bundle.install", json!({"path": folder}));
    assert_eq!(r["error"]["data"]["kind"], "manifest_invalid", "{r}");
    assert_eq!(
        r["error"]["data"]["problems"][0]["path"], "$.server.entry_point",
        "{r}"
    );
    assert!(d.bundle("default", "partial").is_none());
}

/// Issue 18, point 1: `compatibility.runtimes` is checked against the
/// runtime on the daemon's PATH before anything is started.
#[test]
fn a_runtime_range_the_host_does_not_meet_is_refused_at_install() {
    let d = Daemon::start();
    let mut manifest: serde_json::Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("picky");
    manifest["compatibility"] = json!({"runtimes": {"node": ">=999"}});
    let folder = write_bundle(&d.root().join("bundles"), "picky", &manifest);
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "bundle.install", json!({"path": folder}));
    assert_eq!(r["error"]["data"]["kind"], "manifest_invalid", "{r}");
    let problem = &r["error"]["data"]["problems"][0];
    assert_eq!(problem["path"], "$.compatibility.runtimes.node", "{r}");
    let message = problem["message"].as_str().unwrap();
    assert!(
        message.contains("requires node >=999") && message.contains("on the daemon's PATH is"),
        "{message}"
    );
    assert!(d.bundle_processes().is_empty());

    manifest["compatibility"] = json!({"runtimes": {"node": ">=1"}});
    let folder = write_bundle(&d.root().join("bundles"), "picky", &manifest);
    d.ok(&["install", folder.to_str().unwrap()]);
}
