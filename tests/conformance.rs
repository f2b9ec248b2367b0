//! The official MCP conformance suite's server scenarios, run against the
//! conformance target bundle (tests/conformance/bundle, on the TypeScript
//! SDK 2 server 2.4.0) three ways: directly over its own streamable HTTP
//! (the baseline), through the gateway's per-bundle endpoint
//! `/mcp/default/bundle/NAME` (which serves one bundle exactly as itself:
//! every scenario that passes directly must pass there too), and through
//! the aggregated endpoint `/mcp/default` (recorded, not asserted: it names
//! tools `BUNDLE__TOOL`, which many scenarios cannot find).
//!
//! Two pinned suites, both installed by `make conformance` (make test does):
//! 0.1.16 (target/conformance, every server scenario) and 0.2.0-alpha.12
//! (target/conformance-2026, with `--spec-version 2026-07-28`: the
//! scenarios of MCP 2026-07-28), each run by tests/conformance/run.sh,
//! which prints one JSON line per scenario. The table of every run is
//! printed and written as markdown to target/conformance-table.md.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{free_port, Daemon};
use serde_json::Value;

/// The bundle's manifest name (tests/conformance/bundle/manifest.json).
const BUNDLE: &str = "conformance-target";

/// Seconds a scenario may take before run.mjs reports it as an error (its
/// default is 60; a hung scenario must not hold the test that long).
const SCENARIO_TIMEOUT: &str = "20";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/NAME`, which `make conformance` builds (its `.installed` marks
/// a finished build).
fn built(name: &str) -> PathBuf {
    let dir = root().join("target").join(name);
    assert!(
        dir.join(".installed").exists(),
        "{} is not built; run `make conformance` (make test does)",
        dir.display()
    );
    dir
}

/// One pinned suite and the spec version its scenarios are filtered by.
struct Suite {
    label: &'static str,
    dir: PathBuf,
    spec_version: Option<&'static str>,
}

/// What one run of a suite reported: each scenario's JSON line (in the
/// order run), and the closing summary.
struct Run {
    order: Vec<String>,
    scenarios: BTreeMap<String, Value>,
    summary: Value,
    took: Duration,
}

impl Run {
    fn status(&self, scenario: &str) -> Option<&str> {
        self.scenarios
            .get(scenario)
            .and_then(|s| s["status"].as_str())
    }

    fn passed(&self) -> impl Iterator<Item = &str> {
        self.order
            .iter()
            .map(String::as_str)
            .filter(|s| self.status(s) == Some("pass"))
    }

    fn counts(&self) -> String {
        let s = &self.summary;
        format!(
            "{}/{} passed, {} failed, {} errors, {} skipped (suite {}, {:.1} s)",
            s["pass"],
            s["total"],
            s["fail"],
            s["error"],
            s["skipped"],
            s["suiteVersion"],
            self.took.as_secs_f64()
        )
    }
}

/// Runs every server scenario of `suite` against `url` (with the bearer
/// token, if any) through tests/conformance/run.sh.
fn run_suite(suite: &Suite, url: &str, token: Option<&str>) -> Run {
    let started = Instant::now();
    let mut cmd = Command::new(root().join("tests/conformance/run.sh"));
    cmd.arg("--url")
        .arg(url)
        .arg("--suite-dir")
        .arg(&suite.dir)
        .args(["--timeout", SCENARIO_TIMEOUT]);
    if let Some(v) = suite.spec_version {
        cmd.args(["--spec-version", v]);
    }
    if let Some(t) = token {
        cmd.arg("--header")
            .arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .expect("run tests/conformance/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 0: all passed, 1: some failed; anything else is a broken setup.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "run.sh --url {url} ({}) exited {}:\n{stdout}\n{stderr}",
        suite.label,
        out.status
    );
    let mut order = Vec::new();
    let mut scenarios = BTreeMap::new();
    let mut summary = None;
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("run.sh printed a line that is not JSON ({e}): {line}"));
        if v["summary"] == true {
            summary = Some(v);
        } else {
            let name = v["scenario"].as_str().expect("a scenario name").to_string();
            order.push(name.clone());
            scenarios.insert(name, v);
        }
    }
    let summary =
        summary.unwrap_or_else(|| panic!("run.sh printed no summary:\n{stdout}\n{stderr}"));
    assert!(
        !order.is_empty(),
        "run.sh ran no scenario against {url}:\n{stderr}"
    );
    Run {
        order,
        scenarios,
        summary,
        took: started.elapsed(),
    }
}

/// The bundle's server run directly over streamable HTTP on a loopback
/// port of its own (`--http 0`), killed when dropped.
struct Direct {
    child: Child,
    url: String,
}

impl Direct {
    fn start(bundle: &Path) -> Direct {
        let mut child = Command::new("node")
            .arg(bundle.join("server/index.mjs"))
            .args(["--http", "0"])
            .current_dir(bundle)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start node (the conformance bundle's server)");
        // Its stderr is read to the end by a thread (it must never fill
        // up); the first `listening URL` line is its address.
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("listening ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(Ok(url.trim().to_string()));
                    }
                } else if let Some(tx) = &tx {
                    let _ = tx.send(Err(line));
                }
            }
        });
        let mut said = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(url)) => break url,
                Ok(Err(line)) => said.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().unwrap();
                    panic!(
                        "the conformance bundle's server did not say `listening URL` ({status}):\n{}",
                        said.join("\n")
                    );
                }
            }
        };
        Direct { child, url }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The markdown table: one row per scenario (in the order first run), one
/// column per run; `-` where a run did not have the scenario.
fn table(columns: &[(&str, &Run)]) -> String {
    let mut rows: Vec<&str> = Vec::new();
    for (_, run) in columns {
        for s in &run.order {
            if !rows.contains(&s.as_str()) {
                rows.push(s);
            }
        }
    }
    let mut text = String::from("| scenario |");
    for (label, _) in columns {
        text += &format!(" {label} |");
    }
    text += "\n|---|";
    text += &"---|".repeat(columns.len());
    text += "\n";
    for scenario in rows {
        text += &format!("| {scenario} |");
        for (_, run) in columns {
            text += &format!(" {} |", run.status(scenario).unwrap_or("-"));
        }
        text += "\n";
    }
    text += "| **passed** |";
    for (_, run) in columns {
        text += &format!(" {}/{} |", run.summary["pass"], run.summary["total"]);
    }
    text += "\n";
    text
}

/// The scenarios that passed in `direct` and did not in `through`, each
/// with what failed.
fn regressions(direct: &Run, through: &Run) -> Vec<String> {
    direct
        .passed()
        .filter(|s| through.status(s) != Some("pass"))
        .map(|s| {
            let line = through.scenarios.get(s);
            format!(
                "{s}: {} {}",
                line.and_then(|l| l["status"].as_str()).unwrap_or("not run"),
                line.map(|l| l["failures"].to_string()).unwrap_or_default()
            )
        })
        .collect()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn the_conformance_suites_pass_through_the_per_bundle_endpoint_as_directly() {
    let started = Instant::now();
    let bundle = built("conformance-bundle");
    let suites = [
        Suite {
            label: "0.1.16",
            dir: built("conformance"),
            spec_version: None,
        },
        Suite {
            label: "0.2.0-alpha.12 2026-07-28",
            dir: built("conformance-2026"),
            spec_version: Some("2026-07-28"),
        },
    ];

    // The baseline: the bundle's own server over HTTP.
    let direct: Vec<Run> = {
        let server = Direct::start(&bundle);
        suites
            .iter()
            .map(|suite| {
                let run = run_suite(suite, &server.url, None);
                eprintln!("direct {}: {}", suite.label, run.counts());
                run
            })
            .collect()
    };

    // The same bundle installed in a daemon (it runs under a uid of its own
    // and reads its folder in target/, as the other built test bundles do).
    let t0 = Instant::now();
    let port = free_port();
    // The suite opens a session per scenario and never ends one (no
    // DELETE): room for all of them on one token.
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmax_sessions_per_token = 200\n"
    ));
    d.ok(&["install", bundle.to_str().unwrap()]);
    let token = d.ok(&["token", "create"]).trim().to_string();
    d.wait_state("default", BUNDLE, "ready");
    eprintln!(
        "daemon started, bundle ready: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let per_bundle_url = format!("http://127.0.0.1:{port}/mcp/default/bundle/{BUNDLE}");
    let aggregated_url = format!("http://127.0.0.1:{port}/mcp/default");

    let per_bundle: Vec<Run> = suites
        .iter()
        .map(|suite| {
            let run = run_suite(suite, &per_bundle_url, Some(&token));
            eprintln!("per-bundle {}: {}", suite.label, run.counts());
            run
        })
        .collect();
    let aggregated = run_suite(&suites[0], &aggregated_url, Some(&token));
    eprintln!("aggregated {}: {}", suites[0].label, aggregated.counts());

    let columns = [
        ("direct", &direct[0]),
        ("per-bundle", &per_bundle[0]),
        ("aggregated", &aggregated),
        ("direct 2026-07-28", &direct[1]),
        ("per-bundle 2026-07-28", &per_bundle[1]),
    ];
    let text = format!(
        "Server scenarios of the MCP conformance suite against the conformance \
         target bundle: directly, through `/mcp/default/bundle/{BUNDLE}` and through \
         `/mcp/default` (0.1.16, every scenario), and directly and per bundle with \
         0.2.0-alpha.12 `--spec-version 2026-07-28` (tests/conformance.rs).\n\n{}",
        table(&columns)
    );
    eprintln!("{text}");
    let file = root().join("target/conformance-table.md");
    std::fs::write(&file, &text).unwrap();
    eprintln!(
        "written to {}; whole test {:.1} s",
        file.display(),
        started.elapsed().as_secs_f64()
    );

    let mut failed = Vec::new();
    for ((suite, direct), through) in suites.iter().zip(&direct).zip(&per_bundle) {
        assert!(
            direct.passed().next().is_some(),
            "no scenario of {} passed against the bundle directly",
            suite.label
        );
        for r in regressions(direct, through) {
            failed.push(format!("{}: {r}", suite.label));
        }
    }
    assert!(
        failed.is_empty(),
        "scenarios that pass directly fail through {per_bundle_url}:\n{}\ndaemon log:\n{}",
        failed.join("\n"),
        tail(&d.log(), 60)
    );
}
