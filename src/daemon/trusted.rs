//! What the daemon accepts from a watched folder without anyone vouching
//! for it (sshd's StrictModes, for bundles): the folder, each bundle folder
//! and each manifest must belong to the daemon's uid or root and must not be
//! writable by group or others (unless nobody can write them from here: a
//! read-only mount, see [`unwritable_here`]) — whoever can write them
//! decides what the daemon runs. Entries that are symbolic links are refused (a bundle is
//! dropped in, not linked in) — except a bare manifest linked to a file
//! inside the folder itself, as a Kubernetes ConfigMap volume has them —
//! and manifests are opened without following a link, so no file outside
//! the folder is ever read, let alone echoed.
//!
//! The same rule holds for everything a bundle runs from, at install and
//! at every start ([`may_run`]): every file and folder of the bundle
//! folder ([`tree`]; for one installed by path its owner may own them
//! too), and under `[bundles] signatures = "require"` an archive's
//! signature judged again, or a folder refused unless exempted.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::config::Config;
use crate::manifest::LoadedManifest;

/// Largest manifest read from a watched folder.
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// How a watched folder's entries are judged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trust {
    /// The operator vouches for the folder as a read-only volume that only
    /// its platform writes (`[[watch]] read_only_volume = true`: a
    /// Kubernetes ConfigMap volume): write bits do not count where nobody
    /// can write from here ([`unwritable_here`]).
    pub read_only_volume: bool,
}

/// Whether `meta` (of `path`, a `what`) may be trusted.
fn check(what: &str, path: &Path, meta: &std::fs::Metadata, trust: Trust) -> Result<(), String> {
    check_owned(what, path, meta, trust, None)
}

/// [`check`], where the uid `also` (the owner of a bundle folder the
/// operator installed by path) may own it too.
fn check_owned(
    what: &str,
    path: &Path,
    meta: &std::fs::Metadata,
    trust: Trust,
    also: Option<u32>,
) -> Result<(), String> {
    check_in(what, path, meta, trust, also, None)
}

/// [`check_owned`] of an entry below the bundle folder `within`, which
/// the fix for write bits names too (one command for the whole tree).
fn check_in(
    what: &str,
    path: &Path,
    meta: &std::fs::Metadata,
    trust: Trust,
    also: Option<u32>,
    within: Option<&Path>,
) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 && Some(meta.uid()) != also {
        let (owners, to) = match also.filter(|o| *o != me && *o != 0) {
            Some(owner) => (
                format!("uid {owner} (the bundle folder's owner), the daemon's uid {me} or root"),
                owner,
            ),
            None => (format!("the daemon's uid {me} or root"), me),
        };
        return Err(format!(
            "{what} {} belongs to uid {}, not to {owners}; whoever owns it decides what the daemon runs. chown it to uid {to}",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    let whole = within
        .map(|dir| {
            format!(
                " (the whole bundle at once: chmod -R go-w {})",
                dir.display()
            )
        })
        .unwrap_or_default();
    if trust.read_only_volume {
        match mount_id(path) {
            Some(id) if unwritable_here(path, id) => return Ok(()),
            Some(_) => {}
            None => {
                return Err(format!(
                    "{what} {} is writable by others (mode {:o}) and read_only_volume is set, but this kernel does not say which mount it is on (statx STATX_MNT_ID, Linux 5.8 or later), so whether anyone can write it cannot be checked. Run on Linux 5.8+, or remove the write bits: chmod go-w {}",
                    path.display(),
                    meta.mode() & 0o7777,
                    path.display()
                ))
            }
        }
    }
    Err(format!(
        "{what} {} is writable by {} (mode {:o}); anyone who can write it decides what the daemon runs. Remove the write bits: chmod go-w {}{whole}",
        path.display(),
        if meta.mode() & 0o002 != 0 { "every user" } else { "its group" },
        meta.mode() & 0o7777,
        path.display()
    ))
}

/// Whether nobody can write `path` in the daemon's mount namespace,
/// whatever its mode says: the mount it is on (by the kernel's own
/// `statx` mount id, so a mount covered by a later one is never taken
/// for it) is read-only, and no read-write mount of the same filesystem
/// shows it at or above. A Kubernetes ConfigMap volume is such a folder:
/// kubelet makes its root 0777 and mounts it read-only, and only kubelet,
/// outside the pod, changes it. Who may write the volume's source outside
/// this namespace cannot be seen from here, which is why this applies
/// only where the operator vouches for the folder ([`Trust`]).
fn unwritable_here(path: &Path, mount_id: u64) -> bool {
    let (Ok(path), Ok(table)) = (
        path.canonicalize(),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    unwritable_in(&table, mount_id, &path)
}

/// The id of the mount `path` is on (Linux 5.8+), as mountinfo numbers it.
fn mount_id(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx fills the zeroed buffer; both outlive the call.
    let mut buf: nix::libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        nix::libc::statx(
            nix::libc::AT_FDCWD,
            c.as_ptr(),
            0,
            nix::libc::STATX_MNT_ID,
            &mut buf,
        )
    };
    (rc == 0 && buf.stx_mask & nix::libc::STATX_MNT_ID != 0).then_some(buf.stx_mnt_id)
}

/// [`unwritable_here`] against a `/proc/self/mountinfo` text, for `path`
/// on the mount numbered `id`.
fn unwritable_in(mountinfo: &str, id: u64, path: &Path) -> bool {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let Some(on) = mounts.iter().find(|m| m.id == id) else {
        return false;
    };
    if !on.read_only {
        return false;
    }
    if on.fs_read_only {
        return true;
    }
    let Ok(below) = path.strip_prefix(&on.point) else {
        return false;
    };
    let inside = on.root.join(below);
    !mounts
        .iter()
        .any(|m| m.device == on.device && !m.read_only && inside.starts_with(&m.root))
}

/// A line of `/proc/self/mountinfo` (proc(5)), as far as [`unwritable_in`]
/// needs it.
struct Mount {
    id: u64,
    /// `major:minor` of the filesystem.
    device: String,
    /// The folder of the filesystem mounted here.
    root: std::path::PathBuf,
    point: std::path::PathBuf,
    /// This mount is read-only.
    read_only: bool,
    /// The filesystem itself is read-only (every mount of it).
    fs_read_only: bool,
}

impl Mount {
    fn parse(line: &str) -> Option<Mount> {
        let (mine, fs) = line.split_once(" - ")?;
        let f: Vec<&str> = mine.split(' ').collect();
        let ro = |options: &str| options.split(',').any(|o| o == "ro");
        Some(Mount {
            id: f.first()?.parse().ok()?,
            device: f.get(2)?.to_string(),
            root: unescape(f.get(3)?).into(),
            point: unescape(f.get(4)?).into(),
            read_only: ro(f.get(5)?),
            fs_read_only: ro(fs.split(' ').nth(2)?),
        })
    }
}

/// mountinfo writes a space, tab, newline and backslash in a path as
/// `\040`, `\011`, `\012` and `\134`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Checks the watched folder itself.
pub fn folder(dir: &Path, trust: Trust) -> Result<(), String> {
    let meta =
        std::fs::metadata(dir).map_err(|e| format!("watched folder {}: {e}", dir.display()))?;
    check("watched folder", dir, &meta, trust)
}

/// Where the link `entry` (a bare manifest `NAME.json` in a watched
/// folder) leads, when it stays inside that folder and ends at a file:
/// a Kubernetes ConfigMap volume is laid out so (`NAME.json ->
/// ..data/NAME.json`, `..data -> ..TIMESTAMP`, swapped on each update).
/// Every folder on the way must pass the same checks as a bundle folder.
/// Otherwise why not, with the fix.
fn inside_link(entry: &Path, trust: Trust) -> Result<std::path::PathBuf, String> {
    let refused = |why: String| {
        format!(
            "{} is a symbolic link {why}; a watched folder takes bundles, not links to them (only a manifest linked to a file inside the folder, as in a Kubernetes ConfigMap volume): move or copy the bundle in",
            entry.display()
        )
    };
    let folder = entry
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .ok_or_else(|| refused("whose folder cannot be resolved".into()))?;
    let target = entry
        .canonicalize()
        .map_err(|e| refused(format!("that leads nowhere ({e})")))?;
    let Ok(within) = target.strip_prefix(&folder) else {
        return Err(refused(format!(
            "to {}, out of the watched folder",
            target.display()
        )));
    };
    if !target.is_file() {
        return Err(refused(format!(
            "to {}, which is not a file",
            target.display()
        )));
    }
    let mut on_the_way = folder.clone();
    for part in within.parent().into_iter().flat_map(Path::components) {
        on_the_way.push(part);
        let meta = std::fs::symlink_metadata(&on_the_way)
            .map_err(|e| refused(format!("through {}: {e}", on_the_way.display())))?;
        check("folder", &on_the_way, &meta, trust).map_err(|why| {
            format!(
                "{} is a symbolic link through an untrusted folder: {why}",
                entry.display()
            )
        })?;
    }
    Ok(target)
}

/// Checks a `.mcpb` archive in a watched folder: a regular file (not a
/// link) that only the daemon's user (or root) may write.
pub fn archive(path: &Path, trust: Trust) -> Result<(), String> {
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
    check("archive", path, &meta, trust)
}

/// Reads the manifest of the watched entry `entry` (a bundle folder or a
/// bare manifest file) after checking the entry, and the manifest itself
/// through the descriptor it is read from.
pub fn manifest_text(entry: &Path, manifest: &Path, trust: Trust) -> Result<String, String> {
    let meta = std::fs::symlink_metadata(entry)
        .map_err(|e| format!("cannot read {}: {e}", entry.display()))?;
    if meta.file_type().is_symlink() {
        let target = inside_link(entry, trust)?;
        return manifest_text(&target, &target, trust);
    }
    if meta.is_dir() {
        check("bundle folder", entry, &meta, trust)?;
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
    check("manifest", manifest, &meta, trust)?;
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

/// How a bundle came to be installed, as far as trusting its files goes.
#[derive(Debug, Clone)]
pub enum Installed {
    /// From the watched folder `dir`: it and everything the bundle runs
    /// from must be the daemon's or root's.
    Watched {
        dir: std::path::PathBuf,
        trust: Trust,
    },
    /// By path (`bundlevisor install PATH`): the operator chose the folder,
    /// so its owner may own what is in it too — nobody else.
    ByPath,
}

impl Installed {
    /// The `[[watch]]` folder that holds `source` (an install's source), or
    /// [`Installed::ByPath`].
    pub fn of(source: &Path, config: &Config) -> Installed {
        let parent = source.parent();
        config
            .watch
            .iter()
            .find(|w| parent.is_some() && w.dir.canonicalize().ok().as_deref() == parent)
            .map_or(Installed::ByPath, |w| Installed::Watched {
                dir: parent.unwrap_or(&w.dir).to_path_buf(),
                trust: Trust {
                    read_only_volume: w.read_only_volume,
                },
            })
    }
}

/// Checks `dir` and every file and folder below it (links are not
/// followed: where they lead is judged by the sandbox and the archive
/// rules) the way a watched bundle folder is checked: owned by the daemon's
/// uid or root — or, for a folder installed by path, by the folder's own
/// owner — and writable by nobody else. Whoever can write any of them
/// decides what the bundle runs, with the bundle's secrets. Every entry is
/// looked at: a folder that cannot be read cannot be checked, and is
/// refused.
pub fn tree(dir: &Path, installed: &Installed) -> Result<(), String> {
    let (trust, watched) = match installed {
        Installed::Watched { trust, .. } => (*trust, true),
        Installed::ByPath => (Trust::default(), false),
    };
    let top = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read the bundle folder {}: {e}", dir.display()))?;
    let also = (!watched).then_some(top.uid());
    check_owned("bundle folder", dir, &top, trust, also)?;
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let unreadable = |e: std::io::Error| {
            format!(
                "cannot read {} of the bundle folder {} ({e}), so who may write what is in it cannot be checked",
                folder.display(),
                dir.display()
            )
        };
        for entry in std::fs::read_dir(&folder).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            let meta = entry.metadata().map_err(unreadable)?;
            if meta.file_type().is_symlink() {
                continue;
            }
            let what = if meta.is_dir() { "folder" } else { "file" };
            check_in(what, &entry.path(), &meta, trust, also, Some(dir))?;
            if meta.is_dir() {
                folders.push(entry.path());
            }
        }
    }
    Ok(())
}

/// Whether the daemon may run `loaded` (installed from `source`), checked
/// at install and again at every start (boot reload, restart, upgrade): the
/// files it runs from pass [`tree`] (a watched folder's bundle: the folder
/// too), and under `[bundles] signatures = "require"` it comes from an
/// archive whose signature chains to `trusted_certs` today, or is a folder
/// or manifest file the operator exempted (`allow_unsigned_folders`).
/// Blocking: walks the bundle folder.
pub fn may_run(loaded: &LoadedManifest, source: &Path, config: &Config) -> Result<(), String> {
    use crate::archive::{judge_unpacked, unpacked_sha, SignaturePolicy};
    use crate::manifest::Transport;
    let remote = matches!(loaded.manifest.transport, Transport::Remote(_));
    let name = &loaded.manifest.name;
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let archives = canonical(&crate::archive::root(&config.state_dir));
    let dir = canonical(&loaded.dir);
    let unpacked =
        dir.parent() == Some(archives.as_path()) && unpacked_sha(&dir, &archives).is_some();
    // Signatures: on archives only; a remote bundle runs nothing here.
    if unpacked {
        let trust = crate::archive::Trust {
            policy: config.bundles.signatures,
            anchors: config.bundles.trusted_certs.clone(),
        };
        judge_unpacked(&dir, &trust)
            .map_err(|why| format!("bundle {name:?} may not run: {why}"))?;
    } else if !remote
        && config.bundles.signatures == SignaturePolicy::Require
        && !config.bundles.allow_unsigned_folders
    {
        let what = if loaded.is_bare() {
            "a manifest file"
        } else {
            "a bundle folder"
        };
        return Err(format!(
            "bundle {name:?} comes from {what} ({}), which cannot be signed (MCPB signatures are on .mcpb archives), and [bundles] signatures = \"require\"; install it as an archive signed with `mcpb sign`, or let folders and manifest files run unsigned with [bundles] allow_unsigned_folders = true",
            source.display()
        ));
    }
    let installed = Installed::of(source, config);
    if let Installed::Watched { dir, trust } = &installed {
        folder(dir, *trust)?;
    }
    // An unpacked archive is the daemon's own copy (its modes masked to
    // 0755 at most, in the state dir).
    if unpacked {
        return Ok(());
    }
    if loaded.is_bare() {
        let trust = match &installed {
            Installed::Watched { trust, .. } => *trust,
            Installed::ByPath => Trust::default(),
        };
        let meta = std::fs::metadata(&loaded.file)
            .map_err(|e| format!("cannot read manifest {}: {e}", loaded.file.display()))?;
        let also = matches!(installed, Installed::ByPath).then_some(meta.uid());
        return check_owned("manifest", &loaded.file, &meta, trust, also);
    }
    tree(&loaded.dir, &installed)
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
        assert!(folder(root, Trust::default()).is_ok());
        chmod(root, 0o777);
        let err = folder(root, Trust::default()).unwrap_err();
        assert!(err.contains("chmod go-w"), "{err}");
        chmod(root, 0o755);

        let b = root.join("b");
        std::fs::create_dir(&b).unwrap();
        chmod(&b, 0o755);
        let m = b.join("manifest.json");
        std::fs::write(&m, "{}").unwrap();
        chmod(&m, 0o644);
        assert_eq!(manifest_text(&b, &m, Trust::default()).unwrap(), "{}");
        chmod(&m, 0o664);
        assert!(manifest_text(&b, &m, Trust::default())
            .unwrap_err()
            .contains("its group"));
        chmod(&m, 0o644);
        chmod(&b, 0o757);
        assert!(manifest_text(&b, &m, Trust::default())
            .unwrap_err()
            .contains("every user"));
        chmod(&b, 0o755);

        // A manifest linked to another file is never read.
        let secret = root.join("secret.json");
        std::fs::write(&secret, "{\"token\":\"SECRET-VALUE\"}").unwrap();
        std::fs::remove_file(&m).unwrap();
        std::os::unix::fs::symlink(&secret, &m).unwrap();
        let err = manifest_text(&b, &m, Trust::default()).unwrap_err();
        assert!(
            err.contains("symbolic link") && !err.contains("SECRET"),
            "{err}"
        );
        // Nor is a linked-in bundle folder.
        let linked = root.join("linked");
        std::os::unix::fs::symlink(&b, &linked).unwrap();
        let err =
            manifest_text(&linked, &linked.join("manifest.json"), Trust::default()).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");

        // A bare manifest linked inside the folder (a ConfigMap's layout)
        // is read; every other link is refused with its reason.
        let data = root.join("..2026_11_25.1");
        std::fs::create_dir(&data).unwrap();
        chmod(&data, 0o755);
        std::fs::write(data.join("k.json"), "{\"k\":1}").unwrap();
        chmod(&data.join("k.json"), 0o644);
        std::os::unix::fs::symlink("..2026_11_25.1", root.join("..data")).unwrap();
        let key = root.join("k.json");
        std::os::unix::fs::symlink("..data/k.json", &key).unwrap();
        assert_eq!(
            manifest_text(&key, &key, Trust::default()).unwrap(),
            "{\"k\":1}"
        );
        chmod(&data, 0o777);
        let err = manifest_text(&key, &key, Trust::default()).unwrap_err();
        assert!(
            err.contains("through an untrusted folder") && err.contains("chmod go-w"),
            "{err}"
        );
        chmod(&data, 0o755);
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("o.json"), "{}").unwrap();
        let out = root.join("o.json");
        std::os::unix::fs::symlink(outside.path().join("o.json"), &out).unwrap();
        let err = manifest_text(&out, &out, Trust::default()).unwrap_err();
        assert!(err.contains("out of the watched folder"), "{err}");
        let nowhere = root.join("gone.json");
        std::os::unix::fs::symlink("..data/gone.json", &nowhere).unwrap();
        let err = manifest_text(&nowhere, &nowhere, Trust::default()).unwrap_err();
        assert!(err.contains("leads nowhere"), "{err}");
        let err = manifest_text(&linked, &linked, Trust::default()).unwrap_err();
        assert!(err.contains("which is not a file"), "{err}");

        if nix::unistd::geteuid().is_root() {
            // A manifest owned by someone else.
            let other = root.join("other.json");
            std::fs::write(&other, "{}").unwrap();
            nix::unistd::chown(&other, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let err = manifest_text(&other, &other, Trust::default()).unwrap_err();
            assert!(err.contains("belongs to uid 65534"), "{err}");
        }
    }

    /// A pod's mount table (trimmed from a real one): the container's
    /// root, a ConfigMap volume and `/etc/hosts` from kubelet's folder on
    /// the node's disk (8:1), a PVC on the same disk.
    const POD: &str = "\
1251 1180 0:310 / / rw,relatime master:412 - overlay overlay rw,lowerdir=/l,upperdir=/u
1252 1251 0:313 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1262 1251 8:1 /var/lib/kubelet/pods/9f/volumes/kubernetes.io~configmap/bundles /etc/bundlevisor/watched ro,relatime - ext4 /dev/sda1 rw
1263 1251 8:1 /var/lib/kubelet/pods/9f/etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
1264 1251 8:1 /opt/local-path-provisioner/pvc-1 /var/lib/bundlevisor rw,relatime - ext4 /dev/sda1 rw
1265 1251 0:315 / /run/my\\040secrets ro,relatime - tmpfs tmpfs rw
";

    /// Issue 22: a ConfigMap volume's root is 0777 and read-only; its
    /// write bits give nobody a write, so it is a folder to trust.
    #[test]
    fn a_read_only_mount_nobody_writes_through_is_unwritable() {
        let at = |id: u64, p: &str| unwritable_in(POD, id, Path::new(p));
        assert!(at(1262, "/etc/bundlevisor/watched"));
        assert!(at(1262, "/etc/bundlevisor/watched/..2026_11_25_00_00_01.1"));
        assert!(at(1265, "/run/my secrets"), "an escaped mount point");
        assert!(
            !at(1251, "/etc/bundlevisor"),
            "the container's root is read-write"
        );
        assert!(!at(1264, "/var/lib/bundlevisor/state"));
        assert!(
            !at(4242, "/etc/bundlevisor/watched"),
            "a mount not in the table"
        );
        // The same folder bound read-only from the writable root: whoever
        // may write /srv/drop still decides what the daemon runs.
        let bound = format!(
            "{POD}1270 1251 0:310 /srv/drop /etc/bundlevisor/watched ro,relatime - overlay overlay rw\n"
        );
        let watched = Path::new("/etc/bundlevisor/watched");
        assert!(!unwritable_in(&bound, 1270, watched));
        // ...unless the filesystem itself is read-only.
        let fs_ro = bound.replace("overlay overlay rw", "overlay overlay ro");
        assert!(unwritable_in(&fs_ro, 1270, watched));
    }
}
