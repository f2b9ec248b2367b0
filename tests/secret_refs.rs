//! Secret references (`configure --ref KEY=REFERENCE`, docs/credentials.md,
//! "Secret references"): a sensitive value read at each start from where
//! the operator keeps it, never stored, masked everywhere, and the bundle
//! respawned when it changes. Each source against the real thing where it
//! runs here: systemd credentials laid out as systemd lays them out
//! (`$CREDENTIALS_DIRECTORY`; systemd is not PID 1 in these containers), a
//! Kubernetes Secret volume with its `..data` swap, the daemon's
//! environment, `pass` with a GPG key made in the test; GCP Secret Manager
//! and Vault KV v2 against fakes of their HTTP APIs
//! (tests/common/secret_stores.rs). Every test ends with a canary scan.

mod common;
#[path = "common/secret_stores.rs"]
mod stores;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{all_files, contains, env_of, events, keyed_bundle, text, wait_for, Daemon};
use serde_json::Value;

const CANARY: &str = "sk-CANARY-ref-1d7e02";
const CANARY2: &str = "sk-CANARY-ref-rotated-93b1";
const CANARY3: &str = "sk-CANARY-ref-credential-5a2c";
const CANARY4: &str = "sk-CANARY-ref-env-0f88";
const CANARIES: [&str; 4] = [CANARY, CANARY2, CANARY3, CANARY4];

/// A daemon whose config ends with `secrets` (a `[secrets]` table naming
/// `ROOT`, replaced by its folder), with `env`, started.
fn daemon(secrets: &str, env: &[(&str, String)]) -> Daemon {
    let mut d = Daemon::unlaunched("");
    let root = d.root();
    let mut config = std::fs::read_to_string(&d.config).unwrap();
    config.push_str(&secrets.replace("ROOT", root.to_str().unwrap()));
    std::fs::write(&d.config, config).unwrap();
    for (k, v) in env {
        d.env.push((k.to_string(), v.clone()));
    }
    d.launch();
    d
}

fn pid_of(d: &Daemon, name: &str) -> u64 {
    let b = d.wait_state("default", name, "ready");
    b["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {b}"))
}

/// Waits for the bundle to be ready again under another pid.
fn respawned(d: &Daemon, name: &str, old: u64) -> u64 {
    wait_for(Duration::from_secs(30), "the bundle to respawn", || {
        let b = d.bundle("default", name)?;
        let pid = b["pid"].as_u64()?;
        (pid != old && b["state"] == "ready").then_some(pid)
    })
}

/// `configure ARGS` that must fail: its text.
fn refused(d: &Daemon, args: &[&str]) -> String {
    let out = d.cli(args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    text(&out)
}

/// A Kubernetes Secret volume as the kubelet writes it: `KEY` is a link to
/// `..data/KEY`, `..data` a link to a timestamped folder; an update writes
/// a new folder, renames a new link over `..data` and removes the old one.
fn kubelet_write(volume: &Path, key: &str, value: &str, generation: u32) {
    std::fs::create_dir_all(volume).unwrap();
    let folder = format!("..2026_11_27_14_00_0{generation}.000{generation}");
    std::fs::create_dir(volume.join(&folder)).unwrap();
    std::fs::write(volume.join(&folder).join(key), value).unwrap();
    let old = std::fs::read_link(volume.join("..data")).ok();
    std::os::unix::fs::symlink(&folder, volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    if !volume.join(key).exists() {
        std::os::unix::fs::symlink(format!("..data/{key}"), volume.join(key)).unwrap();
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(volume.join(old)).unwrap();
    }
}

/// The bundle's `last_error`.
fn last_error(d: &Daemon, name: &str) -> String {
    let b = d.bundle("default", name).unwrap();
    b["last_error"].as_str().unwrap_or_default().to_string()
}

fn secret_refs(d: &Daemon, name: &str) -> Vec<Value> {
    let b = d.bundle("default", name).unwrap();
    b["secret_refs"].as_array().cloned().unwrap_or_default()
}

/// Everything a user could see, and every file under the state folder,
/// free of each canary.
fn assert_nowhere(d: &Daemon, mut seen: Vec<String>, canaries: &[&str]) {
    seen.push(d.ok(&["status", "--json"]));
    seen.push(d.ok(&["status"]));
    seen.push(d.ok(&["logs", "keyed", "-n", "200"]));
    seen.push(d.log());
    for text in &seen {
        for canary in canaries {
            assert!(!text.contains(canary), "a secret leaked into:\n{text}");
        }
    }
    for (path, bytes) in all_files(&d.state) {
        for canary in canaries {
            assert!(
                !contains(&bytes, canary),
                "{} holds a secret",
                path.display()
            );
        }
    }
}

#[test]
fn file_credential_and_env_references_are_read_at_each_start_and_a_swap_respawns() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    // As systemd lays out LoadCredential=: a folder of 0400 files.
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("api_key"), format!("{CANARY3}\n")).unwrap();
    let d = daemon(
        "[secrets]\nallow = [\n  { scheme = \"file\", prefix = \"ROOT/secrets\" },\n  { scheme = \"credential\", prefix = \"api_*\" },\n  { scheme = \"env\", prefix = \"DEMO_SECRET\" },\n]\n",
        &[
            ("CREDENTIALS_DIRECTORY", creds.display().to_string()),
            ("DEMO_SECRET", CANARY4.to_string()),
        ],
    );
    let stream = events(&d, &["events", "--json"]);
    let mut seen = Vec::new();
    let root = d.root();
    let volume = root.join("secrets/api");
    kubelet_write(&volume, "api_key", CANARY, 1);
    let bundle = keyed_bundle(&root.join("bundles"), "keyed");
    let out = d.cli(&["install", bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    d.wait_state("default", "keyed", "needs_config");

    // A mounted Secret, through its `..data` link.
    let file_ref = format!("api_key=file:{}", volume.join("api_key").display());
    let out = d.ok(&["configure", "keyed", "--ref", &file_ref]);
    assert!(out.contains("reconfigured: ready"), "{out}");
    seen.push(out);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    let refs = secret_refs(&d, "keyed");
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert_eq!(refs[0]["key"], "api_key");
    assert_eq!(
        refs[0]["reference"],
        format!("file:{}", volume.join("api_key").display())
    );
    assert!(refs[0]["resolved_at"].as_i64().unwrap() > 1_700_000_000);
    let listed = d.ok(&["configure", "keyed"]);
    assert!(listed.contains("(read from file:"), "{listed}");
    let json: Value = serde_json::from_str(&d.ok(&["configure", "keyed", "--json"])).unwrap();
    let key = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "api_key")
        .unwrap()
        .clone();
    assert_eq!(
        (
            key["set"].as_bool(),
            key.get("value"),
            key["reference"].as_str()
        ),
        (Some(true), None, refs[0]["reference"].as_str()),
        "{key}"
    );
    seen.extend([listed, json.to_string()]);

    // The kubelet updates the Secret: the bundle is respawned with it.
    let pid = pid_of(&d, "keyed");
    kubelet_write(&volume, "api_key", CANARY2, 2);
    let pid = respawned(&d, "keyed", pid);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY2);
    seen.extend(stream.until("the rotation's event", |l| {
        l.contains("a secret its user_config refers to changed")
    }));

    // A systemd credential, then the daemon's environment.
    seen.push(d.ok(&["configure", "keyed", "--ref", "api_key=credential:api_key"]));
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY3);
    seen.push(d.ok(&["configure", "keyed", "--ref", "api_key=env:DEMO_SECRET"]));
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY4);
    assert_ne!(pid_of(&d, "keyed"), pid);

    // Bad references change nothing and say what is wrong.
    let private = root.join("private");
    std::fs::write(&private, "root's own").unwrap();
    std::os::unix::fs::symlink(&private, root.join("secrets/escape")).unwrap();
    for (given, says) in [
        (
            "api_key=file:/etc/shadow",
            "no [secrets] allow rule covers it",
        ),
        ("api_key=env:HOME", "no [secrets] allow rule covers it"),
        (
            "region=env:DEMO_SECRET",
            "only a sensitive, single string key",
        ),
        ("api_key=vault:nope", "is not a secret reference"),
        ("api_key=file:relative/path", "absolute path"),
    ] {
        let msg = refused(&d, &["configure", "keyed", "--ref", given]);
        assert!(
            msg.contains(says) && msg.contains("nothing was changed"),
            "{given}: {msg}"
        );
        seen.push(msg);
    }
    let missing = format!("api_key=file:{}", root.join("secrets/api/nope").display());
    let msg = refused(&d, &["configure", "keyed", "--ref", &missing]);
    assert!(msg.contains("cannot open it"), "{msg}");
    let escape = format!("api_key=file:{}", root.join("secrets/escape").display());
    let msg = refused(&d, &["configure", "keyed", "--ref", &escape]);
    assert!(msg.contains("which no [secrets] rule allows"), "{msg}");
    assert!(!msg.contains("root's own"), "{msg}");
    // A usage error, caught by the CLI (exit 2).
    let out = d.cli(&["configure", "keyed", "--ref", "api_key"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("expected KEY=REFERENCE"),
        "{}",
        text(&out)
    );
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY4);

    // A reference that fails at a start: needs_config, naming it and why,
    // nothing spawned; fixed, a restart brings the bundle back.
    d.ok(&["configure", "keyed", "--ref", &file_ref]);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY2);
    std::fs::remove_dir_all(&volume).unwrap();
    let msg = refused(&d, &["restart", "keyed"]);
    seen.push(msg);
    let b = d.wait_state("default", "keyed", "needs_config");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains(&format!("file:{}", volume.join("api_key").display()))
            && error.contains("cannot open it")
            && error.contains("bundlevisor restart keyed"),
        "{b}"
    );
    assert!(b["pid"].is_null(), "{b}");
    assert!(
        b.get("secret_refs").is_none(),
        "no process runs with them: {b}"
    );
    kubelet_write(&volume, "api_key", CANARY, 3);
    d.ok(&["restart", "keyed"]);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);

    // A plain value replaces the reference.
    d.ok(&["configure", "keyed", "api_key=literal-value-123"]);
    assert!(secret_refs(&d, "keyed").is_empty());
    assert_nowhere(&d, seen, &CANARIES);
}

/// Kills the gpg-agent a test's GNUPGHOME started.
struct Agent(PathBuf);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .args(["--kill", "all"])
            .env("GNUPGHOME", &self.0)
            .status();
    }
}

/// `pass ARGS` with `stdin`, in the test's store.
fn pass(store: &Path, gnupg: &Path, args: &[&str], stdin: &str) {
    use std::io::Write;
    let mut child = Command::new("pass")
        .args(args)
        .env("PASSWORD_STORE_DIR", store)
        .env("GNUPGHOME", gnupg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pass is installed (make sysdeps)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "pass {args:?}: {}", text(&out));
}

#[test]
fn a_pass_entry_is_read_with_a_real_gpg_key_and_its_change_respawns() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (gnupg, store) = (dir.path().join("gnupg"), dir.path().join("store"));
    std::fs::create_dir(&gnupg).unwrap();
    std::fs::set_permissions(&gnupg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let _agent = Agent(gnupg.clone());
    let gpg = Command::new("gpg")
        .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
        .args([
            "--quick-gen-key",
            "bundlevisor test <test@bundlevisor.invalid>",
        ])
        .args(["default", "default", "never"])
        .env("GNUPGHOME", &gnupg)
        .output()
        .unwrap();
    assert!(gpg.status.success(), "{}", text(&gpg));
    pass(&store, &gnupg, &["init", "test@bundlevisor.invalid"], "");
    // The first line is the password, as pass has it.
    pass(
        &store,
        &gnupg,
        &["insert", "-m", "team/api"],
        &format!("{CANARY}\nuser: bundlevisor\n"),
    );
    let d = daemon(
        &format!(
            "[secrets]\npass_store = \"{}\"\ngnupg_home = \"{}\"\nallow = [{{ scheme = \"pass\", prefix = \"team\" }}]\n",
            store.display(),
            gnupg.display()
        ),
        &[],
    );
    let stream = events(&d, &["events", "--json"]);
    let bundle = keyed_bundle(&d.root().join("bundles"), "keyed");
    let _ = d.cli(&["install", bundle.to_str().unwrap()]);
    let mut seen = vec![d.ok(&["configure", "keyed", "--ref", "api_key=pass:team/api"])];
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    assert_eq!(secret_refs(&d, "keyed")[0]["reference"], "pass:team/api");

    // `pass insert -f` (or `pass edit`) replaces the entry: respawned.
    let pid = pid_of(&d, "keyed");
    pass(
        &store,
        &gnupg,
        &["insert", "-f", "-m", "team/api"],
        &format!("{CANARY2}\n"),
    );
    respawned(&d, "keyed", pid);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY2);
    seen.extend(stream.until("the rotation's event", |l| {
        l.contains("a secret its user_config refers to changed")
    }));

    let msg = refused(
        &d,
        &["configure", "keyed", "--ref", "api_key=pass:team/missing"],
    );
    assert!(msg.contains("no such entry in the store"), "{msg}");
    let msg = refused(
        &d,
        &["configure", "keyed", "--ref", "api_key=pass:other/api"],
    );
    assert!(msg.contains("no [secrets] allow rule"), "{msg}");
    seen.push(msg);
    assert_nowhere(&d, seen, &[CANARY, CANARY2]);
}

#[test]
fn gcp_and_vault_references_are_read_over_their_apis_and_failures_say_why() {
    let fake = stores::Fake::start();
    fake.with(|s| {
        s.gcp.insert(
            "projects/acme/secrets/api/versions/3".into(),
            format!("{CANARY}\n"),
        );
        s.vault.insert(
            "secret/team/api".into(),
            vec![
                [("key".to_string(), CANARY3.to_string())].into(),
                [("key".to_string(), CANARY2.to_string())].into(),
            ],
        );
    });
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("vault-token");
    std::fs::write(&token, format!("{}\n", stores::VAULT_TOKEN)).unwrap();
    let mut d = daemon(
        &format!(
            "[secrets]\ngcp_endpoint = \"{url}\"\ngcp_metadata = \"{url}\"\nvault_addr = \"{url}\"\nvault_token_file = \"{}\"\ntimeout = \"3s\"\nallow = [\n  {{ scheme = \"gcp\", prefix = \"projects/acme\" }},\n  {{ scheme = \"vault\", prefix = \"secret/team\" }},\n]\n",
            token.display(),
            url = fake.url
        ),
        &[],
    );
    let bundle = keyed_bundle(&d.root().join("bundles"), "keyed");
    let _ = d.cli(&["install", bundle.to_str().unwrap()]);

    // GCP, with the metadata server's token (one trailing newline dropped).
    let mut seen = vec![d.ok(&[
        "configure",
        "keyed",
        "--ref",
        "api_key=gcp:projects/acme/secrets/api/versions/3",
    ])];
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    assert!(fake.with(|s| s.metadata_tokens) >= 1);
    // Vault KV v2: the newest version, then a pinned one.
    seen.push(d.ok(&[
        "configure",
        "keyed",
        "--ref",
        "api_key=vault:secret/team/api#key",
    ]));
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY2);
    seen.push(d.ok(&[
        "configure",
        "keyed",
        "--ref",
        "api_key=vault:secret/team/api#key@1",
    ]));
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY3);
    let reads = fake.with(|s| s.vault_reads);
    // A restart reads it again.
    d.ok(&["restart", "keyed"]);
    assert_eq!(fake.with(|s| s.vault_reads), reads + 1);

    for (given, says) in [
        (
            "api_key=gcp:projects/acme/secrets/api/versions/4",
            "Secret Manager has no such secret (HTTP 404)",
        ),
        (
            "api_key=vault:secret/team/api#password",
            "the secret has no field \"password\"",
        ),
        (
            "api_key=vault:secret/other/api#key",
            "no [secrets] allow rule",
        ),
        (
            "api_key=gcp:projects/other/secrets/api/versions/1",
            "no [secrets] allow rule",
        ),
    ] {
        let msg = refused(&d, &["configure", "keyed", "--ref", given]);
        assert!(msg.contains(says), "{given}: {msg}");
        seen.push(msg);
    }

    // A token the store refuses: needs_config, saying so, never the token.
    std::fs::write(&token, "hvs.wrong-token").unwrap();
    seen.push(refused(&d, &["restart", "keyed"]));
    let b = d.wait_state("default", "keyed", "needs_config");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains("Vault refused the daemon's credentials (HTTP 403)"),
        "{b}"
    );
    assert!(!error.contains("hvs."), "{b}");
    std::fs::write(&token, stores::VAULT_TOKEN).unwrap();
    d.ok(&["restart", "keyed"]);
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY3);

    // A sealed Vault (503) may pass; a standby's redirect is not followed.
    for (code, says) in [
        (503, "Vault answered HTTP 503"),
        (307, "a redirect, which is never followed"),
    ] {
        fake.with(|s| s.vault_status.insert("secret/team/api".into(), code));
        let msg = refused(&d, &["restart", "keyed"]);
        assert!(msg.contains(says), "{msg}");
        let error = last_error(&d, "keyed");
        assert!(
            error.contains("tried again by the restart policy"),
            "{error}"
        );
        seen.push(msg);
    }
    fake.with(|s| s.vault_status.clear());
    d.ok(&["restart", "keyed"]);
    assert_eq!(fake.with(|s| s.vault_namespace.clone()), None);

    // A payload damaged on the way (its CRC32C) is not used.
    d.ok(&[
        "configure",
        "keyed",
        "--ref",
        "api_key=gcp:projects/acme/secrets/api/versions/3",
    ]);
    fake.with(|s| s.gcp_bad_crc = true);
    let msg = refused(&d, &["restart", "keyed"]);
    assert!(msg.contains("does not match its dataCrc32c"), "{msg}");
    fake.with(|s| s.gcp_bad_crc = false);

    // A token file instead of the metadata server, and a Vault namespace.
    let gcp_token = dir.path().join("gcp-token");
    std::fs::write(&gcp_token, stores::GCP_TOKEN).unwrap();
    let mut config = std::fs::read_to_string(&d.config).unwrap();
    config = config.replace(
        "[secrets]\n",
        &format!(
            "[secrets]\ngcp_token_file = \"{}\"\nvault_namespace = \"team\"\n",
            gcp_token.display()
        ),
    );
    std::fs::write(&d.config, config).unwrap();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let tokens = fake.with(|s| s.metadata_tokens);
    d.launch();
    d.wait_state("default", "keyed", "ready");
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);
    assert_eq!(
        fake.with(|s| s.metadata_tokens),
        tokens,
        "the token file is used"
    );
    d.ok(&[
        "configure",
        "keyed",
        "--ref",
        "api_key=vault:secret/team/api#key",
    ]);
    assert_eq!(
        fake.with(|s| s.vault_namespace.clone()).as_deref(),
        Some("team")
    );

    // The store goes away: a start fails as one that may pass, and says so.
    drop(fake);
    let msg = refused(&d, &["restart", "keyed"]);
    assert!(msg.contains("Vault is unreachable"), "{msg}");
    let error = last_error(&d, "keyed");
    assert!(
        error.contains("tried again by the restart policy"),
        "{error}"
    );
    seen.push(msg);
    assert_nowhere(&d, seen, &CANARIES);
}

/// An admitted user (not root) may use only the references a rule lists
/// its uid for, and a file is read with its own rights: root's files are
/// not an oracle, whether they exist or not; a link from its folder into
/// root's is refused where it leads; a root-only file under its rule is
/// not readable through it; and a reference root set does not follow the
/// bundle's name to a bundle the user installs in its place.
#[test]
fn an_admitted_user_cannot_read_roots_files_through_a_reference() {
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        return; // acting as another user needs root
    }
    let mut d = Daemon::unlaunched(&format!("[control]\nallowed_gids = [{NOBODY}]\n"));
    let root = d.root();
    let mut config = std::fs::read_to_string(&d.config).unwrap();
    config.push_str(&format!(
        "[secrets]\nallow = [\n  {{ scheme = \"file\", prefix = \"{0}/root-secrets\" }},\n  {{ scheme = \"file\", prefix = \"{0}/team\", uids = [{NOBODY}] }},\n]\n",
        root.display()
    ));
    std::fs::write(&d.config, config).unwrap();
    d.launch();
    for folder in ["root-secrets", "team"] {
        std::fs::create_dir(root.join(folder)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &str, mode: u32| {
        std::fs::set_permissions(root.join(path), std::fs::Permissions::from_mode(mode)).unwrap()
    };
    std::fs::write(root.join("root-secrets/db"), CANARY2).unwrap();
    mode("root-secrets/db", 0o644);
    std::fs::write(root.join("team/api"), CANARY).unwrap();
    mode("team/api", 0o644);
    std::os::unix::fs::symlink(root.join("root-secrets/db"), root.join("team/escape")).unwrap();
    // Under its rule, but root's only.
    std::fs::write(root.join("team/root-only"), CANARY2).unwrap();
    mode("team/root-only", 0o600);
    std::fs::create_dir(root.join("team/private")).unwrap();
    std::fs::write(root.join("team/private/key"), CANARY2).unwrap();
    mode("team/private", 0o700);
    let bundle = keyed_bundle(&root.join("bundles"), "keyed");
    common::chown_tree(&bundle, NOBODY);
    let _ = d.cli_as(NOBODY, &["install", bundle.to_str().unwrap()]);
    d.wait_state("default", "keyed", "needs_config");
    let as_nobody = |given: &str| {
        let out = d.cli_as(NOBODY, &["configure", "keyed", "--ref", given]);
        (out.status.code(), text(&out))
    };
    // Root's file and a missing one get the same answer.
    let (code, existing) = as_nobody(&format!("api_key=file:{}/root-secrets/db", root.display()));
    let (_, missing) = as_nobody(&format!(
        "api_key=file:{}/root-secrets/nope",
        root.display()
    ));
    assert_eq!(code, Some(1), "{existing}");
    assert!(existing.contains("uid 65534 may not use it"), "{existing}");
    assert_eq!(
        existing.replace("/root-secrets/db", "P"),
        missing.replace("/root-secrets/nope", "P")
    );
    let (_, escape) = as_nobody(&format!("api_key=file:{}/team/escape", root.display()));
    assert!(
        escape.contains("which no [secrets] rule allows"),
        "{escape}"
    );
    // Read with its own rights: root's file under its rule is refused, and
    // a folder it cannot enter says the same whether the file is there.
    let (code, root_only) = as_nobody(&format!("api_key=file:{}/team/root-only", root.display()));
    assert_eq!(code, Some(1), "{root_only}");
    assert!(root_only.contains("Permission denied"), "{root_only}");
    let (_, hidden) = as_nobody(&format!("api_key=file:{}/team/private/key", root.display()));
    let (_, absent) = as_nobody(&format!(
        "api_key=file:{}/team/private/nope",
        root.display()
    ));
    assert!(hidden.contains("Permission denied"), "{hidden}");
    assert_eq!(
        hidden.replace("/private/key", "P"),
        absent.replace("/private/nope", "P")
    );
    // Its own folder works, for it.
    let (code, out) = as_nobody(&format!("api_key=file:{}/team/api", root.display()));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(env_of(&d, "keyed", "DEMO_API_KEY"), CANARY);

    // Root configures its own bundle with its own secret; the user
    // uninstalls it and installs its own under the same name: the
    // reference root set is not read for it.
    let roots = keyed_bundle(&root.join("bundles/root"), "shared");
    let _ = d.cli(&["install", roots.to_str().unwrap()]);
    let by_root = format!("api_key=file:{}/root-secrets/db", root.display());
    d.ok(&["configure", "shared", "--ref", &by_root]);
    assert_eq!(env_of(&d, "shared", "DEMO_API_KEY"), CANARY2);
    let uninstalled = d.cli_as(NOBODY, &["uninstall", "shared"]);
    assert!(uninstalled.status.success(), "{}", text(&uninstalled));
    let theirs = keyed_bundle(&root.join("bundles/nobody"), "shared");
    common::chown_tree(&theirs, NOBODY);
    let installed = d.cli_as(NOBODY, &["install", theirs.to_str().unwrap()]);
    assert_eq!(installed.status.code(), Some(1), "{}", text(&installed));
    let b = d.wait_state("default", "shared", "needs_config");
    assert!(
        b["last_error"]
            .as_str()
            .unwrap()
            .contains("set while uid 0 owned the bundle's source, which uid 65534 owns now"),
        "{b}"
    );
    let seen = vec![
        existing,
        missing,
        escape,
        out,
        root_only,
        hidden,
        text(&installed),
    ];
    assert_nowhere(&d, seen, &[CANARY, CANARY2]);

    // The operator takes the uid out of the rule: its reference is not
    // read at the next start.
    let config = std::fs::read_to_string(&d.config)
        .unwrap()
        .replace(&format!(", uids = [{NOBODY}]"), "");
    std::fs::write(&d.config, config).unwrap();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.launch();
    let b = d.wait_state("default", "keyed", "needs_config");
    assert!(
        b["last_error"]
            .as_str()
            .unwrap()
            .contains("uid 65534 may not use it"),
        "{b}"
    );
}
