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
//!
//! `bundlevisor mcp` hands its stdin and stdout to the daemon when both are
//! pipes or sockets ([`send_stdio`], [`receive_stdio`]): the daemon polls
//! them the same way ([`polled_pair`]) and the relay's hop is gone.

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

/// Event-loop handles on a (stdin, stdout) pair of pipes or sockets, if
/// both are; nothing otherwise (a terminal, a file).
pub fn polled_pair(stdin: BorrowedFd<'_>, stdout: BorrowedFd<'_>) -> Option<(Reader, Writer)> {
    let reader: Reader = match polled(stdin, Direction::Read)? {
        Polled::Pipe(file) => Box::new(tokio::net::unix::pipe::Receiver::from_file(file).ok()?),
        Polled::Socket(socket) => Box::new(socket),
    };
    let writer: Writer = match polled(stdout, Direction::Write)? {
        Polled::Pipe(file) => Box::new(tokio::net::unix::pipe::Sender::from_file(file).ok()?),
        Polled::Socket(socket) => Box::new(socket),
    };
    Some((reader, writer))
}

/// Whether this process's stdin and stdout are pipes or sockets, which
/// `bundlevisor mcp` may hand to the daemon.
pub fn can_hand_over() -> bool {
    let kind = |fd: BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        let kind = file.metadata().ok()?.file_type();
        Some(kind.is_fifo() || kind.is_socket())
    };
    kind(std::io::stdin().as_fd()) == Some(true) && kind(std::io::stdout().as_fd()) == Some(true)
}

/// Sends this process's stdin and stdout on a unix socket (`SCM_RIGHTS`,
/// with one byte of payload).
pub async fn send_stdio(socket: &tokio::net::UnixStream) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage};
    let fds = [
        std::io::stdin().as_fd().as_raw_fd(),
        std::io::stdout().as_fd().as_raw_fd(),
    ];
    socket
        .async_io(tokio::io::Interest::WRITABLE, || {
            let payload = [io::IoSlice::new(b"\n")];
            let rights = [ControlMessage::ScmRights(&fds)];
            let flags = DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            sendmsg::<()>(socket.as_raw_fd(), &payload, &rights, flags, None)
                .map(drop)
                .map_err(io::Error::from)
        })
        .await
}

/// Receives the two descriptors `send_stdio` sent; anything else (no
/// descriptors, more than two, a truncated message) is refused and what
/// came is closed.
pub async fn receive_stdio(socket: &tokio::net::UnixStream) -> io::Result<[OwnedFd; 2]> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned};
    use std::os::fd::{FromRawFd, RawFd};
    let mut received: Vec<OwnedFd> = Vec::new();
    socket
        .async_io(tokio::io::Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut payload = [io::IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([RawFd; 2]);
            let flags = DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC;
            let msg = recvmsg::<()>(socket.as_raw_fd(), &mut payload, Some(&mut space), flags)
                .map_err(io::Error::from)?;
            let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
            for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    // SAFETY: the kernel just installed these descriptors
                    // in this process; nothing else owns them.
                    received.extend(
                        fds.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            if msg.bytes == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed",
                ));
            }
            if truncated {
                return Err(io::Error::other("more descriptors than stdin and stdout"));
            }
            Ok(())
        })
        .await?;
    let mut fds = received.into_iter();
    match (fds.next(), fds.next(), fds.next()) {
        (Some(stdin), Some(stdout), None) => Ok([stdin, stdout]),
        _ => Err(io::Error::other(
            "expected two descriptors (stdin and stdout)",
        )),
    }
}

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
