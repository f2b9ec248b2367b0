//! Installing and removing bundles, and what the daemon knows of one: its
//! status and the manifest it runs.

use std::path::PathBuf;

use super::{limit, Api, ApiError};
use crate::daemon::bundle::{same_archive, BundleMsg};
use crate::daemon::supervisor::{install, DaemonMsg, InstallError};
use crate::daemon::workspace::WorkspaceMsg;
use crate::manifest::LoadedManifest;
use crate::protocol::{BundleState, BundleStatus, EventKind};
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
        let ws = workspace.to_string();
        let asked = Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Install {
                path: path.clone(),
                workspace: ws,
                origin,
                reply,
            },
            limit::INSTALL,
            "the daemon",
        );
        let record = self.unpacking(&path, workspace, asked, &mut seen).await??;
        if !wait {
            // The bundle's actor may not have published its first status yet.
            return Ok(self
                .bundle_status(&record.workspace, &record.name)
                .unwrap_or_else(|| crate::daemon::expected_status(&record)));
        }
        self.wait_outcome(events, &record.workspace, &record.name, seen)
            .await
    }

    /// Awaits `work` on the bundle at `path`, passing the unpack of an
    /// archive to `seen` as it goes: its row is named after the archive's
    /// file (the manifest is not read yet).
    async fn unpacking<T, F: std::future::Future<Output = ()>>(
        &self,
        path: &std::path::Path,
        workspace: &str,
        work: impl std::future::Future<Output = T>,
        seen: &mut impl FnMut(crate::daemon::board::Event) -> F,
    ) -> T {
        let mut unpacks = self.shared.board.subscribe();
        let unpacked_as = crate::archive::is_archive(path)
            .then(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .flatten();
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return done,
                Ok(event) = unpacks.recv(), if unpacked_as.is_some() => {
                    if event.kind == EventKind::Unpacking
                        && event.workspace == workspace
                        && Some(&event.name) == unpacked_as.as_ref()
                    {
                        seen(event).await;
                    }
                }
            }
        }
    }

    /// Runs a new version of an installed bundle in its place. The bundle
    /// at `path` (a folder, or a `.mcpb` that runs from its unpacked copy)
    /// is checked as an install is; its manifest names the bundle, which
    /// must be `expect` when given, installed by an operator (a watched
    /// folder decides its bundles' versions). The install then points at
    /// it, and the bundle restarts with it (a uv bundle's environment is
    /// built first, while the running version serves; a build that fails
    /// leaves that version running). With `wait`, waits for the outcome,
    /// each transition passed to `seen`. The very archive that runs,
    /// given again, changes nothing.
    pub async fn upgrade<F: std::future::Future<Output = ()>>(
        &self,
        path: PathBuf,
        workspace: &str,
        expect: Option<&str>,
        wait: bool,
        mut seen: impl FnMut(crate::daemon::board::Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        self.known_workspace(workspace)?;
        self.bare_names_free(&path, workspace).await?;
        let ws = self.workspace(workspace).await?;
        let checking = install::checked(&self.shared, path.clone(), workspace, Origin::Cli);
        let (source, loaded) = self
            .unpacking(&path, workspace, checking, &mut seen)
            .await?;
        let name = loaded.manifest.name.clone();
        if let Some(expected) = expect.filter(|e| **e != name) {
            return Err(InstallError::OtherBundle {
                expected: expected.to_string(),
                found: name,
            }
            .into());
        }
        // One change of a bundle at a time: upgrades, `configure`, `auth`.
        let lock = self.shared.configure_lock(workspace, &name);
        let _serialized = lock.lock().await;
        let (w, n) = (workspace.to_string(), name.clone());
        let record = self
            .shared
            .store
            .call(move |s| s.get(&w, &n))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .ok_or_else(|| InstallError::NotInstalledToUpgrade {
                workspace: workspace.to_string(),
                name: name.clone(),
            })?;
        if record.origin == Origin::Watch {
            return Err(InstallError::WatchedUpgrade {
                name,
                source_path: record.source.display().to_string(),
            }
            .into());
        }
        // The very archive that runs, and the install already from it (not
        // a way back from an upgrade still being built: that one is sent,
        // and the actor drops the build).
        let running = self.running_manifest(workspace, &name).await.ok();
        if let Some(status) = self
            .bundle_status(workspace, &name)
            .filter(|s| s.state == BundleState::Ready && record.source == source)
            .filter(|_| running.is_some_and(|r| same_archive(&r, &loaded)))
        {
            tracing::info!(workspace, bundle = %name, "the archive given to upgrade is the one running: nothing to do");
            return Ok(status);
        }
        if record.source != source {
            // Only if it is still this install (not uninstalled and
            // installed again since it was read).
            let (w, n, from, to) = (
                workspace.to_string(),
                name.clone(),
                record.source.clone(),
                source.clone(),
            );
            let moved = self
                .shared
                .store
                .call(move |store| store.set_source(&w, &n, (&from, &to)))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            if !moved {
                return Err(InstallError::Moved { name }.into());
            }
        }
        // Subscribed before the upgrade: no transition of its start is missed.
        let events = self.shared.board.subscribe();
        let version = loaded.manifest.version.clone();
        let taken = Api::ask(
            &ws,
            |reply| WorkspaceMsg::Upgrade {
                name: name.clone(),
                source: source.clone(),
                manifest: Box::new(loaded),
                reply,
            },
            limit::ANSWER,
            "the workspace",
        )
        .await?;
        if !taken {
            // Being uninstalled: its record goes with it.
            return Err(InstallError::Moved { name }.into());
        }
        tracing::info!(workspace, bundle = %name, source = %source.display(), "bundle upgraded to version {version}");
        // The copy it ran from goes once nothing runs it (after a grace).
        crate::daemon::supervisor::collect_archives_soon(self.shared.clone());
        if !wait {
            return Ok(self
                .bundle_status(workspace, &name)
                .unwrap_or_else(|| crate::daemon::expected_status(&record)));
        }
        self.wait_outcome(events, workspace, &name, seen).await
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
