//! Issue 20, point 3 (first part): the access tokens of the HTTP gateway —
//! made for a workspace and perhaps a profile, shown once, listed without
//! their text, revoked, expiring; stored only as a digest, never logged.

mod common;

use std::time::Duration;

use common::{wait_for, Daemon};
use serde_json::Value;

fn daemon() -> Daemon {
    Daemon::start_with("[[profile]]\nname = \"readonly\"\nbundles = [\"demo\"]\n")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_token_is_shown_once_listed_without_its_text_and_revoked() {
    let d = daemon();
    let out = d.cli(&[
        "token",
        "create",
        "-w",
        "default",
        "--profile",
        "readonly",
        "--name",
        "ci",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("bvt_") && token.len() > 40, "{token}");
    assert!(stderr(&out).contains("shown this once"), "{}", stderr(&out));

    let other = d.ok(&["token", "create", "-w", "other", "--json"]);
    let other: Value = serde_json::from_str(&other).unwrap();
    let other_text = other["token"].as_str().unwrap().to_string();
    assert_ne!(other_text, token);
    assert!(other["name"].as_str().unwrap().starts_with("token-"));

    // Listed: names, workspaces, the profile; never a token's text.
    let listed = d.ok(&["token", "ls"]);
    assert!(
        listed.contains("ci") && listed.contains("(profile readonly)"),
        "{listed}"
    );
    assert!(listed.contains("never expires"), "{listed}");
    let json = d.ok(&["token", "ls", "--json"]);
    for text in [&token, &other_text] {
        assert!(!listed.contains(text.as_str()) && !json.contains(text.as_str()));
    }
    let only: Value =
        serde_json::from_str(&d.ok(&["token", "ls", "-w", "other", "--json"])).unwrap();
    assert_eq!(only["tokens"].as_array().unwrap().len(), 1, "{only}");
    assert!(only["tokens"][0].get("token").is_none(), "{only}");

    // Revoked by name, then by id.
    let revoked = d.ok(&["token", "revoke", "ci"]);
    assert!(
        revoked.starts_with("revoked") && revoked.contains("ci"),
        "{revoked}"
    );
    let id = other["id"].as_str().unwrap();
    d.ok(&["token", "revoke", id]);
    let gone = d.cli(&["token", "revoke", "ci"]);
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("no token is named \"ci\""),
        "{}",
        stderr(&gone)
    );
    let empty: Value = serde_json::from_str(&d.ok(&["token", "ls", "--json"])).unwrap();
    assert_eq!(empty["tokens"], serde_json::json!([]));

    // Never written in the clear: not in the log, not in the database.
    let log = d.log();
    let db = std::fs::read(d.root().join("state/state.db")).unwrap_or_default();
    for text in [&token, &other_text] {
        assert!(!log.contains(text.as_str()), "a token in the log");
        assert!(
            !db.windows(text.len()).any(|w| w == text.as_bytes()),
            "a token in the database"
        );
    }
    assert!(log.contains("access token created") && log.contains("access token revoked"));
}

#[test]
fn bad_token_requests_are_refused_clearly() {
    let d = daemon();
    let unknown = d.cli(&["token", "create", "--profile", "nosuch"]);
    assert!(!unknown.status.success());
    let said = stderr(&unknown);
    assert!(
        said.contains("no profile \"nosuch\"") && said.contains("readonly"),
        "{said}"
    );

    d.ok(&["token", "create", "--name", "twice"]);
    let again = d.cli(&["token", "create", "--name", "twice"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("exists already"),
        "{}",
        stderr(&again)
    );

    let bad_name = d.cli(&["token", "create", "--name", "../x"]);
    assert!(!bad_name.status.success());
    assert!(stderr(&bad_name).contains("name"), "{}", stderr(&bad_name));

    let bad_duration = d.cli(&["token", "create", "--expires", "soon"]);
    assert!(!bad_duration.status.success());
    assert!(
        stderr(&bad_duration).contains("--expires"),
        "{}",
        stderr(&bad_duration)
    );
}

#[test]
fn a_token_expires() {
    let d = daemon();
    // The listing is checked on a token that lives an hour: one that lives a
    // second may already be gone by the time a slow machine lists it.
    d.ok(&["token", "create", "--name", "hourly", "--expires", "1h"]);
    let listed = d.ok(&["token", "ls"]);
    let hourly = listed.lines().find(|l| l.contains("hourly")).unwrap_or("");
    assert!(hourly.contains("expires "), "{listed}");
    d.ok(&["token", "create", "--name", "brief", "--expires", "1s"]);
    let brief = |json: &Value| -> Option<Value> {
        json["tokens"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == "brief")
            .cloned()
    };
    wait_for(Duration::from_secs(10), "the token to expire", || {
        let json: Value = serde_json::from_str(&d.ok(&["token", "ls", "--json"])).ok()?;
        (brief(&json)?["expired"] == true).then_some(())
    });
    let json: Value = serde_json::from_str(&d.ok(&["token", "ls", "--json"])).unwrap();
    let hourly = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "hourly")
        .unwrap();
    assert_eq!(hourly["expired"], false, "{json}");
    let listed = d.ok(&["token", "ls"]);
    let brief = listed.lines().find(|l| l.contains("brief")).unwrap_or("");
    assert!(brief.contains("expired "), "{listed}");
}
