//! Tool search (`discovery = "search"`, issue 35): the ranking's quality
//! on the tools of 21 real MCP servers (221 tools) and 199 agent queries
//! (benches/search/, captured once with the servers' pinned versions),
//! the latency of one search at 1,000 and 10,000 tools (the real tools
//! repeated under other bundle names), and what an agent's context saves:
//! the full tool list against the meta-tools.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bundlevisor::tool_search::ToolIndex;
use rmcp::model::Tool;
use serde_json::Value;

use crate::harness::summarize;
use crate::report::{Row, Target};

/// The targets.
const RECALL_AT_5: f64 = 0.9;
const SEARCH_AT_10K: Duration = Duration::from_millis(5);

fn load(name: &str) -> Value {
    let path = format!("{}/benches/search/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The real servers' tools, by server.
fn servers() -> BTreeMap<String, Vec<Tool>> {
    let tools = load("tools.json");
    tools["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let list: Vec<Tool> = serde_json::from_value(s["tools"].clone()).unwrap();
            (s["server"].as_str().unwrap().to_string(), list)
        })
        .collect()
}

/// Recall at 1 and at 5 of the queries on `index`.
fn recall(index: &ToolIndex, queries: &[Value]) -> (f64, f64) {
    let (mut at1, mut at5) = (0, 0);
    for q in queries {
        let hits = index
            .search(q["query"].as_str().unwrap(), 5, |_, _| true)
            .unwrap();
        let expected = q["expected"].as_str().unwrap();
        match hits
            .iter()
            .position(|h| format!("{}/{}", h.bundle, h.tool) == expected)
        {
            Some(0) => {
                at1 += 1;
                at5 += 1;
            }
            Some(_) => at5 += 1,
            None => {}
        }
    }
    let n = queries.len() as f64;
    (at1 as f64 / n, at5 as f64 / n)
}

/// An index of the real tools, and copies of them under other bundle
/// names up to at least `n` tools. How long indexing took.
fn index_of(servers: &BTreeMap<String, Vec<Tool>>, n: usize) -> (ToolIndex, Duration) {
    let index = ToolIndex::new().unwrap();
    let mut bundles: Vec<(String, &[Tool])> = Vec::new();
    let (mut count, mut copy) = (0, 0);
    loop {
        for (server, tools) in servers {
            let name = if copy == 0 {
                server.clone()
            } else {
                format!("{server}-{copy}")
            };
            bundles.push((name, tools));
            count += tools.len();
        }
        copy += 1;
        if count >= n {
            break;
        }
    }
    let began = Instant::now();
    index
        .sync(bundles.iter().map(|(name, tools)| (name.as_str(), *tools)))
        .unwrap();
    (index, began.elapsed())
}

/// The compact JSON of a tools/list result holding `tools`.
fn listed_bytes(tools: &[Tool]) -> usize {
    serde_json::to_vec(&serde_json::json!({ "tools": tools }))
        .unwrap()
        .len()
}

/// The rows, and the quality and size lines printed under the table.
pub fn measure(smoke: bool) -> (Vec<Row>, Vec<String>) {
    let servers = servers();
    let queries = load("queries.json")["queries"].as_array().unwrap().clone();
    let (real, _) = index_of(&servers, 0);
    let (r1, r5) = recall(&real, &queries);
    let all: Vec<Tool> = servers.values().flatten().cloned().collect();
    let (full, meta) = (
        listed_bytes(&all),
        listed_bytes(&bundlevisor::daemon::gateway::search::meta_tools(true)),
    );
    let mut lines = vec![
        format!(
            "tool search quality: recall@1 {r1:.3}, recall@5 {r5:.3} over {} queries on {} tools of {} real servers (target recall@5 ≥ {RECALL_AT_5}: {})",
            queries.len(),
            all.len(),
            servers.len(),
            if r5 >= RECALL_AT_5 { "met" } else { "NOT met" }
        ),
        format!(
            "an agent's tool list: {full} bytes (~{} tokens) for every tool, {meta} bytes (~{} tokens) for the meta-tools: {:.1}% of it",
            full / 4,
            meta / 4,
            meta as f64 * 100.0 / full as f64
        ),
    ];
    let mut rows = Vec::new();
    let rounds = if smoke { 1 } else { 5 };
    for n in [1_000, 10_000] {
        let (index, took) = index_of(&servers, n);
        lines.push(format!(
            "indexing {} tools: {:.0} ms",
            index.len(),
            took.as_secs_f64() * 1e3
        ));
        let mut sample = Vec::new();
        for _ in 0..rounds {
            for q in &queries {
                let began = Instant::now();
                let hits = index
                    .search(q["query"].as_str().unwrap(), 5, |_, _| true)
                    .unwrap();
                sample.push(began.elapsed());
                assert!(hits.len() <= 5);
            }
        }
        let row = Row::latency(
            &format!("tool search: one query at {n} tools"),
            summarize(sample),
            None,
        );
        rows.push(if n == 10_000 {
            row.target(Target::AtMost(SEARCH_AT_10K))
        } else {
            row
        });
    }
    (rows, lines)
}
