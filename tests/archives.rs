//! `.mcpb` archives made by the official `mcpb` CLI (pinned in
//! tests/mcpb): installed from the command line and from a watched folder,
//! upgraded, kept on a broken upgrade, removed; running after the
//! downloaded file is gone; hostile archives refused with nothing kept.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{openssl, wait_for, Daemon, DEMO_MANIFEST};
use serde_json::{json, Value};

fn mcpb() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/mcpb/node_modules/.bin/mcpb");
    assert!(
        path.exists(),
        "the mcpb CLI is not installed at {}; run `make mcpb` (make test does)",
        path.display()
    );
    path
}

/// Packs the demo bundle as `NAME` version `version` with the real CLI:
/// `mcpb pack FOLDER OUT.mcpb`. The server is the demo binary without its
/// debug info (the archive is then about 4 MB, not 50).
fn pack(dir: &Path, name: &str, version: &str) -> PathBuf {
    let folder = dir.join(format!("{name}-{version}"));
    std::fs::create_dir_all(folder.join("server")).unwrap();
    let server = folder.join("server/bundlevisor-demo");
    common::stripped_demo_server(&server);
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!(name);
    manifest["version"] = json!(version);
    std::fs::write(
        folder.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let out = dir.join(format!("{name}-{version}.mcpb"));
    common::mcpb_pack(&folder, &out);
    std::fs::remove_dir_all(&folder).unwrap();
    out
}

fn sha256(path: &Path) -> String {
    bundlevisor::archive::sha256(path).unwrap()
}

fn unpacked(d: &Daemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d.state.join("archives"))
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_packed_bundle_installs_from_the_cli_and_outlives_its_file() {
    let mut d = Daemon::start();
    let archive = pack(&d.root().join("downloads"), "memo", "1.2.3");
    let sha = sha256(&archive);
    let out = d.ok(&["install", archive.to_str().unwrap(), "--json"]);
    let installed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(installed["bundle"]["state"], "ready", "{installed}");
    assert_eq!(installed["bundle"]["version"], "1.2.3");
    let b = d.bundle("default", "memo").unwrap();
    assert_eq!(b["archive"]["sha256"], sha, "{b}");
    let dir = PathBuf::from(b["archive"]["unpacked"].as_str().unwrap());
    assert_eq!(dir, d.state.join("archives").join(&sha));
    assert!(dir.join("server/bundlevisor-demo").is_file());
    assert_eq!(
        d.ok(&["call", "memo", "echo", r#"{"text":"packed"}"#])
            .trim(),
        "packed"
    );

    // The downloaded file goes; restarts and a daemon restart do not care.
    std::fs::remove_file(&archive).unwrap();
    let out = d.cli(&["restart", "memo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(d.signal(nix::sys::signal::Signal::SIGTERM).success());
    d.launch();
    let b = d.wait_state("default", "memo", "ready");
    assert_eq!(b["archive"]["sha256"], sha);

    // Uninstalled, its unpacked copy is no longer named (and is collected
    // once the grace period has passed, which this test does not wait for).
    d.ok(&["uninstall", "memo"]);
    assert!(d.bundle("default", "memo").is_none());
}

/// The CLI's error for `args`, which must fail.
fn refused(d: &Daemon, args: &[&str]) -> String {
    let out = d.cli(args);
    assert!(!out.status.success(), "bundlevisor {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_installed_archive_is_upgraded_in_place_and_stays_upgraded() {
    let mut d = Daemon::start_with(
        "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n",
    );
    let staging = d.root().join("staging");
    let (v1, v2) = (
        pack(&staging, "memo", "1.0.0"),
        pack(&staging, "memo", "2.0.0"),
    );
    let (v1p, v2p) = (v1.to_str().unwrap(), v2.to_str().unwrap());

    // Nothing to upgrade yet: the error says how to install it.
    let why = refused(&d, &["upgrade", v1p]);
    assert!(
        why.contains("\"memo\" is not installed") && why.contains("bundlevisor install"),
        "{why}"
    );
    d.ok(&["install", v1p]);
    let why = refused(&d, &["install", v2p]);
    assert!(why.contains("bundlevisor upgrade PATH"), "{why}");
    let before = d.wait_state("default", "memo", "ready");

    // The very archive that runs, given again: nothing restarts.
    let same: Value = serde_json::from_str(&d.ok(&["upgrade", v1p, "--json"])).unwrap();
    assert_eq!(same["bundle"]["pid"], before["pid"], "{same}");
    assert_eq!(same["bundle"]["restarts"], before["restarts"], "{same}");

    // The new version runs in its place, from its own unpacked copy.
    let up: Value = serde_json::from_str(&d.ok(&["upgrade", v2p, "--json"])).unwrap();
    assert_eq!(up["bundle"]["state"], "ready", "{up}");
    assert_eq!(up["bundle"]["version"], "2.0.0", "{up}");
    assert_ne!(up["bundle"]["pid"], before["pid"], "{up}");
    let b = d.bundle("default", "memo").unwrap();
    let unpacked_v2 = d.state.join("archives").join(sha256(&v2));
    assert_eq!(b["archive"]["sha256"], sha256(&v2), "{b}");
    assert_eq!(b["source"], unpacked_v2.display().to_string(), "{b}");
    assert_eq!(
        d.ok(&["call", "memo", "echo", r#"{"text":"v2"}"#]).trim(),
        "v2"
    );

    // A version that cannot run is refused before anything stops.
    let broken = staging.join("memo-broken");
    std::fs::create_dir_all(&broken).unwrap();
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("memo");
    manifest["version"] = json!("3.0.0");
    std::fs::write(
        broken.join("manifest.json"),
        serde_json::to_string(&manifest).unwrap(),
    )
    .unwrap();
    let why = refused(&d, &["upgrade", broken.to_str().unwrap()]);
    assert!(why.contains("server/bundlevisor-demo"), "{why}");
    let still = d.bundle("default", "memo").unwrap();
    assert_eq!(
        (&still["version"], &still["pid"], &still["state"]),
        (&json!("2.0.0"), &up["bundle"]["pid"], &json!("ready")),
        "{still}"
    );

    // The daemon restarted runs the upgraded version, the old file gone.
    std::fs::remove_file(&v1).unwrap();
    assert!(d.signal(nix::sys::signal::Signal::SIGTERM).success());
    d.launch();
    let b = d.wait_state("default", "memo", "ready");
    assert_eq!(
        (&b["version"], &b["archive"]["sha256"]),
        (&json!("2.0.0"), &json!(sha256(&v2))),
        "{b}"
    );

    // A watched folder decides its bundles' versions.
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let notes = pack(&staging, "notes", "1.0.0");
    std::fs::copy(&notes, staging.join("copy")).unwrap();
    std::fs::rename(staging.join("copy"), watched.join("notes.mcpb")).unwrap();
    wait_for(Duration::from_secs(30), "the watched bundle ready", || {
        d.bundle("default", "notes")
            .filter(|b| b["state"] == "ready")
    });
    let notes2 = pack(&staging, "notes", "2.0.0");
    let why = refused(&d, &["upgrade", notes2.to_str().unwrap()]);
    assert!(
        why.contains("watched folder") && why.contains("notes.mcpb"),
        "{why}"
    );
    assert_eq!(d.bundle("default", "notes").unwrap()["version"], "1.0.0");
}

#[test]
fn a_watched_archive_is_installed_upgraded_kept_when_broken_and_removed() {
    let d = Daemon::start_with(
        "watch_debounce = \"50ms\"\n[[watch]]\ndir = \"watched\"\nworkspace = \"default\"\n",
    );
    let watched = d.root().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let staging = d.root().join("staging");
    let v1 = pack(&staging, "notes", "1.0.0");
    let v2 = pack(&staging, "notes", "2.0.0");
    let target = watched.join("notes.mcpb");

    // Dropped in (renamed into place, as a download tool finishes).
    std::fs::copy(&v1, staging.join("copy")).unwrap();
    std::fs::rename(staging.join("copy"), &target).unwrap();
    let b = wait_for(Duration::from_secs(30), "v1 ready", || {
        d.bundle("default", "notes")
            .filter(|b| b["state"] == "ready" && b["version"] == "1.0.0")
    });
    assert_eq!(b["archive"]["sha256"], sha256(&v1));
    assert_eq!(b["source"], target.display().to_string());

    // A new file: upgraded, unpacked beside the running version.
    std::fs::copy(&v2, staging.join("copy")).unwrap();
    std::fs::rename(staging.join("copy"), &target).unwrap();
    let b = wait_for(Duration::from_secs(30), "v2 ready", || {
        d.bundle("default", "notes")
            .filter(|b| b["state"] == "ready" && b["version"] == "2.0.0")
    });
    assert_eq!(b["archive"]["sha256"], sha256(&v2));
    let both = unpacked(&d);
    assert!(
        both.contains(&sha256(&v1)) && both.contains(&sha256(&v2)),
        "{both:?}"
    );
    let pid = b["pid"].as_u64();

    // A broken file: refused, the running version keeps running.
    let bytes = std::fs::read(&v2).unwrap();
    let mut broken = std::fs::File::create(staging.join("copy")).unwrap();
    broken.write_all(&bytes[..bytes.len() / 2]).unwrap();
    drop(broken);
    std::fs::rename(staging.join("copy"), &target).unwrap();
    let b = wait_for(Duration::from_secs(30), "the refusal in status", || {
        d.bundle("default", "notes").filter(|b| {
            b["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("rejected"))
        })
    });
    let why = b["last_error"].as_str().unwrap();
    assert!(
        why.contains("notes.mcpb") && why.contains("not a ZIP archive, or it is truncated"),
        "{why}"
    );
    assert_eq!(
        (b["state"].as_str(), b["pid"].as_u64()),
        (Some("ready"), pid)
    );
    assert_eq!(
        d.ok(&["call", "notes", "echo", r#"{"text":"still v2"}"#])
            .trim(),
        "still v2"
    );

    // Removed: uninstalled, its process gone.
    std::fs::remove_file(&target).unwrap();
    wait_for(Duration::from_secs(30), "the uninstall", || {
        d.bundle("default", "notes").is_none().then_some(())
    });
    wait_for(Duration::from_secs(10), "its process to be gone", || {
        d.bundle_processes().is_empty().then_some(())
    });
}

/// Entries of a hand-made ZIP: (name, bytes).
type Entries<'a> = &'a [(&'a str, &'a [u8])];

/// A ZIP made by hand (as a hostile tool would).
fn hand_made_zip(path: &Path, entries: Entries) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in entries {
        zip.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn a_hostile_archive_is_refused_by_name_and_rule_and_nothing_is_kept() {
    let d = Daemon::start();
    let cases: [(&str, Entries, &str); 3] = [
        (
            "climb.mcpb",
            &[("manifest.json", b"{}"), ("../../escaped", b"x")],
            "climbs out of the bundle",
        ),
        (
            "nested.mcpb",
            &[("bundle/manifest.json", b"{}")],
            "manifest.json is not at its root",
        ),
        (
            "twice.mcpb",
            &[("manifest.json", b"{}"), ("MANIFEST.json", b"{}")],
            "twice",
        ),
    ];
    for (file, entries, rule) in cases {
        let path = d.root().join(file);
        hand_made_zip(&path, entries);
        let mut raw = d.raw();
        raw.hello();
        let r = raw.request(1, "bundle.install", json!({ "path": path }));
        assert_eq!(r["error"]["data"]["kind"], "archive_refused", "{file}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(file) && message.contains(rule),
            "{file}: {message}"
        );
        assert!(unpacked(&d).is_empty(), "{file} left {:?}", unpacked(&d));
    }
    assert!(!d.root().join("escaped").exists());
    assert!(d.status()["bundles"].as_array().unwrap().is_empty());
}

/// A small HTTP server (the registry fixture) that answers every request
/// with `bytes`; returns the archive's URL.
fn registry(bytes: Vec<u8>) -> String {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                bytes.len()
            );
            let _ = stream.write_all(answer.as_bytes());
            let _ = stream.write_all(&bytes);
        }
    });
    format!("http://{addr}/bundles/memo-1.0.0.mcpb")
}

/// Issue 17, point 6: install by URL, checked against its SHA-256.
#[test]
fn an_archive_is_installed_from_a_url_only_when_its_hash_matches() {
    let d = Daemon::start();
    let archive = pack(&d.root().join("build"), "fetched", "1.0.0");
    let sha = sha256(&archive);
    let url = registry(std::fs::read(&archive).unwrap());

    let out = d.cli(&["install", &url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs --sha256"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let wrong = "0".repeat(64);
    let out = d.cli(&["install", &url, "--sha256", &wrong]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("has SHA-256 {sha}, not the expected {wrong}"))
            && err.contains("nothing was installed"),
        "{err}"
    );
    assert!(d.bundle("default", "fetched").is_none());
    assert!(unpacked(&d).is_empty(), "{:?}", unpacked(&d));

    let out = d.ok(&["install", &url, "--sha256", &sha.to_uppercase(), "--json"]);
    let installed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(installed["bundle"]["state"], "ready", "{installed}");
    assert_eq!(installed["bundle"]["archive"]["sha256"], sha);
    // Installed from its unpacked copy: the download itself is gone.
    let source = installed["bundle"]["source"].as_str().unwrap();
    assert!(
        source.starts_with(d.state.join("archives").to_str().unwrap()),
        "{source}"
    );
}

/// A throw-away CA, a publisher certificate it issued, and a rogue
/// self-signed one, made with the openssl CLI in `dir`.
fn certificates(dir: &Path) {
    common::test_ca(dir);
    let key = ["-newkey", "rsa:2048", "-nodes", "-days", "2"];
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "publisher.key",
            "-out",
            "publisher.csr",
            "-subj",
            "/CN=Bundle Publisher/O=Example",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "publisher.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "publisher.pem",
            "-days",
            "2",
        ],
    );
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &key,
            &[
                "-keyout",
                "rogue.key",
                "-out",
                "rogue.pem",
                "-subj",
                "/CN=Rogue",
            ],
        ]
        .concat(),
    );
}

/// `mcpb sign FILE --cert CERT --key KEY` on a copy of `archive`.
fn signed(archive: &Path, certs: &Path, who: &str, out: &Path) -> PathBuf {
    std::fs::copy(archive, out).unwrap();
    let status = Command::new(mcpb())
        .arg("sign")
        .arg(out)
        .arg("--cert")
        .arg(certs.join(format!("{who}.pem")))
        .arg("--key")
        .arg(certs.join(format!("{who}.key")))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "mcpb sign: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    out.to_path_buf()
}

fn install_error(d: &Daemon, path: &Path) -> String {
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "bundle.install", json!({ "path": path }));
    assert_eq!(r["error"]["data"]["kind"], "archive_refused", "{r}");
    r["error"]["message"].as_str().unwrap().to_string()
}

/// Issue 17, point 4: signatures made by `mcpb sign`, verified against the
/// operator's trust anchors, in both layouts the CLI has produced.
#[test]
fn signatures_are_required_verified_and_shown() {
    let root = tempfile::tempdir().unwrap();
    let certs = root.path().join("certs");
    certificates(&certs);
    let d = Daemon::start_with(&format!(
        "[bundles]\nsignatures = \"require\"\ntrusted_certs = [\"{}\"]\n",
        certs.join("ca.pem").display()
    ));
    let work = d.root().join("work");
    let archive = pack(&work, "sealed", "1.0.0");

    // Signed by the publisher the CA vouches for: installed, and shown.
    let good = signed(&archive, &certs, "publisher", &work.join("good.mcpb"));
    let out = d.ok(&["install", good.to_str().unwrap(), "--json"]);
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(b["bundle"]["state"], "ready", "{b}");
    assert_eq!(b["bundle"]["archive"]["signature"], "signed");
    let signer = b["bundle"]["archive"]["signer"].as_str().unwrap();
    assert!(signer.contains("CN=Bundle Publisher"), "{signer}");
    d.ok(&["uninstall", "sealed"]);

    // The older layout: the end-of-central-directory comment length
    // patched to cover the signature block.
    let mut bytes = std::fs::read(&good).unwrap();
    let zip_len = bytes
        .windows(11)
        .rposition(|w| w == b"MCPB_SIG_V1")
        .unwrap();
    let eocd = bytes[..zip_len]
        .windows(4)
        .rposition(|w| w == [0x50, 0x4b, 0x05, 0x06])
        .unwrap();
    let covered = (bytes.len() - (eocd + 22)) as u16;
    bytes[eocd + 20..eocd + 22].copy_from_slice(&covered.to_le_bytes());
    let patched = work.join("patched.mcpb");
    std::fs::write(&patched, &bytes).unwrap();
    let out = d.ok(&["install", patched.to_str().unwrap(), "--json"]);
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(b["bundle"]["archive"]["signature"], "signed", "{b}");
    d.ok(&["uninstall", "sealed"]);

    // Refused before anything is unpacked: unsigned, tampered, untrusted.
    let before = unpacked(&d);
    let why = install_error(&d, &archive);
    assert!(why.contains("not signed"), "{why}");
    let mut tampered = std::fs::read(&good).unwrap();
    tampered[200] ^= 0xff;
    let tampered_path = work.join("tampered.mcpb");
    std::fs::write(&tampered_path, &tampered).unwrap();
    let why = install_error(&d, &tampered_path);
    assert!(why.contains("does not match its contents"), "{why}");
    let rogue = signed(&archive, &certs, "rogue", &work.join("rogue.mcpb"));
    let why = install_error(&d, &rogue);
    assert!(
        why.contains("signed by CN=Rogue") && why.contains("trusted_certs"),
        "{why}"
    );
    let after: Vec<String> = unpacked(&d)
        .into_iter()
        .filter(|n| !n.ends_with(".signature.json"))
        .collect();
    let before: Vec<String> = before
        .into_iter()
        .filter(|n| !n.ends_with(".signature.json"))
        .collect();
    assert_eq!(after, before, "a refused archive was unpacked");
}

/// With `signatures = "warn"` (the default) an unsigned or untrusted
/// archive installs and says so, a signature that does not match is still
/// refused; with `"off"` nothing is checked.
#[test]
fn signatures_under_warn_and_off() {
    let root = tempfile::tempdir().unwrap();
    let certs = root.path().join("certs");
    certificates(&certs);
    let work = root.path().join("work");
    let plain = pack(&work, "plain", "1.0.0");
    let rogue = signed(
        &pack(&work, "rogue", "1.0.0"),
        &certs,
        "rogue",
        &work.join("rogue-signed.mcpb"),
    );
    let good = signed(
        &pack(&work, "broken", "1.0.0"),
        &certs,
        "publisher",
        &work.join("good.mcpb"),
    );
    let mut bytes = std::fs::read(&good).unwrap();
    // A byte of the signature value changed: the ZIP is intact, the
    // signature no longer matches it.
    let at = bytes.len() - "MCPB_SIG_END".len() - 10;
    bytes[at] ^= 0xff;
    let tampered = work.join("tampered.mcpb");
    std::fs::write(&tampered, &bytes).unwrap();

    let d = Daemon::start();
    let install = |d: &Daemon, path: &Path| -> Value {
        let out = d.ok(&["install", path.to_str().unwrap(), "--json"]);
        serde_json::from_str::<Value>(&out).unwrap()["bundle"]["archive"].clone()
    };
    let a = install(&d, &plain);
    assert_eq!(
        (a["signature"].as_str(), a["signer"].as_str()),
        (Some("unsigned"), None),
        "{a}"
    );
    let a = install(&d, &rogue);
    assert_eq!(a["signature"], "untrusted", "{a}");
    assert_eq!(a["signer"], "CN=Rogue");
    let why = install_error(&d, &tampered);
    assert!(why.contains("does not match its contents"), "{why}");
    drop(d);

    let d = Daemon::start_with("[bundles]\nsignatures = \"off\"\n");
    let a = install(&d, &tampered);
    assert_eq!(a["signature"], "not_checked", "{a}");
}

/// A real third-party server, packed by the official CLI: the pinned
/// `@modelcontextprotocol/server-memory` folder (`make servers`) as a
/// `.mcpb`, installed and used.
#[test]
fn a_third_party_server_packed_by_mcpb_installs_and_serves() {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/servers/memory");
    assert!(
        folder.join("manifest.json").is_file(),
        "the memory server is not built; run `make servers` (make test does)"
    );
    let d = Daemon::start();
    let archive = d.root().join("memory.mcpb");
    common::mcpb_pack(&folder, &archive);
    let out = d.ok(&["install", archive.to_str().unwrap(), "--json"]);
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(b["bundle"]["state"], "ready", "{b}");
    assert_eq!(b["bundle"]["archive"]["sha256"], sha256(&archive));
    let created = d.ok(&[
        "call",
        "memory",
        "create_entities",
        r#"{"entities":[{"name":"Grace","entityType":"person","observations":["found a moth"]}]}"#,
    ]);
    assert!(created.contains("Grace"), "{created}");
    let graph = d.ok(&["call", "memory", "read_graph", "{}"]);
    assert!(graph.contains("found a moth"), "{graph}");
}
