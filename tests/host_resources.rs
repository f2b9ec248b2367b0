//! The `ai.nimblebrain/host-resources` contract end to end: workspace files
//! put with the CLI, read and listed by a real bundle process over its MCP
//! session (the demo bundle's `host_read` / `host_list` tools), with two
//! workspaces, the size cap, rate limits and every spawn path.

mod common;

use std::time::Duration;

use common::{wait_for, Daemon};
use serde_json::{json, Value};

/// Calls a host tool of bundle `name` in `ws`: (is_error, JSON the host answered).
fn host(d: &Daemon, ws: &str, name: &str, tool: &str, args: Value) -> (bool, Value) {
    let out = d.cli(&["call", name, tool, &args.to_string(), "-w", ws, "--json"]);
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let text = result["content"][0]["text"].as_str().unwrap();
    (
        result["isError"] == true,
        serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

fn read(d: &Daemon, ws: &str, name: &str, uri: &str) -> (bool, Value) {
    host(d, ws, name, "host_read", json!({ "uri": uri }))
}

fn put(d: &Daemon, ws: &str, file: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec!["files", "put", file.to_str().unwrap(), "-w", ws, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&d.ok(&args)).unwrap()
}

fn write(d: &Daemon, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = d.root().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn files_cli_round_trip_and_workspaces_created_on_first_use() {
    let d = Daemon::start();
    let csv = write(&d, "report.csv", b"a,b\n1,2\n");
    let rec = put(&d, "team-b", &csv, &["--tag", "q3", "--tag", "sales"]);
    let id = rec["id"].as_str().unwrap();
    assert!(id.starts_with("fl_") && id.len() == 27);
    assert_eq!(
        (rec["mimeType"].as_str(), rec["size"].as_u64()),
        (Some("text/csv"), Some(8))
    );
    assert_eq!(rec["tags"], json!(["q3", "sales"]));
    assert!(d.status()["workspaces"]
        .as_array()
        .unwrap()
        .contains(&json!("team-b")));

    let list: Value =
        serde_json::from_str(&d.ok(&["files", "ls", "-w", "team-b", "--json"])).unwrap();
    assert_eq!(list["files"][0], rec);
    assert!(
        serde_json::from_str::<Value>(&d.ok(&["files", "ls", "--json"])).unwrap()["files"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    let out = d.root().join("copy.csv");
    d.ok(&[
        "files",
        "get",
        id,
        "-w",
        "team-b",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), b"a,b\n1,2\n");
    assert_eq!(d.ok(&["files", "get", id, "-w", "team-b"]), "a,b\n1,2\n");
    // Another workspace cannot see it.
    let other = d.cli(&["files", "get", id]);
    assert_eq!(other.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&other.stderr).contains("no file"));

    d.ok(&["files", "rm", id, "-w", "team-b"]);
    assert_eq!(
        d.cli(&["files", "rm", id, "-w", "team-b"]).status.code(),
        Some(1)
    );
}

#[test]
fn a_bundle_reads_and_lists_its_workspace_files_truthfully() {
    let d = Daemon::start();
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    d.ok(&["install", b.to_str().unwrap(), "-w", "other"]);
    let text = put(
        &d,
        "default",
        &write(&d, "notes.md", "héllo\n".as_bytes()),
        &["--tag", "a", "--tag", "b"],
    );
    let bin = put(
        &d,
        "default",
        &write(&d, "blob.bin", &[0, 1, 2, 255]),
        &["--tag", "a"],
    );
    let foreign = put(
        &d,
        "other",
        &write(&d, "secret.txt", b"other workspace"),
        &[],
    );

    let uri = format!("files://{}", text["id"].as_str().unwrap());
    assert_eq!(
        read(&d, "default", "demo", &uri),
        (
            false,
            json!({"contents":[{"uri": uri, "mimeType":"text/markdown","text":"héllo\n"}]})
        )
    );
    let buri = format!("files://{}", bin["id"].as_str().unwrap());
    assert_eq!(
        read(&d, "default", "demo", &buri),
        (
            false,
            json!({"contents":[{"uri": buri, "mimeType":"application/octet-stream","blob":"AAEC/w=="}]})
        )
    );

    let (err, all) = host(&d, "default", "demo", "host_list", json!({}));
    assert!(!err);
    assert_eq!(all["resources"].as_array().unwrap().len(), 2, "{all}");
    let (_, both) = host(
        &d,
        "default",
        "demo",
        "host_list",
        json!({"params": {"_meta": {"filter": {"tags": ["a", "b"]}}}}),
    );
    assert_eq!(
        both,
        json!({"resources":[{"uri": uri, "name":"notes.md","mimeType":"text/markdown","size":7}]})
    );
    let (_, by_mime) = host(
        &d,
        "default",
        "demo",
        "host_list",
        json!({"params": {"_meta": {"filter": {"mimeType": "application/octet-stream", "scheme": "files"}}}}),
    );
    assert_eq!(by_mime["resources"][0]["name"], "blob.bin");

    // Another workspace's id answers exactly like a missing one.
    let furi = format!("files://{}", foreign["id"].as_str().unwrap());
    assert_eq!(
        read(&d, "default", "demo", &furi),
        (
            true,
            json!({"code":-32002,"message":"Resource not found","data":{"uri": furi}})
        )
    );
    let missing = "files://fl_0123456789abcdef01234567";
    assert_eq!(
        read(&d, "default", "demo", missing),
        (
            true,
            json!({"code":-32002,"message":"Resource not found","data":{"uri": missing}})
        )
    );
    // The daemon's log has the real reason; the bundle never saw it.
    assert!(
        d.log()
            .contains("the file belongs to workspace \"other\", not \"default\""),
        "{}",
        d.log()
    );
    // ... while the bundle of that workspace reads it.
    assert_eq!(
        read(&d, "other", "demo", &furi).1["contents"][0]["text"],
        "other workspace"
    );

    for uri in [
        "files://../state.db",
        "files://..%2fstate.db",
        "files://%2e%2e/x",
    ] {
        assert_eq!(read(&d, "default", "demo", uri).1["code"], -32002, "{uri}");
    }
    assert_eq!(
        read(&d, "default", "demo", "https://example.com/x"),
        (
            true,
            json!({"code":-32602,"message":"Unsupported URI scheme","data":{"uri":"https://example.com/x","supported":["files"]}})
        )
    );
    let (_, e) = host(
        &d,
        "default",
        "demo",
        "host_list",
        json!({"params": {"cursor": "next"}}),
    );
    assert_eq!(
        e,
        json!({"code":-32602,"message":"Pagination is not supported in this version","data":{"cursor":"next"}})
    );
    let (_, e) = host(
        &d,
        "default",
        "demo",
        "host_list",
        json!({"params": {"_meta": {"filter": {"tags": "a"}}}}),
    );
    assert_eq!(
        e,
        json!({"code":-32602,"message":"filter.tags must be an array of strings","data":{"receivedType":"string"}})
    );
}

#[test]
fn an_over_cap_file_is_refused_from_its_metadata() {
    let d = Daemon::start_with("[host_resources]\nmax_read_bytes = 1024\n");
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let big = put(&d, "default", &write(&d, "big.txt", &[b'x'; 2048]), &[]);
    let uri = format!("files://{}", big["id"].as_str().unwrap());
    assert_eq!(
        read(&d, "default", "demo", &uri),
        (
            true,
            json!({"code":-32005,"message":"Response too large","data":{"uri": uri,"size":2048,"maxSize":1024}})
        )
    );
}

#[test]
fn a_flood_is_rate_limited_then_served_after_retry_after_and_uninstall_drops_the_bucket() {
    let d = Daemon::start_with("[host_resources]\nrate_per_sec = 1\nburst = 2\n");
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let neighbour = d.demo_bundle("neighbour");
    d.ok(&["install", neighbour.to_str().unwrap()]);
    let list = |name: &str| host(&d, "default", name, "host_list", json!({}));
    assert!(!list("demo").0);
    assert!(!list("demo").0);
    let (err, e) = list("demo");
    assert!(err);
    assert_eq!(
        (e["code"].as_i64(), e["message"].as_str()),
        (Some(-32004), Some("Rate limited"))
    );
    let retry = e["data"]["retryAfterMs"].as_u64().unwrap();
    assert!((1..=1000).contains(&retry), "{e}");
    // Buckets are per bundle: the neighbour is not limited.
    assert!(!list("neighbour").0);
    // After retryAfterMs the bundle is served again.
    std::thread::sleep(Duration::from_millis(retry));
    wait_for(Duration::from_secs(5), "the bucket to refill", || {
        (!list("demo").0).then_some(())
    });

    // Drain, uninstall, reinstall: a new bundle gets a full bucket.
    while !list("demo").0 {}
    d.ok(&["uninstall", "demo"]);
    d.ok(&["install", b.to_str().unwrap()]);
    assert!(!list("demo").0);
    assert!(!list("demo").0);
}

#[test]
fn host_resources_work_after_every_spawn_path() {
    let mut d = Daemon::start_with("watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\n");
    std::fs::create_dir_all(d.root().join("watched")).unwrap();
    let staged = common::demo_bundle_at(&d.root().join("staging"), "demo");
    let file = put(&d, "default", &write(&d, "f.txt", b"hello"), &[]);
    let uri = format!("files://{}", file["id"].as_str().unwrap());
    let works = |d: &Daemon, why: &str| {
        let pid = d.bundle("default", "demo").unwrap()["pid"].clone();
        let (err, v) = read(d, "default", "demo", &uri);
        assert!(
            !err && v["contents"][0]["text"] == "hello",
            "after {why}: {v}"
        );
        pid
    };
    // First install (hot, from the watched folder).
    std::fs::rename(&staged, d.root().join("watched/demo")).unwrap();
    d.wait_state("default", "demo", "ready");
    let mut pid = works(&d, "first install");
    // Manual restart.
    d.ok(&["restart", "demo"]);
    let next = works(&d, "manual restart");
    assert_ne!(next, pid);
    pid = next;
    // Crash restart.
    let _ = d.cli(&["call", "demo", "crash"]);
    wait_for(Duration::from_secs(10), "the crash restart", || {
        d.bundle("default", "demo")
            .filter(|b| b["state"] == "ready" && b["pid"] != pid)
    });
    pid = works(&d, "crash restart");
    // Manifest upgrade.
    let manifest = d.root().join("watched/demo/manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["version"] = json!("0.9.0");
    std::fs::write(&manifest, m.to_string()).unwrap();
    wait_for(Duration::from_secs(10), "the upgrade", || {
        d.bundle("default", "demo")
            .filter(|b| b["version"] == "0.9.0" && b["state"] == "ready")
    });
    assert_ne!(works(&d, "manifest upgrade"), pid);
    // Boot reload.
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.launch();
    d.wait_state("default", "demo", "ready");
    works(&d, "boot reload");
}

#[test]
fn checkpoint_and_rollback_restore_the_file_set_and_reads_are_audited() {
    let d = Daemon::start();
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let kept = put(&d, "default", &write(&d, "kept.txt", b"kept"), &[]);
    let kept_id = kept["id"].as_str().unwrap().to_string();
    let cp: Value = serde_json::from_str(&d.ok(&["files", "checkpoint"])).unwrap();
    let cp_id = cp["checkpoint_id"].as_str().unwrap().to_string();
    assert_eq!(cp["files"], json!([kept]));
    assert!(cp["timestamp"].as_str().unwrap().ends_with('Z'));

    let later = put(&d, "default", &write(&d, "later.txt", b"later"), &[]);
    d.ok(&["files", "rm", &kept_id]);
    let uri = format!("files://{kept_id}");
    assert_eq!(read(&d, "default", "demo", &uri).1["code"], -32002);

    let rb: Value = serde_json::from_str(&d.ok(&["files", "rollback", &cp_id])).unwrap();
    assert_eq!(
        rb,
        json!({"success": true, "checkpoint_id": cp_id, "restored_files": [kept_id]})
    );
    let list: Value = serde_json::from_str(&d.ok(&["files", "ls", "--json"])).unwrap();
    assert_eq!(list["files"], json!([kept]));
    // The bytes of the removed file came back with it (blobs are immutable).
    assert_eq!(
        read(&d, "default", "demo", &uri).1["contents"][0]["text"],
        "kept"
    );
    let later_uri = format!("files://{}", later["id"].as_str().unwrap());
    assert_eq!(read(&d, "default", "demo", &later_uri).1["code"], -32002);
    let unknown = d.cli(&["files", "rollback", "cp_000000000000000000000000"]);
    assert_eq!(unknown.status.code(), Some(1));

    // Every decision was audited, with the bundle as principal.
    let audit = d.state.join("audit/default.jsonl");
    let lines = wait_for(Duration::from_secs(5), "the audit log", || {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        (text.lines().count() >= 3).then_some(text)
    });
    let decisions: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(decisions
        .iter()
        .all(|d| d["principal"] == "bundle:default/demo" && d["scope"] == "workspace:default"));
    assert!(decisions
        .iter()
        .any(|d| d["resource"] == uri && d["action"] == "read" && d["permitted"] == true));
}

/// Compares `value` with `tests/golden/host_resources/NAME.json`
/// (`UPDATE_GOLDEN=1` rewrites the file instead).
fn golden(name: &str, value: &Value) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/host_resources")
        .join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing golden file {}; run with UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert_eq!(
        text,
        want,
        "{name}: the wire shape changed (golden file {})",
        path.display()
    );
}

#[test]
fn results_and_errors_match_the_golden_wire_shapes() {
    let d = Daemon::start_with(
        "[host_resources]\nmax_read_bytes = 64\nrate_per_sec = 0.5\nburst = 8\n",
    );
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let text = put(
        &d,
        "default",
        &write(&d, "notes.md", b"# Notes\n"),
        &["--tag", "a"],
    );
    let bin = put(
        &d,
        "default",
        &write(&d, "pixel.png", b"\x89PNG\r\n\x1a\n"),
        &["--tag", "a", "--tag", "b"],
    );
    let big = put(&d, "default", &write(&d, "big.txt", &[b'x'; 100]), &[]);
    let ids = [(&text, "fl_TEXT"), (&bin, "fl_BINARY"), (&big, "fl_BIG")];
    let normalize = |v: Value| -> Value {
        let mut s = v.to_string();
        for (rec, placeholder) in &ids {
            s = s.replace(rec["id"].as_str().unwrap(), placeholder);
        }
        serde_json::from_str(&s).unwrap()
    };
    let uri = |rec: &Value| format!("files://{}", rec["id"].as_str().unwrap());
    let cases: Vec<(&str, &str, Value)> = vec![
        ("read_text", "host_read", json!({"uri": uri(&text)})),
        ("read_blob", "host_read", json!({"uri": uri(&bin)})),
        ("list_all", "host_list", json!({})),
        (
            "list_filtered",
            "host_list",
            json!({"params": {"_meta": {"filter": {"scheme": "files", "mimeType": "image/png", "tags": ["a", "b"]}}}}),
        ),
        (
            "error_not_found",
            "host_read",
            json!({"uri": "files://fl_0123456789abcdef01234567"}),
        ),
        ("error_too_large", "host_read", json!({"uri": uri(&big)})),
        (
            "error_unsupported_scheme",
            "host_read",
            json!({"uri": "http://example.com/a"}),
        ),
        (
            "error_unsupported_scheme_filter",
            "host_list",
            json!({"params": {"_meta": {"filter": {"scheme": "entities"}}}}),
        ),
        (
            "error_pagination",
            "host_list",
            json!({"params": {"cursor": "c1"}}),
        ),
        (
            "error_tags_type",
            "host_list",
            json!({"params": {"_meta": {"filter": {"tags": {"a": 1}}}}}),
        ),
    ];
    for (name, tool, args) in cases {
        let (_, v) = host(&d, "default", "demo", tool, args);
        golden(name, &normalize(v));
    }
    // Drain the bucket (8 tokens; the 6 reads and lists above used 6 — requests refused while parsing use none).
    let limited = (0..5)
        .map(|_| host(&d, "default", "demo", "host_list", json!({})).1)
        .find(|v| v.get("code").is_some())
        .unwrap();
    assert!(limited["data"]["retryAfterMs"].as_u64().unwrap() > 0);
    let mut shape = limited.clone();
    shape["data"]["retryAfterMs"] = json!("<ms>");
    golden("error_rate_limited", &shape);
}

/// Issue 32, point 4: a bundle that speaks MCP 2026-07-28 only (the demo
/// with `DEMO_ONLY_2026=1` refuses `initialize`), where a stdio server
/// must not write requests to stdout, reads and lists its workspace's
/// files on the host-resources channel the daemon gives it (descriptor 3,
/// `NIMBLEBRAIN_HOST_CHANNEL_FD`), with the contract's answers and errors.
#[test]
fn a_bundle_on_2026_07_28_reads_and_lists_on_the_host_channel() {
    let d = Daemon::start();
    let mut manifest: Value = serde_json::from_str(common::DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("modern");
    manifest["server"]["mcp_config"]["env"]["DEMO_ONLY_2026"] = json!("1");
    let dir = common::write_bundle(&d.root().join("bundles"), "modern", &manifest);
    d.ok(&["install", dir.to_str().unwrap()]);
    let status = d.bundle("default", "modern").unwrap();
    assert_eq!(status["mcp"]["revision"], "2026-07-28", "{status}");
    let env = d.ok(&[
        "call",
        "modern",
        "env",
        r#"{"name": "NIMBLEBRAIN_HOST_CHANNEL_FD"}"#,
    ]);
    assert!(env.contains('3'), "{env}");

    let id = d.put_file("channel.txt", b"read on the channel");
    let read = d.ok(&[
        "call",
        "modern",
        "host_read",
        &json!({"uri": format!("files://{id}")}).to_string(),
    ]);
    assert!(read.contains("read on the channel"), "{read}");
    let list = d.ok(&["call", "modern", "host_list", "{}"]);
    assert!(list.contains(&id) && list.contains("channel.txt"), "{list}");
    // The contract's errors, as in-band: a file that does not exist.
    let out = d.cli(&[
        "call",
        "modern",
        "host_read",
        r#"{"uri": "files://fl_000000000000000000000000"}"#,
    ]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("-32002"), "{text}");
}
