//! Access tokens of the HTTP gateway (docs/gateway.md, "Tokens"): each is
//! bound to one workspace and perhaps one profile, may expire, and is kept
//! only as its SHA-256. The token itself is shown once, when it is made.

use rusqlite::{params, OptionalExtension};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::{Store, StoreError};

/// What a token text starts with (so that a leaked one is recognisable).
pub const PREFIX: &str = "bvt_";

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessToken {
    /// Short random id (hex), for `token revoke`.
    pub id: String,
    pub name: String,
    pub workspace: String,
    pub profile: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    /// Its own rules (docs/gateway.md, "Token policy"), as written.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

/// A token just made: its record and its text (shown once).
pub struct NewToken {
    pub token: AccessToken,
    pub text: Zeroizing<String>,
}

/// The digest a token is found by.
pub fn digest(text: &str) -> Vec<u8> {
    Sha256::digest(text.as_bytes()).to_vec()
}

/// N bytes from the OS's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use chacha20poly1305::aead::rand_core::RngCore;
    let mut bytes = [0u8; N];
    chacha20poly1305::aead::OsRng.fill_bytes(&mut bytes);
    bytes
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AccessToken> {
    let rules = |i: usize| -> rusqlite::Result<Vec<String>> {
        let text: String = r.get(i)?;
        serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
        })
    };
    Ok(AccessToken {
        id: r.get(0)?,
        name: r.get(1)?,
        workspace: r.get(2)?,
        profile: r.get(3)?,
        created_at: r.get(4)?,
        expires_at: r.get(5)?,
        allow: rules(6)?,
        deny: rules(7)?,
    })
}

const COLUMNS: &str = "id, name, workspace, profile, created_at, expires_at, allow, deny";

/// What a new token is limited to: its workspace, perhaps a profile, and
/// its own allow and deny rules (checked by the caller).
pub struct TokenScope<'a> {
    pub workspace: &'a str,
    pub profile: Option<&'a str>,
    pub allow: &'a [String],
    pub deny: &'a [String],
}

impl Store {
    /// Makes a token limited to `scope`; `name` defaults to `token-ID`.
    /// None when the name is taken.
    pub fn create_token(
        &self,
        name: Option<&str>,
        scope: &TokenScope<'_>,
        now: i64,
        expires_at: Option<i64>,
    ) -> Result<Option<NewToken>, StoreError> {
        use base64::Engine;
        let id: String = random_bytes::<4>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<32>());
        let text = Zeroizing::new(format!("{PREFIX}{secret}"));
        let token = AccessToken {
            name: name.map_or_else(|| format!("token-{id}"), str::to_string),
            id,
            workspace: scope.workspace.to_string(),
            profile: scope.profile.map(str::to_string),
            created_at: now,
            expires_at,
            allow: scope.allow.to_vec(),
            deny: scope.deny.to_vec(),
        };
        let json = |rules: &[String]| serde_json::to_string(rules).unwrap_or_else(|_| "[]".into());
        let inserted = self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO access_tokens (id, name, workspace, profile, hash, created_at, expires_at, allow, deny)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    token.id,
                    token.name,
                    token.workspace,
                    token.profile,
                    digest(&text),
                    token.created_at,
                    token.expires_at,
                    json(&token.allow),
                    json(&token.deny)
                ],
            )
        })?;
        Ok((inserted == 1).then_some(NewToken { token, text }))
    }

    /// Every token (of `workspace`, if given), oldest first.
    pub fn tokens(&self, workspace: Option<&str>) -> Result<Vec<AccessToken>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM access_tokens WHERE ?1 IS NULL OR workspace = ?1 ORDER BY created_at, name"
            ))?;
            let rows = stmt.query_map(params![workspace], row)?;
            rows.collect()
        })
    }

    /// Removes the token named `name_or_id` (its name, or its id); the
    /// removed one, if there was one.
    pub fn revoke_token(&self, name_or_id: &str) -> Result<Option<AccessToken>, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let found = tx
                .query_row(
                    &format!("SELECT {COLUMNS} FROM access_tokens WHERE name = ?1 OR id = ?1"),
                    params![name_or_id],
                    row,
                )
                .optional()?;
            if let Some(t) = &found {
                tx.execute("DELETE FROM access_tokens WHERE id = ?1", params![t.id])?;
            }
            tx.commit()?;
            Ok(found)
        })
    }

    /// The live token whose text is `text` (not expired at `now`).
    pub fn token_by_text(&self, text: &str, now: i64) -> Result<Option<AccessToken>, StoreError> {
        if !text.starts_with(PREFIX) {
            return Ok(None);
        }
        self.with(|c| {
            c.query_row(
                &format!(
                    "SELECT {COLUMNS} FROM access_tokens WHERE hash = ?1 AND (expires_at IS NULL OR expires_at > ?2)"
                ),
                params![digest(text), now],
                row,
            )
            .optional()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        (dir, store)
    }

    fn scope<'a>(workspace: &'a str, profile: Option<&'a str>) -> TokenScope<'a> {
        TokenScope {
            workspace,
            profile,
            allow: &[],
            deny: &[],
        }
    }

    #[test]
    fn a_token_is_found_by_its_text_until_it_expires_or_is_revoked() {
        let (_dir, store) = store();
        let made = store
            .create_token(Some("ci"), &scope("default", Some("ro")), 100, Some(200))
            .unwrap()
            .unwrap();
        assert!(made.text.starts_with(PREFIX) && made.text.len() > 40);
        let found = store.token_by_text(&made.text, 150).unwrap().unwrap();
        assert_eq!(found, made.token);
        assert_eq!(
            store.token_by_text(&made.text, 200).unwrap(),
            None,
            "expired"
        );
        assert_eq!(store.token_by_text("bvt_wrong", 150).unwrap(), None);
        // The same name twice: refused.
        assert!(store
            .create_token(Some("ci"), &scope("other", None), 100, None)
            .unwrap()
            .is_none());
        let revoked = store.revoke_token(&made.token.id).unwrap().unwrap();
        assert_eq!(revoked.name, "ci");
        assert_eq!(store.token_by_text(&made.text, 150).unwrap(), None);
        assert_eq!(store.revoke_token("ci").unwrap(), None);
    }

    /// Issue 35: a token keeps its own rules, as written.
    #[test]
    fn a_tokens_rules_are_kept_with_it() {
        let (_dir, store) = store();
        let (allow, deny) = (
            vec!["tool:github/*".to_string()],
            vec!["*/delete_*".to_string()],
        );
        let scope = TokenScope {
            workspace: "default",
            profile: None,
            allow: &allow,
            deny: &deny,
        };
        let made = store
            .create_token(Some("ci"), &scope, 1, None)
            .unwrap()
            .unwrap();
        let found = store.token_by_text(&made.text, 2).unwrap().unwrap();
        assert_eq!((found.allow, found.deny), (allow, deny));
        assert_eq!(store.tokens(None).unwrap()[0].deny, ["*/delete_*"]);
    }

    /// A version 5 database's tokens keep working, without rules.
    #[test]
    fn a_version_5_token_migrates_without_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE access_tokens (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                     workspace TEXT NOT NULL, profile TEXT, hash BLOB NOT NULL UNIQUE,
                     created_at INTEGER NOT NULL, expires_at INTEGER);
                 PRAGMA user_version = 5;",
            )
            .unwrap();
            c.execute(
                "INSERT INTO access_tokens VALUES ('abcd', 'old', 'default', NULL, ?1, 1, NULL)",
                params![digest("bvt_old")],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let old = store.token_by_text("bvt_old", 2).unwrap().unwrap();
        assert_eq!(old.name, "old");
        assert!(old.allow.is_empty() && old.deny.is_empty());
    }

    #[test]
    fn only_the_digest_is_stored() {
        let (dir, store) = store();
        let made = store
            .create_token(None, &scope("default", None), 1, None)
            .unwrap()
            .unwrap();
        assert_eq!(made.token.name, format!("token-{}", made.token.id));
        drop(store);
        let bytes = std::fs::read(dir.path().join("state.db")).unwrap();
        let secret = made.text.as_bytes();
        assert!(!bytes.windows(secret.len()).any(|w| w == secret));
        assert!(bytes
            .windows(32)
            .any(|w| w == digest(&made.text).as_slice()));
    }
}
