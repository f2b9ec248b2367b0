//! `bundlevisor files put|ls|get|rm`: the workspace's files, which bundles
//! read through `ai.nimblebrain/host-resources`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::{Checkpoint, Rollback};
use crate::protocol::{
    FileContent, FileRecord, FilesList, FilesParams, FilesPutParams, DEFAULT_WORKSPACE,
};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: FilesCommand,
}

#[derive(clap::Subcommand, Debug)]
enum FilesCommand {
    /// Store a file; prints its id.
    Put {
        path: PathBuf,
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
        /// A tag (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// MIME type (default: from the extension, else the content).
        #[arg(long)]
        mime: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List the workspace's files.
    Ls {
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
        #[arg(long)]
        json: bool,
    },
    /// Write a file's bytes to stdout or to -o PATH.
    Get {
        id: String,
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Delete a file.
    Rm {
        id: String,
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
    },
    /// Record the workspace's file set; prints {checkpoint_id, timestamp, files}.
    Checkpoint {
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
    },
    /// Restore the file set of a checkpoint; prints {success, checkpoint_id, restored_files}.
    Rollback {
        checkpoint_id: String,
        #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
        workspace: String,
    },
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    match &args.command {
        FilesCommand::Put {
            path,
            workspace,
            tags,
            mime,
            json,
        } => {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            let params = FilesPutParams {
                workspace: workspace.clone(),
                path: path.display().to_string(),
                tags: tags.clone(),
                mime: mime.clone(),
            };
            let record: FileRecord = client
                .call::<crate::protocol::typed::FilesPut>(params, |_| {})
                .await?;
            if *json {
                print_json(&record)?;
            } else {
                outln!("{}", record.id);
            }
        }
        FilesCommand::Ls { workspace, json } => {
            let params = FilesParams {
                workspace: workspace.clone(),
                id: None,
            };
            let list: FilesList = client
                .call::<crate::protocol::typed::FilesLs>(params, |_| {})
                .await?;
            if *json {
                print_json(&list)?;
            } else {
                for f in &list.files {
                    outln!(
                        "{}  {:>10}  {:<24}  {}  [{}]",
                        f.id,
                        f.size,
                        printable_line(&f.mime_type),
                        printable_line(&f.filename),
                        printable_line(&f.tags.join(","))
                    );
                }
            }
        }
        FilesCommand::Get {
            id,
            workspace,
            output,
        } => {
            use base64::Engine;
            let params = FilesParams {
                workspace: workspace.clone(),
                id: Some(id.clone()),
            };
            let content: FileContent = client
                .call::<crate::protocol::typed::FilesGet>(params, |_| {})
                .await?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(content.base64)
                .map_err(|e| ClientError::Protocol(format!("bad content from daemon: {e}")))?;
            let written = match output {
                Some(path) => std::fs::write(path, &bytes)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                None => {
                    let mut stdout = std::io::stdout().lock();
                    if let Err(e) = stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
                        super::exit_on_write_error(&e);
                    }
                    Ok(())
                }
            };
            written.map_err(ClientError::Protocol)?;
        }
        FilesCommand::Rm { id, workspace } => {
            let params = FilesParams {
                workspace: workspace.clone(),
                id: Some(id.clone()),
            };
            client
                .call::<crate::protocol::typed::FilesRm>(params, |_| {})
                .await?;
            outln!("{id} removed");
        }
        FilesCommand::Checkpoint { workspace } => {
            let params = FilesParams {
                workspace: workspace.clone(),
                id: None,
            };
            let cp: Checkpoint = client
                .call::<crate::protocol::typed::FilesCheckpoint>(params, |_| {})
                .await?;
            print_json(&cp)?;
        }
        FilesCommand::Rollback {
            checkpoint_id,
            workspace,
        } => {
            let params = FilesParams {
                workspace: workspace.clone(),
                id: Some(checkpoint_id.clone()),
            };
            let r: Rollback = client
                .call::<crate::protocol::typed::FilesRollback>(params, |_| {})
                .await?;
            print_json(&r)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
