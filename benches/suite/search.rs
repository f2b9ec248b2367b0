//! Tool search (`discovery = "search"`, issue 35): the ranking's quality
//! on the tools of 21 real MCP servers (221 tools) and 199 agent queries
//! (benches/search/, captured once with the servers' pinned versions) —
//! by words alone (BM25) and with the model `make model` fetches, the
//! latter also on each half of the queries (the fusion's constants were
//! chosen on the even ones) — the latency of one search at 1,000 and
//! 10,000 tools (the real tools repeated under other bundle names), the
//! cost of embedding, and what an agent's context saves: the full tool
//! list against the meta-tools. A smoke run (`make test`) leaves the model
//! out: tests/tool_search.rs checks its ranking.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bundlevisor::tool_search::ToolIndex;
use bundlevisor_embed::Encoder;
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

/// The model `make model` fetches.
const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/models/all-minilm-l6-v2"
);

/// Recall at 1 and at 5 of the queries on `index`.
fn recall(index: &ToolIndex, queries: &[&Value]) -> (f64, f64) {
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
/// names up to at least `n` tools (`github_`, `github__`, …: the same
/// words, so the same texts, which the index embeds once). How long
/// indexing took (by words; embedding is [`ToolIndex::embed_pending`]'s).
fn index_of(
    servers: &BTreeMap<String, Vec<Tool>>,
    n: usize,
    encoder: Option<&Arc<Encoder>>,
) -> (ToolIndex, Duration) {
    let index = match encoder {
        Some(encoder) => ToolIndex::with_encoder(encoder.clone()).unwrap(),
        None => ToolIndex::new().unwrap(),
    };
    let mut bundles: Vec<(String, &[Tool])> = Vec::new();
    let (mut count, mut copy) = (0, 0);
    loop {
        for (server, tools) in servers {
            let name = format!("{server}{}", "_".repeat(copy));
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

/// One search of each query (`rounds` times) on `index`: the row.
fn latency(index: &ToolIndex, queries: &[&Value], rounds: usize, what: &str) -> Row {
    let mut sample = Vec::new();
    for _ in 0..rounds {
        for q in queries {
            let began = Instant::now();
            let hits = index
                .search(q["query"].as_str().unwrap(), 5, |_, _| true)
                .unwrap();
            sample.push(began.elapsed());
            assert!(hits.len() <= 5);
        }
    }
    Row::latency(what, summarize(sample), None)
}

fn quality(what: &str, (r1, r5): (f64, f64)) -> String {
    format!(
        "{what}: recall@1 {r1:.3}, recall@5 {r5:.3} (target recall@5 ≥ {RECALL_AT_5}: {})",
        if r5 >= RECALL_AT_5 { "met" } else { "NOT met" }
    )
}

/// The rows, and the quality and size lines printed under the table.
pub fn measure(smoke: bool) -> (Vec<Row>, Vec<String>) {
    let servers = servers();
    let queries = load("queries.json")["queries"].as_array().unwrap().clone();
    let queries: Vec<&Value> = queries.iter().collect();
    let (real, _) = index_of(&servers, 0, None);
    let all: Vec<Tool> = servers.values().flatten().cloned().collect();
    let (full, meta) = (
        listed_bytes(&all),
        listed_bytes(&bundlevisor::daemon::gateway::search::meta_tools(true)),
    );
    let mut lines = vec![
        format!(
            "tool search over {} queries on {} tools of {} real servers:",
            queries.len(),
            all.len(),
            servers.len(),
        ),
        quality("  by words (BM25)", recall(&real, &queries)),
        format!(
            "an agent's tool list: {full} bytes (~{} tokens) for every tool, {meta} bytes (~{} tokens) for the meta-tools: {:.1}% of it",
            full / 4,
            meta / 4,
            meta as f64 * 100.0 / full as f64
        ),
    ];
    let mut rows = Vec::new();
    let rounds = if smoke { 1 } else { 5 };
    let encoder = (!smoke).then(|| {
        let began = Instant::now();
        let encoder = Encoder::load(std::path::Path::new(MODEL))
            .unwrap_or_else(|e| panic!("{e} (run `make model`)"));
        lines.push(format!(
            "the model (all-MiniLM-L6-v2) loads in {:.0} ms",
            began.elapsed().as_secs_f64() * 1e3
        ));
        Arc::new(encoder)
    });
    if let Some(encoder) = &encoder {
        let (index, _) = index_of(&servers, 0, Some(encoder));
        let texts = index.pending();
        let began = Instant::now();
        index.embed_pending();
        let took = began.elapsed();
        lines.push(format!(
            "embedding the {} real tools ({texts} texts: each tool's whole description and its first sentence): {:.1} s, {:.1} ms a text, on one thread",
            all.len(),
            took.as_secs_f64(),
            took.as_secs_f64() * 1e3 / texts as f64
        ));
        let half = |parity: usize| -> Vec<&Value> {
            (queries.iter().enumerate())
                .filter(|(i, _)| i % 2 == parity)
                .map(|(_, q)| *q)
                .collect()
        };
        lines.push(quality("  by words and meaning", recall(&index, &queries)));
        lines.push(quality(
            "    on the even queries (the fusion's constants were chosen on these)",
            recall(&index, &half(0)),
        ));
        lines.push(quality(
            "    on the odd queries (held out)",
            recall(&index, &half(1)),
        ));
        let mut sample = Vec::new();
        for q in &queries {
            let began = Instant::now();
            let vector = encoder.embed(q["query"].as_str().unwrap());
            sample.push(began.elapsed());
            assert_eq!(vector.len(), encoder.dimensions());
        }
        rows.push(Row::latency(
            "tool search: a query's vector (all-MiniLM-L6-v2)",
            summarize(sample),
            None,
        ));
    }
    for n in [1_000, 10_000] {
        let (index, took) = index_of(&servers, n, None);
        lines.push(format!(
            "indexing {} tools by words: {:.0} ms",
            index.len(),
            took.as_secs_f64() * 1e3
        ));
        let target = |row: Row| {
            if n == 10_000 {
                row.target(Target::AtMost(SEARCH_AT_10K))
            } else {
                row
            }
        };
        let what = format!("tool search: one query at {n} tools, by words");
        rows.push(target(latency(&index, &queries, rounds, &what)));
        if let Some(encoder) = &encoder {
            let (index, _) = index_of(&servers, n, Some(encoder));
            index.embed_pending();
            let what = format!("tool search: one query at {n} tools, words and meaning");
            rows.push(target(latency(&index, &queries, rounds, &what)));
        }
    }
    (rows, lines)
}
