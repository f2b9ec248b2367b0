//! What the daemon accepts from a watched folder without anyone vouching
//! for it (sshd's StrictModes, for bundles): the folder, each bundle folder
//! and each manifest must belong to the daemon's uid or root and must not be
//! writable by group or others — whoever can write them decides what the
//! daemon runs. Entries that are symbolic links are refused (a bundle is
//! dropped in, not linked in) — except a bare manifest linked to a file
//! inside the folder itself, as a Kubernetes ConfigMap volume has them —
//! and manifests are opened without following a link, so no file outside
//! the folder is ever read, let alone echoed.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Largest manifest read from a watched folder.
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// Whether `meta` (of `path`, a `what`) may be trusted.
fn check(what: &str, path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "{what} {} belongs to uid {}, not to the daemon's uid {me} or root; whoever owns it decides what the daemon runs. chown it to uid {me}",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{what} {} is writable by {} (mode {:o}); anyone who can write it decides what the daemon runs. Remove the write bits: chmod go-w {}",
            path.display(),
            if meta.mode() & 0o002 != 0 { "every user" } else { "its group" },
            meta.mode() & 0o7777,
            path.display()
        ));
    }
    Ok(())
}

/// Checks the watched folder itself.
pub fn folder(dir: &Path) -> Result<(), String> {
    let meta =
        std::fs::metadata(dir).map_err(|e| format!("watched folder {}: {e}", dir.display()))?;
    check("watched folder", dir, &meta)
}

/// Where the link `entry` (a bare manifest `NAME.json` in a watched
/// folder) leads, when it stays inside that folder and ends at a file:
/// a Kubernetes ConfigMap volume is laid out so (`NAME.json ->
/// ..data/NAME.json`, `..data -> ..TIMESTAMP`, swapped on each update).
/// Every folder on the way must pass the same checks as a bundle folder.
fn inside_link(entry: &Path) -> Option<std::path::PathBuf> {
    let folder = entry.parent()?.canonicalize().ok()?;
    let target = entry.canonicalize().ok()?;
    let within = target.strip_prefix(&folder).ok()?;
    if !target.is_file() {
        return None;
    }
    let mut on_the_way = folder.clone();
    for part in within.parent()?.components() {
        on_the_way.push(part);
        let meta = std::fs::symlink_metadata(&on_the_way).ok()?;
        check("folder", &on_the_way, &meta).ok()?;
    }
    Some(target)
}

/// Checks a `.mcpb` archive in a watched folder: a regular file (not a
/// link) that only the daemon's user (or root) may write.
pub fn archive(path: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "{} is a symbolic link; a watched folder takes bundles, not links to them: move or copy the archive in",
            path.display()
        ));
    }
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    check("archive", path, &meta)
}

/// Reads the manifest of the watched entry `entry` (a bundle folder or a
/// bare manifest file) after checking the entry, and the manifest itself
/// through the descriptor it is read from.
pub fn manifest_text(entry: &Path, manifest: &Path) -> Result<String, String> {
    let meta = std::fs::symlink_metadata(entry)
        .map_err(|e| format!("cannot read {}: {e}", entry.display()))?;
    if meta.file_type().is_symlink() {
        let target = inside_link(entry).ok_or_else(|| {
            format!(
                "{} is a symbolic link out of the watched folder; a watched folder takes bundles, not links to them: move or copy the bundle in",
                entry.display()
            )
        })?;
        return manifest_text(&target, &target);
    }
    if meta.is_dir() {
        check("bundle folder", entry, &meta)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(manifest)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => format!(
                "{} is a symbolic link; the manifest must be a file in the bundle",
                manifest.display()
            ),
            _ => format!("cannot read manifest {}: {e}", manifest.display()),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read manifest {}: {e}", manifest.display()))?;
    if !meta.is_file() {
        return Err(format!("manifest {} is not a file", manifest.display()));
    }
    check("manifest", manifest, &meta)?;
    let mut text = String::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read manifest {}: {e}", manifest.display()))?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(format!(
            "manifest {} is larger than {MAX_MANIFEST_BYTES} bytes",
            manifest.display()
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn writable_linked_or_foreign_entries_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        chmod(root, 0o755);
        assert!(folder(root).is_ok());
        chmod(root, 0o777);
        let err = folder(root).unwrap_err();
        assert!(err.contains("chmod go-w"), "{err}");
        chmod(root, 0o755);

        let b = root.join("b");
        std::fs::create_dir(&b).unwrap();
        chmod(&b, 0o755);
        let m = b.join("manifest.json");
        std::fs::write(&m, "{}").unwrap();
        chmod(&m, 0o644);
        assert_eq!(manifest_text(&b, &m).unwrap(), "{}");
        chmod(&m, 0o664);
        assert!(manifest_text(&b, &m).unwrap_err().contains("its group"));
        chmod(&m, 0o644);
        chmod(&b, 0o757);
        assert!(manifest_text(&b, &m).unwrap_err().contains("every user"));
        chmod(&b, 0o755);

        // A manifest linked to another file is never read.
        let secret = root.join("secret.json");
        std::fs::write(&secret, "{\"token\":\"SECRET-VALUE\"}").unwrap();
        std::fs::remove_file(&m).unwrap();
        std::os::unix::fs::symlink(&secret, &m).unwrap();
        let err = manifest_text(&b, &m).unwrap_err();
        assert!(
            err.contains("symbolic link") && !err.contains("SECRET"),
            "{err}"
        );
        // Nor is a linked-in bundle folder.
        let linked = root.join("linked");
        std::os::unix::fs::symlink(&b, &linked).unwrap();
        let err = manifest_text(&linked, &linked.join("manifest.json")).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");

        if nix::unistd::geteuid().is_root() {
            // A manifest owned by someone else.
            let other = root.join("other.json");
            std::fs::write(&other, "{}").unwrap();
            nix::unistd::chown(&other, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let err = manifest_text(&other, &other).unwrap_err();
            assert!(err.contains("belongs to uid 65534"), "{err}");
        }
    }
}
