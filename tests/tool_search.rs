//! The tool search ranking (`discovery = "search"`) measured on the tools
//! of 21 real MCP servers (221 tools) and 199 agent queries
//! (benches/search/): recall at 1 and 5, by words alone (BM25) and with
//! the model `make model` fetches, as a smoke test of what `make bench`
//! reports in full.

use std::collections::HashMap;
use std::sync::Arc;

use bundlevisor::tool_search::ToolIndex;
use bundlevisor_embed::Encoder;
use rmcp::model::Tool;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/benches/search/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// `index` holding every server's tools.
fn indexed(index: ToolIndex) -> ToolIndex {
    let tools = load("tools.json");
    let mut by_server: HashMap<String, Vec<Tool>> = HashMap::new();
    for server in tools["servers"].as_array().unwrap() {
        let list: Vec<Tool> = serde_json::from_value(server["tools"].clone()).unwrap();
        by_server.insert(server["server"].as_str().unwrap().to_string(), list);
    }
    index
        .sync(by_server.iter().map(|(s, t)| (s.as_str(), t.as_slice())))
        .unwrap();
    index
}

/// Recall at 1 and at 5 over the queries (the misses printed).
fn recall(index: &ToolIndex) -> (f64, f64) {
    let queries = load("queries.json");
    let queries = queries["queries"].as_array().unwrap();
    let (mut at1, mut at5) = (0, 0);
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
            None => println!("missed {query:?} -> {expected} (got {names:?})"),
        }
    }
    let n = queries.len() as f64;
    let (r1, r5) = (at1 as f64 / n, at5 as f64 / n);
    println!("recall@1 {r1:.3} recall@5 {r5:.3} over {n} queries");
    (r1, r5)
}

#[test]
fn the_ranking_by_words_finds_the_expected_tool_for_real_queries() {
    let (r1, r5) = recall(&indexed(ToolIndex::new().unwrap()));
    // A floor against regressions of the BM25 ranking (measured: 0.357 and
    // 0.658); the target (0.9 at 5) is `make bench`'s to report.
    assert!(
        r1 >= 0.30 && r5 >= 0.60,
        "recall@1 {r1:.3}, recall@5 {r5:.3}"
    );
}

#[test]
fn the_ranking_by_words_and_meaning_finds_far_more() {
    let folder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/models/all-minilm-l6-v2"
    );
    let encoder = Encoder::load(std::path::Path::new(folder))
        .unwrap_or_else(|e| panic!("{e} (run `make model`)"));
    let index = indexed(ToolIndex::with_encoder(Arc::new(encoder)).unwrap());
    assert!(index.pending() > 221, "every tool waits for its vectors");
    index.embed_pending();
    assert_eq!(index.pending(), 0);
    let (r1, r5) = recall(&index);
    // Measured: 0.658 and 0.889 (docs/performance.md, "Tool search").
    assert!(
        r1 >= 0.60 && r5 >= 0.85,
        "recall@1 {r1:.3}, recall@5 {r5:.3}"
    );
}
