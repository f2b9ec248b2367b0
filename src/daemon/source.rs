//! Where an install's files come from: a bundle folder, a bare manifest
//! file, or a `.mcpb` archive, unpacked into the state dir first (see
//! [`crate::archive`]). Blocking: run on the blocking pool.

use std::path::Path;

use crate::archive::{self, ArchiveError};
use crate::config::Config;
use crate::manifest::{LoadedManifest, ManifestError};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

impl SourceError {
    /// The source is not there (any more): a folder or archive deleted.
    pub fn is_gone(&self) -> bool {
        let io = match self {
            SourceError::Archive(ArchiveError::Io { source, .. }) => source,
            SourceError::Manifest(ManifestError::Io { source, .. }) => source,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::NotFound
    }
}

/// Reads and validates the manifest at `source`; an archive is unpacked
/// (or found unpacked) and its folder becomes the bundle's.
pub fn load(source: &Path, config: &Config) -> Result<LoadedManifest, SourceError> {
    if archive::is_archive(source) {
        let root = archive::root(&config.state_dir);
        let trust = archive::Trust {
            policy: config.bundles.signatures,
            anchors: config.bundles.trusted_certs.clone(),
        };
        let unpacked = archive::unpack(source, &root, &config.archives.limits(), &trust)?;
        return Ok(crate::manifest::load(&unpacked.dir)?);
    }
    Ok(crate::manifest::load(source)?)
}

/// Whether `source` is an archive (the bundle folder is then its unpacked copy).
pub fn is_archive(source: &Path) -> bool {
    archive::is_archive(source)
}
