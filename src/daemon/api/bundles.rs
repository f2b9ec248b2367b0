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
        seen: impl FnMut(crate::daemon::board::Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        // Subscribed before the install: no transition of its start is missed.
        let events = self.shared.board.subscribe();
        let workspace = workspace.to_string();
        let record = Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Install {
                path,
                workspace,
                origin,
                reply,
            },
            limit::INSTALL,
            "the daemon",
        )
        .await??;
        if !wait {
            // The bundle's actor may not have published its first status yet.
            return Ok(self
                .bundle_status(&record.workspace, &record.name)
                .unwrap_or_else(|| crate::daemon::expected_status(&record)));
        }
        self.wait_outcome(events, &record.workspace, &record.name, seen)
            .await
    }

    /// What the status board shows of a bundle.
    pub fn bundle_status(&self, workspace: &str, name: &str) -> Option<BundleStatus> {
        self.shared.board.get(workspace, name)
    }

    /// Stops and removes a bundle; `purge`: its stored credentials and
    /// tokens go too.
    pub async fn uninstall(
        &self,
        workspace: &str,
        name: &str,
        purge: bool,
    ) -> Result<(), ApiError> {
        let (ws, n) = (workspace.to_string(), name.to_string());
        Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Uninstall {
                workspace: ws,
                name: n,
                reply,
            },
            limit::UNINSTALL,
            "the uninstall",
        )
        .await??;
        if purge {
            self.shared
                .credentials_of(workspace, name, |c, w, n| c.purge(w, n))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            tracing::info!(
                workspace,
                bundle = name,
                "stored credentials and tokens purged"
            );
        }
        Ok(())
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
    /// installed (with its owner's rights when an admitted user owns it).
    pub async fn installed_manifest(
        &self,
        workspace: &str,
        name: &str,
    ) -> Result<LoadedManifest, ApiError> {
        let record = self.installed(workspace, name).await?;
        tokio::task::spawn_blocking(move || crate::daemon::source::manifest_of(&record.source))
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
