//! Watched folders as one scan sees them: the bundles in a folder
//! (`DIR/NAME/manifest.json`, `DIR/NAME.json`, `DIR/NAME.mcpb`), each
//! manifest (or archive) read once, checked for trust, and parsed (or
//! unpacked) only when its content changed. Blocking work: run on the
//! blocking pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::host_resources::PROVIDED_CAPABILITIES;
use crate::manifest::LoadedManifest;
use crate::store::InstallRecord;

/// A watched folder as one scan found it, with the installs recorded then.
pub struct Scan {
    pub dir: PathBuf,
    pub found: Vec<Found>,
    pub installs: Vec<InstallRecord>,
}

/// One bundle found in a watched folder.
pub struct Found {
    pub path: PathBuf,
    /// Hash of the manifest's text (or of why it was refused).
    pub hash: u64,
    /// The validated (and gated) manifest; None when its content is the one
    /// seen last time (nothing to do, so it is not parsed again).
    pub manifest: Option<Result<LoadedManifest, String>>,
    /// A bundle folder still arriving (its entry point is missing, or files
    /// below it were written less than the debounce ago): why, and it is
    /// looked at again later instead of being installed half-copied.
    pub settling: Option<String>,
    /// A fingerprint of every file below a bundle folder (newest change,
    /// count), taken for the bundles asked about: a failed one is retried
    /// when it changes.
    pub tree: Option<u64>,
}

/// What a scan needs to know besides the folder.
pub struct ScanInputs<'a> {
    pub seen: &'a HashMap<PathBuf, u64>,
    pub config: &'a Config,
    /// How long a bundle folder's files must have been quiet.
    pub quiet: std::time::Duration,
    /// Bundle folders whose tree is fingerprinted (failed bundles).
    pub trees: &'a std::collections::HashSet<PathBuf>,
    /// Names of entries a rename brought into the folder since the last
    /// scan: complete when they arrived, so no quiet period applies.
    pub arrived: &'a std::collections::BTreeSet<std::ffi::OsString>,
    /// How the folder's modes are judged (its `[[watch]]` entry).
    pub trust: super::trusted::Trust,
    /// The workspace its bundles are installed in.
    pub workspace: &'a str,
    /// Where an archive's unpack is shown while it runs.
    pub board: &'a super::board::StatusBoard,
}

/// Entries walked at most to fingerprint a tree (a huge tree is judged on
/// its first entries).
const TREE_WALK_MAX: usize = 200_000;

/// The newest change time below `dir` and how many entries there are
/// (links not followed).
fn walk(dir: &Path) -> (std::time::SystemTime, usize) {
    let mut newest = std::time::UNIX_EPOCH;
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            count += 1;
            if count > TREE_WALK_MAX {
                return (newest, count);
            }
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if let Ok(t) = meta.modified() {
                newest = newest.max(t);
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    (newest, count)
}

fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let (newest, count) = walk(dir);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (newest, count).hash(&mut h);
    h.finish()
}

/// Why a new or changed bundle folder is not complete yet, if it is not.
fn still_arriving(
    loaded: &LoadedManifest,
    quiet: std::time::Duration,
    moved_in: bool,
) -> Option<String> {
    if let crate::manifest::Transport::Stdio(server) = &loaded.manifest.transport {
        let entry = loaded.dir.join(&server.entry_point);
        if !entry.exists() {
            return Some(format!(
                "its entry point {} is not there yet",
                entry.display()
            ));
        }
    }
    // Renamed in whole (the documented way): written before it arrived.
    if moved_in {
        return None;
    }
    let (newest, _) = walk(&loaded.dir);
    let age = newest.elapsed().unwrap_or_default();
    (age < quiet).then(|| {
        format!(
            "files below {} were written {} ago (waiting for {} of quiet)",
            loaded.dir.display(),
            humantime::format_duration(std::time::Duration::from_millis(age.as_millis() as u64)),
            humantime::format_duration(quiet)
        )
    })
}

/// Reads every bundle of a watched folder, each manifest once; parses only
/// those whose content hash differs from `seen`. None when the folder is missing.
pub fn scan(dir: &Path, ask: &ScanInputs) -> Option<(PathBuf, Vec<Found>)> {
    let (seen, config) = (ask.seen, ask.config);
    let (sandbox, protected) = (&config.sandbox, config.protected_paths());
    let dir = dir.canonicalize().ok().filter(|d| d.is_dir())?;
    let untrusted = super::trusted::folder(&dir, ask.trust).err();
    if let Some(why) = &untrusted {
        tracing::error!("{why}; nothing in it is installed or changed until that is fixed");
    }
    let found = bundle_paths(&dir)
        .into_iter()
        .map(|path| {
            if crate::archive::is_archive(&path) {
                return archive(path, untrusted.as_deref(), ask, config);
            }
            let file = crate::manifest::manifest_file(&path);
            let text = match &untrusted {
                Some(why) => Err(why.clone()),
                None => super::trusted::manifest_text(&path, &file, ask.trust),
            };
            let hash = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                match &text {
                    Ok(text) => text.hash(&mut h),
                    // A refusal is seen again until its cause is gone.
                    Err(why) => ("refused", why).hash(&mut h),
                }
                h.finish()
            };
            let manifest = (seen.get(&path) != Some(&hash)).then(|| {
                let loaded = crate::manifest::from_text(file, &text?).map_err(|e| e.to_string())?;
                crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)
                    .map_err(|e| e.to_string())?;
                crate::bundle::sandbox::check_install(sandbox, &protected, &loaded, ask.workspace)
                    .map_err(|e| e.to_string())?;
                Ok(loaded)
            });
            // A folder (not a bare manifest) is complete when its entry
            // point is there and nothing below it changed for a while.
            let settling = match &manifest {
                Some(Ok(loaded)) if !loaded.is_bare() => {
                    let moved_in = path.file_name().is_some_and(|n| ask.arrived.contains(n));
                    still_arriving(loaded, ask.quiet, moved_in)
                }
                _ => None,
            };
            let tree = (path.is_dir() && ask.trees.contains(&path)).then(|| fingerprint(&path));
            Found {
                path,
                hash,
                manifest,
                settling,
                tree,
            }
        })
        .collect();
    Some((dir, found))
}

/// A `.mcpb` in a watched folder: trusted like a manifest, hashed whole
/// (SHA-256), unpacked and checked only when that hash changed.
fn archive(path: PathBuf, untrusted: Option<&str>, ask: &ScanInputs, config: &Config) -> Found {
    let (trust, seen) = (ask.trust, ask.seen);
    let hashed = match untrusted {
        Some(why) => Err(why.to_string()),
        None => super::trusted::archive(&path, trust).and_then(|()| {
            archive_sha256(&path)
                .map_err(|e| format!("cannot read archive {}: {e}", path.display()))
        }),
    };
    let hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match &hashed {
            Ok(sha) => sha.hash(&mut h),
            Err(why) => ("refused", why).hash(&mut h),
        }
        h.finish()
    };
    let manifest = (seen.get(&path) != Some(&hash)).then(|| {
        hashed?;
        let mut progress = ask.board.unpack_progress(ask.workspace, &path);
        let loaded = super::source::load_with(&path, config, &mut progress);
        drop(progress);
        let loaded = loaded.map_err(|e| e.to_string())?;
        crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)
            .map_err(|e| e.to_string())?;
        crate::bundle::sandbox::check_install(
            &config.sandbox,
            &config.protected_paths(),
            &loaded,
            ask.workspace,
        )
        .map_err(|e| e.to_string())?;
        Ok(loaded)
    });
    Found {
        path,
        hash,
        manifest,
        settling: None,
        tree: None,
    }
}

/// The SHA-256 of an archive, hashed again only when its file changed: a
/// rescan (one per change anywhere in the folder) re-hashed every archive,
/// gigabytes for a folder of large ones. Changed means another inode,
/// size, mtime or ctime (ctime cannot be set back by a writer); a file
/// changed in the last two seconds is always hashed.
fn archive_sha256(path: &Path) -> std::io::Result<String> {
    remembered_sha256(path, unix_now(), crate::archive::sha256)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// [`archive_sha256`] at the time `now` (seconds), hashing with `hash`.
fn remembered_sha256(
    path: &Path,
    now: i64,
    hash: fn(&Path) -> std::io::Result<String>,
) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    type Stamp = (u64, u64, u64, i64, i64, i64, i64);
    static HASHED: std::sync::Mutex<Option<HashMap<PathBuf, (Stamp, String)>>> =
        std::sync::Mutex::new(None);
    let stamp = |m: &std::fs::Metadata| -> Stamp {
        (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    let before = stamp(&std::fs::metadata(path)?);
    {
        let hashed = HASHED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, sha)) = hashed.as_ref().and_then(|h| h.get(path)) {
            if *at == before {
                return Ok(sha.clone());
            }
        }
    }
    let sha = hash(path)?;
    let after = std::fs::metadata(path)?;
    // Not remembered when written to while it was read, or changed so
    // recently that a write in the same clock tick (timestamps are coarse)
    // could leave the stamp as it is.
    let settled = now - after.mtime().max(after.ctime()) >= 2;
    if settled && stamp(&after) == before {
        let mut hashed = HASHED.lock().unwrap_or_else(|p| p.into_inner());
        let map = hashed.get_or_insert_with(HashMap::new);
        if map.len() >= 65_536 {
            map.clear();
        }
        map.insert(path.to_path_buf(), (before, sha.clone()));
    }
    Ok(sha)
}

/// Bundles in a watched folder: `DIR/NAME/manifest.json`, `DIR/NAME.json`
/// and `DIR/NAME.mcpb`.
pub fn bundle_paths(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        tracing::warn!(dir = %dir.display(), "watched folder cannot be read");
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter(|p| {
            if p.is_dir() {
                p.join("manifest.json").is_file()
            } else {
                p.extension().is_some_and(|e| e == "json") || crate::archive::is_archive(p)
            }
        })
        // A link stays a path in the folder (and is refused by the scan).
        .filter_map(|p| {
            if p.is_symlink() {
                Some(p)
            } else {
                p.canonicalize().ok()
            }
        })
        .collect();
    paths.sort();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22: an archive's hash is remembered between rescans (a rescan
    /// re-hashed every archive of the folder), and hashed again once its
    /// file changed or while it is fresh.
    #[test]
    fn an_archive_is_hashed_once_until_its_file_changes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static HASHES: AtomicUsize = AtomicUsize::new(0);
        fn counted(path: &Path) -> std::io::Result<String> {
            HASHES.fetch_add(1, Ordering::SeqCst);
            crate::archive::sha256(path)
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.mcpb");
        std::fs::write(&path, b"first version").unwrap();
        let now = unix_now();
        // Fresh (changed within 2 s): hashed every time.
        let first = remembered_sha256(&path, now, counted).unwrap();
        assert_eq!(first, crate::archive::sha256(&path).unwrap());
        remembered_sha256(&path, now, counted).unwrap();
        assert_eq!(HASHES.load(Ordering::SeqCst), 2);
        // Settled: hashed once, then remembered.
        let later = now + 10;
        assert_eq!(remembered_sha256(&path, later, counted).unwrap(), first);
        assert_eq!(remembered_sha256(&path, later, counted).unwrap(), first);
        assert_eq!(HASHES.load(Ordering::SeqCst), 3);
        // Replaced in place with the same size: hashed again.
        std::fs::write(&path, b"other version").unwrap();
        let second = remembered_sha256(&path, later + 10, counted).unwrap();
        assert_ne!(first, second);
        assert_eq!(second, crate::archive::sha256(&path).unwrap());
        assert_eq!(HASHES.load(Ordering::SeqCst), 4);
        assert_eq!(archive_sha256(&path).unwrap(), second);
    }
}
