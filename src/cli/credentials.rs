//! `bundlevisor credentials ls [-w WS] [--orphaned] [--json]`: the bundles
//! whose user_config values or OAuth tokens are stored — keys, never values
//! — and whether each is still installed. A bundle gone from its watched
//! folder keeps its secrets; `uninstall NAME --purge` deletes them.

use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::{CredentialsListParams, StoredCredentials};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// List them.
    Ls {
        #[arg(short, long)]
        workspace: Option<String>,
        /// Only those of bundles no longer installed.
        #[arg(long)]
        orphaned: bool,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let Sub::Ls {
        workspace,
        orphaned,
        json,
    } = &args.command;
    let params = CredentialsListParams {
        workspace: workspace.clone(),
        orphaned: *orphaned,
    };
    let r: StoredCredentials = client
        .call::<crate::protocol::typed::CredentialsList>(params, |_| {})
        .await?;
    if *json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    if r.bundles.is_empty() {
        outln!(
            "nothing is stored{}",
            if *orphaned {
                " for a bundle that is not installed"
            } else {
                ""
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<12} {:<24} {:<10} {:<7} KEYS",
        "WORKSPACE",
        "BUNDLE",
        "INSTALLED",
        "OAUTH"
    );
    for b in &r.bundles {
        outln!(
            "{:<12} {:<24} {:<10} {:<7} {}",
            b.workspace,
            b.name,
            if b.installed { "yes" } else { "no" },
            if b.oauth_tokens { "yes" } else { "-" },
            if b.keys.is_empty() {
                "-".to_string()
            } else {
                b.keys.join(",")
            }
        );
    }
    let orphans = r.bundles.iter().filter(|b| !b.installed).count();
    if orphans > 0 {
        outln!("{orphans} not installed: `bundlevisor uninstall NAME -w WS --purge` deletes what is stored for one");
    }
    Ok(ExitCode::SUCCESS)
}
