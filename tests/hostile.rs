//! Hostile bundles: each tries something a third-party bundle must not get
//! away with. The daemon must stay responsive, a neighbour bundle must keep
//! answering, nothing may leak, and the attempt must be refused or
//! contained. (Bundles that ignore SIGTERM: tests/shutdown.rs; reading
//! other workspaces' ids: tests/host_resources.rs.)

mod common;

use std::time::Duration;

use common::{chown_tree, demo_bundle_at, shell_wrapped_demo, wait_for, Daemon};
use serde_json::Value;

/// A well-behaved neighbour, installed first.
fn neighbour(d: &Daemon) {
    let dir = d.root().join("bundles");
    d.ok(&[
        "install",
        demo_bundle_at(&dir, "neighbour").to_str().unwrap(),
    ]);
}

fn neighbour_answers(d: &Daemon) {
    assert_eq!(
        d.ok(&["call", "neighbour", "echo", r#"{"text":"still here"}"#])
            .trim(),
        "still here"
    );
}

fn landlock_available() -> bool {
    bundlevisor::bundle::sandbox::landlock_abi().is_ok()
}

fn daemon_peak_rss_kib(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn a_bundle_cannot_read_the_state_dir_etc_shadow_or_another_sandbox() {
    let d = Daemon::start();
    neighbour(&d);
    let bundles = d.root().join("bundles");
    // The neighbour keeps a secret in its own data dir.
    let secret = d.state.join("sandboxes/default/neighbour/data/secret");
    std::fs::write(&secret, "neighbour's secret").unwrap();
    let targets = [
        "/etc/shadow".to_string(),
        d.state.join("state.db").display().to_string(),
        d.state.join("credentials.key").display().to_string(),
        secret.display().to_string(),
        d.root().join("bundlevisor.toml").display().to_string(),
    ];
    let probe = targets
        .iter()
        .map(|t| format!("if cat '{t}' >/dev/null 2>&1; then echo \"READ {t}\" >&2; else echo \"DENIED {t}\" >&2; fi;"))
        .collect::<String>();
    let write_probe = format!(
        "if touch '{}/evil' 2>/dev/null; then echo WROTE-STATE >&2; else echo DENIED-WRITE >&2; fi; echo own > \"$BUNDLEVISOR_DATA_DIR/mine\" && echo WROTE-OWN >&2;",
        d.state.display()
    );
    let folder = shell_wrapped_demo(&bundles, "prober", &format!("{probe}{write_probe}"));
    d.ok(&["install", folder.to_str().unwrap()]);

    let status: Value = d.bundle("default", "prober").unwrap();
    let sandbox = &status["sandbox"];
    assert_eq!(sandbox["sandbox_id"], "default/prober", "{status}");
    assert!(sandbox["strategy"]
        .as_str()
        .unwrap()
        .contains("no_new_privs"));
    let logs = d.ok(&["logs", "prober", "-n", "50"]);
    assert!(
        logs.contains("WROTE-OWN"),
        "its own data dir is writable: {logs}"
    );
    if landlock_available() {
        assert!(
            sandbox["landlock"]
                .as_str()
                .unwrap()
                .starts_with("enforced"),
            "{status}"
        );
        for t in &targets {
            assert!(
                logs.contains(&format!("DENIED {t}")),
                "{t} was readable:\n{logs}"
            );
        }
        assert!(logs.contains("DENIED-WRITE"), "{logs}");
    } else {
        // No silent downgrade: status says so.
        assert!(
            sandbox["landlock"]
                .as_str()
                .unwrap()
                .starts_with("unavailable"),
            "{status}"
        );
    }
    neighbour_answers(&d);
}

#[test]
fn junk_on_stdout_after_start_restarts_the_bundle_with_the_reason() {
    let d = Daemon::start();
    neighbour(&d);
    // Ready first, then a log line on stdout, as a careless server does.
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "chatty",
        "( sleep 0.3; echo 'Server listening on port 8080' ) &",
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    let b = wait_for(
        Duration::from_secs(20),
        "the violation to be reported",
        || {
            d.bundle("default", "chatty").filter(|b| {
                b["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("not an MCP message"))
            })
        },
    );
    let reason = b["last_error"].as_str().unwrap();
    assert!(
        reason.contains("Server listening on port 8080") && reason.contains("stderr"),
        "{reason}"
    );
    assert!(
        b["restarts"].as_u64().unwrap() >= 1 || b["state"] == "restarting",
        "{b}"
    );
    neighbour_answers(&d);
}

#[test]
fn a_100_mb_line_is_cut_the_bundle_restarted_and_daemon_memory_stays_bounded() {
    let d = Daemon::start();
    neighbour(&d);
    let before = daemon_peak_rss_kib(&d);
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "spewer",
        "( sleep 0.3; printf '{'; head -c 104857600 /dev/zero | tr '\\0' x ) &",
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    let b = wait_for(
        Duration::from_secs(30),
        "the overlong message to be reported",
        || {
            d.bundle("default", "spewer").filter(|b| {
                b["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("longer than 16777216 bytes"))
            })
        },
    );
    assert!(b["last_error"]
        .as_str()
        .unwrap()
        .contains("max_message_bytes"));
    let after = daemon_peak_rss_kib(&d);
    assert!(
        after < before + 64 * 1024,
        "the daemon buffered the line: peak RSS {before} KiB -> {after} KiB"
    );
    neighbour_answers(&d);
    d.ok(&["uninstall", "spewer"]);
    wait_for(
        Duration::from_secs(10),
        "the spewer's processes to be gone",
        || {
            common::processes_with_cwd_under(&d.root().join("bundles/spewer"))
                .is_empty()
                .then_some(())
        },
    );
}

/// Live processes of a uid (from /proc).
fn processes_of(uid: u32) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let real_uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if real_uid == Some(uid) && !zombie {
            n += 1;
        }
    }
    n
}

#[test]
fn a_fork_loop_run_as_an_unprivileged_user_is_capped_and_cleaned_up() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        // Switching users needs root (CI runs as root). A non-root daemon
        // ignores `user` and says so by not listing it in the strategy.
        let d = Daemon::start_with("[sandbox]\nuser = \"nobody\"\n");
        neighbour(&d);
        let b = d.bundle("default", "neighbour").unwrap();
        let strategy = b["sandbox"]["strategy"].as_str().unwrap();
        assert!(!strategy.contains("user"), "{strategy}");
        return;
    }
    assert_eq!(
        processes_of(NOBODY),
        0,
        "another test or service runs as nobody"
    );
    let d = Daemon::start_with("[sandbox]\nuser = \"nobody\"\nmax_processes = 40\n");
    // The bundle's user must reach its folder and binary.
    for p in [d.root(), d.root().join("bundles")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    neighbour(&d);
    // Forks until the kernel says no (the forking subshell then dies).
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "forker",
        "( while :; do sleep 60 & done ) 2>/dev/null;",
    );
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.ok(&["install", "--no-wait", folder.to_str().unwrap()]);
    let peak = wait_for(
        Duration::from_secs(20),
        "the fork loop to reach the cap",
        || {
            let n = processes_of(NOBODY);
            (n >= 30).then_some(n)
        },
    );
    assert!(peak <= 40, "RLIMIT_NPROC did not hold: {peak} processes");
    // The sandbox record is in status while the bundle is still starting.
    let b = wait_for(
        Duration::from_secs(10),
        "the forker's sandbox record",
        || {
            d.bundle("default", "forker")
                .filter(|b| b["sandbox"].is_object())
        },
    );
    assert!(
        b["sandbox"]["isolation"]
            .as_str()
            .unwrap()
            .starts_with("user nobody"),
        "{b}"
    );
    for _ in 0..50 {
        let n = processes_of(NOBODY);
        assert!(n <= 40, "RLIMIT_NPROC did not hold: {n} processes");
    }
    neighbour_answers(&d);
    // The neighbour runs as nobody too: after both uninstalls, nothing of
    // that user may be left.
    d.ok(&["uninstall", "forker"]);
    d.ok(&["uninstall", "neighbour"]);
    wait_for(
        Duration::from_secs(10),
        "every process of the forker to be gone",
        || (processes_of(NOBODY) == 0).then_some(()),
    );
}

#[test]
fn a_host_resources_flood_is_rate_limited_and_a_neighbour_keeps_its_own_budget() {
    let d = Daemon::start_with("[host_resources]\nrate_per_sec = 20\nburst = 20\n");
    neighbour(&d);
    let dir = d.root().join("bundles");
    d.ok(&["install", demo_bundle_at(&dir, "flooder").to_str().unwrap()]);
    let id = d.put_file("note.txt", b"shared note");
    let uri = format!("files://{id}");
    std::thread::scope(|s| {
        let flood = s.spawn(|| {
            let args = serde_json::json!({ "uri": uri, "count": 8000 }).to_string();
            let out = d.ok(&["call", "flooder", "host_bench", &args]);
            serde_json::from_str::<Value>(out.trim()).unwrap()
        });
        // While the flood runs, the neighbour's reads come out of its own
        // bucket (10 reads, within its burst of 20).
        for _ in 0..10 {
            let args = serde_json::json!({ "uri": uri }).to_string();
            let read = d.ok(&["call", "neighbour", "host_read", &args]);
            assert!(
                read.contains("shared note"),
                "the neighbour was refused: {read}"
            );
        }
        assert!(
            !flood.is_finished(),
            "the flood should still be running (raise its count if this machine is very fast)"
        );
        let result = flood.join().unwrap();
        let errors = result["errors"].as_u64().unwrap();
        assert!(errors > 7500, "the flood was not rate limited: {result}");
    });
    d.ok(&["status"]);
}

// ---- Issue 15: the sandbox escapes an audit reproduced, each closed. ----

/// Installs a shell-wrapped demo bundle that runs `script` first, and
/// returns its log once `marker` is in it.
fn run_probe(d: &Daemon, name: &str, script: &str, marker: &str) -> String {
    let folder = shell_wrapped_demo(&d.root().join("bundles"), name, script);
    d.ok(&["install", folder.to_str().unwrap()]);
    wait_for(
        Duration::from_secs(20),
        &format!("{name} to log {marker}"),
        || {
            let logs = d.ok(&["logs", name, "-n", "200"]);
            logs.contains(marker).then_some(logs)
        },
    )
}

/// A Python probe (system Python, readable to every bundle): says
/// `daemon.hello` on the control socket and prints what came back, tagged
/// with its first argument.
fn socket_probe(socket: &std::path::Path) -> String {
    format!(
        "import socket,sys\ntag=sys.argv[1]\ntry:\n s=socket.socket(socket.AF_UNIX)\n s.connect({sock:?})\n s.sendall(b'{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"daemon.hello\",\"params\":{{\"protocol\":1}}}}\\n')\n print(tag+'-ANSWER', s.recv(4096).decode(errors='replace').strip(), file=sys.stderr)\nexcept Exception as e:\n print(tag+'-REFUSED', e, file=sys.stderr)\n",
        sock = socket.display().to_string()
    )
}

#[test]
fn finding_1_a_bundle_and_its_double_forked_grandchild_cannot_drive_the_control_socket() {
    let d = Daemon::start();
    neighbour(&d);
    // Straight from the bundle, and from a grandchild that left the
    // bundle's session and process tree (setsid + double fork).
    let script = "P=\"$(dirname \"$0\")/../probe.py\"; /usr/bin/python3 \"$P\" DIRECT; ( setsid /usr/bin/python3 \"$P\" ESCAPED & ) ;";
    let folder = shell_wrapped_demo(&d.root().join("bundles"), "intruder", script);
    std::fs::write(folder.join("probe.py"), socket_probe(&d.socket)).unwrap();
    d.ok(&["install", folder.to_str().unwrap()]);
    let logs = wait_for(Duration::from_secs(20), "both probes", || {
        let l = d.ok(&["logs", "intruder", "-n", "200"]);
        (l.contains("DIRECT-") && l.contains("ESCAPED-")).then_some(l)
    });
    for line in logs.lines().filter(|l| l.contains("-ANSWER")) {
        assert!(
            line.contains("permission_denied") && !line.contains("\"result\""),
            "a bundle was answered on the control socket: {line}"
        );
    }
    let b = d.bundle("default", "intruder").unwrap();
    let isolation = b["sandbox"]["isolation"].as_str().unwrap();
    if nix::unistd::geteuid().is_root() {
        assert!(isolation.starts_with("own uid"), "{b}");
        let uid = b["sandbox"]["uid"].as_u64().unwrap();
        assert_ne!(uid, 0, "{b}");
        // The neighbour has a uid of its own.
        let n = d.bundle("default", "neighbour").unwrap();
        assert_ne!(n["sandbox"]["uid"], b["sandbox"]["uid"]);
    }
    neighbour_answers(&d);
}

#[test]
fn finding_2_a_link_out_of_the_bundle_folder_is_refused_at_install() {
    let d = Daemon::start();
    neighbour(&d);
    let folder = demo_bundle_at(&d.root().join("bundles"), "linker");
    std::os::unix::fs::symlink("/", folder.join("escape")).unwrap();
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert!(!out.status.success(), "a bundle linking to / was installed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("escape -> /"), "{err}");
    assert!(err.contains("read_only_paths"), "the fix is named: {err}");
    // It is refused before it is recorded: nothing of it runs.
    assert!(d.bundle("default", "linker").is_none());
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(
        2,
        "bundle.install",
        serde_json::json!({"path": folder.to_str().unwrap()}),
    );
    assert_eq!(r["error"]["data"]["kind"], "sandbox_refused", "{r}");
    // The granted paths are listed, exactly, and hold neither / nor the state dir.
    let n = d.bundle("default", "neighbour").unwrap();
    if landlock_available() {
        let read: Vec<&str> = n["sandbox"]["read"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        assert!(!read.is_empty(), "{n}");
        assert!(!read.contains(&"/"), "{read:?}");
        let state = d.state.display().to_string();
        assert!(
            !read
                .iter()
                .any(|p| state.starts_with(p) || p.starts_with(&state)),
            "{read:?}"
        );
        assert!(n["sandbox"]["write"].as_array().unwrap().len() >= 2, "{n}");
        assert!(n["sandbox"]["landlock_abi"].as_u64().unwrap() >= 1, "{n}");
    }
    neighbour_answers(&d);
}

#[test]
fn finding_3_a_bare_manifest_does_not_open_its_folder() {
    use std::os::unix::fs::PermissionsExt;
    if !landlock_available() {
        return;
    }
    // The operator grants the demo server's folder (the command is /bin/sh).
    let server_dir = std::path::Path::new(common::DEMO_BIN).parent().unwrap();
    let d = Daemon::start_with(&format!(
        "[sandbox]\nread_only_paths = [{:?}]\n",
        server_dir.display().to_string()
    ));
    let dir = d.root().join("loose");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "next to the manifest").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut manifest: Value = serde_json::from_str(common::DEMO_MANIFEST).unwrap();
    manifest["name"] = serde_json::json!("flat");
    manifest["server"]["mcp_config"]["command"] = serde_json::json!("/bin/sh");
    manifest["server"]["mcp_config"]["args"] = serde_json::json!([
        "-c",
        format!(
            "if cat '{}' >/dev/null 2>&1; then echo FLAT-READ >&2; else echo FLAT-DENIED >&2; fi; exec \"$0\"",
            secret.display()
        ),
        common::DEMO_BIN
    ]);
    let file = dir.join("flat.json");
    std::fs::write(&file, manifest.to_string()).unwrap();
    d.ok(&["install", file.to_str().unwrap()]);
    let logs = wait_for(Duration::from_secs(20), "the flat probe", || {
        let l = d.ok(&["logs", "flat", "-n", "50"]);
        l.contains("FLAT-").then_some(l)
    });
    assert!(logs.contains("FLAT-DENIED"), "{logs}");
    let b = d.bundle("default", "flat").unwrap();
    let dir_text = dir.display().to_string();
    assert!(
        !b["sandbox"]["read"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with(&dir_text)),
        "{b}"
    );
}

#[test]
fn finding_4_no_root_no_device_files_and_no_neighbour_environ() {
    let d = Daemon::start();
    neighbour(&d);
    let npid = d.bundle("default", "neighbour").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let script = format!(
        "if mknod \"$HOME/blk\" b 8 0 2>/dev/null; then echo MKNOD-MADE >&2; else echo MKNOD-DENIED >&2; fi; \
         if cat /proc/{npid}/environ >/dev/null 2>&1; then echo ENVIRON-READ >&2; else echo ENVIRON-DENIED >&2; fi; \
         echo \"UID-$(id -u)\" >&2;"
    );
    let logs = run_probe(&d, "devmaker", &script, "UID-");
    assert!(logs.contains("MKNOD-DENIED"), "{logs}");
    assert!(!d.state.join("sandboxes/default/devmaker/data/blk").exists());
    if nix::unistd::geteuid().is_root() || landlock_available() {
        assert!(logs.contains("ENVIRON-DENIED"), "{logs}");
    }
    assert!(!logs.contains("UID-0\n"), "a bundle ran as root: {logs}");
    neighbour_answers(&d);
}

#[test]
fn finding_5_a_bundle_cannot_stop_the_daemon_or_a_neighbour() {
    if !(nix::unistd::geteuid().is_root() || landlock_available()) {
        return;
    }
    let mut d = Daemon::start();
    neighbour(&d);
    let npid = d.bundle("default", "neighbour").unwrap()["pid"]
        .as_u64()
        .unwrap();
    // $PPID of the wrapping shell is the daemon.
    let script = format!(
        "if kill -STOP $PPID 2>/dev/null; then echo STOPPED-DAEMON >&2; else echo DAEMON-SIGNAL-DENIED >&2; fi; \
         if kill -STOP {npid} 2>/dev/null; then echo STOPPED-NEIGHBOUR >&2; else echo NEIGHBOUR-SIGNAL-DENIED >&2; fi;"
    );
    let folder = shell_wrapped_demo(&d.root().join("bundles"), "stopper", &script);
    let out = d.cli(&["install", "--no-wait", folder.to_str().unwrap()]);
    assert!(out.status.success());
    let log = d.state.join("logs/default/stopper.log");
    let logs = wait_for(Duration::from_secs(20), "the stopper's verdict", || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        l.contains("NEIGHBOUR-").then_some(l)
    });
    if logs.contains("STOPPED-") {
        // Let the test clean up before failing.
        d.signal(nix::sys::signal::Signal::SIGCONT);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(npid as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
        panic!("a bundle stopped the daemon or its neighbour: {logs}");
    }
    assert!(logs.contains("DAEMON-SIGNAL-DENIED"), "{logs}");
    d.wait_state("default", "stopper", "ready");
    neighbour_answers(&d);
}

#[test]
fn finding_6_an_admitted_user_acts_with_its_own_rights() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        return; // acting as another user needs root
    }
    let d = Daemon::start_with(&format!("[control]\nallowed_gids = [{NOBODY}]\n"));
    let as_nobody = |args: &[&str]| d.cli_as(NOBODY, args);
    // Root's file, and one that does not exist, get the same answer.
    let shadow = as_nobody(&["files", "put", "/etc/shadow"]);
    assert!(!shadow.status.success(), "nobody stored /etc/shadow");
    let missing = as_nobody(&["files", "put", "/etc/no-such-file-here"]);
    let (a, b) = (
        String::from_utf8_lossy(&shadow.stderr).replace("/etc/shadow", "P"),
        String::from_utf8_lossy(&missing.stderr).replace("/etc/no-such-file-here", "P"),
    );
    assert!(a.contains("owned by uid 65534"), "{a}");
    assert_eq!(a, b, "the answer tells whether a path exists");
    // Its own file works.
    let own = d.root().join("mine.txt");
    std::fs::write(&own, "nobody's note").unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o644)).unwrap();
    nix::unistd::chown(&own, Some(nix::unistd::Uid::from_raw(NOBODY)), None).unwrap();
    let put = as_nobody(&["files", "put", own.to_str().unwrap()]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    // A root-owned bundle folder is not nobody's to install.
    let folder = demo_bundle_at(&d.root().join("bundles"), "roots");
    let install = as_nobody(&["install", folder.to_str().unwrap()]);
    assert!(!install.status.success());
    assert!(
        String::from_utf8_lossy(&install.stderr).contains("owned by uid 65534"),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    assert!(d.bundle("default", "roots").is_none());
}

/// Issue 30, finding 10: an admitted user's bundle folder with a link to a
/// file only root can reach gets the same answer as one whose link leads
/// nowhere: its links are followed with the user's rights, not root's.
#[test]
fn an_admitted_users_links_say_nothing_about_root_only_paths() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    let d = Daemon::start_with(&format!("[control]\nallowed_gids = [{NOBODY}]\n"));
    let private = d.root().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(private.join("secret"), "root's").unwrap();
    let install = |name: &str, target: &str| {
        let folder = demo_bundle_at(&d.root().join("bundles"), name);
        std::os::unix::fs::symlink(private.join(target), folder.join("x")).unwrap();
        for own in [folder.clone(), folder.join("manifest.json")] {
            nix::unistd::chown(&own, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
        }
        let out = d.cli_as(NOBODY, &["install", folder.to_str().unwrap()]);
        let said = format!(
            "{:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A started bundle's pid differs from one install to the next.
        let said = match said.find("(pid ") {
            Some(at) => {
                let rest = &said[at + 5..];
                let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
                format!("{}(pid N{}", &said[..at], &rest[end..])
            }
            None => said,
        };
        said.replace(name, "NAME").replace(target, "TARGET")
    };
    let existing = install("linked-a", "secret");
    let missing = install("linked-b", "missing");
    // Both are installed: a link grants nothing, whatever it leads to.
    assert!(existing.contains("is ready"), "{existing}");
    assert!(!existing.contains("private"), "{existing}");
    assert_eq!(
        existing, missing,
        "the answer tells whether a root-only path exists"
    );
}

/// Issue 30, beyond finding 3: an admitted user installs its own bundle,
/// then links its `manifest.json` to a file only root may read. The next
/// start read it as root and quoted its values in the error and
/// `last_error`; now the manifest of a folder another user owns is read
/// with that user's rights, and nothing of the file shows.
#[test]
fn an_admitted_users_manifest_linked_to_a_root_only_file_is_read_with_its_rights() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    const MARKER: &str = "SECRET-MARKER-4711";
    let d = Daemon::start_with(&format!("[control]\nallowed_gids = [{NOBODY}]\n"));
    let private = d.root().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = private.join("secret.json");
    std::fs::write(
        &secret,
        format!("{{\"dxt_version\": \"{MARKER}\", \"manifest_version\": \"0.3\"}}"),
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let folder = demo_bundle_at(&d.root().join("bundles"), "theirs");
    for own in [folder.clone(), folder.join("manifest.json")] {
        nix::unistd::chown(&own, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    }
    let out = d.cli_as(NOBODY, &["install", folder.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = folder.join("manifest.json");
    std::fs::remove_file(&manifest).unwrap();
    std::os::unix::fs::symlink(&secret, &manifest).unwrap();
    std::os::unix::fs::lchown(&manifest, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = d.cli(&["restart", "theirs"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains(MARKER),
        "a root-only file was quoted: {said}"
    );
    // The last good manifest keeps running; the new one was read (with
    // the user's rights) and refused, and nothing of the file shows.
    let b = d.bundle("default", "theirs").unwrap();
    let last_error = b["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("cannot read manifest"),
        "the changed manifest was not read: {b}"
    );
    let status = d.ok(&["status", "--json"]);
    assert!(!status.contains(MARKER), "{status}");
    assert!(!d.log().contains(MARKER), "{}", d.log());
}

#[test]
fn finding_7_names_on_every_control_method_are_checked() {
    let d = Daemon::start();
    // A log file outside the state dir that a path-like workspace reached.
    let evil = d.root().join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("x.log"), "NOT-A-BUNDLE-LOG\n").unwrap();
    let out = d.cli(&["logs", "-w", "../../evil", "x"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("NOT-A-BUNDLE-LOG"), "{text}");
    assert!(!out.status.success());
    assert!(text.contains("workspace"), "{text}");
    // Every method with a name takes the same check.
    let mut raw = d.raw();
    raw.hello();
    for (i, method) in [
        "bundle.logs",
        "bundle.restart",
        "bundle.tools",
        "bundle.call",
        "bundle.uninstall",
    ]
    .iter()
    .enumerate()
    {
        let r = raw.request(
            10 + i as u64,
            method,
            serde_json::json!({"workspace": "default", "name": "../x", "tool": "t"}),
        );
        assert_eq!(r["error"]["data"]["kind"], "invalid_name", "{method}: {r}");
    }
}

#[test]
fn finding_1_a_daemon_that_is_not_root_needs_the_opt_in_and_refuses_its_bundles_even_double_forked()
{
    // A uid of no user and outside uid_range; switching to it needs root.
    const SERVICE_UID: u32 = 4242;
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let as_service = |extra: &str| {
        let mut d = Daemon::unlaunched(extra);
        d.uid = Some(SERVICE_UID);
        chown_tree(&d.root(), SERVICE_UID);
        d.launch();
        d
    };
    // Without the opt-in, a bundle does not start, and the error says why.
    let d = as_service("");
    let folder = demo_bundle_at(&d.root().join("bundles"), "shared");
    chown_tree(&folder, SERVICE_UID);
    let out = d.cli(&["install", folder.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "a bundle started under the daemon's uid"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow_same_uid"), "{err}");
    drop(d);

    // With it, the bundle runs under the daemon's uid, and neither it nor
    // its double-forked grandchild (re-parented to the daemon, its
    // subreaper) is admitted on the control socket.
    let d = as_service("[sandbox]\nallow_same_uid = true\n");
    let script = "P=\"$(dirname \"$0\")/../probe.py\"; /usr/bin/python3 \"$P\" DIRECT; ( setsid /usr/bin/python3 \"$P\" ESCAPED & ) ;";
    let folder = shell_wrapped_demo(&d.root().join("bundles"), "intruder", script);
    std::fs::write(folder.join("probe.py"), socket_probe(&d.socket)).unwrap();
    chown_tree(&folder, SERVICE_UID);
    d.ok(&["install", folder.to_str().unwrap()]);
    let logs = wait_for(Duration::from_secs(20), "both probes", || {
        let l = d.ok(&["logs", "intruder", "-n", "200"]);
        (l.contains("DIRECT-") && l.contains("ESCAPED-")).then_some(l)
    });
    for tag in ["DIRECT-ANSWER", "ESCAPED-ANSWER"] {
        let line = logs
            .lines()
            .find(|l| l.contains(tag))
            .unwrap_or_else(|| panic!("no {tag}: {logs}"));
        assert!(
            line.contains("permission_denied") && line.contains("descends from the daemon"),
            "{line}"
        );
    }
    let b = d.bundle("default", "intruder").unwrap();
    assert_eq!(
        b["sandbox"]["uid"].as_u64(),
        Some(SERVICE_UID as u64),
        "{b}"
    );
    assert!(
        b["sandbox"]["isolation"]
            .as_str()
            .unwrap()
            .contains("allow_same_uid"),
        "{b}"
    );
    d.ok(&["uninstall", "intruder"]);
}

#[test]
fn finding_8_a_watched_folder_entry_others_can_write_or_that_links_out_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    let mut d = Daemon::unlaunched(
        "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n",
    );
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    mode(&watched, 0o755);
    d.launch();
    let staging = d.root().join("staging");

    // A bundle folder its group may write: refused, with the fix.
    let loose = demo_bundle_at(&staging, "loose");
    mode(&loose, 0o775);
    std::fs::rename(&loose, watched.join("loose")).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the loose bundle's refusal",
        || d.log().contains("chmod go-w").then_some(()),
    );
    assert!(d.bundle("default", "loose").is_none());

    // A manifest linked to a file elsewhere: refused, its content never shown.
    let secret = d.root().join("secret.json");
    std::fs::write(&secret, "{\"name\": \"SECRET-VALUE-815\", \"version\": 7}").unwrap();
    mode(&secret, 0o600);
    let linked = staging.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&secret, linked.join("manifest.json")).unwrap();
    let events = common::events(&d, &["events", "--json"]);
    std::fs::rename(&linked, watched.join("linked")).unwrap();
    let seen = events.until("the linked manifest's refusal", |l| {
        l.contains("manifest_rejected") && l.contains("linked")
    });
    let seen = seen.join("\n");
    assert!(seen.contains("symbolic link"), "{seen}");
    assert!(!seen.contains("SECRET-VALUE"), "{seen}");
    assert!(!d.log().contains("SECRET-VALUE"));

    // Once the mode is fixed, the bundle installs.
    mode(&watched.join("loose"), 0o755);
    let manifest = watched.join("loose/manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text + "\n").unwrap();
    d.wait_state("default", "loose", "ready");

    // A watched folder anyone may write is not read at all.
    mode(&watched, 0o777);
    demo_bundle_at(&watched, "planted");
    wait_for(Duration::from_secs(10), "the open folder's refusal", || {
        d.log().contains("writable by every user").then_some(())
    });
    assert!(d.bundle("default", "planted").is_none());
    assert!(
        d.bundle("default", "loose").is_some(),
        "a running bundle was removed"
    );
}

#[test]
fn finding_1_a_bundle_cannot_use_the_metrics_listener_either() {
    use std::io::{Read, Write};
    let port = common::free_port();
    let d = Daemon::start_with(&format!("metrics_addr = \"{port}\"\n"));
    let script = format!(
        "import socket,sys\ntry:\n s=socket.create_connection(('127.0.0.1',{port}))\n s.sendall(b'GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n d=b''\n while True:\n  c=s.recv(65536)\n  if not c: break\n  d+=c\n print('SCRAPE-'+('GOT' if b'bundlevisor_' in d else 'REFUSED'), file=sys.stderr)\nexcept Exception as e:\n print('SCRAPE-REFUSED', e, file=sys.stderr)\n"
    );
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "scraper",
        "/usr/bin/python3 \"$(dirname \"$0\")/../scrape.py\";",
    );
    std::fs::write(folder.join("scrape.py"), script).unwrap();
    d.ok(&["install", folder.to_str().unwrap()]);
    let logs = wait_for(Duration::from_secs(20), "the scrape probe", || {
        let l = d.ok(&["logs", "scraper", "-n", "50"]);
        l.contains("SCRAPE-").then_some(l)
    });
    assert!(
        logs.contains("SCRAPE-REFUSED"),
        "a bundle read the metrics: {logs}"
    );
    assert!(d.log().contains("HTTP connection refused"), "{}", d.log());
    // The operator still can.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.contains("bundlevisor_"), "{text}");
}
