//! Encryption at rest for credentials and OAuth tokens: XChaCha20-Poly1305
//! (RustCrypto `chacha20poly1305`) under one 256-bit key.
//!
//! The key comes from, in this order: the environment variable named by
//! `[credentials] key_env`, the file named by `[credentials] key_file`, or
//! `STATE_DIR/credentials.key`, which the daemon creates (mode 0600) on
//! first start. A key file readable by group or others is refused, as ssh
//! refuses such a private key. The key is base64 text (44 characters).
//!
//! A sealed value is `version (1 byte) || nonce (24 bytes) || ciphertext+tag`.
//! Every value is sealed with associated data naming what it is (for
//! example the workspace, bundle and key of a credential), so a ciphertext
//! copied onto another row does not decrypt.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::config::CredentialsConfig;

const SEAL_VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const KEY_LEN: usize = 32;

/// The default key file's name inside the state dir.
pub const KEY_FILE_NAME: &str = "credentials.key";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("environment variable {0} (named by [credentials] key_env) is not set; set it to the base64 key, or remove key_env to use a key file")]
    EnvMissing(String),
    #[error("credential key file {path} does not exist; restore it from your backup (a new key cannot decrypt the stored credentials), or remove [credentials] key_file to let the daemon create one in the state dir")]
    FileMissing { path: PathBuf },
    #[error("credential key file {path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`")]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("credential key {origin} is not a base64-encoded 32-byte key")]
    Malformed { origin: String },
    #[error("cannot {action} credential key file {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("a stored secret could not be decrypted (wrong credential key, or the value was altered)")]
pub struct OpenError;

/// Where the key came from, for the daemon's start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    Env(String),
    File(PathBuf),
    Created(PathBuf),
}

impl std::fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyOrigin::Env(var) => write!(f, "environment variable {var}"),
            KeyOrigin::File(p) => write!(f, "{}", p.display()),
            KeyOrigin::Created(p) => write!(f, "{} (created now)", p.display()),
        }
    }
}

/// The credential cipher. `Debug` shows nothing of the key.
pub struct Cipher {
    aead: XChaCha20Poly1305,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher([redacted])")
    }
}

impl Cipher {
    /// Loads (or, for the default key file, creates) the key.
    pub fn load(
        config: &CredentialsConfig,
        state_dir: &Path,
    ) -> Result<(Cipher, KeyOrigin), KeyError> {
        if let Some(var) = &config.key_env {
            let text =
                Zeroizing::new(std::env::var(var).map_err(|_| KeyError::EnvMissing(var.clone()))?);
            let key = decode_key(&text, &format!("in environment variable {var}"))?;
            return Ok((Cipher::from_key(&key), KeyOrigin::Env(var.clone())));
        }
        let path = key_path(config, state_dir).expect("key_env handled above");
        let may_create = config.key_file.is_none();
        match read_key_file(&path) {
            Ok(key) => Ok((Cipher::from_key(&key), KeyOrigin::File(path))),
            Err(KeyError::FileMissing { .. }) if may_create => {
                let key = create_key_file(&path)?;
                Ok((Cipher::from_key(&key), KeyOrigin::Created(path)))
            }
            Err(e) => Err(e),
        }
    }

    /// The key in a key file (which must be private).
    pub fn from_file(path: &Path) -> Result<Cipher, KeyError> {
        let key = read_key_file(path)?;
        Ok(Cipher::from_key(&key))
    }

    pub fn from_key(key: &[u8; KEY_LEN]) -> Cipher {
        Cipher {
            aead: XChaCha20Poly1305::new(key.into()),
        }
    }

    /// A fresh random key as base64 text (what a key file holds).
    pub fn generate_key_text() -> Zeroizing<String> {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(key))
    }

    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ciphertext = self
            .aead
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory values");
        let mut out = Vec::with_capacity(1 + NONCE_LEN + ciphertext.len());
        out.push(SEAL_VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ciphertext);
        out
    }

    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, OpenError> {
        if sealed.len() < 1 + NONCE_LEN || sealed[0] != SEAL_VERSION {
            return Err(OpenError);
        }
        let nonce = XNonce::from_slice(&sealed[1..1 + NONCE_LEN]);
        self.aead
            .decrypt(
                nonce,
                Payload {
                    msg: &sealed[1 + NONCE_LEN..],
                    aad,
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| OpenError)
    }
}

/// The key file in use: `[credentials] key_file`, or the state dir's
/// default; `None` when the key comes from the environment (`key_env`).
pub fn key_path(config: &CredentialsConfig, state_dir: &Path) -> Option<PathBuf> {
    if config.key_env.is_some() {
        return None;
    }
    Some(
        config
            .key_file
            .clone()
            .unwrap_or_else(|| state_dir.join(KEY_FILE_NAME)),
    )
}

/// Where `rotate-key` writes the new key before the stored secrets are
/// re-sealed with it: `KEY_FILE.new`, next to the key file (same file
/// system, so the final rename is atomic).
pub fn pending_key_path(key_path: &Path) -> PathBuf {
    let mut name = key_path.as_os_str().to_owned();
    name.push(".new");
    PathBuf::from(name)
}

/// Writes a fresh key to `pending` (mode 0600, synced), replacing a
/// leftover of an earlier attempt, and returns its cipher.
pub fn write_pending_key(pending: &Path) -> Result<Cipher, KeyError> {
    match std::fs::remove_file(pending) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KeyError::Io {
                action: "replace",
                path: pending.to_path_buf(),
                source,
            })
        }
    }
    let key = create_key_file(pending)?;
    Ok(Cipher::from_key(&key))
}

/// Makes the pending key the key file (atomic rename, directory synced).
pub fn promote_pending_key(key_path: &Path) -> Result<(), KeyError> {
    let pending = pending_key_path(key_path);
    let io = |source| KeyError::Io {
        action: "replace",
        path: key_path.to_path_buf(),
        source,
    };
    std::fs::rename(&pending, key_path).map_err(io)?;
    if let Some(dir) = key_path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

fn decode_key(text: &str, origin: &str) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let malformed = || KeyError::Malformed {
        origin: origin.to_string(),
    };
    let bytes = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| malformed())?,
    );
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    if bytes.len() != KEY_LEN {
        return Err(malformed());
    }
    key.copy_from_slice(&bytes);
    Ok(key)
}

fn read_key_file(path: &Path) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let io = |action, source| KeyError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(KeyError::FileMissing {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(io("read", e)),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| io("read", e))?);
    decode_key(&text, &format!("file {}", path.display()))
}

/// Creates the key file with mode 0600, never overwriting one (`O_EXCL`).
fn create_key_file(path: &Path) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let io = |source| KeyError::Io {
        action: "create",
        path: path.to_path_buf(),
        source,
    };
    let text = Cipher::generate_key_text();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)?;
    file.write_all(b"\n").map_err(io)?;
    file.sync_all().map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    decode_key(&text, "just generated")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(key_file: Option<PathBuf>, key_env: Option<&str>) -> CredentialsConfig {
        CredentialsConfig {
            key_file,
            key_env: key_env.map(str::to_string),
        }
    }

    #[test]
    fn seal_open_round_trip_and_aad_binds_the_value() {
        let cipher = Cipher::from_key(&[7; 32]);
        let sealed = cipher.seal(b"ws/b/key", b"sk-canary");
        assert!(!sealed.windows(9).any(|w| w == b"sk-canary"));
        assert_eq!(&*cipher.open(b"ws/b/key", &sealed).unwrap(), b"sk-canary");
        assert!(cipher.open(b"ws/b/other", &sealed).is_err());
        assert!(Cipher::from_key(&[8; 32])
            .open(b"ws/b/key", &sealed)
            .is_err());
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(cipher.open(b"ws/b/key", &flipped).is_err());
        assert!(cipher.open(b"ws/b/key", &sealed[..10]).is_err());
        // Fresh nonce per seal.
        assert_ne!(sealed, cipher.seal(b"ws/b/key", b"sk-canary"));
    }

    #[test]
    fn default_key_file_is_created_0600_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, origin) = Cipher::load(&config(None, None), dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE_NAME);
        assert_eq!(origin, KeyOrigin::Created(path.clone()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (b, origin) = Cipher::load(&config(None, None), dir.path()).unwrap();
        assert_eq!(origin, KeyOrigin::File(path));
        let sealed = a.seal(b"x", b"value");
        assert_eq!(&*b.open(b"x", &sealed).unwrap(), b"value");
    }

    #[test]
    fn a_named_key_file_is_never_created_and_must_be_private() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("elsewhere.key");
        let err = Cipher::load(&config(Some(named.clone()), None), dir.path()).unwrap_err();
        assert!(matches!(err, KeyError::FileMissing { .. }), "{err}");
        assert!(!named.exists());
        std::fs::write(&named, Cipher::generate_key_text().as_bytes()).unwrap();
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Cipher::load(&config(Some(named.clone()), None), dir.path()).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o600)).unwrap();
        Cipher::load(&config(Some(named.clone()), None), dir.path()).unwrap();
        std::fs::write(&named, "not a key").unwrap();
        let err = Cipher::load(&config(Some(named), None), dir.path()).unwrap_err();
        assert!(matches!(err, KeyError::Malformed { .. }), "{err}");
    }

    #[test]
    fn key_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let var = "BUNDLEVISOR_TEST_KEY_FROM_ENV";
        let err = Cipher::load(&config(None, Some(var)), dir.path()).unwrap_err();
        assert!(err.to_string().contains(var), "{err}");
        // SAFETY: this variable is used by this test only.
        unsafe { std::env::set_var(var, Cipher::generate_key_text().as_str()) };
        let (_, origin) = Cipher::load(&config(None, Some(var)), dir.path()).unwrap();
        assert_eq!(origin, KeyOrigin::Env(var.into()));
        assert!(!dir.path().join(KEY_FILE_NAME).exists());
    }
}
