//! Installing and removing bundles, and what the daemon knows of one: its
//! status and the manifest it runs.

use std::path::PathBuf;

use super::{limit, Api, ApiError};
use crate::daemon::bundle::BundleMsg;
use crate::daemon::supervisor::DaemonMsg;
use crate::manifest::LoadedManifest;
use crate::protocol::BundleStatus;
use crate::store::{InstallRecord, Origin};

impl Api {
    /// Installs the bundle at `path` in `workspace`; with `wait`, waits
    /// for the outcome of its start (each transition passed to `seen`),
    /// else answers with its status as soon as it is installed.
    pub async fn install<F: std::future::Future<Output = ()>>(
        &self,
        path: PathBuf,
        workspace: &str,
        origin: Origin,
        wait: bool,
        mut seen: impl FnMut(crate::daemon::board::Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        self.bare_names_free(&path, workspace).await?;
        // Subscribed before the install: no transition of its start is missed.
        let events = self.shared.board.subscribe();
        // An archive's unpack is told while the install is asked: its row
        // is named after the archive's file (the manifest is not read yet).
        let mut unpacks = self.shared.board.subscribe();
        let unpacked_as = crate::archive::is_archive(&path)
            .then(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .flatten();
        let ws = workspace.to_string();
        let asked = Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Install {
                path,
                workspace: ws,
                origin,
                reply,
            },
            limit::INSTALL,
            "the daemon",
        );
        tokio::pin!(asked);
        let record = loop {
            tokio::select! {
                record = &mut asked => break record??,
                Ok(event) = unpacks.recv(), if unpacked_as.is_some() => {
                    if event.kind == crate::protocol::EventKind::Unpacking
                        && event.workspace == workspace
                        && Some(&event.name) == unpacked_as.as_ref()
                    {
                        seen(event).await;
                    }
                }
            }
        };
        drop(unpacks);
        if !wait {
            // The bundle's actor may not have published its first status yet.
            return Ok(self
                .bundle_status(&record.workspace, &record.name)
                .unwrap_or_else(|| crate::daemon::expected_status(&record)));
        }
        self.wait_outcome(events, &record.workspace, &record.name, seen)
            .await
    }

    /// Refuses a bundle whose manifest lists a tool that another bundle of
    /// the workspace already has under the same name, when a profile with
    /// `names = "bare"` shows both. (A manifest that lists no tools, or an
    /// archive, is not checked here; the gateway then shows a shared name
    /// prefixed for both bundles.)
    async fn bare_names_free(
        &self,
        path: &std::path::Path,
        workspace: &str,
    ) -> Result<(), ApiError> {
        let bare: Vec<&crate::config::Profile> = self
            .shared
            .config
            .profiles
            .iter()
            .filter(|p| p.names == crate::config::NameMode::Bare)
            .collect();
        if bare.is_empty() || !path.is_dir() {
            return Ok(());
        }
        let source = path.to_path_buf();
        let Ok(Ok(loaded)) =
            tokio::task::spawn_blocking(move || crate::daemon::source::manifest_of(&source)).await
        else {
            return Ok(());
        };
        let name = loaded.manifest.name.clone();
        let declared: Vec<String> = serde_json::from_str::<serde_json::Value>(&loaded.text)
            .ok()
            .and_then(|m| m.get("tools").and_then(|t| t.as_array()).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_string))
            .collect();
        if declared.is_empty() {
            return Ok(());
        }
        let others = self.tools(workspace, None).await?;
        for profile in bare {
            let shows = |bundle: &str| {
                profile
                    .bundles
                    .as_ref()
                    .is_none_or(|b| b.iter().any(|x| x == bundle))
            };
            let hidden =
                |bundle: &str, tool: &str| profile.exclude_tools.iter().any(|t| t.is(bundle, tool));
            if !shows(&name) {
                continue;
            }
            for other in others.iter().filter(|o| o.name != name && shows(&o.name)) {
                let clash = declared.iter().find(|tool| {
                    !hidden(&name, tool)
                        && other
                            .tools
                            .iter()
                            .any(|t| t.name == tool.as_str() && !hidden(&other.name, tool))
                });
                if let Some(tool) = clash {
                    return Err(ApiError::InvalidParams(format!(
                        "profile {:?} shows tools under their own names (names = \"bare\"), and bundle {name:?} would show tool {tool:?}, which bundle {:?} already shows; hide one of them in the profile (exclude_tools), leave one bundle out of it, or use names = \"prefixed\"",
                        profile.name, other.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// What the status board shows of a bundle.
    pub fn bundle_status(&self, workspace: &str, name: &str) -> Option<BundleStatus> {
        self.shared.board.get(workspace, name)
    }

    /// Stops and removes a bundle; `purge`: its stored credentials and
    /// tokens go too, also when it is no longer installed (gone from its
    /// watched folder): then `Ok(false)`.
    pub async fn uninstall(
        &self,
        workspace: &str,
        name: &str,
        purge: bool,
    ) -> Result<bool, ApiError> {
        let (ws, n) = (workspace.to_string(), name.to_string());
        let installed = match Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Uninstall {
                workspace: ws,
                name: n,
                reply,
            },
            limit::UNINSTALL,
            "the uninstall",
        )
        .await?
        {
            Ok(()) => true,
            Err(crate::daemon::supervisor::InstallError::NotInstalled { .. }) if purge => false,
            Err(e) => return Err(e.into()),
        };
        if purge {
            let purged = self
                .shared
                .credentials_of(workspace, name, |c, w, n| c.purge(w, n))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            if !installed && purged == 0 {
                return Err(ApiError::not_found(workspace, name));
            }
            tracing::info!(
                workspace,
                bundle = name,
                "stored credentials and tokens purged"
            );
        }
        Ok(installed)
    }

    /// The bundles something is stored for, installed or (`orphaned`) not.
    pub async fn credentials_list(
        &self,
        workspace: Option<String>,
        orphaned: bool,
    ) -> Result<crate::protocol::StoredCredentials, ApiError> {
        let credentials = self.shared.credentials.clone();
        let (installs, stored) = self
            .shared
            .store
            .call(move |s| Ok((s.installs()?, credentials.stored()?)))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let bundles = stored
            .into_iter()
            .map(|s| crate::protocol::StoredBundle {
                installed: installs
                    .iter()
                    .any(|r| r.workspace == s.workspace && r.name == s.bundle),
                workspace: s.workspace,
                name: s.bundle,
                keys: s.keys,
                oauth_tokens: s.tokens,
            })
            .filter(|b| workspace.as_ref().is_none_or(|w| *w == b.workspace))
            .filter(|b| !(orphaned && b.installed))
            .collect();
        Ok(crate::protocol::StoredCredentials { bundles })
    }

    /// The manifest a bundle runs (the last good one: a broken file on
    /// disk does not change it); read from where it was installed before
    /// its first start.
    pub async fn running_manifest(
        &self,
        workspace: &str,
        name: &str,
    ) -> Result<LoadedManifest, ApiError> {
        let actor = Api::bundle_actor(workspace, name)?;
        let running = Api::ask(
            &actor,
            BundleMsg::Manifest,
            limit::ANSWER,
            "the bundle's actor",
        )
        .await?;
        match running {
            Some(running) => Ok(running),
            None => self.installed_manifest(workspace, name).await,
        }
    }

    /// The manifest of an installed bundle, read from where it was
    /// installed (with its owner's rights when an admitted user owns it; an
    /// archive's from its unpacked copy).
    pub async fn installed_manifest(
        &self,
        workspace: &str,
        name: &str,
    ) -> Result<LoadedManifest, ApiError> {
        let record = self.installed(workspace, name).await?;
        let config = self.shared.config.clone();
        // A watched archive's source is the `.mcpb` itself: its manifest is
        // read from the unpacked copy, as a start reads it.
        tokio::task::spawn_blocking(move || crate::daemon::source::load(&record.source, &config))
            .await
            .map_err(ApiError::unavailable)?
            .map_err(|e| ApiError::ManifestUnreadable {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }

    /// The install record of a bundle.
    pub async fn installed(&self, workspace: &str, name: &str) -> Result<InstallRecord, ApiError> {
        let (ws, n) = (workspace.to_string(), name.to_string());
        self.shared
            .store
            .call(move |s| s.get(&ws, &n))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .ok_or_else(|| ApiError::not_found(workspace, name))
    }
}
