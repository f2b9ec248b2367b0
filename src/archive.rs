//! MCPB archives: a `.mcpb` file is a ZIP with `manifest.json` at its root
//! (what `mcpb pack` makes). An archive is checked entry by entry against
//! the hostile-archive rules before anything is written, then unpacked once
//! into `STATE_DIR/archives/SHA256/`: into a temporary folder first, renamed
//! into place when complete, file modes restored (without setuid, setgid or
//! sticky bits). Named after the archive's SHA-256, an unpacked version is
//! never written over: an upgrade lands beside the running one, a version
//! seen before is there at once, and a CLI install keeps running after the
//! downloaded file is deleted. Blocking: run on the blocking pool.
//!
//! A signature block that `mcpb sign` appends after the ZIP
//! (`MCPB_SIG_V1`, length, PKCS#7 DER, `MCPB_SIG_END`) is verified with
//! OpenSSL against `[bundles] trusted_certs` under `[bundles] signatures`
//! (both layouts the CLI has produced: with and without the end-of-central-
//! directory comment length patched to cover the block), then cut off
//! before the ZIP is read.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// The file extension of MCPB archives.
pub const EXTENSION: &str = "mcpb";

/// Where the signature block of a signed archive begins and ends: header,
/// the PKCS#7 (DER) length as 4 bytes little-endian, the PKCS#7, footer.
const SIGNATURE_MARKER: &[u8] = b"MCPB_SIG_V1";
const SIGNATURE_END: &[u8] = b"MCPB_SIG_END";

/// How `mcpb sign` signatures are held (`[bundles] signatures`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignaturePolicy {
    /// Not checked.
    Off,
    /// Checked and shown; a missing or untrusted signature is logged.
    #[default]
    Warn,
    /// An unsigned or untrusted archive is refused.
    Require,
}

/// What the signature of an archive said.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Signature {
    /// `[bundles] signatures = "off"`.
    NotChecked,
    Unsigned,
    /// Valid, and chains to a trusted certificate.
    Signed {
        signer: String,
    },
    /// Valid, but its certificate chains to none of `trusted_certs`.
    Untrusted {
        signer: String,
        reason: String,
    },
}

/// The policy and the certificates signatures must chain to.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    pub policy: SignaturePolicy,
    pub anchors: Vec<PathBuf>,
}

/// The certificates of a PEM file (one or more), or why they cannot be read.
pub fn load_certs(path: &Path) -> Result<Vec<openssl::x509::X509>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = openssl::x509::X509::stack_from_pem(&pem)
        .map_err(|e| format!("{} is not a PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}

/// Splits a signed archive into the ZIP it signs and the PKCS#7 (DER).
fn signature_block(bytes: &[u8]) -> Option<(usize, &[u8])> {
    if !bytes.ends_with(SIGNATURE_END) {
        return None;
    }
    let end = bytes.len() - SIGNATURE_END.len();
    let start = bytes[..end]
        .windows(SIGNATURE_MARKER.len())
        .rposition(|w| w == SIGNATURE_MARKER)?;
    let len_at = start + SIGNATURE_MARKER.len();
    let len = u32::from_le_bytes(bytes.get(len_at..len_at + 4)?.try_into().ok()?) as usize;
    let der = bytes.get(len_at + 4..len_at + 4 + len)?;
    (len_at + 4 + len == end).then_some((start, der))
}

/// The ZIP with its end-of-central-directory comment length set to what
/// really follows the record: older `mcpb sign` releases patched it to
/// cover the signature block. None when it needs no fixing.
fn unpatched(zip: &[u8]) -> Option<Vec<u8>> {
    let floor = zip.len().saturating_sub(22 + 65_535);
    let at = (floor..zip.len().saturating_sub(21))
        .rev()
        .find(|&i| zip[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])?;
    let stored = u16::from_le_bytes([zip[at + 20], zip[at + 21]]) as usize;
    let real = zip.len() - (at + 22);
    (stored != real && real <= u16::MAX as usize).then(|| {
        let mut fixed = zip.to_vec();
        fixed[at + 20..at + 22].copy_from_slice(&(real as u16).to_le_bytes());
        fixed
    })
}

/// Checks the signature of `signed_zip` (the archive without its
/// signature block) against `trust`. Err: the rule it breaks.
fn verify(signed_zip: &[u8], der: Option<&[u8]>, trust: &Trust) -> Result<Signature, String> {
    use openssl::pkcs7::{Pkcs7, Pkcs7Flags};
    use openssl::stack::Stack;
    use openssl::x509::store::X509StoreBuilder;
    if trust.policy == SignaturePolicy::Off {
        return Ok(Signature::NotChecked);
    }
    let Some(der) = der else {
        return match trust.policy {
            SignaturePolicy::Require => Err(
                "it is not signed, and [bundles] signatures = \"require\"; sign it with `mcpb sign`".to_string(),
            ),
            _ => Ok(Signature::Unsigned),
        };
    };
    let p7 = Pkcs7::from_der(der)
        .map_err(|e| format!("its signature block is not a PKCS#7 signature ({e})"))?;
    let none = Stack::new().map_err(|e| e.to_string())?;
    let signer = p7
        .signers(&none, Pkcs7Flags::empty())
        .ok()
        .and_then(|certs| certs.iter().next().map(subject))
        .unwrap_or_else(|| "an unknown signer".to_string());
    // First the signature itself (either layout), then whom it chains to.
    let empty = X509StoreBuilder::new().map_err(|e| e.to_string())?.build();
    let fixed = unpatched(signed_zip);
    let contents: Vec<&[u8]> = std::iter::once(signed_zip)
        .chain(fixed.as_deref())
        .collect();
    let content = contents
        .iter()
        .copied()
        .find(|c| {
            p7.verify(&none, &empty, Some(c), None, Pkcs7Flags::BINARY | Pkcs7Flags::NOVERIFY)
                .is_ok()
        })
        .ok_or_else(|| {
            format!("its signature (by {signer}) does not match its contents: the archive was changed after it was signed")
        })?;
    let store = anchors(trust)?.build();
    let chained = p7.verify(&none, &store, Some(content), None, Pkcs7Flags::BINARY);
    judged(chained, signer, trust)
}

/// A certificate's subject as `CN=…, O=…`.
fn subject(cert: &openssl::x509::X509Ref) -> String {
    cert.subject_name()
        .entries()
        .filter_map(|e| {
            let key = e.object().nid().short_name().ok()?;
            let value = e.data().to_string().ok()?;
            Some(format!("{key}={value}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the signature of an unpacked archive is kept (beside its folder).
/// The archives (and verdicts) whose signature this daemon already
/// warned about, for the unpacks that race the first one's record.
static SIGNATURES_TOLD: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

pub fn signature_file(root: &Path, sha256: &str) -> PathBuf {
    root.join(format!("{sha256}.signature.json"))
}

/// Where the PKCS#7 signature of an unpacked archive is kept (beside its
/// folder), when it matched the archive.
fn pkcs7_file(root: &Path, sha256: &str) -> PathBuf {
    root.join(format!("{sha256}.signature.p7s"))
}

/// What the signature of the archive unpacked at `dir` says under `trust`
/// today: a bundle installed from an archive runs from its unpacked copy
/// (the archive itself may be gone), and `[bundles] signatures` or
/// `trusted_certs` may have changed since it was unpacked. The kept
/// signature (checked against the archive's bytes when it was unpacked) is
/// chained again to the trust anchors; a folder unpacked without one
/// (unsigned, or while signatures were `off`) is unsigned. Err under
/// `require`: why it may not run, with the fix.
pub fn judge_unpacked(dir: &Path, trust: &Trust) -> Result<Signature, String> {
    if trust.policy == SignaturePolicy::Off {
        return Ok(Signature::NotChecked);
    }
    let (Some(sha), Some(root)) = (dir.file_name().and_then(|s| s.to_str()), dir.parent()) else {
        return Err(format!("{} is not an unpacked archive", dir.display()));
    };
    let unsigned = |why: &str| {
        match trust.policy {
        SignaturePolicy::Require => Err(format!(
            "the archive it was unpacked from (sha256 {sha}) {why}, and [bundles] signatures = \"require\"; install an archive signed with `mcpb sign`"
        )),
        _ => Ok(Signature::Unsigned),
    }
    };
    match std::fs::read(pkcs7_file(root, sha)) {
        Ok(der) => chain(&der, trust),
        Err(_) => match recorded_signature(dir) {
            // Recorded by a version that kept no signature: it chained to
            // the trust anchors of the day it was unpacked.
            Some(Signature::Signed { signer }) => Ok(Signature::Signed { signer }),
            Some(Signature::NotChecked) => {
                unsigned("was not checked when it was unpacked ([bundles] signatures = \"off\" then)")
            }
            Some(Signature::Untrusted { signer, reason }) => match trust.policy {
                SignaturePolicy::Require => Err(format!(
                    "the archive it was unpacked from (sha256 {sha}) is signed by {signer}, but {reason}, and [bundles] signatures = \"require\""
                )),
                _ => Ok(Signature::Untrusted { signer, reason }),
            },
            _ => unsigned("is not signed"),
        },
    }
}

/// Whom the signer's certificate of the PKCS#7 `der` chains to, judged
/// against `trust` (as `verify` judges it: S/MIME signing purpose).
fn chain(der: &[u8], trust: &Trust) -> Result<Signature, String> {
    use openssl::pkcs7::{Pkcs7, Pkcs7Flags};
    use openssl::stack::Stack;
    use openssl::x509::{X509PurposeId, X509StoreContext, X509};
    let p7 = Pkcs7::from_der(der)
        .map_err(|e| format!("its kept signature is not a PKCS#7 signature ({e})"))?;
    let none: Stack<X509> = Stack::new().map_err(|e| e.to_string())?;
    let signers = p7
        .signers(&none, Pkcs7Flags::empty())
        .map_err(|e| format!("its kept signature names no signer ({e})"))?;
    let signer_cert = signers
        .iter()
        .next()
        .ok_or("its kept signature names no signer")?
        .to_owned();
    let signer = subject(&signer_cert);
    let mut included: Stack<X509> = Stack::new().map_err(|e| e.to_string())?;
    for cert in p7
        .signed()
        .and_then(|s| s.certificates())
        .into_iter()
        .flatten()
    {
        included.push(cert.to_owned()).map_err(|e| e.to_string())?;
    }
    let mut store = anchors(trust)?;
    store
        .set_purpose(X509PurposeId::SMIME_SIGN)
        .map_err(|e| e.to_string())?;
    let store = store.build();
    let mut context = X509StoreContext::new().map_err(|e| e.to_string())?;
    let verdict = context
        .init(&store, &signer_cert, &included, |c| {
            Ok(c.verify_cert()?.then_some(()).ok_or(c.error()))
        })
        .map_err(|e| e.to_string())?;
    judged(verdict, signer, trust)
}

/// A store of the operator's `[bundles] trusted_certs`.
fn anchors(trust: &Trust) -> Result<openssl::x509::store::X509StoreBuilder, String> {
    let mut store = openssl::x509::store::X509StoreBuilder::new().map_err(|e| e.to_string())?;
    for path in &trust.anchors {
        for cert in load_certs(path)? {
            store.add_cert(cert).map_err(|e| e.to_string())?;
        }
    }
    Ok(store)
}

/// What a signature by `signer` is worth once its chain to the anchors was
/// checked: signed, or (not chained) untrusted, refused under `require`.
fn judged(
    chained: Result<(), impl std::fmt::Display>,
    signer: String,
    trust: &Trust,
) -> Result<Signature, String> {
    match chained {
        Ok(()) => Ok(Signature::Signed { signer }),
        Err(e) => {
            let reason = format!("its certificate chains to none of [bundles] trusted_certs ({e})");
            match trust.policy {
                SignaturePolicy::Require => Err(format!("it is signed by {signer}, but {reason}")),
                _ => Ok(Signature::Untrusted { signer, reason }),
            }
        }
    }
}

/// The signature recorded for the archive unpacked at `dir`.
pub fn recorded_signature(dir: &Path) -> Option<Signature> {
    let sha = dir.file_name()?.to_str()?;
    let root = dir.parent()?;
    serde_json::from_slice(&std::fs::read(signature_file(root, sha)).ok()?).ok()
}

/// Entries whose uncompressed size is below this are not held to the
/// compression-ratio rule (small text compresses well).
const RATIO_FLOOR: u64 = 1024 * 1024;

/// What an archive may hold (`[archives]` in the daemon config; its
/// defaults are `config::defaults`').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Size of the `.mcpb` file itself.
    pub max_archive_bytes: u64,
    /// Files, folders and links in it.
    pub max_entries: u64,
    /// Everything unpacked, together.
    pub max_unpacked_bytes: u64,
    /// Unpacked size over compressed size of one entry (of 1 MiB or more).
    pub max_ratio: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read archive {archive}: {source}")]
    Io {
        archive: PathBuf,
        source: std::io::Error,
    },
    /// The archive breaks a rule; nothing of it was kept.
    #[error("archive {archive} is refused: {rule}")]
    Refused { archive: PathBuf, rule: String },
    #[error("cannot unpack archive {archive} into {dir}: {source}")]
    Unpack {
        archive: PathBuf,
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// An archive, unpacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// SHA-256 of the `.mcpb` file, in lowercase hex.
    pub sha256: String,
    /// `STATE_DIR/archives/SHA256`: the bundle folder.
    pub dir: PathBuf,
    pub signature: Signature,
}

/// Whether `path` names an MCPB archive (by its extension).
pub fn is_archive(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(EXTENSION))
}

/// `STATE_DIR/archives`: where archives are unpacked.
pub fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("archives")
}

/// The SHA-256 of the archive whose unpacked folder is (or contains) `path`.
pub fn unpacked_sha(path: &Path, root: &Path) -> Option<String> {
    let rest = path.strip_prefix(root).ok()?;
    let first = rest.components().next()?.as_os_str().to_str()?;
    is_sha(first).then(|| first.to_string())
}

fn is_sha(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// SHA-256 of a file, in lowercase hex.
pub fn sha256(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How often [`unpack`] tells its progress while it writes entries.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Unpacks `archive` below `root` (see the module doc); a version unpacked
/// before is found, not unpacked again. On any refusal or failure nothing
/// of it is left on disk. While entries are written, `progress` is told
/// (entries written, entries in all): once before the first, at most every
/// [`PROGRESS_EVERY`] meanwhile, and once after the last.
pub fn unpack(
    archive: &Path,
    root: &Path,
    limits: &ArchiveLimits,
    trust: &Trust,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Unpacked, ArchiveError> {
    let io = |source| ArchiveError::Io {
        archive: archive.to_path_buf(),
        source,
    };
    let refused = |rule: String| ArchiveError::Refused {
        archive: archive.to_path_buf(),
        rule,
    };
    create_root(root).map_err(|source| ArchiveError::Unpack {
        archive: archive.to_path_buf(),
        dir: root.to_path_buf(),
        source,
    })?;
    // Work on a private copy, hashed as it is made: what is checked and
    // unpacked is exactly what the hash names, whatever happens to the
    // original meanwhile.
    let scratch = Scratch::new(root).map_err(|source| ArchiveError::Unpack {
        archive: archive.to_path_buf(),
        dir: root.to_path_buf(),
        source,
    })?;
    let copy = scratch.path.join("archive.mcpb");
    let sha256 = copy_hashed(archive, &copy, limits.max_archive_bytes).map_err(|e| match e {
        Copied::Io(e) => io(e),
        Copied::TooLarge => refused(format!(
            "it is larger than {} bytes ([archives] max_archive_bytes)",
            limits.max_archive_bytes
        )),
    })?;
    // The signature is checked on every install and start, before anything
    // is unpacked (or an earlier unpack is used): the policy may have changed.
    let (signature, der) = {
        let bytes = std::fs::read(&copy).map_err(io)?;
        let (zip_len, der) = match signature_block(&bytes) {
            Some((at, der)) => (at, Some(der)),
            None => (bytes.len(), None),
        };
        let signature = verify(&bytes[..zip_len], der, trust).map_err(refused)?;
        // What is unzipped is the ZIP alone, its comment length as written
        // before signing.
        let zip = &bytes[..zip_len];
        let fixed = unpatched(zip);
        if der.is_some() || fixed.is_some() {
            std::fs::write(&copy, fixed.as_deref().unwrap_or(zip)).map_err(io)?;
        }
        (signature, der.map(<[u8]>::to_vec))
    };
    let der = der.as_deref();
    // What the signature said is kept beside the unpacked folder, once the
    // archive is accepted (a refused one leaves nothing), and the signature
    // itself when it was found to match the archive: every start judges it
    // again against the trust anchors of the day ([`judge_unpacked`]).
    let matched = matches!(
        signature,
        Signature::Signed { .. } | Signature::Untrusted { .. }
    );
    let der = der.filter(|_| matched).map(<[u8]>::to_vec);
    let record = |sha256: &str| {
        // Said once per accepted archive (and again if the verdict changes, e.g. with
        // the trust anchors): every install and start of it judges it again.
        if !matches!(signature, Signature::Signed { .. } | Signature::NotChecked) {
            let before: Option<Signature> = std::fs::read(signature_file(root, sha256))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            if before.as_ref() == Some(&signature)
                || !SIGNATURES_TOLD
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((sha256.to_string(), format!("{signature:?}")))
            {
                tracing::debug!(archive = %archive.display(), sha256 = %sha256, "archive signature: {signature:?} (said when it was first unpacked)");
            } else {
                tracing::warn!(archive = %archive.display(), sha256 = %sha256, "archive signature: {signature:?}");
            }
        }
        let _ = std::fs::write(
            signature_file(root, sha256),
            serde_json::to_vec(&signature).unwrap_or_default(),
        );
        let kept = pkcs7_file(root, sha256);
        let _ = match &der {
            Some(der) => std::fs::write(kept, der),
            None => std::fs::remove_file(kept),
        };
    };
    let dir = root.join(&sha256);
    if dir.is_dir() {
        record(&sha256);
        return Ok(Unpacked {
            sha256,
            dir,
            signature,
        });
    }
    let file = std::fs::File::open(&copy).map_err(io)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| {
        refused(format!(
            "it is not a ZIP archive, or it is truncated ({e}); an MCPB bundle is made with `mcpb pack`"
        ))
    })?;
    let plan = check(&mut zip, limits).map_err(refused)?;
    let tree = scratch.path.join("tree");
    extract(&mut zip, &plan, &tree, limits, progress).map_err(|e| match e {
        Extracted::Rule(rule) => refused(rule),
        Extracted::Io(source) => ArchiveError::Unpack {
            archive: archive.to_path_buf(),
            dir: tree.clone(),
            source,
        },
    })?;
    set_mode(&tree, 0o755).map_err(io)?;
    match std::fs::rename(&tree, &dir) {
        Ok(()) => {}
        // Another unpack of the same archive got there first: same bytes.
        Err(_) if dir.is_dir() => {}
        Err(source) => {
            return Err(ArchiveError::Unpack {
                archive: archive.to_path_buf(),
                dir,
                source,
            })
        }
    }
    record(&sha256);
    Ok(Unpacked {
        sha256,
        dir,
        signature,
    })
}

/// Removes the unpacked archives whose hash is not in `keep` (versions no
/// install runs any more) and scratch folders an interrupted unpack left,
/// if untouched for `min_age` (an unpack that a start has not picked up
/// yet is never taken from under it).
pub fn collect_garbage(
    root: &Path,
    keep: &HashSet<String>,
    min_age: std::time::Duration,
) -> std::io::Result<usize> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(0);
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let stale = name.starts_with(".unpack-") || (is_sha(&name) && !keep.contains(&*name));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if stale && old {
            std::fs::remove_dir_all(entry.path())?;
            let _ = std::fs::remove_file(signature_file(root, &name));
            let _ = std::fs::remove_file(pkcs7_file(root, &name));
            removed += 1;
        }
    }
    Ok(removed)
}

/// The archives folder: traversable by bundles (they run from below it),
/// listable by nobody else.
fn create_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(root)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// A private folder for one unpack, removed (with whatever is in it) when
/// dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new(root: &Path) -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = root.join(format!(".unpack-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

enum Copied {
    Io(std::io::Error),
    TooLarge,
}

/// Copies `from` to `to` (at most `max` bytes) and returns its SHA-256.
fn copy_hashed(from: &Path, to: &Path, max: u64) -> Result<String, Copied> {
    let source = std::fs::File::open(from).map_err(Copied::Io)?;
    let meta = source.metadata().map_err(Copied::Io)?;
    if !meta.is_file() {
        return Err(Copied::Io(std::io::Error::other("not a regular file")));
    }
    let mut out = std::fs::File::create(to).map_err(Copied::Io)?;
    let mut hasher = Sha256::new();
    let mut limited = source.take(max + 1);
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = limited.read(&mut buf).map_err(Copied::Io)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > max {
            return Err(Copied::TooLarge);
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(Copied::Io)?;
    }
    out.sync_all().map_err(Copied::Io)?;
    Ok(hex(&hasher.finalize()))
}

/// What an entry becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Link,
}

/// The entries to write, checked: (index, relative path, kind, mode).
type Plan = Vec<(usize, PathBuf, Kind, u32)>;

/// Every rule that can be checked from the central directory, before
/// anything is written.
fn check<R: Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    limits: &ArchiveLimits,
) -> Result<Plan, String> {
    if zip.len() as u64 > limits.max_entries {
        return Err(format!(
            "it holds {} entries, more than {} ([archives] max_entries)",
            zip.len(),
            limits.max_entries
        ));
    }
    let mut plan = Vec::with_capacity(zip.len());
    let mut names: HashSet<String> = HashSet::new();
    let mut total = 0u64;
    let mut nested_manifest = None;
    for i in 0..zip.len() {
        let entry = zip
            .by_index_raw(i)
            .map_err(|e| format!("entry {i} cannot be read: {e}"))?;
        let raw = entry
            .name()
            .map_err(|e| format!("entry {i} has a name that cannot be read: {e}"))?
            .to_string();
        let path = entry_path(&raw)?;
        let folded = path.to_string_lossy().to_lowercase();
        if !names.insert(folded) {
            return Err(format!(
                "{raw:?} is in it twice (names that differ only in case count as the same): an unpacked bundle must not depend on which one wins"
            ));
        }
        let mode = entry.unix_mode().unwrap_or(0);
        let kind = match mode & 0o170000 {
            0o040000 => Kind::Dir,
            0o120000 => Kind::Link,
            0o100000 => Kind::File,
            0 if entry.is_dir() => Kind::Dir,
            0 => Kind::File,
            _ => {
                return Err(format!(
                    "{raw:?} is a device, pipe or socket (mode {mode:o}); a bundle holds files, folders and links"
                ))
            }
        };
        let size = entry.size();
        total = total.saturating_add(size);
        if total > limits.max_unpacked_bytes {
            return Err(format!(
                "it unpacks to more than {} bytes ([archives] max_unpacked_bytes)",
                limits.max_unpacked_bytes
            ));
        }
        let compressed = entry.compressed_size().max(1);
        if size >= RATIO_FLOOR && size / compressed > limits.max_ratio {
            return Err(format!(
                "{raw:?} expands {}-fold ({size} bytes from {compressed}), more than {} ([archives] max_ratio): a zip bomb",
                size / compressed,
                limits.max_ratio
            ));
        }
        if path.file_name().is_some_and(|n| n == "manifest.json")
            && path.parent() != Some(Path::new(""))
        {
            nested_manifest.get_or_insert(raw.clone());
        }
        plan.push((i, path, kind, mode & 0o777));
    }
    if !plan
        .iter()
        .any(|(_, p, kind, _)| *kind == Kind::File && p == Path::new("manifest.json"))
    {
        return Err(match nested_manifest {
            Some(found) => format!(
                "manifest.json is not at its root (found {found:?}); pack the bundle folder's contents, as `mcpb pack` does"
            ),
            None => "it has no manifest.json at its root; it is not an MCPB bundle".to_string(),
        });
    }
    Ok(plan)
}

/// An entry's name as a relative path inside the bundle, or why it cannot be.
fn entry_path(raw: &str) -> Result<PathBuf, String> {
    if raw.is_empty() || raw.contains('\0') || raw.contains('\\') {
        return Err(format!(
            "entry {raw:?} has an empty name, a NUL or a backslash"
        ));
    }
    let path = Path::new(raw.trim_end_matches('/'));
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(p) => clean.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("entry {raw:?} climbs out of the bundle (`..`)"))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("entry {raw:?} is an absolute path"))
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(format!("entry {raw:?} names no file"));
    }
    Ok(clean)
}

enum Extracted {
    Rule(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Extracted {
    fn from(e: std::io::Error) -> Self {
        Extracted::Io(e)
    }
}

/// Writes the checked entries below `tree`. Sizes are enforced on the
/// bytes actually inflated, not on what the headers claim.
fn extract<R: Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    plan: &Plan,
    tree: &Path,
    limits: &ArchiveLimits,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), Extracted> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o755).create(tree)?;
    let mut budget = limits.max_unpacked_bytes;
    let mut links = Vec::new();
    let total = plan.len() as u64;
    progress(0, total);
    let mut told = std::time::Instant::now();
    for (done, (i, path, kind, mode)) in plan.iter().enumerate() {
        if told.elapsed() >= PROGRESS_EVERY {
            progress(done as u64, total);
            told = std::time::Instant::now();
        }
        let target = tree.join(path);
        if let Some(parent) = target.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        let mut entry = zip.by_index(*i).map_err(|e| {
            Extracted::Rule(format!("entry {} cannot be read: {e}", path.display()))
        })?;
        match kind {
            Kind::Dir => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&target)?;
            }
            Kind::File => {
                let mut out = std::fs::File::create(&target)?;
                let written =
                    std::io::copy(&mut (&mut entry).take(budget + 1), &mut out).map_err(|e| {
                        Extracted::Rule(format!("{} cannot be inflated: {e}", path.display()))
                    })?;
                if written > budget {
                    return Err(Extracted::Rule(format!(
                        "it unpacks to more than {} bytes ([archives] max_unpacked_bytes)",
                        limits.max_unpacked_bytes
                    )));
                }
                budget -= written;
                // The owner may always read it; setuid/setgid/sticky never.
                let mode = if *mode == 0 {
                    0o644
                } else {
                    (mode | 0o400) & 0o755
                };
                set_mode(&target, mode)?;
            }
            Kind::Link => {
                let mut text = String::new();
                (&mut entry)
                    .take(4096)
                    .read_to_string(&mut text)
                    .map_err(|e| {
                        Extracted::Rule(format!(
                            "link {} has an unreadable target: {e}",
                            path.display()
                        ))
                    })?;
                links.push((path.clone(), target, text));
            }
        }
    }
    // Links last: none can redirect a file written after it. Each is then
    // judged by where it resolves among all of them, not by its text: a
    // link whose `..`s stay inside by their count may pass through another
    // link that already climbed (`s -> ../..`, `esc -> deep/s/../../etc`).
    for (_, target, text) in &links {
        std::os::unix::fs::symlink(text, target)?;
    }
    for (path, _, text) in &links {
        resolve_inside(tree, path).map_err(|why| {
            Extracted::Rule(format!(
                "link {} (-> {text:?}) {why}; a bundle's links must lead to files or folders inside it",
                path.display()
            ))
        })?;
    }
    progress(total, total);
    Ok(())
}

/// Links followed at most while one link is resolved (the kernel's own
/// limit, `MAXSYMLINKS`).
const MAX_LINK_HOPS: usize = 40;

/// Resolves the link `link` (relative to `tree`) name by name inside
/// `tree`, following the links it meets there (at most [`MAX_LINK_HOPS`]),
/// as the kernel will resolve it once the bundle runs. Only folders already
/// resolved are looked into, so nothing outside `tree` is ever read. Err:
/// where it goes wrong (out of the bundle, absolute, nowhere, a loop).
fn resolve_inside(tree: &Path, link: &Path) -> Result<(), String> {
    use std::ffi::OsString;
    // The real folders (no links) walked so far, below `tree`.
    let mut at: Vec<OsString> = link
        .parent()
        .into_iter()
        .flat_map(Path::components)
        .map(|c| c.as_os_str().to_owned())
        .collect();
    // What is left to resolve, the next name last.
    let mut pending: Vec<OsString> = Vec::new();
    let follow = |path: &Path, pending: &mut Vec<OsString>| -> Result<(), String> {
        let target = std::fs::read_link(path).map_err(|e| format!("cannot be read ({e})"))?;
        if target.is_absolute() || target.as_os_str().is_empty() {
            return Err("points outside the bundle (an absolute or empty target)".into());
        }
        pending.extend(target.components().rev().map(|c| c.as_os_str().to_owned()));
        Ok(())
    };
    follow(&tree.join(link), &mut pending)?;
    let mut hops = 1;
    let mut ends_at_file = false;
    while let Some(name) = pending.pop() {
        if ends_at_file {
            return Err("leads through a file as if it were a folder".into());
        }
        match Path::new(&name).components().next() {
            Some(Component::CurDir) | None => {}
            Some(Component::ParentDir) => {
                if at.pop().is_none() {
                    return Err("points outside the bundle (it climbs above its root, through the links inside it)".into());
                }
            }
            Some(Component::Normal(_)) => {
                let here: PathBuf = std::iter::once(tree.as_os_str())
                    .chain(at.iter().map(OsString::as_os_str))
                    .chain(std::iter::once(name.as_os_str()))
                    .collect();
                let meta = std::fs::symlink_metadata(&here).map_err(|_| {
                    format!(
                        "leads nowhere ({} is not in the bundle)",
                        here.strip_prefix(tree).unwrap_or(&here).display()
                    )
                })?;
                if meta.file_type().is_symlink() {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(format!(
                            "goes through more than {MAX_LINK_HOPS} links (a loop)"
                        ));
                    }
                    follow(&here, &mut pending)?;
                } else if meta.is_dir() {
                    at.push(name);
                } else {
                    ends_at_file = true;
                }
            }
            Some(Component::RootDir | Component::Prefix(_)) => {
                return Err("points outside the bundle (an absolute target)".into())
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use zip::write::SimpleFileOptions;

    fn default_limits() -> ArchiveLimits {
        crate::config::ArchiveSettings::default().limits()
    }

    /// A ZIP made in memory: (name, unix mode, content).
    fn zip_of(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
        let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, mode, bytes) in entries {
            let options = SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated)
                .unix_permissions(*mode);
            if mode & 0o170000 == 0o120000 {
                out.add_symlink(*name, std::str::from_utf8(bytes).unwrap(), options)
                    .unwrap();
            } else if name.ends_with('/') {
                out.add_directory(*name, options).unwrap();
            } else {
                out.start_file(*name, options).unwrap();
                out.write_all(bytes).unwrap();
            }
        }
        out.finish().unwrap().into_inner()
    }

    const MANIFEST: (&str, u32, &[u8]) = ("manifest.json", 0o100644, b"{}");

    /// Sets the unix mode (file type included, which the writer masks) of
    /// entry `name` in the central directory of a ZIP, as a hostile tool
    /// would write it.
    fn with_mode(mut bytes: Vec<u8>, name: &str, mode: u32) -> Vec<u8> {
        let mut i = 0;
        while i + 46 <= bytes.len() {
            if bytes[i..i + 4] == [0x50, 0x4b, 0x01, 0x02] {
                let len = u16::from_le_bytes([bytes[i + 28], bytes[i + 29]]) as usize;
                if &bytes[i + 46..i + 46 + len] == name.as_bytes() {
                    bytes[i + 38..i + 42].copy_from_slice(&(mode << 16).to_le_bytes());
                    return bytes;
                }
            }
            i += 1;
        }
        panic!("no entry {name}");
    }

    fn unpack_bytes(
        bytes: &[u8],
        limits: &ArchiveLimits,
    ) -> (tempfile::TempDir, Result<Unpacked, ArchiveError>) {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("b.mcpb");
        std::fs::write(&archive, bytes).unwrap();
        let result = unpack(
            &archive,
            &dir.path().join("archives"),
            limits,
            &Trust::default(),
            &mut |_, _| {},
        );
        (dir, result)
    }

    /// Nothing of a refused archive is left: no folder, no scratch.
    fn assert_refused(bytes: &[u8], limits: &ArchiveLimits, rule: &str) {
        let (dir, result) = unpack_bytes(bytes, limits);
        match result {
            Err(ArchiveError::Refused { rule: r, archive }) => {
                assert!(r.contains(rule), "{r}");
                assert!(archive.ends_with("b.mcpb"));
            }
            other => panic!("expected a refusal for {rule:?}, got {other:?}"),
        }
        let left: Vec<_> = std::fs::read_dir(dir.path().join("archives"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "left on disk: {left:?}");
    }

    #[test]
    fn a_good_archive_is_unpacked_once_with_its_modes() {
        let bytes = zip_of(&[
            MANIFEST,
            ("server/", 0o040755, b""),
            ("server/run", 0o100755, b"#!/bin/sh\n"),
            ("server/data.txt", 0o100600, b"x"),
            ("server/link", 0o120777, b"run"),
        ]);
        let bytes = with_mode(bytes, "server/run", 0o104755);
        let (dir, result) = unpack_bytes(&bytes, &default_limits());
        let unpacked = result.unwrap();
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::symlink_metadata(unpacked.dir.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("server/run"), 0o755, "setuid dropped");
        assert_eq!(mode("server/data.txt"), 0o600);
        assert_eq!(
            std::fs::read_link(unpacked.dir.join("server/link")).unwrap(),
            Path::new("run")
        );
        assert_eq!(unpacked.sha256, sha256(&dir.path().join("b.mcpb")).unwrap());
        assert_eq!(
            unpacked_sha(&unpacked.dir.join("server"), &dir.path().join("archives")),
            Some(unpacked.sha256.clone())
        );
        // The same archive again: found, not unpacked again.
        std::fs::write(unpacked.dir.join("marker"), "").unwrap();
        let mut told = Vec::new();
        let again = unpack(
            &dir.path().join("b.mcpb"),
            &dir.path().join("archives"),
            &default_limits(),
            &Trust::default(),
            &mut |done, of| told.push((done, of)),
        )
        .unwrap();
        assert_eq!(again, unpacked);
        assert!(told.is_empty(), "nothing unpacked, no progress: {told:?}");
        assert!(again.dir.join("marker").exists());
        // Garbage collection keeps what is named.
        let keep: HashSet<String> = [unpacked.sha256.clone()].into();
        let root = dir.path().join("archives");
        let now = std::time::Duration::ZERO;
        assert_eq!(collect_garbage(&root, &keep, now).unwrap(), 0);
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(
            collect_garbage(&root, &HashSet::new(), hour).unwrap(),
            0,
            "too young"
        );
        assert_eq!(collect_garbage(&root, &HashSet::new(), now).unwrap(), 1);
        assert!(!unpacked.dir.exists());
    }

    /// Issue 34 (7): an unpack tells its progress, from none to every entry.
    #[test]
    fn an_unpack_tells_its_progress_from_none_to_all() {
        let names: Vec<String> = (0..300).map(|i| format!("server/f{i}.txt")).collect();
        let mut entries = vec![MANIFEST];
        entries.extend(names.iter().map(|n| (n.as_str(), 0o100644, &b"x"[..])));
        let bytes = zip_of(&entries);
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("b.mcpb");
        std::fs::write(&archive, &bytes).unwrap();
        let mut told = Vec::new();
        unpack(
            &archive,
            &dir.path().join("archives"),
            &default_limits(),
            &Trust::default(),
            &mut |done, of| told.push((done, of)),
        )
        .unwrap();
        let all = entries.len() as u64;
        assert_eq!(told.first(), Some(&(0, all)));
        assert_eq!(told.last(), Some(&(all, all)));
        assert!(told.windows(2).all(|w| w[0].0 <= w[1].0), "{told:?}");
    }

    #[test]
    fn hostile_archives_are_refused_by_rule_and_leave_nothing() {
        let d = default_limits();
        assert_refused(
            &zip_of(&[MANIFEST, ("../evil", 0o100644, b"x")]),
            &d,
            "climbs out",
        );
        assert_refused(
            &zip_of(&[MANIFEST, ("/etc/evil", 0o100644, b"x")]),
            &d,
            "absolute",
        );
        assert_refused(
            &zip_of(&[MANIFEST, ("a\\b", 0o100644, b"x")]),
            &d,
            "backslash",
        );
        assert_refused(
            &zip_of(&[MANIFEST, ("out", 0o120777, b"../../etc/passwd")]),
            &d,
            "points outside",
        );
        assert_refused(
            &zip_of(&[MANIFEST, ("abs", 0o120777, b"/etc/passwd")]),
            &d,
            "points outside",
        );
        assert_refused(
            &zip_of(&[MANIFEST, ("Run", 0o100644, b"x"), ("run", 0o100644, b"y")]),
            &d,
            "twice",
        );
        let device = with_mode(zip_of(&[MANIFEST, ("dev", 0o100644, b"")]), "dev", 0o020644);
        assert_refused(&device, &d, "device");
        let fifo = with_mode(
            zip_of(&[MANIFEST, ("fifo", 0o100644, b"")]),
            "fifo",
            0o010644,
        );
        assert_refused(&fifo, &d, "device, pipe");
        assert_refused(
            &zip_of(&[("sub/manifest.json", 0o100644, b"{}")]),
            &d,
            "not at its root",
        );
        assert_refused(
            &zip_of(&[("readme", 0o100644, b"x")]),
            &d,
            "no manifest.json",
        );
        assert_refused(b"this is no zip at all", &d, "not a ZIP");
        let good = zip_of(&[MANIFEST, ("a", 0o100644, b"x")]);
        assert_refused(&good[..good.len() - 30], &d, "not a ZIP");
        let few = ArchiveLimits {
            max_entries: 1,
            ..d
        };
        assert_refused(&good, &few, "max_entries");
        let zeros = vec![0u8; 4 * 1024 * 1024];
        let bomb = zip_of(&[MANIFEST, ("zeros", 0o100644, &zeros)]);
        assert_refused(&bomb, &d, "zip bomb");
        let small = ArchiveLimits {
            max_unpacked_bytes: 1024,
            max_ratio: 1_000_000,
            ..d
        };
        assert_refused(&bomb, &small, "max_unpacked_bytes");
        let tiny = ArchiveLimits {
            max_archive_bytes: 10,
            ..d
        };
        assert_refused(&good, &tiny, "max_archive_bytes");
    }

    #[test]
    fn a_signature_block_is_checked_then_cut_off() {
        let mut bytes = zip_of(&[MANIFEST]);
        bytes.extend_from_slice(b"MCPB_SIG_V1\x10\x00\x00\x00not-a-real-pkcs7MCPB_SIG_END");
        assert_eq!(
            signature_block(&bytes).map(|(_, der)| der),
            Some(&b"not-a-real-pkcs7"[..])
        );
        // Checked: not a signature at all.
        assert_refused(&bytes, &default_limits(), "not a PKCS#7 signature");
        // Not checked: cut off, and the ZIP before it unpacked.
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("b.mcpb");
        std::fs::write(&archive, &bytes).unwrap();
        let off = Trust {
            policy: SignaturePolicy::Off,
            anchors: Vec::new(),
        };
        let unpacked = unpack(
            &archive,
            &dir.path().join("archives"),
            &default_limits(),
            &off,
            &mut |_, _| {},
        )
        .unwrap();
        assert!(unpacked.dir.join("manifest.json").is_file());
        assert_eq!(unpacked.signature, Signature::NotChecked);
    }

    #[test]
    fn an_unsigned_archive_is_refused_only_when_signatures_are_required() {
        let bytes = zip_of(&[MANIFEST]);
        let (_dir, result) = unpack_bytes(&bytes, &default_limits());
        assert_eq!(result.unwrap().signature, Signature::Unsigned);
        let require = Trust {
            policy: SignaturePolicy::Require,
            anchors: Vec::new(),
        };
        assert!(verify(&bytes, None, &require)
            .unwrap_err()
            .contains("not signed"));
    }

    #[test]
    fn links_are_judged_by_where_they_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path();
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::create_dir_all(tree.join("server")).unwrap();
        std::fs::write(tree.join("a/c"), "").unwrap();
        std::fs::write(tree.join("server/run"), "").unwrap();
        let link = |at: &str, to: &str| {
            std::os::unix::fs::symlink(to, tree.join(at)).unwrap();
            resolve_inside(tree, Path::new(at))
        };
        assert_eq!(link("a/b/up", "../c"), Ok(()));
        assert_eq!(link("run", "server/run"), Ok(()));
        assert_eq!(link("srv", "./server/"), Ok(()));
        assert_eq!(link("via", "srv/run"), Ok(()), "through a link inside");
        assert!(link("out", "../x").unwrap_err().contains("outside"));
        assert!(link("a/out", "../../x").unwrap_err().contains("outside"));
        assert!(link("a/abs", "/x").unwrap_err().contains("outside"));
        assert!(link("gone", "server/nothing")
            .unwrap_err()
            .contains("nowhere"));
        assert!(link("file", "run/x")
            .unwrap_err()
            .contains("through a file"));
        assert!(link("loop", "loop").unwrap_err().contains("a loop"));
        // Each `..` counted by its text stays inside; resolved, `s` is
        // already the root's child, so `esc` climbs out.
        std::fs::create_dir_all(tree.join("deep/1/2")).unwrap();
        assert_eq!(link("deep/1/2/s", "../.."), Ok(()));
        let esc = link("esc", "deep/1/2/s/../../../etc/passwd").unwrap_err();
        assert!(esc.contains("outside"), "{esc}");
    }
}
