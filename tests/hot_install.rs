//! The watched folder: drop a bundle in to install it, edit its manifest to
//! upgrade it, break the manifest (the running version keeps serving),
//! remove it to uninstall it; folder recreation and offline changes.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{demo_bundle_at, mount, wait_for, Daemon, Unmount, DEMO_BIN, DEMO_MANIFEST};
use serde_json::{json, Value};

const WATCH: &str =
    "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n";

fn watched(d: &Daemon) -> PathBuf {
    d.root().join("watched")
}

fn started() -> Daemon {
    let d = Daemon::start_with(WATCH);
    std::fs::create_dir_all(watched(&d)).unwrap();
    d
}

/// Builds a bundle outside the watched folder and renames it into place.
fn drop_in(d: &Daemon, name: &str) -> PathBuf {
    let staging = d.root().join("staging");
    let built = demo_bundle_at(&staging, name);
    let target = watched(d).join(name);
    std::fs::rename(built, &target).unwrap();
    target
}

fn pid(d: &Daemon, name: &str) -> Option<u64> {
    d.bundle("default", name).and_then(|b| b["pid"].as_u64())
}

fn edit(folder: &Path, change: impl FnOnce(&mut Value)) {
    let path = folder.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    change(&mut m);
    std::fs::write(&path, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn a_bundle_renamed_into_the_folder_is_installed_and_removing_it_uninstalls() {
    let d = started();
    std::fs::create_dir_all(watched(&d)).unwrap();
    // Let the watcher arm the freshly created folder.
    wait_for(
        Duration::from_secs(5),
        "the watcher to see the folder",
        || d.log().contains("watched folder is back").then_some(()),
    );
    let landed = Instant::now();
    let folder = drop_in(&d, "hot");
    d.wait_state("default", "hot", "ready");
    println!("manifest landed -> ready: {:?}", landed.elapsed());
    assert_eq!(
        d.ok(&["call", "hot", "echo", r#"{"text":"hot"}"#]).trim(),
        "hot"
    );

    std::fs::remove_dir_all(&folder).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the bundle to be uninstalled",
        || d.bundle("default", "hot").is_none().then_some(()),
    );
    wait_for(Duration::from_secs(10), "its process to be gone", || {
        d.bundle_processes().is_empty().then_some(())
    });
}

#[test]
fn editing_a_manifest_upgrades_only_that_bundle() {
    let d = started();
    let a = drop_in(&d, "alpha");
    drop_in(&d, "beta");
    d.wait_state("default", "alpha", "ready");
    d.wait_state("default", "beta", "ready");
    let (old_alpha, beta) = (pid(&d, "alpha"), pid(&d, "beta"));

    edit(&a, |m| {
        m["version"] = json!("0.2.0");
        m["user_config"]["greeting"]["default"] = json!("upgraded: ");
    });
    let b = wait_for(
        Duration::from_secs(10),
        "alpha to run version 0.2.0",
        || {
            d.bundle("default", "alpha")
                .filter(|b| b["version"] == "0.2.0" && b["state"] == "ready")
        },
    );
    assert_ne!(b["pid"].as_u64(), old_alpha);
    assert_eq!(
        d.ok(&["call", "alpha", "echo", r#"{"text":"x"}"#]).trim(),
        "upgraded: x"
    );
    let beta_now = d.bundle("default", "beta").unwrap();
    assert_eq!(
        (beta_now["pid"].as_u64(), beta_now["restarts"].as_u64()),
        (beta, Some(0)),
        "beta was touched"
    );
}

#[test]
fn an_invalid_edit_keeps_the_running_version_serving() {
    let d = started();
    let a = drop_in(&d, "steady");
    d.wait_state("default", "steady", "ready");
    let before = pid(&d, "steady");

    std::fs::write(
        a.join("manifest.json"),
        "{ \"name\": \"steady\", \"version\": ",
    )
    .unwrap();
    let b = wait_for(
        Duration::from_secs(10),
        "the rejection to show in status",
        || {
            d.bundle("default", "steady").filter(|b| {
                b["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("rejected"))
            })
        },
    );
    assert_eq!(b["state"], "ready");
    assert_eq!(b["pid"].as_u64(), before);
    assert!(
        b["last_error"].as_str().unwrap().contains("keeps running"),
        "{b}"
    );
    assert_eq!(
        d.ok(&["call", "steady", "echo", r#"{"text":"still"}"#])
            .trim(),
        "still"
    );

    // Fixing the manifest upgrades to it.
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!("steady");
    m["version"] = json!("1.0.0");
    std::fs::write(a.join("manifest.json"), m.to_string()).unwrap();
    let b = wait_for(Duration::from_secs(10), "the fixed version", || {
        d.bundle("default", "steady")
            .filter(|b| b["version"] == "1.0.0" && b["state"] == "ready")
    });
    // The rejection stays shown, with its time (issue 34, point 8).
    assert!(
        b["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("rejected"))
            && b["last_error_at"].is_i64(),
        "{b}"
    );
}

#[test]
fn a_slow_partial_write_is_rejected_then_installed_when_complete() {
    let d = started();
    let folder = watched(&d).join("slow");
    std::fs::create_dir_all(folder.join("server")).unwrap();
    common::place_demo_server(&folder.join("server/bundlevisor-demo"));
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!("slow");
    let text = m.to_string();
    let (first, rest) = text.split_at(text.len() / 2);
    let mut file = std::fs::File::create(folder.join("manifest.json")).unwrap();
    use std::io::Write;
    file.write_all(first.as_bytes()).unwrap();
    file.flush().unwrap();
    // The writer pauses longer than the debounce: the half file is seen and refused.
    wait_for(
        Duration::from_secs(10),
        "the half-written manifest to be refused",
        || d.log().contains("bundle not installed").then_some(()),
    );
    assert!(d.bundle("default", "slow").is_none());
    file.write_all(rest.as_bytes()).unwrap();
    drop(file);
    d.wait_state("default", "slow", "ready");
}

#[test]
fn a_manifest_file_in_the_folder_is_a_bundle() {
    let d = started();
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!("single");
    m["server"]["mcp_config"]["command"] = json!(DEMO_BIN);
    let file = watched(&d).join("single.json");
    let tmp = d.root().join("single.json.tmp");
    std::fs::write(&tmp, m.to_string()).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    d.wait_state("default", "single", "ready");
    std::fs::remove_file(&file).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the file bundle to be uninstalled",
        || d.bundle("default", "single").is_none().then_some(()),
    );
}

#[test]
fn the_folder_can_be_deleted_and_recreated() {
    let d = started();
    drop_in(&d, "first");
    d.wait_state("default", "first", "ready");
    std::fs::remove_dir_all(watched(&d)).unwrap();
    wait_for(Duration::from_secs(5), "the watcher to notice", || {
        d.log().contains("watched folder disappeared").then_some(())
    });
    // The folder vanishing does not uninstall what it held.
    assert_eq!(d.bundle("default", "first").unwrap()["state"], "ready");

    std::fs::create_dir_all(watched(&d)).unwrap();
    drop_in(&d, "first");
    drop_in(&d, "second");
    d.wait_state("default", "second", "ready");
    // And the recreated folder is watched again: an edit is seen.
    edit(&watched(&d).join("second"), |m| {
        m["version"] = json!("9.9.9")
    });
    wait_for(
        Duration::from_secs(10),
        "the edit in the recreated folder",
        || {
            d.bundle("default", "second")
                .filter(|b| b["version"] == "9.9.9" && b["state"] == "ready")
        },
    );
}

#[test]
fn changes_made_while_the_daemon_was_down_are_reconciled_at_start() {
    let mut d = started();
    drop_in(&d, "stays");
    let leaving = drop_in(&d, "leaves");
    d.wait_state("default", "stays", "ready");
    d.wait_state("default", "leaves", "ready");
    d.signal(nix::sys::signal::Signal::SIGTERM);

    std::fs::remove_dir_all(&leaving).unwrap();
    drop_in(&d, "arrives");
    edit(&watched(&d).join("stays"), |m| {
        m["version"] = json!("2.0.0")
    });

    d.launch();
    d.wait_state("default", "arrives", "ready");
    let stays = d.wait_state("default", "stays", "ready");
    assert_eq!(stays["version"], "2.0.0");
    wait_for(
        Duration::from_secs(10),
        "the removed bundle to be uninstalled",
        || d.bundle("default", "leaves").is_none().then_some(()),
    );
    assert_eq!(d.bundle_processes().len(), 2);
}

/// Issue 16, finding 8: a crash restart uses the manifest the bundle runs,
/// not a refused edit on disk.
#[test]
fn a_crash_after_a_refused_edit_restarts_the_running_version() {
    let d = started();
    let a = drop_in(&d, "kept");
    d.wait_state("default", "kept", "ready");
    edit(&a, |m| m["version"] = json!(5));
    wait_for(Duration::from_secs(10), "the edit to be refused", || {
        d.bundle("default", "kept").filter(|b| {
            b["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("rejected"))
        })
    });
    let before = pid(&d, "kept");
    let _ = d.cli(&["call", "kept", "crash", "{}"]);
    let b = wait_for(
        Duration::from_secs(10),
        "the bundle back after its crash",
        || {
            d.bundle("default", "kept")
                .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != before)
        },
    );
    assert_eq!(b["version"], "0.1.0", "{b}");
    assert_eq!(
        d.ok(&["call", "kept", "echo", r#"{"text":"after"}"#])
            .trim(),
        "after"
    );
}

/// Issue 16, finding 3: a bundle moved out of the folder and back while its
/// old process ignores SIGTERM comes back supervised, and the old process's
/// end (SIGKILL after the grace) does not take the new one off the books.
#[test]
fn a_bundle_moved_out_and_back_within_the_grace_stays_supervised() {
    // The test daemon's stop_grace is 2 s.
    let d = Daemon::start_with(WATCH);
    std::fs::create_dir_all(watched(&d)).unwrap();
    let staging = d.root().join("staging");
    let built = common::shell_wrapped_demo(&staging, "stubborn", "trap '' TERM;");
    let target = watched(&d).join("stubborn");
    std::fs::rename(&built, &target).unwrap();
    d.wait_state("default", "stubborn", "ready");
    let old = pid(&d, "stubborn").unwrap();

    let away = d.root().join("away");
    std::fs::rename(&target, &away).unwrap();
    wait_for(Duration::from_secs(10), "the uninstall to begin", || {
        d.log().contains("bundle uninstalled").then_some(())
    });
    std::fs::rename(&away, &target).unwrap();
    // The old process is SIGKILLed 2 s after the SIGTERM it ignores; the
    // new one starts once it is gone.
    let b = wait_for(Duration::from_secs(15), "the new process", || {
        d.bundle("default", "stubborn")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(old))
    });
    let new = b["pid"].as_u64().unwrap();
    assert!(
        common::is_zombie(old as u32) || !Path::new(&format!("/proc/{old}")).exists(),
        "the old process is gone"
    );
    // Still listed and served well after the old process's end.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let b = d.bundle("default", "stubborn");
        assert_eq!(
            b.as_ref().and_then(|b| b["pid"].as_u64()),
            Some(new),
            "{b:?}"
        );
        assert_eq!(
            d.ok(&["call", "stubborn", "echo", r#"{"text":"here"}"#])
                .trim(),
            "here"
        );
    }
    // And an uninstall still takes it (and its process) down.
    std::fs::remove_dir_all(&target).unwrap();
    wait_for(Duration::from_secs(15), "the bundle to be gone", || {
        d.bundle("default", "stubborn").is_none().then_some(())
    });
    wait_for(Duration::from_secs(5), "its process to be gone", || {
        d.bundle_processes().is_empty().then_some(())
    });
}

/// Issue 17, point 5: a bundle folder copied in piece by piece (manifest
/// first, the server later) is not started until its entry point is there
/// and its files have been quiet for the debounce.
#[test]
fn a_bundle_folder_still_arriving_waits_until_it_is_complete() {
    let d = Daemon::start_with(
        "watch_debounce = \"300ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n",
    );
    std::fs::create_dir_all(watched(&d)).unwrap();
    let folder = watched(&d).join("slow");
    std::fs::create_dir_all(&folder).unwrap();
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!("slow");
    std::fs::write(folder.join("manifest.json"), m.to_string()).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the scan to wait for the entry point",
        || {
            d.log()
                .contains("watched bundle not complete yet: its entry point")
                .then_some(())
        },
    );
    assert!(
        d.bundle("default", "slow").is_none(),
        "installed half-copied"
    );

    // The server arrives (a copy, written now).
    std::fs::create_dir_all(folder.join("server")).unwrap();
    std::fs::copy(DEMO_BIN, folder.join("server/bundlevisor-demo")).unwrap();
    let written = Instant::now();
    d.wait_state("default", "slow", "ready");
    assert!(
        written.elapsed() >= Duration::from_millis(300),
        "started {:?} after the last write, before the debounce",
        written.elapsed()
    );
    let log = d.log();
    assert!(!log.contains("bundle failed"), "{log}");
}

/// A complete bundle folder renamed into the watched folder (the
/// documented way) is taken at once: its files were written before it
/// arrived, so neither the debounce nor the quiet period applies (they are
/// for folders written in place).
#[test]
fn a_bundle_folder_renamed_in_whole_is_taken_at_once() {
    let mut d = Daemon::unlaunched(
        "watch_debounce = \"5s\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n",
    );
    std::fs::create_dir_all(watched(&d)).unwrap();
    d.launch();
    // Written just now, then moved in.
    let built = demo_bundle_at(&d.root().join("staging"), "quick");
    let moved = Instant::now();
    std::fs::rename(&built, watched(&d).join("quick")).unwrap();
    d.wait_state("default", "quick", "ready");
    assert!(
        moved.elapsed() < Duration::from_secs(4),
        "ready {:?} after the rename: it waited for the quiet period\n{}",
        moved.elapsed(),
        d.log()
    );
    assert!(!d.log().contains("not complete yet"), "{}", d.log());
}

/// Issue 17, point 5: a watched bundle that crash-looped into `failed`
/// while its files were still arriving is retried when they change (here
/// a file deep in the bundle, which raises no event on the folder).
#[test]
fn a_failed_watched_bundle_is_retried_when_its_files_change() {
    let d = Daemon::start_with(&format!(
        "{WATCH}[supervision]\nmax_restarts = 1\nbackoff_initial = \"10ms\"\n"
    ));
    std::fs::create_dir_all(watched(&d)).unwrap();
    let staging = d.root().join("staging");
    let built = demo_bundle_at(&staging, "fixme");
    let server = built.join("server/bundlevisor-demo");
    std::fs::remove_file(&server).unwrap();
    std::fs::write(&server, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&server, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let target = watched(&d).join("fixme");
    std::fs::rename(&built, &target).unwrap();
    let failed = d.wait_state("default", "fixme", "failed");
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap()
            .contains("crash loop"),
        "{failed}"
    );

    // The real server is copied over the broken one.
    let server = target.join("server/bundlevisor-demo");
    std::fs::remove_file(&server).unwrap();
    std::fs::copy(DEMO_BIN, &server).unwrap();
    d.wait_state("default", "fixme", "ready");
    assert!(d.log().contains("the files of a failed bundle changed"));
    assert_eq!(
        d.ok(&["call", "fixme", "echo", r#"{"text":"fixed"}"#])
            .trim(),
        "fixed"
    );
}

/// Writes a Kubernetes ConfigMap volume's layout of `files` into `dir` as
/// kubelet's atomic writer does: the files in a new timestamped folder,
/// `..data` swapped to it with a rename, `NAME -> ..data/NAME` links for
/// the keys (added and removed as keys are), the old folder removed.
fn config_map_update(dir: &Path, generation: u32, files: &[(&str, String)]) {
    let stamp = format!("..2026_11_25_00_00_{generation:02}.{generation}");
    let folder = dir.join(&stamp);
    std::fs::create_dir(&folder).unwrap();
    for (name, text) in files {
        std::fs::write(folder.join(name), text).unwrap();
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamp, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !files.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    for (name, _) in files {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// The daemon's config for a ConfigMap test: the watched folder, and the
/// demo binary's folder readable by bundles.
fn config_map_config(read_only_volume: bool) -> String {
    let server_dir = Path::new(DEMO_BIN).parent().unwrap();
    format!(
        "{WATCH}read_only_volume = {read_only_volume}\n[sandbox]\nread_only_paths = [{:?}]\n",
        server_dir.display().to_string()
    )
}

#[test]
fn a_config_map_volume_installs_upgrades_and_uninstalls_on_its_data_swaps() {
    let d = Daemon::start_with(&config_map_config(false));
    let dir = watched(&d);
    std::fs::create_dir_all(&dir).unwrap();
    config_map_swaps(&d, &dir);
}

/// A ConfigMap volume as a pod has it. kubelet makes the volume's folder
/// 0777 and mounts it read-only into the container, where nothing else
/// shows it; it writes each update from the node's side. Returns the
/// daemon, started with `read_only_volume` as given, and the node's side.
fn config_map_volume(read_only_volume: bool) -> (Daemon, PathBuf, Unmount) {
    let mut d = Daemon::unlaunched(&config_map_config(read_only_volume));
    // The node's side: a tmpfs of mode 0777 that kubelet writes...
    let node = d.root().join("node");
    let dir = watched(&d);
    for p in [&node, &dir] {
        std::fs::create_dir_all(p).unwrap();
    }
    let unmount = Unmount(vec![dir.clone(), node.clone()]);
    mount(&[
        "-t",
        "tmpfs",
        "-o",
        "mode=0777",
        "tmpfs",
        node.to_str().unwrap(),
    ]);
    // ...and the container's side: the same folder, read-only.
    mount(&["--bind", node.to_str().unwrap(), dir.to_str().unwrap()]);
    mount(&["-o", "remount,bind,ro", dir.to_str().unwrap()]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o777
    );
    d.unmounted = Some(node.clone());
    d.launch();
    (d, node, unmount)
}

/// Issue 22: vouched for as a read-only volume, the 0777 folder is
/// trusted (nobody can write it through any mount the daemon sees) and
/// the swaps made where the daemon cannot look are followed.
#[test]
fn a_read_only_config_map_volume_of_mode_0777_is_trusted_and_followed() {
    let (d, node, _unmount) = config_map_volume(true);
    config_map_swaps(&d, &node);
    assert!(
        !d.log().contains("writable by every user"),
        "the volume was refused:\n{}",
        d.log()
    );
}

/// Without the operator's word the same volume is refused: who may write
/// its source outside the daemon's mount namespace cannot be seen.
#[test]
fn a_read_only_volume_not_vouched_for_is_refused() {
    let (d, node, _unmount) = config_map_volume(false);
    let events = common::events(&d, &["events", "--json"]);
    config_map_update(&node, 1, &[("notes.json", "{}".to_string())]);
    let seen = events.until("the manifest's refusal", |l| {
        l.contains("manifest_rejected") && l.contains("notes")
    });
    assert!(
        seen.join("\n").contains("writable by every user"),
        "{seen:?}"
    );
    assert!(d.bundle("default", "notes").is_none());
}

/// A read-only mount over a folder that stays writable where it comes
/// from (a 0777 folder of the test's own filesystem, bound read-only, and
/// that filesystem mounted read-write at `/`): whoever can write the
/// source decides what the daemon runs, so it is refused, and nothing in
/// it is installed.
#[test]
fn a_read_only_bind_of_a_folder_still_writable_elsewhere_is_refused() {
    // Even vouched for as a read-only volume.
    let mut d = Daemon::unlaunched(&config_map_config(true));
    let source = d.root().join("source");
    let dir = watched(&d);
    for p in [&source, &dir] {
        std::fs::create_dir_all(p).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _unmount = Unmount(vec![dir.clone()]);
    mount(&["--bind", source.to_str().unwrap(), dir.to_str().unwrap()]);
    mount(&["-o", "remount,bind,ro", dir.to_str().unwrap()]);
    d.launch();
    let events = common::events(&d, &["events", "--json"]);
    demo_bundle_at(&source, "notes");
    let seen = events.until("the bundle's refusal", |l| {
        l.contains("manifest_rejected") && l.contains("notes")
    });
    let seen = seen.join("\n");
    assert!(seen.contains("writable by every user"), "{seen}");
    assert!(
        d.bundle("default", "notes").is_none(),
        "installed from an untrusted folder"
    );
}

/// Installs, upgrades and uninstalls through ConfigMap updates written to
/// `dir` (the watched folder, or what it shows).
fn config_map_swaps(d: &Daemon, dir: &Path) {
    let bare = |name: &str, version: &str| {
        let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
        m["name"] = json!(name);
        m["version"] = json!(version);
        m["server"]["mcp_config"]["command"] = json!(DEMO_BIN);
        m["server"]["mcp_config"]["args"] = json!([]);
        m.to_string()
    };
    let version = |name: &str| {
        d.bundle("default", name)
            .and_then(|b| b["version"].as_str().map(str::to_string))
    };
    config_map_update(dir, 1, &[("notes.json", bare("notes", "1.0.0"))]);
    d.wait_state("default", "notes", "ready");
    assert_eq!(version("notes").as_deref(), Some("1.0.0"));
    // A new version of the key, and a second key.
    config_map_update(
        dir,
        2,
        &[
            ("notes.json", bare("notes", "2.0.0")),
            ("todo.json", bare("todo", "1.0.0")),
        ],
    );
    wait_for(Duration::from_secs(20), "the upgrade to 2.0.0", || {
        (version("notes").as_deref() == Some("2.0.0")).then_some(())
    });
    d.wait_state("default", "notes", "ready");
    d.wait_state("default", "todo", "ready");
    // The first key removed: its bundle is uninstalled, the other stays.
    config_map_update(dir, 3, &[("todo.json", bare("todo", "1.0.0"))]);
    wait_for(Duration::from_secs(20), "notes uninstalled", || {
        d.bundle("default", "notes").is_none().then_some(())
    });
    assert_eq!(version("todo").as_deref(), Some("1.0.0"));
}
