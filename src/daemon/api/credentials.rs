//! A bundle's credentials: `configure` checks values against the
//! manifest's user_config, stores them sealed, respawns the bundle (through
//! its actor, and so the one connect function) and reports the outcome;
//! `auth_begin` and `auth_complete` are the operator-completed
//! authorization-code + PKCE flow of a remote bundle; `rotate_key` re-seals
//! every stored secret with a new key in one transaction.
//!
//! Calls on one bundle are serialized by [`Shared::configure_lock`], held
//! from validation to outcome, so two operators cannot interleave a store
//! and a respawn.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use super::{Api, ApiError};
use crate::daemon::admission::Peer;
use crate::daemon::board::Event;
use crate::daemon::bundle::Respawn;
use crate::daemon::{PendingAuth, Shared};
use crate::manifest::{LoadedManifest, Plan, RemotePlan, UserConfigType};
use crate::protocol::{
    AuthBeginParams, AuthBeginResult, AuthCompleteParams, BundleStatus, ConfigKey, ConfigureParams,
    ConfigureResult, RotateKeyResult,
};
use crate::secret::Secret;
use crate::store::{Change, TokenSet};

impl Api {
    /// Replaces the credential key: the new key is written to `KEY_FILE.new`
    /// first, every secret is re-sealed in one transaction, then the new file
    /// replaces the key file. A daemon stopped in between finishes (or undoes)
    /// it at its next start (`daemon::open_credentials`). Rotations run one at
    /// a time ([`Shared::key_rotation`](crate::daemon::Shared), held until the
    /// blocking work is done even if the caller goes away): two interleaved
    /// ones would leave one's key in the file and the other's in the store.
    pub async fn rotate_key(&self) -> Result<RotateKeyResult, ApiError> {
        use crate::store::crypto;
        let failed = ApiError::KeyRotationFailed;
        let settings = &self.shared.config.credentials;
        let Some(key_path) = crypto::key_path(settings, &self.shared.config.state_dir) else {
            return Err(failed(format!(
                "the credential key comes from environment variable {} ([credentials] key_env), which the daemon cannot change; to rotate, move the key into a key file ([credentials] key_file) first (docs/operations.md, runbook)",
                settings.key_env.as_deref().unwrap_or("?")
            )));
        };
        let credentials = self.shared.credentials.clone();
        let rotating = self.shared.key_rotation.clone().lock_owned().await;
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
        .map_err(ApiError::unavailable)??;
        Ok(result)
    }

    /// Stores `p`'s changes (checked against the manifest; an admitted
    /// `peer` may name only its own paths) and respawns the bundle, passing
    /// each transition of its start to `seen`; without changes, lists the keys.
    pub async fn configure<F: Future<Output = ()>>(
        &self,
        p: ConfigureParams,
        peer: Peer,
        seen: impl FnMut(Event) -> F,
    ) -> Result<ConfigureResult, ApiError> {
        Api::bundle_actor(&p.workspace, &p.name)?;
        let lock = self.shared.configure_lock(&p.workspace, &p.name);
        let _serialized = lock.lock().await;
        let loaded = self.running_manifest(&p.workspace, &p.name).await?;
        let stored: BTreeSet<String> = {
            self.shared
                .credentials_of(&p.workspace, &p.name, move |c, w, n| c.keys(w, n))
                .await
                .map_err(internal)?
                .into_iter()
                .map(|k| k.key)
                .collect()
        };

        // The values' checks look at the file system (a directory must exist,
        // a path must be the peer's): on the blocking pool.
        let (mut problems, mut changes) = {
            let (manifest, set, unset, peer, name) = (
                loaded.manifest.clone(),
                p.set.clone(),
                p.unset.clone(),
                peer,
                p.name.clone(),
            );
            tokio::task::spawn_blocking(move || {
                check_changes(&manifest, &set, &unset, &stored, peer, &name)
            })
            .await
            .map_err(internal)?
        };
        let owner = self.source_owner(&p.workspace, &p.name).await;
        let (ref_problems, ref_changes) =
            check_refs(&self.shared.secrets, &loaded.manifest, &p, (peer, owner)).await;
        problems.extend(ref_problems);
        changes.extend(ref_changes);
        if !problems.is_empty() {
            return Err(ApiError::InvalidConfigValue {
                message: format!(
                    "nothing was changed: {}; `bundlevisor configure {} -w {}` lists the keys",
                    problems.join("; "),
                    p.name,
                    p.workspace
                ),
                problems,
            });
        }

        if changes.is_empty() {
            let keys = describe_keys(&self.shared, &loaded, &p.workspace, &p.name).await?;
            return Ok(ConfigureResult {
                keys,
                bundle: None,
                notes: Vec::new(),
            });
        }
        let grants = self.shared.config.sandbox.for_bundle(&p.workspace, &p.name);
        let notes = ungranted_paths(&loaded.manifest, &p.set, grants);
        {
            self.shared
                .credentials_of(&p.workspace, &p.name, move |c, w, n| {
                    c.apply(w, n, &changes)
                })
                .await
                .map_err(internal)?;
        }
        tracing::info!(workspace = %p.workspace, bundle = %p.name, set = ?p.set.keys().collect::<Vec<_>>(), refs = ?p.refs, unset = ?p.unset, "user_config changed; respawning");
        let bundle = self
            .respawn_and_wait(&p.workspace, &p.name, Respawn::Reconfigured, seen)
            .await?;
        let keys = describe_keys(&self.shared, &loaded, &p.workspace, &p.name).await?;
        Ok(ConfigureResult {
            keys,
            bundle: Some(bundle),
            notes,
        })
    }

    /// The uid owning an installed bundle's source.
    async fn source_owner(&self, workspace: &str, name: &str) -> Option<u32> {
        let source = self.shared.board.get(workspace, name)?.source;
        crate::daemon::secret_watch::source_owner(std::path::Path::new(&source)).await
    }

    /// The resolved remote plan of an installed remote bundle.
    async fn remote_plan(&self, workspace: &str, name: &str) -> Result<RemotePlan, ApiError> {
        let loaded = self.installed_manifest(workspace, name).await?;
        // A client secret may be a reference: read now, as a start would.
        let owner = self.source_owner(workspace, name).await;
        let (values, _) = self
            .shared
            .user_values(workspace, name, owner)
            .await
            .map_err(|e| match &e {
                crate::daemon::secret_watch::ValuesError::Ref { error, .. } if error.transient => {
                    ApiError::unavailable(e.to_string())
                }
                _ => ApiError::NotConfigured(e.to_string()),
            })?;
        match loaded.manifest.plan(&loaded.dir, &values) {
            Ok(Plan::Remote(plan)) => Ok(plan),
            Ok(Plan::Stdio(_)) => Err(ApiError::InvalidParams(format!(
                "bundle {name:?} is not a remote bundle; only remote bundles are authorized with `bundlevisor auth`"
            ))),
            Err(e) => Err(ApiError::NotConfigured(format!(
                "bundle {name:?} cannot be authorized yet: {e}; set them with `bundlevisor configure {name}` first"
            ))),
        }
    }

    async fn stored_tokens(&self, workspace: &str, name: &str) -> Result<TokenSet, ApiError> {
        Ok(self
            .shared
            .credentials_of(workspace, name, move |c, w, n| c.tokens(w, n))
            .await
            .map_err(internal)?
            .unwrap_or_default())
    }

    /// Begins the authorization of a remote bundle: the URL to open, and the
    /// state its redirect must carry back to [`Api::auth_complete`].
    pub async fn auth_begin(&self, p: AuthBeginParams) -> Result<AuthBeginResult, ApiError> {
        Api::bundle_actor(&p.workspace, &p.name)?;
        let redirect = url::Url::parse(&p.redirect_uri)
            .map_err(|e| ApiError::InvalidParams(format!("redirect_uri: {e}")))?;
        if redirect.scheme() != "http"
            || !matches!(
                redirect.host_str(),
                Some("127.0.0.1" | "[::1]" | "localhost")
            )
        {
            return Err(ApiError::InvalidParams(
                "redirect_uri must be a loopback http URL (http://127.0.0.1:PORT/...)".into(),
            ));
        }
        let plan = self.remote_plan(&p.workspace, &p.name).await?;
        let stored = self.stored_tokens(&p.workspace, &p.name).await?;
        let http = crate::oauth::http_client();
        let flow = crate::oauth::begin(&http, &plan, &stored, &p.redirect_uri)
            .await
            .map_err(auth_failed)?;
        let result = AuthBeginResult {
            authorization_url: flow.authorization_url.clone(),
            state: flow.state.clone(),
            expires_in_secs: AUTH_FLOW_TTL.as_secs(),
        };
        let mut pending = self
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

    /// Completes an authorization with what its redirect carried: the tokens
    /// are stored and the bundle respawned, each transition of its start
    /// passed to `seen`.
    pub async fn auth_complete<F: Future<Output = ()>>(
        &self,
        p: AuthCompleteParams,
        seen: impl FnMut(Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        let flow = self
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
        Api::bundle_actor(&workspace, &name)?;
        let lock = self.shared.configure_lock(&workspace, &name);
        let _serialized = lock.lock().await;
        let http = crate::oauth::http_client();
        let tokens = crate::oauth::complete(&http, &flow.flow, code, p.iss.as_deref())
            .await
            .map_err(auth_failed)?;
        {
            self.shared
                .credentials_of(&workspace, &name, move |c, w, n| {
                    c.set_tokens(w, n, Some(&tokens))
                })
                .await
                .map_err(internal)?;
        }
        tracing::info!(workspace = %workspace, bundle = %name, "authorization completed; tokens stored");
        self.respawn_and_wait(&workspace, &name, Respawn::Authorized, seen)
            .await
    }
}

/// A note for each `string` value in `set` that names an absolute path
/// none of the bundle's `[[sandbox.bundle]]` paths (`grants`) covers: a
/// string is passed as text and never granted (only `directory` and
/// `file` values are), so a bundle that opens it would be refused by its
/// sandbox. The value itself is not quoted (it may be sensitive).
fn ungranted_paths(
    manifest: &crate::manifest::Manifest,
    set: &std::collections::BTreeMap<String, String>,
    grants: Option<&crate::config::SandboxOverride>,
) -> Vec<String> {
    use crate::manifest::UserConfigType;
    let granted = |path: &std::path::Path| {
        grants.is_some_and(|g| {
            (g.read_only_paths.iter())
                .chain(&g.read_write_paths)
                .any(|p| path.starts_with(p))
        })
    };
    set.iter()
        .filter(|(key, _)| {
            manifest
                .user_config
                .get(*key)
                .is_some_and(|e| e.kind == UserConfigType::String)
        })
        .filter(|(key, raw)| {
            let items = if manifest.user_config[*key].multiple {
                crate::manifest::stored_items(raw)
            } else {
                vec![raw.to_string()]
            };
            items.iter().any(|item| {
                let path = std::path::Path::new(item.trim());
                path.is_absolute() && !item.contains(char::is_whitespace) && !granted(path)
            })
        })
        .map(|(key, _)| {
            format!(
                "{key} is a string setting and its value looks like an absolute path: a string is passed to the bundle as text, never granted by its sandbox (only `directory` and `file` settings are); if the bundle must open it, add it to `read_only_paths` or `read_write_paths` of the bundle's [[sandbox.bundle]] (docs/operations.md, \"Configured folders\")"
            )
        })
        .collect()
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

/// Checks `p.refs`: each names a sensitive, single `string` key not also
/// set or unset, parses, is allowed for `peer` by the `[secrets]` rules
/// and resolves now (so that a reference that cannot work is refused
/// before anything is stored); every problem at once, or the changes.
async fn check_refs(
    sources: &crate::secret_ref::Sources,
    manifest: &crate::manifest::Manifest,
    p: &ConfigureParams,
    (peer, owner): (Peer, Option<u32>),
) -> (Vec<String>, Vec<Change>) {
    let (mut problems, mut changes) = (Vec::new(), Vec::new());
    for (key, text) in &p.refs {
        let Some(entry) = manifest.user_config.get(key) else {
            problems.push(format!(
                "{key} is not a user_config key of bundle {:?}",
                p.name
            ));
            continue;
        };
        if p.set.contains_key(key) || p.unset.contains(key) {
            problems.push(format!(
                "{key} is given both as a reference and set or unset"
            ));
            continue;
        }
        if !entry.sensitive || entry.multiple || entry.kind != UserConfigType::String {
            problems.push(format!(
                "{key}: only a sensitive, single string key takes a reference (set this one with {key}=VALUE)"
            ));
            continue;
        }
        let reference: crate::secret_ref::SecretRef = match text.parse() {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{key}: {e}"));
                continue;
            }
        };
        if let Err(e) = sources.resolve(&reference, peer.uid).await {
            problems.push(format!("{key}: {e}"));
            continue;
        }
        changes.push(Change::SetRef {
            key: key.clone(),
            reference: crate::store::StoredRef {
                reference: reference.to_string(),
                uid: peer.uid,
                owner,
            },
        });
    }
    (problems, changes)
}

/// The manifest's keys with what is stored for each (values of sensitive
/// keys never leave the daemon).
async fn describe_keys(
    shared: &Shared,
    loaded: &LoadedManifest,
    workspace: &str,
    name: &str,
) -> Result<Vec<ConfigKey>, ApiError> {
    let (values, refs) = shared
        .credentials_of(workspace, name, move |c, w, n| {
            Ok((c.values(w, n)?, c.refs(w, n)?))
        })
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
            set: values.contains_key(key) || refs.contains_key(key),
            has_default: entry.default.is_some(),
            value: values
                .get(key)
                .filter(|_| !entry.sensitive)
                .map(|v| v.expose().to_string()),
            reference: refs.get(key).map(|r| r.reference.clone()),
        })
        .collect())
}

/// How long an authorization-code flow waits for its redirect.
const AUTH_FLOW_TTL: Duration = Duration::from_secs(600);

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

fn auth_failed(e: impl std::fmt::Display) -> ApiError {
    ApiError::AuthFailed(e.to_string())
}
