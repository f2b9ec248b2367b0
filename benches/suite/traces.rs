//! What the operator's views cost (issue 36): a dashboard page load, and
//! what tracing costs a call.
//!
//! Page loads: `GET /ui/` and a bundle's page over the daemon's listener
//! with a signed-in session (as a browser asks for the HTML; its one
//! script and no other resource), one after the other, and the bytes.
//!
//! Tracing: the same `echo` over the HTTP
//! gateway of two daemons side by side, one with `[telemetry]` off and one
//! exporting every call's spans (the gateway's and its request to the
//! bundle) over OTLP, in alternating rounds, each agent sending a
//! `traceparent` in `_meta` as a traced agent does. The spans go to a
//! collector stand-in in this process that answers every export 200 and
//! counts the bytes (a real receiver's own work on these 2 cores would
//! land on the figure; its correctness is tests/telemetry.rs's, with
//! Arize Phoenix).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bundlevisor::protocol::method;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::json;

use crate::harness::{call, summarize, BenchDaemon};
use crate::report::Row;
use crate::{floors, http_transport, scaled, CONFIG, ROUNDS};

/// An OTLP/HTTP endpoint that takes every export: the bytes it was sent.
async fn collector() -> (u16, Arc<AtomicU64>) {
    let bytes = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counted = bytes.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(body.len() as u64, Ordering::Relaxed);
                ""
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, bytes)
}

/// A daemon under `root` with the demo bundle `gw` and the HTTP gateway
/// (and the dashboard), `telemetry` in its config; an agent of it over
/// HTTP, and the listener's port.
async fn daemon(
    root: &Path,
    telemetry: &str,
) -> (BenchDaemon, RunningService<RoleClient, ()>, u16) {
    std::fs::create_dir_all(root.join("watched")).unwrap();
    std::fs::create_dir_all(root.join("bundles")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let config = format!(
        "{CONFIG}{telemetry}[http]\nlisten = \"127.0.0.1:{port}\"\nrate_per_sec = 1000000.0\nburst = 1000000\ndashboard = true\n"
    );
    let d = BenchDaemon::start(root, Some(&config)).await;
    let mut ctl = d.connect().await;
    let dir = crate::harness::demo_bundle(&root.join("bundles"), "gw");
    call(&mut ctl, method::INSTALL, json!({"path": dir})).await;
    let made = call(
        &mut ctl,
        method::TOKEN_CREATE,
        json!({"workspace": "default"}),
    )
    .await;
    let token = made["token"].as_str().expect("a token").to_string();
    let agent = rmcp::ServiceExt::serve((), http_transport(port, &token))
        .await
        .expect("initialize over HTTP");
    (d, agent, port)
}

/// `n` loads of each page (after a few unmeasured), signed in with a
/// one-time code from the control socket: the rows, with the bytes.
async fn page_loads(d: &BenchDaemon, port: u16, n: usize) -> Vec<Row> {
    let mut ctl = d.connect().await;
    let link = call(&mut ctl, method::DASHBOARD_LOGIN, json!({})).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Signed in as the sign-in page's own form does.
    let code = link["code"].as_str().expect("a sign-in code");
    let signed = http
        .post(format!("http://127.0.0.1:{port}/ui/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("code={code}"))
        .send()
        .await
        .unwrap();
    let cookie = signed
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let mut rows = Vec::new();
    for (what, path) in [
        ("the bundles", "/ui/"),
        ("a bundle's page", "/ui/bundle/default/gw"),
    ] {
        let (mut sample, mut bytes) = (Vec::with_capacity(n), 0);
        for i in 0..n + 5 {
            let start = Instant::now();
            let page = http
                .get(format!("http://127.0.0.1:{port}{path}"))
                .header("Cookie", &cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(page.status(), 200, "{path}");
            bytes = page.bytes().await.unwrap().len();
            if i >= 5 {
                sample.push(start.elapsed());
            }
        }
        rows.push(Row::latency(
            &format!("dashboard: GET {what} ({path}, {bytes} B)"),
            summarize(sample),
            None,
        ));
    }
    rows
}

/// `n` echo calls, each with a new `traceparent` in `_meta`.
async fn traced_calls(client: &RunningService<RoleClient, ()>, n: usize) -> Vec<Duration> {
    let args = json!({"text": "ping"}).as_object().unwrap().clone();
    let mut sample = Vec::with_capacity(n);
    for i in 0..n + 50 {
        let mut params = CallToolRequestParams::new("gw__echo").with_arguments(args.clone());
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.set_traceparent(format!(
            "00-{:032x}-{:016x}-01",
            fastrand::u128(1..),
            fastrand::u64(1..)
        ));
        params.meta = Some(meta);
        let start = Instant::now();
        client.peer().call_tool(params).await.expect("call");
        if i >= 50 {
            sample.push(start.elapsed());
        }
    }
    sample
}

/// The dashboard's page loads and tracing's cost (see the module's text).
pub async fn cost(root: &Path) -> Vec<Row> {
    let n = scaled(2000);
    let (port, exported) = collector().await;
    let (off_daemon, off, off_port) = daemon(&root.join("tracing-off"), "").await;
    // Each daemon on a host has a uid range of its own.
    let on_config = format!(
        "[sandbox]\nuid_range = \"2000100000-2000165535\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}\"\n"
    );
    let (on_daemon, on, _) = daemon(&root.join("tracing-on"), &on_config).await;
    let (_child, direct) = floors::bare_start().await;
    let (mut floor, mut without, mut with) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        floor.extend(crate::echo_calls(&direct, "echo", n / ROUNDS).await);
        without.extend(traced_calls(&off, n / ROUNDS).await);
        with.extend(traced_calls(&on, n / ROUNDS).await);
    }
    for c in [off, on, direct] {
        let _ = c.cancel().await;
    }
    let mut rows = page_loads(&off_daemon, off_port, scaled(500)).await;
    // The last batch goes when the daemon stops.
    tokio::task::block_in_place(|| {
        off_daemon.stop();
        on_daemon.stop();
    });
    let sent = exported.load(Ordering::Relaxed);
    assert!(sent > 0, "the traced daemon exported no spans");
    let floor = summarize(floor);
    let without = summarize(without);
    rows.extend([
        Row::latency("tracing: echo via HTTP, tracing off", without, Some(floor)),
        Row::latency(
            &format!(
                "tracing: the same, tracing on (over off; {} B of OTLP a call)",
                sent / (n as u64 + 50 * ROUNDS as u64).max(1)
            ),
            summarize(with),
            Some(without),
        ),
    ]);
    rows
}
