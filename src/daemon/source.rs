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
    load_with(source, config, &mut |_, _| {})
}

/// [`load`], telling an unpack's progress (entries written, entries in
/// all) to `progress` (see [`archive::unpack`]).
pub fn load_with(
    source: &Path,
    config: &Config,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LoadedManifest, SourceError> {
    if archive::is_archive(source) {
        let root = archive::root(&config.state_dir);
        let trust = archive::Trust {
            policy: config.bundles.signatures,
            anchors: config.bundles.trusted_certs.clone(),
        };
        let limits = config.archives.limits();
        let unpacked = archive::unpack(source, &root, &limits, &trust, progress)?;
        return Ok(crate::manifest::load(&unpacked.dir)?);
    }
    Ok(manifest_of(source)?)
}

/// The text of `file`, which must be a regular file (not a link, a FIFO or
/// a device) of at most [`super::trusted::MAX_MANIFEST_BYTES`].
fn read_plain_file(file: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(file)?;
    if !opened.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a manifest must be a file in the bundle folder)",
        ));
    }
    let mut text = String::new();
    opened
        .take(super::trusted::MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > super::trusted::MAX_MANIFEST_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} bytes", super::trusted::MAX_MANIFEST_BYTES),
        ));
    }
    Ok(text)
}

/// Reads and validates the manifest of a bundle folder (or a bare manifest
/// file). In a folder another user owns (an admitted user installed it),
/// the manifest is read with that user's rights, at install and at every
/// start: a manifest that user later links elsewhere, or makes a FIFO or a
/// device, is refused unread, and nothing of another file is quoted in an
/// error, `last_error` or the log.
pub fn manifest_of(source: &Path) -> Result<LoadedManifest, ManifestError> {
    let file = crate::manifest::manifest_file(source);
    let folder = file.parent().unwrap_or(Path::new("/"));
    let Some(owner) = crate::bundle::sandbox::folder_owner(folder) else {
        return crate::manifest::load(source);
    };
    let text = crate::bundle::sandbox::as_user(owner, || read_plain_file(&file))
        .unwrap_or_else(|| {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("cannot take the rights of uid {owner}, the folder's owner, to read it"),
            ))
        })
        .map_err(|source| ManifestError::Io {
            path: file.clone(),
            source,
        })?;
    crate::manifest::from_text(file, &text)
}

/// Whether `source` is an archive (the bundle folder is then its unpacked copy).
pub fn is_archive(source: &Path) -> bool {
    archive::is_archive(source)
}
