//! A small HTTP/1.1 server of one request per connection, for the one place
//! that answers plain HTTP without the daemon's web stack: the loopback
//! redirect of `bundlevisor auth` (a CLI process, no axum runtime needed).
//!
//! Connections are served concurrently. Each has [`Limits::deadline`] for its
//! whole request head and as long again for the answer; at most
//! [`Limits::max_connections`] are open at once, and a newcomer beyond that
//! closes the oldest one. So idle or trickling connections (a port scanner,
//! a browser's speculative pre-connect, a hostile local user) can delay a
//! real request by nothing more than the time it takes to send it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinSet};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once; the oldest is closed for a newcomer.
    pub max_connections: usize,
    /// For the whole request head, and again for writing the answer.
    pub deadline: Duration,
    /// A longer head is cut here (the request line is at its start).
    pub max_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            deadline: Duration::from_secs(5),
            max_head_bytes: 8192,
        }
    }
}

/// The request line of one request.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// As sent: the path and the query.
    pub target: String,
}

impl Request {
    /// The path of the target, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    /// E.g. "200 OK".
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: String,
}

/// Serves `listener` until `handle` returns a value, and returns that value
/// once the answer that came with it has been written (or could not be).
/// With `T = Infallible` it serves for as long as the future is polled.
/// Dropping the future closes every connection it has open.
pub async fn serve<T, H>(listener: &TcpListener, limits: Limits, handle: H) -> T
where
    T: Send + 'static,
    H: Fn(&Request) -> (Response, Option<T>) + Send + Sync + 'static,
{
    let handle = Arc::new(handle);
    let mut tasks: JoinSet<Option<T>> = JoinSet::new();
    let mut open: VecDeque<AbortHandle> = VecDeque::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: let some close first.
                    tracing::warn!("HTTP listener on {:?}: {e}", listener.local_addr().ok());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(Some(value)) = done {
                    return value;
                }
                continue;
            }
        };
        open.retain(|task| !task.is_finished());
        if open.len() >= limits.max_connections.max(1) {
            if let Some(oldest) = open.pop_front() {
                oldest.abort();
            }
        }
        let handle = handle.clone();
        open.push_back(
            tasks.spawn(async move { connection(stream, limits, move |r| handle(r)).await }),
        );
    }
}

/// One connection: the head within the deadline, the handler, the answer.
async fn connection<T>(
    mut stream: TcpStream,
    limits: Limits,
    handle: impl FnOnce(&Request) -> (Response, Option<T>),
) -> Option<T> {
    let head = tokio::time::timeout(limits.deadline, read_head(&mut stream, limits))
        .await
        .ok()??;
    let mut words = head.split_whitespace();
    let request = Request {
        method: words.next().unwrap_or("").to_string(),
        target: words.next().unwrap_or("").to_string(),
    };
    let (response, value) = handle(&request);
    let text = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        response.status,
        response.content_type,
        response.body.len(),
        response.body
    );
    let _ = tokio::time::timeout(limits.deadline, async {
        stream.write_all(text.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    value
}

/// The request head (up to the blank line, at most `max_head_bytes`);
/// None if the peer closed or failed before sending all of it.
async fn read_head(stream: &mut TcpStream, limits: Limits) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < limits.max_head_bytes {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn ok(body: &str) -> Response {
        Response {
            status: "200 OK",
            content_type: "text/plain",
            body: body.to_string(),
        }
    }

    async fn get(addr: std::net::SocketAddr, target: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn idle_and_trickling_connections_do_not_keep_a_request_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 8,
            deadline: Duration::from_secs(30),
            max_head_bytes: 8192,
        };
        tokio::spawn(async move {
            let never: Infallible = serve(&listener, limits, |r| {
                (ok(&format!("you asked {}", r.target)), None)
            })
            .await;
            match never {}
        });
        // More idle connections than the cap, and one that trickles.
        let mut idle = Vec::new();
        for _ in 0..20 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut trickle = TcpStream::connect(addr).await.unwrap();
        let trickling = tokio::spawn(async move {
            for b in b"GET /slow HTTP/1.1\r\n".iter().cycle() {
                if trickle.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let answer = tokio::time::timeout(Duration::from_secs(5), get(addr, "/metrics"))
            .await
            .expect("a real request is answered at once");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("you asked /metrics"), "{answer}");
        trickling.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_not_sent_within_the_deadline_is_dropped_and_a_value_ends_serving() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            serve(&listener, Limits::default(), |r| {
                (
                    ok("done"),
                    (r.path() == "/callback").then(|| r.target.clone()),
                )
            })
            .await
        });
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /never").await.unwrap();
        let mut rest = Vec::new();
        // The clock is paused: this read ends only because the deadline passes.
        let n = slow.read_to_end(&mut rest).await.unwrap();
        assert_eq!(n, 0, "closed without an answer");
        let answer = get(addr, "/callback?code=1").await;
        assert!(answer.ends_with("done"), "{answer}");
        assert_eq!(server.await.unwrap(), "/callback?code=1");
    }
}
