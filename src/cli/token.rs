//! `bundlevisor token create|ls|revoke`: the access tokens of the HTTP
//! gateway (docs/gateway.md, "Tokens"). A token is printed once, when it
//! is made; afterwards only its name, id, workspace, profile and expiry.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use super::{print_json, Client, ClientError};
use crate::protocol::typed;
use crate::protocol::{
    TokenCreateParams, TokenCreated, TokenInfo, TokenListParams, TokenRevokeParams, Tokens,
    DEFAULT_WORKSPACE,
};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TokenCommand {
    /// Make a token for one workspace (and profile); prints it once.
    Create {
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
        /// A [[profile]] of the daemon's config the token is limited to.
        #[arg(long)]
        profile: Option<String>,
        /// When it stops working, from now (e.g. 12h, 30d); never by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
        /// Its name (unique); default token-ID.
        #[arg(long)]
        name: Option<String>,
        /// What it may reach: KIND:BUNDLE/NAME with globs, e.g.
        /// tool:github/*, prompt:*/*, resource:@files/* (repeatable; with
        /// none, everything its profile shows).
        #[arg(long, value_name = "RULE")]
        allow: Vec<String>,
        /// What it may not reach, whatever --allow says (repeatable), e.g.
        /// tool:*/delete_*.
        #[arg(long, value_name = "RULE")]
        deny: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List the tokens (never their text).
    Ls {
        /// Only this workspace's.
        #[arg(short, long)]
        workspace: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by name or id: it admits nobody from now on.
    Revoke {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

fn when(secs: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

fn line(t: &TokenInfo) -> String {
    let expiry = match (t.expires_at, t.expired) {
        (None, _) => "never expires".to_string(),
        (Some(at), true) => format!("expired {}", when(at)),
        (Some(at), false) => format!("expires {}", when(at)),
    };
    let rules = |flag: &str, rules: &[String]| -> String {
        rules
            .iter()
            .map(|r| format!("  {flag} {}", printable_line(r)))
            .collect()
    };
    format!(
        "{}  {}  workspace {}{}  created {}  {}{}{}",
        t.id,
        printable_line(&t.name),
        t.workspace,
        t.profile
            .as_deref()
            .map(|p| format!(" (profile {})", printable_line(p)))
            .unwrap_or_default(),
        when(t.created_at),
        expiry,
        rules("--allow", &t.allow),
        rules("--deny", &t.deny)
    )
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    match &args.command {
        TokenCommand::Create {
            workspace,
            profile,
            expires,
            name,
            allow,
            deny,
            json,
        } => {
            let params = TokenCreateParams {
                workspace: workspace.clone(),
                profile: profile.clone(),
                name: name.clone(),
                expires_secs: expires.map(|d| d.as_secs().max(1)),
                allow: allow.clone(),
                deny: deny.clone(),
            };
            let made: TokenCreated = client.call::<typed::TokenCreate>(params, |_| {}).await?;
            if *json {
                print_json(&made)?;
            } else {
                outln!("{}", made.token);
                eprintln!(
                    "token {} ({}) for workspace {}: shown this once, keep it secret; agents send it as `Authorization: Bearer TOKEN`",
                    printable_line(&made.info.name),
                    made.info.id,
                    made.info.workspace
                );
            }
        }
        TokenCommand::Ls { workspace, json } => {
            let params = TokenListParams {
                workspace: workspace.clone(),
            };
            let list: Tokens = client.call::<typed::TokenList>(params, |_| {}).await?;
            if *json {
                print_json(&list)?;
            } else if list.tokens.is_empty() {
                eprintln!("no tokens; `bundlevisor token create -w WORKSPACE` makes one");
            } else {
                for t in &list.tokens {
                    outln!("{}", line(t));
                }
            }
        }
        TokenCommand::Revoke { name, json } => {
            let params = TokenRevokeParams { name: name.clone() };
            let revoked: TokenInfo = client.call::<typed::TokenRevoke>(params, |_| {}).await?;
            if *json {
                print_json(&revoked)?;
            } else {
                outln!("revoked {}", line(&revoked));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
