//! Talking to a running server: where it is and which token to send (flags,
//! then `DEDUPD_URL` / `DEDUPD_TOKEN`, then the config file), and errors
//! that say what to do when it cannot be reached or refuses the token.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use dedupd::config::{CONFIG_ENV, Loaded, Settings};
use reqwest::{StatusCode, Url};
use serde_json::Value;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read (128 MiB): an event's page with the largest
/// body a source may take, each byte escaped in its JSON as six, and its
/// headers and attempts.
const MAX_ANSWER: usize = 6 * dedupd::gateway::source::MAX_BODY_LIMIT + (32 << 20);

/// Where the server is and how to authenticate, as given on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// TOML settings file; the server's address and API token are read
    /// from it unless --url and --token are given [default: none, or $DEDUPD_CONFIG].
    #[arg(long, env = CONFIG_ENV)]
    pub config: Option<PathBuf>,
    /// The server's base URL, such as http://127.0.0.1:8080 [default: the
    /// config's `listen` address].
    #[arg(long, env = "DEDUPD_URL")]
    pub url: Option<String>,
    /// Bearer token for /v1 [default: the config's first API token].
    #[arg(long, env = "DEDUPD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl ServerArgs {
    /// Whether the config must be read: for the address or the token.
    pub fn needs_config(&self) -> bool {
        self.url.is_none() || self.token.is_none()
    }

    /// Loads the settings (defaults and `DEDUPD_*` when no file is named).
    pub fn load(&self) -> anyhow::Result<Loaded> {
        Settings::load_for_operator(self.config.as_deref()).map_err(|e| {
            anyhow!(
                "{e}\n(the server's address and token come from this configuration; \
                 or give them with --url and --token)"
            )
        })
    }

    /// The client for the server these arguments name; `loaded` supplies
    /// what the flags and environment leave out.
    pub fn client(&self, loaded: Option<&Loaded>) -> anyhow::Result<Client> {
        let base = match (&self.url, loaded) {
            (Some(url), _) => Url::parse(url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
                .ok_or_else(|| {
                    anyhow!(
                        "--url {:?} is not an http:// or https:// URL",
                        dedupd::redact::url_str(url)
                    )
                })?,
            (None, Some(l)) => listen_url(l.settings.listen)?,
            (None, None) => listen_url(Settings::default().listen)?,
        };
        let token = self.token.clone().or_else(|| {
            loaded
                .and_then(|l| l.api_tokens.first())
                .map(|t| t.expose().to_owned())
        });
        // Refused as sent, it read as a server that cannot be reached.
        if let Some(t) = &token
            && reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).is_err()
        {
            bail!(
                "the API token (--token, DEDUPD_TOKEN or the config's api.tokens) has a \
                 character an HTTP header cannot carry (a line break, say): nothing was sent"
            );
        }
        let http = dedupd::http_client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("dedupd-cli/", env!("CARGO_PKG_VERSION")))
            .timeout(TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        Ok(Client { base, token, http })
    }
}

/// The URL a client uses to reach a server listening on `listen`: a
/// wildcard address is reached over loopback.
fn listen_url(listen: SocketAddr) -> anyhow::Result<Url> {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let addr = SocketAddr::new(ip, listen.port());
    Url::parse(&format!("http://{addr}")).with_context(|| format!("no URL for {addr}"))
}

/// A server's answer that was not a success.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    /// The problem document's `detail` (or the raw body).
    pub detail: String,
    /// The problem document's `code`, if any.
    pub code: Option<String>,
    /// The body as sent.
    pub body: String,
}

impl std::fmt::Display for Refusal {
    // The detail and code are the server's, whoever it is: escaped, so an
    // ANSI sequence in them cannot reach the terminal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use dedupd::redact::escape_control;
        write!(f, "{}: {}", self.status, escape_control(&self.detail))?;
        if let Some(code) = &self.code {
            write!(f, " ({})", escape_control(code))?;
        }
        Ok(())
    }
}

impl std::error::Error for Refusal {}

/// An answer past [`MAX_ANSWER`], from the server named.
#[derive(Debug)]
pub struct TooLarge(String);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dedupd at {} answered more than {} MiB: no answer of dedupd's is that large \
             (is --url the dedupd server?)",
            self.0,
            MAX_ANSWER >> 20
        )
    }
}

impl std::error::Error for TooLarge {}

/// One server, one token.
#[derive(Debug, Clone)]
pub struct Client {
    /// Base URL; paths are appended to it.
    base: Url,
    /// Sent as `Authorization: Bearer` on `/v1` requests.
    token: Option<String>,
    /// Keeps one connection for a command's requests.
    http: reqwest::Client,
}

impl Client {
    /// The URL of `segments` (each percent-encoded) under the base URL.
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// As [`Client::url`], with `query` pairs (percent-encoded).
    pub fn url_with(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.url(segments);
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        url
    }

    /// The server's URL as errors name it: without userinfo or query.
    fn shown(&self) -> String {
        dedupd::redact::url(&self.base)
            .trim_end_matches('/')
            .to_owned()
    }

    /// A request without the token: for `/ingest`, which needs none. The
    /// API token is for `/v1` and must not go anywhere else (`--url` may
    /// name any server).
    pub fn anonymous(&self, method: reqwest::Method, url: Url) -> reqwest::RequestBuilder {
        self.http.request(method, url)
    }

    /// A request with the token, if any.
    pub fn request(&self, method: reqwest::Method, url: Url) -> reqwest::RequestBuilder {
        let req = self.http.request(method, url);
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends `req`; a connection failure becomes an error that names the
    /// server and says what to check.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        req.send().await.map_err(|e| {
            let why = if e.is_timeout() {
                format!("no answer within {}s", TIMEOUT.as_secs())
            } else {
                root_cause(&e.without_url())
            };
            anyhow!(
                "cannot reach dedupd at {}: {why}\nIs `dedupd serve` running there? \
                 Point at it with --url or DEDUPD_URL (or the config's `listen`).",
                self.shown()
            )
        })
    }

    /// Sends a `/v1` request and reads its JSON answer; a refusal becomes
    /// a [`Refusal`], a refused token an error that says which token was
    /// sent and where to set another.
    pub async fn json(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let res = self.send(req).await?;
        let status = res.status();
        let body = self.body(res).await?;
        self.refused(status, &body)?;
        serde_json::from_str(&body).with_context(|| {
            format!(
                "dedupd at {} answered {status} with a body that is not JSON",
                self.shown()
            )
        })
    }

    /// An answer's body as text, read up to [`MAX_ANSWER`]: `--url` may
    /// name any server, and one that sends without end would otherwise
    /// fill the operator's memory within the timeout.
    pub async fn body(&self, mut res: reqwest::Response) -> anyhow::Result<String> {
        let too_big = || anyhow::Error::new(TooLarge(self.shown()));
        if res.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(too_big());
        }
        let mut got = Vec::new();
        while let Some(chunk) = res
            .chunk()
            .await
            // reqwest's message names the URL, userinfo and query included.
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("reading the answer of {}", self.shown()))?
        {
            if got.len() + chunk.len() > MAX_ANSWER {
                return Err(too_big());
            }
            got.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&got).into_owned())
    }

    /// Sends a `/v1` request whose answer is not JSON (a backup's bytes):
    /// the answer, once its status is a success; a refusal as
    /// [`Client::json`] makes it. `within` bounds the whole exchange
    /// instead of the usual 10 s.
    pub async fn stream(
        &self,
        req: reqwest::RequestBuilder,
        within: Duration,
    ) -> anyhow::Result<reqwest::Response> {
        let res = self.send(req.timeout(within)).await?;
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let body = self.body(res).await?;
        self.refused(status, &body)?;
        bail!("dedupd at {} answered {status}", self.shown())
    }

    /// The error for an answer of `status` with `body` that is not a
    /// success; `Ok` for a success.
    fn refused(&self, status: StatusCode, body: &str) -> anyhow::Result<()> {
        if status == StatusCode::UNAUTHORIZED {
            match &self.token {
                None => bail!(
                    "dedupd at {} requires an API token and none was given: pass --token, \
                     set DEDUPD_TOKEN, or point --config at its configuration (api.tokens)",
                    self.shown()
                ),
                Some(_) => bail!(
                    "dedupd at {} refused the API token (401 Unauthorized): pass one of its \
                     api.tokens with --token or DEDUPD_TOKEN",
                    self.shown()
                ),
            }
        }
        if status.is_redirection() {
            bail!(
                "dedupd at {} answered {status}, a redirect, which is not followed (the API \
                 token would go with it): is --url the dedupd server, with http:// or https:// \
                 as it serves?",
                self.shown()
            );
        }
        if !status.is_success() {
            let problem: Option<Value> = serde_json::from_str(body).ok();
            let field = |k: &str| {
                problem
                    .as_ref()
                    .and_then(|p| p[k].as_str())
                    .map(str::to_owned)
            };
            return Err(Refusal {
                status,
                detail: field("detail").unwrap_or_else(|| body.trim().to_owned()),
                code: field("code"),
                body: body.to_owned(),
            }
            .into());
        }
        Ok(())
    }
}

/// The innermost cause of an error (reqwest's outer layers say only
/// "error sending request"), such as "Connection refused (os error 111)".
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listen_address_is_reached_over_loopback() {
        let url = |listen: &str| listen_url(listen.parse().expect("addr")).map(String::from);
        assert_eq!(
            url("0.0.0.0:8080").ok().as_deref(),
            Some("http://127.0.0.1:8080/")
        );
        assert_eq!(url("[::]:9000").ok().as_deref(), Some("http://[::1]:9000/"));
        assert_eq!(url("10.0.0.5:80").ok().as_deref(), Some("http://10.0.0.5/"));
    }

    /// A token a header cannot carry is refused before anything is sent,
    /// saying so (it read as "cannot reach dedupd").
    #[test]
    fn a_token_with_a_line_break_is_refused_saying_so() {
        let args = ServerArgs {
            config: None,
            url: Some("http://127.0.0.1:8080".into()),
            token: Some("t0ken\nx".into()),
        };
        let e = args.client(None).expect_err("refused");
        assert!(e.to_string().contains("cannot carry"), "{e}");
        assert!(!e.to_string().contains("t0ken"), "{e}");
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        let args = ServerArgs {
            config: None,
            url: Some("http://127.0.0.1:8080/base/".into()),
            token: None,
        };
        let client = args.client(None).expect("client");
        assert_eq!(
            client.url(&["v1", "claims", "run/7 a?"]).as_str(),
            "http://127.0.0.1:8080/base/v1/claims/run%2F7%20a%3F"
        );
    }
}
