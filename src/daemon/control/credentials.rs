//! `bundle.configure`: check values against the manifest's user_config,
//! store them encrypted, respawn the bundle through its actor (and so
//! through the one connect function) and report the outcome. `auth.begin`
//! and `auth.complete`: the operator-completed authorization-code + PKCE
//! flow of a remote bundle.
//!
//! `credentials.rotate_key`: a new credential key, every stored secret
//! re-sealed with it in one transaction.
//!
//! Calls on one bundle are serialized by [`Shared::configure_lock`], held
//! from validation to outcome, so two operators cannot interleave a store
//! and a respawn.

use std::collections::BTreeSet;
use std::time::Duration;

use super::wire::{bundle_actor, unavailable};
use super::{Ctx, Outbox};
use crate::daemon::bundle::Respawn;
use crate::daemon::PendingAuth;
use crate::manifest::{LoadedManifest, Plan, RemotePlan, UserConfigType};
use crate::protocol::{
    AuthBeginParams, AuthBeginResult, AuthCompleteParams, BundleResult, ConfigKey, ConfigureParams,
    ConfigureResult, ErrorKind, NoParams, RotateKeyResult, RpcError,
};
use crate::secret::Secret;
use crate::store::{Change, TokenSet};

/// Replaces the credential key: the new key is written to `KEY_FILE.new`
/// first, every secret is re-sealed in one transaction, then the new file
/// replaces the key file. A daemon stopped in between finishes (or undoes)
/// it at its next start (`daemon::open_credentials`). Rotations run one at
/// a time ([`Shared::key_rotation`](crate::daemon::Shared), held until the
/// blocking work is done even if the caller goes away): two interleaved
/// ones would leave one's key in the file and the other's in the store.
pub(super) async fn rotate_key(_: NoParams, ctx: &Ctx) -> Result<RotateKeyResult, RpcError> {
    use crate::store::crypto;
    let failed = |message: String| RpcError::new(ErrorKind::KeyRotationFailed, message);
    let settings = &ctx.shared.config.credentials;
    let Some(key_path) = crypto::key_path(settings, &ctx.shared.config.state_dir) else {
        return Err(failed(format!(
            "the credential key comes from environment variable {} ([credentials] key_env), which the daemon cannot change; to rotate, move the key into a key file ([credentials] key_file) first (docs/operations.md, runbook)",
            settings.key_env.as_deref().unwrap_or("?")
        )));
    };
    let credentials = ctx.shared.credentials.clone();
    let rotating = ctx.shared.key_rotation.clone().lock_owned().await;
    let result = tokio::task::spawn_blocking(move || {
        let _rotating = rotating;
        let pending = crypto::pending_key_path(&key_path);
        let new = crypto::write_pending_key(&pending)
            .map_err(|e| failed(format!("nothing was changed: {e}")))?;
        let resealed = match credentials.rotate(new) {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&pending);
                return Err(failed(format!(
                    "nothing was changed (the stored secrets are still sealed with the current key): {e}"
                )));
            }
        };
        #[cfg(feature = "fault-injection")]
        if std::env::var("BUNDLEVISOR_FAULT").as_deref() == Ok("rotate_after_commit") {
            std::process::abort();
        }
        crypto::promote_pending_key(&key_path).map_err(|e| {
            failed(format!(
                "the secrets are re-sealed with the new key, which is in {}, but it could not replace the key file: {e}; the daemon finishes this at its next start — do not delete that file",
                pending.display()
            ))
        })?;
        tracing::info!(file = %key_path.display(), values = resealed.values, token_sets = resealed.token_sets, "credential key rotated");
        Ok(RotateKeyResult {
            key_file: key_path.display().to_string(),
            values: resealed.values,
            token_sets: resealed.token_sets,
        })
    })
    .await
    .map_err(unavailable)??;
    Ok(result)
}

pub(super) async fn configure(
    p: ConfigureParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<ConfigureResult, RpcError> {
    bundle_actor(&p.workspace, &p.name)?;
    let lock = ctx.shared.configure_lock(&p.workspace, &p.name);
    let _serialized = lock.lock().await;
    let loaded = ctx.api.running_manifest(&p.workspace, &p.name).await?;
    let stored: BTreeSet<String> = {
        ctx.shared
            .credentials_of(&p.workspace, &p.name, move |c, w, n| c.keys(w, n))
            .await
            .map_err(internal)?
            .into_iter()
            .map(|k| k.key)
            .collect()
    };

    // The values' checks look at the file system (a directory must exist,
    // a path must be the peer's): on the blocking pool.
    let (problems, changes) = {
        let (manifest, set, unset, peer, name) = (
            loaded.manifest.clone(),
            p.set.clone(),
            p.unset.clone(),
            ctx.peer,
            p.name.clone(),
        );
        tokio::task::spawn_blocking(move || {
            check_changes(&manifest, &set, &unset, &stored, peer, &name)
        })
        .await
        .map_err(internal)?
    };
    if !problems.is_empty() {
        return Err(RpcError::new(
            ErrorKind::InvalidConfigValue,
            format!(
                "nothing was changed: {}; `bundlevisor configure {} -w {}` lists the keys",
                problems.join("; "),
                p.name,
                p.workspace
            ),
        )
        .with("problems", problems));
    }

    if changes.is_empty() {
        let keys = describe_keys(ctx, &loaded, &p.workspace, &p.name).await?;
        return Ok(ConfigureResult { keys, bundle: None });
    }
    {
        ctx.shared
            .credentials_of(&p.workspace, &p.name, move |c, w, n| {
                c.apply(w, n, &changes)
            })
            .await
            .map_err(internal)?;
    }
    tracing::info!(workspace = %p.workspace, bundle = %p.name, set = ?p.set.keys().collect::<Vec<_>>(), unset = ?p.unset, "user_config changed; respawning");
    let bundle = ctx
        .api
        .respawn_and_wait(
            &p.workspace,
            &p.name,
            Respawn::Reconfigured,
            out.forwarding(),
        )
        .await?;
    let keys = describe_keys(ctx, &loaded, &p.workspace, &p.name).await?;
    Ok(ConfigureResult {
        keys,
        bundle: Some(bundle),
    })
}

/// Checks `set` and `unset` against the manifest's user_config: every
/// problem at once, or the changes to store. Blocking.
fn check_changes(
    manifest: &crate::manifest::Manifest,
    set: &std::collections::BTreeMap<String, String>,
    unset: &[String],
    stored: &BTreeSet<String>,
    peer: crate::daemon::admission::Peer,
    name: &str,
) -> (Vec<String>, Vec<Change>) {
    let mut problems = Vec::new();
    let mut changes = Vec::new();
    for (key, raw) in set {
        if unset.contains(key) {
            problems.push(format!("{key} is both set and unset"));
            continue;
        }
        if let Some(entry) = manifest.user_config.get(key) {
            use crate::manifest::UserConfigType;
            let path_kind = matches!(entry.kind, UserConfigType::Directory | UserConfigType::File);
            // Checked before the value itself, so that an admitted user learns
            // nothing about paths it does not own (not even whether they exist).
            // Each value of a `multiple` key is a path of its own.
            let items = if entry.multiple {
                crate::manifest::stored_items(raw)
            } else {
                vec![raw.clone()]
            };
            if let Some(foreign) = items
                .iter()
                .find(|item| path_kind && !peer.may_use(std::path::Path::new(item.as_str())))
            {
                problems.push(format!("{key}: {}", peer.not_theirs("path", foreign)));
                continue;
            }
        }
        match manifest.check_user_value(key, raw) {
            Ok(value) => changes.push(Change::Set {
                key: key.clone(),
                value: Secret::new(value),
                sensitive: manifest.user_config[key].sensitive,
            }),
            Err(e) => problems.push(e),
        }
    }
    for key in unset {
        if manifest.user_config.contains_key(key) || stored.contains(key) {
            changes.push(Change::Unset(key.clone()));
        } else {
            problems.push(format!("{key} is neither a user_config key of bundle {:?} nor stored, so it cannot be unset", name));
        }
    }
    (problems, changes)
}

/// The manifest's keys with what is stored for each (values of sensitive
/// keys never leave the daemon).
async fn describe_keys(
    ctx: &Ctx,
    loaded: &LoadedManifest,
    workspace: &str,
    name: &str,
) -> Result<Vec<ConfigKey>, RpcError> {
    let values = ctx
        .shared
        .credentials_of(workspace, name, move |c, w, n| c.values(w, n))
        .await
        .map_err(internal)?;
    Ok(loaded
        .manifest
        .user_config
        .iter()
        .map(|(key, entry)| ConfigKey {
            key: key.clone(),
            title: entry.title.clone(),
            kind: match entry.kind {
                UserConfigType::String => "string",
                UserConfigType::Number => "number",
                UserConfigType::Boolean => "boolean",
                UserConfigType::Directory => "directory",
                UserConfigType::File => "file",
            }
            .to_string(),
            required: entry.required,
            sensitive: entry.sensitive,
            set: values.contains_key(key),
            has_default: entry.default.is_some(),
            value: values
                .get(key)
                .filter(|_| !entry.sensitive)
                .map(|v| v.expose().to_string()),
        })
        .collect())
}

/// How long an authorization-code flow waits for its redirect.
const AUTH_FLOW_TTL: Duration = Duration::from_secs(600);

fn internal(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(ErrorKind::Internal, e.to_string())
}

fn auth_failed(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(ErrorKind::AuthFailed, e.to_string())
}

/// The resolved remote plan of an installed remote bundle.
async fn remote_plan(ctx: &Ctx, workspace: &str, name: &str) -> Result<RemotePlan, RpcError> {
    let loaded = ctx.api.installed_manifest(workspace, name).await?;
    let values = ctx
        .shared
        .credentials_of(workspace, name, move |c, w, n| c.values(w, n))
        .await
        .map_err(internal)?;
    match loaded.manifest.plan(&loaded.dir, &values) {
        Ok(Plan::Remote(plan)) => Ok(plan),
        Ok(Plan::Stdio(_)) => Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!("bundle {name:?} is not a remote bundle; only remote bundles are authorized with `bundlevisor auth`"),
        )),
        Err(e) => Err(RpcError::new(
            ErrorKind::NeedsConfig,
            format!("bundle {name:?} cannot be authorized yet: {e}; set them with `bundlevisor configure {name}` first"),
        )),
    }
}

async fn stored_tokens(ctx: &Ctx, workspace: &str, name: &str) -> Result<TokenSet, RpcError> {
    Ok(ctx
        .shared
        .credentials_of(workspace, name, move |c, w, n| c.tokens(w, n))
        .await
        .map_err(internal)?
        .unwrap_or_default())
}

pub(super) async fn auth_begin(p: AuthBeginParams, ctx: &Ctx) -> Result<AuthBeginResult, RpcError> {
    bundle_actor(&p.workspace, &p.name)?;
    let redirect = url::Url::parse(&p.redirect_uri)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("redirect_uri: {e}")))?;
    if redirect.scheme() != "http"
        || !matches!(
            redirect.host_str(),
            Some("127.0.0.1" | "[::1]" | "localhost")
        )
    {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            "redirect_uri must be a loopback http URL (http://127.0.0.1:PORT/...)",
        ));
    }
    let plan = remote_plan(ctx, &p.workspace, &p.name).await?;
    let stored = stored_tokens(ctx, &p.workspace, &p.name).await?;
    let http = crate::oauth::http_client();
    let flow = crate::oauth::begin(&http, &plan, &stored, &p.redirect_uri)
        .await
        .map_err(auth_failed)?;
    let result = AuthBeginResult {
        authorization_url: flow.authorization_url.clone(),
        state: flow.state.clone(),
        expires_in_secs: AUTH_FLOW_TTL.as_secs(),
    };
    let mut pending = ctx
        .shared
        .pending_auth
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    pending.retain(|_, f| f.started.elapsed() < AUTH_FLOW_TTL);
    pending.insert(
        flow.state.clone(),
        PendingAuth {
            workspace: p.workspace.clone(),
            name: p.name.clone(),
            flow,
            started: std::time::Instant::now(),
        },
    );
    tracing::info!(workspace = %p.workspace, bundle = %p.name, "authorization flow started");
    Ok(result)
}

pub(super) async fn auth_complete(
    p: AuthCompleteParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let flow = ctx
        .shared
        .pending_auth
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&p.state)
        .filter(|f| f.started.elapsed() < AUTH_FLOW_TTL)
        .ok_or_else(|| {
            auth_failed("no authorization flow with this state (it expired after 10 minutes, was already used, or the redirect was forged); run `bundlevisor auth` again")
        })?;
    let (workspace, name) = (flow.workspace.clone(), flow.name.clone());
    if let Some(error) = &p.error {
        return Err(auth_failed(format!(
            "the authorization server refused: {error}{}",
            p.error_description
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        )));
    }
    let code = p
        .code
        .as_deref()
        .ok_or_else(|| auth_failed("the redirect carried no code"))?;
    bundle_actor(&workspace, &name)?;
    let lock = ctx.shared.configure_lock(&workspace, &name);
    let _serialized = lock.lock().await;
    let http = crate::oauth::http_client();
    let tokens = crate::oauth::complete(&http, &flow.flow, code, p.iss.as_deref())
        .await
        .map_err(auth_failed)?;
    {
        ctx.shared
            .credentials_of(&workspace, &name, move |c, w, n| {
                c.set_tokens(w, n, Some(&tokens))
            })
            .await
            .map_err(internal)?;
    }
    tracing::info!(workspace = %workspace, bundle = %name, "authorization completed; tokens stored");
    let bundle = ctx
        .api
        .respawn_and_wait(&workspace, &name, Respawn::Authorized, out.forwarding())
        .await?;
    Ok(BundleResult { bundle })
}
