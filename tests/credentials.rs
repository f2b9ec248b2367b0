//! `bundlevisor configure`: user_config values stored encrypted, the
//! respawn that follows, `needs_config`, and a canary secret that must never
//! show up in a log, status, event or error text.

mod common;

use std::time::Duration;

use common::{
    all_files, contains, env_of, events, keyed_bundle, keyed_ready, nth, text, wait_for, Daemon,
};
use serde_json::Value;

const CANARY: &str = "sk-CANARY-7f3a91c2";
const CANARY2: &str = "sk-CANARY-second-55d0";

#[test]
fn configure_respawns_with_the_new_values_and_the_secret_never_leaks() {
    let d = Daemon::start();
    let stream = events(&d, &["events", "--json"]);
    let mut seen = Vec::new(); // every output a user or a script could see
    let bundle = keyed_bundle(&d.root().join("bundles"), "keyed");

    // Without the required key the bundle is not spawned.
    let out = d.cli(&["install", bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let msg = text(&out);
    assert!(msg.contains("needs configuration"), "{msg}");
    assert!(msg.contains("api_key"), "{msg}");
    assert!(msg.contains("bundlevisor configure keyed"), "{msg}");
    let b = d.wait_state("default", "keyed", "needs_config");
    assert!(b["pid"].is_null(), "{b}");
    assert!(b["last_error"].as_str().unwrap().contains("api_key"), "{b}");
    assert!(
        common::processes_with_cwd_under(&bundle).is_empty(),
        "a bundle that needs configuration must not be spawned"
    );

    // Set it: the bundle starts with it.
    let out = d.ok(&["configure", "keyed", &format!("api_key={CANARY}")]);
    assert!(out.contains("default/keyed reconfigured: ready"), "{out}");
    seen.push(out);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    assert_eq!(env_of(&d, "keyed", "DEMO_REGION"), "eu");
    let pid1 = d.bundle("default", "keyed").unwrap()["pid"]
        .as_u64()
        .unwrap();

    // A non-secret change respawns it; the stored secret stays.
    seen.push(d.ok(&["configure", "keyed", "region=us"]));
    let pid2 = d.bundle("default", "keyed").unwrap()["pid"]
        .as_u64()
        .unwrap();
    assert_ne!(pid1, pid2, "configure must respawn the bundle");
    assert_eq!(env_of(&d, "keyed", "DEMO_REGION"), "us");
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);

    // KEY=- reads the value from stdin.
    let out = d.cli_with_stdin(
        &["configure", "keyed", "api_key=-"],
        &format!("{CANARY2}\n"),
    );
    assert!(out.status.success(), "{}", text(&out));
    seen.push(text(&out));
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY2);

    // Bad input changes nothing and says what is wrong.
    let out = d.cli(&["configure", "keyed", "api_kye=x", "region=ap"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = text(&out);
    assert!(
        msg.contains("nothing was changed") && msg.contains("api_kye"),
        "{msg}"
    );
    assert!(msg.contains("api_key, mode, region"), "{msg}");
    assert_eq!(env_of(&d, "keyed", "DEMO_REGION"), "us");

    // Listing: the secret is masked, the plain value shown.
    let list = d.ok(&["configure", "keyed"]);
    assert!(
        list.contains("[redacted]") && list.contains(" us"),
        "{list}"
    );
    let json: Value = serde_json::from_str(&d.ok(&["configure", "keyed", "--json"])).unwrap();
    let api = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "api_key")
        .unwrap();
    assert_eq!(
        (api["set"].as_bool(), api.get("value")),
        (Some(true), None),
        "{json}"
    );
    seen.push(list);
    seen.push(json.to_string());

    // A start that fails with the secret in its stderr: the failure text and
    // the `exited` event carry the stderr tail, masked.
    let out = d.cli(&["configure", "keyed", "mode=crash"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let msg = text(&out);
    assert!(msg.contains("was rejected"), "{msg}");
    assert!(msg.contains("[redacted]"), "{msg}");
    seen.push(msg);
    seen.push(d.ok(&["configure", "keyed", "--unset", "mode"]));
    d.wait_state("default", "keyed", "ready");

    // The careless bundle did print its key: the log has the line, masked.
    let logs = d.ok(&["logs", "keyed", "-n", "100"]);
    assert!(logs.contains("using key [redacted]"), "{logs}");
    seen.push(logs);
    seen.push(d.ok(&["status"]));
    seen.push(d.ok(&["status", "--json"]));
    seen.push(d.ok(&["tools", "keyed", "--json"]));
    // Four starts reached ready: api_key, region, stdin, and after the crash.
    let events = stream.until("the fourth ready", nth(4, keyed_ready));
    assert!(
        events.iter().any(|e| e.contains("\"reconfigured\"")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("fatal: key [redacted] was rejected")),
        "the failed start's event carries the masked stderr: {events:?}"
    );
    seen.extend(events);
    seen.push(d.log());

    for text in &seen {
        for canary in [CANARY, CANARY2] {
            assert!(!text.contains(canary), "a secret leaked into:\n{text}");
        }
    }
    // Nothing under the state dir (database, WAL, logs) holds it in the clear.
    for (path, bytes) in all_files(&d.state) {
        for canary in [CANARY, CANARY2] {
            assert!(
                !contains(&bytes, canary),
                "{} holds a secret in the clear",
                path.display()
            );
        }
    }
}

#[test]
fn stored_values_survive_a_daemon_restart_and_a_wrong_key_is_refused() {
    let mut d = Daemon::start();
    let bundle = keyed_bundle(&d.root().join("bundles"), "keyed");
    let _ = d.cli(&["install", bundle.to_str().unwrap()]);
    d.wait_state("default", "keyed", "needs_config");
    d.ok(&["configure", "keyed", &format!("api_key={CANARY}")]);
    let key_file = d.state.join("credentials.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // Boot reload: the bundle comes back with its stored key, no prompt.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.launch();
    d.wait_state("default", "keyed", "ready");
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);

    // Another key cannot read the credentials: the daemon refuses to start
    // and says how to recover, instead of starting bundles without them.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let original = std::fs::read(&key_file).unwrap();
    std::fs::remove_file(&key_file).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["daemon", "--config"])
        .arg(&d.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("does not match"), "{msg}");
    assert!(msg.contains("restore the original key"), "{msg}");
    // The refused start created a new key file; put the backup back.
    std::fs::remove_file(&key_file).unwrap();
    std::fs::write(&key_file, original).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    d.launch();
    d.wait_state("default", "keyed", "ready");
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);

    // uninstall keeps the credentials (a reinstall finds them); --purge deletes them.
    d.ok(&["uninstall", "keyed"]);
    d.ok(&["install", bundle.to_str().unwrap()]);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    d.ok(&["uninstall", "keyed", "--purge"]);
    let out = d.cli(&["install", bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    d.wait_state("default", "keyed", "needs_config");
}

#[test]
fn concurrent_configure_calls_on_one_bundle_run_one_after_the_other() {
    let d = Daemon::start();
    let bundle = keyed_bundle(&d.root().join("bundles"), "keyed");
    let _ = d.cli(&["install", bundle.to_str().unwrap()]);
    d.ok(&["configure", "keyed", "api_key=first-value"]);
    let stream = events(&d, &["events", "--json"]);
    let regions = ["r1", "r2", "r3", "r4"];
    std::thread::scope(|s| {
        for r in regions {
            let d = &d;
            s.spawn(move || d.ok(&["configure", "keyed", &format!("region={r}")]));
        }
    });
    let lines = stream.until("four respawns", nth(regions.len(), keyed_ready));
    // Serialized: each reconfigure reaches ready before the next one begins.
    let kinds: Vec<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["name"] == "keyed")
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .filter(|k| k == "reconfigured" || k == "ready")
        .collect();
    assert_eq!(
        kinds,
        ["reconfigured", "ready"].repeat(regions.len()),
        "{lines:#?}"
    );
    let last = env_of(&d, "keyed", "DEMO_REGION");
    assert!(regions.contains(&last.as_str()), "{last}");
    wait_for(Duration::from_secs(5), "a single bundle process", || {
        (common::processes_with_cwd_under(&bundle).len() == 1).then_some(())
    });
}
