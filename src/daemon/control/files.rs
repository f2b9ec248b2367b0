//! `files.*`: a workspace's files, asked of its WorkspaceActor (which runs
//! the FileStore on the blocking pool).

use std::path::{Path, PathBuf};

use ractor::RpcReplyPort;

use super::ask::{ask, limit, workspace};
use super::Ctx;
use crate::daemon::workspace::{FilesOp, WorkspaceMsg};
use crate::files::FileError;
use crate::protocol::typed::FileRemoved;
use crate::protocol::{
    Checkpoint, ErrorKind, FileContent, FileRecord, FilesList, FilesParams, FilesPutParams,
    Rollback, RpcError,
};

/// Runs one FileStore operation in a workspace.
pub(super) async fn files_call<T: Send + 'static>(
    ctx: &Ctx,
    ws: &str,
    op: impl FnOnce(RpcReplyPort<Result<T, FileError>>) -> FilesOp,
) -> Result<T, RpcError> {
    let actor = workspace(ctx, ws).await?;
    ask(
        &actor,
        |reply| WorkspaceMsg::Files(op(reply)),
        limit::FILES,
        "the file operation",
    )
    .await?
    .map_err(|e| {
        let kind = match e {
            // What the caller gave (a tag, an id) is wrong.
            FileError::BadTag(_) | FileError::BadId(_) => ErrorKind::InvalidParams,
            FileError::Io { .. } | FileError::Store(_) => ErrorKind::FileError,
        };
        RpcError::new(kind, e.to_string())
    })
}

fn file_not_found(ws: &str, id: &str) -> RpcError {
    RpcError::new(
        ErrorKind::FileNotFound,
        format!("no file {id:?} in workspace {ws:?}; `bundlevisor files ls -w {ws}` lists them"),
    )
}

fn require_id(p: &FilesParams) -> Result<String, RpcError> {
    p.id.clone()
        .ok_or_else(|| RpcError::new(ErrorKind::InvalidParams, "\"id\" is required"))
}

pub(super) async fn files_put(p: FilesPutParams, ctx: &Ctx) -> Result<FileRecord, RpcError> {
    let refused = |message: String| {
        Err(RpcError::new(ErrorKind::InvalidParams, message).with("path", p.path.clone()))
    };
    // Opened here (on the blocking pool), checked against the peer, and read
    // by the store through this very descriptor: a path swapped after the
    // check changes nothing.
    let opened = p.path.clone();
    let file = tokio::task::spawn_blocking(move || {
        std::fs::File::open(&opened)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    })
    .await
    .ok()
    .flatten();
    let file = match file {
        Some(f) if ctx.peer.may_read(&f) => f,
        Some(_) => return refused(ctx.peer.not_theirs("file", &p.path)),
        None if !ctx.peer.is_daemon_uid() => return refused(ctx.peer.not_theirs("file", &p.path)),
        None => return refused(format!("{} is not a readable file", p.path)),
    };
    use std::os::fd::AsRawFd;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let filename = Path::new(&p.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let (tags, mime) = (p.tags, p.mime);
    let record = files_call(ctx, &p.workspace, |reply| FilesOp::Put {
        path,
        filename,
        tags,
        mime,
        reply,
    })
    .await?;
    drop(file);
    Ok(record)
}

pub(super) async fn files_ls(p: FilesParams, ctx: &Ctx) -> Result<FilesList, RpcError> {
    let files = files_call(ctx, &p.workspace, FilesOp::List).await?;
    Ok(FilesList {
        workspace: p.workspace,
        files,
    })
}

pub(super) async fn files_get(p: FilesParams, ctx: &Ctx) -> Result<FileContent, RpcError> {
    use base64::Engine;
    let id = require_id(&p)?;
    let found = files_call(ctx, &p.workspace, |reply| FilesOp::Get {
        id: id.clone(),
        reply,
    })
    .await?;
    let (file, bytes) = found.ok_or_else(|| file_not_found(&p.workspace, &id))?;
    Ok(FileContent {
        file,
        base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

pub(super) async fn files_rm(p: FilesParams, ctx: &Ctx) -> Result<FileRemoved, RpcError> {
    let id = require_id(&p)?;
    if !files_call(ctx, &p.workspace, |reply| FilesOp::Remove {
        id: id.clone(),
        reply,
    })
    .await?
    {
        return Err(file_not_found(&p.workspace, &id));
    }
    Ok(FileRemoved {
        workspace: p.workspace,
        id,
        removed: true,
    })
}

pub(super) async fn files_checkpoint(p: FilesParams, ctx: &Ctx) -> Result<Checkpoint, RpcError> {
    files_call(ctx, &p.workspace, FilesOp::Checkpoint).await
}

pub(super) async fn files_rollback(p: FilesParams, ctx: &Ctx) -> Result<Rollback, RpcError> {
    let checkpoint_id = require_id(&p)?;
    let id = checkpoint_id.clone();
    files_call(ctx, &p.workspace, |reply| FilesOp::Rollback {
        checkpoint_id: id,
        reply,
    })
    .await?
    .ok_or_else(|| {
        RpcError::new(
            ErrorKind::FileNotFound,
            format!(
                "no checkpoint {checkpoint_id:?} in workspace {:?}",
                p.workspace
            ),
        )
    })
}
