//! Stored credentials: user_config values set by `bundlevisor configure`
//! and the OAuth tokens of remote bundles, sealed by [`super::crypto`].
//!
//! Every value is encrypted, sensitive or not (the `sensitive` column only
//! decides what is redacted and masked). The associated data binds each
//! ciphertext to its row: `credential\0WS\0BUNDLE\0KEY` for a value,
//! `credential-ref\0WS\0BUNDLE\0KEY` for a reference to a secret kept
//! elsewhere (so no row can be turned from one into the other), or
//! `oauth\0WS\0BUNDLE`. A `meta` row sealed at first use lets the daemon
//! tell at start that it was given the wrong key, instead of failing on
//! each bundle later.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::crypto::Cipher;
use super::{Store, StoreError};
use crate::secret::Secret;

const KEY_CHECK: &str = "credential_key_check";
const KEY_CHECK_PLAIN: &[u8] = b"bundlevisor credential key";

/// One stored key of a bundle (never its value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub key: String,
    pub sensitive: bool,
    /// The entry is a reference (the value is read at each start).
    pub reference: bool,
    /// Unix seconds.
    pub updated_at: i64,
}

/// A change made by one `configure` call.
#[derive(Debug, Clone)]
pub enum Change {
    Set {
        key: String,
        value: Secret,
        sensitive: bool,
    },
    /// A reference to a secret kept elsewhere, instead of its value.
    SetRef {
        key: String,
        reference: StoredRef,
    },
    Unset(String),
}

/// A stored reference (`credential:NAME`, `file:/PATH`, ...; see
/// [`crate::secret_ref`]) and the uid of the operator who set it, whose
/// rights it is resolved with at each start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRef {
    pub reference: String,
    pub uid: u32,
    /// The uid that owned the bundle's source when it was set: a bundle
    /// installed again by someone else does not inherit it.
    #[serde(default)]
    pub owner: Option<u32>,
}

/// The two kinds of `credentials` rows.
const VALUE: &str = "value";
const REF: &str = "ref";

/// The OAuth tokens (and dynamically registered client) of a remote bundle.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenSet {
    pub access_token: Option<Secret>,
    pub refresh_token: Option<Secret>,
    /// Unix seconds; `None` when the server did not say.
    pub expires_at: Option<i64>,
    /// A client registered with the authorization server (RFC 7591).
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    /// Scopes the server said a token lacks (403 `insufficient_scope`)
    /// and no silent grant got: the next authorization asks for them.
    pub wanted_scopes: Vec<String>,
    /// The `issuer` of the authorization server that registered the client
    /// and issued the tokens: neither is used with another one. `None` in
    /// sets stored before the issuer was recorded.
    pub issuer: Option<String>,
    /// The `WWW-Authenticate` challenge of the server's last 401 or 403:
    /// `bundlevisor auth` discovers from its `resource_metadata` and asks
    /// for its `scope`.
    pub challenge: Option<String>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet")
            .field("access_token", &self.access_token.is_some())
            .field("refresh_token", &self.refresh_token.is_some())
            .field("expires_at", &self.expires_at)
            .field("client_id", &self.client_id)
            .field("wanted_scopes", &self.wanted_scopes)
            .field("issuer", &self.issuer)
            .field("challenge", &self.challenge)
            .finish()
    }
}

/// The sealed JSON form of a [`TokenSet`].
#[derive(Serialize, Deserialize)]
struct TokenJson {
    access_token: Option<String>,
    refresh_token: Option<String>,
    expires_at: Option<i64>,
    client_id: Option<String>,
    client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    wanted_scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    challenge: Option<String>,
}

fn credential_aad(workspace: &str, bundle: &str, key: &str) -> Vec<u8> {
    format!("credential\0{workspace}\0{bundle}\0{key}").into_bytes()
}

fn ref_aad(workspace: &str, bundle: &str, key: &str) -> Vec<u8> {
    format!("credential-ref\0{workspace}\0{bundle}\0{key}").into_bytes()
}

/// The associated data of a `credentials` row of `kind`.
fn row_aad(kind: &str, workspace: &str, bundle: &str, key: &str) -> Vec<u8> {
    if kind == REF {
        ref_aad(workspace, bundle, key)
    } else {
        credential_aad(workspace, bundle, key)
    }
}

fn token_aad(workspace: &str, bundle: &str) -> Vec<u8> {
    format!("oauth\0{workspace}\0{bundle}").into_bytes()
}

/// Handle to the credential tables; cheap to clone.
///
/// The cipher is behind a lock that every seal-and-write and read-and-open
/// holds for its whole length, and that [`Credentials::rotate`] takes
/// exclusively: no value is ever written under a key the table is no
/// longer sealed with, nor read under one it is not yet sealed with.
#[derive(Clone)]
pub struct Credentials {
    store: Store,
    cipher: Arc<RwLock<Cipher>>,
}

/// What a key rotation re-sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    pub values: usize,
    pub token_sets: usize,
}

/// What is stored for one bundle (never a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFor {
    pub workspace: String,
    pub bundle: String,
    /// The user_config keys with a value.
    pub keys: Vec<String>,
    /// OAuth tokens are stored.
    pub tokens: bool,
}

impl Credentials {
    /// Checks that `cipher` is the key the stored values were sealed with
    /// (recording it on first use).
    pub fn open(store: Store, cipher: Cipher) -> Result<Credentials, StoreError> {
        let aad = KEY_CHECK.as_bytes();
        let found: Option<Vec<u8>> = store.with(|c| {
            c.query_row("SELECT value FROM meta WHERE key = ?1", [KEY_CHECK], |r| {
                r.get(0)
            })
            .optional()
        })?;
        match found {
            Some(sealed) => {
                if cipher.open(aad, &sealed).is_err() {
                    return Err(StoreError::KeyMismatch {
                        path: store.path.clone(),
                    });
                }
            }
            None => {
                let sealed = cipher.seal(aad, KEY_CHECK_PLAIN);
                store.with(|c| {
                    c.execute(
                        "INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)",
                        params![KEY_CHECK, sealed],
                    )
                })?;
            }
        }
        Ok(Credentials {
            store,
            cipher: Arc::new(RwLock::new(cipher)),
        })
    }

    fn cipher(&self) -> RwLockReadGuard<'_, Cipher> {
        self.cipher.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-seals every stored value, token set and the key check under
    /// `new` in one transaction, then uses `new` from here on. Nothing
    /// changes if any stored value does not open with the current key.
    pub fn rotate(&self, new: Cipher) -> Result<Resealed, StoreError> {
        let mut current = self.cipher.write().unwrap_or_else(|p| p.into_inner());
        let failed = |what: String| StoreError::Decrypt { what };
        // Outer error: SQLite; inner: a value that does not open (the
        // transaction is dropped, so rolled back).
        let counts = self.store.with(|c| {
            let mut counts = Resealed {
                values: 0,
                token_sets: 0,
            };
            let tx = c.transaction()?;
            type Row = (String, String, String, Vec<u8>, String);
            let values: Vec<Row> = tx
                .prepare("SELECT workspace, bundle, key, value, kind FROM credentials")?
                .query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?
                .collect::<Result<_, _>>()?;
            for (ws, bundle, key, sealed, kind) in values {
                let aad = row_aad(&kind, &ws, &bundle, &key);
                let Ok(plain) = current.open(&aad, &sealed) else {
                    return Ok(Err(failed(format!(
                        "user_config value {key:?} of bundle {bundle:?}"
                    ))));
                };
                tx.execute(
                    "UPDATE credentials SET value = ?4 WHERE workspace = ?1 AND bundle = ?2 AND key = ?3",
                    params![ws, bundle, key, new.seal(&aad, &plain)],
                )?;
                counts.values += 1;
            }
            let tokens: Vec<(String, String, Vec<u8>)> = tx
                .prepare("SELECT workspace, bundle, value FROM oauth_tokens")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?;
            for (ws, bundle, sealed) in tokens {
                let aad = token_aad(&ws, &bundle);
                let Ok(plain) = current.open(&aad, &sealed) else {
                    return Ok(Err(failed(format!("OAuth tokens of bundle {bundle:?}"))));
                };
                tx.execute(
                    "UPDATE oauth_tokens SET value = ?3 WHERE workspace = ?1 AND bundle = ?2",
                    params![ws, bundle, new.seal(&aad, &plain)],
                )?;
                counts.token_sets += 1;
            }
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![KEY_CHECK, new.seal(KEY_CHECK.as_bytes(), KEY_CHECK_PLAIN)],
            )?;
            tx.commit()?;
            Ok(Ok(counts))
        })??;
        *current = new;
        Ok(counts)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Every stored value of a bundle, decrypted (not its references).
    pub fn values(
        &self,
        workspace: &str,
        bundle: &str,
    ) -> Result<BTreeMap<String, Secret>, StoreError> {
        let opened = self.opened(workspace, bundle, VALUE)?;
        let mut out = BTreeMap::new();
        for (key, mut text) in opened {
            out.insert(key, Secret::new(std::mem::take(&mut *text)));
        }
        Ok(out)
    }

    /// Every stored reference of a bundle, decrypted.
    pub fn refs(
        &self,
        workspace: &str,
        bundle: &str,
    ) -> Result<BTreeMap<String, StoredRef>, StoreError> {
        let opened = self.opened(workspace, bundle, REF)?;
        let mut out = BTreeMap::new();
        for (key, text) in opened {
            let reference = serde_json::from_str(&text).map_err(|_| StoreError::Decrypt {
                what: format!("user_config reference {key:?} of bundle {bundle:?}"),
            })?;
            out.insert(key, reference);
        }
        Ok(out)
    }

    /// The rows of `kind` of a bundle, opened (as text held only while it
    /// is turned into what the caller keeps).
    fn opened(
        &self,
        workspace: &str,
        bundle: &str,
        kind: &str,
    ) -> Result<Vec<(String, Zeroizing<String>)>, StoreError> {
        let cipher = self.cipher();
        let rows: Vec<(String, Vec<u8>)> = self.store.with(|c| {
            let mut stmt = c.prepare(
                "SELECT key, value FROM credentials WHERE workspace = ?1 AND bundle = ?2 AND kind = ?3",
            )?;
            let rows = stmt.query_map(params![workspace, bundle, kind], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
            rows.collect()
        })?;
        let mut out = Vec::with_capacity(rows.len());
        for (key, sealed) in rows {
            let what = || StoreError::Decrypt {
                what: format!("user_config entry {key:?} of bundle {bundle:?}"),
            };
            let plain = cipher
                .open(&row_aad(kind, workspace, bundle, &key), &sealed)
                .map_err(|_| what())?;
            let text = String::from_utf8(plain.to_vec()).map_err(|_| what())?;
            out.push((key, Zeroizing::new(text)));
        }
        Ok(out)
    }

    /// The stored keys of a bundle, without values.
    pub fn keys(&self, workspace: &str, bundle: &str) -> Result<Vec<StoredKey>, StoreError> {
        self.store.with(|c| {
            let mut stmt = c.prepare(
                "SELECT key, sensitive, updated_at, kind FROM credentials WHERE workspace = ?1 AND bundle = ?2 ORDER BY key",
            )?;
            let rows = stmt.query_map(params![workspace, bundle], |r| {
                Ok(StoredKey {
                    key: r.get(0)?,
                    sensitive: r.get::<_, i64>(1)? != 0,
                    updated_at: r.get(2)?,
                    reference: r.get::<_, String>(3)? == REF,
                })
            })?;
            rows.collect()
        })
    }

    /// Applies one `configure` call's changes in one transaction.
    pub fn apply(
        &self,
        workspace: &str,
        bundle: &str,
        changes: &[Change],
    ) -> Result<(), StoreError> {
        // (key, Some((ciphertext, sensitive, kind))) to store, (key, None)
        // to delete.
        type Row = (String, Option<(Vec<u8>, bool, &'static str)>);
        let cipher = self.cipher();
        let sealed: Vec<Row> = changes
            .iter()
            .map(|change| match change {
                Change::Set {
                    key,
                    value,
                    sensitive,
                } => (
                    key.clone(),
                    Some((
                        cipher.seal(
                            &credential_aad(workspace, bundle, key),
                            value.expose().as_bytes(),
                        ),
                        *sensitive,
                        VALUE,
                    )),
                ),
                Change::SetRef { key, reference } => {
                    let json = Zeroizing::new(
                        serde_json::to_string(reference).expect("a reference serializes"),
                    );
                    let blob = cipher.seal(&ref_aad(workspace, bundle, key), json.as_bytes());
                    // Only sensitive entries take references.
                    (key.clone(), Some((blob, true, REF)))
                }
                Change::Unset(key) => (key.clone(), None),
            })
            .collect();
        let at = crate::clock::unix_secs();
        self.store.with(|c| {
            let tx = c.transaction()?;
            for (key, value) in &sealed {
                match value {
                    Some((blob, sensitive, kind)) => tx.execute(
                        "INSERT INTO credentials (workspace, bundle, key, sensitive, value, updated_at, kind)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                         ON CONFLICT (workspace, bundle, key) DO UPDATE
                         SET sensitive = excluded.sensitive, value = excluded.value,
                             updated_at = excluded.updated_at, kind = excluded.kind",
                        params![workspace, bundle, key, *sensitive as i64, blob, at, kind],
                    )?,
                    None => tx.execute(
                        "DELETE FROM credentials WHERE workspace = ?1 AND bundle = ?2 AND key = ?3",
                        params![workspace, bundle, key],
                    )?,
                };
            }
            tx.commit()
        })
    }

    /// Removes every credential and token of a bundle (`uninstall --purge`).
    /// Deletes a bundle's stored values and tokens; how many rows went.
    pub fn purge(&self, workspace: &str, bundle: &str) -> Result<usize, StoreError> {
        self.store.with(|c| {
            let tx = c.transaction()?;
            let values = tx.execute(
                "DELETE FROM credentials WHERE workspace = ?1 AND bundle = ?2",
                params![workspace, bundle],
            )?;
            let tokens = tx.execute(
                "DELETE FROM oauth_tokens WHERE workspace = ?1 AND bundle = ?2",
                params![workspace, bundle],
            )?;
            tx.commit()?;
            Ok(values + tokens)
        })
    }

    /// Every bundle something is stored for: its workspace and name, the
    /// keys of its values (never the values) and whether it has tokens.
    pub fn stored(&self) -> Result<Vec<StoredFor>, StoreError> {
        let rows: Vec<(String, String, Option<String>)> = self.store.with(|c| {
            let mut q = c.prepare(
                "SELECT workspace, bundle, key FROM credentials
                 UNION ALL SELECT workspace, bundle, NULL FROM oauth_tokens
                 ORDER BY 1, 2, 3",
            )?;
            let rows = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect()
        })?;
        let mut out: Vec<StoredFor> = Vec::new();
        for (workspace, bundle, key) in rows {
            if out
                .last()
                .is_none_or(|l| l.workspace != workspace || l.bundle != bundle)
            {
                out.push(StoredFor {
                    workspace,
                    bundle,
                    keys: Vec::new(),
                    tokens: false,
                });
            }
            let last = out.last_mut().expect("pushed above");
            match key {
                Some(key) => last.keys.push(key),
                None => last.tokens = true,
            }
        }
        Ok(out)
    }

    pub fn tokens(&self, workspace: &str, bundle: &str) -> Result<Option<TokenSet>, StoreError> {
        let cipher = self.cipher();
        let sealed: Option<Vec<u8>> = self.store.with(|c| {
            c.query_row(
                "SELECT value FROM oauth_tokens WHERE workspace = ?1 AND bundle = ?2",
                params![workspace, bundle],
                |r| r.get(0),
            )
            .optional()
        })?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        let decrypt = || StoreError::Decrypt {
            what: format!("OAuth tokens of bundle {bundle:?}"),
        };
        let plain = cipher
            .open(&token_aad(workspace, bundle), &sealed)
            .map_err(|_| decrypt())?;
        let json: TokenJson = serde_json::from_slice(&plain).map_err(|_| decrypt())?;
        Ok(Some(TokenSet {
            access_token: json.access_token.map(Secret::new),
            refresh_token: json.refresh_token.map(Secret::new),
            expires_at: json.expires_at,
            client_id: json.client_id,
            client_secret: json.client_secret.map(Secret::new),
            wanted_scopes: json.wanted_scopes,
            issuer: json.issuer,
            challenge: json.challenge,
        }))
    }

    /// Stores (or, with `None`, forgets) a bundle's tokens.
    pub fn set_tokens(
        &self,
        workspace: &str,
        bundle: &str,
        tokens: Option<&TokenSet>,
    ) -> Result<(), StoreError> {
        let Some(tokens) = tokens else {
            return self.store.with(|c| {
                c.execute(
                    "DELETE FROM oauth_tokens WHERE workspace = ?1 AND bundle = ?2",
                    params![workspace, bundle],
                )
                .map(|_| ())
            });
        };
        let json = Zeroizing::new(
            serde_json::to_vec(&TokenJson {
                access_token: tokens.access_token.as_ref().map(|s| s.expose().to_string()),
                refresh_token: tokens
                    .refresh_token
                    .as_ref()
                    .map(|s| s.expose().to_string()),
                expires_at: tokens.expires_at,
                client_id: tokens.client_id.clone(),
                client_secret: tokens
                    .client_secret
                    .as_ref()
                    .map(|s| s.expose().to_string()),
                wanted_scopes: tokens.wanted_scopes.clone(),
                issuer: tokens.issuer.clone(),
                challenge: tokens.challenge.clone(),
            })
            .expect("token JSON serializes"),
        );
        let cipher = self.cipher();
        let sealed = cipher.seal(&token_aad(workspace, bundle), &json);
        let at = crate::clock::unix_secs();
        self.store.with(|c| {
            c.execute(
                "INSERT INTO oauth_tokens (workspace, bundle, value, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (workspace, bundle) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                params![workspace, bundle, sealed, at],
            )
            .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path, key: u8) -> Result<Credentials, StoreError> {
        let store = Store::open(&dir.join("state.db")).unwrap();
        Credentials::open(store, Cipher::from_key(&[key; 32]))
    }

    #[test]
    fn values_round_trip_and_the_file_never_holds_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let creds = open(dir.path(), 1).unwrap();
        creds
            .apply(
                "ws",
                "b",
                &[
                    Change::Set {
                        key: "api_key".into(),
                        value: Secret::new("sk-CANARY-4242"),
                        sensitive: true,
                    },
                    Change::Set {
                        key: "region".into(),
                        value: Secret::new("eu-west"),
                        sensitive: false,
                    },
                ],
            )
            .unwrap();
        creds
            .set_tokens(
                "ws",
                "b",
                Some(&TokenSet {
                    access_token: Some(Secret::new("at-CANARY-4242")),
                    refresh_token: Some(Secret::new("rt-CANARY-4242")),
                    ..Default::default()
                }),
            )
            .unwrap();
        let values = creds.values("ws", "b").unwrap();
        assert_eq!(values["api_key"].expose(), "sk-CANARY-4242");
        assert_eq!(values["region"].expose(), "eu-west");
        assert!(creds.values("other", "b").unwrap().is_empty());
        let tokens = creds.tokens("ws", "b").unwrap().unwrap();
        assert_eq!(tokens.refresh_token.unwrap().expose(), "rt-CANARY-4242");
        let keys = creds.keys("ws", "b").unwrap();
        assert_eq!(
            keys.iter()
                .map(|k| (k.key.as_str(), k.sensitive))
                .collect::<Vec<_>>(),
            [("api_key", true), ("region", false)]
        );

        creds
            .apply("ws", "b", &[Change::Unset("region".into())])
            .unwrap();
        assert_eq!(creds.values("ws", "b").unwrap().len(), 1);
        drop(creds);
        // Nothing of the secrets is on disk in the clear (database and WAL).
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            assert!(!bytes.windows(6).any(|w| w == b"CANARY"));
        }
    }

    #[test]
    fn a_wrong_key_is_refused_at_open_and_a_moved_ciphertext_does_not_decrypt() {
        let dir = tempfile::tempdir().unwrap();
        let creds = open(dir.path(), 1).unwrap();
        creds
            .apply(
                "ws",
                "a",
                &[Change::Set {
                    key: "k".into(),
                    value: Secret::new("secret-a"),
                    sensitive: true,
                }],
            )
            .unwrap();
        drop(creds);
        let err = open(dir.path(), 2).err().unwrap();
        assert!(matches!(err, StoreError::KeyMismatch { .. }), "{err}");

        let creds = open(dir.path(), 1).unwrap();
        // Copy bundle a's ciphertext onto bundle b: the AAD refuses it.
        creds
            .store()
            .with(|c| {
                c.execute(
                    "INSERT INTO credentials SELECT workspace, 'b', key, sensitive, value, updated_at, kind FROM credentials WHERE bundle = 'a'",
                    [],
                )
            })
            .unwrap();
        let err = creds.values("ws", "b").unwrap_err();
        assert!(err.to_string().contains("could not be decrypted"), "{err}");
        assert!(!err.to_string().contains("secret-a"));
        creds.purge("ws", "b").unwrap();
        assert!(creds.values("ws", "b").unwrap().is_empty());
    }

    #[test]
    fn a_reference_is_stored_apart_from_values_and_cannot_be_turned_into_one() {
        let dir = tempfile::tempdir().unwrap();
        let creds = open(dir.path(), 1).unwrap();
        let reference = StoredRef {
            reference: "file:/run/secrets/db-password".into(),
            uid: 1234,
            owner: Some(0),
        };
        creds
            .apply(
                "ws",
                "a",
                &[
                    Change::SetRef {
                        key: "db".into(),
                        reference: reference.clone(),
                    },
                    Change::Set {
                        key: "user".into(),
                        value: Secret::new("alice"),
                        sensitive: false,
                    },
                ],
            )
            .unwrap();
        assert_eq!(creds.refs("ws", "a").unwrap()["db"], reference);
        let values = creds.values("ws", "a").unwrap();
        assert_eq!(values.keys().collect::<Vec<_>>(), ["user"]);
        let keys = creds.keys("ws", "a").unwrap();
        assert!(keys[0].reference && keys[0].sensitive, "{keys:?}");
        assert!(!keys[1].reference);
        // The reference survives a rotation, and setting a value replaces it.
        creds.rotate(Cipher::from_key(&[2; 32])).unwrap();
        assert_eq!(creds.refs("ws", "a").unwrap()["db"], reference);
        // A row flipped from reference to value does not open as a value.
        creds
            .store
            .with(|c| c.execute("UPDATE credentials SET kind = 'value' WHERE key = 'db'", []))
            .unwrap();
        assert!(matches!(
            creds.values("ws", "a"),
            Err(StoreError::Decrypt { .. })
        ));
        creds
            .apply(
                "ws",
                "a",
                &[Change::Set {
                    key: "db".into(),
                    value: Secret::new("literal"),
                    sensitive: true,
                }],
            )
            .unwrap();
        assert!(creds.refs("ws", "a").unwrap().is_empty());
        assert_eq!(creds.values("ws", "a").unwrap()["db"].expose(), "literal");
    }

    #[test]
    fn values_stored_before_references_existed_stay_values() {
        let dir = tempfile::tempdir().unwrap();
        let creds = open(dir.path(), 1).unwrap();
        creds
            .apply(
                "ws",
                "a",
                &[Change::Set {
                    key: "k".into(),
                    value: Secret::new("from-v6"),
                    sensitive: true,
                }],
            )
            .unwrap();
        // The table as schema version 6 had it.
        creds
            .store
            .with(|c| {
                c.execute_batch(
                    "ALTER TABLE credentials DROP COLUMN kind; PRAGMA user_version = 6;",
                )
            })
            .unwrap();
        drop(creds);
        let creds = open(dir.path(), 1).unwrap();
        assert_eq!(creds.values("ws", "a").unwrap()["k"].expose(), "from-v6");
        assert!(creds.refs("ws", "a").unwrap().is_empty());
    }

    #[test]
    fn rotation_reseals_everything_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let creds = open(dir.path(), 1).unwrap();
        let set = |value: &str| Change::Set {
            key: "k".into(),
            value: Secret::new(value),
            sensitive: true,
        };
        creds.apply("ws", "a", &[set("secret-a")]).unwrap();
        creds.apply("ws", "b", &[set("secret-b")]).unwrap();
        let tokens = TokenSet {
            refresh_token: Some(Secret::new("rt")),
            ..Default::default()
        };
        creds.set_tokens("ws", "a", Some(&tokens)).unwrap();

        let done = creds.rotate(Cipher::from_key(&[2; 32])).unwrap();
        assert_eq!(
            done,
            Resealed {
                values: 2,
                token_sets: 1
            }
        );
        assert_eq!(creds.values("ws", "b").unwrap()["k"].expose(), "secret-b");
        assert_eq!(creds.tokens("ws", "a").unwrap().unwrap(), tokens);
        // Written after the rotation: under the new key too.
        creds.apply("ws", "c", &[set("secret-c")]).unwrap();
        drop(creds);
        assert!(matches!(
            open(dir.path(), 1),
            Err(StoreError::KeyMismatch { .. })
        ));
        let creds = open(dir.path(), 2).unwrap();
        assert_eq!(creds.values("ws", "c").unwrap()["k"].expose(), "secret-c");

        // One value that does not open: nothing changes.
        creds
            .store
            .with(|c| {
                c.execute(
                    "UPDATE credentials SET value = x'00' WHERE bundle = 'b'",
                    [],
                )
            })
            .unwrap();
        let err = creds.rotate(Cipher::from_key(&[3; 32])).unwrap_err();
        assert!(err.to_string().contains("bundle \"b\""), "{err}");
        assert_eq!(creds.values("ws", "a").unwrap()["k"].expose(), "secret-a");
        drop(creds);
        assert!(
            open(dir.path(), 2).is_ok(),
            "still sealed under the key before"
        );
    }
}
