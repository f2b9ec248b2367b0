//! `files.*`: a workspace's files, asked of its WorkspaceActor (which runs
//! the FileStore on the blocking pool).

use std::path::{Path, PathBuf};

use ractor::RpcReplyPort;

use super::Ctx;
use crate::daemon::workspace::FilesOp;
use crate::files::FileError;
use crate::protocol::typed::FileRemoved;
use crate::protocol::{
    Checkpoint, ErrorKind, FileContent, FileRecord, FilesList, FilesParams, FilesPutParams,
    Rollback, RpcError,
};

/// Runs one FileStore operation in a workspace.
async fn files_call<T: Send + 'static>(
    ctx: &Ctx,
    ws: &str,
    op: impl FnOnce(RpcReplyPort<Result<T, FileError>>) -> FilesOp,
) -> Result<T, RpcError> {
    Ok(ctx.api.files(ws, op).await?)
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

/// Why a path cannot be put.
enum Unfit {
    /// It cannot be opened (missing, unreadable); the OS's reason.
    Unopened(std::io::Error),
    /// An admitted user's path it does not own.
    NotTheirs,
    /// A FIFO, socket, device or folder: named for the message.
    NotRegular(&'static str),
}

/// Opens `path` (links followed; called with the peer's rights) as an
/// `O_PATH` handle, which neither blocks (a FIFO with no writer) nor
/// touches a device, and checks on it that the peer may read it and that
/// it is a regular file. The store then
/// reads that very inode through `/proc/self/fd`, so a path swapped after
/// the check changes nothing.
fn open_regular(path: &str, peer: crate::daemon::admission::Peer) -> Result<std::fs::File, Unfit> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH)
        .open(path)
        .map_err(Unfit::Unopened)?;
    if !peer.may_read(&file) {
        return Err(Unfit::NotTheirs);
    }
    let kind = file.metadata().map_err(Unfit::Unopened)?.file_type();
    match () {
        _ if kind.is_file() => Ok(file),
        _ if kind.is_fifo() => Err(Unfit::NotRegular("a FIFO")),
        _ if kind.is_socket() => Err(Unfit::NotRegular("a socket")),
        _ if kind.is_dir() => Err(Unfit::NotRegular("a folder")),
        _ if kind.is_char_device() || kind.is_block_device() => Err(Unfit::NotRegular("a device")),
        _ => Err(Unfit::NotRegular("not a plain file")),
    }
}

pub(super) async fn files_put(p: FilesPutParams, ctx: &Ctx) -> Result<FileRecord, RpcError> {
    let refused = |message: String| {
        Err(RpcError::new(ErrorKind::InvalidParams, message).with("path", p.path.clone()))
    };
    // One of the peer's slots for the whole put: the open and the read run
    // on the blocking pool, and a file system that never answers holds
    // only that peer's slots.
    let slot = ctx.shared.path_work.permit(ctx.peer.uid).await;
    let (opened, peer) = (p.path.clone(), ctx.peer);
    // An admitted user's path is opened with its own rights (only the
    // read that follows is the daemon's).
    let file = tokio::task::spawn_blocking(move || {
        crate::bundle::sandbox::as_user(peer.uid, || open_regular(&opened, peer))
            .unwrap_or(Err(Unfit::NotTheirs))
    })
    .await
    .map_err(super::wire::unavailable)?;
    let file = match file {
        Ok(f) => f,
        // An admitted user learns nothing about paths it does not own.
        Err(Unfit::NotTheirs | Unfit::Unopened(_)) if !ctx.peer.is_daemon_uid() => {
            return refused(ctx.peer.not_theirs("file", &p.path))
        }
        Err(Unfit::NotTheirs) => unreachable!("the daemon's uid may read every path"),
        Err(Unfit::Unopened(e)) => return refused(format!("{} is not a readable file: {e}", p.path)),
        Err(Unfit::NotRegular(kind)) => {
            return refused(format!(
                "{} is not a regular file ({kind}); `files put` stores the contents of regular files only: copy it into one first",
                p.path
            ))
        }
    };
    use std::os::fd::AsRawFd;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let filename = Path::new(&p.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let (tags, mime) = (p.tags, p.mime);
    // The file (so fd N stays this file) and the slot go with the put: if
    // this handler stops waiting, the read still holds both until it ends.
    let held: Box<dyn Send> = Box::new((file, slot));
    files_call(ctx, &p.workspace, |reply| FilesOp::Put {
        path,
        filename,
        tags,
        mime,
        held,
        reply,
    })
    .await
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
