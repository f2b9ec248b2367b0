//! The daemon's state database (SQLite, WAL): what is installed where.
//!
//! Calls are synchronous; actors run them on the blocking pool
//! (`tokio::task::spawn_blocking`). Every change is one transaction, so a
//! crash leaves either the old or the new state.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

pub mod credentials;
pub mod crypto;
pub mod tokens;

pub use credentials::{Change, Credentials, StoredKey, StoredRef, TokenSet};
pub use tokens::{AccessToken, NewToken, TokenScope};

/// Newest schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 7;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("state database task failed: {0}")]
    Background(String),
    #[error("state database {path} has schema version {found}, newer than this build understands ({SCHEMA_VERSION}); upgrade bundlevisor")]
    TooNew { path: PathBuf, found: i64 },
    #[error("the credential key does not match the one the credentials in {path} were encrypted with; restore the original key (docs/credentials.md) — the daemon will not start with a key that cannot read them")]
    KeyMismatch { path: PathBuf },
    #[error("stored {what} could not be decrypted (the value was altered or the key changed); set it again with `bundlevisor configure`")]
    Decrypt { what: String },
}

/// Where an install came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `bundlevisor install`
    Cli,
    /// Found in a watched folder.
    Watch,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Cli => "cli",
            Origin::Watch => "watch",
        }
    }

    fn parse(s: &str) -> Origin {
        if s == "watch" {
            Origin::Watch
        } else {
            Origin::Cli
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRecord {
    pub workspace: String,
    pub name: String,
    /// The folder or manifest file given at install time (absolute).
    pub source: PathBuf,
    pub origin: Origin,
    /// Unix seconds.
    pub installed_at: i64,
}

/// Maps a `SELECT workspace, name, source, origin, installed_at` row.
fn record_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InstallRecord> {
    Ok(InstallRecord {
        workspace: r.get(0)?,
        name: r.get(1)?,
        source: PathBuf::from(r.get::<_, String>(2)?),
        origin: Origin::parse(&r.get::<_, String>(3)?),
        installed_at: r.get(4)?,
    })
}

/// Handle to the state database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found: version,
            });
        }
        if version < 1 {
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE IF NOT EXISTS installs (
                     workspace    TEXT NOT NULL,
                     name         TEXT NOT NULL,
                     source       TEXT NOT NULL,
                     origin       TEXT NOT NULL,
                     installed_at INTEGER NOT NULL,
                     PRIMARY KEY (workspace, name)
                 );
                 PRAGMA user_version = 1;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 2 {
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE IF NOT EXISTS files (
                     workspace  TEXT NOT NULL,
                     id         TEXT NOT NULL,
                     filename   TEXT NOT NULL,
                     mime_type  TEXT NOT NULL,
                     size       INTEGER NOT NULL,
                     tags       TEXT NOT NULL,
                     created_at TEXT NOT NULL,
                     sha256     TEXT NOT NULL,
                     PRIMARY KEY (workspace, id)
                 );
                 PRAGMA user_version = 2;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 3 {
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE IF NOT EXISTS checkpoints (
                     workspace  TEXT NOT NULL,
                     id         TEXT NOT NULL,
                     created_at TEXT NOT NULL,
                     files      TEXT NOT NULL,
                     PRIMARY KEY (workspace, id)
                 );
                 PRAGMA user_version = 3;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 4 {
            // Credentials and OAuth tokens: every value sealed by store::crypto.
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE IF NOT EXISTS credentials (
                     workspace  TEXT NOT NULL,
                     bundle     TEXT NOT NULL,
                     key        TEXT NOT NULL,
                     sensitive  INTEGER NOT NULL,
                     value      BLOB NOT NULL,
                     updated_at INTEGER NOT NULL,
                     PRIMARY KEY (workspace, bundle, key)
                 );
                 CREATE TABLE IF NOT EXISTS oauth_tokens (
                     workspace  TEXT NOT NULL,
                     bundle     TEXT NOT NULL,
                     value      BLOB NOT NULL,
                     updated_at INTEGER NOT NULL,
                     PRIMARY KEY (workspace, bundle)
                 );
                 CREATE TABLE IF NOT EXISTS meta (
                     key   TEXT PRIMARY KEY,
                     value BLOB NOT NULL
                 );
                 PRAGMA user_version = 4;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 5 {
            // Access tokens of the HTTP gateway: only their SHA-256 is kept.
            conn.execute_batch(
                "BEGIN;
                 CREATE TABLE IF NOT EXISTS access_tokens (
                     id         TEXT PRIMARY KEY,
                     name       TEXT NOT NULL UNIQUE,
                     workspace  TEXT NOT NULL,
                     profile    TEXT,
                     hash       BLOB NOT NULL UNIQUE,
                     created_at INTEGER NOT NULL,
                     expires_at INTEGER
                 );
                 PRAGMA user_version = 5;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 6 {
            // A token's own allow and deny rules (JSON arrays of strings).
            conn.execute_batch(
                "BEGIN;
                 ALTER TABLE access_tokens ADD COLUMN allow TEXT NOT NULL DEFAULT '[]';
                 ALTER TABLE access_tokens ADD COLUMN deny TEXT NOT NULL DEFAULT '[]';
                 PRAGMA user_version = 6;
                 COMMIT;",
            )
            .map_err(err)?;
        }
        if version < 7 {
            // A stored user_config entry is a value or a reference to a
            // secret kept elsewhere (secret_ref), each sealed with its own
            // associated data.
            // (A database cut down by hand may lack the table.)
            let has_table: bool = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'credentials'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(err)?
                > 0;
            let alter = match has_table {
                true => "ALTER TABLE credentials ADD COLUMN kind TEXT NOT NULL DEFAULT 'value';",
                false => "",
            };
            conn.execute_batch(&format!(
                "BEGIN;
                 {alter}
                 PRAGMA user_version = 7;
                 COMMIT;"
            ))
            .map_err(err)?;
        }
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_path_buf(),
        })
    }

    /// Runs `f` on the blocking pool: the way async code (actors) calls the
    /// store, since SQLite calls block.
    pub async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| StoreError::Background(e.to_string()))?
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn).map_err(|source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        })
    }

    pub fn installs(&self) -> Result<Vec<InstallRecord>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT workspace, name, source, origin, installed_at FROM installs ORDER BY workspace, name",
            )?;
            let rows = stmt.query_map([], record_from_row)?;
            rows.collect()
        })
    }

    pub fn get(&self, workspace: &str, name: &str) -> Result<Option<InstallRecord>, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT workspace, name, source, origin, installed_at FROM installs WHERE workspace = ?1 AND name = ?2",
                params![workspace, name],
                record_from_row,
            )
            .optional()
        })
    }

    /// Records an install. Returns false (and changes nothing) when the
    /// bundle is already installed in that workspace.
    pub fn insert(&self, record: &InstallRecord) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT OR IGNORE INTO installs (workspace, name, source, origin, installed_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    record.workspace,
                    record.name,
                    record.source.to_string_lossy(),
                    record.origin.as_str(),
                    record.installed_at
                ],
            )?;
            tx.commit()?;
            Ok(n == 1)
        })
    }

    /// Points an operator's install at the copy an upgrade brought (an
    /// archive's new unpacked folder, another bundle folder), if it is
    /// still the install from `from`: false (nothing changed) when it is
    /// gone, a watched folder's, or from elsewhere now (uninstalled and
    /// installed again meanwhile).
    pub fn set_source(
        &self,
        workspace: &str,
        name: &str,
        (from, to): (&Path, &Path),
    ) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "UPDATE installs SET source = ?4 WHERE workspace = ?1 AND name = ?2 AND source = ?3 AND origin = ?5",
                params![
                    workspace,
                    name,
                    from.to_string_lossy(),
                    to.to_string_lossy(),
                    Origin::Cli.as_str()
                ],
            )?;
            tx.commit()?;
            Ok(n == 1)
        })
    }

    /// Removes an install; returns whether it existed.
    pub fn remove(&self, workspace: &str, name: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "DELETE FROM installs WHERE workspace = ?1 AND name = ?2",
                params![workspace, name],
            )?;
            tx.commit()?;
            Ok(n == 1)
        })
    }
}

/// File metadata rows are the protocol's [`FileRecord`]: the shape is the
/// same in the database, on the socket and in checkpoints.
pub use crate::protocol::FileRecord as FileRow;

fn file_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileRow> {
    let tags: String = r.get(5)?;
    Ok(FileRow {
        id: r.get(0)?,
        filename: r.get(1)?,
        mime_type: r.get(2)?,
        size: r.get::<_, i64>(3)? as u64,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        created_at: r.get(6)?,
        sha256: r.get(4)?,
    })
}

const FILE_COLUMNS: &str = "id, filename, mime_type, size, sha256, tags, created_at";

impl Store {
    pub fn insert_file(&self, workspace: &str, f: &FileRow) -> Result<(), StoreError> {
        let tags = serde_json::to_string(&f.tags).unwrap_or_else(|_| "[]".into());
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO files (workspace, id, filename, mime_type, size, tags, created_at, sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![workspace, f.id, f.filename, f.mime_type, f.size as i64, tags, f.created_at, f.sha256],
            )?;
            tx.commit()
        })
    }

    pub fn files(&self, workspace: &str) -> Result<Vec<FileRow>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {FILE_COLUMNS} FROM files WHERE workspace = ?1 ORDER BY rowid"
            ))?;
            let rows = stmt.query_map(params![workspace], file_from_row)?;
            rows.collect()
        })
    }

    pub fn file(&self, workspace: &str, id: &str) -> Result<Option<FileRow>, StoreError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {FILE_COLUMNS} FROM files WHERE workspace = ?1 AND id = ?2"),
                params![workspace, id],
                file_from_row,
            )
            .optional()
        })
    }

    /// Records a checkpoint: the file rows as they are now.
    pub fn insert_checkpoint(
        &self,
        workspace: &str,
        id: &str,
        created_at: &str,
        files: &[FileRow],
    ) -> Result<(), StoreError> {
        let files = serde_json::to_string(files).unwrap_or_else(|_| "[]".into());
        self.with(|c| {
            c.execute(
                "INSERT INTO checkpoints (workspace, id, created_at, files) VALUES (?1, ?2, ?3, ?4)",
                params![workspace, id, created_at, files],
            )
            .map(|_| ())
        })
    }

    /// The file rows of a checkpoint.
    pub fn checkpoint(
        &self,
        workspace: &str,
        id: &str,
    ) -> Result<Option<Vec<FileRow>>, StoreError> {
        let text: Option<String> = self.with(|c| {
            c.query_row(
                "SELECT files FROM checkpoints WHERE workspace = ?1 AND id = ?2",
                params![workspace, id],
                |r| r.get(0),
            )
            .optional()
        })?;
        Ok(text.map(|t| serde_json::from_str(&t).unwrap_or_default()))
    }

    /// Ids of every blob some checkpoint of the workspace still refers to.
    pub fn checkpointed_ids(
        &self,
        workspace: &str,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let all: Vec<String> = self.with(|c| {
            let mut stmt = c.prepare("SELECT files FROM checkpoints WHERE workspace = ?1")?;
            let rows = stmt.query_map(params![workspace], |r| r.get(0))?;
            rows.collect()
        })?;
        Ok(all
            .iter()
            .flat_map(|t| serde_json::from_str::<Vec<serde_json::Value>>(t).unwrap_or_default())
            .filter_map(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string))
            .collect())
    }

    /// Makes the workspace's file rows exactly `rows` (one transaction).
    pub fn replace_files(&self, workspace: &str, rows: &[FileRow]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM files WHERE workspace = ?1", params![workspace])?;
            for f in rows {
                let tags = serde_json::to_string(&f.tags).unwrap_or_else(|_| "[]".into());
                tx.execute(
                    "INSERT INTO files (workspace, id, filename, mime_type, size, tags, created_at, sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![workspace, f.id, f.filename, f.mime_type, f.size as i64, tags, f.created_at, f.sha256],
                )?;
            }
            tx.commit()
        })
    }

    /// The workspace that holds file `id`, if any (for logs only: never
    /// told to a bundle).
    pub fn file_owner(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT workspace FROM files WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Removes a file's metadata; returns whether it existed.
    pub fn remove_file(&self, workspace: &str, id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "DELETE FROM files WHERE workspace = ?1 AND id = ?2",
                params![workspace, id],
            )?;
            tx.commit()?;
            Ok(n == 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ws: &str, name: &str) -> InstallRecord {
        InstallRecord {
            workspace: ws.into(),
            name: name.into(),
            source: PathBuf::from(format!("/b/{name}")),
            origin: Origin::Cli,
            installed_at: 1,
        }
    }

    #[test]
    fn installs_survive_reopen_and_duplicates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let store = Store::open(&path).unwrap();
            assert!(store.insert(&record("default", "a")).unwrap());
            assert!(store.insert(&record("w2", "a")).unwrap());
            assert!(!store.insert(&record("default", "a")).unwrap());
        }
        let store = Store::open(&path).unwrap();
        let all = store.installs().unwrap();
        assert_eq!(all, vec![record("default", "a"), record("w2", "a")]);
        assert!(store.remove("default", "a").unwrap());
        assert!(!store.remove("default", "a").unwrap());
        assert_eq!(store.get("w2", "a").unwrap(), Some(record("w2", "a")));
        assert_eq!(store.get("default", "a").unwrap(), None);
    }

    #[test]
    fn an_upgrade_moves_only_its_own_cli_install_from_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let (old, new) = (Path::new("/b/a"), Path::new("/new/a"));
        {
            let store = Store::open(&path).unwrap();
            assert!(store.insert(&record("default", "a")).unwrap());
            assert!(store.insert(&record("w2", "a")).unwrap());
            let mut watched = record("default", "w");
            watched.origin = Origin::Watch;
            assert!(store.insert(&watched).unwrap());
            assert!(store.set_source("default", "a", (old, new)).unwrap());
            // Not from where it was to move from (installed again meanwhile).
            let elsewhere = Path::new("/elsewhere");
            assert!(!store.set_source("w2", "a", (elsewhere, new)).unwrap());
            assert!(!store.set_source("default", "gone", (old, new)).unwrap());
            assert!(!store
                .set_source("default", "w", (Path::new("/b/w"), new))
                .unwrap());
        }
        let store = Store::open(&path).unwrap();
        let moved = store.get("default", "a").unwrap().unwrap();
        assert_eq!(moved.source, PathBuf::from("/new/a"));
        assert_eq!(moved.installed_at, 1, "still the same install");
        assert_eq!(store.get("w2", "a").unwrap(), Some(record("w2", "a")));
        assert_eq!(store.get("default", "gone").unwrap(), None);
        let watched = store.get("default", "w").unwrap().unwrap();
        assert_eq!(watched.source, PathBuf::from("/b/w"), "a watched install");
    }

    #[test]
    fn a_version_1_database_migrates_and_keeps_its_installs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            // The schema exactly as version 1 wrote it.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE installs (workspace TEXT NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL,
                     origin TEXT NOT NULL, installed_at INTEGER NOT NULL, PRIMARY KEY (workspace, name));
                 INSERT INTO installs VALUES ('default', 'old', '/b/old', 'watch', 7);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let old = store.get("default", "old").unwrap().unwrap();
        assert_eq!((old.origin, old.installed_at), (Origin::Watch, 7));
        assert!(store.files("default").unwrap().is_empty());
        assert!(store.checkpointed_ids("default").unwrap().is_empty());
        let version: i64 = store
            .with(|c| c.pragma_query_value(None, "user_version", |r| r.get(0)))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn refuses_a_database_from_a_newer_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let err = Store::open(&path).err().unwrap();
        assert!(err.to_string().contains("upgrade bundlevisor"), "{err}");
    }
}
