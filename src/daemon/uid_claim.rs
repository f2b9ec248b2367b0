//! One `[sandbox] uid_range` per daemon on a host. A root daemon gives
//! each bundle a uid from its range; two daemons with overlapping ranges
//! would run their bundles under the same uids at once (one
//! `RLIMIT_NPROC` between them, each other's `/proc` entries and signals).
//!
//! So a root daemon claims its range at start: a file named `FIRST-LAST`
//! in [`CLAIMS_DIR`], holding the daemon's pid and state dir, with an
//! exclusive `flock` held for the daemon's life. The kernel drops the lock
//! when the daemon dies, even by SIGKILL, so a claim never outlives its
//! daemon. A daemon whose range overlaps a live claim refuses to start and
//! names the other daemon. Claimers take turns through `CLAIMS_DIR/.lock`,
//! so two daemons starting at once cannot both miss each other.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::config::UidRange;

/// Where the claims are: outside every daemon's state and runtime folders
/// (systemd removes a unit's `RuntimeDirectory` when it stops), on a
/// tmpfs that a reboot empties.
pub const CLAIMS_DIR: &str = "/run/bundlevisor-uid-ranges";

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("[sandbox] uid_range {ours} overlaps uid_range {theirs} of another bundlevisor daemon ({holder}); the bundles of both would run under the same uids. Stop that daemon, or give this one a range of its own: [sandbox] uid_range = \"{suggested}\"")]
    Taken {
        ours: UidRange,
        theirs: UidRange,
        holder: String,
        suggested: String,
    },
    #[error("cannot claim [sandbox] uid_range {range} in {path}: {source}")]
    Io {
        range: UidRange,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A claimed range, held until dropped (or the process dies).
#[derive(Debug)]
pub struct UidClaim {
    _lock: Flock<File>,
}

/// Claims `range` for the daemon of `state_dir`.
pub fn claim(range: UidRange, state_dir: &Path) -> Result<UidClaim, ClaimError> {
    claim_in(Path::new(CLAIMS_DIR), range, state_dir)
}

fn overlaps(a: UidRange, b: UidRange) -> bool {
    a.first <= b.last && b.first <= a.last
}

fn parse(name: &str) -> Option<UidRange> {
    let (a, b) = name.split_once('-')?;
    Some(UidRange {
        first: a.parse().ok()?,
        last: b.parse().ok()?,
    })
}

/// A range of the same size right after `theirs`, for the message.
fn suggestion(ours: UidRange, theirs: UidRange) -> String {
    let size = ours.last - ours.first;
    match theirs
        .last
        .checked_add(1)
        .and_then(|f| Some((f, f.checked_add(size)?)))
    {
        Some((first, last)) if last < u32::MAX => format!("{first}-{last}"),
        _ => "FIRST-LAST, away from the other daemon's".to_string(),
    }
}

fn claim_in(dir: &Path, range: UidRange, state_dir: &Path) -> Result<UidClaim, ClaimError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ClaimError::Io {
            range,
            path,
            source,
        }
    };
    let open = |path: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let turn = dir.join(".lock");
    let _turn = Flock::lock(open(&turn).map_err(io(&turn))?, FlockArg::LockExclusive)
        .map_err(|(_, e)| io(&turn)(e.into()))?;
    let ours = dir.join(range.to_string());
    for entry in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let name = entry.file_name();
        let Some(theirs) = name.to_str().and_then(parse) else {
            continue;
        };
        if !overlaps(range, theirs) {
            continue;
        }
        let path = entry.path();
        let file = open(&path).map_err(io(&path))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            // A claim whose daemon is gone.
            Ok(stale) => {
                if path != ours {
                    std::fs::remove_file(&path).map_err(io(&path))?;
                }
                drop(stale);
            }
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(ClaimError::Taken {
                    ours: range,
                    theirs,
                    holder: if holder.is_empty() {
                        format!("its claim is {}", path.display())
                    } else {
                        holder.to_string()
                    },
                    suggested: suggestion(range, theirs),
                });
            }
        }
    }
    let file = open(&ours).map_err(io(&ours))?;
    let mut lock =
        Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| io(&ours)(e.into()))?;
    lock.set_len(0).map_err(io(&ours))?;
    writeln!(
        lock,
        "pid {}, state dir {}",
        std::process::id(),
        state_dir.display()
    )
    .map_err(io(&ours))?;
    Ok(UidClaim { _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u32, last: u32) -> UidRange {
        UidRange { first, last }
    }

    #[test]
    fn an_overlapping_range_is_refused_while_its_claim_lives() {
        let dir = tempfile::tempdir().unwrap();
        let a = claim_in(dir.path(), range(5000, 5999), Path::new("/srv/a")).unwrap();
        let err = claim_in(dir.path(), range(5500, 6499), Path::new("/srv/b")).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("5000-5999")
                && said.contains(&format!("pid {}, state dir /srv/a", std::process::id()))
                && said.contains("uid_range = \"6000-6999\""),
            "{said}"
        );
        // Beside it is fine; once it is dropped, its range is free.
        let _b = claim_in(dir.path(), range(6000, 6999), Path::new("/srv/b")).unwrap();
        drop(a);
        claim_in(dir.path(), range(5000, 5999), Path::new("/srv/c")).unwrap();
    }
}
