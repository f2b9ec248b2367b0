//! Workspace files: the FileStore (bytes in `state_dir/files/WS/ID`,
//! metadata in the state database) and the MIME module shared by every
//! component that hands file content out.
//!
//! Write order: bytes to a temp file, fsync, rename to the id, fsync the
//! folder, then the metadata commit. A crash before the commit leaves a blob
//! without a record; [`FileStore::open`] deletes those (and temp files), so
//! neither a half file nor a dangling record is ever visible.

pub mod mime;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::protocol::{Checkpoint, FileRecord, Rollback};
use crate::store::{FileRow, Store, StoreError};

/// Bytes read for content sniffing.
const SNIFF_BYTES: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0} is not a valid file id (expected fl_ and 24 lowercase hex digits)")]
    BadId(String),
    #[error("invalid tag {0:?}: tags are 1-64 characters without control characters")]
    BadTag(String),
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FileError + 'a {
    move |source| FileError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `id` has the shape of a file id. Anything else can name no file.
pub fn is_file_id(id: &str) -> bool {
    id.len() == 27
        && id.starts_with("fl_")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn new_id() -> String {
    format!("fl_{:024x}", fastrand::u128(..) >> 32)
}

/// One workspace's files. Cheap to clone; calls block (use the blocking
/// pool), except [`FileStore::cached`].
#[derive(Clone)]
pub struct FileStore {
    workspace: String,
    dir: PathBuf,
    db: Store,
    records: Arc<Mutex<RecordCache>>,
}

/// Records already looked up, so that host-resources reads of known files
/// skip SQLite. A record never changes while it exists, so an entry is
/// exact until its file is removed or rolled back; those bump `generation`
/// after changing the table, and a lookup only caches what it read if no
/// invalidation happened meanwhile.
///
/// Beside a small file's record it keeps what a host-resources read of it
/// answers (the bytes never change while the id exists), so a repeated read
/// is neither a file read nor a UTF-8 check or base64 encoding.
#[derive(Default)]
struct RecordCache {
    generation: u64,
    by_id: HashMap<String, Cached>,
    /// Bytes of the answers kept, at most [`ANSWER_CACHE_MAX_BYTES`].
    answer_bytes: usize,
}

struct Cached {
    record: FileRecord,
    /// A read answer's encoded `result` and the content bytes it holds.
    answer: Option<(Arc<str>, usize)>,
}

/// Entries kept before the cache starts over.
const RECORD_CACHE_MAX: usize = 4096;
/// Read answers kept per workspace, in bytes of file content.
const ANSWER_CACHE_MAX_BYTES: usize = 8 << 20;

impl FileStore {
    /// Opens (creating) `state_dir/files/WS` and removes what a crash left
    /// behind: temp files and blobs without a record.
    pub fn open(state_dir: &Path, workspace: &str, db: Store) -> Result<FileStore, FileError> {
        let dir = state_dir.join("files").join(workspace);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io("create", &dir))?;
        let store = FileStore {
            workspace: workspace.to_string(),
            dir,
            db,
            records: Arc::default(),
        };
        let mut known: std::collections::HashSet<String> = store
            .db
            .files(workspace)?
            .into_iter()
            .map(|f| f.id)
            .collect();
        // Blobs a checkpoint refers to are kept for its rollback.
        known.extend(store.db.checkpointed_ids(workspace)?);
        for entry in std::fs::read_dir(&store.dir)
            .map_err(io("read", &store.dir))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") || (is_file_id(&name) && !known.contains(&name)) {
                tracing::info!(workspace, file = %name, "removing a file left by an interrupted write");
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(store)
    }

    fn blob(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Copies `src` into the store. `filename` defaults to `src`'s name.
    pub fn put(
        &self,
        src: &Path,
        filename: Option<&str>,
        tags: Vec<String>,
        mime: Option<&str>,
    ) -> Result<FileRecord, FileError> {
        for tag in &tags {
            if tag.is_empty() || tag.len() > 64 || tag.chars().any(char::is_control) {
                return Err(FileError::BadTag(tag.clone()));
            }
        }
        let filename = filename
            .map(str::to_string)
            .or_else(|| src.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "file".into());
        let mut input = std::fs::File::open(src).map_err(io("open", src))?;
        let id = new_id();
        let tmp = self.dir.join(format!(".tmp-{id}"));
        let result = (|| {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io("create", &tmp))?;
            let mut hasher = Sha256::new();
            let (mut size, mut head) = (0u64, Vec::new());
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = input.read(&mut buf).map_err(io("read", src))?;
                if n == 0 {
                    break;
                }
                if head.len() < SNIFF_BYTES {
                    head.extend_from_slice(&buf[..n.min(SNIFF_BYTES - head.len())]);
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(io("write", &tmp))?;
                size += n as u64;
            }
            out.sync_all().map_err(io("sync", &tmp))?;
            let blob = self.blob(&id);
            std::fs::rename(&tmp, &blob).map_err(io("rename", &blob))?;
            std::fs::File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(io("sync", &self.dir))?;
            let sha256 = hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            Ok(FileRow {
                id: id.clone(),
                mime_type: mime::detect(mime, &filename, &head),
                filename,
                size,
                tags,
                created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                    .to_string(),
                sha256,
            })
        })();
        let row = match result {
            Ok(row) => row,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if let Err(e) = self.db.insert_file(&self.workspace, &row) {
            let _ = std::fs::remove_file(self.blob(&id));
            return Err(e.into());
        }
        Ok(row)
    }

    pub fn list(&self) -> Result<Vec<FileRecord>, FileError> {
        Ok(self.db.files(&self.workspace)?)
    }

    /// The record of `id` in this workspace (None for any other id).
    pub fn get(&self, id: &str) -> Result<Option<FileRecord>, FileError> {
        if !is_file_id(id) {
            return Ok(None);
        }
        let generation = {
            let cache = self.cache();
            if let Some(cached) = cache.by_id.get(id) {
                return Ok(Some(cached.record.clone()));
            }
            cache.generation
        };
        let record = self.db.file(&self.workspace, id)?;
        if let Some(record) = &record {
            let mut cache = self.cache();
            if cache.generation == generation {
                if cache.by_id.len() >= RECORD_CACHE_MAX {
                    cache.by_id.clear();
                    cache.answer_bytes = 0;
                }
                let cached = Cached {
                    record: record.clone(),
                    answer: None,
                };
                if let Some(old) = cache.by_id.insert(id.to_string(), cached) {
                    cache.answer_bytes -= old.answer.map_or(0, |a| a.1);
                }
            }
        }
        Ok(record)
    }

    /// The record of `id` if it is cached; never blocks on the database.
    pub fn cached(&self, id: &str) -> Option<FileRecord> {
        self.cache().by_id.get(id).map(|c| c.record.clone())
    }

    /// The size of `id` and the read answer kept for it, if its record is
    /// cached; never blocks on the database.
    pub fn cached_answer(&self, id: &str) -> Option<(u64, Option<Arc<str>>)> {
        let cache = self.cache();
        let cached = cache.by_id.get(id)?;
        Some((
            cached.record.size,
            cached.answer.as_ref().map(|a| a.0.clone()),
        ))
    }

    /// Keeps the read answer of `id` (made from `bytes` bytes of content)
    /// while its record is cached and the budget allows.
    pub fn keep_answer(&self, id: &str, answer: Arc<str>, bytes: usize) {
        let mut cache = self.cache();
        if cache.answer_bytes + bytes > ANSWER_CACHE_MAX_BYTES {
            return;
        }
        let Some(cached) = cache.by_id.get_mut(id) else {
            return;
        };
        if cached.answer.is_none() {
            cached.answer = Some((answer, bytes));
            cache.answer_bytes += bytes;
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, RecordCache> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called after a change that removes records from the table.
    fn invalidate(&self, id: Option<&str>) {
        let mut cache = self.cache();
        cache.generation += 1;
        match id {
            Some(id) => {
                if let Some(old) = cache.by_id.remove(id) {
                    cache.answer_bytes -= old.answer.map_or(0, |a| a.1);
                }
            }
            None => {
                cache.by_id.clear();
                cache.answer_bytes = 0;
            }
        }
    }

    /// Why `id` is not in this workspace, for the log: another workspace
    /// holds it, or nobody does.
    pub fn absence_reason(&self, id: &str) -> String {
        match self.db.file_owner(id) {
            Ok(Some(owner)) => format!(
                "the file belongs to workspace {owner:?}, not {:?}",
                self.workspace
            ),
            Ok(None) => "no workspace has this file".to_string(),
            Err(e) => format!("owner lookup failed: {e}"),
        }
    }

    pub fn read(&self, id: &str) -> Result<Vec<u8>, FileError> {
        if !is_file_id(id) {
            return Err(FileError::BadId(id.to_string()));
        }
        let path = self.blob(id);
        std::fs::read(&path).map_err(io("read", &path))
    }

    /// Removes a file: the record first (it disappears at once), then the
    /// bytes — unless a checkpoint still refers to them (blobs are immutable,
    /// which is what makes a checkpoint cheap).
    pub fn remove(&self, id: &str) -> Result<bool, FileError> {
        if !is_file_id(id) || !self.db.remove_file(&self.workspace, id)? {
            return Ok(false);
        }
        self.invalidate(Some(id));
        if !self.db.checkpointed_ids(&self.workspace)?.contains(id) {
            let _ = std::fs::remove_file(self.blob(id));
        }
        Ok(true)
    }

    /// Records the current file set.
    pub fn checkpoint(&self) -> Result<Checkpoint, FileError> {
        let rows = self.db.files(&self.workspace)?;
        let id = format!("cp_{:024x}", fastrand::u128(..) >> 32);
        let timestamp = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        self.db
            .insert_checkpoint(&self.workspace, &id, &timestamp, &rows)?;
        Ok(Checkpoint {
            checkpoint_id: id,
            timestamp,
            files: rows,
        })
    }

    /// Restores the file set of a checkpoint; None when there is no such
    /// checkpoint in this workspace.
    pub fn rollback(&self, checkpoint_id: &str) -> Result<Option<Rollback>, FileError> {
        let Some(rows) = self.db.checkpoint(&self.workspace, checkpoint_id)? else {
            return Ok(None);
        };
        let current: std::collections::HashSet<String> = self
            .db
            .files(&self.workspace)?
            .into_iter()
            .map(|f| f.id)
            .collect();
        self.db.replace_files(&self.workspace, &rows)?;
        self.invalidate(None);
        let restored_files = rows
            .iter()
            .filter(|r| !current.contains(&r.id))
            .map(|r| r.id.clone())
            .collect();
        Ok(Some(Rollback {
            success: true,
            checkpoint_id: checkpoint_id.to_string(),
            restored_files,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let db = Store::open(&dir.path().join("state.db")).unwrap();
        (dir, db)
    }

    #[test]
    fn cached_records_go_with_remove_and_rollback() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db).unwrap();
        let src = dir.path().join("a.txt");
        std::fs::write(&src, "a").unwrap();
        let kept = fs.put(&src, None, vec![], None).unwrap();
        let checkpoint = fs.checkpoint().unwrap();
        let later = fs.put(&src, None, vec![], None).unwrap();
        assert_eq!(
            fs.cached(&kept.id),
            None,
            "nothing is cached before a lookup"
        );
        assert_eq!(fs.get(&kept.id).unwrap().as_ref(), Some(&kept));
        assert_eq!(fs.get(&later.id).unwrap().as_ref(), Some(&later));
        assert_eq!(fs.cached(&kept.id).as_ref(), Some(&kept));
        // A clone shares the cache, as the workspace actor's clones do.
        let clone = fs.clone();
        assert!(clone.remove(&kept.id).unwrap());
        assert_eq!(fs.cached(&kept.id), None);
        assert_eq!(fs.get(&kept.id).unwrap(), None);
        // The rollback restores `kept` and drops `later`.
        assert!(fs.rollback(&checkpoint.checkpoint_id).unwrap().is_some());
        assert_eq!(fs.cached(&later.id), None);
        assert_eq!(fs.get(&later.id).unwrap(), None);
        assert_eq!(fs.get(&kept.id).unwrap().as_ref(), Some(&kept));
    }

    #[test]
    fn put_get_read_list_remove_round_trip() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db.clone()).unwrap();
        let src = dir.path().join("report.csv");
        std::fs::write(&src, "a,b\n1,2\n").unwrap();
        let rec = fs.put(&src, None, vec!["q3".into()], None).unwrap();
        assert!(is_file_id(&rec.id), "{}", rec.id);
        assert_eq!(
            (rec.filename.as_str(), rec.mime_type.as_str(), rec.size),
            ("report.csv", "text/csv", 8)
        );
        assert_eq!(rec.sha256.len(), 64);
        assert_eq!(fs.read(&rec.id).unwrap(), b"a,b\n1,2\n");
        assert_eq!(fs.get(&rec.id).unwrap().as_ref(), Some(&rec));
        assert_eq!(fs.list().unwrap(), vec![rec.clone()]);
        // Another workspace sees nothing of it.
        let other = FileStore::open(dir.path(), "other", db).unwrap();
        assert_eq!(other.get(&rec.id).unwrap(), None);
        assert!(other.list().unwrap().is_empty());
        assert!(fs.remove(&rec.id).unwrap());
        assert!(!fs.remove(&rec.id).unwrap());
        assert!(fs.list().unwrap().is_empty());
        assert!(!dir.path().join("files/w").join(&rec.id).exists());
    }

    #[test]
    fn the_sha256_is_that_of_the_bytes() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db).unwrap();
        let src = dir.path().join("abc");
        std::fs::write(&src, "abc").unwrap();
        let rec = fs.put(&src, Some("x.bin"), vec![], None).unwrap();
        assert_eq!(
            rec.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(rec.mime_type, "application/octet-stream");
    }

    #[test]
    fn open_removes_what_an_interrupted_write_left() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db.clone()).unwrap();
        let src = dir.path().join("keep.txt");
        std::fs::write(&src, "keep").unwrap();
        let kept = fs.put(&src, None, vec![], None).unwrap();
        let files = dir.path().join("files/w");
        // A crash after the rename but before the commit, and one mid-copy.
        std::fs::write(files.join("fl_0123456789abcdef01234567"), "orphan").unwrap();
        std::fs::write(files.join(".tmp-fl_aaaaaaaaaaaaaaaaaaaaaaaa"), "half").unwrap();
        let fs = FileStore::open(dir.path(), "w", db).unwrap();
        let left: Vec<String> = std::fs::read_dir(&files)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec![kept.id.clone()]);
        assert_eq!(fs.read(&kept.id).unwrap(), b"keep");
    }

    #[test]
    fn rollback_restores_the_checkpointed_set_and_its_bytes() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db.clone()).unwrap();
        let src = dir.path().join("a.txt");
        std::fs::write(&src, "A").unwrap();
        let a = fs.put(&src, None, vec![], None).unwrap();
        let cp = fs.checkpoint().unwrap();
        assert_eq!(cp.files, vec![a.clone()]);
        std::fs::write(&src, "B").unwrap();
        let b = fs.put(&src, Some("b.txt"), vec![], None).unwrap();
        assert!(fs.remove(&a.id).unwrap());
        // Reopening must not collect the checkpointed blob.
        let fs = FileStore::open(dir.path(), "w", db).unwrap();
        let rb = fs.rollback(&cp.checkpoint_id).unwrap().unwrap();
        assert!(rb.success);
        assert_eq!(rb.restored_files, vec![a.id.clone()]);
        assert_eq!(fs.list().unwrap(), vec![a.clone()]);
        assert_eq!(fs.read(&a.id).unwrap(), b"A");
        assert_eq!(fs.get(&b.id).unwrap(), None);
        assert!(fs.rollback("cp_nope").unwrap().is_none());
    }

    #[test]
    fn bad_ids_and_tags_are_refused() {
        let (dir, db) = setup();
        let fs = FileStore::open(dir.path(), "w", db).unwrap();
        for id in ["../state.db", "fl_ABCDEF0123456789abcdef01", "fl_123", ""] {
            assert_eq!(fs.get(id).unwrap(), None, "{id}");
            assert!(fs.read(id).is_err(), "{id}");
        }
        let src = dir.path().join("t.txt");
        std::fs::write(&src, "t").unwrap();
        assert!(matches!(
            fs.put(&src, None, vec!["".into()], None),
            Err(FileError::BadTag(_))
        ));
    }
}
