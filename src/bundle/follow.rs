//! Following the resources of a bundle on MCP 2026-07-28, which has no
//! `resources/subscribe`: the URIs agents follow are heard on one
//! `subscriptions/listen` stream the daemon holds open to the bundle, and
//! opened again (new stream first, then the old one ended) whenever the
//! set changes. Each `notifications/resources/updated` on it goes to the
//! agents that follow the URI, as a 2025-11-25 bundle's does.

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::{Peer, RoleClient};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::client::{Agent, Subscribers};

/// The stream that ended (the bundle ended it, or a proxy cut it) is
/// opened again for whatever agents follow then, after 1 s, 2 s, … up to a
/// minute between tries; this ends with the session (the follower gone)
/// or once a stream is open (this task is then replaced).
fn reopen(me: std::sync::Weak<Inner>) -> futures::future::BoxFuture<'static, ()> {
    // Boxed: a stream it opens runs this again when it ends.
    Box::pin(async move {
        let mut pause = std::time::Duration::from_secs(1);
        loop {
            tokio::time::sleep(pause).await;
            let Some(inner) = me.upgrade() else {
                return;
            };
            let follower = Follower(inner);
            let mut stream = follower.0.stream.lock().await;
            let wanted = follower.0.subscribers.uris();
            if wanted.is_empty() {
                *stream = None;
                return;
            }
            match follower.open(&wanted).await {
                // Replacing the ended stream aborts this task: nothing follows.
                Ok(opened) => {
                    *stream = Some(opened);
                    return;
                }
                Err(e) => {
                    tracing::info!(bundle = %follower.0.bundle, "cannot open the bundle's subscriptions/listen stream again: {e}")
                }
            }
            pause = (pause * 2).min(std::time::Duration::from_secs(60));
        }
    })
}

/// The one `subscriptions/listen` stream of a session, and the URIs it was
/// opened for.
#[derive(Clone)]
pub struct Follower(Arc<Inner>);

struct Inner {
    peer: Peer<RoleClient>,
    subscribers: Subscribers,
    bundle: String,
    stream: Mutex<Option<Stream>>,
}

/// A listen stream: the URIs the bundle acknowledged, and the task that
/// hears them (aborted, which cancels the request at the bundle, when the
/// stream is replaced or the session ends).
struct Stream {
    uris: BTreeSet<String>,
    task: JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follower {
    pub fn new(peer: Peer<RoleClient>, subscribers: Subscribers, bundle: &str) -> Self {
        Follower(Arc::new(Inner {
            peer,
            subscribers,
            bundle: bundle.to_string(),
            stream: Mutex::new(None),
        }))
    }

    /// `agent` follows `uri`: the stream is opened again with it unless it
    /// is heard already. Refused, and nothing changed, when the bundle does
    /// not acknowledge the URI or the stream cannot be opened.
    pub async fn subscribe(&self, uri: &str, agent: Arc<dyn Agent>) -> Result<(), String> {
        let mut stream = self.0.stream.lock().await;
        self.0.subscribers.add(uri, agent.clone());
        let wanted = self.0.subscribers.uris();
        if stream
            .as_ref()
            .is_some_and(|s| s.uris.contains(uri) && !s.task.is_finished())
        {
            return Ok(());
        }
        match self.open(&wanted).await {
            Ok(opened) if opened.uris.contains(uri) => {
                *stream = Some(opened);
                Ok(())
            }
            Ok(opened) => {
                self.0.subscribers.remove(uri, &agent);
                // The others' URIs the bundle still takes are heard on it.
                *stream = Some(opened);
                Err(format!(
                    "the bundle (MCP 2026-07-28) did not accept updates of {uri} on its subscriptions/listen stream"
                ))
            }
            Err(e) => {
                self.0.subscribers.remove(uri, &agent);
                Err(format!(
                    "the bundle (MCP 2026-07-28) refused subscriptions/listen for {uri}: {e}"
                ))
            }
        }
    }

    /// `agent` stops following `uri`: the stream is opened again without
    /// the URIs nobody follows any more (or ended when none is left).
    pub async fn unsubscribe(&self, uri: &str, agent: &Arc<dyn Agent>) {
        let mut stream = self.0.stream.lock().await;
        self.0.subscribers.remove(uri, agent);
        let wanted = self.0.subscribers.uris();
        let Some(current) = stream.as_ref() else {
            return;
        };
        if current.uris.is_subset(&wanted) {
            return;
        }
        if wanted.is_empty() {
            *stream = None;
            return;
        }
        match self.open(&wanted).await {
            Ok(opened) => *stream = Some(opened),
            // The old stream stays: more updates than asked for are
            // dropped here (nobody follows them), none are lost.
            Err(e) => {
                tracing::info!(bundle = %self.0.bundle, "could not narrow the bundle's subscriptions/listen stream: {e}")
            }
        }
    }

    /// Opens a stream for `uris` and starts hearing it.
    async fn open(&self, uris: &BTreeSet<String>) -> Result<Stream, String> {
        let filter = SubscriptionFilter::builder()
            .resource_subscriptions(uris.iter().cloned())
            .build();
        let mut subscription = self
            .0
            .peer
            .listen(filter)
            .await
            .map_err(|e| e.to_string())?;
        let acknowledged: BTreeSet<String> = subscription
            .acknowledged()
            .resource_subscriptions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let (subscribers, bundle) = (self.0.subscribers.clone(), self.0.bundle.clone());
        let me = Arc::downgrade(&self.0);
        let task = tokio::spawn(async move {
            loop {
                match subscription.next().await {
                    Ok(Some(ServerNotification::ResourceUpdatedNotification(n))) => {
                        subscribers.tell(&bundle, &n.params.uri)
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        tracing::info!(%bundle, end = ?subscription.end(), "the bundle's subscriptions/listen stream ended; opening it again");
                        break;
                    }
                    Err(e) => {
                        tracing::info!(%bundle, "the bundle's subscriptions/listen stream failed ({e}); opening it again");
                        break;
                    }
                }
            }
            drop(subscription);
            reopen(me).await;
        });
        Ok(Stream {
            uris: acknowledged,
            task,
        })
    }
}
