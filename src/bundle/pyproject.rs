//! A uv bundle's Python project (`pyproject.toml`, perhaps `uv.lock`),
//! read and checked by the daemon before uv sees it.
//!
//! uv runs as the daemon (root), so the daemon decides what it may read,
//! run and fetch, not the bundle:
//!
//! - The files are opened without following links (a `pyproject.toml`
//!   linked to `/proc/1/environ` or another root-only file is refused before
//!   a byte is read), must be regular files of a bounded size, and in a
//!   folder that is neither the daemon's nor root's (an admitted user's)
//!   must belong to the folder's owner. uv is then given a copy of the bytes
//!   checked here, in a folder of the daemon's: it never opens a file of
//!   the bundle, so nothing it quotes in an error can come from elsewhere.
//! - A project whose dependencies only its build backend can tell
//!   (`project.dynamic` with `dependencies` or `optional-dependencies`, or
//!   no `[project]` table) is refused unless it ships a `uv.lock`: uv would
//!   run that backend, the bundle's code, as root to learn them. A build
//!   backend inside the project (`build-system.backend-path`) is refused
//!   always.
//! - Packages come only from the configured indexes: a direct reference
//!   (`pkg @ https://…`, `pkg @ file:///…`), a `[tool.uv.sources]` entry,
//!   an index of the project's own, or a locked package from anything but
//!   a registry is refused unless `[uv] allow_direct_references = true`.
//!   A lock's own download URLs are never used (see `uv.rs`: the lock is
//!   exported to pinned, hashed requirements that uv installs from the
//!   index), and [`check_exported`] checks that export once more.
//!
//! Every problem is reported at once, each with its fix.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Larger project files are refused (a real `uv.lock` of a large project
/// is a few hundred KiB).
pub const MAX_PYPROJECT_BYTES: u64 = 1 << 20;
pub const MAX_LOCK_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// A project file that cannot be used; `reason` never holds its content.
    #[error("cannot use {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{path} is not valid TOML (line {line}, column {column}: {message}); fix the file and install the bundle again")]
    Toml {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("the uv bundle in {folder} is refused: {}", problems.join("; "))]
    Refused {
        folder: PathBuf,
        problems: Vec<String>,
    },
}

/// The project files as read from the bundle folder (the bytes uv gets).
#[derive(Debug, Clone)]
pub struct ProjectFiles {
    pub pyproject: Vec<u8>,
    pub lock: Option<Vec<u8>>,
}

/// Reads `pyproject.toml` and `uv.lock` (if there) of the bundle folder.
pub fn read(folder: &Path) -> Result<ProjectFiles, ProjectError> {
    let owner = std::fs::metadata(folder)
        .map_err(|e| ProjectError::File {
            path: folder.to_path_buf(),
            reason: e.kind().to_string(),
        })?
        .uid();
    let pyproject =
        read_file(folder, "pyproject.toml", MAX_PYPROJECT_BYTES, owner)?.ok_or_else(|| {
            ProjectError::File {
                path: folder.join("pyproject.toml"),
                reason: "there is no such file; a uv bundle ships its pyproject.toml".into(),
            }
        })?;
    let lock = read_file(folder, "uv.lock", MAX_LOCK_BYTES, owner)?;
    Ok(ProjectFiles { pyproject, lock })
}

/// One project file: not a link, a regular file, at most `max` bytes,
/// and in a folder owned by anyone but the daemon or root, the owner's.
/// `None` when it does not exist.
fn read_file(
    folder: &Path,
    name: &str,
    max: u64,
    folder_owner: u32,
) -> Result<Option<Vec<u8>>, ProjectError> {
    let path = folder.join(name);
    let refuse = |reason: String| ProjectError::File {
        path: path.clone(),
        reason,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        // Not a link; and a FIFO does not block the open.
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(refuse(format!(
                "it is a symbolic link; {name} must be a file in the bundle folder (copy it in instead of linking it)"
            )))
        }
        Err(e) => return Err(refuse(e.kind().to_string())),
    };
    let meta = file.metadata().map_err(|e| refuse(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(refuse(format!(
            "it is not a regular file; {name} must be a file in the bundle folder"
        )));
    }
    let daemon = nix::unistd::geteuid().as_raw();
    if folder_owner != 0 && folder_owner != daemon && meta.uid() != folder_owner {
        return Err(refuse(format!(
            "it belongs to uid {}, not to the bundle folder's owner (uid {folder_owner}); the owner's own file is used, nobody else's",
            meta.uid()
        )));
    }
    if meta.len() > max {
        return Err(refuse(format!("it is larger than {max} bytes")));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| refuse(e.kind().to_string()))?;
    if bytes.len() as u64 > max {
        return Err(refuse(format!("it is larger than {max} bytes")));
    }
    Ok(Some(bytes))
}

/// Parses one project file; an error says where, never quotes the line.
fn parse(folder: &Path, name: &str, bytes: &[u8]) -> Result<toml::Table, ProjectError> {
    let path = folder.join(name);
    let text = std::str::from_utf8(bytes).map_err(|e| ProjectError::File {
        path: path.clone(),
        reason: format!(
            "it is not UTF-8 text (at byte {}); fix the file",
            e.valid_up_to()
        ),
    })?;
    text.parse::<toml::Table>().map_err(|e| {
        let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
        let before = &text.as_bytes()[..at];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = at
            - before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |p| p + 1)
            + 1;
        ProjectError::Toml {
            path,
            line,
            column,
            message: e.message().to_string(),
        }
    })
}

/// Checks the project files; every problem at once.
pub fn check(
    folder: &Path,
    files: &ProjectFiles,
    allow_direct_references: bool,
) -> Result<(), ProjectError> {
    let project = parse(folder, "pyproject.toml", &files.pyproject)?;
    let lock = match &files.lock {
        Some(bytes) => Some(parse(folder, "uv.lock", bytes)?),
        None => None,
    };
    let mut problems = Vec::new();
    let opt_in = "or set [uv] allow_direct_references = true for bundles you trust";

    // What only the project's build backend could tell.
    if lock.is_none() {
        match project.get("project").and_then(|p| p.as_table()) {
            None => problems.push(
                "pyproject.toml has no [project] table, so uv would run the project's build backend (its code, as root) to learn the dependencies; add [project] with name, version and dependencies, or ship a uv.lock (`uv lock`)".to_string(),
            ),
            Some(table) => {
                let dynamic = strings(table.get("dynamic"));
                for field in ["dependencies", "optional-dependencies"] {
                    if dynamic.contains(&field) {
                        problems.push(format!(
                            "project.dynamic lists \"{field}\", so uv would run the project's build backend (its code, as root) to learn them; list them in project.{field}, or ship a uv.lock (`uv lock`)"
                        ));
                    }
                }
            }
        }
    }
    if let Some(build) = project.get("build-system").and_then(|b| b.as_table()) {
        if build.contains_key("backend-path") {
            problems.push(
                "build-system.backend-path makes code of the bundle its build backend; use a published backend (hatchling, setuptools, …) or none".to_string(),
            );
        }
    }

    // Direct references, wherever a requirement can be written.
    if !allow_direct_references {
        let at = |table: &toml::Table, keys: &[&str]| -> Option<toml::Value> {
            let mut value = table.get(keys[0])?;
            for key in &keys[1..] {
                value = value.get(key)?;
            }
            Some(value.clone())
        };
        let mut lists: Vec<(String, toml::Value)> = Vec::new();
        for keys in [
            &["project", "dependencies"][..],
            &["build-system", "requires"],
            &["tool", "uv", "dev-dependencies"],
            &["tool", "uv", "override-dependencies"],
            &["tool", "uv", "constraint-dependencies"],
            &["tool", "uv", "build-constraint-dependencies"],
        ] {
            if let Some(v) = at(&project, keys) {
                lists.push((keys.join("."), v));
            }
        }
        for table in [
            &["project", "optional-dependencies"][..],
            &["dependency-groups"],
        ] {
            if let Some(toml::Value::Table(groups)) = at(&project, table) {
                for (group, v) in groups {
                    lists.push((format!("{}.{group}", table.join(".")), v.clone()));
                }
            }
        }
        for (place, list) in &lists {
            for requirement in strings(Some(list)) {
                if is_direct_reference(requirement) {
                    let requirement = without_credentials(requirement);
                    problems.push(format!(
                        "{place} has the direct reference {requirement:?}: the daemon installs packages only from the configured index; publish it there, {opt_in}"
                    ));
                }
            }
        }
        let uv = at(&project, &["tool", "uv"]);
        if let Some(toml::Value::Table(uv)) = &uv {
            if let Some(toml::Value::Table(sources)) = uv.get("sources") {
                for name in sources.keys() {
                    problems.push(format!(
                        "tool.uv.sources.{name} takes a package from somewhere other than the configured index; remove it, {opt_in}"
                    ));
                }
            }
            for key in ["index", "index-url", "extra-index-url", "find-links"] {
                if uv.contains_key(key) {
                    problems.push(format!(
                        "tool.uv.{key} names package sources of the bundle's own; the daemon uses the configured index (UV_DEFAULT_INDEX through [sandbox] pass_env); remove it, {opt_in}"
                    ));
                }
            }
        }
        if let Some(lock) = &lock {
            let root = project
                .get("project")
                .and_then(|p| p.get("name"))
                .and_then(|n| n.as_str());
            for package in lock
                .get("package")
                .and_then(|p| p.as_array())
                .into_iter()
                .flatten()
            {
                let name = package.get("name").and_then(|n| n.as_str()).unwrap_or("?");
                let Some(source) = package.get("source").and_then(|s| s.as_table()) else {
                    problems.push(format!(
                        "uv.lock: package {name:?} has no source; lock the project again (`uv lock`)"
                    ));
                    continue;
                };
                let this_project = Some(name) == root
                    && ["virtual", "editable", "directory"]
                        .iter()
                        .any(|k| source.get(*k).and_then(|v| v.as_str()) == Some("."));
                if source.contains_key("registry") || this_project {
                    continue;
                }
                let kind = source.keys().next().map(String::as_str).unwrap_or("?");
                problems.push(format!(
                    "uv.lock: package {name:?} comes from a {kind} source, not from an index; the daemon installs packages only from the configured index; publish it there, {opt_in}"
                ));
            }
        }
    }
    if let Some(uv) = project.get("tool").and_then(|t| t.get("uv")) {
        if uv.get("workspace").is_some() {
            problems.push(
                "tool.uv.workspace: a uv workspace is not supported in a bundle (uv sees only pyproject.toml and uv.lock); make the bundle one project".to_string(),
            );
        }
    }
    refused_if_any(folder, problems)
}

/// Checks the requirements uv exported from a checked lock: only pinned
/// names (with markers and hashes), no options (`--index-url`,
/// `--find-links`, `-e`, `-r`) and, unless allowed, no direct references.
pub fn check_exported(
    folder: &Path,
    requirements: &str,
    allow_direct_references: bool,
) -> Result<(), ProjectError> {
    let mut problems = Vec::new();
    for line in requirements.lines() {
        let line = line.trim().trim_end_matches('\\').trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("--hash=") {
            continue;
        }
        if line.starts_with('-') {
            problems.push(format!(
                "the requirements exported from uv.lock hold the option {:?}; lock the project again (`uv lock`)",
                line.split_whitespace().next().unwrap_or(line)
            ));
        } else if !allow_direct_references && is_direct_reference(line) {
            let line = without_credentials(line);
            problems.push(format!(
                "uv.lock locks the direct reference {line:?}: the daemon installs packages only from the configured index; publish it there, or set [uv] allow_direct_references = true for bundles you trust"
            ));
        }
    }
    refused_if_any(folder, problems)
}

/// The strings of a TOML array (other items, such as a dependency group's
/// `{include-group = …}`, are not requirements).
fn strings(value: Option<&toml::Value>) -> Vec<&str> {
    value
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect()
}

/// Every problem found at once, or none.
fn refused_if_any(folder: &Path, problems: Vec<String>) -> Result<(), ProjectError> {
    if problems.is_empty() {
        return Ok(());
    }
    Err(ProjectError::Refused {
        folder: folder.to_path_buf(),
        problems,
    })
}

/// A requirement as it may be shown: the user and password of every URL
/// in it (`https://USER:TOKEN@host/…`, `git+https://TOKEN@…`) replaced by
/// `***`, so a refusal quoting it never carries a credential.
fn without_credentials(requirement: &str) -> String {
    let mut shown = String::with_capacity(requirement.len());
    let mut rest = requirement;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        shown.push_str(head);
        let authority_end = tail.find(['/', '?', '#', ' ']).unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(user_end) => {
                shown.push_str("***");
                rest = &tail[user_end..];
            }
            None => rest = tail,
        }
    }
    shown.push_str(rest);
    shown
}

/// A requirement that names where its files come from: `name @ URL`, or a
/// bare URL or path. Names, extras and version specifiers never hold `@`
/// or `/`; markers (after `;`) may, in quoted strings.
fn is_direct_reference(requirement: &str) -> bool {
    let before_marker = requirement.split(';').next().unwrap_or(requirement);
    before_marker.contains(['@', '/', '\\'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(pyproject: &str, lock: Option<&str>, allow: bool) -> Result<(), String> {
        let files = ProjectFiles {
            pyproject: pyproject.as_bytes().to_vec(),
            lock: lock.map(|l| l.as_bytes().to_vec()),
        };
        check(Path::new("/b"), &files, allow).map_err(|e| e.to_string())
    }

    const PLAIN: &str = "[project]\nname = \"b\"\nversion = \"1\"\ndependencies = [\"mcp>=1\", \"idna ; python_version >= '3.10' and platform_release != 'a@b/c'\"]\n[build-system]\nrequires = [\"hatchling\"]\nbuild-backend = \"hatchling.build\"\n";

    #[test]
    fn a_plain_project_passes() {
        checked(PLAIN, None, false).unwrap();
    }

    #[test]
    fn what_only_the_build_backend_could_tell_is_refused_without_a_lock() {
        let dynamic = "[project]\nname = \"b\"\nversion = \"1\"\ndynamic = [\"dependencies\", \"optional-dependencies\"]\n[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n";
        let e = checked(dynamic, None, true).unwrap_err();
        assert!(e.contains("the uv bundle in /b is refused"), "{e}");
        assert!(e.contains("project.dynamic lists \"dependencies\""), "{e}");
        assert!(
            e.contains("project.dynamic lists \"optional-dependencies\""),
            "{e}"
        );
        assert!(e.contains("build-system.backend-path"), "{e}");
        let e = checked("[tool.x]\na = 1\n", None, false).unwrap_err();
        assert!(e.contains("no [project] table"), "{e}");
        // With a lock, uv takes the dependencies from it (never the backend).
        let dynamic = "[project]\nname = \"b\"\nversion = \"1\"\ndynamic = [\"dependencies\"]\n";
        checked(dynamic, Some("version = 1\n"), false).unwrap();
        // Other dynamic fields need no build to install the dependencies.
        checked(
            "[project]\nname = \"b\"\ndynamic = [\"version\", \"readme\"]\n",
            None,
            false,
        )
        .unwrap();
    }

    #[test]
    fn direct_references_are_refused_everywhere_unless_allowed() {
        let project = "[project]\nname = \"b\"\nversion = \"1\"\ndependencies = [\"x @ http://127.0.0.1:9/x.whl\"]\n[project.optional-dependencies]\nextra = [\"y @ file:///root/y.whl\"]\n[dependency-groups]\ndev = [\"z@git+https://e.example/z\", {include-group = \"other\"}, \"./local.whl\"]\n[tool.uv.sources]\nmcp = { git = \"https://e.example/mcp\" }\n[tool.uv]\nextra-index-url = [\"http://127.0.0.1:9/simple\"]\n";
        let e = checked(project, None, false).unwrap_err();
        for expected in [
            "project.dependencies has the direct reference \"x @ http://127.0.0.1:9/x.whl\"",
            "project.optional-dependencies.extra has the direct reference \"y @ file:///root/y.whl\"",
            "dependency-groups.dev has the direct reference \"z@git+https://e.example/z\"",
            "dependency-groups.dev has the direct reference \"./local.whl\"",
            "tool.uv.sources.mcp",
            "tool.uv.extra-index-url",
            "allow_direct_references = true",
        ] {
            assert!(e.contains(expected), "{expected}: {e}");
        }
        checked(project, None, true).unwrap();
    }

    #[test]
    fn a_lock_may_name_registries_and_the_project_itself_only() {
        let lock = "version = 1\n[[package]]\nname = \"b\"\nversion = \"1\"\nsource = { virtual = \".\" }\n[[package]]\nname = \"idna\"\nversion = \"3.10\"\nsource = { registry = \"https://pypi.org/simple\" }\n";
        checked(PLAIN, Some(lock), false).unwrap();
        let lock = format!("{lock}[[package]]\nname = \"evil\"\nversion = \"1\"\nsource = {{ url = \"http://127.0.0.1:9/evil.whl\" }}\n[[package]]\nname = \"side\"\nversion = \"1\"\nsource = {{ editable = \".\" }}\n");
        let e = checked(PLAIN, Some(&lock), false).unwrap_err();
        assert!(
            e.contains("package \"evil\" comes from a url source"),
            "{e}"
        );
        assert!(
            e.contains("package \"side\" comes from a editable source"),
            "{e}"
        );
        checked(PLAIN, Some(&lock), true).unwrap();
    }

    #[test]
    fn an_exported_lock_holds_pinned_names_only() {
        let fine = "idna==3.10 ; python_full_version >= '3.10' \\\n    --hash=sha256:12 \\\n    --hash=sha256:94\n    # via b\n";
        check_exported(Path::new("/b"), fine, false).unwrap();
        let e = check_exported(
            Path::new("/b"),
            "--index-url http://127.0.0.1:9/simple\nx @ http://127.0.0.1:9/x.whl\n",
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the option \"--index-url\""), "{e}");
        assert!(e.contains("direct reference \"x @ http"), "{e}");
    }

    #[test]
    fn a_parse_error_says_where_without_quoting_the_line() {
        let e = checked(
            "[project]\nname = \"b\"\nSECRET_KEY=sk-CANARY-abc def\n",
            None,
            false,
        )
        .unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        assert!(!e.contains("CANARY") && !e.contains("SECRET_KEY"), "{e}");
    }

    #[test]
    fn links_foreign_files_and_fifos_are_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "TOKEN=sk-CANARY\n").unwrap();
        let folder = dir.path().join("bundle");
        std::fs::create_dir(&folder).unwrap();
        std::os::unix::fs::symlink(&secret, folder.join("pyproject.toml")).unwrap();
        let e = read(&folder).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_file(folder.join("pyproject.toml")).unwrap();
        nix::unistd::mkfifo(
            &folder.join("pyproject.toml"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let e = read(&folder).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_file(folder.join("pyproject.toml")).unwrap();
        std::fs::write(folder.join("pyproject.toml"), PLAIN).unwrap();
        let files = read(&folder).unwrap();
        assert_eq!(files.pyproject, PLAIN.as_bytes());
        assert!(files.lock.is_none());
        // In a folder of another user, a file that user does not own.
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&folder, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
            let e = read(&folder).unwrap_err().to_string();
            assert!(
                e.contains("not to the bundle folder's owner (uid 65534)"),
                "{e}"
            );
        }
    }

    #[test]
    fn credentials_in_a_quoted_requirement_are_masked() {
        assert_eq!(
            without_credentials("pkg @ https://user:s3cret@host.example/p.whl"),
            "pkg @ https://***@host.example/p.whl"
        );
        assert_eq!(
            without_credentials("pkg @ git+https://TOKEN@git.example/r.git@v1"),
            "pkg @ git+https://***@git.example/r.git@v1"
        );
        assert_eq!(
            without_credentials("pkg @ file:///srv/p.whl"),
            "pkg @ file:///srv/p.whl"
        );
        assert_eq!(without_credentials("pkg>=1"), "pkg>=1");
    }
}
