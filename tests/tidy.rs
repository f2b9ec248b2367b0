//! Tidy checks: invariants of docs/ARCHITECTURE.md that the compiler does
//! not see, checked on the source text.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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

/// A file's code without its `#[cfg(test)]` modules (tests may spawn and
/// import anything), wherever they stand; lines are kept, so line numbers
/// still hold.
fn code(path: &Path) -> String {
    without_test_modules(&std::fs::read_to_string(path).unwrap())
}

fn without_test_modules(text: &str) -> String {
    // Found on the blanked text (same byte offsets), so a brace or a
    // `#[cfg(test)]` in a string or a comment misleads nothing.
    let blanked = blank(text);
    let b = blanked.as_bytes();
    let mut out = text.as_bytes().to_vec();
    let mut from = 0;
    while let Some(i) = blanked[from..].find("#[cfg(test)]").map(|i| from + i) {
        from = i + 1;
        let after = skip_ws(b, i + "#[cfg(test)]".len());
        let (word, q) = read_ident(b, after);
        if word != "mod" {
            continue; // a test-only item: kept
        }
        let (_, q) = read_ident(b, skip_ws(b, q));
        let q = skip_ws(b, q);
        let end = match b.get(q) {
            Some(b'{') => {
                let mut depth = 0;
                let mut k = q;
                while k < b.len() {
                    match b[k] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                k + 1
            }
            _ => q + 1, // `mod tests;`: its file is left out by name
        };
        let end = end.min(out.len());
        for c in &mut out[i..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).unwrap_or_else(|_| blanked.clone())
}

#[test]
fn only_the_process_and_reaper_modules_spawn_processes_in_the_daemon() {
    // The orphan reaper (bundle/orphans.rs) reaps every child of the daemon
    // that is not registered with `orphans::own`; a spawn elsewhere would
    // have its exit status stolen. The CLI is another process.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // bundle/helper.rs runs the daemon's short helpers (uv, pass), each
    // registered before it can exit.
    let allowed = ["bundle/process.rs", "bundle/reaper.rs", "bundle/helper.rs"];
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
        let spawns = text.contains("process::Command")
            || text.contains("Command::new(") && !text.contains("clap::Command")
            || text.contains("libc::clone(")
            || text.contains("libc::fork(")
            || text.contains("posix_spawn");
        // bundle/spawn.rs is the clone(CLONE_VM) primitive that only
        // bundle/process.rs calls (checked below), and it registers.
        if spawns && rel != "bundle/spawn.rs" {
            offenders.push(rel.clone());
        }
        if text.contains("spawn::spawn(") && rel != "bundle/process.rs" {
            offenders.push(format!("{rel} (calls bundle::spawn)"));
        }
    }
    assert!(
        offenders.is_empty(),
        "processes spawned outside bundle/process.rs, bundle/reaper.rs and bundle/helper.rs: {offenders:?}"
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

/// The library's files (not the binary, not test modules), each with its code.
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

// ---------------------------------------------------------------------------
// Imports, read from the source text.
//
// A file's code is first blanked of comments and string and char literals
// (a path in a message or a doc comment is not an import). Every path that
// starts with `crate::`, `super::` or `self::` (or, in a `use`, with a child
// module's name) is then read as a tree — `use crate::{a, b::{c, d}}` over
// any number of lines is four paths — and made absolute: `super::` against
// the module the code is in (the file's module path, plus any inline
// `mod name { .. }` around it). A path that lands on a name the module
// imports (`pub use host::HostBlock` in `manifest/mod.rs`, then
// `super::HostBlock` in a child) follows that import, so a re-export hides
// no edge. The module that holds the named item is what the path depends on.

/// `code` with comments and string and char literals replaced by spaces
/// (newlines kept, so line numbers still hold).
fn blank(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank_byte = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        // Line comment.
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
            continue;
        }
        // Block comment (they nest).
        if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank_byte(b[i]));
                    i += 1;
                }
            }
            continue;
        }
        let after_ident = i > 0 && ident(b[i - 1]);
        // Raw string: r"..", r#".."#, br"..".
        if !after_ident && (c == b'r' || (c == b'b' && next == Some(b'r'))) {
            let mut j = i + if c == b'b' { 2 } else { 1 };
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&b'"') {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let end = b[j + 1..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| j + 1 + p + close.len());
                out.extend(b[i..end].iter().map(|&c| blank_byte(c)));
                i = end;
                continue;
            }
        }
        // String (or byte string: its `b` was copied as an identifier).
        if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() {
                match b[i] {
                    b'\\' => {
                        out.push(b' ');
                        if let Some(&e) = b.get(i + 1) {
                            out.push(blank_byte(e));
                        }
                        i += 2;
                    }
                    b'"' => {
                        out.push(b' ');
                        i += 1;
                        break;
                    }
                    other => {
                        out.push(blank_byte(other));
                        i += 1;
                    }
                }
            }
            continue;
        }
        // Char literal ('x', '\n', '\u{..}', a multi-byte char); a lifetime
        // ('a) is code.
        if c == b'\'' {
            let end = if next == Some(b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p + 1)
            } else {
                let len = match next {
                    Some(n) if n >= 0xF0 => 4,
                    Some(n) if n >= 0xE0 => 3,
                    Some(n) if n >= 0xC0 => 2,
                    _ => 1,
                };
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
            };
            if let Some(end) = end {
                out.extend(b[i..end].iter().map(|_| b' '));
                i = end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced, by spaces")
}

/// The module path of a file under src/: `daemon/control/mod.rs` and
/// `daemon/control.rs` are `daemon::control`, `lib.rs` is the crate root.
fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.trim_end_matches(".rs");
    let mut path: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// One path a file names, as written.
#[derive(Debug, Clone)]
struct Named {
    /// Absolute, from the crate root (`super::`/`self::` resolved).
    path: Vec<String>,
    /// The name it binds, for a `use` (its alias or last segment).
    binds: Option<String>,
    line: usize,
    /// The module the code is in (inline modules included).
    within: Vec<String>,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn skip_ws(b: &[u8], mut p: usize) -> usize {
    while p < b.len() && b[p].is_ascii_whitespace() {
        p += 1;
    }
    p
}

fn read_ident(b: &[u8], p: usize) -> (String, usize) {
    let mut q = p;
    if b[q..].starts_with(b"r#") {
        q += 2;
    }
    let start = q;
    while q < b.len() && is_ident(b[q]) {
        q += 1;
    }
    if q == start {
        return (String::new(), p);
    }
    (String::from_utf8_lossy(&b[start..q]).into_owned(), q)
}

/// One path of a path tree.
struct Leaf {
    segments: Vec<String>,
    alias: Option<String>,
    /// Where its own part starts (a group member's line is its own).
    at: usize,
}

impl Leaf {
    fn new(segments: Vec<String>, alias: Option<String>, at: usize) -> Leaf {
        Leaf {
            segments,
            alias,
            at,
        }
    }
}

/// A path tree at `p`: segments joined by `::`, a `{..}` group (nested,
/// over lines) or `*` at the end, an optional `as alias`. Each leaf comes
/// back as its segments, its alias and where its own part starts.
fn path_tree(b: &[u8], mut p: usize) -> (Vec<Leaf>, usize) {
    let mut segments = Vec::new();
    let start = skip_ws(b, p);
    loop {
        p = skip_ws(b, p);
        match b.get(p) {
            Some(b'{') => {
                p += 1;
                let mut leaves = Vec::new();
                loop {
                    p = skip_ws(b, p);
                    match b.get(p) {
                        None => break,
                        Some(b'}') => {
                            p += 1;
                            break;
                        }
                        Some(b',') => p += 1,
                        Some(_) => {
                            let (members, q) = path_tree(b, p);
                            if q == p {
                                p += 1; // not a path: step over it
                            } else {
                                p = q;
                            }
                            for leaf in members {
                                let mut path = segments.clone();
                                path.extend(leaf.segments);
                                leaves.push(Leaf {
                                    segments: path,
                                    ..leaf
                                });
                            }
                        }
                    }
                }
                return (leaves, p);
            }
            Some(b'*') => {
                segments.push("*".to_string());
                return (vec![Leaf::new(segments, None, start)], p + 1);
            }
            _ => {}
        }
        let (segment, q) = read_ident(b, p);
        if segment.is_empty() {
            break;
        }
        segments.push(segment);
        p = skip_ws(b, q);
        if b[p..].starts_with(b"::") {
            p += 2;
            continue;
        }
        let (word, q) = read_ident(b, p);
        if word == "as" {
            let q = skip_ws(b, q);
            let (alias, q) = read_ident(b, q);
            return (vec![Leaf::new(segments, Some(alias), start)], q);
        }
        break;
    }
    if segments.is_empty() {
        return (Vec::new(), p);
    }
    (vec![Leaf::new(segments, None, start)], p)
}

/// Every crate path named in `code` (already blanked), made absolute.
/// `module` is the file's module path, `modules` every module of the crate
/// (a `use` may start with a child module's name), `root` the crate's name
/// as written (`crate` in the library, `bundlevisor` in tests and benches).
fn named_paths(
    code: &str,
    module: &[String],
    modules: &BTreeSet<Vec<String>>,
    root: &str,
) -> Vec<Named> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    // Inline modules around the cursor: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let (mut depth, mut line, mut p) = (0usize, 1usize, 0usize);
    while p < b.len() {
        let c = b[p];
        match c {
            b'\n' => line += 1,
            b'{' => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
            }
            b'}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            b';' => pending_mod = None,
            _ => {}
        }
        if !is_ident(c) || (p > 0 && is_ident(b[p - 1])) {
            p += 1;
            continue;
        }
        let (word, q) = read_ident(b, p);
        let within: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let is_use = word == "use";
        let starts_path = [root, "super", "self"].contains(&word.as_str())
            && b[skip_ws(b, q)..].starts_with(b"::");
        if word == "mod" {
            let (name, r) = read_ident(b, skip_ws(b, q));
            if b.get(skip_ws(b, r)) == Some(&b'{') {
                pending_mod = Some(name);
            }
            p = r.max(q);
            continue;
        }
        if !is_use && !starts_path {
            p = q;
            continue;
        }
        let tree_at = if is_use { skip_ws(b, q) } else { p };
        let (leaves, end) = path_tree(b, tree_at);
        for Leaf {
            mut segments,
            alias,
            at,
        } in leaves
        {
            if segments.last().is_some_and(|s| s == "self") {
                segments.pop();
            }
            let Some(first) = segments.first().cloned() else {
                continue;
            };
            let absolute: Vec<String> = if first == root {
                segments[1..].to_vec()
            } else if first == "super" {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let mut base = within.clone();
                base.truncate(base.len().saturating_sub(ups));
                base.extend(segments[ups..].iter().cloned());
                base
            } else if first == "self" {
                within.iter().chain(&segments[1..]).cloned().collect()
            } else {
                let mut child = within.clone();
                child.push(first.clone());
                if !(is_use && modules.contains(&child)) {
                    continue; // another crate, or a local item
                }
                within.iter().chain(&segments).cloned().collect()
            };
            let binds = if is_use {
                alias.or_else(|| absolute.last().filter(|s| *s != "*").cloned())
            } else {
                None
            };
            out.push(Named {
                path: absolute,
                binds,
                line: line + b[p..at.max(p)].iter().filter(|&&c| c == b'\n').count(),
                within: within.clone(),
            });
        }
        // Lines the tree spanned.
        line += b[p..end.max(p)].iter().filter(|&&c| c == b'\n').count();
        p = end.max(q);
    }
    out
}

/// The library's sources as the import checks read them.
struct Crate {
    /// (path under src/, blanked code, module path)
    files: Vec<(String, String, Vec<String>)>,
    modules: BTreeSet<Vec<String>>,
    /// Names each module binds with `use`: (module, name) → absolute path.
    uses: BTreeMap<(Vec<String>, String), Vec<String>>,
}

/// What a path depends on, with where it was named (for messages).
struct Import {
    file: String,
    line: usize,
    /// The module holding the named item.
    target: Vec<String>,
    written: String,
}

impl Crate {
    fn new(files: Vec<(String, String)>) -> Crate {
        let files: Vec<(String, String, Vec<String>)> = files
            .into_iter()
            .map(|(rel, code)| {
                let module = module_of(&rel);
                (rel, blank(&code), module)
            })
            .collect();
        let mut modules = BTreeSet::new();
        for (_, _, module) in &files {
            for n in 0..=module.len() {
                modules.insert(module[..n].to_vec());
            }
        }
        let mut uses = BTreeMap::new();
        for (_, code, module) in &files {
            for named in named_paths(code, module, &modules, "crate") {
                if let Some(name) = named.binds {
                    uses.insert((named.within, name), named.path);
                }
            }
        }
        Crate {
            files,
            modules,
            uses,
        }
    }

    /// The module that holds the item `path` names: the longest known
    /// module prefix, after following the `use`s of the modules on the way.
    fn holder(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        let mut k = 0;
        let mut hops = 0;
        while k < path.len() {
            let mut next = path[..k].to_vec();
            next.push(path[k].clone());
            if self.modules.contains(&next) {
                k += 1;
                continue;
            }
            let key = (path[..k].to_vec(), path[k].clone());
            match self.uses.get(&key) {
                Some(target) if hops < 16 && *target != path[..=k] => {
                    hops += 1;
                    let mut followed = target.clone();
                    followed.extend(path[k + 1..].iter().cloned());
                    path = followed;
                    k = 0;
                }
                _ => break,
            }
        }
        path.truncate(k);
        path
    }

    /// Every crate path each file names, with the module holding its item.
    fn imports(&self) -> Vec<Import> {
        let mut out = Vec::new();
        for (rel, code, module) in &self.files {
            for named in named_paths(code, module, &self.modules, "crate") {
                out.push(Import {
                    file: rel.clone(),
                    line: named.line,
                    target: self.holder(&named.path),
                    written: named.path.join("::"),
                });
            }
        }
        out
    }
}

type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// The dependency graph of the children of `parent` (the crate root: the
/// top-level modules): node → dependency → where it was first named.
/// The parent's own items are not a node: it declares its children.
fn graph_below(krate: &Crate, parent: &[&str]) -> Graph {
    let parent: Vec<String> = parent.iter().map(|s| s.to_string()).collect();
    let child = |module: &[String]| -> Option<String> {
        (module.len() > parent.len() && module.starts_with(&parent))
            .then(|| module[parent.len()].clone())
    };
    let mut graph = Graph::new();
    for (_, _, module) in &krate.files {
        if let Some(node) = child(module) {
            graph.entry(node).or_default();
        }
    }
    for import in krate.imports() {
        let from = module_of(&import.file);
        let (Some(from), Some(to)) = (child(&from), child(&import.target)) else {
            continue;
        };
        if from != to {
            graph.entry(from).or_default().entry(to).or_insert_with(|| {
                format!(
                    "src/{}:{} names {}",
                    import.file, import.line, import.written
                )
            });
        }
    }
    graph
}

/// The cycles of `graph`: for each strongly connected component with more
/// than one node (Tarjan), its members and one shortest cycle through its
/// first member, each step with the line that makes it.
fn cycles(graph: &Graph) -> Vec<String> {
    struct T<'a> {
        g: &'a Graph,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: HashSet<&'a str>,
        next: usize,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g[v].keys() {
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
                scc.push(w);
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
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: HashSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    let shortest_cycle_through = |start: &str, scc: &[&str]| -> Vec<String> {
        // Breadth-first from `start` back to it, inside the component.
        let mut came_from: HashMap<&str, &str> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        'search: while let Some(v) = queue.pop_front() {
            for w in graph[v].keys().map(String::as_str) {
                if !scc.contains(&w) {
                    continue;
                }
                if w == start {
                    came_from.insert(start, v);
                    break 'search;
                }
                if !came_from.contains_key(w) {
                    came_from.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut nodes = Vec::new();
        let mut to = start;
        loop {
            let from = came_from[to];
            nodes.push(from.to_string());
            to = from;
            if to == start {
                break;
            }
        }
        nodes.reverse();
        nodes
    };
    t.out
        .iter()
        .map(|scc| {
            // One shortest cycle through each member, each printed once.
            let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
            let mut text = format!("{{{}}}:", scc.join(", "));
            for start in scc {
                let nodes = shortest_cycle_through(start, scc);
                let mut key = nodes.clone();
                let first = (0..key.len()).min_by_key(|&i| &key[i]).unwrap();
                key.rotate_left(first);
                if !seen.insert(key) {
                    continue;
                }
                text.push_str(&format!("\n  {} → {}", nodes.join(" → "), nodes[0]));
                for (i, from) in nodes.iter().enumerate() {
                    let to = &nodes[(i + 1) % nodes.len()];
                    text.push_str(&format!("\n    {from} → {to}: {}", graph[from][to]));
                }
            }
            text
        })
        .collect()
}

/// Files under protocol/ that name anything outside it.
fn protocol_boundary_breaches(krate: &Crate) -> Vec<String> {
    krate
        .imports()
        .into_iter()
        .filter(|i| {
            i.file.starts_with("protocol/")
                && i.target.first().map(String::as_str) != Some("protocol")
        })
        .map(|i| format!("src/{}:{} names {}", i.file, i.line, i.written))
        .collect()
}

/// Files outside cli/ that name the cli module.
fn cli_importers(krate: &Crate) -> Vec<String> {
    krate
        .imports()
        .into_iter()
        .filter(|i| {
            !i.file.starts_with("cli/") && i.target.first().map(String::as_str) == Some("cli")
        })
        .map(|i| format!("src/{}:{} names {}", i.file, i.line, i.written))
        .collect()
}

/// Where an MCP client is built outside bundle/connect.rs: rmcp's client
/// constructors and transports, a `ClientHandler` implemented outside
/// bundle/client.rs, or a `.serve(` in a file that names a client role or
/// handler (rmcp implements `ClientHandler` for `()` and `ClientInfo`).
fn mcp_client_builders(files: &[(String, String)]) -> Vec<String> {
    let constructors = [
        "serve_client",
        "StreamableHttpClientTransport",
        "SseClientTransport",
        "TokioChildProcess",
        "BundleClient::new",
        // The stdio transport answers host-resources requests itself.
        "BundleStdio::new",
    ];
    let client_side = [
        "RoleClient",
        "ClientHandler",
        "ClientInfo",
        "BundleClient",
        "().serve",
    ];
    let mut out = Vec::new();
    for (rel, code) in files {
        if rel == "bundle/connect.rs" {
            continue;
        }
        let code = blank(code);
        for (n, line) in code.lines().enumerate() {
            let at = format!("src/{rel}:{}", n + 1);
            for c in constructors.iter().filter(|c| line.contains(*c)) {
                out.push(format!("{at}: {c}"));
            }
            if line.contains("impl")
                && line.contains("ClientHandler for")
                && rel != "bundle/client.rs"
            {
                out.push(format!("{at}: a second ClientHandler"));
            }
        }
        let serves = code.contains(".serve(") || code.contains("serve_with_ct(");
        if let Some(side) = client_side.iter().find(|s| code.contains(*s)) {
            if serves {
                out.push(format!("src/{rel}: serves a client ({side})"));
            }
        }
    }
    out
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let krate = Crate::new(library());
    let graph = graph_below(&krate, &[]);
    assert!(graph.len() > 15, "{graph:?}");
    assert!(
        graph["daemon"].contains_key("config"),
        "the parser sees imports: {graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "top-level modules that import each other (docs/ARCHITECTURE.md, \"No import cycles\"):\n{}",
        found.join("\n")
    );
}

/// At every level, not only the top: the children of each module with
/// children (daemon/'s among them) import each other without cycles.
#[test]
fn the_children_of_every_module_import_each_other_without_cycles() {
    let krate = Crate::new(library());
    let parents: Vec<Vec<String>> = krate
        .modules
        .iter()
        .filter(|m| {
            krate
                .modules
                .iter()
                .any(|c| c.len() == m.len() + 1 && c.starts_with(m))
        })
        .cloned()
        .collect();
    assert!(
        parents.iter().any(|p| p == &["daemon".to_string()]),
        "the parser sees daemon/'s children: {parents:?}"
    );
    let mut found = Vec::new();
    for parent in &parents {
        let names: Vec<&str> = parent.iter().map(String::as_str).collect();
        for cycle in cycles(&graph_below(&krate, &names)) {
            found.push(format!(
                "in {}: {cycle}",
                if names.is_empty() {
                    "the crate".to_string()
                } else {
                    names.join("::")
                }
            ));
        }
    }
    assert!(
        found.is_empty(),
        "modules that import a sibling that imports them (docs/ARCHITECTURE.md, \"No import cycles\"):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_manifest_modules_import_each_other_without_cycles() {
    let krate = Crate::new(library());
    let graph = graph_below(&krate, &["manifest"]);
    assert!(
        graph.contains_key("validate") && graph.values().any(|deps| !deps.is_empty()),
        "the parser sees manifest/: {graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "manifest/ modules that import each other (share a checker module instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_control_handlers_import_each_other_without_cycles() {
    // wire.rs is what every handler shares; a handler file never needs another.
    let krate = Crate::new(library());
    let graph = graph_below(&krate, &["daemon", "control"]);
    assert!(
        graph.contains_key("wire") && graph.values().any(|deps| !deps.is_empty()),
        "the parser sees daemon/control/: {graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "daemon/control/ modules that import each other (move the shared part into wire.rs):\n{}",
        found.join("\n")
    );
}

/// The control socket's handler files ask the daemon through its API and
/// share only `wire.rs`: none imports another control file.
#[test]
fn the_control_handlers_import_no_other_control_file_but_wire() {
    let krate = Crate::new(library());
    let graph = graph_below(&krate, &["daemon", "control"]);
    let handlers = [
        "status",
        "install",
        "call",
        "logs",
        "files",
        "gateway",
        "credentials",
        "tokens",
    ];
    let mut found = Vec::new();
    for handler in handlers {
        let deps = graph
            .get(handler)
            .unwrap_or_else(|| panic!("no control handler {handler}: {graph:?}"));
        for (dep, at) in deps {
            if dep != "wire" {
                found.push(format!("{handler} → {dep}: {at}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "control handlers that import another control file (move the shared part into daemon::api or wire.rs):\n{}",
        found.join("\n")
    );
}

/// The daemon's faces (the control socket, the gateway, the HTTP routes)
/// reach the actor tree only through `daemon::api`: none names an actor's
/// message, the status board or the ready sessions (the fault-injection
/// panic of a bundle's actor excepted).
#[test]
fn the_faces_reach_the_actors_only_through_the_api() {
    let faces = |rel: &str| {
        rel.starts_with("daemon/control/")
            || rel.starts_with("daemon/gateway/")
            || rel == "daemon/http.rs"
            || rel == "daemon/conns.rs"
    };
    let mut found = Vec::new();
    let mut seen = 0;
    for (rel, code) in library().into_iter().filter(|(rel, _)| faces(rel)) {
        seen += 1;
        let code = blank(&code).replace("BundleMsg::Panic", "");
        for needle in [
            "DaemonMsg::",
            "WorkspaceMsg::",
            "BundleMsg::",
            ".board.",
            ".lanes",
        ] {
            if code.contains(needle) {
                found.push(format!("src/{rel} names {needle}"));
            }
        }
    }
    assert!(seen > 10, "the faces are read: {seen}");
    assert!(
        found.is_empty(),
        "a face that goes around daemon::api (add what it needs to the API):\n{}",
        found.join("\n")
    );
}

/// A `HostContext` needs the workspace's host port, which only the
/// WorkspaceActor hands out (to the BundleActors it spawns), and only the
/// BundleActor makes one: so every bundle connection serves host-resources
/// requests for its own workspace.
#[test]
fn only_the_workspace_hands_out_its_host_port_and_only_the_bundle_actor_makes_a_host_context() {
    let mut made = Vec::new();
    let mut ported = Vec::new();
    for (rel, code) in library() {
        let code = blank(&code);
        if code.contains("HostContext::new(") {
            made.push(rel.clone());
        }
        if code.contains("get_derived()") {
            ported.push(rel);
        }
    }
    assert_eq!(made, ["daemon/bundle/mod.rs"]);
    assert_eq!(ported, ["daemon/workspace.rs"]);
}

#[test]
fn protocol_imports_nothing_from_the_crate() {
    let krate = Crate::new(library());
    let breaches = protocol_boundary_breaches(&krate);
    assert!(
        breaches.is_empty(),
        "protocol/ is an API boundary (serde types only), yet:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn only_the_binary_imports_the_cli() {
    let krate = Crate::new(library());
    let importers = cli_importers(&krate);
    assert!(
        importers.is_empty(),
        "only src/bin/ may import cli (the control client is crate::client), yet:\n{}",
        importers.join("\n")
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut others = Vec::new();
    sources(&root.join("benches"), &mut others);
    sources(&root.join("tests"), &mut others);
    let no_modules = BTreeSet::new();
    for file in others.iter().filter(|f| !f.ends_with("tidy.rs")) {
        let code = blank(&std::fs::read_to_string(file).unwrap());
        for named in named_paths(&code, &[], &no_modules, "bundlevisor") {
            assert!(
                named.path.first().map(String::as_str) != Some("cli"),
                "{}:{} imports the cli module",
                file.display(),
                named.line
            );
        }
    }
}

#[test]
fn the_mcp_client_is_built_only_in_bundle_connect() {
    let files = library();
    let found = mcp_client_builders(&files);
    assert!(
        found.is_empty(),
        "an MCP client built outside bundle/connect.rs (only it may, so every bundle gets the host-resources handlers):\n{}",
        found.join("\n")
    );
    let connect = &files
        .iter()
        .find(|(rel, _)| rel == "bundle/connect.rs")
        .unwrap()
        .1;
    assert!(
        blank(connect).contains("serve_client"),
        "bundle/connect.rs no longer builds the client?"
    );
}

/// The checks above against sources made up to break each invariant: each
/// check must see the breach (so none of them passes by reading nothing).
#[test]
fn each_check_sees_what_it_checks() {
    let krate = |files: &[(&str, &str)]| {
        Crate::new(
            files
                .iter()
                .map(|(rel, code)| (rel.to_string(), code.to_string()))
                .collect(),
        )
    };
    // A cycle through a multi-line nested group and a `super::super::`.
    let k = krate(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
        ("a.rs", "use crate::{\n    c::X,\n    b::{\n        inner::{Y, Z},\n    },\n};"),
        ("b/mod.rs", "pub mod inner;"),
        ("b/inner/mod.rs", "pub mod deep;"),
        ("b/inner/deep.rs", "fn f() { super::super::super::a::g() }"),
        ("c.rs", "// crate::a::g in a comment\nconst S: &str = \"crate::a::g\";\nconst C: char = '{';\nfn f<'a>(x: &'a str) {}"),
    ]);
    let graph = graph_below(&k, &[]);
    assert_eq!(
        graph["c"].len(),
        0,
        "comments and literals are not imports: {graph:?}"
    );
    let found = cycles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("{a, b}:"), "{}", found[0]);
    assert!(
        found[0].contains("a → b: src/a.rs:4 names b::inner::Y"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("b → a: src/b/inner/deep.rs:1 names a::g"),
        "{}",
        found[0]
    );
    // A test module, wherever it stands, is no part of the code checked.
    let text = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() { let s = \"}\"; std::process::Command::new(\"x\"); }\n}\nfn b() { crate::x::y() }\n";
    let kept = without_test_modules(text);
    assert_eq!(kept.lines().count(), text.lines().count());
    assert!(
        !kept.contains("Command") && kept.contains("fn a()") && kept.contains("crate::x::y()"),
        "{kept}"
    );
    // `super::` in an inline module is its parent, not the crate root.
    let k = krate(&[
        ("lib.rs", "pub mod config; pub mod daemon;"),
        (
            "config.rs",
            "pub mod defaults {\n    pub fn d() -> super::daemon::X { todo!() }\n}",
        ),
        ("daemon.rs", "use crate::config::defaults;"),
    ]);
    assert!(cycles(&graph_below(&k, &[])).is_empty());
    // A sibling reached through the parent's re-export.
    let k = krate(&[
        (
            "manifest/mod.rs",
            "mod host;\nmod validate;\npub use host::{gate, HostBlock as Block};",
        ),
        ("manifest/validate.rs", "use super::Block;"),
        ("manifest/host.rs", "fn f() { super::validate::run() }"),
    ]);
    let found = cycles(&graph_below(&k, &["manifest"]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("validate → host: src/manifest/validate.rs:1 names manifest::Block"),
        "{}",
        found[0]
    );
    // protocol/ reaching out, however it is written.
    let k = krate(&[
        ("protocol/mod.rs", "pub mod methods;\nuse super::daemon;"),
        (
            "protocol/methods.rs",
            "use super::super::store::Row;\nuse crate::protocol::X;",
        ),
        ("daemon.rs", ""),
        ("store.rs", ""),
    ]);
    let breaches = protocol_boundary_breaches(&k);
    assert_eq!(breaches.len(), 2, "{breaches:?}");
    assert!(
        breaches[1].contains("src/protocol/methods.rs:1 names store::Row"),
        "{breaches:?}"
    );
    // The cli, through a group.
    let k = krate(&[
        ("cli/mod.rs", "pub fn main() {}"),
        ("gateway/mod.rs", "use crate::{client, cli::{self}};"),
        ("client.rs", ""),
    ]);
    assert_eq!(
        cli_importers(&k),
        vec!["src/gateway/mod.rs:1 names cli".to_string()]
    );
    // A second MCP client: rmcp's `()` handler served, a handler of our own,
    // a transport; a server's `.serve(` is no client.
    let files: Vec<(String, String)> = [
        ("bundle/connect.rs", "serve_client_with_ct(client, t, ct)"),
        ("daemon/probe.rs", "let peer = ().serve(transport).await?;"),
        ("gateway/client.rs", "impl ClientHandler for Mine {}"),
        (
            "oauth.rs",
            "let t = rmcp::transport::StreamableHttpClientTransport::from_uri(u);",
        ),
        (
            "gateway/mod.rs",
            "impl ServerHandler for Gateway {}\nlet s = Gateway.serve(stdio()).await;",
        ),
        (
            "bundle/client.rs",
            "impl ClientHandler for BundleClient {} // serve_client",
        ),
    ]
    .iter()
    .map(|(rel, code)| (rel.to_string(), code.to_string()))
    .collect();
    let found = mcp_client_builders(&files);
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/daemon/probe.rs: serves a client")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/gateway/client.rs:1: a second ClientHandler")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("src/oauth.rs:1: StreamableHttpClientTransport")),
        "{found:?}"
    );
    assert!(
        !found
            .iter()
            .any(|f| f.contains("gateway/mod.rs") || f.contains("bundle/client.rs")),
        "{found:?}"
    );
}

/// The functions of `code` (blanked, test modules gone) with a body: name,
/// first line, number of lines from `fn` to the closing brace.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let line_of = |i: usize| code[..i].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = code[i..].find("fn ").map(|k| i + k) {
        i = at + 3;
        if at > 0 && ident(b[at - 1]) {
            continue;
        }
        let (name, _) = read_ident(b, skip_ws(b, at + 3));
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` before any `;` (a declaration has none),
        // at bracket depth 0 of the signature.
        let mut k = at;
        let mut depth = 0i32;
        let open = loop {
            match b.get(k) {
                None => break None,
                Some(b';') if depth <= 0 => break None,
                Some(b'>') if k > 0 && b[k - 1] == b'-' => {}
                Some(b'(' | b'[' | b'<') => depth += 1,
                Some(b')' | b']' | b'>') => depth -= 1,
                Some(b'{') if depth <= 0 => break Some(k),
                _ => {}
            }
            k += 1;
        };
        let Some(open) = open else { continue };
        let mut braces = 0;
        let mut end = open;
        for (j, c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, line_of(at), line_of(end) - line_of(at) + 1));
    }
    out
}

/// Issue 31: no function in daemon/ is longer than about a screen; a
/// longer one is split into steps with names.
#[test]
fn no_function_in_the_daemon_is_over_120_lines() {
    const MAX: usize = 120;
    let mut long = Vec::new();
    let mut seen = 0;
    for (rel, code) in library() {
        if !rel.starts_with("daemon/") {
            continue;
        }
        for (name, line, lines) in functions(&blank(&code)) {
            seen += 1;
            if lines > MAX {
                long.push(format!("src/{rel}:{line} fn {name}: {lines} lines"));
            }
        }
    }
    assert!(
        seen > 300,
        "the scanner sees the daemon's functions: {seen}"
    );
    assert!(
        long.is_empty(),
        "functions over {MAX} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_scanner_measures_bodies_and_skips_declarations() {
    let code = "trait T { fn a(&self) -> u8; }\nfn b<T: Into<u8>>(x: T) -> u8 {\n    let y = { 1 };\n    y\n}\nimpl X { pub async fn c(&self) {} }\n";
    let found = functions(&blank(code));
    assert_eq!(
        found,
        vec![("b".to_string(), 2, 4), ("c".to_string(), 6, 1)]
    );
}

/// Issue 35 (docs/ARCHITECTURE.md): every tool call, prompt get and
/// resource read of an agent passes the guard. The functions that hand
/// one to a bundle are called from one function each, in the gateway,
/// which checks the request's grant and writes its audit line; nowhere
/// else (a search meta-tool, an endpoint) calls them.
#[test]
fn every_agent_call_passes_the_guard() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let texts: Vec<(PathBuf, String)> = files.iter().map(|f| (f.clone(), code(f))).collect();
    let body = |text: &str, line: usize, len: usize| -> String {
        text.lines()
            .skip(line - 1)
            .take(len)
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (routed, guard, permit) in [
        ("call_routed", "call_exposed", "self.permit("),
        ("prompt_routed", "get_prompt", "self.permit("),
        ("read_routed", "read_resource", "self.permit_resource("),
    ] {
        let mut callers = Vec::new();
        for (file, text) in &texts {
            for (name, line, len) in functions(text) {
                let b = body(text, line, len);
                if name != routed && b.contains(&format!(".{routed}(")) {
                    let rel = file.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
                    callers.push((rel.display().to_string(), name, b));
                }
            }
        }
        let names: Vec<(&str, &str)> = callers
            .iter()
            .map(|(f, n, _)| (f.as_str(), n.as_str()))
            .collect();
        assert_eq!(
            names,
            [("src/daemon/gateway/server.rs", guard)],
            "{routed} must be called only by the gateway's {guard}"
        );
        let checked = &callers[0].2;
        // The audit starts before the call (`self.audit(`, whose guard
        // writes the line however the request ends) and ends after it.
        assert!(
            checked.contains(permit)
                && checked.contains("self.audit(")
                && checked.contains("audited.end("),
            "{guard} must check the grant ({permit}) and write the audit line before and after {routed}"
        );
    }
}

/// The places `unsafe` stands in the encoder (crates/embed), each with
/// why it is sound: a `// SAFETY:` comment within the three lines above
/// every `unsafe` block, a `# Safety` section in the doc of every `unsafe
/// fn`. Files, and `unsafe` blocks and functions in each.
fn unexplained_unsafe(root: &Path) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut files = Vec::new();
    sources(root, &mut files);
    let (mut seen, mut bare) = (BTreeMap::new(), Vec::new());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        let blanked = blank(&text);
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in blanked.lines().enumerate() {
            let block = line.contains("unsafe {");
            let function = line.contains("unsafe fn ");
            if !block && !function {
                continue;
            }
            *seen.entry(rel.clone()).or_default() += 1;
            let said = if block {
                (lines[n.saturating_sub(3)..n].iter())
                    .any(|l| l.trim_start().starts_with("// SAFETY:"))
            } else {
                // The function's own doc and attributes, right above it.
                (lines[..n].iter().rev())
                    .take_while(|l| {
                        l.trim_start().starts_with("///") || l.trim_start().starts_with("#[")
                    })
                    .any(|l| l.trim() == "/// # Safety")
            };
            if !said {
                bare.push(format!("{rel}:{}: {}", n + 1, lines[n].trim()));
            }
        }
    }
    (seen, bare)
}

#[test]
fn the_encoders_unsafe_is_in_its_kernels_and_says_why_it_is_sound() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/embed/src");
    let (seen, bare) = unexplained_unsafe(&root);
    assert!(bare.is_empty(), "unsafe without its reason: {bare:#?}");
    let files: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        files,
        ["bert.rs", "lib.rs", "linear.rs"],
        "unsafe only in the products (the AVX kernels, the dot product, the attention's gemm)"
    );
    // The check sees what it checks.
    let dir = std::env::temp_dir().join(format!("tidy-unsafe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.rs"),
        "fn a() {\n    // SAFETY: fine\n    unsafe { f() }\n}\nfn b() {\n    unsafe { g() }\n}\n/// # Safety\n/// none\nunsafe fn c() {}\nunsafe fn d() {}\n",
    )
    .unwrap();
    let (_, bare) = unexplained_unsafe(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        bare,
        ["x.rs:6: unsafe { g() }", "x.rs:11: unsafe fn d() {}"]
    );
}

/// Issue 37: rmcp spawns one task per request whose future holds the
/// handler's future by value, and tokio copies a task's future whole when
/// it spawns it. Every async request handler of the gateway boxes its body
/// (`Box::pin(async move { … }).await`), so that spawn stays small whatever
/// the request; unboxed, the copies were a third of a call's instructions.
#[test]
fn every_gateway_request_handler_boxes_its_body() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon/gateway/server.rs");
    let code = blank(&code(&path));
    let start = code
        .find("impl ServerHandler for Gateway {")
        .expect("the gateway implements rmcp's ServerHandler");
    let block = &code[start..];
    let block = &block[..block.find("\n}\n").unwrap()];
    let mut handlers = 0;
    let mut unboxed = Vec::new();
    let mut from = 0;
    while let Some(at) = block[from..].find("    async fn ").map(|i| from + i) {
        from = at + 1;
        let (name, _) = read_ident(block.as_bytes(), at + "    async fn ".len());
        let open = block[at..].find(" {\n").map(|i| at + i + 3).unwrap();
        let first = block[open..].trim_start();
        // A notification's handler (`on_initialized`, `on_cancelled`) is
        // not a request's.
        if name.starts_with("on_") {
            continue;
        }
        handlers += 1;
        if !first.starts_with("Box::pin(async move {") {
            unboxed.push(name);
        }
    }
    assert!(handlers >= 10, "the check sees the handlers: {handlers}");
    assert!(
        unboxed.is_empty(),
        "request handlers whose body is not boxed: {unboxed:?}"
    );
}
