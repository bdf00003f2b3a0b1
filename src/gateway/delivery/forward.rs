//! Forwarding one event to the application over HTTP: the original body,
//! signed with the Standard Webhooks scheme under each destination secret.
//!
//! One client serves every source. It keeps connections alive and reuses
//! them (a pool per destination host), so a busy destination is not paying
//! a TCP (and TLS) handshake per event.

use std::time::Duration;

use crate::clock::Millis;
use crate::gateway::Source;
use crate::gateway::signature::signature_header;
use crate::store::inbox::InboxEvent;
use crate::telemetry::traces;

/// What an id that is not plain ASCII has percent-encoded in its
/// `webhook-id`: every byte past ASCII, controls, spaces and `%`.
const ENCODED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'%');

/// The forward's `webhook-id` (and what its signature covers) for the
/// event `id`: the id itself when it is printable ASCII without a space at
/// either end, else its UTF-8 percent-encoded ([`ENCODED`]). Sent as it
/// is, `commande_é1` went out as raw bytes most receivers cannot read
/// (their frameworks refuse the header, or read it as Latin-1 and the
/// signature fails), so every attempt failed until the event was dead; a
/// space at either end is trimmed by the receiver's parser, and the
/// signature fails too. Unambiguous but for a plain id that spells another
/// one's encoding (`a%C3%A9` beside `aé`, in one source).
pub fn webhook_id(id: &str) -> std::borrow::Cow<'_, str> {
    let plain = id.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
        && !id.starts_with(' ')
        && !id.ends_with(' ');
    if plain {
        std::borrow::Cow::Borrowed(id)
    } else {
        percent_encoding::utf8_percent_encode(id, ENCODED).into()
    }
}

/// Idle connections are closed after this long.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Most answer bytes read to keep a connection reusable.
const DRAIN_LIMIT: usize = 64 * 1024;

/// The HTTP side of delivery.
#[derive(Debug, Clone)]
pub struct Forwarder {
    /// Shared client: its connection pool is what makes keep-alive work.
    client: reqwest::Client,
}

impl Forwarder {
    /// A forwarder keeping up to `idle_per_host` idle connections to each
    /// destination host.
    pub fn new(idle_per_host: usize) -> reqwest::Result<Self> {
        let client = crate::http_client::builder()
            // A redirect is a failed delivery, never followed.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("dedupd/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(idle_per_host)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self { client })
    }

    /// POSTs the event to the source's destination as attempt `attempt`,
    /// signed at `now_s` (Unix seconds). Ok (with the status) only for a
    /// 2xx; the error says what failed, without the URL (it may hold
    /// credentials).
    pub async fn post(
        &self,
        source: &Source,
        ev: &InboxEvent,
        attempt: u32,
        now_s: i64,
    ) -> Result<u16, Failed> {
        let id = webhook_id(&ev.event_id);
        let signature = signature_header(&source.destination_keys, &id, now_s, &ev.body);
        let mut req = self
            .client
            .post(source.forward_to.clone())
            .timeout(source.forward_timeout)
            .body(ev.body.clone());
        // With traces on, the attempt's own context replaces any the
        // provider's request carried (and was kept with the event).
        let propagated = traces::propagation();
        for (name, value) in &ev.headers {
            let ours = propagated.is_some()
                && (name.eq_ignore_ascii_case("traceparent")
                    || name.eq_ignore_ascii_case("tracestate"));
            if traces::is_internal(name) || ours {
                continue;
            }
            req = req.header(name.as_str(), value.as_str());
        }
        if let Some(traceparent) = propagated
            && let Ok(value) = reqwest::header::HeaderValue::from_str(traceparent.as_str())
        {
            // A name of its own, not parsed again for every forward.
            const TRACEPARENT: reqwest::header::HeaderName =
                reqwest::header::HeaderName::from_static("traceparent");
            req = req.header(TRACEPARENT, value);
        }
        if let Some(replay) = &ev.replay {
            req = req.header("dedupd-replay", replay.job.as_str());
        }
        let res = req
            .header("webhook-id", id.as_ref())
            .header("webhook-timestamp", now_s.to_string())
            .header("webhook-signature", signature)
            .header("dedupd-attempt", attempt.to_string())
            .header(
                "dedupd-source",
                source.lane_of.as_deref().unwrap_or(source.name.as_str()),
            )
            .header("dedupd-destination", source.destination.as_str())
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => {
                let status = r.status().as_u16();
                drain(r).await;
                Ok(status)
            }
            Ok(r) if r.status().is_redirection() => Err(Failed {
                error: format!(
                    "HTTP {} (redirects count as failures and are not followed)",
                    r.status()
                ),
                status: Some(r.status().as_u16()),
                retry_after: None,
            }),
            Ok(r) => {
                let status = r.status();
                let retry_after = matches!(status.as_u16(), 429 | 503)
                    .then(|| r.headers().get(reqwest::header::RETRY_AFTER))
                    .flatten()
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after_ms(v, now_s));
                let error = match retry_after {
                    Some(ms) => format!("HTTP {status}, Retry-After {} s", ms / 1000),
                    None => format!("HTTP {status}"),
                };
                Err(Failed {
                    error,
                    status: Some(status.as_u16()),
                    retry_after,
                })
            }
            Err(e) if e.is_timeout() => Err(Failed::new(format!(
                "no answer within {:?}",
                source.forward_timeout
            ))),
            Err(e) => Err(Failed::new(format!(
                "request failed: {}",
                error_chain(&e.without_url())
            ))),
        }
    }
}

/// A failed attempt: what failed, the status the destination answered
/// (none when it did not answer), and how long it asked to be left alone
/// (a 429 or 503 with `Retry-After`), ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub error: String,
    pub status: Option<u16>,
    pub retry_after: Option<Millis>,
}

impl Failed {
    /// No answer came.
    fn new(error: String) -> Self {
        Self {
            error,
            status: None,
            retry_after: None,
        }
    }
}

/// A `Retry-After` value (RFC 9110: delay-seconds, or an HTTP-date) as ms
/// from `now_s`; `None` when it is neither. A date in the past is 0.
pub fn retry_after_ms(value: &str, now_s: i64) -> Option<Millis> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(secs.saturating_mul(1000));
    }
    let at = time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822)
        .ok()?
        .unix_timestamp();
    Some(
        u64::try_from(at.saturating_sub(now_s))
            .unwrap_or(0)
            .saturating_mul(1000),
    )
}

/// Reads what is left of a small answer so its connection goes back to the
/// pool; a large one is dropped (closing its connection) rather than read.
async fn drain(mut r: reqwest::Response) {
    let mut read = 0usize;
    while let Ok(Some(chunk)) = r.chunk().await {
        read += chunk.len();
        if read > DRAIN_LIMIT {
            return;
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        // 2015-10-21T07:28:00Z
        let now = 1_445_412_480;
        assert_eq!(retry_after_ms("120", now), Some(120_000));
        assert_eq!(retry_after_ms(" 0 ", now), Some(0));
        assert_eq!(
            retry_after_ms("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(120_000)
        );
        assert_eq!(
            retry_after_ms("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(0)
        );
        for bad in ["", "-5", "soon", "1.5", "Wed, 21 Oct 2015"] {
            assert_eq!(retry_after_ms(bad, now), None, "{bad:?}");
        }
    }
}
