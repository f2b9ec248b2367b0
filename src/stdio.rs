//! Async stdin and stdout that stay on the event loop.
//!
//! tokio's `stdin()` and `stdout()` hand every read and write to a
//! blocking-pool thread, so each message costs two thread wake-ups (about
//! 40 µs on a VM, more than the rest of a relay; docs/performance.md). An
//! MCP client spawns its server with pipes or a socket pair, and those can
//! be polled like any other descriptor instead.
//!
//! The inherited descriptors are never switched to non-blocking mode: the
//! open file description is shared with whoever else holds it (a shell
//! wrapper's background job, the terminal, the parent), and making it
//! non-blocking would make *their* writes fail with EAGAIN. A pipe is
//! reopened through `/proc/self/fd` (a new, private description); a socket
//! is used with per-call `MSG_DONTWAIT`. Anything else (a terminal, a file,
//! or a sandbox without `/proc`) keeps tokio's handles.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use nix::sys::socket::{recv, send, MsgFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// (stdin, stdout) for an MCP stdio transport.
pub fn stdio() -> (Reader, Writer) {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let reader: Reader = match polled(stdin.as_fd(), Direction::Read) {
        Some(Polled::Pipe(file)) => match tokio::net::unix::pipe::Receiver::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        Some(Polled::Socket(socket)) => Box::new(socket),
        None => Box::new(tokio::io::stdin()),
    };
    let writer: Writer = match polled(stdout.as_fd(), Direction::Write) {
        Some(Polled::Pipe(file)) => match tokio::net::unix::pipe::Sender::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        Some(Polled::Socket(socket)) => Box::new(socket),
        None => Box::new(tokio::io::stdout()),
    };
    (reader, writer)
}

enum Polled {
    Pipe(std::fs::File),
    Socket(Socket),
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Read,
    Write,
}

/// An event-loop handle on `fd` for one direction, if it is a pipe or a
/// socket.
fn polled(fd: BorrowedFd<'_>, direction: Direction) -> Option<Polled> {
    let duplicate = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    let kind = duplicate.metadata().ok()?.file_type();
    if kind.is_fifo() {
        let mut open = std::fs::OpenOptions::new();
        match direction {
            Direction::Read => open.read(true),
            Direction::Write => open.write(true),
        };
        open.custom_flags(nix::libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .ok()
            .map(Polled::Pipe)
    } else if kind.is_socket() {
        let interest = match direction {
            Direction::Read => tokio::io::Interest::READABLE,
            Direction::Write => tokio::io::Interest::WRITABLE,
        };
        // SAFETY: the duplicate is owned by the AsyncFd, which keeps it
        // open until it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(OwnedFd::from(duplicate), interest) };
        fd.ok().map(|fd| Polled::Socket(Socket { fd }))
    } else {
        None
    }
}

/// A stream socket read or written with `MSG_DONTWAIT`, leaving the shared
/// description's flags alone. Each direction registers its own duplicate.
struct Socket {
    fd: AsyncFd<OwnedFd>,
}

const DONTWAIT: MsgFlags = MsgFlags::MSG_DONTWAIT;

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| Ok(recv(fd.as_raw_fd(), unfilled, DONTWAIT)?)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let flags = DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| Ok(send(fd.as_raw_fd(), buf, flags)?)) {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn is_nonblocking(fd: BorrowedFd<'_>) -> bool {
        let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
    }

    #[tokio::test]
    async fn a_socket_is_polled_and_its_shared_description_stays_blocking() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let Some(Polled::Socket(mut reader)) = polled(ours.as_fd(), Direction::Read) else {
            panic!("a socket is polled");
        };
        let Some(Polled::Socket(mut writer)) = polled(ours.as_fd(), Direction::Write) else {
            panic!("a socket is polled");
        };
        assert!(
            !is_nonblocking(ours.as_fd()),
            "the shared description was changed"
        );
        // More than the socket buffers hold, so the writer waits for room.
        let sent: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let echo = std::thread::spawn(move || {
            let mut got = vec![0u8; 4 << 20];
            std::io::Read::read_exact(&mut theirs, &mut got).unwrap();
            std::io::Write::write_all(&mut theirs, b"ok\n").unwrap();
            got
        });
        writer.write_all(&sent).await.unwrap();
        let mut answer = [0u8; 3];
        reader.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ok\n");
        assert!(echo.join().unwrap() == sent);
        assert!(!is_nonblocking(ours.as_fd()));
    }

    #[tokio::test]
    async fn a_pipe_is_reopened_privately_and_the_inherited_end_stays_blocking() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let Some(Polled::Pipe(private)) = polled(write.as_fd(), Direction::Write) else {
            panic!("a pipe is polled");
        };
        let mut sender = tokio::net::unix::pipe::Sender::from_file(private).unwrap();
        assert!(
            !is_nonblocking(write.as_fd()),
            "the inherited end was changed"
        );
        sender.write_all(b"through\n").await.unwrap();
        let mut got = [0u8; 8];
        std::io::Read::read_exact(&mut std::fs::File::from(read), &mut got).unwrap();
        assert_eq!(&got, b"through\n");
        assert!(!is_nonblocking(write.as_fd()));
    }
}
