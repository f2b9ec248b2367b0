//! Tidy checks: invariants of docs/ARCHITECTURE.md that the compiler does
//! not see, checked on the source text.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's code without its `#[cfg(test)]` module (tests may spawn).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[test]
fn only_the_process_and_reaper_modules_spawn_processes_in_the_daemon() {
    // The orphan reaper (bundle/orphans.rs) reaps every child of the daemon
    // that is not registered with `orphans::own`; a spawn elsewhere would
    // have its exit status stolen. The CLI is another process.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = ["bundle/process.rs", "bundle/reaper.rs"];
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut offenders = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("cli/") || allowed.contains(&rel.as_str()) {
            continue;
        }
        let text = code(file);
        if text.contains("process::Command")
            || text.contains("Command::new(") && !text.contains("clap::Command")
        {
            offenders.push(rel);
        }
    }
    assert!(
        offenders.is_empty(),
        "processes spawned outside bundle/process.rs and bundle/reaper.rs: {offenders:?}"
    );
    for spawner in allowed {
        let text = code(&root.join(spawner));
        assert!(
            text.contains("orphans::own("),
            "{spawner} does not register its child with orphans::own"
        );
    }
}

#[test]
fn every_module_is_on_the_crate_map_and_in_the_architecture_doc() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(manifest.join("src/lib.rs")).unwrap();
    let arch = std::fs::read_to_string(manifest.join("docs/ARCHITECTURE.md")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    assert!(modules.len() > 10, "{modules:?}");
    for m in modules {
        if m == "clock" {
            continue; // a one-function helper
        }
        assert!(
            lib.contains(&format!("[`{m}`]")),
            "src/lib.rs's map does not name {m}"
        );
        assert!(
            arch.contains(&format!("src/{m}/")) || arch.contains(&format!("src/{m}.rs")),
            "docs/ARCHITECTURE.md's code map does not name src/{m}"
        );
    }
}

/// Paths named in `text` below `prefix` (`crate::` or `super::`): the first
/// segment of each, including every member of a `prefix{a, b::c}` group.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level members of the group: split on commas at depth 0.
            let mut depth = 0;
            let mut member = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(first_segment(&member));
                        member.clear();
                        continue;
                    }
                    _ => {}
                }
                member.push(ch);
            }
            out.push(first_segment(&member));
        } else {
            out.push(first_segment(rest));
        }
    }
    out.retain(|s| !s.is_empty() && s != "self");
    out
}

fn first_segment(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The library's files, each with its code (test modules left out).
fn library() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, code(f))
        })
        .filter(|(rel, _)| !rel.starts_with("bin/") && !rel.ends_with("/tests.rs"))
        .collect()
}

/// A directed graph's cycles: each strongly connected component with more
/// than one node (Tarjan's algorithm).
fn cycles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        index: std::collections::HashMap<&'a str, usize>,
        low: std::collections::HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: std::collections::HashSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.g.contains_key(w) {
                continue;
            }
            if !t.index.contains_key(w) {
                visit(t, w);
                let low = t.low[v].min(t.low[w]);
                t.low.insert(v, low);
            } else if t.on.contains(w) {
                let low = t.low[v].min(t.index[w]);
                t.low.insert(v, low);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: Default::default(),
        low: Default::default(),
        stack: Vec::new(),
        on: Default::default(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (rel, text) in library() {
        if rel == "lib.rs" {
            continue;
        }
        let module = first_segment(&rel);
        let deps = graph.entry(module.clone()).or_default();
        deps.extend(
            named_after(&text, "crate::")
                .into_iter()
                .filter(|d| *d != module),
        );
    }
    assert!(graph.len() > 15, "{graph:?}");
    assert!(
        graph["daemon"].contains("config"),
        "the parser sees imports"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "top-level modules that import each other (each group is a cycle): {found:?}"
    );
}

#[test]
fn the_manifest_checker_is_shared_without_cycles() {
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (rel, text) in library() {
        let Some(file) = rel.strip_prefix("manifest/") else {
            continue;
        };
        let module = file.trim_end_matches(".rs").to_string();
        let deps = graph.entry(module.clone()).or_default();
        let mut named = named_after(&text, "super::");
        named.extend(named_after(&text, "crate::manifest::"));
        deps.extend(named.into_iter().filter(|d| *d != module));
    }
    assert!(
        graph.contains_key("check") && graph.contains_key("validate"),
        "{graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "manifest/ modules that import each other: {found:?}"
    );
}

#[test]
fn protocol_imports_nothing_from_the_crate() {
    for (rel, text) in library() {
        if !rel.starts_with("protocol/") {
            continue;
        }
        let outside: Vec<String> = named_after(&text, "crate::")
            .into_iter()
            .filter(|m| m != "protocol")
            .collect();
        assert!(
            outside.is_empty() && !text.contains("super::super"),
            "src/{rel} imports {outside:?}: protocol/ is an API boundary (serde types only)"
        );
    }
}

#[test]
fn only_the_binary_imports_the_cli() {
    for (rel, text) in library() {
        if rel.starts_with("cli/") || rel == "lib.rs" {
            continue;
        }
        assert!(
            !named_after(&text, "crate::").iter().any(|m| m == "cli"),
            "src/{rel} imports cli: only src/bin/ may (the control client is crate::client)"
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut others = Vec::new();
    sources(&root.join("benches"), &mut others);
    sources(&root.join("tests"), &mut others);
    for file in others.iter().filter(|f| !f.ends_with("tidy.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !named_after(&text, "bundlevisor::")
                .iter()
                .any(|m| m == "cli"),
            "{} imports the cli module",
            file.display()
        );
    }
}

#[test]
fn the_mcp_client_is_built_only_in_bundle_connect() {
    let builders = [
        "serve_client",
        "StreamableHttpClientTransport",
        "TokioChildProcess",
        "BundleClient::new(",
    ];
    let mut seen_in_connect = false;
    for (rel, text) in library() {
        let found: Vec<&str> = builders
            .iter()
            .copied()
            .filter(|b| text.contains(b))
            .collect();
        if rel == "bundle/connect.rs" {
            seen_in_connect = !found.is_empty();
            continue;
        }
        assert!(
            found.is_empty(),
            "src/{rel} builds an MCP client ({found:?}): only bundle/connect.rs may, so every bundle gets the host-resources handlers"
        );
    }
    assert!(
        seen_in_connect,
        "bundle/connect.rs no longer builds the client?"
    );
}
