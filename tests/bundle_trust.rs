//! Which bundle code the daemon runs (audit issue 30): every file and
//! folder a bundle runs from must be writable only by its owner (checked
//! at install and at every start), an archive's links are judged by where
//! they resolve, and `[bundles] signatures = "require"` holds for folders
//! and at every start.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{demo_bundle_at, wait_for, Daemon, DEMO_MANIFEST};
use serde_json::{json, Value};

const WATCH: &str =
    "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n";

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
}

/// `bundle.install` of `path`: the error's kind and message.
fn install_refusal(d: &Daemon, path: &Path) -> (String, String) {
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "bundle.install", json!({ "path": path }));
    assert!(r["error"].is_object(), "installed: {r}");
    (
        r["error"]["data"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        r["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

/// An MCPB archive of the demo bundle (its server stripped, as `mcpb
/// pack` of the real folder would hold it) plus `extra` entries: (name,
/// link target) for links, written as a hostile tool may write them.
fn demo_archive(dir: &Path, name: &str, links: &[(&str, &str)]) -> PathBuf {
    use zip::write::SimpleFileOptions;
    std::fs::create_dir_all(dir).unwrap();
    let server = dir.join(format!("{name}-server"));
    common::stripped_demo_server(&server);
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!(name);
    let path = dir.join(format!("{name}.mcpb"));
    let mut out = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let file = |m: u32| {
        SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(m)
    };
    out.start_file("manifest.json", file(0o644)).unwrap();
    out.write_all(manifest.to_string().as_bytes()).unwrap();
    out.start_file("server/bundlevisor-demo", file(0o755))
        .unwrap();
    out.write_all(&std::fs::read(&server).unwrap()).unwrap();
    for (at, to) in links {
        out.add_symlink(*at, *to, file(0o777)).unwrap();
    }
    out.finish().unwrap();
    path
}

/// Finding 8: a root-owned bundle folder whose server folder anyone may
/// write (another user swaps the server, and it runs with the bundle's
/// secrets) is refused, watched or installed by path, with the path and
/// the fix; so is a group-writable file deep inside; a clean one installs.
/// One that turns writable after its install does not start again.
#[test]
fn bundle_code_others_may_write_is_refused_at_install_and_at_every_start() {
    let mut d = Daemon::unlaunched(WATCH);
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    mode(&watched, 0o755);
    d.launch();
    let staging = d.root().join("staging");

    // Watched: the server's folder is 0777.
    let events = common::events(&d, &["events", "--json"]);
    let open = demo_bundle_at(&staging, "open");
    mode(&open.join("server"), 0o777);
    std::fs::rename(&open, watched.join("open")).unwrap();
    let seen = events.until("the open bundle's refusal", |l| {
        l.contains("manifest_rejected") && l.contains("open")
    });
    let seen = seen.join("\n");
    let server = watched.join("open/server");
    assert!(
        seen.contains(&format!(
            "folder {} is writable by every user",
            server.display()
        )) && seen.contains(&format!("chmod go-w {}", server.display())),
        "{seen}"
    );
    assert!(d.bundle("default", "open").is_none(), "installed");

    // By path: a file deep inside its group may write.
    let deep = demo_bundle_at(&staging, "deep");
    let lib = deep.join("server/lib/a/b");
    std::fs::create_dir_all(&lib).unwrap();
    let helper = lib.join("helper.py");
    std::fs::write(&helper, "print('hi')\n").unwrap();
    mode(&helper, 0o664);
    let (kind, message) = install_refusal(&d, &deep);
    assert_eq!(kind, "bundle_untrusted", "{message}");
    assert!(
        message.contains(&format!(
            "file {} is writable by its group",
            helper.display()
        )) && message.contains(&format!(
            "the whole bundle at once: chmod -R go-w {}",
            deep.display()
        )),
        "{message}"
    );
    assert!(d.bundle("default", "deep").is_none(), "installed");
    mode(&helper, 0o644);
    d.ok(&["install", deep.to_str().unwrap()]);
    assert_eq!(d.wait_state("default", "deep", "ready")["state"], "ready");

    // Clean, then opened after its install: the next start refuses it.
    let later = demo_bundle_at(&staging, "later");
    d.ok(&["install", later.to_str().unwrap()]);
    d.wait_state("default", "later", "ready");
    mode(&later.join("server"), 0o777);
    let _ = d.cli(&["restart", "later"]);
    let failed = d.wait_state("default", "later", "failed");
    let why = failed["last_error"].as_str().unwrap_or("");
    assert!(
        why.contains(&format!(
            "{} is writable by every user",
            later.join("server").display()
        )),
        "{failed}"
    );
    assert!(d.bundle("default", "deep").is_some());
}

/// Finding 11: a chain of relative links whose `..`s stay inside by their
/// count but climb out through another link (`s -> ../../..`, `esc ->
/// deep/1/2/3/s/../../../../etc/passwd`, which resolves to /etc/passwd) is
/// refused, naming the link; nothing of it is unpacked.
#[test]
fn an_archive_link_that_climbs_out_through_another_link_is_refused() {
    let d = Daemon::start();
    let work = d.root().join("work");
    let up = "../../../../../../../..";
    let escape = format!("deep/1/2/3/4/5/6/7/8/s/{}/etc/passwd", "../".repeat(10));
    let archive = demo_archive(
        &work,
        "chain",
        &[("deep/1/2/3/4/5/6/7/8/s", up), ("esc", escape.as_str())],
    );
    let (kind, message) = install_refusal(&d, &archive);
    assert_eq!(kind, "archive_refused", "{message}");
    assert!(
        message.contains("link esc ") && message.contains("points outside the bundle"),
        "{message}"
    );
    assert!(d.bundle("default", "chain").is_none());
    let unpacked: Vec<_> = std::fs::read_dir(d.state.join("archives"))
        .map(|e| e.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        unpacked
            .iter()
            .all(|n| n.to_string_lossy().starts_with(".unpack-")),
        "unpacked: {unpacked:?}"
    );
    // The same links resolving inside install.
    let inside = demo_archive(
        &work,
        "inside",
        &[
            ("deep/1/2/s", "../../.."),
            ("run", "deep/1/2/s/server/bundlevisor-demo"),
        ],
    );
    d.ok(&["install", inside.to_str().unwrap()]);
    d.wait_state("default", "inside", "ready");
}

/// Finding 12: under `signatures = "require"` a folder (which cannot be
/// signed) is refused, installed by path or watched, unless the operator
/// exempts folders.
#[test]
fn required_signatures_refuse_unsigned_folders_unless_exempted() {
    let root = tempfile::tempdir().unwrap();
    let pem = common::test_ca(&root.path().join("certs"));
    let require = format!(
        "[bundles]\nsignatures = \"require\"\ntrusted_certs = [\"{}\"]\n",
        pem.display()
    );
    let mut d = Daemon::unlaunched(&format!("{WATCH}{require}"));
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    d.launch();
    let staging = d.root().join("staging");
    let folder = demo_bundle_at(&staging, "plain");
    let (kind, message) = install_refusal(&d, &folder);
    assert_eq!(kind, "bundle_untrusted", "{message}");
    assert!(
        message.contains("cannot be signed") && message.contains("allow_unsigned_folders = true"),
        "{message}"
    );
    // (No event stream here: its probe bundle is a folder too.)
    std::fs::rename(demo_bundle_at(&staging, "dropped"), watched.join("dropped")).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the watched folder's refusal",
        || {
            d.log()
                .lines()
                .any(|l| {
                    l.contains("bundle \"dropped\" comes from a bundle folder")
                        && l.contains("cannot be signed")
                })
                .then_some(())
        },
    );
    assert!(d.bundle("default", "dropped").is_none());
    assert!(d.bundle("default", "plain").is_none());
    drop(d);

    // Exempted by the operator: folders install.
    let exempt = require.replace("[bundles]\n", "[bundles]\nallow_unsigned_folders = true\n");
    let d = Daemon::start_with(&exempt);
    let folder = demo_bundle_at(&d.root().join("staging"), "plain");
    d.ok(&["install", folder.to_str().unwrap()]);
    d.wait_state("default", "plain", "ready");
}

/// Finding 12, the other gap: an unsigned archive installed under `warn`
/// does not start once the config says `require` — not at the boot
/// reload, not on a restart.
#[test]
fn an_unsigned_archive_installed_under_warn_does_not_start_under_require() {
    let root = tempfile::tempdir().unwrap();
    let pem = common::test_ca(&root.path().join("certs"));
    let require = format!(
        "[bundles]\nsignatures = \"require\"\ntrusted_certs = [\"{}\"]\n",
        pem.display()
    );
    // Installed under `warn` (the default)...
    let mut d = Daemon::start();
    let archive = demo_archive(&d.root().join("work"), "unsigned", &[]);
    d.ok(&["install", archive.to_str().unwrap()]);
    d.wait_state("default", "unsigned", "ready");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    // ...does not start once signatures are required: not at the boot
    // reload, not on a restart.
    let config = std::fs::read_to_string(&d.config).unwrap();
    let config = config.replace("[bundles]\n", &require);
    std::fs::write(&d.config, config).unwrap();
    d.launch();
    let failed = d.wait_state("default", "unsigned", "failed");
    let why = failed["last_error"].as_str().unwrap_or("");
    assert!(
        why.contains("is not signed") && why.contains("signatures = \"require\""),
        "{failed}"
    );
    let _ = d.cli(&["restart", "unsigned"]);
    let again = d.wait_state("default", "unsigned", "failed");
    assert!(
        again["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("is not signed"),
        "{again}"
    );
    wait_for(Duration::from_secs(5), "no process of it", || {
        d.bundle_processes().is_empty().then_some(())
    });
}
