//! uv bundles (MCPB 0.4 `server.type = "uv"`), with the real uv (pinned,
//! from PyPI, by `make uv`) and the official `mcp-server-time` (PyPI,
//! locked by `tests/servers/time-uv/uv.lock`): the daemon builds the
//! environment once per version, outside the read-only bundle folder, and
//! a failed build is a clear `failed`, not a crash loop.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{uv_config, Daemon};
use serde_json::Value;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

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

/// Makes the uv bundle at `folder` depend on a package the index does
/// not have (its lock removed, so uv resolves); its `pyproject.toml` as it was.
fn needs_a_missing_package(folder: &Path) -> String {
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
    project
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
    common::mcpb_pack(&folder, &archive);

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
    let project = needs_a_missing_package(&folder);
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

/// A copy of `tests/servers/time-uv` at `dir/NAME` whose `pyproject.toml`
/// is `pyproject` and whose `uv.lock` is `lock` (none: removed).
fn project_bundle(dir: &Path, name: &str, pyproject: &str, lock: Option<&str>) -> PathBuf {
    let folder = time_uv(dir, name, |_| {});
    std::fs::write(folder.join("pyproject.toml"), pyproject).unwrap();
    match lock {
        Some(lock) => std::fs::write(folder.join("uv.lock"), lock).unwrap(),
        None => std::fs::remove_file(folder.join("uv.lock")).unwrap(),
    }
    folder
}

/// `pyproject.toml` of a bundle that needs `mcp-server-time` and `extra`.
fn pyproject_with(extra: &str) -> String {
    format!(
        "[project]\nname = \"time-uv\"\nversion = \"1\"\nrequires-python = \">=3.10\"\ndependencies = [\"mcp-server-time==2026.10.19\", \"{extra}\"]\n"
    )
}

/// A loopback HTTP server that answers 404 to everything and records the
/// request line of every connection (a connection without one too).
struct Recorder {
    port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Recorder {
    fn start() -> Recorder {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 4096];
                let n = stream.read(&mut head).unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..n])
                    .lines()
                    .next()
                    .unwrap_or("(a connection without a request)")
                    .to_string();
                record.lock().unwrap().push(line);
                let _ = stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Recorder { port, seen }
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// Writes the wheel `bvmark-1.0-py3-none-any.whl` (module `bvmark`) in `dir`.
fn bvmark_wheel(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let wheel = dir.join("bvmark-1.0-py3-none-any.whl");
    let made = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             files = {'bvmark/__init__.py': 'VALUE = 1\\n',\n\
              'bvmark-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\\nName: bvmark\\nVersion: 1.0\\n',\n\
              'bvmark-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}\n\
             files['bvmark-1.0.dist-info/RECORD'] = ''.join(n + ',,\\n' for n in files) + 'bvmark-1.0.dist-info/RECORD,,\\n'\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
             \x20   [z.writestr(n, t) for n, t in files.items()]\n",
        )
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    wheel
}

/// Whether an environment of the bundle has the package `bvmark`.
fn has_bvmark(d: &Daemon, name: &str) -> bool {
    environments(d, name).iter().any(|env| {
        std::fs::read_dir(env.join("lib"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|python| python.path().join("site-packages/bvmark").exists())
    })
}

/// Installs `folder`, which must fail; returns what the CLI said.
fn install_fails(d: &Daemon, folder: &Path) -> String {
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "installed: {said}");
    said
}

fn assert_says(said: &str, expected: &[&str]) {
    for e in expected {
        assert!(said.contains(e), "{e:?} not in: {said}");
    }
}

/// Issue 30, finding 1: a project that only its build backend can tell
/// the dependencies of (`dynamic = ["dependencies"]`), with that backend
/// in the bundle (`backend-path = ["."]`): uv ran the backend as root to
/// learn them, even with `UV_NO_BUILD`. Now the daemon refuses the
/// project before uv runs, and the backend never runs.
#[test]
fn finding_30_1_a_bundle_build_backend_never_runs_at_install() {
    let d = Daemon::start_with(&uv_config());
    let marker = d.root().join("backend-ran");
    let folder = project_bundle(
        &d.root().join("src"),
        "dyn",
        "[project]\nname = \"dyn\"\nversion = \"1\"\nrequires-python = \">=3.10\"\ndynamic = [\"dependencies\"]\n\n[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n",
        None,
    );
    std::fs::write(
        folder.join("backend.py"),
        format!(
            "import os\nopen({:?}, 'w').write(str(os.getuid()))\n\
             def get_requires_for_build_wheel(config_settings=None):\n    return []\n\
             def prepare_metadata_for_build_wheel(d, config_settings=None):\n    os.makedirs(d + '/dyn-1.dist-info')\n    open(d + '/dyn-1.dist-info/METADATA', 'w').write('Metadata-Version: 2.1\\nName: dyn\\nVersion: 1\\n')\n    return 'dyn-1.dist-info'\n",
            marker.to_str().unwrap()
        ),
    )
    .unwrap();
    let said = install_fails(&d, &folder);
    assert!(
        !marker.exists(),
        "the bundle's build backend ran (as uid {})",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    assert_says(
        &said,
        &[
            "is refused",
            "project.dynamic lists \"dependencies\"",
            "build backend",
            "build-system.backend-path",
        ],
    );
    let b = d.bundle("default", "dyn").unwrap();
    assert_eq!(b["state"], "failed", "{b:#}");
    assert!(
        b["last_error"]
            .as_str()
            .unwrap()
            .contains("project.dynamic lists \"dependencies\""),
        "{b:#}"
    );
}

/// Issue 30, finding 1: a direct reference made the daemon (uv, as root)
/// fetch any URL, a loopback one here; in a lock too. Now it is refused
/// before uv runs, and nothing is fetched.
#[test]
fn finding_30_1_a_direct_reference_url_is_never_fetched() {
    let d = Daemon::start_with(&uv_config());
    let server = Recorder::start();
    let src = d.root().join("src");
    let url = format!(
        "bvmark @ http://127.0.0.1:{}/bvmark-1.0-py3-none-any.whl",
        server.port
    );
    let folder = project_bundle(&src, "by-url", &pyproject_with(&url), None);
    let said = install_fails(&d, &folder);
    assert_eq!(server.requests(), Vec::<String>::new());
    assert_says(
        &said,
        &[
            "project.dependencies has the direct reference",
            "allow_direct_references = true",
        ],
    );

    // A locked package from a URL.
    let (project, lock) = time_uv_project();
    let url = format!(
        "http://127.0.0.1:{}/bvmark-1.0-py3-none-any.whl",
        server.port
    );
    let lock = lock.replace(
        "    { name = \"mcp-server-time\" },\n]",
        "    { name = \"bvmark\" },\n    { name = \"mcp-server-time\" },\n]",
    );
    let lock = format!(
        "{lock}\n[[package]]\nname = \"bvmark\"\nversion = \"1.0\"\nsource = {{ url = \"{url}\" }}\nwheels = [{{ url = \"{url}\", hash = \"sha256:{}\" }}]\n",
        "0".repeat(64)
    );
    let project = project.replace(
        "\"mcp-server-time==2026.10.19\"",
        "\"mcp-server-time==2026.10.19\", \"bvmark\"",
    );
    let folder = project_bundle(&src, "lock-url", &project, Some(&lock));
    let said = install_fails(&d, &folder);
    assert_eq!(server.requests(), Vec::<String>::new());
    assert_says(
        &said,
        &["uv.lock: package \"bvmark\" comes from a url source"],
    );
}

/// Issue 30, finding 1: `pkg @ file:///…` made uv (as root) read a wheel
/// only root can read and install it into the world-readable environment.
#[test]
fn finding_30_1_a_root_only_wheel_is_never_read() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start_with(&uv_config());
    let private = d.root().join("root-only");
    let wheel = bvmark_wheel(&private);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&wheel, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = format!("bvmark @ file://{}", wheel.display());
    let folder = project_bundle(
        &d.root().join("src"),
        "by-file",
        &pyproject_with(&file),
        None,
    );
    let said = install_fails(&d, &folder);
    assert!(
        !has_bvmark(&d, "by-file"),
        "the root-only wheel was installed"
    );
    assert_says(&said, &["project.dependencies has the direct reference"]);
}

/// Issue 30, finding 1: `uv sync --frozen` fetched a lock's download URLs
/// as they stood (a loopback server here). Now the lock gives versions and
/// hashes only, and the files come from the configured index.
#[test]
fn finding_30_1_a_lock_download_urls_are_never_fetched() {
    // A cache of its own: a cached wheel would hide a fetch of the lock's URL.
    let cache = Path::new(REPO).join("target/uv-cache-lock-urls");
    let _ = std::fs::remove_dir_all(&cache);
    let config = uv_config().replace(
        &Path::new(REPO)
            .join("target/uv-cache")
            .display()
            .to_string(),
        &cache.display().to_string(),
    );
    let d = Daemon::start_with(&config);
    let server = Recorder::start();
    let (project, lock) = time_uv_project();
    let lock = lock.replace(
        "https://files.pythonhosted.org/",
        &format!("http://127.0.0.1:{}/", server.port),
    );
    let folder = project_bundle(&d.root().join("src"), "by-lock", &project, Some(&lock));
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert_eq!(server.requests(), Vec::<String>::new());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(current_time(&d, "by-lock").contains("datetime"));
}

/// `tests/servers/time-uv`'s `pyproject.toml` and `uv.lock`.
fn time_uv_project() -> (String, String) {
    let read = |name: &str| {
        std::fs::read_to_string(Path::new(REPO).join("tests/servers/time-uv").join(name)).unwrap()
    };
    (read("pyproject.toml"), read("uv.lock"))
}

/// Issue 30, finding 1: `[uv] allow_direct_references = true` is the
/// operator's opt-in for bundles it trusts.
#[test]
fn finding_30_1_direct_references_install_when_the_operator_allows_them() {
    let d = Daemon::start_with(&format!("{}allow_direct_references = true\n", uv_config()));
    let wheel = bvmark_wheel(&d.root().join("wheels"));
    let file = format!("bvmark @ file://{}", wheel.display());
    let folder = project_bundle(
        &d.root().join("src"),
        "trusted",
        &pyproject_with(&file),
        None,
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    assert!(current_time(&d, "trusted").contains("datetime"));
    assert!(has_bvmark(&d, "trusted"));
}

/// Issue 30, finding 3: an admitted user links its bundle's
/// `pyproject.toml` to a root-only file under a read grant (here in
/// `read_only_paths`; `/proc/<daemon pid>/environ` is the same): uv,
/// running as root, followed the link and quoted the line it could not
/// parse in the install error and `last_error`. Now the daemon opens the
/// project files without following links; nothing of the file is read.
#[test]
fn finding_30_3_a_linked_pyproject_leaks_nothing_of_its_target() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        return; // acting as another user needs root
    }
    // Made before the daemon, named in its read grants.
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("keys.env");
    std::fs::write(&secret, "SECRET_MARKER=sk-CANARY-uv-0600 and more\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut d = Daemon::unlaunched(&format!(
        "{}[control]\nallowed_gids = [{NOBODY}]\n[sandbox]\nread_only_paths = [{:?}]\n",
        uv_config(),
        secrets.path().to_str().unwrap()
    ));
    d.env.push((
        "BV_TEST_DAEMON_SECRET".into(),
        "sk-CANARY-uv-environ".into(),
    ));
    d.launch();

    let home = d.root().join("home-nobody");
    std::fs::create_dir_all(&home).unwrap();
    let leak = |name: &str, target: &Path| {
        let folder = time_uv(&home, name, |_| {});
        std::fs::remove_file(folder.join("uv.lock")).unwrap();
        std::fs::remove_file(folder.join("pyproject.toml")).unwrap();
        std::os::unix::fs::symlink(target, folder.join("pyproject.toml")).unwrap();
        let out = Command::new("chown")
            .args(["-hR", &format!("{NOBODY}:{NOBODY}")])
            .arg(&folder)
            .output()
            .unwrap();
        assert!(out.status.success());
        let install = d.cli_as(NOBODY, &["install", folder.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&install.stderr).into_owned();
        common::assert_no_canary("the install error", said.as_bytes());
        assert!(!install.status.success(), "{said}");
        assert!(
            said.contains("pyproject.toml: it is a symbolic link"),
            "{said}"
        );
        // status --json (the harness's CLI checks the answer for the canary).
        let b = d.bundle("default", name).unwrap();
        assert_eq!(b["state"], "failed", "{b:#}");
        assert!(
            b["last_error"].as_str().unwrap().contains("symbolic link"),
            "{b:#}"
        );
    };
    leak("linked", &secret);
    leak("environ", Path::new(&format!("/proc/{}/environ", d.pid())));
    common::assert_no_canary("the daemon log", d.log().as_bytes());
    assert!(!d.log().contains("SECRET_MARKER"));
}

/// Issue 36's `bundlevisor upgrade` of a uv bundle: the new version's
/// environment is built while the old one serves. One that cannot be built
/// fails the command, leaves the old version running, and gives the install
/// record back to it: after a daemon restart the old version still runs.
#[test]
fn an_operators_uv_upgrade_that_cannot_be_built_leaves_the_old_version_installed() {
    let mut d = Daemon::start_with(&uv_config());
    let v1 = time_uv(&d.root().join("v1"), "clock", |_| {});
    d.ok(&["install", v1.to_str().unwrap()]);
    let before = d.wait_state("default", "clock", "ready");
    let v2 = time_uv(&d.root().join("v2"), "clock", |m| {
        m["version"] = Value::from("2.0.0");
    });
    needs_a_missing_package(&v2);
    let out = d.cli(&["upgrade", v2.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the upgrade succeeded: {said}");
    assert!(said.contains("the running version keeps running"), "{said}");
    let b = d.bundle("default", "clock").unwrap();
    assert_eq!(
        (&b["state"], &b["version"], &b["pid"], &b["source"]),
        (
            &before["state"],
            &before["version"],
            &before["pid"],
            &before["source"]
        ),
        "{b}"
    );
    // The record is the old version's again: a restarted daemon runs it.
    assert!(d.signal(nix::sys::signal::Signal::SIGTERM).success());
    d.launch();
    let b = common::wait_for(Duration::from_secs(60), "the old version back", || {
        d.bundle("default", "clock")
            .filter(|b| b["state"] == "ready")
    });
    assert_eq!(
        (&b["version"], &b["source"]),
        (&before["version"], &before["source"]),
        "{b}"
    );
    assert!(current_time(&d, "clock").contains("datetime"));
}
