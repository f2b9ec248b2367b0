//! uv bundles (MCPB 0.4 `server.type = "uv"`), with the real uv (pinned,
//! from PyPI, by `make uv`) and the official `mcp-server-time` (PyPI,
//! locked by `tests/servers/time-uv/uv.lock`): the daemon builds the
//! environment once per version, outside the read-only bundle folder, and
//! a failed build is a clear `failed`, not a crash loop.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::Daemon;
use serde_json::Value;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The daemon's `[uv]` table: the pinned uv, the system's Python (readable
/// by the bundles' uids), and one download cache for the whole test run.
fn uv_config() -> String {
    let uv = Path::new(REPO).join("target/uv/venv/bin/uv");
    assert!(
        uv.is_file(),
        "uv is not installed at {}; run `make uv` (make test does)",
        uv.display()
    );
    format!(
        "[uv]\ncommand = \"{}\"\npython = \"/usr/bin/python3\"\ncache_dir = \"{}\"\n",
        uv.display(),
        Path::new(REPO).join("target/uv-cache").display()
    )
}

/// A copy of `tests/servers/time-uv` at `dir/NAME`, with `edit` applied to its manifest.
fn time_uv(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let from = Path::new(REPO).join("tests/servers/time-uv");
    let to = dir.join(name);
    std::fs::create_dir_all(to.join("src")).unwrap();
    for file in ["pyproject.toml", "uv.lock", "src/server.py", ".mcpbignore"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("manifest.json")).unwrap())
            .unwrap();
    manifest["name"] = Value::from(name);
    edit(&mut manifest);
    std::fs::write(
        to.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    to
}

/// The bundle's environments: `STATE_DIR/sandboxes/default/NAME/env/*`.
fn environments(d: &Daemon, name: &str) -> Vec<PathBuf> {
    let root = d
        .root()
        .join("state/sandboxes/default")
        .join(name)
        .join("env");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|e| e.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.sort();
    found
}

fn current_time(d: &Daemon, name: &str) -> String {
    d.ok(&[
        "call",
        name,
        "get_current_time",
        r#"{"timezone":"Asia/Tokyo"}"#,
    ])
}

/// Issue 18, point 5: the official time server as the uv bundle the
/// official CLI packs (its `mcp_config` runs `uv run`), installed from the
/// archive: the environment is built at install (progress as `preparing`
/// events), reused at a restart, and the unpacked bundle is never written.
#[test]
fn the_official_time_server_packed_as_a_uv_bundle_builds_once_and_serves() {
    let d = Daemon::start_with(&uv_config());
    let folder = time_uv(&d.root().join("src"), "time-uv", |_| {});
    let archive = d.root().join("time-uv.mcpb");
    let mcpb = Path::new(REPO).join("target/mcpb/node_modules/.bin/mcpb");
    let packed = Command::new(&mcpb)
        .arg("pack")
        .arg(&folder)
        .arg(&archive)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; run `make mcpb`", mcpb.display()));
    assert!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );

    let events = common::events(&d, &["events", "--json"]);
    d.ok(&["install", archive.to_str().unwrap()]);
    let seen = events.until("time-uv ready", |l| {
        l.contains("\"time-uv\"") && l.contains("\"kind\":\"ready\"")
    });
    let preparing: Vec<&String> = seen
        .iter()
        .filter(|l| l.contains("\"time-uv\"") && l.contains("\"kind\":\"preparing\""))
        .collect();
    assert!(
        preparing.iter().any(|l| l.contains("Installed")),
        "no progress of the build: {seen:#?}"
    );

    let now = current_time(&d, "time-uv");
    assert!(
        now.contains("Asia/Tokyo") && now.contains("datetime"),
        "{now}"
    );

    let envs = environments(&d, "time-uv");
    assert_eq!(envs.len(), 1, "{envs:?}");
    let stamp = envs[0].join(".bundlevisor-env");
    let built = std::fs::metadata(&stamp).unwrap();
    // The bundle reads its environment; it cannot change it.
    let b = d.bundle("default", "time-uv").unwrap();
    let read = b["sandbox"]["read"].as_array().unwrap();
    assert!(
        read.iter().any(|p| p == envs[0].to_str().unwrap()),
        "{read:?}"
    );
    let write = b["sandbox"]["write"].as_array().unwrap();
    assert!(
        !write.iter().any(|p| p.as_str().unwrap().contains("/env")),
        "{write:?}"
    );
    // The unpacked bundle folder holds what the archive held, nothing more.
    let unpacked = PathBuf::from(b["archive"]["unpacked"].as_str().unwrap());
    assert!(!unpacked.join(".venv").exists());

    // A restart finds the environment: nothing is built again.
    d.ok(&["restart", "time-uv"]);
    let now = current_time(&d, "time-uv");
    assert!(now.contains("datetime"), "{now}");
    assert_eq!(environments(&d, "time-uv"), envs);
    let after = std::fs::metadata(&stamp).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (built.ino(), built.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    assert_eq!(
        d.log()
            .matches("built the bundle's Python environment")
            .count(),
        1,
        "{}",
        d.log()
    );
}

/// Issue 18, point 5: a uv bundle as the MCPB example writes it (no
/// `mcp_config`: the host runs `python ENTRY_POINT` in the environment);
/// an upgrade with another lock builds a new environment and removes the
/// old one.
#[test]
fn a_uv_bundle_without_mcp_config_runs_its_entry_point_and_an_upgrade_rebuilds() {
    let d = Daemon::start_with(&uv_config());
    let folder = time_uv(&d.root().join("src"), "clock", |m| {
        m["server"].as_object_mut().unwrap().remove("mcp_config");
    });
    d.ok(&["install", folder.to_str().unwrap()]);
    let now = current_time(&d, "clock");
    assert!(now.contains("Asia/Tokyo"), "{now}");
    let first = environments(&d, "clock");
    assert_eq!(first.len(), 1);
    // It runs `ENV/bin/python ENTRY_POINT`.
    let pid = d.bundle("default", "clock").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(argv[0], first[0].join("bin/python").to_str().unwrap());
    assert_eq!(argv[1], folder.join("src/server.py").to_str().unwrap());

    // The bundle's project changes (a new version): a new environment.
    let project = folder.join("pyproject.toml");
    let text = std::fs::read_to_string(&project).unwrap();
    std::fs::write(
        &project,
        text.replace("version = \"2026.10.19\"", "version = \"2026.10.20\""),
    )
    .unwrap();
    std::fs::remove_file(folder.join("uv.lock")).unwrap();
    d.ok(&["restart", "clock"]);
    assert!(current_time(&d, "clock").contains("datetime"));
    let second = environments(&d, "clock");
    assert_eq!(second.len(), 1, "the old environment stays: {second:?}");
    assert_ne!(first, second);
}

/// Issue 18, point 5: a dependency the index does not have is a `failed`
/// bundle with uv's reason, not a crash loop; a missing uv is refused at
/// install.
#[test]
fn a_failed_resolution_is_a_clear_failure_and_a_missing_uv_is_refused() {
    let d = Daemon::start_with(&uv_config());
    let folder = time_uv(&d.root().join("src"), "broken", |_| {});
    std::fs::write(
        folder.join("pyproject.toml"),
        "[project]\nname = \"broken\"\nversion = \"1\"\nrequires-python = \">=3.10\"\ndependencies = [\"bundlevisor-no-such-package-zz==1.0\"]\n",
    )
    .unwrap();
    std::fs::remove_file(folder.join("uv.lock")).unwrap();
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("building the Python environment failed")
            && said.contains("bundlevisor-no-such-package-zz"),
        "{said}"
    );
    let b = d.bundle("default", "broken").unwrap();
    assert_eq!(b["state"], "failed", "{b:#}");
    assert!(
        b["last_error"]
            .as_str()
            .unwrap()
            .contains("bundlevisor-no-such-package-zz"),
        "{b:#}"
    );
    assert_eq!(b["restarts"], 0, "{b:#}");
    // An unfinished environment is not left to be mistaken for a built one.
    for env in environments(&d, "broken") {
        assert!(!env.join(".bundlevisor-env").exists());
    }

    let without = Daemon::start_with("[uv]\ncommand = \"/nonexistent/uv\"\n");
    let folder = time_uv(&without.root().join("src"), "time-uv", |_| {});
    let out = without.cli(&["install", folder.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("[uv] command"), "{said}");
    assert!(without.bundle("default", "time-uv").is_none());
}

/// Issue 18, point 5, and "a broken bundle never takes down the running
/// version": a watched uv bundle's upgrade is built while the running
/// version serves; one whose dependencies cannot be resolved is rejected
/// and the running version keeps running; a good one replaces it.
#[test]
fn a_watched_uv_upgrade_is_built_before_the_running_version_stops() {
    let d = Daemon::start_with(&format!(
        "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n{}",
        uv_config()
    ));
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    // Made beside the folder and renamed in whole, as a deploy tool does.
    let staged = time_uv(&d.root().join("staging"), "clock", |_| {});
    std::fs::rename(&staged, watched.join("clock")).unwrap();
    let folder = watched.join("clock");
    let d = &d;
    let ready = |version: &'static str| {
        move || {
            d.bundle("default", "clock")
                .filter(|b| b["state"] == "ready" && b["version"] == version)
        }
    };
    let b = common::wait_for(Duration::from_secs(60), "v1 ready", ready("2026.10.19"));
    let pid = b["pid"].as_u64().unwrap();
    let first = environments(d, "clock");

    // v2 depends on a package the index does not have.
    let set_version = |version: &str| {
        let file = folder.join("manifest.json");
        let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        m["version"] = Value::from(version);
        let tmp = folder.join("manifest.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
        std::fs::rename(tmp, file).unwrap();
    };
    let project = std::fs::read_to_string(folder.join("pyproject.toml")).unwrap();
    std::fs::remove_file(folder.join("uv.lock")).unwrap();
    std::fs::write(
        folder.join("pyproject.toml"),
        project.replace(
            "\"mcp-server-time==2026.10.19\"",
            "\"mcp-server-time==2026.10.19\", \"bundlevisor-no-such-package-zz==1.0\"",
        ),
    )
    .unwrap();
    set_version("2.0.0");
    let b = common::wait_for(Duration::from_secs(60), "the rejection", || {
        d.bundle("default", "clock").filter(|b| {
            b["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("bundlevisor-no-such-package-zz"))
        })
    });
    let why = b["last_error"].as_str().unwrap();
    assert!(why.contains("the running version keeps running"), "{why}");
    assert_eq!(b["state"], "ready");
    assert_eq!(b["version"], "2026.10.19");
    assert_eq!(b["pid"].as_u64(), Some(pid));
    assert!(current_time(d, "clock").contains("datetime"));

    // v3 is fine: built, then it replaces v1, whose environment goes.
    std::fs::write(
        folder.join("pyproject.toml"),
        project.replace("2026.10.19\"\n", "3\"\n"),
    )
    .unwrap();
    set_version("3.0.0");
    let b = common::wait_for(Duration::from_secs(120), "v3 ready", ready("3.0.0"));
    assert_ne!(b["pid"].as_u64(), Some(pid));
    assert!(current_time(d, "clock").contains("datetime"));
    let now = environments(d, "clock");
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first);
}
