//! `bundlevisor configure NAME [-w WS] KEY=VALUE... [--ref KEY=REFERENCE]...
//! [--unset KEY]...` (a key declared `multiple` takes several: `KEY=a
//! KEY=b`, or a JSON array): stores user_config values (encrypted), or
//! references to where a sensitive value is kept (read at each start), and
//! respawns the bundle; waits for the outcome. Without changes it lists the bundle's keys. `KEY=-` reads
//! the value from stdin, which keeps a secret out of the shell history and
//! the process list.

use std::io::Read;
use std::process::ExitCode;
use std::str::FromStr;

use super::{print_json, with_spinner, Client, ClientError};
use crate::protocol::{ConfigureParams, ConfigureResult, DEFAULT_WORKSPACE};
use crate::secret::Secret;
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    /// KEY=VALUE pairs (KEY=- reads the value from stdin).
    #[arg(value_name = "KEY=VALUE")]
    set: Vec<Assignment>,
    /// Read a sensitive key's value, at each start, from where it is kept:
    /// credential:NAME, file:/PATH, env:NAME, pass:PATH,
    /// gcp:projects/P/secrets/S/versions/V or vault:MOUNT/PATH#FIELD[@VERSION]
    /// (allowed by the daemon's [secrets] rules).
    #[arg(long = "ref", value_name = "KEY=REFERENCE")]
    refs: Vec<String>,
    /// Remove a stored value (the manifest default applies again).
    #[arg(long, value_name = "KEY")]
    unset: Vec<String>,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    #[arg(long)]
    json: bool,
}

/// One `KEY=VALUE` argument; the value is a secret until proven otherwise.
#[derive(Debug, Clone)]
struct Assignment {
    key: String,
    value: Secret,
}

impl FromStr for Assignment {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok(Assignment {
                key: key.to_string(),
                value: Secret::new(value),
            }),
            _ => Err("expected KEY=VALUE (KEY=- reads the value from stdin)".to_string()),
        }
    }
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let usage = |m: String| ClientError::Usage(m);
    // A key given more than once carries all its values, as a JSON array
    // (for `multiple` keys; the daemon refuses it for the others).
    let mut given: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut stdin_used = false;
    for a in &args.set {
        let value = if a.value.expose() == "-" {
            if stdin_used {
                return Err(usage("only one KEY=- can read its value from stdin".into()));
            }
            stdin_used = true;
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|e| {
                usage(format!(
                    "cannot read the value of {} from stdin: {e}",
                    a.key
                ))
            })?;
            let trimmed = text.strip_suffix('\n').unwrap_or(&text);
            let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string();
            zeroize::Zeroize::zeroize(&mut text);
            trimmed
        } else {
            a.value.expose().to_string()
        };
        given.entry(a.key.clone()).or_default().push(value);
    }
    let set = given
        .into_iter()
        .map(|(key, mut values)| {
            let value = if values.len() == 1 {
                values.remove(0)
            } else {
                serde_json::to_string(&values).unwrap_or_default()
            };
            (key, value)
        })
        .collect();
    let mut refs = std::collections::BTreeMap::new();
    for given in &args.refs {
        let Some((key, reference)) = given.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(usage(format!(
                "--ref {given:?}: expected KEY=REFERENCE (e.g. --ref api_key=file:/run/secrets/api_key)"
            )));
        };
        if refs
            .insert(key.to_string(), reference.to_string())
            .is_some()
        {
            return Err(usage(format!("--ref {key}: given twice")));
        }
    }
    let params = ConfigureParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
        set,
        unset: args.unset.clone(),
        refs,
    };
    let what = format!("configuring {}/{}", args.workspace, args.name);
    let r: ConfigureResult = with_spinner(what, async |on_note| {
        client
            .call::<crate::protocol::typed::Configure>(params, on_note)
            .await
    })
    .await?;
    for note in &r.notes {
        eprintln!("note: {}", printable_line(note));
    }
    if args.json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(b) = &r.bundle {
        outln!(
            "{}/{} reconfigured: {} (pid {})",
            printable_line(&b.workspace),
            printable_line(&b.name),
            b.state.as_str(),
            b.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into())
        );
        return Ok(ExitCode::SUCCESS);
    }
    if r.keys.is_empty() {
        outln!(
            "{}/{} declares no user_config keys",
            args.workspace,
            args.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<20} {:<10} {:<9} {:<9} VALUE",
        "KEY",
        "TYPE",
        "REQUIRED",
        "SENSITIVE"
    );
    for k in &r.keys {
        let value = match (&k.value, k.set, k.has_default) {
            _ if k.reference.is_some() => format!(
                "(read from {})",
                printable_line(k.reference.as_deref().unwrap_or_default())
            ),
            (Some(v), _, _) => printable_line(v).into_owned(),
            (None, true, _) => crate::secret::MASK.to_string(),
            (None, false, true) => "(default)".to_string(),
            (None, false, false) if k.required => "(not set: required)".to_string(),
            (None, false, false) => "(not set)".to_string(),
        };
        outln!(
            "{:<20} {:<10} {:<9} {:<9} {value}",
            printable_line(&k.key),
            printable_line(&k.kind),
            if k.required { "yes" } else { "no" },
            if k.sensitive { "yes" } else { "no" },
        );
    }
    Ok(ExitCode::SUCCESS)
}
