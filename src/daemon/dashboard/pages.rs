//! The dashboard's pages: HTML written here, escaped at every value, one
//! small stylesheet and one script file (`app.js`: live rows, logs and
//! events; no inline script, which the pages' policy refuses); nothing
//! fetched from elsewhere.

use crate::protocol::{BundleStatus, StatusResult, TokenInfo};

/// `text` safe inside HTML text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment (workspace and bundle names are plain, but never trusted).
pub fn path(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A bundle's page.
pub fn bundle_url(workspace: &str, name: &str) -> String {
    format!("/ui/bundle/{}/{}", path(workspace), path(name))
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:center}\
header a{color:#cfe0ff;text-decoration:none}header b{margin-right:auto}\
main{padding:16px 20px;max-width:1200px}table{border-collapse:collapse;width:100%;background:#fff}\
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e3e6ea;vertical-align:top}\
th{background:#eef1f5;font-weight:600}.state{font-weight:600}.ready{color:#137333}.failed,.needs_config,.needs_auth{color:#b3261e}\
.starting,.restarting,.backoff,.unpacking{color:#a15c00}pre{background:#0f1420;color:#d7e0ee;padding:10px;overflow:auto;max-height:360px}\
section{background:#fff;padding:12px 16px;margin:14px 0;border:1px solid #e3e6ea}form.inline{display:inline}\
textarea{width:100%;min-width:320px;font-family:monospace}.err{color:#b3261e}.once{background:#fff8d6;padding:8px;border:1px solid #e8d37a}\
button{cursor:pointer}";

/// A whole page: the title, the navigation (with sign-out when signed in)
/// and `body`.
/// The script's one file (`/ui/app.js`).
pub const APP_JS: &str = include_str!("app.js");

/// What a page's live script follows: nothing (a page without it), every
/// bundle's row, or one bundle (its base URL and row id).
enum Live<'a> {
    Off,
    Rows,
    Bundle(&'a str, &'a str),
}

impl Live<'_> {
    /// The body's data attributes and the script tag.
    fn parts(&self) -> (String, &'static str) {
        const TAG: &str = "<script src=\"/ui/app.js\"></script>";
        match self {
            Live::Off => (String::new(), ""),
            Live::Rows => (" data-live=1".to_string(), TAG),
            Live::Bundle(base, row) => (
                format!(
                    " data-live=1 data-base=\"{}\" data-row=\"{}\"",
                    esc(base),
                    esc(row)
                ),
                TAG,
            ),
        }
    }
}

fn layout(title: &str, csrf: Option<&str>, body: &str, live: Live) -> String {
    let (attributes, script) = live.parts();
    let nav = match csrf {
        Some(csrf) => format!(
            "<a href=\"/ui/\">Bundles</a><a href=\"/ui/files\">Files</a><a href=\"/ui/tokens\">Tokens</a>\
             <form class=inline method=post action=\"/ui/logout\"><input type=hidden name=csrf value=\"{}\"><button>Sign out</button></form>",
            esc(csrf)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width\">\
         <title>{} · bundlevisor</title><style>{STYLE}</style></head><body{attributes}><header><b>bundlevisor</b>{nav}</header>\
         <main>{body}</main>{script}</body></html>",
        esc(title)
    )
}

pub fn message(title: &str, text: &str) -> String {
    layout(
        title,
        None,
        &format!(
            "<h1>{}</h1><p>{}</p><p><a href=\"/ui/\">Back</a></p>",
            esc(title),
            esc(text)
        ),
        Live::Off,
    )
}

/// Why an agent's token is not taken (the sign-in form, a bearer).
pub const AGENT_REFUSED: &str = "That is an agent's access token. Agents' tokens never open the dashboard: run `bundlevisor dashboard` on the daemon's host for a sign-in link.";

pub fn refused(agent: bool) -> String {
    let text = if agent {
        AGENT_REFUSED
    } else {
        "Sign in with a link from `bundlevisor dashboard`; a bearer token is not taken here."
    };
    layout(
        "Refused",
        None,
        &format!("<h1>Refused</h1><p id=why>{}</p>", esc(text)),
        Live::Off,
    )
}

/// The sign-in page, with a link's code filled in (signing in is a POST
/// of this page's own form).
pub fn login(why: Option<&str>, code: Option<&str>) -> String {
    let why = why.map_or(String::new(), |w| {
        format!("<p class=err id=why>{}</p>", esc(w))
    });
    let code = esc(code.unwrap_or_default());
    layout(
        "Sign in",
        None,
        &format!(
            "<h1>Sign in</h1>{why}<p>Run <code>bundlevisor dashboard</code> on the daemon's host and open the link it prints, \
             or paste its code here.</p><form method=post action=\"/ui/login\"><input name=code size=50 autocomplete=off value=\"{code}\"> \
             <button id=signin>Sign in</button></form>"
        ),
        Live::Off,
    )
}

fn human_bytes(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        Some(b) => format!("{} KiB", b / 1024),
        None => "-".into(),
    }
}

fn uptime(secs: Option<u64>) -> String {
    match secs {
        Some(s) if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        Some(s) if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        Some(s) => format!("{s}s"),
        None => "-".into(),
    }
}

/// One bundle's cells, by key (the live script fills the same keys).
fn cells(b: &BundleStatus) -> Vec<(&'static str, String)> {
    let usage = b.usage.as_ref();
    vec![
        ("state", b.state.as_str().to_string()),
        ("version", b.version.clone().unwrap_or_else(|| "-".into())),
        ("restarts", b.restarts.to_string()),
        ("uptime", uptime(b.uptime_secs)),
        (
            "memory",
            human_bytes(usage.and_then(|u| u.memory_bytes.or(u.rss_bytes))),
        ),
        (
            "cpu",
            usage
                .and_then(|u| u.cpu_usec)
                .map_or("-".into(), |c| format!("{:.1} s", c as f64 / 1e6)),
        ),
        ("tools", b.tools.to_string()),
        ("error", b.last_error.clone().unwrap_or_default()),
    ]
}

fn row_id(b: &BundleStatus) -> String {
    format!("b-{}-{}", path(&b.workspace), path(&b.name))
}

/// Every bundle's row for the live script: `[{id, cells…}]`.
pub fn rows_json(status: &StatusResult) -> String {
    let rows: Vec<serde_json::Value> = status
        .bundles
        .iter()
        .map(|b| {
            let mut row = serde_json::Map::new();
            row.insert("id".into(), row_id(b).into());
            for (k, v) in cells(b) {
                row.insert(k.into(), v.into());
            }
            row.into()
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

pub fn overview(csrf: &str, principal: &str, status: &StatusResult) -> String {
    let mut rows = String::new();
    for b in &status.bundles {
        let mut tds = format!(
            "<td>{}</td><td><a href=\"/ui/bundle/{}/{}\">{}</a></td>",
            esc(&b.workspace),
            path(&b.workspace),
            path(&b.name),
            esc(&b.name)
        );
        for (k, v) in cells(b) {
            let class = if k == "state" {
                format!(" class=\"state {}\"", esc(&v))
            } else {
                String::new()
            };
            tds.push_str(&format!("<td data-k={k}{class}>{}</td>", esc(&v)));
        }
        rows.push_str(&format!("<tr id=\"{}\">{tds}</tr>", row_id(b)));
    }
    let workspaces: String = status
        .workspaces
        .iter()
        .map(|w| format!("<option>{}</option>", esc(w)))
        .collect();
    let body = format!(
        "<h1>Bundles</h1><p>Signed in as {}. {} bundles in {} workspaces.</p>\
         <table id=bundles><tr><th>Workspace</th><th>Bundle</th><th>State</th><th>Version</th><th>Restarts</th>\
         <th>Uptime</th><th>Memory</th><th>CPU</th><th>Tools</th><th>Last error</th></tr>{rows}</table>\
         <section><h2>Install</h2><form method=post action=\"/ui/install\" enctype=\"multipart/form-data\">\
         <input type=hidden name=csrf value=\"{}\">into <select name=workspace>{workspaces}</select> \
         <input type=file name=archive accept=\".mcpb\"> <button id=install>Install</button></form></section>",
        esc(principal),
        status.bundles.len(),
        status.workspaces.len(),
        esc(csrf)
    );
    layout("Bundles", Some(csrf), &body, Live::Rows)
}

/// What a bundle's page shows.
pub struct BundleView<'a> {
    pub status: &'a BundleStatus,
    pub tools: &'a [rmcp::model::Tool],
    /// The tail of its log.
    pub lines: &'a [String],
    /// Its recent lifecycle events, newest first.
    pub events: &'a [crate::protocol::LifecycleEvent],
    /// Its manifest's settings: key, title, sensitive.
    pub settings: &'a [(String, String, bool)],
    /// A tool just called: its name, its answer's text, whether an error.
    pub called: Option<(String, String, bool)>,
}

/// The settings form: every field empty (a sensitive value is never
/// shown; an empty field leaves the value as it is; one read by reference
/// says from where).
fn settings_form(
    (base, hidden): (&str, &str),
    settings: &[(String, String, bool)],
    refs: &[crate::protocol::SecretRefStatus],
) -> String {
    if settings.is_empty() {
        return String::new();
    }
    let fields: String = settings
        .iter()
        .map(|(key, title, sensitive)| {
            let read_from = refs.iter().find(|r| &r.key == key);
            let (kind, hint) = match (sensitive, read_from) {
                (true, Some(r)) => (
                    "password",
                    format!(
                        "read from {} at each start; a value typed here replaces it",
                        r.reference
                    ),
                ),
                (true, None) => ("password", "write-only: never shown; empty keeps it".into()),
                (false, _) => ("text", "empty keeps it".into()),
            };
            let hint = esc(&hint);
            format!(
                "<tr><th>{}</th><td><input type={kind} name=\"cfg.{}\" autocomplete=off placeholder=\"{hint}\" size=40></td></tr>",
                esc(if title.is_empty() { key } else { title }),
                esc(key)
            )
        })
        .collect();
    format!(
        "<section><h2>Settings</h2><form method=post action=\"{base}/configure\">{hidden}<table>{fields}</table>\
         <button id=configure>Save and restart</button></form></section>"
    )
}

pub fn bundle(csrf: &str, view: BundleView) -> String {
    let BundleView {
        status: b,
        tools,
        lines,
        events,
        settings,
        called,
    } = view;
    let base = bundle_url(&b.workspace, &b.name);
    let facts: String = cells(b)
        .into_iter()
        .map(|(k, v)| {
            let class = if k == "state" {
                format!(" class=\"state {}\"", esc(&v))
            } else {
                String::new()
            };
            format!(
                "<tr><th>{k}</th><td data-k={k}{class}>{}</td></tr>",
                esc(&v)
            )
        })
        .collect();
    let hidden = format!("<input type=hidden name=csrf value=\"{}\">", esc(csrf));
    let answer = match called {
        Some((tool, text, error)) => format!(
            "<section><h2>{} answered{}</h2><pre id=answer>{}</pre></section>",
            esc(&tool),
            if error { " with an error" } else { "" },
            esc(&text)
        ),
        None => String::new(),
    };
    let mut tool_rows = String::new();
    for t in tools {
        let schema = serde_json::to_string(&t.input_schema).unwrap_or_default();
        tool_rows.push_str(&format!(
            "<tr><td><b>{}</b><br>{}<br><small><code>{}</code></small></td><td><form method=post action=\"{base}/call\">{hidden}\
             <input type=hidden name=tool value=\"{}\"><textarea name=arguments rows=2 placeholder='{{}}'></textarea>\
             <button id=\"call-{}\">Call</button></form></td></tr>",
            esc(&t.name),
            esc(t.description.as_deref().unwrap_or_default()),
            esc(&schema),
            esc(&t.name),
            esc(&t.name)
        ));
    }
    let log: String = lines.iter().map(|l| esc(l) + "\n").collect();
    let body = format!(
        "<h1>{} <small>in {}</small></h1><table id=facts>{facts}</table>\
         <p><form class=inline method=post action=\"{base}/restart\">{hidden}<button id=restart>Restart</button></form> \
         <form class=inline method=post action=\"{base}/uninstall\">{hidden}<button id=uninstall>Uninstall</button></form></p>\
         {answer}<section><h2>Tools</h2><table>{tool_rows}</table></section>{}\
         <section><h2>Upgrade</h2><form method=post action=\"{base}/upgrade\" enctype=\"multipart/form-data\">{hidden}\
         <input type=file name=archive accept=\".mcpb\"> <button id=upgrade>Upgrade</button> \
         <small>a .mcpb of this bundle runs in place of this version; one refused by the install checks leaves this one running</small></form></section>\
         <section><h2>Log</h2><pre id=log>{log}</pre></section>\
         <section><h2>Events</h2><table id=events><tr><th>When</th><th>What</th><th>State</th><th>Message</th></tr>{}</table></section>",
        esc(&b.name),
        esc(&b.workspace),
        settings_form((&base, &hidden), settings, &b.secret_refs),
        events.iter().map(event_row).collect::<String>()
    );
    let row = row_id(b);
    layout(&b.name, Some(csrf), &body, Live::Bundle(&base, &row))
}

/// A token just made: shown this once, with the client entry that uses it.
pub struct Made {
    pub name: String,
    pub token: String,
    /// The `mcpServers` entry for an agent's client.
    pub entry: String,
}

/// An event's fields as the page shows them.
fn event_fields(e: &crate::protocol::LifecycleEvent) -> [(&'static str, String); 4] {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(e.time_ms);
    let kind = serde_json::to_value(e.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    [
        ("time", humantime::format_rfc3339_seconds(time).to_string()),
        ("kind", kind),
        ("state", e.state.as_str().to_string()),
        ("message", e.message.clone()),
    ]
}

fn event_row(e: &crate::protocol::LifecycleEvent) -> String {
    let cells: String = event_fields(e)
        .iter()
        .map(|(_, v)| format!("<td>{}</td>", esc(v)))
        .collect();
    format!("<tr>{cells}</tr>")
}

/// An event for the live script: `{time, kind, state, message}`.
pub fn event_json(e: &crate::protocol::LifecycleEvent) -> String {
    let fields: serde_json::Map<String, serde_json::Value> = event_fields(e)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
    serde_json::Value::Object(fields).to_string()
}

pub fn tokens(csrf: &str, list: &[TokenInfo], made: Option<Made>) -> String {
    let once = match made {
        Some(made) => format!(
            "<div class=once><p>Token <b>{}</b> made. Its text is shown this once: <code id=token>{}</code></p>\
             <p>An agent's MCP client (Claude Code, Cursor, VS Code) takes it so (<code>bundlevisor connect</code> writes it for you):</p>\
             <pre id=entry>{}</pre></div>",
            esc(&made.name),
            esc(&made.token),
            esc(&made.entry)
        ),
        None => String::new(),
    };
    let rows: String = list
        .iter()
        .map(|t| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&t.name),
                esc(&t.workspace),
                esc(t.profile.as_deref().unwrap_or("-")),
                esc(&[
                    t.allow.join(" "),
                    t.deny
                        .iter()
                        .map(|d| format!("deny {d}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                ]
                .join(" ")),
                if t.expired { "expired" } else { "live" }
            )
        })
        .collect();
    let body = format!(
        "<h1>Agents' tokens</h1>{once}<table id=tokens><tr><th>Name</th><th>Workspace</th><th>Profile</th><th>Rules</th><th></th></tr>{rows}</table>\
         <section><h2>New token</h2><form method=post action=\"/ui/tokens\"><input type=hidden name=csrf value=\"{}\">\
         name <input name=name> workspace <input name=workspace placeholder=default> profile <input name=profile> \
         <button id=create>Create</button></form></section>",
        esc(csrf)
    );
    layout("Tokens", Some(csrf), &body, Live::Off)
}

pub fn files(
    csrf: &str,
    workspace: &str,
    workspaces: &[String],
    list: &[crate::protocol::FileRecord],
) -> String {
    let choose: String = workspaces
        .iter()
        .map(|w| {
            let selected = if w == workspace { " selected" } else { "" };
            format!("<option{selected}>{}</option>", esc(w))
        })
        .collect();
    let hidden = format!(
        "<input type=hidden name=csrf value=\"{}\"><input type=hidden name=workspace value=\"{}\">",
        esc(csrf),
        esc(workspace)
    );
    let rows: String = list
        .iter()
        .map(|f| {
            format!(
                "<tr id=\"f-{}\"><td><a href=\"/ui/files/{}/{}\">{}</a></td><td><code>files://{}</code></td><td>{}</td><td>{} B</td><td>{}</td><td>{}</td>\
                 <td><form class=inline method=post action=\"/ui/files/remove\">{hidden}<input type=hidden name=id value=\"{}\"><button>Remove</button></form></td></tr>",
                esc(&f.id),
                path(workspace),
                path(&f.id),
                esc(&f.filename),
                esc(&f.id),
                esc(&f.mime_type),
                f.size,
                esc(&f.tags.join(", ")),
                esc(&f.created_at),
                esc(&f.id)
            )
        })
        .collect();
    let body = format!(
        "<h1>Files of {}</h1><form method=get action=\"/ui/files\"><select name=workspace>{choose}</select> <button>Show</button></form>\
         <table id=files><tr><th>Name</th><th>URI</th><th>Type</th><th>Size</th><th>Tags</th><th>Added</th><th></th></tr>{rows}</table>\
         <section><h2>Add a file</h2><form method=post action=\"/ui/files/put\" enctype=\"multipart/form-data\">{hidden}\
         tags <input name=tags placeholder=\"a, b\"> <input type=file name=file> <button id=put>Add</button></form></section>\
         <p>Bundles read these through host-resources (<code>bundlevisor files</code> does the same from a shell).</p>",
        esc(workspace)
    );
    layout("Files", Some(csrf), &body, Live::Off)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_value_is_escaped() {
        assert_eq!(
            super::esc("<script>\"x\" & 'y'</script>"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
        assert_eq!(super::path("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn a_setting_read_by_reference_says_from_where_never_what() {
        let settings = [
            ("api_key".to_string(), "API key".to_string(), true),
            ("token".to_string(), String::new(), true),
        ];
        let refs = [crate::protocol::SecretRefStatus {
            key: "api_key".into(),
            reference: "file:/run/secrets/<api>".into(),
            resolved_at: 1,
        }];
        let form = super::settings_form(("/b", ""), &settings, &refs);
        assert!(
            form.contains("read from file:/run/secrets/&lt;api&gt; at each start"),
            "{form}"
        );
        assert!(form.contains("write-only: never shown"), "{form}");
    }
}
