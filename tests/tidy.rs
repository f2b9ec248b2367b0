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
