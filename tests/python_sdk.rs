//! The published Python SDK (`nimblebrain-bundle-sdk==0.2.0`, FastMCP)
//! against the real daemon: `bundles/workspace-reader-py` reads and lists
//! workspace files through `host(ctx)`, unmodified. Its virtual environment
//! is built by `make pyenv` (a prerequisite of `make test`).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{wait_for, Daemon};
use serde_json::{json, Value};

const NAME: &str = "workspace-reader-py";

fn bundle_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("bundles")
        .join(NAME);
    assert!(
        dir.join(".venv/bin/python").exists(),
        "the Python SDK bundle has no virtual environment: run `make pyenv` (make test does)"
    );
    dir
}

/// Calls a tool of the Python bundle in `ws` and parses the JSON it returned.
fn call(d: &Daemon, ws: &str, tool: &str, args: Value) -> Value {
    let out = d.ok(&["call", NAME, tool, &args.to_string(), "-w", ws]);
    serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("not JSON: {out}"))
}

fn put(d: &Daemon, ws: &str, name: &str, bytes: &[u8], tags: &[&str]) -> String {
    let path = d.root().join(name);
    std::fs::write(&path, bytes).unwrap();
    let mut args = vec!["files", "put", path.to_str().unwrap(), "-w", ws];
    for t in tags {
        args.extend_from_slice(&["--tag", t]);
    }
    d.ok(&args).trim().to_string()
}

#[test]
fn the_python_sdk_reads_lists_and_sees_every_contract_error() {
    let d = Daemon::start_with(
        "[host_resources]\nmax_read_bytes = 4096\nrate_per_sec = 2\nburst = 30\n",
    );
    let dir = bundle_dir();
    d.ok(&["install", dir.to_str().unwrap()]);
    d.ok(&["install", dir.to_str().unwrap(), "-w", "other"]);

    assert_eq!(
        call(&d, "default", "capability", json!({})),
        json!({"read": true, "list": true, "files": true})
    );

    let text = put(&d, "default", "notes.csv", b"a,b\n1,2\n", &["q3", "sales"]);
    let binary = put(
        &d,
        "default",
        "pixel.png",
        b"\x89PNG\r\n\x1a\n\x00\x01",
        &["q3"],
    );
    let big = put(&d, "default", "big.txt", &[b'x'; 5000], &[]);
    let foreign = put(&d, "other", "theirs.txt", b"not yours", &[]);

    // Text and binary round trips, MIME types as stored.
    assert_eq!(
        call(
            &d,
            "default",
            "read_file",
            json!({"uri": format!("files://{text}")})
        ),
        json!({"uri": format!("files://{text}"), "mimeType": "text/csv", "text": "a,b\n1,2\n"})
    );
    assert_eq!(
        call(
            &d,
            "default",
            "read_file",
            json!({"uri": format!("files://{binary}")})
        ),
        json!({"uri": format!("files://{binary}"), "mimeType": "image/png", "blob": "iVBORw0KGgoAAQ=="})
    );

    // List with mimeType and tags filters (AND).
    let names = |v: Value| -> Vec<String> {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(call(&d, "default", "list_files", json!({}))).len(), 3);
    assert_eq!(
        names(call(&d, "default", "list_files", json!({"tags": ["q3"]}))),
        vec!["notes.csv", "pixel.png"]
    );
    assert_eq!(
        names(call(
            &d,
            "default",
            "list_files",
            json!({"tags": ["q3", "sales"]})
        )),
        vec!["notes.csv"]
    );
    assert_eq!(
        names(call(
            &d,
            "default",
            "list_files",
            json!({"mime_type": "image/png", "tags": ["q3"]})
        )),
        vec!["pixel.png"]
    );
    assert!(names(call(
        &d,
        "default",
        "list_files",
        json!({"mime_type": "image/png", "tags": ["sales"]})
    ))
    .is_empty());

    // -32002 for another workspace's id, exactly like a missing one.
    let uri = format!("files://{foreign}");
    assert_eq!(
        call(&d, "default", "read_file", json!({"uri": uri})),
        json!({"error": {"code": -32002, "message": "Resource not found", "data": {"uri": uri}}})
    );
    assert_eq!(
        call(&d, "other", "read_file", json!({"uri": uri}))["text"],
        "not yours"
    );
    // -32005 for a file over the cap.
    let uri = format!("files://{big}");
    assert_eq!(
        call(&d, "default", "read_file", json!({"uri": uri})),
        json!({"error": {"code": -32005, "message": "Response too large", "data": {"uri": uri, "size": 5000, "maxSize": 4096}}})
    );
    // -32602 for an unsupported scheme.
    assert_eq!(
        call(&d, "default", "read_file", json!({"uri": "s3://bucket/x"}))["error"]["code"],
        -32602
    );

    // -32004 under a flood, and served again after retryAfterMs.
    let uri = format!("files://{text}");
    let limited = (0..40)
        .map(|_| call(&d, "default", "read_file", json!({"uri": uri})))
        .find(|v| v.get("error").is_some())
        .expect("the flood was never rate limited");
    assert_eq!(
        (
            limited["error"]["code"].as_i64(),
            limited["error"]["message"].as_str()
        ),
        (Some(-32004), Some("Rate limited"))
    );
    let retry = limited["error"]["data"]["retryAfterMs"].as_u64().unwrap();
    assert!((1..=500).contains(&retry), "{limited}");
    std::thread::sleep(Duration::from_millis(retry));
    wait_for(Duration::from_secs(5), "reads to be served again", || {
        call(&d, "default", "read_file", json!({"uri": uri}))
            .get("text")
            .map(|_| ())
    });
}
