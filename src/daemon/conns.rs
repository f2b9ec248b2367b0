//! The TCP connections of the daemon's HTTP listeners (the gateway's
//! `[http] listen` and `metrics_addr`): accepted here and served by hyper
//! (HTTP/1.1) with the axum router, so that no client can hold what the
//! daemon needs for others.
//!
//! - At most `[http] max_connections` connections a listener, TLS
//!   handshakes included. A newcomer beyond the cap closes the connection
//!   that has been idle longest (no request in flight, waiting for its next
//!   request head); when every connection is busy, the newcomer is closed.
//!   So idle or trickling connections cannot exhaust the daemon's
//!   descriptors (the control socket's among them) nor keep a request out.
//! - A request head must arrive within `[http] head_timeout` of the moment
//!   the connection is ready for one (right after the accept, or after the
//!   previous answer): an idle keep-alive connection is closed then too.
//! - A TLS handshake must finish within the same time.
//! - Bundles are refused on every route: before a connection's first
//!   request is routed, the client is looked up by the connection's own
//!   addresses (`admission::tcp_refusal`, once per connection, off the event
//!   loop); a refused one gets 403 and the connection is closed.
//!
//! The request body's own deadline (`[http] body_timeout`) is applied where
//! the body is read (the gateway endpoints).

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::SandboxSettings;

/// What a listener allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections open at once (TLS handshakes included).
    pub max_connections: usize,
    /// For a request head (from when the connection is ready for one), and
    /// for a TLS handshake.
    pub head_timeout: Duration,
}

impl ConnLimits {
    /// The configured limits, with the connection cap lowered to a quarter
    /// of the open-files limit when that is less: the two listeners
    /// together then hold at most half the daemon's descriptors, and the
    /// rest (bundles' pipes, the store, the control socket's accepts) stay
    /// free whatever TCP clients do.
    pub fn of(http: &crate::config::HttpSettings) -> ConnLimits {
        use nix::sys::resource::{getrlimit, Resource};
        let budget = getrlimit(Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| usize::try_from(soft / 4).unwrap_or(usize::MAX))
            .unwrap_or(usize::MAX);
        if budget < http.max_connections {
            tracing::warn!(
                configured = http.max_connections,
                serving = budget,
                "[http] max_connections is more than a quarter of the open-files limit; each listener keeps at most a quarter (raise LimitNOFILE= to serve more)"
            );
        }
        ConnLimits {
            max_connections: http.max_connections.min(budget).max(1),
            head_timeout: http.head_timeout,
        }
    }
}

/// One open connection, as the registry sees it (until its task ends,
/// closing or not: its descriptor counts until then).
struct Entry {
    /// Told to close already (not chosen again).
    closing: bool,
    /// Requests whose answers are not finished (a streamed body included).
    busy: Arc<AtomicUsize>,
    /// When it last became idle (or was accepted), for the eviction order.
    idle_since: Arc<Mutex<tokio::time::Instant>>,
    /// Closes it (gracefully: an idle connection at once).
    close: Arc<Notify>,
}

/// The open connections of one listener.
#[derive(Default)]
struct Registry {
    next: u64,
    open: HashMap<u64, Entry>,
}

impl Registry {
    /// Room for one more: closes the longest-idle connection when full.
    /// False when every connection is busy or already closing (the
    /// newcomer is refused). A closed connection counts until its task
    /// has dropped it, so the cap bounds descriptors, not only entries.
    fn make_room(&mut self, max: usize) -> bool {
        if self.open.len() < max {
            return true;
        }
        let oldest = self
            .open
            .values_mut()
            .filter(|e| !e.closing && e.busy.load(Ordering::SeqCst) == 0)
            .min_by_key(|e| *e.idle_since.lock().unwrap_or_else(|p| p.into_inner()));
        match oldest {
            Some(entry) => {
                entry.closing = true;
                entry.close.notify_one();
                // Dropped at once (it is idle): the newcomer may have its place.
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` (HTTPS when `tls`), then
/// closes every connection gracefully and returns once they are closed.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    router: Router,
    limits: ConnLimits,
    sandbox: SandboxSettings,
    shutdown: CancellationToken,
) {
    let sandbox = Arc::new(sandbox);
    let registry = Arc::new(Mutex::new(Registry::default()));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut tasks = tokio::task::JoinSet::new();
    let mut last_said: Option<tokio::time::Instant> = None;
    loop {
        let (stream, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, most likely: let some close first.
                    tracing::warn!("HTTP listener {:?}: accept failed: {e}", listener.local_addr().ok());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let entry = {
            let mut open = registry.lock().unwrap_or_else(|p| p.into_inner());
            if !open.make_room(limits.max_connections) {
                // Said at most once a second: a flood must not fill the log.
                let now = tokio::time::Instant::now();
                if last_said.is_none_or(|at| now - at >= Duration::from_secs(1)) {
                    last_said = Some(now);
                    tracing::warn!(
                        %remote,
                        max = limits.max_connections,
                        "HTTP connection refused: every connection is busy ([http] max_connections)"
                    );
                }
                continue;
            }
            let id = open.next;
            open.next += 1;
            let entry = Entry {
                closing: false,
                busy: Arc::default(),
                idle_since: Arc::new(Mutex::new(tokio::time::Instant::now())),
                close: Arc::default(),
            };
            let handles = (
                id,
                entry.busy.clone(),
                entry.idle_since.clone(),
                entry.close.clone(),
            );
            open.open.insert(id, entry);
            handles
        };
        let (id, busy, idle_since, close) = entry;
        let peer = Client {
            addr: remote,
            local: stream.local_addr().ok(),
            sandbox: sandbox.clone(),
            refusal: tokio::sync::OnceCell::new(),
        };
        let (router, acceptor, registry, shutdown) = (
            router.clone(),
            acceptor.clone(),
            registry.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            let service = Service {
                router,
                peer: Arc::new(peer),
                busy,
                idle_since,
            };
            connection(stream, acceptor, service, limits, &shutdown, &close).await;
            registry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open
                .remove(&id);
        });
    }
    // Shutdown: every connection closes gracefully (its answers finish).
    for entry in registry
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .open
        .values()
    {
        entry.close.notify_one();
    }
    while tasks.join_next().await.is_some() {}
}

/// One connection: the TLS handshake (if any), then HTTP/1.1 until the
/// client leaves, the head deadline passes, or it is closed.
async fn connection(
    stream: TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    service: Service,
    limits: ConnLimits,
    shutdown: &CancellationToken,
    close: &Notify,
) {
    match acceptor {
        None => http1(stream, service, limits, shutdown, close).await,
        Some(acceptor) => {
            let remote = service.peer.addr;
            let handshake = tokio::time::timeout(limits.head_timeout, acceptor.accept(stream));
            let tls = tokio::select! {
                _ = close.notified() => return,
                _ = shutdown.cancelled() => return,
                done = handshake => done,
            };
            match tls {
                Ok(Ok(tls)) => http1(tls, service, limits, shutdown, close).await,
                Ok(Err(e)) => tracing::debug!(%remote, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
            }
        }
    }
}

async fn http1<I>(
    io: I,
    service: Service,
    limits: ConnLimits,
    shutdown: &CancellationToken,
    close: &Notify,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let busy = service.busy.clone();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = shutdown.cancelled() => {}
        _ = close.notified() => {
            // Evicted while idle: dropped now, even with half a head read
            // (hyper's graceful close would wait for the head's deadline).
            if busy.load(Ordering::SeqCst) == 0 {
                return;
            }
        }
    }
    // A busy one (or the daemon stopping) ends after its answer.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// The client of one connection and, once looked up (for the whole
/// connection), why it is refused, if it is: a bundle's socket.
struct Client {
    addr: std::net::SocketAddr,
    /// The connection's own address (never the wildcard it was accepted on).
    local: Option<std::net::SocketAddr>,
    sandbox: Arc<SandboxSettings>,
    refusal: tokio::sync::OnceCell<Option<String>>,
}

impl Client {
    /// 403 (and the connection closed) for a bundle, or for a client that
    /// cannot be identified; None to serve it.
    async fn refused(&self) -> Option<axum::response::Response> {
        let refused = self
            .refusal
            .get_or_init(|| {
                let (addr, local, sandbox) = (self.addr, self.local, self.sandbox.clone());
                async move {
                    let Some(local) = local else {
                        return Some(format!("{addr}: the connection's own address is unknown"));
                    };
                    tokio::task::spawn_blocking(move || {
                        super::admission::tcp_refusal(addr, local, &sandbox)
                    })
                    .await
                    .unwrap_or_else(|e| Some(e.to_string()))
                }
            })
            .await;
        let why = refused.as_ref()?;
        tracing::warn!(peer = %self.addr, "HTTP connection refused: {why}");
        Some(
            (
                axum::http::StatusCode::FORBIDDEN,
                [(axum::http::header::CONNECTION, "close")],
            )
                .into_response(),
        )
    }
}

/// The router for one connection: each request is admitted (or not) by
/// its peer, and counts as busy until its answer's body is finished.
#[derive(Clone)]
struct Service {
    router: Router,
    peer: Arc<Client>,
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<tokio::time::Instant>>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Service {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        use tower_service::Service as _;
        let request = request.map(Body::new);
        let busy = Busy::enter(self.busy.clone(), self.idle_since.clone());
        let (peer, mut router) = (self.peer.clone(), self.router.clone());
        Box::pin(async move {
            if let Some(no) = peer.refused().await {
                return Ok(no);
            }
            let response = router.call(request).await?;
            Ok(response.map(|body| Body::new(Guarded { body, _busy: busy })))
        })
    }
}

/// One request in flight on a connection; its end marks the connection
/// idle from that moment.
struct Busy {
    count: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<tokio::time::Instant>>,
}

impl Busy {
    fn enter(count: Arc<AtomicUsize>, idle_since: Arc<Mutex<tokio::time::Instant>>) -> Busy {
        count.fetch_add(1, Ordering::SeqCst);
        Busy { count, idle_since }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body that keeps its request counted as in flight until it
/// is finished or dropped (a streamed answer included).
struct Guarded {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: ConnLimits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    "late"
                }),
            );
        let shutdown = CancellationToken::new();
        let sandbox = SandboxSettings::default();
        tokio::spawn(serve(
            listener,
            None,
            router,
            limits,
            sandbox,
            shutdown.clone(),
        ));
        (addr, shutdown)
    }

    async fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text).await;
        text
    }

    /// Issue 30, finding 6: idle connections beyond the cap used to hold a
    /// descriptor each for ever; now a newcomer closes the longest idle.
    #[tokio::test]
    async fn idle_connections_beyond_the_cap_are_closed_oldest_first_and_requests_get_through() {
        let limits = ConnLimits {
            max_connections: 8,
            head_timeout: Duration::from_secs(3600),
        };
        let (addr, _shutdown) = start(limits).await;
        // Half a head on each: hyper alone would keep them until the
        // head's deadline.
        let mut idle = Vec::new();
        for _ in 0..50 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"G").await.unwrap();
            idle.push(s);
        }
        let answer = tokio::time::timeout(Duration::from_secs(10), get(addr))
            .await
            .expect("a real request is answered");
        assert!(answer.ends_with("hello"), "{answer}");
        // The first ones were closed (EOF), not left open.
        let mut closed = 0;
        for s in idle.iter_mut().take(40) {
            let mut buf = [0u8; 16];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await
            {
                closed += 1;
            }
        }
        assert_eq!(closed, 40, "the oldest idle connections are closed");
    }

    #[tokio::test]
    async fn a_busy_connection_is_not_evicted_and_when_all_are_busy_the_newcomer_is_refused() {
        let limits = ConnLimits {
            max_connections: 2,
            head_timeout: Duration::from_secs(3600),
        };
        let (addr, _shutdown) = start(limits).await;
        let mut busy = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            busy.push(s);
        }
        // Both are in flight once a newcomer is refused (closed at once).
        let refused = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let answer = get(addr).await;
                if answer.is_empty() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(refused.is_ok(), "a newcomer was served while all were busy");
        // The busy ones are still open.
        for s in busy.iter_mut() {
            let mut buf = [0u8; 16];
            assert!(
                tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf))
                    .await
                    .is_err(),
                "a busy connection was closed"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_not_sent_in_time_closes_the_connection() {
        let limits = ConnLimits {
            max_connections: 8,
            head_timeout: Duration::from_secs(5),
        };
        let (addr, _shutdown) = start(limits).await;
        // The clock is paused: these reads end only because a deadline
        // passes, the server's (5 s) before the test's (60 s).
        let until_closed = |mut s: TcpStream| async move {
            let mut all = Vec::new();
            tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut all))
                .await
                .expect("the connection was left open")
                .map(|_| String::from_utf8_lossy(&all).into_owned())
        };
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTT").await.unwrap();
        let text = until_closed(slow).await.unwrap_or_default();
        assert!(!text.contains("hello"), "{text}");
        // An idle keep-alive connection is closed after its answer's deadline too.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(until_closed(idle).await.unwrap().contains("hello"));
    }
}
