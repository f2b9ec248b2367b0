//! References to secrets kept where operators already keep them (issue 38,
//! in progress): what may stand in place of a sensitive value — a systemd
//! credential, a file (a Kubernetes Secret volume, a Docker secret), the
//! daemon's environment, the `pass` store, GCP Secret Manager, Vault KV v2
//! — parsed, checked against the operator's allow rules, and, for the
//! local sources, resolved. The reference is what gets stored; the value
//! is read at each start and never written anywhere.
//!
//! A reference is never told apart from a literal by its text: a value
//! set as `KEY=env:HOME` is those nine characters. Only a value given as a
//! reference is parsed here.
//!
//! `configure --ref` stores a reference (store::credentials, its own
//! associated data); a bundle's start resolves each one with
//! [`Sources::resolve`] (daemon::bundle::start) and daemon::secret_watch
//! respawns the bundle when a referenced file changes.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use crate::config::AllowRule;
use crate::secret::Secret;

/// The most a referenced value may be (a key file fits many times over).
pub const MAX_VALUE_BYTES: u64 = 64 * 1024;

/// Where a secret is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    /// `credential:NAME`: the file NAME in the daemon's
    /// `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`,
    /// `SetCredentialEncrypted=`, `systemd-creds`).
    Credential(String),
    /// `file:/ABSOLUTE/PATH` (a mounted Kubernetes Secret, a Docker
    /// secret, any file the operator allows).
    File(PathBuf),
    /// `env:NAME`: a variable of the daemon's environment.
    Env(String),
    /// `pass:PATH`: the entry PATH of the `pass` store (its first line).
    Pass(String),
    /// `gcp:projects/P/secrets/S/versions/V` (GCP Secret Manager).
    Gcp {
        project: String,
        secret: String,
        version: String,
    },
    /// `vault:MOUNT/PATH#FIELD`, or `…#FIELD@VERSION` (Vault or OpenBao
    /// KV version 2).
    Vault {
        mount: String,
        path: String,
        field: String,
        version: Option<u64>,
    },
}

/// The forms, for error messages.
const FORMS: &str = "credential:NAME, file:/ABSOLUTE/PATH, env:NAME, pass:PATH, gcp:projects/P/secrets/S/versions/V or vault:MOUNT/PATH#FIELD[@VERSION]";

/// A name of a credential or variable: letters, digits, `_`, `-`, `.`,
/// not starting with `.`.
fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// A relative path of segments that are names (no `.`, `..` or empty one).
fn segments_ok(path: &str) -> bool {
    !path.is_empty() && path.split('/').all(name_ok)
}

impl FromStr for SecretRef {
    type Err = String;

    fn from_str(text: &str) -> Result<SecretRef, String> {
        let bad = |why: &str| Err(format!("{text:?} is not a secret reference: {why}"));
        let Some((scheme, rest)) = text.split_once(':') else {
            return bad(&format!("expected one of {FORMS}"));
        };
        match scheme {
            "credential" if name_ok(rest) => Ok(SecretRef::Credential(rest.into())),
            "credential" => bad("a credential's name is letters, digits, '_', '-' and '.', without '/'"),
            "env" if name_ok(rest) && !rest.contains('.') && !rest.contains('-') => {
                Ok(SecretRef::Env(rest.into()))
            }
            "env" => bad("a variable's name is letters, digits and '_'"),
            "file" => {
                // By its text: `Path::components` would hide a `.`.
                let normal = rest.strip_prefix('/').is_some_and(|r| {
                    r.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
                });
                if normal {
                    Ok(SecretRef::File(PathBuf::from(rest)))
                } else {
                    bad("a file is an absolute path without '.' or '..' segments")
                }
            }
            "pass" if segments_ok(rest) => Ok(SecretRef::Pass(rest.into())),
            "pass" => bad("an entry of the pass store is a relative path of names"),
            "gcp" => match rest.split('/').collect::<Vec<_>>()[..] {
                ["projects", p, "secrets", s, "versions", v]
                    if [p, s, v].iter().all(|x| name_ok(x)) =>
                {
                    Ok(SecretRef::Gcp {
                        project: p.into(),
                        secret: s.into(),
                        version: v.into(),
                    })
                }
                _ => bad("expected gcp:projects/PROJECT/secrets/SECRET/versions/VERSION (VERSION a number or latest)"),
            },
            "vault" => {
                let (location, field) = rest.split_once('#').unwrap_or((rest, ""));
                let (field, version) = match field.split_once('@') {
                    Some((f, v)) => match v.parse::<u64>() {
                        Ok(v) if v > 0 => (f, Some(v)),
                        _ => return bad("a Vault version is a number from 1"),
                    },
                    None => (field, None),
                };
                match location.split_once('/') {
                    Some((mount, path)) if name_ok(mount) && segments_ok(path) && name_ok(field) => {
                        Ok(SecretRef::Vault {
                            mount: mount.into(),
                            path: path.into(),
                            field: field.into(),
                            version,
                        })
                    }
                    _ => bad("expected vault:MOUNT/PATH#FIELD (a KV v2 mount, the secret's path, the field), optionally @VERSION"),
                }
            }
            _ => bad(&format!("unknown kind {scheme:?}; expected one of {FORMS}")),
        }
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Credential(n) => write!(f, "credential:{n}"),
            SecretRef::File(p) => write!(f, "file:{}", p.display()),
            SecretRef::Env(n) => write!(f, "env:{n}"),
            SecretRef::Pass(p) => write!(f, "pass:{p}"),
            SecretRef::Gcp {
                project,
                secret,
                version,
            } => write!(
                f,
                "gcp:projects/{project}/secrets/{secret}/versions/{version}"
            ),
            SecretRef::Vault {
                mount,
                path,
                field,
                version,
            } => {
                write!(f, "vault:{mount}/{path}#{field}")?;
                match version {
                    Some(v) => write!(f, "@{v}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl SecretRef {
    pub fn scheme(&self) -> &'static str {
        match self {
            SecretRef::Credential(_) => "credential",
            SecretRef::File(_) => "file",
            SecretRef::Env(_) => "env",
            SecretRef::Pass(_) => "pass",
            SecretRef::Gcp { .. } => "gcp",
            SecretRef::Vault { .. } => "vault",
        }
    }

    /// What an allow rule's prefix is matched against: a path, or a name.
    fn location(&self) -> String {
        match self {
            SecretRef::Credential(n) | SecretRef::Env(n) => n.clone(),
            SecretRef::File(p) => p.display().to_string(),
            SecretRef::Pass(p) => p.clone(),
            SecretRef::Gcp {
                project, secret, ..
            } => format!("projects/{project}/secrets/{secret}"),
            SecretRef::Vault { mount, path, .. } => format!("{mount}/{path}"),
        }
    }
}

/// Whether `rule` covers a reference of `scheme` at `location`.
fn covers(rule: &AllowRule, scheme: &str, location: &str) -> bool {
    if rule.scheme != scheme {
        return false;
    }
    match scheme {
        "credential" | "env" => match rule.prefix.strip_suffix('*') {
            Some(start) => location.starts_with(start),
            None => location == rule.prefix,
        },
        _ => {
            // `/` (or an empty prefix) is everything of the scheme.
            let (rule, here) = (rule.prefix.trim_end_matches('/'), location);
            rule.is_empty()
                || here == rule
                || (here.starts_with(rule) && here[rule.len()..].starts_with('/'))
        }
    }
}

/// Why a reference gave no value: what an operator fixes (`needs_config`:
/// not allowed, missing, unreadable, too large) or what may pass (a store
/// not reachable). The text names the reference, never a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefError {
    pub reference: String,
    pub why: String,
    pub transient: bool,
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "secret reference {}: {}", self.reference, self.why)
    }
}

impl std::error::Error for RefError {}

impl RefError {
    fn fix(reference: &SecretRef, why: impl Into<String>) -> RefError {
        RefError {
            reference: reference.to_string(),
            why: why.into(),
            transient: false,
        }
    }

    fn transient(reference: &SecretRef, why: impl Into<String>) -> RefError {
        RefError {
            transient: true,
            ..RefError::fix(reference, why)
        }
    }
}

/// Whether `uid` may use `reference` under `rules` (the daemon's own uid
/// under any rule that covers it; another uid only where a rule lists it).
pub fn allowed(
    rules: &[AllowRule],
    reference: &SecretRef,
    uid: u32,
    daemon_uid: u32,
) -> Result<(), RefError> {
    let (scheme, location) = (reference.scheme(), reference.location());
    let covering: Vec<&AllowRule> = rules
        .iter()
        .filter(|r| covers(r, scheme, &location))
        .collect();
    if covering.is_empty() {
        return Err(RefError::fix(
            reference,
            format!("no [secrets] allow rule covers it; add one with scheme = \"{scheme}\" and a prefix over {location:?} to the daemon's config"),
        ));
    }
    if uid != daemon_uid && !covering.iter().any(|r| r.uids.contains(&uid)) {
        return Err(RefError::fix(
            reference,
            format!("uid {uid} may not use it (the [secrets] rules that cover it allow only the daemon's uid and their `uids`)"),
        ));
    }
    Ok(())
}

/// The local sources: where systemd's credentials are, and the daemon's
/// environment.
pub struct Local<'a> {
    /// `$CREDENTIALS_DIRECTORY`, when the daemon has one.
    pub credentials: Option<&'a Path>,
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The daemon's own files (state, key, socket): never read, whatever
    /// a rule allows.
    pub protected: &'a [PathBuf],
    /// `[credentials] key_env`: never read.
    pub key_env: Option<&'a str>,
}

/// The value of a local reference (`credential`, `file`, `env`) for `uid`
/// (`who`: it and the daemon's uid), checked with [`allowed`]. A file is
/// checked again where it really is once open (a link under an allowed
/// folder that points out of it is refused, a Kubernetes `..data` swap is
/// followed), and must be a regular file of at most [`MAX_VALUE_BYTES`].
/// One trailing newline is dropped.
pub fn resolve_local(
    reference: &SecretRef,
    rules: &[AllowRule],
    (uid, daemon_uid): (u32, u32),
    local: &Local<'_>,
) -> Result<Secret, RefError> {
    allowed(rules, reference, uid, daemon_uid)?;
    let own = |real: &Path| local.protected.iter().any(|p| real.starts_with(p));
    let text = match reference {
        SecretRef::Env(name) if local.key_env == Some(name.as_str()) => {
            return Err(RefError::fix(
                reference,
                "it holds the daemon's credential key, which is never a secret source",
            ))
        }
        SecretRef::Env(name) => (local.env)(name)
            .ok_or_else(|| RefError::fix(reference, "the daemon has no such variable"))?,
        SecretRef::Credential(name) => {
            let Some(dir) = local.credentials else {
                return Err(RefError::fix(
                    reference,
                    "the daemon has no $CREDENTIALS_DIRECTORY (give its unit LoadCredential= or SetCredentialEncrypted=)",
                ));
            };
            let within = std::fs::canonicalize(dir)
                .map_err(|e| RefError::fix(reference, format!("$CREDENTIALS_DIRECTORY: {e}")))?;
            // The daemon's own credentials: read with its rights.
            read_checked(
                reference,
                &dir.join(name),
                |real| real.parent() == Some(within.as_path()) && !own(real),
                daemon_uid,
            )?
        }
        SecretRef::File(path) => read_checked(
            reference,
            path,
            |real| {
                !own(real)
                    && allowed(rules, &SecretRef::File(real.to_path_buf()), uid, daemon_uid).is_ok()
            },
            uid,
        )?,
        _ => {
            return Err(RefError::fix(
                reference,
                "not a local source (resolved by its store's client)",
            ))
        }
    };
    Ok(without_newline(&text))
}

/// `text` without one trailing newline (`echo` and editors add one).
fn without_newline(text: &str) -> Secret {
    let text = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(text);
    Secret::new(text)
}

/// Reads `path` with the rights of `uid` (an admitted user's reference
/// reaches only what that user could read itself): opened first as an
/// `O_PATH` handle (links followed; nothing is opened for I/O, so a FIFO
/// does not block and a device is never touched), checked to be a regular
/// file of at most [`MAX_VALUE_BYTES`] where it really is (`inside`), then
/// that very inode opened for reading through `/proc/self/fd` (the read
/// permission checked for `uid` then) and read whole.
fn read_checked(
    reference: &SecretRef,
    path: &Path,
    inside: impl Fn(&Path) -> bool + Send,
    uid: u32,
) -> Result<String, RefError> {
    crate::bundle::sandbox::as_user(uid, || read_regular(reference, path, inside)).unwrap_or_else(
        || {
            Err(RefError::fix(
                reference,
                format!("cannot take the rights of uid {uid} to read it"),
            ))
        },
    )
}

fn read_regular(
    reference: &SecretRef,
    path: &Path,
    inside: impl Fn(&Path) -> bool,
) -> Result<String, RefError> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH)
        .open(path)
        .map_err(|e| RefError::fix(reference, format!("cannot open it: {e}")))?;
    let at = format!("/proc/self/fd/{}", handle.as_raw_fd());
    let real = std::fs::read_link(&at)
        .map_err(|e| RefError::fix(reference, format!("cannot tell where it is: {e}")))?;
    if !inside(&real) {
        return Err(RefError::fix(
            reference,
            format!(
                "it leads to {}, which no [secrets] rule allows",
                real.display()
            ),
        ));
    }
    let meta = handle
        .metadata()
        .map_err(|e| RefError::fix(reference, format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(RefError::fix(reference, "it is not a regular file"));
    }
    if meta.len() > MAX_VALUE_BYTES {
        return Err(RefError::fix(
            reference,
            format!("it is {} bytes, more than {MAX_VALUE_BYTES}", meta.len()),
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(&at)
        .map_err(|e| RefError::fix(reference, format!("cannot open it: {e}")))?;
    let mut text = String::new();
    file.take(MAX_VALUE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| RefError::fix(reference, format!("cannot read it as text: {e}")))?;
    Ok(text)
}

/// A resolved value, and the file whose change changes it (watched for
/// rotation; none for the environment and the cloud stores).
pub struct Resolved {
    pub value: Secret,
    pub watch: Option<PathBuf>,
}

/// Where the references are resolved from: the daemon's `[secrets]`
/// settings, its systemd credentials and what it never hands out.
#[derive(Clone)]
pub struct Sources {
    pub settings: crate::config::SecretsConfig,
    /// `$CREDENTIALS_DIRECTORY` of the daemon.
    pub credentials: Option<PathBuf>,
    pub protected: Vec<PathBuf>,
    pub key_env: Option<String>,
    pub daemon_uid: u32,
    http: reqwest::Client,
}

/// What no reference may read: the daemon's state, key and socket, and
/// the credentials it reads the stores with (token files, the GnuPG
/// home), each also where it really is.
fn protected(config: &crate::config::Config) -> Vec<PathBuf> {
    let mut paths = config.never_secret_sources();
    let real: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    paths.extend(real);
    paths
}

impl Sources {
    pub fn of(config: &crate::config::Config) -> Sources {
        Sources {
            settings: config.secrets.clone(),
            credentials: std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from),
            protected: protected(config),
            key_env: config.credentials.key_env.clone(),
            daemon_uid: nix::unistd::geteuid().as_raw(),
            // A redirect could carry a token to another host.
            // A proxy would see the tokens of an http:// (loopback or
            // metadata) store in the clear.
            http: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(config.secrets.timeout)
                .build()
                .expect("a reqwest client with static settings builds"),
        }
    }

    /// Whether `uid` may use `reference` (checked when it is set).
    pub fn allowed(&self, reference: &SecretRef, uid: u32) -> Result<(), RefError> {
        allowed(&self.settings.allow, reference, uid, self.daemon_uid)
    }

    /// The value of `reference` for the operator `uid` who set it, read
    /// now (within `[secrets] timeout`).
    pub async fn resolve(&self, reference: &SecretRef, uid: u32) -> Result<Resolved, RefError> {
        self.allowed(reference, uid)?;
        let limit = self.settings.timeout;
        let work = async {
            match reference {
                SecretRef::Credential(_) | SecretRef::File(_) | SecretRef::Env(_) => {
                    self.local(reference, uid).await
                }
                SecretRef::Pass(entry) => self.pass(reference, entry, uid).await,
                SecretRef::Gcp { .. } => self.gcp(reference).await,
                SecretRef::Vault { .. } => self.vault(reference).await,
            }
        };
        match tokio::time::timeout(limit, work).await {
            Ok(result) => result,
            Err(_) => Err(RefError::transient(
                reference,
                format!("no answer within {limit:?} ([secrets] timeout)"),
            )),
        }
    }

    async fn local(&self, reference: &SecretRef, uid: u32) -> Result<Resolved, RefError> {
        let (named, reference, this) = (reference.clone(), reference.clone(), self.clone());
        tokio::task::spawn_blocking(move || {
            let local = Local {
                credentials: this.credentials.as_deref(),
                env: &|name| std::env::var(name).ok(),
                protected: &this.protected,
                key_env: this.key_env.as_deref(),
            };
            let value = resolve_local(
                &reference,
                &this.settings.allow,
                (uid, this.daemon_uid),
                &local,
            )?;
            let watch = match &reference {
                SecretRef::Credential(name) => this.credentials.as_ref().map(|d| d.join(name)),
                SecretRef::File(path) => Some(path.clone()),
                _ => None,
            };
            Ok(Resolved { value, watch })
        })
        .await
        .map_err(|e| RefError::transient(&named, e.to_string()))?
    }

    /// The first line of `pass show ENTRY`, run with only the variables
    /// it needs.
    async fn pass(
        &self,
        reference: &SecretRef,
        entry: &str,
        uid: u32,
    ) -> Result<Resolved, RefError> {
        let settings = &self.settings;
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
        let store = settings
            .pass_store
            .clone()
            .unwrap_or_else(|| Path::new(&home).join(".password-store"));
        self.pass_entry(reference, &store, entry, uid).await?;
        let mut command = crate::bundle::helper::command(&settings.pass_command);
        command
            .args(["show", "--", entry])
            .env_clear()
            .env("HOME", &home)
            .env("PASSWORD_STORE_DIR", &store)
            .env("LC_ALL", "C")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        if let Some(gnupg) = &settings.gnupg_home {
            command.env("GNUPGHOME", gnupg);
        }
        let cannot_run = |e: std::io::Error| {
            RefError::fix(
                reference,
                format!(
                    "cannot run {} ({e}); install pass or set [secrets] pass_command",
                    settings.pass_command.display()
                ),
            )
        };
        // Registered with the orphan reaper, its group killed if the
        // timeout drops it.
        let helper = crate::bundle::helper::spawn(&mut command).map_err(cannot_run)?;
        let out = helper
            .output(MAX_VALUE_BYTES + 1)
            .await
            .map_err(cannot_run)?;
        let stdout = zeroize::Zeroizing::new(out.stdout);
        if !out.status.success() {
            // pass and gpg say what is wrong on stderr (never the value).
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(RefError::fix(
                reference,
                format!(
                    "pass failed ({}): {}",
                    out.status,
                    said.chars().take(200).collect::<String>()
                ),
            ));
        }
        if stdout.len() as u64 > MAX_VALUE_BYTES {
            return Err(RefError::fix(
                reference,
                format!("the entry is more than {MAX_VALUE_BYTES} bytes"),
            ));
        }
        let text = std::str::from_utf8(&stdout)
            .map_err(|_| RefError::fix(reference, "the entry is not UTF-8 text"))?;
        Ok(Resolved {
            value: Secret::new(text.lines().next().unwrap_or("")),
            watch: Some(store.join(format!("{entry}.gpg"))),
        })
    }

    /// Checks that `ENTRY.gpg` is a regular file of the store, and that
    /// where it really is (a link inside the store followed) is allowed
    /// for `uid` too: `pass show` of a folder would print a tree, and a
    /// link could lead to an entry no rule allows.
    async fn pass_entry(
        &self,
        reference: &SecretRef,
        store: &Path,
        entry: &str,
        uid: u32,
    ) -> Result<(), RefError> {
        let file = store.join(format!("{entry}.gpg"));
        let missing = |e: std::io::Error| {
            RefError::fix(reference, format!("no such entry in the store: {e}"))
        };
        let real_store = tokio::fs::canonicalize(store).await.map_err(|e| {
            RefError::fix(
                reference,
                format!("the pass store {}: {e}", store.display()),
            )
        })?;
        let real = tokio::fs::canonicalize(&file).await.map_err(missing)?;
        let is_file = tokio::fs::metadata(&real).await.map_err(missing)?.is_file();
        let within = real
            .strip_prefix(&real_store)
            .ok()
            .and_then(|rel| rel.to_str()?.strip_suffix(".gpg").map(str::to_string));
        match within {
            Some(rel) if is_file => self.allowed(&SecretRef::Pass(rel), uid).map_err(|_| {
                RefError::fix(
                    reference,
                    format!(
                        "it leads to {}, which no [secrets] rule allows",
                        real.display()
                    ),
                )
            }),
            Some(_) => Err(RefError::fix(reference, "it is not an entry (a folder?)")),
            None => Err(RefError::fix(
                reference,
                format!("it leads to {}, outside the pass store", real.display()),
            )),
        }
    }

    /// `GET …/versions/V:access` of GCP Secret Manager, with the token of
    /// `[secrets] gcp_token_file` or of the metadata server.
    async fn gcp(&self, reference: &SecretRef) -> Result<Resolved, RefError> {
        let SecretRef::Gcp {
            project,
            secret,
            version,
        } = reference
        else {
            unreachable!("gcp() is called for gcp references")
        };
        let settings = &self.settings;
        let token = match &settings.gcp_token_file {
            Some(file) => token_file(reference, file, "gcp_token_file").await?,
            None => {
                let url = format!(
                    "{}/computeMetadata/v1/instance/service-accounts/default/token",
                    settings.gcp_metadata.trim_end_matches('/')
                );
                let answer = self
                    .get(
                        reference,
                        &url,
                        &[("Metadata-Flavor", "Google")],
                        "the metadata server",
                    )
                    .await?;
                let token = answer["access_token"].as_str().ok_or_else(|| {
                    RefError::fix(
                        reference,
                        "the metadata server's answer has no access_token",
                    )
                })?;
                Secret::new(token)
            }
        };
        let url = format!(
            "{}/v1/projects/{project}/secrets/{secret}/versions/{version}:access",
            settings.gcp_endpoint.trim_end_matches('/')
        );
        let bearer = Secret::new(format!("Bearer {}", token.expose()));
        let answer = self
            .get(
                reference,
                &url,
                &[("Authorization", bearer.expose())],
                "Secret Manager",
            )
            .await?;
        let bad = || RefError::fix(reference, "Secret Manager's answer has no payload.data");
        let data = answer["payload"]["data"].as_str().ok_or_else(bad)?;
        use base64::Engine as _;
        let bytes = zeroize::Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|_| bad())?,
        );
        // int64 in JSON is a string; a number is taken too.
        let sum = &answer["payload"]["dataCrc32c"];
        let sum = sum.as_str().and_then(|s| s.parse().ok()).or(sum.as_u64());
        if sum.is_some_and(|sum| sum != u64::from(crc32c(&bytes))) {
            return Err(RefError::transient(
                reference,
                "the payload does not match its dataCrc32c (damaged on the way)",
            ));
        }
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| RefError::fix(reference, "the secret is not UTF-8 text"))?;
        Ok(Resolved {
            value: without_newline(text),
            watch: None,
        })
    }

    /// `GET /v1/MOUNT/data/PATH[?version=N]` of Vault (or OpenBao) KV
    /// version 2, with the token of `[secrets] vault_token_file`.
    async fn vault(&self, reference: &SecretRef) -> Result<Resolved, RefError> {
        let SecretRef::Vault {
            mount,
            path,
            field,
            version,
        } = reference
        else {
            unreachable!("vault() is called for vault references")
        };
        let settings = &self.settings;
        let Some(addr) = &settings.vault_addr else {
            return Err(RefError::fix(
                reference,
                "the daemon has no [secrets] vault_addr",
            ));
        };
        let Some(file) = &settings.vault_token_file else {
            return Err(RefError::fix(
                reference,
                "the daemon has no [secrets] vault_token_file",
            ));
        };
        let token = token_file(reference, file, "vault_token_file").await?;
        let mut url = format!("{}/v1/{mount}/data/{path}", addr.trim_end_matches('/'));
        if let Some(v) = version {
            url.push_str(&format!("?version={v}"));
        }
        let mut headers = vec![("X-Vault-Token", token.expose())];
        if let Some(ns) = &settings.vault_namespace {
            headers.push(("X-Vault-Namespace", ns.as_str()));
        }
        let answer = self.get(reference, &url, &headers, "Vault").await?;
        let fields = answer["data"]["data"].as_object().ok_or_else(|| {
            RefError::fix(
                reference,
                "Vault's answer has no data.data (is the mount KV version 2, and the version not deleted?)",
            )
        })?;
        match fields.get(field) {
            Some(serde_json::Value::String(text)) => Ok(Resolved {
                value: without_newline(text),
                watch: None,
            }),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => Ok(Resolved {
                value: Secret::new(v.to_string()),
                watch: None,
            }),
            Some(_) => Err(RefError::fix(
                reference,
                format!("field {field:?} is not a string, number or boolean"),
            )),
            None => Err(RefError::fix(
                reference,
                format!("the secret has no field {field:?}"),
            )),
        }
    }

    /// A GET answered with JSON; a failure named by its status (never by
    /// its body, which could echo what was sent).
    async fn get(
        &self,
        reference: &SecretRef,
        url: &str,
        headers: &[(&str, &str)],
        store: &str,
    ) -> Result<serde_json::Value, RefError> {
        let mut request = self.http.get(url);
        for (name, value) in headers {
            let Ok(mut value) = reqwest::header::HeaderValue::from_str(value) else {
                return Err(RefError::fix(
                    reference,
                    format!("the {name} the daemon has is not a valid header value"),
                ));
            };
            // Tokens are kept out of reqwest's own debug output.
            value.set_sensitive(true);
            request = request.header(*name, value);
        }
        let response = request.send().await.map_err(|e| {
            RefError::transient(
                reference,
                format!("{store} is unreachable: {}", e.without_url()),
            )
        })?;
        let status = response.status();
        let failed = |why: String| match status.as_u16() {
            429 | 500..=599 => RefError::transient(reference, why),
            _ => RefError::fix(reference, why),
        };
        match status.as_u16() {
            200 => {}
            404 => return Err(failed(format!("{store} has no such secret (HTTP 404)"))),
            401 | 403 => {
                return Err(failed(format!(
                    "{store} refused the daemon's credentials (HTTP {})",
                    status.as_u16()
                )))
            }
            300..=399 => {
                return Err(RefError::transient(
                    reference,
                    format!(
                        "{store} answered HTTP {} (a redirect, which is never followed: a Vault standby sends one; give the active node's address)",
                        status.as_u16()
                    ),
                ))
            }
            code => return Err(failed(format!("{store} answered HTTP {code}"))),
        }
        let body = zeroize::Zeroizing::new(
            response
                .bytes()
                .await
                .map_err(|e| {
                    RefError::transient(reference, format!("{store}: {}", e.without_url()))
                })?
                .to_vec(),
        );
        serde_json::from_slice(&body)
            .map_err(|_| RefError::fix(reference, format!("{store}'s answer is not JSON")))
    }
}

/// A token kept in a file of the daemon's configuration (trimmed).
async fn token_file(reference: &SecretRef, file: &Path, setting: &str) -> Result<Secret, RefError> {
    let text = tokio::fs::read_to_string(file).await.map_err(|e| {
        let why = format!("[secrets] {setting} {}: {e}", file.display());
        // A Vault Agent's (or a refresher's) sink may not be written yet.
        match e.kind() {
            std::io::ErrorKind::NotFound => RefError::transient(reference, why),
            _ => RefError::fix(reference, why),
        }
    })?;
    let text = zeroize::Zeroizing::new(text);
    Ok(Secret::new(text.trim()))
}

/// CRC-32C (Castagnoli), as Secret Manager's `dataCrc32c`.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(scheme: &str, prefix: &str, uids: &[u32]) -> AllowRule {
        AllowRule {
            scheme: scheme.into(),
            prefix: prefix.into(),
            uids: uids.to_vec(),
        }
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for text in [
            "credential:db-password",
            "file:/run/secrets/db/password",
            "env:GITHUB_TOKEN",
            "pass:team/github/token",
            "gcp:projects/acme/secrets/github/versions/latest",
            "gcp:projects/acme/secrets/github/versions/3",
            "vault:secret/teams/acme#token",
            "vault:kv/app/db#password@4",
        ] {
            let parsed: SecretRef = text.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn a_malformed_reference_is_refused_with_the_form_it_needs() {
        for (text, says) in [
            ("HOME", "expected one of credential:NAME"),
            ("nope:x", "unknown kind \"nope\""),
            ("credential:../x", "without '/'"),
            ("credential:a/b", "without '/'"),
            ("env:", "letters, digits and '_'"),
            ("env:A-B", "letters, digits and '_'"),
            ("file:relative/x", "absolute path"),
            ("file:/run/secrets/../../etc/shadow", "absolute path"),
            ("file:/run/./x", "absolute path"),
            ("pass:/abs", "relative path"),
            ("pass:a/../b", "relative path"),
            ("gcp:projects/a/secrets/b", "versions/VERSION"),
            ("vault:secret#token", "vault:MOUNT/PATH#FIELD"),
            ("vault:secret/app", "vault:MOUNT/PATH#FIELD"),
            ("vault:secret/app#f@0", "from 1"),
        ] {
            let err = text.parse::<SecretRef>().unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_rule_covers_whole_segments_and_names_only() {
        let rules = [
            rule("file", "/run/secrets", &[]),
            rule("env", "GITHUB_*", &[]),
            rule("credential", "db", &[1000]),
            rule("vault", "secret/teams", &[]),
        ];
        let ok = |r: &str, uid| allowed(&rules, &r.parse().unwrap(), uid, 0);
        assert!(ok("file:/run/secrets/db", 0).is_ok());
        assert!(ok("file:/run/secrets/a/b", 0).is_ok());
        let err = ok("file:/run/secrets-old/db", 0).unwrap_err();
        assert!(err.why.contains("no [secrets] allow rule"), "{err}");
        assert!(ok("env:GITHUB_TOKEN", 0).is_ok());
        assert!(ok("env:HOME", 0).is_err());
        assert!(ok("credential:db", 0).is_ok());
        assert!(ok("credential:db2", 0).is_err());
        assert!(ok("vault:secret/teams/acme#t", 0).is_ok());
        assert!(ok("vault:secret/teamsx#t", 0).is_err());
        // Another uid: only where a covering rule lists it.
        assert!(ok("credential:db", 1000).is_ok());
        let err = ok("file:/run/secrets/db", 1000).unwrap_err();
        assert!(err.why.contains("uid 1000 may not use it"), "{err}");
        assert!(err
            .to_string()
            .starts_with("secret reference file:/run/secrets/db: "));
        // No rules: nothing is allowed.
        assert!(allowed(&[], &"env:GITHUB_TOKEN".parse().unwrap(), 0, 0).is_err());
    }

    fn local_env(name: &str) -> Option<String> {
        (name == "GITHUB_TOKEN").then(|| "ghp_example\n".to_string())
    }

    #[test]
    fn a_kubernetes_secret_is_read_through_its_data_link_and_follows_a_swap() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // The layout the kubelet makes: a timestamped folder, `..data`
        // pointing at it, the key a link through `..data`.
        std::fs::create_dir(root.join("..2026_11_27_a")).unwrap();
        std::fs::write(root.join("..2026_11_27_a/token"), "first\n").unwrap();
        std::os::unix::fs::symlink("..2026_11_27_a", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", root.join("token")).unwrap();
        let rules = [rule("file", &root.display().to_string(), &[])];
        let reference = SecretRef::File(root.join("token"));
        let local = Local {
            credentials: None,
            env: &local_env,
            protected: &[],
            key_env: None,
        };
        let read = || resolve_local(&reference, &rules, (0, 0), &local);
        assert_eq!(read().unwrap().expose(), "first");
        // The update: a new folder, a new link renamed over `..data`.
        std::fs::create_dir(root.join("..2026_11_27_b")).unwrap();
        std::fs::write(root.join("..2026_11_27_b/token"), "second").unwrap();
        std::os::unix::fs::symlink("..2026_11_27_b", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        assert_eq!(read().unwrap().expose(), "second");
    }

    #[test]
    fn a_link_out_of_the_allowed_folder_a_fifo_and_a_large_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (allowed_dir, outside) = (dir.path().join("secrets"), dir.path().join("private"));
        std::fs::create_dir(&allowed_dir).unwrap();
        std::fs::write(&outside, "root's secret").unwrap();
        std::os::unix::fs::symlink(&outside, allowed_dir.join("escape")).unwrap();
        nix::unistd::mkfifo(&allowed_dir.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(
            allowed_dir.join("big"),
            vec![b'x'; MAX_VALUE_BYTES as usize + 1],
        )
        .unwrap();
        let rules = [rule("file", &allowed_dir.display().to_string(), &[])];
        let local = Local {
            credentials: None,
            env: &local_env,
            protected: &[],
            key_env: None,
        };
        let read = |name: &str| {
            resolve_local(
                &SecretRef::File(allowed_dir.join(name)),
                &rules,
                (0, 0),
                &local,
            )
            .unwrap_err()
        };
        let escape = read("escape");
        assert!(
            escape.why.contains("which no [secrets] rule allows"),
            "{escape}"
        );
        assert!(!escape.to_string().contains("root's secret"));
        assert!(read("fifo").why.contains("not a regular file"));
        assert!(read("big").why.contains("more than"));
        assert!(read("missing").why.contains("cannot open it"));
    }

    #[test]
    fn a_credential_and_a_variable_are_read_with_one_newline_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("db"), "s3cret\r\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("out")).unwrap();
        let local = Local {
            credentials: Some(dir.path()),
            env: &local_env,
            protected: &[],
            key_env: None,
        };
        let rules = [
            rule("credential", "*", &[]),
            rule("env", "GITHUB_*", &[]),
            rule("env", "NOPE", &[]),
        ];
        let get = |r: &str| resolve_local(&r.parse().unwrap(), &rules, (0, 0), &local);
        assert_eq!(get("credential:db").unwrap().expose(), "s3cret");
        assert_eq!(get("env:GITHUB_TOKEN").unwrap().expose(), "ghp_example");
        assert!(get("env:NOPE")
            .unwrap_err()
            .why
            .contains("no such variable"));
        // A credential that leads out of the credentials folder.
        assert!(get("credential:out").unwrap_err().why.contains("leads to"));
        let none = Local {
            credentials: None,
            env: &local_env,
            protected: &[],
            key_env: None,
        };
        let err =
            resolve_local(&"credential:db".parse().unwrap(), &rules, (0, 0), &none).unwrap_err();
        assert!(err.why.contains("LoadCredential="), "{err}");
        // Not allowed: never read, whatever it holds.
        assert!(get("env:HOME")
            .unwrap_err()
            .why
            .contains("no [secrets] allow rule"));
        // Not a local source.
        let pass = [rule("pass", "", &[])];
        let err = resolve_local(&"pass:a/b".parse().unwrap(), &pass, (0, 0), &local).unwrap_err();
        assert!(err.why.contains("not a local source"), "{err}");
    }

    #[test]
    fn the_daemons_own_files_and_key_variable_are_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join("credentials.key"), "key").unwrap();
        let rules = [rule("file", "/", &[]), rule("env", "*", &[])];
        let protected = [state.clone()];
        let local = Local {
            credentials: None,
            env: &local_env,
            protected: &protected,
            key_env: Some("GITHUB_TOKEN"),
        };
        let file = SecretRef::File(state.join("credentials.key"));
        let err = resolve_local(&file, &rules, (0, 0), &local).unwrap_err();
        assert!(err.why.contains("leads to"), "{err}");
        let err = resolve_local(
            &SecretRef::Env("GITHUB_TOKEN".into()),
            &rules,
            (0, 0),
            &local,
        )
        .unwrap_err();
        assert!(err.why.contains("credential key"), "{err}");
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // The check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }
}
