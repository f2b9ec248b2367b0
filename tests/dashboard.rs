//! Issue 36, the dashboard in a real browser: Debian's chromium, headless,
//! driven through chromedriver's WebDriver (fantoccini). Signing in with
//! the link `bundlevisor dashboard` prints, an agent's token refused (in
//! the sign-in form and as a bearer), the bundle list following a crash
//! and the restart without a reload, a tool called from its form, the log
//! followed live, an archive made by the real `mcpb pack` installed by
//! upload and upgraded by upload, the workspace's files added, downloaded
//! and removed, a token made (its text shown once), and a change without
//! the form's CSRF token refused. Screenshots of the pages go to
//! `target/dashboard/` (the ones in docs/ were taken from it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{demo_bundle_at, free_port, mcpb_pack, write_bundle, Daemon, DEMO_MANIFEST};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// chromedriver on a port of its own, stopped when dropped.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> Driver {
    let bin = Path::new("/usr/bin/chromedriver");
    assert!(
        bin.exists(),
        "chromedriver is not installed; run `make sysdeps` (make test does: chromium, chromium-driver)"
    );
    let port = free_port();
    let child = Command::new(bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for(Duration::from_secs(20), "chromedriver to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Driver(child, port)
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.1))
        .await
        .expect("a chromium session")
}

/// The text of `css` once `done` holds for it (polled, bounded).
async fn text_when(client: &Client, css: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if done(&text) {
                    return text;
                }
                last = text;
            }
        }
        if std::time::Instant::now() >= deadline {
            let page = client.source().await.unwrap_or_default();
            panic!("{what}: {css} still says {last:?}; the page:\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` finds.
async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

/// Types `text` into the element `css` finds (a file input: its path).
async fn type_into(client: &Client, css: &str, text: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .send_keys(text)
        .await
        .unwrap();
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// `GET /ui/`, with `cookie` if given, redirects not followed.
async fn bundles_page(base: &str, cookie: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut request = client.get(format!("{base}/ui/"));
    if let Some(cookie) = cookie {
        request = request.header("Cookie", cookie);
    }
    request.send().await.unwrap()
}

/// A multipart `body` (boundary `B`) posted to the files page's upload
/// with the session `cookie`, as a forger or a flooder would send it.
async fn upload(base: &str, cookie: &str, body: String) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/ui/files/put"))
        .header("Cookie", format!("bv_session={cookie}"))
        .header("Content-Type", "multipart/form-data; boundary=B")
        .body(body)
        .send()
        .await
        .unwrap()
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_runs_the_daemon_from_a_browser() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\ndashboard = true\n"
    ));
    blocking(|| d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]));
    let base = format!("http://127.0.0.1:{port}");
    let agent_token = blocking(|| {
        d.ok(&["token", "create", "--name", "an-agent"])
            .trim()
            .to_string()
    });

    // An agent's token is no way in: as a bearer, or in the sign-in form.
    let raw = reqwest::Client::new()
        .get(format!("{base}/ui/"))
        .bearer_auth(&agent_token)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 403);
    assert!(raw
        .text()
        .await
        .unwrap()
        .contains("agent&#39;s access token"));
    let unsigned = bundles_page(&base, None).await;
    assert_eq!(unsigned.status(), 303, "no session: to the sign-in page");
    // No inline script runs: the pages' one script is /ui/app.js.
    let policy = unsigned.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(policy.contains("script-src 'self';"), "{policy}");
    assert!(
        !policy.contains("script-src 'self' 'unsafe-inline'"),
        "{policy}"
    );

    let driver = blocking(chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    client.goto(&format!("{base}/ui/login")).await.unwrap();
    let field = client.find(Locator::Css("input[name=code]")).await.unwrap();
    field.send_keys(&agent_token).await.unwrap();
    click(&client, "form button").await;
    let why = text_when(&client, "#why", "the agent token's refusal", |t| {
        !t.is_empty()
    })
    .await;
    assert!(why.contains("agent's access token"), "{why}");
    assert!(why.contains("bundlevisor dashboard"), "{why}");

    // Signed in with the one-time link.
    let link: Value = blocking(|| serde_json::from_str(&d.ok(&["dashboard", "--json"])).unwrap());
    let url = link["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("{base}/ui/login?code=")), "{url}");
    client.goto(url).await.unwrap();
    // Opening the link fills the code in; the page's own button signs in.
    click(&client, "#signin").await;
    let row = "#b-default-demo [data-k=state]";
    text_when(&client, row, "the demo bundle listed ready", |t| {
        t == "ready"
    })
    .await;
    // The link works once.
    let code = link["code"].as_str().unwrap();
    let again = reqwest::Client::new()
        .post(format!("{base}/ui/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("code={code}"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 403);
    assert!(again
        .text()
        .await
        .unwrap()
        .contains("unknown, used or expired"));
    // Another site cannot sign a browser in (as whoever it has a code of).
    let planted = reqwest::Client::new()
        .post(format!("{base}/ui/login"))
        .header("Origin", "http://evil.example")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("code=anything")
        .send()
        .await
        .unwrap();
    assert_eq!(planted.status(), 403);

    // The list follows a crash and the restart, without a reload.
    let marker = "not reloaded";
    client
        .execute("window.bvMarker = arguments[0];", vec![json!(marker)])
        .await
        .unwrap();
    let restarts = "#b-default-demo [data-k=restarts]";
    assert_eq!(
        text_when(&client, restarts, "restarts", |_| true).await,
        "0"
    );
    let _ = blocking(|| d.cli(&["call", "demo", "crash", "{}"]));
    text_when(&client, restarts, "the restart counted", |t| t == "1").await;
    text_when(&client, row, "ready again", |t| t == "ready").await;
    let kept = client
        .execute("return window.bvMarker;", vec![])
        .await
        .unwrap();
    assert_eq!(kept, json!(marker), "the page was reloaded");

    // A bundle's page: a tool called from its form, the log followed.
    client
        .goto(&format!("{base}/ui/bundle/default/demo"))
        .await
        .unwrap();
    let args = client
        .find(Locator::Css("form:has(#call-echo) textarea"))
        .await
        .unwrap();
    args.send_keys(r#"{"text": "hello from chromium"}"#)
        .await
        .unwrap();
    click(&client, "#call-echo").await;
    let answer = text_when(&client, "#answer", "the echo's answer", |t| !t.is_empty()).await;
    assert_eq!(answer, "hello from chromium");
    // Its events: the crash before the page was opened, and a restart made
    // while it is open, live.
    let events = text_when(&client, "#events", "the crash among the events", |t| {
        t.contains("exited")
    })
    .await;
    assert!(events.contains("crashing on request"), "{events}");
    let count = "return document.querySelectorAll('#events tr').length;";
    let before = client
        .execute(count, vec![])
        .await
        .unwrap()
        .as_u64()
        .unwrap();
    blocking(|| d.ok(&["restart", "demo"]));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = client
            .execute(count, vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap();
        if now >= before + 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no live events: {now} rows, {before} before"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let newest = text_when(
        &client,
        "#events tr:nth-child(2)",
        "the newest event",
        |t| !t.is_empty(),
    )
    .await;
    assert!(newest.contains("ready"), "{newest}");
    let _ = blocking(|| d.ok(&["call", "demo", "sleep", r#"{"ms": 7}"#]));
    text_when(&client, "#log", "the log line, live", |t| {
        t.contains("demo: sleeping 7 ms")
    })
    .await;
    screenshot(&client, "bundle").await;

    // A change without the form's token is refused, even with the session.
    let cookie = client.get_named_cookie("bv_session").await.unwrap();
    let forged = reqwest::Client::new()
        .post(format!("{base}/ui/bundle/default/demo/uninstall"))
        .header("Cookie", format!("bv_session={}", cookie.value()))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("csrf=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert!(
        blocking(|| d.bundle("default", "demo")).is_some(),
        "still installed"
    );

    // An archive packed by the real mcpb CLI, installed by upload.
    let dir = tempfile::tempdir().unwrap();
    let folder = demo_bundle_at(dir.path(), "uploaded");
    let archive = dir.path().join("uploaded.mcpb");
    blocking(|| mcpb_pack(&folder, &archive));
    client.goto(&format!("{base}/ui/")).await.unwrap();
    let file = client.find(Locator::Css("input[type=file]")).await.unwrap();
    file.send_keys(archive.to_str().unwrap()).await.unwrap();
    click(&client, "#install").await;
    text_when(
        &client,
        "#facts [data-k=state]",
        "the upload's bundle ready",
        |t| t == "ready",
    )
    .await;
    let uploaded = blocking(|| d.wait_state("default", "uploaded", "ready"));
    assert_eq!(uploaded["archive"]["signature"], "unsigned", "{uploaded}");
    let uploads = d.state.join("uploads");
    assert_eq!(
        std::fs::read_dir(&uploads).unwrap().count(),
        0,
        "the upload is not kept"
    );

    // Upgraded by upload from its page: version 2 runs in its place. An
    // archive of another bundle is refused, and the running one stays.
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("uploaded");
    manifest["version"] = json!("2.0.0");
    let v2_folder = write_bundle(&dir.path().join("v2"), "uploaded", &manifest);
    let v2 = dir.path().join("uploaded-2.mcpb");
    blocking(|| mcpb_pack(&v2_folder, &v2));
    let upgrade_with = async |archive: &Path, page: &str| {
        client
            .goto(&format!("{base}/ui/bundle/default/{page}"))
            .await
            .unwrap();
        let file = client
            .find(Locator::Css("form:has(#upgrade) input[type=file]"))
            .await
            .unwrap();
        file.send_keys(archive.to_str().unwrap()).await.unwrap();
        click(&client, "#upgrade").await;
    };
    upgrade_with(&archive, "demo").await;
    let why = text_when(&client, "p", "the refusal", |t| t.contains("not")).await;
    assert!(
        why.contains("holds bundle \"uploaded\", not \"demo\""),
        "{why}"
    );
    upgrade_with(&v2, "uploaded").await;
    text_when(
        &client,
        "#facts [data-k=version]",
        "version 2 running",
        |t| t == "2.0.0",
    )
    .await;
    let upgraded = blocking(|| d.wait_state("default", "uploaded", "ready"));
    assert_eq!(upgraded["version"], "2.0.0", "{upgraded}");
    assert_eq!(
        blocking(|| d.bundle("default", "demo")).unwrap()["version"],
        "0.1.0"
    );
    assert_eq!(
        std::fs::read_dir(&uploads).unwrap().count(),
        0,
        "an upload is kept"
    );

    // A sensitive setting, entered write-only: the bundle gets it, no
    // page shows it.
    let secret = "sk-CANARY-dashboard-5e1";
    blocking(|| {
        let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
        m["name"] = json!("keyed");
        m["user_config"] = json!({"api_key": {"type": "string", "title": "API key",
            "description": "API key", "required": true, "sensitive": true}});
        m["server"]["mcp_config"]["env"] = json!({ "DEMO_API_KEY": "${user_config.api_key}" });
        let folder = write_bundle(&d.root().join("bundles"), "keyed", &m);
        d.ok(&["install", "--no-wait", folder.to_str().unwrap()]);
        d.wait_state("default", "keyed", "needs_config");
    });
    client
        .goto(&format!("{base}/ui/bundle/default/keyed"))
        .await
        .unwrap();
    let field = client
        .find(Locator::Css("input[name='cfg.api_key']"))
        .await
        .unwrap();
    assert_eq!(
        field.attr("type").await.unwrap().as_deref(),
        Some("password")
    );
    field.send_keys(secret).await.unwrap();
    click(&client, "#configure").await;
    text_when(
        &client,
        "#facts [data-k=state]",
        "the configured bundle ready",
        |t| t == "ready",
    )
    .await;
    let args = client
        .find(Locator::Css("form:has(#call-env) textarea"))
        .await
        .unwrap();
    args.send_keys(r#"{"name": "DEMO_API_KEY"}"#).await.unwrap();
    click(&client, "#call-env").await;
    assert_eq!(
        text_when(&client, "#answer", "the key in the bundle", |t| !t
            .is_empty())
        .await,
        secret
    );
    client
        .goto(&format!("{base}/ui/bundle/default/keyed"))
        .await
        .unwrap();
    assert!(
        !client.source().await.unwrap().contains(secret),
        "a page shows the key"
    );
    client.goto(&format!("{base}/ui/")).await.unwrap();
    assert!(
        !client.source().await.unwrap().contains(secret),
        "a page shows the key"
    );

    // The workspace's files: one put from the shell listed, one uploaded
    // from the page, downloaded (as a download, never a page of the
    // site), then removed.
    blocking(|| d.put_file("report.csv", b"a,b\n1,2\n"));
    client.goto(&format!("{base}/ui/files")).await.unwrap();
    text_when(&client, "#files", "the file listed", |t| {
        t.contains("report.csv")
    })
    .await;
    let page_bytes = b"<script>alert(1)</script> from the browser\n";
    let local = dir.path().join("notes from the browser.html");
    std::fs::write(&local, page_bytes).unwrap();
    type_into(&client, "input[name=tags]", "ui, test").await;
    type_into(
        &client,
        "form:has(#put) input[type=file]",
        local.to_str().unwrap(),
    )
    .await;
    click(&client, "#put").await;
    text_when(&client, "#files", "the uploaded file listed", |t| {
        t.contains("notes from the browser.html") && t.contains("ui, test")
    })
    .await;
    let listed: Value =
        serde_json::from_str(&blocking(|| d.ok(&["files", "ls", "--json"]))).unwrap();
    let id = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["filename"] == "notes from the browser.html")
        .map(|f| f["id"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("not in files ls: {listed}"));
    let cookie = client.get_named_cookie("bv_session").await.unwrap();
    let fetched = reqwest::Client::new()
        .get(format!("{base}/ui/files/default/{id}"))
        .header("Cookie", format!("bv_session={}", cookie.value()))
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 200);
    let disposition = fetched.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(disposition.starts_with("attachment;"), "{disposition}");
    assert_eq!(
        fetched.headers()["content-type"],
        "application/octet-stream"
    );
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), page_bytes);
    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{base}/ui/files/default/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 303, "a file without a session");
    click(&client, &format!("#f-{id} button")).await;
    text_when(&client, "#files", "the file removed", |t| {
        t.contains("report.csv") && !t.contains("notes from the browser")
    })
    .await;
    assert!(!blocking(|| d.ok(&["files", "ls"])).contains("notes from the browser"));
    // An upload whose form does not open with the session's token is
    // refused before its file is read.
    for first in ["workspace\r\n\r\ndefault", "csrf\r\n\r\nwrong"] {
        let body = format!(
            "--B\r\nContent-Disposition: form-data; name={first}\r\n--B\r\n\
             Content-Disposition: form-data; name=file; filename=x.txt\r\n\r\nforged\r\n--B--\r\n"
        );
        let forged = upload(&base, cookie.value(), body).await;
        assert_eq!(forged.status(), 403, "{first}");
    }
    assert!(!blocking(|| d.ok(&["files", "ls"])).contains("x.txt"));
    // With the session's token first, the form's text fields are still
    // held to 64 KiB together (each under it, many of them over).
    let files_page = reqwest::Client::new()
        .get(format!("{base}/ui/files"))
        .header("Cookie", format!("bv_session={}", cookie.value()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = files_page
        .split("name=csrf value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's form token")
        .to_string();
    let mut body = format!("--B\r\nContent-Disposition: form-data; name=csrf\r\n\r\n{csrf}\r\n");
    for i in 0..20 {
        body.push_str(&format!(
            "--B\r\nContent-Disposition: form-data; name=f{i}\r\n\r\n{}\r\n",
            "x".repeat(4096)
        ));
    }
    body.push_str("--B\r\nContent-Disposition: form-data; name=file; filename=big.txt\r\n\r\nbig\r\n--B--\r\n");
    let flooded = upload(&base, cookie.value(), body).await;
    assert_eq!(flooded.status(), 400);
    assert!(flooded.text().await.unwrap().contains("too large"));
    assert!(!blocking(|| d.ok(&["files", "ls"])).contains("big.txt"));
    client.goto(&format!("{base}/ui/")).await.unwrap();
    text_when(
        &client,
        "#b-default-keyed [data-k=state]",
        "every bundle listed",
        |t| t == "ready",
    )
    .await;
    screenshot(&client, "overview").await;

    // A token: its text shown once with the client entry, then only its name.
    client.goto(&format!("{base}/ui/tokens")).await.unwrap();
    type_into(&client, "input[name=name]", "from-the-browser").await;
    click(&client, "#create").await;
    let text = text_when(&client, "#token", "the new token's text", |t| !t.is_empty()).await;
    let entry: Value =
        serde_json::from_str(&text_when(&client, "#entry", "the entry", |t| !t.is_empty()).await)
            .unwrap();
    let server = &entry["mcpServers"]["bundlevisor-default"];
    assert_eq!(server["url"], format!("{base}/mcp/default"), "{entry}");
    assert_eq!(
        server["headers"]["Authorization"],
        format!("Bearer {text}"),
        "{entry}"
    );
    client.goto(&format!("{base}/ui/tokens")).await.unwrap();
    screenshot(&client, "tokens").await;
    let page = client.source().await.unwrap();
    assert!(page.contains("from-the-browser") && !page.contains(&text));
    let listed = blocking(|| d.ok(&["token", "ls", "--json"]));
    assert!(listed.contains("from-the-browser"), "{listed}");

    // Signing out ends the session, and the live views it had open.
    let cookie = client.get_named_cookie("bv_session").await.unwrap();
    let cookie = format!("bv_session={}", cookie.value());
    let mut live = reqwest::Client::new()
        .get(format!("{base}/ui/live"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let first = live.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: status"));
    click(&client, "header form button").await;
    text_when(&client, "input[name=code]", "the sign-in page", |_| true).await;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while live.chunk().await.ok().flatten().is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "a live view outlived its session");
    let after = bundles_page(&base, Some(&cookie)).await;
    assert_eq!(after.status(), 303, "the cookie still works after sign-out");

    client.close().await.unwrap();
}

/// Off by default: no dashboard, and `bundlevisor dashboard` says how to
/// turn it on.
#[test]
fn the_dashboard_is_off_unless_configured() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    let out = d.cli(&["dashboard"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[http] dashboard = true"), "{stderr}");
    let answer = common::http_get(port, "/ui/");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}
