//! Metrics: `bundlevisor metrics` is valid Prometheus text (checked with a
//! Prometheus text parser), its counters move with installs, crashes, tool
//! calls and host-resources requests, and `metrics_addr` serves the same
//! families over HTTP.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{wait_for, Daemon};
use prometheus_parse::{Scrape, Value};

fn scrape(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("metrics parse as Prometheus text")
}

fn metrics(d: &Daemon) -> Scrape {
    scrape(&d.ok(&["metrics"]))
}

/// The value of the one sample of `metric` with these labels.
fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<_> = s
        .samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect();
    assert!(matching.len() <= 1, "{metric} {labels:?} is not one sample");
    matching.first().map(|x| match &x.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{metric} is not a single number: {other:?}"),
    })
}

fn demo(s: &Scrape, metric: &str) -> f64 {
    value(s, metric, &[("workspace", "default"), ("bundle", "demo")])
        .unwrap_or_else(|| panic!("no {metric} for default/demo"))
}

fn host(s: &Scrape, outcome: &str) -> f64 {
    value(
        s,
        "bundlevisor_host_resources_requests_total",
        &[("workspace", "default"), ("outcome", outcome)],
    )
    .unwrap_or_else(|| panic!("no host-resources {outcome} count"))
}

#[test]
fn counters_move_with_installs_crashes_calls_and_host_resources_requests() {
    // Three tokens and (practically) no refill: the fourth counted read is
    // rate limited. Files over 1 KiB are too large.
    let d = Daemon::start_with(
        "[host_resources]\nrate_per_sec = 0.001\nburst = 3\nmax_read_bytes = 1024\n",
    );
    let before = metrics(&d);
    assert_eq!(
        value(&before, "bundlevisor_bundles", &[("state", "ready")]),
        Some(0.0)
    );

    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let s = metrics(&d);
    assert_eq!(
        value(&s, "bundlevisor_bundles", &[("state", "ready")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "bundlevisor_bundles", &[("state", "failed")]),
        Some(0.0)
    );
    assert_eq!(demo(&s, "bundlevisor_bundle_restarts_total"), 0.0);
    assert_eq!(demo(&s, "bundlevisor_bundle_crashes_total"), 0.0);
    assert!(demo(&s, "bundlevisor_bundle_resident_memory_bytes") > 100_000.0);
    assert!(value(&s, "bundlevisor_resident_memory_bytes", &[]).unwrap() > 1_000_000.0);

    // Calls: two that work, one whose result is an error.
    d.ok(&["call", "demo", "echo", r#"{"text":"a"}"#]);
    d.ok(&["call", "demo", "add", r#"{"a":1,"b":2}"#]);
    let _ = d.cli(&["call", "demo", "fail"]);
    let s = metrics(&d);
    assert_eq!(demo(&s, "bundlevisor_tool_calls_total"), 3.0);
    assert_eq!(demo(&s, "bundlevisor_tool_call_errors_total"), 1.0);
    let histogram = s
        .samples
        .iter()
        .find(|x| x.metric == "bundlevisor_tool_call_duration_seconds")
        .expect("the latency histogram");
    let Value::Histogram(buckets) = &histogram.value else {
        panic!("not a histogram: {:?}", histogram.value);
    };
    let inf = buckets
        .iter()
        .find(|b| b.less_than == f64::INFINITY)
        .unwrap();
    assert_eq!(inf.count, 3.0);
    assert!(
        buckets.windows(2).all(|w| w[0].count <= w[1].count),
        "buckets are cumulative"
    );

    // Host-resources requests, one of each outcome.
    let small = d.put_file("small.txt", b"hello");
    let large = d.put_file("large.bin", &[7u8; 4096]);
    let read = |uri: &str| {
        d.cli(&[
            "call",
            "demo",
            "host_read",
            &format!(r#"{{"uri":"{uri}"}}"#),
        ])
    };
    read("http://example.com/x"); // invalid: no token taken
    read(&format!("files://{small}")); // ok (token 1)
    read(&format!("files://{large}")); // too large (token 2)
    read("files://does-not-exist"); // not found (token 3)
    read(&format!("files://{small}")); // rate limited
    let s = metrics(&d);
    for (outcome, n) in [
        ("ok", 1.0),
        ("invalid", 1.0),
        ("too_large", 1.0),
        ("not_found", 1.0),
        ("rate_limited", 1.0),
    ] {
        assert_eq!(host(&s, outcome), n, "host-resources {outcome}");
    }

    // A crash: counted once, and the restart that follows.
    let _ = d.cli(&["call", "demo", "crash", r#"{"code":5}"#]);
    wait_for(
        Duration::from_secs(20),
        "the restart after the crash",
        || {
            let s = metrics(&d);
            (demo(&s, "bundlevisor_bundle_restarts_total") == 1.0
                && value(&s, "bundlevisor_bundles", &[("state", "ready")]) == Some(1.0))
            .then_some(s)
        },
    );
    let s = metrics(&d);
    assert_eq!(demo(&s, "bundlevisor_bundle_crashes_total"), 1.0);
    // A restart the operator asked for is a restart, not a crash.
    d.ok(&["restart", "demo"]);
    let s = metrics(&d);
    assert_eq!(demo(&s, "bundlevisor_bundle_restarts_total"), 2.0);
    assert_eq!(demo(&s, "bundlevisor_bundle_crashes_total"), 1.0);

    let control = |s: &Scrape, m: &str| {
        value(s, "bundlevisor_control_requests_total", &[("method", m)]).unwrap_or(0.0)
    };
    assert!(control(&s, "bundle.call") >= 9.0);
    assert!(control(&s, "metrics") >= 5.0);

    // Uninstalled: its series are gone.
    d.ok(&["uninstall", "demo"]);
    let s = metrics(&d);
    assert_eq!(
        value(&s, "bundlevisor_tool_calls_total", &[("bundle", "demo")]),
        None
    );
    assert_eq!(
        value(
            &s,
            "bundlevisor_bundle_restarts_total",
            &[("bundle", "demo")]
        ),
        None
    );
}

#[test]
fn metrics_addr_serves_the_same_text_over_http_and_status_names_it() {
    let port = common::free_port();
    let d = Daemon::start_with(&format!("metrics_addr = \"{port}\"\n"));
    let status: serde_json::Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(
        status["daemon"]["metrics_addr"],
        format!("127.0.0.1:{port}")
    );

    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let response = get("/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let s = scrape(body);
    assert_eq!(
        value(&s, "bundlevisor_bundles", &[("state", "ready")]),
        Some(0.0)
    );
    // The status request above was counted in the same registry.
    assert!(
        value(
            &s,
            "bundlevisor_control_requests_total",
            &[("method", "status")]
        )
        .is_some_and(|n| n >= 1.0),
        "{body}"
    );
    assert!(get("/other").starts_with("HTTP/1.1 404"));
    // Health and readiness on the same listener.
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    let ready = get("/readyz");
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"),
        "{ready}"
    );
}

#[test]
fn a_bad_metrics_addr_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bv.toml");
    std::fs::write(
        &config,
        "state_dir = \"s\"\nsocket = \"bv.sock\"\nmetrics_addr = \"localhost\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["daemon", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metrics_addr \"localhost\" is not HOST:PORT"),
        "{stderr}"
    );
}

#[test]
fn a_scrape_is_answered_while_idle_and_trickling_connections_are_open() {
    let port = common::free_port();
    let d = Daemon::start_with(&format!("metrics_addr = \"{port}\"\n"));
    // Connected and silent; then one that sends its head a byte at a time.
    let idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let mut trickle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    trickle.write_all(b"GE").unwrap();

    let started = std::time::Instant::now();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    trickle.write_all(b"T").unwrap();
    let mut response = String::new();
    let read = stream.read_to_string(&mut response);
    assert!(
        read.is_ok() && response.starts_with("HTTP/1.1 200"),
        "the scrape was not answered ({read:?}): {response:?}\n{}",
        d.log()
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the scrape waited {:?} behind idle connections",
        started.elapsed()
    );
    scrape(response.split_once("\r\n\r\n").unwrap().1);
    drop((idle, trickle));
}

/// Issue 16, findings 2 and 10: one restart counter, one meaning — `status`
/// and the metrics agree during a backoff, and exits during start are
/// counted as crashes.
#[test]
fn status_and_metrics_count_the_same_restarts_and_every_crash() {
    let d = Daemon::start_with(
        "[supervision]\nbackoff_initial = \"3s\"\nbackoff_max = \"3s\"\nmax_restarts = 10\n",
    );
    // Exits before it ever answers initialize: every start fails.
    let dying = common::shell_wrapped_demo(&d.root().join("bundles"), "demo", "exit 1;");
    let out = d.cli(&["install", dying.to_str().unwrap(), "--no-wait"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // First failed start: restarting, in a 3 s backoff.
    let b = wait_for(Duration::from_secs(10), "the first backoff", || {
        d.bundle("default", "demo")
            .filter(|b| b["state"] == "restarting")
    });
    let s = metrics(&d);
    assert_eq!(
        demo(&s, "bundlevisor_bundle_restarts_total"),
        b["restarts"].as_f64().unwrap(),
        "status and metrics disagree during the backoff: {b}"
    );
    assert_eq!(demo(&s, "bundlevisor_bundle_crashes_total"), 1.0);
    // The second failed start, after the backoff.
    let b = wait_for(Duration::from_secs(10), "the second failed start", || {
        d.bundle("default", "demo")
            .filter(|b| b["restarts"] == 1 && b["state"] == "restarting")
    });
    let s = metrics(&d);
    assert_eq!(demo(&s, "bundlevisor_bundle_restarts_total"), 1.0, "{b}");
    assert_eq!(demo(&s, "bundlevisor_bundle_crashes_total"), 2.0);
}
