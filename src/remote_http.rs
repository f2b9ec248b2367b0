//! The network rules of remote bundles, in one place: which URLs the daemon
//! may send a request — and so a header, a token or a client secret — to,
//! and which redirects its HTTP clients follow. The manifest check of `url`
//! and `auth.authorization_server`, the OAuth client (every URL it
//! discovers) and the MCP transport all use these functions
//! (docs/security.md, "Remote bundles").

use std::sync::{Arc, Mutex};

use url::Url;

/// Why a URL fails the https-or-loopback rule. The texts complete a
/// sentence that names the URL ("`$.url` must use https ...").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("is not a valid URL: {0}")]
    Invalid(String),
    #[error("must use https (plain http is allowed only for loopback hosts such as 127.0.0.1)")]
    PlainHttp,
    #[error("uses unsupported scheme {0:?}; use https")]
    Scheme(String),
}

/// The https-or-loopback rule: `https`, or `http` to a loopback host only,
/// so nothing the daemon sends crosses a network in the clear.
pub fn check_url(value: &str) -> Result<Url, UrlRefused> {
    let u = Url::parse(value).map_err(|e| UrlRefused::Invalid(e.to_string()))?;
    match u.scheme() {
        "https" => Ok(u),
        "http" if is_loopback(&u) => Ok(u),
        "http" => Err(UrlRefused::PlainHttp),
        other => Err(UrlRefused::Scheme(other.to_string())),
    }
}

/// `127.0.0.0/8`, `::1` or `localhost`.
pub fn is_loopback(u: &Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Redirects followed in one chain at most.
pub const MAX_REDIRECTS: usize = 5;

/// A redirect the daemon would not follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedirectRefused {
    #[error(
        "{from} redirected to {to}, another origin (scheme, host or port differ); bundlevisor follows redirects only within one origin, so nothing was sent there. If the server has moved, set the bundle's url to its new address"
    )]
    CrossOrigin { from: String, to: String },
    #[error("{from} redirected more than {MAX_REDIRECTS} times (last to {to}); set the bundle's url to the server's final address")]
    TooMany { from: String, to: String },
}

/// Whether to follow a redirect to `next`; `chain` holds the URLs already
/// requested, the first being the one the caller asked for. Only
/// redirects within the first URL's origin (scheme, host and port) are
/// followed: anything else would carry the request's headers (a bundle's
/// API key, its bearer token) to a server the bundle file never named.
pub fn check_redirect(chain: &[Url], next: &Url) -> Result<(), RedirectRefused> {
    let Some(first) = chain.first() else {
        // reqwest always passes the original URL; refuse if it does not.
        return Err(RedirectRefused::CrossOrigin {
            from: "(unknown)".into(),
            to: next.to_string(),
        });
    };
    if first.origin() != next.origin() {
        return Err(RedirectRefused::CrossOrigin {
            from: first.to_string(),
            to: next.to_string(),
        });
    }
    if chain.len() > MAX_REDIRECTS {
        return Err(RedirectRefused::TooMany {
            from: first.to_string(),
            to: next.to_string(),
        });
    }
    Ok(())
}

/// A reqwest redirect policy built on [`check_redirect`] that remembers
/// what it refused: reqwest's own error only says "error following
/// redirect", and the operator needs to see where the server pointed.
#[derive(Clone, Default)]
pub struct RedirectGuard {
    refused: Arc<Mutex<Option<RedirectRefused>>>,
}

impl RedirectGuard {
    pub fn policy(&self) -> reqwest::redirect::Policy {
        let refused = self.refused.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            match check_redirect(attempt.previous(), attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => {
                    *refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                    attempt.error(e)
                }
            }
        })
    }

    /// The last redirect refused by a client built with [`Self::policy`].
    pub fn refused(&self) -> Option<RedirectRefused> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_anywhere_and_plain_http_only_to_loopback() {
        for ok in [
            "https://mcp.example.com/mcp",
            "http://127.0.0.1:8080/mcp",
            "http://127.0.0.2/x",
            "http://[::1]:9/",
            "http://localhost/",
            "http://LOCALHOST:1/",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("http://mcp.example.com/mcp", UrlRefused::PlainHttp),
            ("http://10.0.0.1/", UrlRefused::PlainHttp),
            ("http://localhost.evil.example/", UrlRefused::PlainHttp),
            ("http://127.0.0.1.nip.io/", UrlRefused::PlainHttp),
            ("ftp://127.0.0.1/", UrlRefused::Scheme("ftp".into())),
            ("file:///etc/passwd", UrlRefused::Scheme("file".into())),
        ] {
            assert_eq!(check_url(bad).unwrap_err(), why, "{bad}");
        }
        assert!(matches!(
            check_url("not a url"),
            Err(UrlRefused::Invalid(_))
        ));
    }

    fn urls(list: &[&str]) -> Vec<Url> {
        list.iter().map(|u| Url::parse(u).unwrap()).collect()
    }

    #[test]
    fn redirects_are_followed_within_the_first_urls_origin_only() {
        let chain = urls(&["http://127.0.0.1:8080/mcp"]);
        let next = |u: &str| Url::parse(u).unwrap();
        assert_eq!(
            check_redirect(&chain, &next("http://127.0.0.1:8080/mcp/")),
            Ok(())
        );
        for other in [
            "http://127.0.0.1:8081/mcp",  // port
            "http://127.0.0.2:8080/mcp",  // host
            "http://localhost:8080/mcp",  // host, same machine
            "https://127.0.0.1:8080/mcp", // scheme
            "http://evil.example:8080/mcp",
        ] {
            let refused = check_redirect(&chain, &next(other)).unwrap_err();
            let text = refused.to_string();
            assert!(
                text.contains("http://127.0.0.1:8080/mcp") && text.contains(other),
                "{text}"
            );
        }
        // A same-origin hop does not make a later hop to elsewhere acceptable.
        let chain = urls(&["https://a.example/mcp", "https://a.example/v2/mcp"]);
        assert!(check_redirect(&chain, &next("https://b.example/mcp")).is_err());
        // An https → http downgrade on the same host is another origin.
        assert!(check_redirect(&chain, &next("http://a.example/mcp")).is_err());
        let long: Vec<String> = (0..=MAX_REDIRECTS)
            .map(|i| format!("https://a.example/{i}"))
            .collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        assert!(matches!(
            check_redirect(&urls(&long), &next("https://a.example/end")),
            Err(RedirectRefused::TooMany { .. })
        ));
    }

    /// The policy on a real client: a cross-origin 307 fails the request
    /// and the other origin never sees it; a same-origin one is followed.
    #[tokio::test]
    async fn a_client_with_the_guard_never_reaches_another_origin() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_url = format!("http://{}/stolen", other.local_addr().unwrap());
        let counter = hits.clone();
        tokio::spawn(async move {
            let app = axum::Router::new().fallback(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { "stolen" }
            });
            axum::serve(other, app).await.unwrap();
        });
        let home = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let home_url = format!("http://{}", home.local_addr().unwrap());
        let to_other = other_url.clone();
        tokio::spawn(async move {
            let app = axum::Router::new()
                .route(
                    "/away",
                    axum::routing::post(move || {
                        let to = to_other.clone();
                        async move {
                            (
                                axum::http::StatusCode::TEMPORARY_REDIRECT,
                                [("location", to)],
                            )
                        }
                    }),
                )
                .route(
                    "/here",
                    axum::routing::post(|| async {
                        (
                            axum::http::StatusCode::TEMPORARY_REDIRECT,
                            [("location", "/final")],
                        )
                    }),
                )
                .route("/final", axum::routing::post(|| async { "final" }));
            axum::serve(home, app).await.unwrap();
        });

        let guard = RedirectGuard::default();
        let http = reqwest::Client::builder()
            .redirect(guard.policy())
            .no_proxy()
            .build()
            .unwrap();
        let same = http
            .post(format!("{home_url}/here"))
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        assert_eq!(same.text().await.unwrap(), "final");
        assert_eq!(guard.refused(), None);

        let err = http
            .post(format!("{home_url}/away"))
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap_err();
        assert!(err.is_redirect(), "{err:?}");
        assert_eq!(
            guard.refused(),
            Some(RedirectRefused::CrossOrigin {
                from: format!("{home_url}/away"),
                to: other_url,
            })
        );
        assert_eq!(hits.load(Ordering::SeqCst), 0);
    }
}
