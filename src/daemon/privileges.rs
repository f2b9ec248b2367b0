//! What a root daemon needs of root. A daemon whose uid is 0 runs every
//! bundle under another uid, hands it its folders and stops it with
//! signals; in a container with a reduced capability set (deploy/base) a
//! missing capability would otherwise show only later, as a bundle that
//! cannot start ("drop to the bundle's user: Operation not permitted",
//! then a crash loop) or one that cannot be stopped. So the daemon checks
//! its effective capabilities at start and refuses to run without them,
//! naming what is missing and how to give it.

/// The capabilities a root daemon uses, with what each is for.
pub const NEEDED: [(u32, &str, &str); 4] = [
    (0, "CHOWN", "hand each bundle its data and tmp folders"),
    (5, "KILL", "stop bundles that run under their own uids"),
    (6, "SETGID", "start bundles under their own gids"),
    (7, "SETUID", "start bundles under their own uids"),
];

#[derive(Debug, thiserror::Error)]
pub struct MissingCapabilities(Vec<(u32, &'static str, &'static str)>);

impl std::fmt::Display for MissingCapabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(_, name, _)| *name).collect();
        let uses: Vec<String> = self
            .0
            .iter()
            .map(|(_, name, why)| format!("{name}: {why}"))
            .collect();
        let flags: Vec<String> = names.iter().map(|n| format!("--cap-add={n}")).collect();
        write!(
            f,
            "the daemon runs as root without the capabilities {} ({}); a root daemon runs each bundle under a uid of its own and needs them. Give them to its container (Kubernetes: securityContext.capabilities.add: [{}]; podman or docker: {}), or run the daemon as a user other than root with [sandbox] allow_same_uid = true (docs/scaling.md)",
            names.join(", "),
            uses.join("; "),
            names.join(", "),
            flags.join(" ")
        )
    }
}

/// The effective capability set of this process (`CapEff` of
/// `/proc/self/status`); None when it cannot be read.
fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// The [`NEEDED`] capabilities missing from `set`.
fn missing_from(set: u64) -> Vec<(u32, &'static str, &'static str)> {
    NEEDED
        .into_iter()
        .filter(|(bit, _, _)| set & (1 << bit) == 0)
        .collect()
}

/// For a root daemon: Err naming every needed capability it lacks. A set
/// that cannot be read is not believed to be complete (fail closed).
pub fn check() -> Result<(), MissingCapabilities> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let missing = missing_from(effective().unwrap_or(0));
    if missing.is_empty() {
        Ok(())
    } else {
        Err(MissingCapabilities(missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_set_misses_nothing_and_a_reduced_one_is_named_with_the_fix() {
        assert!(missing_from(u64::MAX).is_empty());
        // CHOWN, KILL and SETGID, not SETUID.
        let set = (1 << 0) | (1 << 5) | (1 << 6);
        let error = MissingCapabilities(missing_from(set)).to_string();
        assert!(
            error.contains(
                "without the capabilities SETUID (SETUID: start bundles under their own uids)"
            ),
            "{error}"
        );
        assert!(error.contains("capabilities.add: [SETUID]"), "{error}");
        assert!(error.contains("--cap-add=SETUID"), "{error}");
        assert_eq!(missing_from(0).len(), NEEDED.len());
    }

    #[test]
    fn this_process_reads_its_own_set() {
        assert!(effective().is_some());
    }
}
