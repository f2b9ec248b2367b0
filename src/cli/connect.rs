//! `bundlevisor connect CLIENT [-w WS] [--profile P] [--http URL]`: an
//! agent's MCP client given this daemon's gateway in one step
//! (docs/gateway.md, "Connecting an agent"). The entry is added to the
//! client's configuration file beside its others (never over one), or
//! printed: over stdio it runs `bundlevisor mcp`; over HTTP it carries a
//! token made for it, limited to the workspace and profile.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Map, Value};

use super::{print_json, Client, ClientError};
use crate::protocol::typed;
use crate::protocol::{
    ErrorKind, ProfileParams, RpcError, TokenCreateParams, TokenCreated, TokenRevokeParams,
    DEFAULT_WORKSPACE,
};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    /// Claude Desktop (claude_desktop_config.json; stdio only).
    ClaudeDesktop,
    /// Claude Code (the project's .mcp.json).
    ClaudeCode,
    /// VS Code (the workspace's .vscode/mcp.json).
    Vscode,
    /// Cursor (~/.cursor/mcp.json).
    Cursor,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's client.
    #[arg(value_enum)]
    client: Agent,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// A `[[profile]]` of the daemon's config the agent sees.
    #[arg(long)]
    profile: Option<String>,
    /// Reach the gateway over streamable HTTP at this base URL (the
    /// daemon's `[http] listen`, e.g. http://127.0.0.1:8766) with a token
    /// made for the agent; stdio (`bundlevisor mcp`) otherwise.
    #[arg(long, value_name = "URL")]
    http: Option<String>,
    /// The entry's name in the client's configuration (default
    /// bundlevisor-WS, or bundlevisor-WS-PROFILE).
    #[arg(long)]
    name: Option<String>,
    /// The configuration file to add the entry to (default: where the
    /// client reads it; see docs/gateway.md).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Replace an entry of the same name.
    #[arg(long)]
    force: bool,
    /// Print the entry instead of writing it.
    #[arg(long)]
    print: bool,
    #[arg(long)]
    json: bool,
}

/// The operation failed (exit 1): what went wrong, with the fix.
fn refused(message: String) -> ClientError {
    ClientError::Rpc(RpcError::new(ErrorKind::InvalidParams, message))
}

impl Agent {
    /// The key the client keeps its servers under.
    fn servers_key(self) -> &'static str {
        match self {
            Agent::Vscode => "servers",
            _ => "mcpServers",
        }
    }

    /// Where the client reads its servers from.
    fn default_file(self) -> Result<PathBuf, ClientError> {
        let home = || {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .ok_or_else(|| refused("HOME is not set: give the file with --file".into()))
        };
        Ok(match self {
            Agent::ClaudeDesktop if cfg!(target_os = "macos") => {
                home()?.join("Library/Application Support/Claude/claude_desktop_config.json")
            }
            Agent::ClaudeDesktop => {
                let config = match std::env::var_os("XDG_CONFIG_HOME") {
                    Some(dir) if !dir.is_empty() => PathBuf::from(dir),
                    _ => home()?.join(".config"),
                };
                config.join("Claude/claude_desktop_config.json")
            }
            Agent::ClaudeCode => PathBuf::from(".mcp.json"),
            Agent::Vscode => PathBuf::from(".vscode/mcp.json"),
            Agent::Cursor => home()?.join(".cursor/mcp.json"),
        })
    }

    /// The entry of a stdio server running `command args`.
    fn stdio(self, command: &Path, args: &[String]) -> Value {
        let mut entry = json!({ "command": command, "args": args });
        if matches!(self, Agent::ClaudeCode | Agent::Vscode) {
            entry["type"] = json!("stdio");
        }
        entry
    }

    /// The entry of a streamable HTTP server at `url` with `token`.
    fn http(self, url: &str, token: &str) -> Value {
        let mut entry = json!({
            "url": url,
            "headers": { "Authorization": format!("Bearer {token}") },
        });
        if matches!(self, Agent::ClaudeCode | Agent::Vscode) {
            entry["type"] = json!("http");
        }
        entry
    }
}

pub async fn run(client: &mut Client, args: &Args, socket: &Path) -> Result<ExitCode, ClientError> {
    let name = args.name.clone().unwrap_or_else(|| match &args.profile {
        Some(p) => format!("bundlevisor-{}-{p}", args.workspace),
        None => format!("bundlevisor-{}", args.workspace),
    });
    let file = match &args.file {
        Some(f) => f.clone(),
        None => args.client.default_file()?,
    };
    // Checked before a token is made: a refused write leaves none behind.
    let existing = if args.print {
        None
    } else {
        Some(read_config(&file, args.client, &name, args.force)?)
    };
    // The token made for an HTTP entry, revoked if the entry is not written.
    let mut made_token: Option<String> = None;
    let entry = match &args.http {
        None => {
            let command = std::env::current_exe()
                .map_err(|e| refused(format!("cannot tell where this bundlevisor is: {e}")))?;
            let socket = std::path::absolute(socket).unwrap_or_else(|_| socket.to_path_buf());
            let mut mcp = vec![
                "--socket".to_string(),
                socket.display().to_string(),
                "mcp".to_string(),
                "-w".to_string(),
                args.workspace.clone(),
            ];
            if let Some(p) = &args.profile {
                // A profile the daemon does not have is said now, with the
                // ones it has, not when the agent first starts the entry.
                let asked = ProfileParams { name: p.clone() };
                client.call::<typed::Profile>(asked, |_| {}).await?;
                mcp.extend(["--profile".to_string(), p.clone()]);
            }
            args.client.stdio(&command, &mcp)
        }
        Some(_) if args.client == Agent::ClaudeDesktop => {
            return Err(ClientError::Usage(
                "Claude Desktop's configuration file runs local servers only: connect it over stdio (leave out --http), or add the HTTP gateway as a connector in its settings".into(),
            ));
        }
        Some(base) => {
            let base = base.trim_end_matches('/');
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(ClientError::Usage(format!(
                    "--http {base:?} is not an http:// or https:// URL; give the gateway's base, e.g. http://127.0.0.1:8766"
                )));
            }
            let mut url = format!("{base}/mcp/{}", args.workspace);
            if let Some(p) = &args.profile {
                url.push('/');
                url.push_str(p);
            }
            let params = TokenCreateParams {
                workspace: args.workspace.clone(),
                profile: args.profile.clone(),
                name: Some(format!("{name}-{}", token_suffix())),
                expires_secs: None,
                allow: Vec::new(),
                deny: Vec::new(),
            };
            let made: TokenCreated = client.call::<typed::TokenCreate>(params, |_| {}).await?;
            made_token = Some(made.info.name.clone());
            eprintln!(
                "made token {} for it (`bundlevisor token revoke {}` takes it back)",
                made.info.name, made.info.name
            );
            args.client.http(&url, &made.token)
        }
    };
    let Some(mut config) = existing else {
        if args.json {
            print_json(&json!({ "name": name, "entry": entry }))?;
        } else {
            let mut servers = Map::new();
            servers.insert(name, entry);
            let shown = json!({ args.client.servers_key(): servers });
            outln!(
                "{}",
                serde_json::to_string_pretty(&shown).unwrap_or_default()
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    config[args.client.servers_key()][&name] = entry;
    if let Err(e) = write_config(&file, &config) {
        if let Some(token) = made_token {
            let params = TokenRevokeParams { name: token };
            let _ = client.call::<typed::TokenRevoke>(params, |_| {}).await;
        }
        return Err(e);
    }
    if args.json {
        print_json(&json!({ "name": name, "file": file }))?;
    } else {
        eprintln!(
            "added {name} to {}; restart the client (or reload its MCP servers) to use it",
            file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A few random hex digits, so each connect's token has a name of its own.
fn token_suffix() -> String {
    format!("{:06x}", fastrand::u32(..0x100_0000))
}

/// The client's configuration as it is (an empty one when there is no
/// file), ready for the entry `name`: refused when the file is not a JSON
/// object, or already has `name` (unless `force`).
fn read_config(file: &Path, client: Agent, name: &str, force: bool) -> Result<Value, ClientError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(refused(format!("cannot read {}: {e}", file.display()))),
    };
    let mut config: Value = if text.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&text).map_err(|e| {
            refused(format!(
                "{} is not JSON ({e}); fix it or give another file with --file: nothing was written",
                file.display()
            ))
        })?
    };
    let key = client.servers_key();
    let Some(object) = config.as_object_mut() else {
        return Err(refused(format!(
            "{} is not a JSON object; nothing was written",
            file.display()
        )));
    };
    let servers = object.entry(key).or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object() else {
        return Err(refused(format!(
            "{}: \"{key}\" is not an object; nothing was written",
            file.display()
        )));
    };
    if servers.contains_key(name) && !force {
        return Err(refused(format!(
            "{} already has a server named {name:?}: give another --name, or --force to replace it",
            file.display()
        )));
    }
    Ok(config)
}

/// Writes `config` to `file` whole or not at all (a temporary file renamed
/// over it), creating its folder; a new file is readable by its owner
/// only (an HTTP entry holds a token), an existing one keeps its mode. A
/// link (dotfiles kept elsewhere) is followed: the file it names is
/// replaced, the link kept.
fn write_config(file: &Path, config: &Value) -> Result<(), ClientError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = &std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let failed = |e: std::io::Error| refused(format!("cannot write {}: {e}", file.display()));
    let folder = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder).map_err(failed)?;
    let mode = std::fs::metadata(file).map(|m| m.permissions().mode() & 0o7777);
    let temporary = folder.join(format!(
        ".{}.bundlevisor-{}",
        file.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("config"),
        std::process::id()
    ));
    let mut text = serde_json::to_string_pretty(config).unwrap_or_default();
    text.push('\n');
    let written = (|| {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        out.write_all(text.as_bytes())?;
        out.sync_all()?;
        if let Ok(mode) = mode {
            std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))?;
        }
        std::fs::rename(&temporary, file)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(failed)
}
