//! Remote bundles over streamable HTTP against the in-process OAuth fixture
//! (tests/common/remote.rs): the OAuth retry rebuild (401 → token → rebuild
//! through the one connect function → retry once), host-resources on the
//! rebuilt session, the `auth` flow through its loopback redirect, boot
//! reload with the stored token, and `needs_auth` when nothing silent helps.
//! Then the attacks of docs/security.md ("Remote bundles"): a redirect to
//! another origin, a challenge pointing at plain-http metadata, an
//! authorization server with another issuer, metadata for another resource.
//! Then the MCP authorization spec's situations, each against the fixture
//! laid out that way: every discovery path (including a 2025-03-26 server
//! with no metadata), each token-endpoint authentication method (basic,
//! post, none, private_key_jwt), client ID metadata documents, the scopes
//! a client asks for, and step-up on `403 insufficient_scope`. Then the
//! 2026-07-28 revision's: `bundlevisor auth` discovering from and asking
//! for the first 401's challenge (a server without GET), the client in the
//! spec's order with `application_type`, stored credentials used with
//! their own authorization server only, and Enterprise-Managed
//! Authorization (an ID-JAG from the fixture's IdP).

mod common;
#[path = "common/remote.rs"]
mod fixture;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{events, nth, wait_for, Daemon, BIN};
use fixture::{Asm, Fixture, Layout, Lies, Prm};
use serde_json::{json, Value};

const CLIENT_SECRET: &str = "cs-CANARY-0b6e2d9a";

/// Writes `bundles/NAME.json`: a remote bundle for the fixture's server.
/// Its `read_file` tool reads workspace files through host-resources, so
/// the file declares it (and the daemon speaks MCP 2025-11-25 with it:
/// docs/gateway.md, "Bundles and revisions").
fn write_remote(d: &Daemon, fx: &Fixture, name: &str, extra: Value) -> PathBuf {
    let mut file = json!({
        "name": name,
        "url": fx.mcp_url,
        "description": "fixture",
        "_meta": {"ai.nimblebrain/host": {
            "host_version": "1.1",
            "host_capabilities": {"ai.nimblebrain/host-resources": {"required": false}},
        }},
    });
    for (k, v) in extra.as_object().unwrap() {
        file[k] = v.clone();
    }
    let path = d.root().join("bundles").join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    path
}

/// A confidential client whose secret is the sensitive user_config
/// `client_secret` (set with `configure`, as a value or a reference).
fn secret_from_user_config() -> Value {
    json!({
        "user_config": {"client_secret": {"type": "string", "title": "Client secret", "description": "Client secret", "sensitive": true, "required": true}},
        "auth": {"client_id": "bv-daemon", "client_secret": "${user_config.client_secret}"}
    })
}

/// Restarts the daemon and checks the remote bundle comes back by itself.
fn restart_daemon(d: &mut Daemon) {
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.launch();
    d.wait_state("default", "notes", "ready");
    assert_eq!(call_text(d, "notes", "whoami", json!({})), "remote fixture");
}

fn call_text(d: &Daemon, bundle: &str, tool: &str, args: Value) -> String {
    d.ok(&["call", bundle, tool, &args.to_string()])
        .trim()
        .to_string()
}

/// Runs `bundlevisor auth NAME` and plays the browser for it: what the
/// browser landed on, how `auth` ended, and what it printed after the URL.
fn run_auth(d: &Daemon, fx: &Fixture, name: &str) -> ((u16, String), std::process::Output, String) {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["auth", name, "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    while !url.starts_with("http") {
        url.clear();
        let n = stdout.read_line(&mut url).unwrap();
        assert!(
            n > 0,
            "auth ended before printing the authorization URL: {:?}",
            child.wait_with_output()
        );
    }
    let landing = fx.browse(url.trim());
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    (landing, out, rest)
}

/// Runs `bundlevisor auth NAME`, plays the browser, and checks it worked.
fn authorize(d: &Daemon, fx: &Fixture, name: &str) -> String {
    let ((status, page), out, rest) = run_auth(d, fx, name);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Authorization received"), "{page}");
    assert!(
        out.status.success(),
        "auth failed: {rest}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    rest
}

/// Fails if any of `secrets` appears in what the daemon wrote or shows.
fn assert_no_leak(d: &Daemon, secrets: &[String], extra: &[String]) {
    let mut texts = vec![d.log(), d.ok(&["status", "--json"]), d.ok(&["status"])];
    texts.extend_from_slice(extra);
    for text in &texts {
        for s in secrets {
            assert!(!text.contains(s.as_str()), "a secret leaked into:\n{text}");
        }
    }
    let mut stack = vec![d.state.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
                continue;
            }
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            for s in secrets {
                assert!(
                    !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
                    "{} holds a secret in the clear",
                    entry.path().display()
                );
            }
        }
    }
}

#[test]
fn client_credentials_rebuild_retries_the_call_and_host_resources_work_on_the_new_session() {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    let d = Daemon::start();
    let stream = events(&d, &["events", "--json"]);
    let path = write_remote(&d, &fx, "notes", secret_from_user_config());
    let out = d.cli(&["install", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    d.wait_state("default", "notes", "needs_config");

    // The secret arrives: no token yet → 401 → client credentials → rebuild → ready.
    let out = d.ok(&[
        "configure",
        "notes",
        &format!("client_secret={CLIENT_SECRET}"),
    ]);
    assert!(out.contains("reconfigured: ready"), "{out}");
    assert_eq!(fx.with(|s| s.client_credentials_grants), 1);
    let b = d.bundle("default", "notes").unwrap();
    assert_eq!(
        (b["tools"].as_u64(), b["pid"].is_null()),
        (Some(3), true),
        "{b}"
    );
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );

    // host-resources over the remote session.
    let id = d.put_file("hello.txt", b"hello from the workspace");
    assert_eq!(
        call_text(&d, "notes", "read_file", json!({ "id": id })),
        "hello from the workspace"
    );

    // Mid-session 401: the call is retried once on a rebuilt session, which
    // still answers host-resources.
    fx.revoke_access_tokens();
    assert_eq!(
        call_text(&d, "notes", "read_file", json!({ "id": id })),
        "hello from the workspace"
    );
    assert_eq!(fx.with(|s| s.client_credentials_grants), 2);
    // Two rebuilds with a new token: at configure, and after the revocation.
    let lines = stream.until(
        "the second reauthorized event",
        nth(2, |l| l.contains("\"kind\":\"reauthorized\"")),
    );
    assert!(
        lines.iter().any(|l| l.contains("answered 401")),
        "{lines:#?}"
    );

    let mut secrets = vec![CLIENT_SECRET.to_string()];
    secrets.extend(
        fx.with(|s| s.issued.clone())
            .into_iter()
            .filter(|t| t.starts_with("at-")),
    );
    assert_no_leak(&d, &secrets, &lines);
}

/// Issue 38: the client secret kept in a file the operator mounts (a
/// Kubernetes Secret, a Docker secret), given as a reference: read at each
/// start for the client-credentials grant, never stored.
#[test]
fn a_client_secret_given_by_reference_gets_the_token_and_is_never_stored() {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    let mut d = Daemon::unlaunched("");
    let secrets = d.root().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("client_secret"), format!("{CLIENT_SECRET}\n")).unwrap();
    let mut config = std::fs::read_to_string(&d.config).unwrap();
    config.push_str(&format!(
        "[secrets]\nallow = [{{ scheme = \"file\", prefix = \"{}\" }}]\n",
        secrets.display()
    ));
    std::fs::write(&d.config, config).unwrap();
    d.launch();
    let stream = events(&d, &["events", "--json"]);
    let path = write_remote(&d, &fx, "notes", secret_from_user_config());
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_config");
    let reference = format!(
        "client_secret=file:{}",
        secrets.join("client_secret").display()
    );
    let out = d.ok(&["configure", "notes", "--ref", &reference]);
    assert!(out.contains("reconfigured: ready"), "{out}");
    assert_eq!(fx.with(|s| s.client_credentials_grants), 1);
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    // Boot reload reads it again (no token is stored for a fresh daemon's
    // first call: the stored one is used, and a revoked one gets a new grant).
    restart_daemon(&mut d);
    d.wait_state("default", "notes", "ready");
    fx.revoke_access_tokens();
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    assert_eq!(fx.with(|s| s.client_credentials_grants), 2);
    let lines = stream.until("a reauthorized event", |l| {
        l.contains("\"kind\":\"reauthorized\"")
    });
    assert_no_leak(&d, &[CLIENT_SECRET.to_string()], &lines);
}

#[test]
fn authorization_code_flow_refresh_once_for_concurrent_401s_boot_reload_and_needs_auth() {
    let fx = Fixture::start(None);
    let mut d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", json!({}));

    // No token and no way to get one silently: needs_auth, with the command.
    let out = d.cli(&["install", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        msg.contains("needs authorization") && msg.contains("bundlevisor auth notes"),
        "{msg}"
    );
    d.wait_state("default", "notes", "needs_auth");

    // The operator completes the flow through the loopback redirect.
    let out = authorize(&d, &fx, "notes");
    assert!(out.contains("default/notes authorized: ready"), "{out}");
    assert_eq!(fx.with(|s| (s.registrations, s.code_grants)), (1, 1));
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );

    // Six calls hit 401 at once: one refresh, one rebuild, six answers.
    fx.revoke_access_tokens();
    let id = d.put_file("n.txt", b"note");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| s.spawn(|| call_text(&d, "notes", "read_file", json!({ "id": id }))))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), "note");
        }
    });
    assert_eq!(
        fx.with(|s| s.refresh_grants),
        1,
        "concurrent 401s must share one refresh"
    );

    // Boot reload uses the stored token: no prompt, no new grant.
    restart_daemon(&mut d);
    assert_eq!(fx.with(|s| (s.code_grants, s.refresh_grants)), (1, 1));

    // Refresh token expired too: needs_auth, not a restart loop.
    fx.expire_refresh_tokens();
    fx.revoke_access_tokens();
    let out = d.cli(&["call", "notes", "whoami", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(msg.contains("bundlevisor auth notes"), "{msg}");
    let b = d.wait_state("default", "notes", "needs_auth");
    assert_eq!(fx.with(|s| s.refused_refresh_grants), 1);
    let restarts = b["restarts"].as_u64().unwrap();
    // Nothing is retried on its own: a status taken after an unrelated
    // restart round trip still shows the same state and count.
    let probe = d.demo_bundle("probe");
    d.ok(&["install", probe.to_str().unwrap()]);
    d.ok(&["restart", "probe"]);
    let b = d.bundle("default", "notes").unwrap();
    assert_eq!(
        (b["state"].as_str(), b["restarts"].as_u64()),
        (Some("needs_auth"), Some(restarts))
    );
    assert_eq!(fx.with(|s| s.refused_refresh_grants), 1);

    // Authorizing again brings it back.
    authorize(&d, &fx, "notes");
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    wait_for(Duration::from_secs(5), "the bundle to be ready", || {
        (d.bundle("default", "notes").unwrap()["state"] == "ready").then_some(())
    });
    let secrets: Vec<String> = fx
        .with(|s| s.issued.clone())
        .into_iter()
        .filter(|t| !t.starts_with("client-"))
        .collect();
    assert_no_leak(&d, &secrets, &[]);
}

#[test]
fn a_remote_bundle_file_dropped_into_a_watched_folder_comes_up_and_goes() {
    let fx = Fixture::start(Some(("bv-watch", CLIENT_SECRET)));
    let d = Daemon::start_with("[[watch]]\ndir = \"bundles\"\nworkspace = \"default\"\n");
    // A literal secret in the file works too (docs/credentials.md advises
    // ${user_config.KEY} instead, so the file can be shared).
    write_remote(
        &d,
        &fx,
        "watched",
        json!({ "auth": {"client_id": "bv-watch", "client_secret": CLIENT_SECRET} }),
    );
    d.wait_state("default", "watched", "ready");
    assert_eq!(
        call_text(&d, "watched", "whoami", json!({})),
        "remote fixture"
    );
    std::fs::remove_file(d.root().join("bundles/watched.json")).unwrap();
    wait_for(
        Duration::from_secs(10),
        "the bundle to be uninstalled",
        || d.bundle("default", "watched").is_none().then_some(()),
    );
}

#[test]
fn a_token_known_to_be_expired_is_refreshed_before_use_without_a_401() {
    let fx = Fixture::start(None);
    // Tokens that expire within the daemon's 30 s margin.
    fx.state.lock().unwrap().expires_in = Some(5);
    let mut d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", json!({}));
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_auth");
    authorize(&d, &fx, "notes");
    let (refreshes, rejected) = fx.with(|s| (s.refresh_grants, s.dead_tokens));

    restart_daemon(&mut d);
    assert_eq!(
        fx.with(|s| (s.refresh_grants, s.dead_tokens)),
        (refreshes + 1, rejected),
        "the boot reload refreshes the expired token first instead of presenting it"
    );
}

/// Installs `path` (which must not come up) and returns its status once the
/// start has failed with a reason.
fn refused_start(d: &Daemon, path: &std::path::Path, name: &str) -> Value {
    let out = d.cli(&["install", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let b = wait_for(Duration::from_secs(20), "a failed start", || {
        d.bundle("default", name)
            .filter(|b| b["last_error"].is_string())
    });
    assert_ne!(b["state"], "ready", "{b}");
    b
}

fn client_credentials() -> Value {
    json!({ "auth": {"client_id": "bv-daemon", "client_secret": CLIENT_SECRET} })
}

#[test]
fn a_redirect_to_another_origin_is_refused_and_the_bundles_headers_never_go_there() {
    const API_KEY: &str = "key-CANARY-5f1c0e";
    let fx = Fixture::start(None);
    let d = Daemon::start();
    let path = write_remote(
        &d,
        &fx,
        "moved",
        json!({ "url": fx.moved_url, "headers": {"X-Api-Key": API_KEY} }),
    );
    let b = refused_start(&d, &path, "moved");
    let error = b["last_error"].as_str().unwrap();
    let target = format!("{}/mcp", fx.decoy_base);
    assert!(
        error.contains(&format!(
            "{} redirected to {target}, another origin",
            fx.moved_url
        )),
        "{error}"
    );
    assert!(!error.contains(API_KEY), "{error}");
    let decoy = fx.with(|s| s.decoy.clone());
    assert!(
        decoy.is_empty(),
        "the other origin was sent a request: {decoy:#?}"
    );
}

#[test]
fn a_challenge_pointing_at_plain_http_metadata_is_refused_without_a_request() {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    let metadata = "http://attacker.example/.well-known/oauth-protected-resource";
    fx.lie(Lies {
        challenge_metadata: Some(metadata.into()),
        ..Default::default()
    });
    // Every request to a non-loopback host goes through the decoy as a
    // proxy, so a fetch of the attacker's metadata would be seen there.
    let mut d = Daemon::unlaunched("");
    d.env.push(("http_proxy".into(), fx.decoy_base.clone()));
    d.env
        .push(("no_proxy".into(), "127.0.0.1,localhost".into()));
    d.launch();
    let path = write_remote(&d, &fx, "notes", client_credentials());
    let b = refused_start(&d, &path, "notes");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "refused the resource_metadata URL of the server's 401 challenge {metadata}: it must use https"
        )) && error.contains("nothing was sent there"),
        "{error}"
    );
    let decoy = fx.with(|s| s.decoy.clone());
    assert!(decoy.is_empty(), "the metadata was fetched: {decoy:#?}");
    assert_eq!(fx.with(|s| s.token_requests), 0);
    assert_no_leak(&d, &[CLIENT_SECRET.to_string()], &[]);
}

/// A client-credentials bundle against a fixture whose metadata tells
/// `lies`; its start must fail: the fixture, the daemon and the reason.
fn lying_start(lies: Lies) -> (Fixture, Daemon, String) {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lie(lies);
    let d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", client_credentials());
    let b = refused_start(&d, &path, "notes");
    let error = b["last_error"].as_str().unwrap().to_string();
    (fx, d, error)
}

#[test]
fn an_authorization_server_naming_another_issuer_never_gets_the_client_secret() {
    let (fx, d, error) = lying_start(Lies {
        issuer: Some("https://unrelated.example".into()),
        ..Default::default()
    });
    assert!(
        error.contains(&format!(
            "names issuer \"https://unrelated.example\", not {}/ (RFC 8414 §3.3)",
            fx.base
        )),
        "{error}"
    );
    // The interactive flow refuses it too, before registering a client.
    let out = d.cli(&["auth", "notes", "--timeout", "10s"]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("RFC 8414"), "{msg}");
    assert_eq!(fx.with(|s| (s.token_requests, s.registrations)), (0, 0));
    assert_no_leak(&d, &[CLIENT_SECRET.to_string()], &[]);
}

#[test]
fn protected_resource_metadata_for_another_resource_is_refused() {
    let other = "http://127.0.0.1:1/other-mcp".to_string();
    let (fx, _d, error) = lying_start(Lies {
        resource: Some(other.clone()),
        ..Default::default()
    });
    assert!(
        error.contains(&format!(
            "metadata resource mismatch: reference '{}', permitted '{other}' (RFC 9728 §3.3)",
            fx.mcp_url
        )),
        "{error}"
    );
    assert!(fx.with(|s| s.resource_metadata_requests) > 0);
    assert_eq!(fx.with(|s| s.token_requests), 0);
}

/// A GET over a plain connection, answered within 10 s: (status line and
/// headers, body).
fn raw_get(url: &str) -> (String, String) {
    use std::io::{Read, Write};
    let url = url::Url::parse(url).unwrap();
    let target = &url[url::Position::BeforePath..];
    let mut s = std::net::TcpStream::connect((
        url.host_str().unwrap(),
        url.port_or_known_default().unwrap(),
    ))
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    if let Err(e) = s.read_to_string(&mut answer) {
        panic!("no answer from {url} within 10 s ({e}): {answer:?}");
    }
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.to_string(), body.to_string())
}

/// What `begin_auth` started: the CLI and the rest of its stdout.
type Auth = (std::process::Child, BufReader<std::process::ChildStdout>);

/// Starts `bundlevisor auth NAME`; returns it and the authorization URL.
fn begin_auth(d: &Daemon, name: &str) -> (Auth, url::Url) {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["auth", name, "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("http") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "no URL printed");
    }
    ((child, stdout), url::Url::parse(line.trim()).unwrap())
}

fn query(url: &url::Url, key: &str) -> String {
    url.query_pairs()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no {key} in {url}"))
}

#[test]
fn the_auth_redirect_gets_through_idle_connections_and_a_refusal_is_shown_escaped() {
    let fx = Fixture::start(None);
    let d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", json!({}));
    assert_eq!(
        d.cli(&["install", path.to_str().unwrap()]).status.code(),
        Some(1)
    );
    d.wait_state("default", "notes", "needs_auth");

    // The authorization server refuses, with a hostile error_description.
    let ((child, _stdout), url) = begin_auth(&d, "notes");
    let mut callback = url::Url::parse(&query(&url, "redirect_uri")).unwrap();
    callback
        .query_pairs_mut()
        .append_pair("state", &query(&url, "state"))
        .append_pair("error", "access_denied")
        .append_pair("error_description", "no \x1b]0;pwned\x07\rway \u{202e}x");
    let (head, body) = raw_get(callback.as_str());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("Authorization was refused"), "{body}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(r"no \x1b]0;pwned\x07\rway \u{202e}x"),
        "{stderr}"
    );
    for raw in ['\x1b', '\r', '\x07', '\u{202e}'] {
        assert!(!stderr.contains(raw), "raw {raw:?} in {stderr:?}");
    }

    // Idle connections and one that trickles do not keep the redirect out.
    let ((child, mut stdout), url) = begin_auth(&d, "notes");
    let redirect = url::Url::parse(&query(&url, "redirect_uri")).unwrap();
    let port = redirect.port().unwrap();
    let idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let mut trickle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut trickle, b"GET /call").unwrap();
    let (head, _) = raw_get(url.as_str());
    assert!(head.starts_with("HTTP/1.1 302"), "{head}");
    let location = head
        .lines()
        .find_map(|l| l.strip_prefix("location: "))
        .unwrap_or_else(|| panic!("no location: {head}"));
    let (head, body) = raw_get(location);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("Authorization received"), "{body}");
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(
        out.status.success() && rest.contains("default/notes authorized: ready"),
        "{out:?} {rest}"
    );
    drop((idle, trickle));
}

/// Installs a client-credentials bundle `name` against `fx` and waits for
/// it to be ready; returns what the daemon's start cost the fixture.
fn comes_up_with_client_credentials(d: &Daemon, fx: &Fixture, name: &str, extra: Value) {
    let mut auth = json!({"client_id": "bv-daemon", "client_secret": CLIENT_SECRET});
    for (k, v) in extra.as_object().unwrap() {
        auth[k] = v.clone();
    }
    let path = write_remote(d, fx, name, json!({ "auth": auth }));
    let out = d.cli(&["install", path.to_str().unwrap()]);
    let b = wait_for(Duration::from_secs(20), "the bundle to come up", || {
        d.bundle("default", name)
            .filter(|b| b["state"] == "ready" || b["last_error"].is_string())
    });
    assert_eq!(b["state"], "ready", "{b}\n{out:?}\n{}", d.log());
    assert_eq!(call_text(d, name, "whoami", json!({})), "remote fixture");
}

#[test]
fn every_discovery_path_of_the_spec_finds_the_authorization_server() {
    let d = Daemon::start();
    let cases: Vec<(&str, Layout, &[&str])> = vec![
        (
            "challenge",
            Layout::default(),
            &[
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-authorization-server",
            ],
        ),
        (
            "prm-inserted",
            Layout {
                no_challenge_metadata: true,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-authorization-server",
            ],
        ),
        (
            "prm-root",
            Layout {
                prm: Prm::Root,
                no_challenge_metadata: true,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-authorization-server",
            ],
        ),
        (
            "oidc",
            Layout {
                asm: Asm::OidcInserted,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-authorization-server",
                "/.well-known/openid-configuration",
            ],
        ),
        (
            "path-oauth",
            Layout {
                issuer_path: "/tenant".into(),
                ..Default::default()
            },
            &["/.well-known/oauth-authorization-server/tenant"],
        ),
        (
            "path-oidc-inserted",
            Layout {
                issuer_path: "/tenant".into(),
                asm: Asm::OidcInserted,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-authorization-server/tenant",
                "/.well-known/openid-configuration/tenant",
            ],
        ),
        (
            "path-oidc-appended",
            Layout {
                issuer_path: "/tenant".into(),
                asm: Asm::OidcAppended,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-authorization-server/tenant",
                "/.well-known/openid-configuration/tenant",
                "/tenant/.well-known/openid-configuration",
            ],
        ),
        (
            "no-prm",
            Layout {
                prm: Prm::Absent,
                ..Default::default()
            },
            &[
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-authorization-server",
            ],
        ),
        (
            "legacy",
            Layout {
                prm: Prm::Absent,
                asm: Asm::Absent,
                ..Default::default()
            },
            // No metadata anywhere: the MCP URL's own (with its path, then
            // at the root), then the 2025-03-26 endpoints at the origin.
            &[
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-authorization-server/mcp",
                "/.well-known/openid-configuration/mcp",
                "/.well-known/oauth-authorization-server",
            ],
        ),
    ];
    for (name, layout, order) in cases {
        let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
        fx.lay_out(layout);
        comes_up_with_client_credentials(&d, &fx, name, json!({}));
        // The paths of the spec were tried in its order.
        let asked = fx.with(|s| s.well_known.clone());
        let mut at = 0;
        for path in order {
            let found = asked[at..].iter().position(|p| p == path);
            assert!(
                found.is_some(),
                "{name}: {path} not asked after {:?}: {asked:?}",
                &asked[..at]
            );
            at += found.unwrap() + 1;
        }
        // Every token request named the MCP server (RFC 8707).
        let forms = fx.with(|s| s.token_forms.clone());
        assert!(!forms.is_empty(), "{name}");
        assert!(
            forms
                .iter()
                .all(|f| f.resource.as_deref() == Some(fx.mcp_url.as_str())),
            "{name}: {forms:?}"
        );
    }
}

#[test]
fn the_token_endpoint_is_called_the_way_the_server_authenticates_clients() {
    let d = Daemon::start();
    for (name, methods, expected) in [
        ("basic", vec!["client_secret_basic"], "basic"),
        ("post", vec!["client_secret_post"], "post"),
        (
            "both",
            vec!["client_secret_basic", "client_secret_post"],
            "post",
        ),
    ] {
        let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
        fx.lay_out(Layout {
            auth_methods: Some(methods.iter().map(|m| m.to_string()).collect()),
            ..Default::default()
        });
        comes_up_with_client_credentials(&d, &fx, name, json!({}));
        let forms = fx.with(|s| s.token_forms.clone());
        assert_eq!(
            forms.iter().map(|f| f.auth).collect::<Vec<_>>(),
            vec![expected],
            "{name}"
        );
    }
    // A server that offers neither secret method: said, and no request.
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lay_out(Layout {
        auth_methods: Some(vec!["private_key_jwt".into()]),
        ..Default::default()
    });
    let path = write_remote(&d, &fx, "nomethod", client_credentials());
    let b = refused_start(&d, &path, "nomethod");
    let error = b["last_error"].as_str().unwrap();
    assert!(error.contains("client_secret_post"), "{error}");
    assert_eq!(fx.with(|s| s.token_requests), 0);
    assert_no_leak(&d, &[CLIENT_SECRET.to_string()], &[]);
}

/// An EC P-256 key pair made by openssl: (private PKCS#8 PEM, public PEM).
fn ec_key_pair(dir: &std::path::Path) -> (String, String) {
    let private = dir.join("client-key.pem");
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let raw = dir.join("raw.pem");
    run(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        raw.to_str().unwrap(),
    ]);
    run(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        raw.to_str().unwrap(),
        "-out",
        private.to_str().unwrap(),
    ]);
    let public = dir.join("client-pub.pem");
    run(&[
        "ec",
        "-in",
        raw.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    (
        std::fs::read_to_string(private).unwrap(),
        std::fs::read_to_string(public).unwrap(),
    )
}

#[test]
fn client_credentials_with_private_key_jwt_sign_with_the_operators_sealed_key() {
    let fx = Fixture::start(None);
    let d = Daemon::start();
    let (private, public) = ec_key_pair(&d.root());
    fx.state
        .lock()
        .unwrap()
        .jwt_keys
        .push(("bv-jwt".into(), public));
    fx.lay_out(Layout {
        auth_methods: Some(vec!["private_key_jwt".into()]),
        ..Default::default()
    });
    let out = install_jwt_bundle(&d, &fx, &private);
    assert!(out.contains("reconfigured: ready"), "{out}\n{}", d.log());
    let key_file = d.root().join("client-key.pem");
    let forms = fx.with(|s| s.token_forms.clone());
    assert_eq!(forms.len(), 1, "{forms:?}");
    assert_eq!(
        (forms[0].auth, forms[0].grant_type.as_str()),
        ("jwt", "client_credentials")
    );
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    // The key is sealed: never in the clear on disk, in logs or status.
    let body: String = private
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    std::fs::remove_file(&key_file).unwrap();
    std::fs::remove_file(d.root().join("raw.pem")).unwrap();
    assert_no_leak(&d, &[body[..40].to_string()], &[]);
}

#[test]
fn scopes_come_from_the_challenge_else_scopes_supported_else_none() {
    let d = Daemon::start();
    for (name, layout, expected) in [
        (
            "challenge",
            Layout {
                challenge_scope: Some("notes:read".into()),
                scopes_supported: Some(vec!["notes:read".into(), "notes:write".into()]),
                ..Default::default()
            },
            Some("notes:read"),
        ),
        (
            "supported",
            Layout {
                scopes_supported: Some(vec!["notes:read".into(), "notes:write".into()]),
                ..Default::default()
            },
            Some("notes:read notes:write"),
        ),
        ("none", Layout::default(), None),
    ] {
        let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
        fx.lay_out(layout);
        comes_up_with_client_credentials(&d, &fx, name, json!({}));
        let forms = fx.with(|s| s.token_forms.clone());
        assert_eq!(forms[0].scope.as_deref(), expected, "{name}");
    }
    // The bundle file's scopes win over what the server suggests.
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lay_out(Layout {
        challenge_scope: Some("notes:read".into()),
        ..Default::default()
    });
    comes_up_with_client_credentials(&d, &fx, "configured", json!({"scopes": ["notes:admin"]}));
    assert_eq!(
        fx.with(|s| s.token_forms[0].scope.clone()).as_deref(),
        Some("notes:admin")
    );
}

#[test]
fn a_client_id_metadata_document_is_the_client_where_the_server_supports_it() {
    let d = Daemon::start();
    let document = "https://bundlevisor.example/oauth/client.json";
    for (name, cimd) in [("cimd", true), ("dcr", false)] {
        let fx = Fixture::start(None);
        fx.lay_out(Layout {
            cimd,
            ..Default::default()
        });
        let path = write_remote(
            &d,
            &fx,
            name,
            json!({"auth": {"client_metadata_url": document}}),
        );
        let _ = d.cli(&["install", path.to_str().unwrap()]);
        d.wait_state("default", name, "needs_auth");
        authorize(&d, &fx, name);
        d.wait_state("default", name, "ready");
        let (clients, registrations, forms) = fx.with(|s| {
            (
                s.authorize_clients.clone(),
                s.registrations,
                s.token_forms.clone(),
            )
        });
        if cimd {
            assert_eq!(clients, vec![document.to_string()]);
            assert_eq!(registrations, 0);
        } else {
            assert_eq!(registrations, 1);
            assert!(clients[0].starts_with("client-"), "{clients:?}");
        }
        // A public client: no secret at the token endpoint; PKCE and the
        // resource were checked by the fixture.
        assert_eq!(
            forms
                .iter()
                .map(|f| (f.auth, f.grant_type.as_str()))
                .collect::<Vec<_>>(),
            vec![("none", "authorization_code")],
            "{name}"
        );
    }
}

#[test]
fn a_token_lacking_a_scope_is_stepped_up_silently_for_the_union_of_scopes() {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lay_out(Layout {
        required_scope: Some("notes:write".into()),
        ..Default::default()
    });
    let d = Daemon::start();
    comes_up_with_client_credentials(&d, &fx, "notes", json!({"scopes": ["notes:read"]}));
    let forms = fx.with(|s| s.token_forms.clone());
    assert_eq!(
        forms.iter().map(|f| f.scope.clone()).collect::<Vec<_>>(),
        vec![
            Some("notes:read".to_string()),
            Some("notes:read notes:write".to_string())
        ],
        "the second grant asks for the union"
    );
    assert!(fx.with(|s| s.insufficient) >= 1);

    // Mid-session: the server starts wanting more; the call that got the
    // 403 is answered on a session with a token for the union of all that
    // was asked for (the scope of the first step-up too).
    fx.lay_out(Layout {
        required_scope: Some("notes:admin".into()),
        ..Default::default()
    });
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    let last = fx.with(|s| s.token_forms.last().unwrap().scope.clone());
    assert_eq!(last.as_deref(), Some("notes:read notes:write notes:admin"));
    d.wait_state("default", "notes", "ready");
}

#[test]
fn a_scope_no_silent_grant_can_get_is_named_and_asked_for_by_the_next_authorization() {
    let fx = Fixture::start(None);
    fx.lay_out(Layout {
        required_scope: Some("notes:write".into()),
        ..Default::default()
    });
    let d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", json!({}));
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_auth");
    // The first authorization asks for no scope: its token lacks one, and
    // a refresh cannot widen a grant (the fixture refuses, RFC 6749 §6).
    let (_, out, _) = run_auth(&d, &fx, "notes");
    assert!(!out.status.success(), "{out:?}");
    let b = d.wait_state("default", "notes", "needs_auth");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains("it needs the scope \"notes:write\"")
            && error.contains("bundlevisor auth notes"),
        "{error}"
    );
    // The next one asks for it, and the bundle comes up.
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    let asked = fx.with(|s| {
        s.token_forms
            .iter()
            .map(|f| (f.grant_type.clone(), f.scope.clone()))
            .collect::<Vec<_>>()
    });
    assert!(
        asked.contains(&("refresh_token".to_string(), Some("notes:write".to_string()))),
        "the silent step-up was tried first: {asked:?}"
    );
    // Never a restart loop: two authorizations, two code grants.
    assert_eq!(fx.with(|s| s.code_grants), 2);
}

/// Installs a remote bundle with no auth settings, which the fixture's
/// first 401 puts in `needs_auth`.
fn install_needing_auth(d: &Daemon, fx: &Fixture, name: &str) {
    let path = write_remote(d, fx, name, json!({}));
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", name, "needs_auth");
}

#[test]
fn bundlevisor_auth_discovers_through_the_first_challenges_resource_metadata_alone() {
    // The protected-resource metadata is only where the challenge says
    // (no well-known URL leads to it), and the authorization server's
    // endpoints live under its issuer's path: guessing finds nothing, and
    // the origin's /register is a 404. Only the first 401 (to a POST) has
    // the challenge: the server has no GET to probe.
    let fx = Fixture::start(None);
    fx.lay_out(Layout {
        prm: Prm::ChallengeOnly,
        issuer_path: "/tenant".into(),
        no_get: true,
        ..Default::default()
    });
    let d = Daemon::start();
    install_needing_auth(&d, &fx, "notes");
    let metadata_reads = fx.with(|s| s.resource_metadata_requests);
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    assert_eq!(fx.with(|s| (s.registrations, s.code_grants)), (1, 1));
    assert!(
        fx.with(|s| s.resource_metadata_requests) > metadata_reads,
        "auth read the metadata the challenge names"
    );
}

#[test]
fn bundlevisor_auth_asks_for_the_scope_of_the_first_challenge() {
    // The challenge's scope, not the metadata's scopes_supported: a token
    // for notes:read alone would get a 403.
    let fx = Fixture::start(None);
    fx.lay_out(Layout {
        challenge_scope: Some("notes:write".into()),
        scopes_supported: Some(vec!["notes:read".into()]),
        required_scope: Some("notes:write".into()),
        no_get: true,
        ..Default::default()
    });
    let d = Daemon::start();
    install_needing_auth(&d, &fx, "notes");
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    assert_eq!(
        fx.with(|s| s.authorize_scopes.clone()),
        vec![Some("notes:write".to_string())]
    );
    // One authorization was enough: no 403, no second code grant.
    assert_eq!(fx.with(|s| (s.insufficient, s.code_grants)), (0, 1));
}

#[test]
fn the_client_is_the_pre_registered_one_then_a_metadata_document_then_a_registration() {
    let d = Daemon::start();
    let document = "https://bundlevisor.example/oauth/client.json";
    // Pre-registered beats a metadata document the server would take.
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lay_out(Layout {
        cimd: true,
        no_client_credentials: true,
        ..Default::default()
    });
    let path = write_remote(
        &d,
        &fx,
        "pre",
        json!({"auth": {"client_id": "bv-daemon", "client_secret": CLIENT_SECRET, "client_metadata_url": document}}),
    );
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "pre", "needs_auth");
    authorize(&d, &fx, "pre");
    d.wait_state("default", "pre", "ready");
    assert_eq!(
        fx.with(|s| (s.authorize_clients.clone(), s.registrations)),
        (vec!["bv-daemon".to_string()], 0)
    );

    // A registration says what kind of application registers: a native
    // one, whose redirect goes to a loopback address.
    let fx = Fixture::start(None);
    install_needing_auth(&d, &fx, "dcr");
    authorize(&d, &fx, "dcr");
    let bodies = fx.with(|s| s.registration_bodies.clone());
    assert_eq!(bodies.len(), 1);
    assert_eq!(bodies[0]["application_type"], "native", "{bodies:?}");

    // Neither a registration endpoint nor a way to name a client: the
    // operator is told what to set, and nothing is sent.
    for (name, cimd, needed) in [
        ("tell-cimd", true, "set auth.client_metadata_url"),
        ("tell-id", false, "set auth.client_id"),
    ] {
        let fx = Fixture::start(None);
        fx.lay_out(Layout {
            cimd,
            no_registration: true,
            ..Default::default()
        });
        install_needing_auth(&d, &fx, name);
        let out = d.cli(&["auth", name, "--timeout", "10s"]);
        assert!(!out.status.success());
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(
            msg.contains("offers no dynamic client registration")
                || msg.contains("offers neither dynamic client registration"),
            "{msg}"
        );
        assert!(msg.contains(needed), "{name}: {msg}");
        assert_eq!(
            fx.with(|s| (s.registrations, s.authorize_clients.len())),
            (0, 0),
            "{name}"
        );
    }
}

#[test]
fn a_client_registration_is_never_used_with_another_authorization_server() {
    let fx = Fixture::start(None);
    let d = Daemon::start();
    install_needing_auth(&d, &fx, "notes");
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    let first = fx.with(|s| s.authorize_clients[0].clone());

    // The MCP server moves to another authorization server (issuer
    // BASE/tenant): the old one's refresh token is not sent to it, and
    // its registration is not used there.
    fx.lay_out(Layout {
        issuer_path: "/tenant".into(),
        ..Default::default()
    });
    fx.revoke_access_tokens();
    let token_requests = fx.with(|s| s.token_requests);
    let out = d.cli(&["call", "notes", "whoami", "{}"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let b = d.wait_state("default", "notes", "needs_auth");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains("the stored tokens are from the authorization server")
            && error.contains("bundlevisor auth notes"),
        "{error}"
    );
    assert_eq!(fx.with(|s| s.token_requests), token_requests);

    // `auth` registers again, with the new server, and the bundle comes up.
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    let (registrations, clients) = fx.with(|s| (s.registrations, s.authorize_clients.clone()));
    assert_eq!(registrations, 2);
    assert_ne!(clients[1], first, "{clients:?}");
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
}

const IDP_SECRET: &str = "idp-CANARY-5f1c3a7e";

/// An authorization server that takes ID-JAGs, an IdP that issues them to
/// client `bv-idp` (for client `bv-daemon` at the authorization server),
/// and a bundle `notes` of that client whose user's ID token is in the
/// file `id_token` (which the IdP takes, for user `alice`). Returns the
/// file and the ID token.
fn enterprise_start() -> (Fixture, Daemon, PathBuf, String) {
    let fx = Fixture::start(Some(("bv-daemon", CLIENT_SECRET)));
    fx.lay_out(Layout {
        id_jag: true,
        ..Default::default()
    });
    let id_token = "idt-CANARY-alice-01".to_string();
    {
        let mut s = fx.state.lock().unwrap();
        s.idp_clients
            .insert("bv-idp".into(), (IDP_SECRET.into(), "bv-daemon".into()));
        s.id_tokens.insert(id_token.clone(), "alice".into());
    }
    let d = Daemon::start();
    let file = d.root().join("id_token");
    std::fs::write(&file, format!("{id_token}\n")).unwrap();
    let sensitive = |title: &str| json!({"type": "string", "title": title, "description": title, "sensitive": true, "required": true});
    let path = write_remote(
        &d,
        &fx,
        "notes",
        json!({
            "user_config": {
                "client_secret": sensitive("Client secret"),
                "idp_secret": sensitive("IdP client secret"),
                "id_token_file": {"type": "file", "title": "ID token file", "description": "ID token file", "required": true}
            },
            "auth": {
                "client_id": "bv-daemon",
                "client_secret": "${user_config.client_secret}",
                "scopes": ["notes:read"],
                "enterprise": {
                    "token_endpoint": format!("{}/idp/token", fx.base),
                    "client_id": "bv-idp",
                    "client_secret": "${user_config.idp_secret}",
                    "id_token_file": "${user_config.id_token_file}"
                }
            }
        }),
    );
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_config");
    (fx, d, file, id_token)
}

/// Sets the bundle's three values; what `configure` printed.
fn configure_enterprise(d: &Daemon, file: &std::path::Path) -> String {
    let out = d.cli(&[
        "configure",
        "notes",
        &format!("client_secret={CLIENT_SECRET}"),
        &format!("idp_secret={IDP_SECRET}"),
        &format!("id_token_file={}", file.display()),
    ]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn enterprise_managed_authorization_exchanges_the_users_id_token_for_an_id_jag_and_a_token() {
    let (fx, d, file, first_token) = enterprise_start();
    let out = configure_enterprise(&d, &file);
    assert!(out.contains("reconfigured: ready"), "{out}\n{}", d.log());
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    // The client declares the extension it uses.
    let declared = call_text(&d, "notes", "extensions", json!({}));
    assert!(
        declared.contains("io.modelcontextprotocol/enterprise-managed-authorization")
            && declared.contains("ai.nimblebrain/host-resources"),
        "{declared}"
    );
    // The exchange named the authorization server, the MCP server and the
    // scope; the ID-JAG became a token; no client-credentials token stood
    // in for the user's.
    let exchanges = fx.with(|s| s.exchanges.clone());
    assert_eq!(exchanges.len(), 1);
    assert_eq!(exchanges[0].audience, fx.base);
    assert_eq!(exchanges[0].resource.as_deref(), Some(fx.mcp_url.as_str()));
    assert_eq!(exchanges[0].scope.as_deref(), Some("notes:read"));
    let forms = fx.with(|s| s.token_forms.clone());
    assert_eq!(
        forms
            .iter()
            .map(|f| (f.auth, f.grant_type.as_str()))
            .collect::<Vec<_>>(),
        vec![("post", "urn:ietf:params:oauth:grant-type:jwt-bearer")]
    );
    assert_eq!(fx.with(|s| s.client_credentials_grants), 0);

    // The token expires; the user's ID token was renewed in the file
    // meanwhile (the old one is no longer taken): the file is read again,
    // and a new ID-JAG is asked for (an ID-JAG is never replayed).
    let second_token = "idt-CANARY-alice-02".to_string();
    {
        let mut s = fx.state.lock().unwrap();
        s.id_tokens.clear();
        s.id_tokens.insert(second_token.clone(), "alice".into());
    }
    std::fs::write(&file, &second_token).unwrap();
    fx.revoke_access_tokens();
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    assert_eq!(
        fx.with(|s| (
            s.exchanges.len(),
            s.jwt_bearer_grants,
            s.refused_assertions.clone()
        )),
        (2, 2, Vec::new())
    );

    let mut secrets = vec![
        CLIENT_SECRET.to_string(),
        IDP_SECRET.to_string(),
        first_token,
        second_token,
    ];
    secrets.extend(
        fx.with(|s| s.issued.clone())
            .into_iter()
            .filter(|t| !t.starts_with("jti-")),
    );
    std::fs::remove_file(&file).unwrap();
    assert_no_leak(&d, &secrets, &[out]);
}

#[test]
fn an_id_jag_for_another_audience_is_refused_and_the_bundle_waits_for_the_operator() {
    let (fx, d, file, id_token) = enterprise_start();
    fx.lie(Lies {
        id_jag_audience: Some("https://elsewhere.example".into()),
        ..Default::default()
    });
    let out = configure_enterprise(&d, &file);
    assert!(!out.contains("reconfigured: ready"), "{out}");
    let b = d.wait_state("default", "notes", "needs_auth");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains("enterprise-managed authorization")
            && error.contains("invalid_grant")
            && error.contains("audience is not this authorization server"),
        "{error}"
    );
    assert_eq!(
        fx.with(|s| (
            s.jwt_bearer_grants,
            s.refused_assertions.len(),
            s.access.len()
        )),
        (0, 1, 0)
    );
    let mut secrets = vec![CLIENT_SECRET.to_string(), IDP_SECRET.to_string(), id_token];
    secrets.extend(fx.with(|s| {
        s.exchanges
            .iter()
            .map(|e| e.id_jag.clone())
            .collect::<Vec<_>>()
    }));
    std::fs::remove_file(&file).unwrap();
    assert_no_leak(&d, &secrets, &[out]);
}

#[test]
fn enterprise_authorization_asks_the_idp_nothing_when_the_server_takes_no_id_jag() {
    let (fx, d, file, _) = enterprise_start();
    fx.lay_out(Layout::default());
    let _ = configure_enterprise(&d, &file);
    // A setting the server cannot serve: failed, not retried.
    let b = d.wait_state("default", "notes", "failed");
    let error = b["last_error"].as_str().unwrap();
    assert!(
        error.contains("does not list urn:ietf:params:oauth:grant-profile:id-jag in its authorization_grant_profiles_supported")
            && error.contains("remove auth.enterprise"),
        "{error}"
    );
    assert_eq!(fx.with(|s| (s.idp_requests, s.token_requests)), (0, 0));
}

#[test]
fn a_gracefully_closed_stream_is_resumed_after_its_retry_with_last_event_id() {
    let fx = Fixture::start(None);
    let d = Daemon::start();
    let path = d.root().join("bundles").join("resumable.json");
    let file = json!({"name": "resumable", "url": format!("{}/sse-mcp", fx.base)});
    std::fs::write(&path, file.to_string()).unwrap();
    d.ok(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "resumable", "ready");
    assert_eq!(
        call_text(&d, "resumable", "slow", json!({})),
        "resumed answer"
    );
    let resumed = fx.with(|s| s.resumed.clone());
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    let (last_event_id, after) = &resumed[0];
    assert_eq!(last_event_id, "ev-1");
    // The server's `retry` (2.5 s), not the client's own backoff (1 s).
    assert!(
        *after >= Duration::from_millis(fixture::SSE_RETRY_MS - 100),
        "resumed after {after:?}"
    );
}

#[test]
fn private_key_jwt_authenticates_the_code_exchange_and_the_refresh_too() {
    let fx = Fixture::start(None);
    let d = Daemon::start();
    let (private, public) = ec_key_pair(&d.root());
    {
        let mut state = fx.state.lock().unwrap();
        state.jwt_keys.push(("bv-jwt".into(), public));
        state.clients.insert("bv-jwt".into(), None);
    }
    fx.lay_out(Layout {
        auth_methods: Some(vec!["private_key_jwt".into()]),
        no_client_credentials: true,
        ..Default::default()
    });
    install_jwt_bundle(&d, &fx, &private);
    // Client credentials are refused: only the browser can help.
    d.wait_state("default", "notes", "needs_auth");
    authorize(&d, &fx, "notes");
    d.wait_state("default", "notes", "ready");
    // The access token stops working: the refresh signs again.
    fx.revoke_access_tokens();
    assert_eq!(
        call_text(&d, "notes", "whoami", json!({})),
        "remote fixture"
    );
    let forms = fx.with(|s| s.token_forms.clone());
    assert_eq!(
        forms
            .iter()
            .map(|f| (f.auth, f.grant_type.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("jwt", "client_credentials"),
            ("jwt", "authorization_code"),
            ("jwt", "refresh_token"),
        ]
    );
    assert!(forms
        .iter()
        .all(|f| f.resource.as_deref() == Some(fx.mcp_url.as_str())));
}

/// `bundlevisor configure NAME KEY=-` with `value` on stdin (how a
/// multi-line secret such as a PEM key goes in); what it printed.
fn configure_from_stdin(d: &Daemon, name: &str, key: &str, value: &str) -> String {
    let mut configure = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["configure", name, &format!("{key}=-")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut configure.stdin.take().unwrap(), value.as_bytes()).unwrap();
    let out = configure.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_authorization_server_that_does_not_advertise_pkce_gets_no_authorization_request() {
    let fx = Fixture::start(None);
    fx.lay_out(Layout {
        no_pkce_advertised: true,
        ..Default::default()
    });
    let d = Daemon::start();
    let path = write_remote(&d, &fx, "notes", json!({}));
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_auth");
    let out = d.cli(&["auth", "notes", "--timeout", "10s"]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("code_challenge_methods_supported"), "{msg}");
    assert_eq!(
        fx.with(|s| (s.registrations, s.authorize_clients.len())),
        (0, 0)
    );
}

/// Installs `notes`, a bundle of client `bv-jwt` that signs with the
/// private key `private` (a sensitive user_config value given on stdin);
/// what `configure` printed.
fn install_jwt_bundle(d: &Daemon, fx: &Fixture, private: &str) -> String {
    let path = write_remote(
        d,
        fx,
        "notes",
        json!({
            "user_config": {"key": {"type": "string", "title": "Client key", "description": "Client key", "sensitive": true, "required": true}},
            "auth": {"client_id": "bv-jwt", "private_key": "${user_config.key}", "signing_alg": "ES256"}
        }),
    );
    let _ = d.cli(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "needs_config");
    configure_from_stdin(d, "notes", "key", private)
}
