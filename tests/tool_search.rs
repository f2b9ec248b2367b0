//! The tool search ranking (`discovery = "search"`) measured on the tools
//! of 21 real MCP servers (221 tools) and 199 agent queries
//! (benches/search/): recall at 1 and 5, as a smoke test of what `make
//! bench` reports in full.

use std::collections::HashMap;

use bundlevisor::tool_search::ToolIndex;
use rmcp::model::Tool;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/benches/search/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn the_ranking_finds_the_expected_tool_for_real_queries() {
    let tools = load("tools.json");
    let index = ToolIndex::new().unwrap();
    let mut by_server: HashMap<String, Vec<Tool>> = HashMap::new();
    for server in tools["servers"].as_array().unwrap() {
        let list: Vec<Tool> = serde_json::from_value(server["tools"].clone()).unwrap();
        by_server.insert(server["server"].as_str().unwrap().to_string(), list);
    }
    index
        .sync(by_server.iter().map(|(s, t)| (s.as_str(), t.as_slice())))
        .unwrap();
    let queries = load("queries.json");
    let queries = queries["queries"].as_array().unwrap();
    let (mut at1, mut at5) = (0, 0);
    let mut missed = Vec::new();
    for q in queries {
        let (query, expected) = (
            q["query"].as_str().unwrap(),
            q["expected"].as_str().unwrap(),
        );
        let hits = index.search(query, 5, |_, _| true).unwrap();
        let names: Vec<String> = hits
            .iter()
            .map(|h| format!("{}/{}", h.bundle, h.tool))
            .collect();
        match names.iter().position(|n| n == expected) {
            Some(0) => {
                at1 += 1;
                at5 += 1
            }
            Some(_) => at5 += 1,
            None => missed.push(format!("{query:?} -> {expected} (got {names:?})")),
        }
    }
    let n = queries.len() as f64;
    let (r1, r5) = (at1 as f64 / n, at5 as f64 / n);
    println!(
        "recall@1 {r1:.3} recall@5 {r5:.3} over {} queries",
        queries.len()
    );
    for m in &missed {
        println!("missed {m}");
    }
    // A floor against regressions of the BM25 ranking (measured: 0.357 and
    // 0.658); the target (0.9 at 5) is `make bench`'s to report.
    assert!(
        r1 >= 0.30 && r5 >= 0.60,
        "recall@1 {r1:.3}, recall@5 {r5:.3}"
    );
}
