//! What keeps a web page the operator visits from using the API.
//!
//! A browser sends a "simple" cross-origin request (a `POST` with a
//! `text/plain`, form or multipart body, or none) without asking first,
//! and a page can point a name it controls at 127.0.0.1 (DNS rebinding)
//! to read the answers too. So:
//!
//! - [`check_host`]: without API tokens, only requests addressed to a
//!   loopback name (`localhost`, `127.0.0.0/8`, `[::1]`, any port) are
//!   served, except `/ingest/…` (signed, and reached through proxies that
//!   pass the public `Host`) and `/healthz` and `/readyz` (probes, which
//!   show nothing). Others get 421.
//! - [`check_host`] also refuses, without API tokens and on the same
//!   paths, a request that came through a reverse proxy: one with a header
//!   a proxy adds (`Forwarded`, `Via`, `X-Forwarded-*`, `X-Real-IP` and the
//!   like) or in HTTP/1.0. nginx's default `proxy_pass` sends none of those
//!   headers but speaks HTTP/1.0 to its upstream, and passes
//!   `Host: 127.0.0.1:PORT`; without this check every client of a proxy in
//!   front of a token-less dedupd was served as a local one. Browsers and
//!   curl speak HTTP/1.1 (or 2) and add no such header.
//! - [`check_v1`], on `/v1`, tokens or not: a request whose
//!   `Origin` is not this server's own (`http` or `https` and the `Host`
//!   it was sent to; the scheme is not compared, as TLS ends in front of
//!   dedupd) or whose `Sec-Fetch-Site` says another site sent it gets 403;
//!   a body (anything but `GET` and `HEAD`) must be JSON
//!   (`application/json`, `application/*+json`, UTF-8), else 415. JSON is
//!   not a type a page may send cross-origin without a preflight, which
//!   dedupd never grants.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

use actix_web::dev::ServiceRequest;
use actix_web::http::header::{self, HeaderMap, HeaderName};
use actix_web::http::{Method, Version};

use crate::error::ApiError;

/// Set by browsers: who made the page that sent the request.
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Paths served whatever the `Host`: ingest (providers post through
/// proxies with the public name) and the probes.
fn any_host(path: &str) -> bool {
    path == "/healthz" || path == "/readyz" || path.starts_with("/ingest/")
}

/// For every request: with no API token configured (`open`), refuses a
/// request addressed to a name that is not loopback, or one that came
/// through a proxy (see the module doc). The check is by path, so a route
/// added later is covered unless listed in [`any_host`].
pub(crate) fn check_host(req: &ServiceRequest, open: bool) -> Result<(), ApiError> {
    if open && !any_host(req.path()) {
        // The proxy first: its remedy (tokens) is the one that helps, and a
        // proxy that passes the public `Host` would otherwise be told only
        // about names.
        if let Some(mark) = proxy_mark(req.headers(), req.version()) {
            return Err(ApiError::ProxiedWithoutTokens { mark });
        }
        if !addressed_to_loopback(req) {
            return Err(ApiError::HostNotAllowed);
        }
    }
    Ok(())
}

/// Headers that reverse proxies and load balancers add to say who the
/// client was (and `Via`, that a proxy passed the request on). No browser
/// or HTTP client sends one of its own accord.
const PROXY_HEADERS: [(&str, &str); 7] = [
    ("forwarded", "Forwarded"),
    ("via", "Via"),
    ("x-real-ip", "X-Real-IP"),
    ("x-client-ip", "X-Client-IP"),
    ("true-client-ip", "True-Client-IP"),
    ("cf-connecting-ip", "CF-Connecting-IP"),
    ("fastly-client-ip", "Fastly-Client-IP"),
];

/// What shows that a request came through a proxy, if anything does: a
/// header of [`PROXY_HEADERS`], any `X-Forwarded-*` (`-For`, `-Host`,
/// `-Proto`, `-Port`, …), or HTTP/1.0, which nginx speaks to its upstream
/// unless told otherwise (`proxy_http_version`) while browsers and curl
/// send HTTP/1.1.
fn proxy_mark(headers: &HeaderMap, version: Version) -> Option<&'static str> {
    // One pass over the request's few header names (not a lookup per
    // name on the list), keeping the list's order when several are there.
    let mut first = None::<usize>;
    for name in headers.keys() {
        let name = name.as_str();
        let at = match PROXY_HEADERS.iter().position(|(h, _)| *h == name) {
            Some(i) => i,
            None if name.starts_with("x-forwarded-") => PROXY_HEADERS.len(),
            None => continue,
        };
        first = Some(first.map_or(at, |f| f.min(at)));
    }
    match first {
        Some(i) => Some(
            PROXY_HEADERS
                .get(i)
                .map_or("X-Forwarded-*", |(_, shown)| shown),
        ),
        None => (version == Version::HTTP_10).then_some("HTTP/1.0"),
    }
}

/// Whether the request names only loopback: exactly one `Host`, and the
/// authority of an absolute-form target, if any, loopback too.
fn addressed_to_loopback(req: &ServiceRequest) -> bool {
    let host = only(req.headers(), &header::HOST).and_then(Authority::parse);
    let target_ok = req
        .uri()
        .authority()
        .is_none_or(|a| Authority::parse(a.as_str()).is_some_and(|a| a.is_loopback()));
    host.is_some_and(|h| h.is_loopback()) && target_ok
}

/// For `/v1`: same-origin browsers only, and JSON bodies (see the module
/// doc).
pub(crate) fn check_v1(req: &ServiceRequest) -> Result<(), ApiError> {
    let headers = req.headers();
    if let Some(site) = headers.get(SEC_FETCH_SITE) {
        // `none`: the operator typed the URL or opened a bookmark.
        if !matches!(site.to_str(), Ok("same-origin" | "none")) {
            return Err(ApiError::CrossOrigin);
        }
    }
    if headers.contains_key(header::ORIGIN) {
        let host = only(headers, &header::HOST);
        let origin = only(headers, &header::ORIGIN);
        if !matches!((origin, host), (Some(o), Some(h)) if same_origin(o, h)) {
            return Err(ApiError::CrossOrigin);
        }
    }
    if !(req.method() == Method::GET || req.method() == Method::HEAD) {
        let json = match headers.get_all(header::CONTENT_TYPE).count() {
            0 => !has_body(headers),
            1 => only(headers, &header::CONTENT_TYPE).is_some_and(is_json),
            _ => false,
        };
        if !json {
            return Err(ApiError::UnsupportedMediaType);
        }
    }
    Ok(())
}

/// The value of `name` when it appears exactly once and is visible ASCII.
pub fn only<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let mut all = headers.get_all(name);
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

/// Whether the request carries a body: a chunked one, or a length over 0.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) != Some(0))
}

/// `application/json` or `application/*+json`, with no charset but UTF-8.
fn is_json(content_type: &str) -> bool {
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim().as_bytes();
    let Some((kind, sub)) = essence.split_at_checked(b"application/".len()) else {
        return false;
    };
    let name = sub
        .len()
        .checked_sub(b"+json".len())
        .map(|n| sub.split_at(n));
    let json = kind.eq_ignore_ascii_case(b"application/")
        && (sub.eq_ignore_ascii_case(b"json")
            || name.is_some_and(|(name, suffix)| {
                suffix.eq_ignore_ascii_case(b"+json")
                    && !name.is_empty()
                    && name
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.".contains(b))
            }));
    json && parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => {
            v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        Some(_) => true,
        None => p.trim().is_empty(),
    })
}

/// Whether `origin` (`scheme://host[:port]`) is the origin of a page
/// served at `host` (a `Host` header): the same host and port, a missing
/// port being the scheme's default. Anything else, `null` included, is not.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default = if scheme.eq_ignore_ascii_case("http") {
        80
    } else if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        return false;
    };
    match (Authority::parse(rest), Authority::parse(host)) {
        (Some(o), Some(h)) => {
            o.host == h.host && o.port.unwrap_or(default) == h.port.unwrap_or(default)
        }
        _ => false,
    }
}

/// A `Host` header or an origin's authority: a host (lowercase, an IPv6
/// literal in brackets and canonical form) and perhaps a port. No
/// userinfo, path or anything else.
#[derive(Debug, PartialEq, Eq)]
struct Authority<'a> {
    host: Cow<'a, str>,
    port: Option<u16>,
}

impl<'a> Authority<'a> {
    fn parse(s: &'a str) -> Option<Self> {
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return None;
        }
        let (host, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (inner, after) = rest.split_once(']')?;
                let ip: Ipv6Addr = inner.parse().ok()?;
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':').and_then(port)?),
                };
                (Cow::Owned(format!("[{ip}]")), port)
            }
            None => {
                let (host, port) = match s.split_once(':') {
                    None => (s, None),
                    Some((h, p)) => (h, Some(port(p)?)),
                };
                if host.is_empty() || host.contains(['[', ']']) {
                    return None;
                }
                // Every request without tokens comes here: allocate only
                // for a name that is not lower case already.
                let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                    Cow::Owned(host.to_ascii_lowercase())
                } else {
                    Cow::Borrowed(host)
                };
                (host, port)
            }
        };
        Some(Self { host, port })
    }

    /// `localhost`, an address in 127.0.0.0/8, or `[::1]`. Other names
    /// (`localhost.`, `foo.localhost`, IPv4-mapped loopback) are refused:
    /// a browser addresses this server by one of these.
    fn is_loopback(&self) -> bool {
        if self.host == "localhost" {
            return true;
        }
        match self
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
        {
            Some(v6) => v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()),
            None => self
                .host
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback()),
        }
    }
}

/// A port: 1 to 5 digits, at most 65535.
fn port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_or_without_a_port_and_nothing_else() {
        for host in [
            "localhost",
            "LocalHost:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8080",
            "[0:0:0:0:0:0:0:1]:8080",
        ] {
            let a = Authority::parse(host).unwrap_or_else(|| panic!("{host} parses"));
            assert!(a.is_loopback(), "{host}");
        }
        for host in [
            "",
            "attacker.example",
            "attacker.example:8080",
            "localhost.",
            "localhost.:8080",
            "foo.localhost",
            "127.0.0.1.attacker.example",
            "127.1",
            "0x7f.0.0.1",
            "2130706433",
            "0.0.0.0",
            "[::ffff:127.0.0.1]",
            "[::1%25lo]",
            "::1",
            "[::1]x",
            "user@127.0.0.1",
            "127.0.0.1@attacker.example",
            "127.0.0.1:",
            "127.0.0.1:99999",
            "127.0.0.1:80:80",
            "127.0.0.1 ",
            "127.0.0.1/x",
            "localhost\\@attacker.example",
        ] {
            assert!(
                !Authority::parse(host).is_some_and(|a| a.is_loopback()),
                "{host:?} must not count as loopback"
            );
        }
    }

    #[test]
    fn an_origin_matches_only_the_host_it_was_sent_to() {
        let yes = [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://LOCALHOST:8080", "localhost:8080"),
            ("https://dedupd.example", "dedupd.example"),
            ("https://dedupd.example", "dedupd.example:443"),
            ("http://dedupd.example:80", "dedupd.example"),
            ("http://[::1]:8080", "[0::1]:8080"),
        ];
        for (origin, host) in yes {
            assert!(same_origin(origin, host), "{origin} vs {host}");
        }
        let no = [
            ("null", "127.0.0.1:8080"),
            ("http://evil.example", "127.0.0.1:8080"),
            ("http://127.0.0.1:8081", "127.0.0.1:8080"),
            ("http://127.0.0.1", "127.0.0.1:8080"),
            ("https://127.0.0.1", "127.0.0.1:80"),
            ("http://localhost:8080", "127.0.0.1:8080"),
            ("http://localhost.:8080", "localhost:8080"),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
            ("http://user@127.0.0.1:8080", "127.0.0.1:8080"),
            ("file://", "127.0.0.1:8080"),
            ("chrome-extension://abc", "abc"),
            ("ftp://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080", "user@127.0.0.1:8080"),
            ("http://[::1]:8080", "127.0.0.1:8080"),
        ];
        for (origin, host) in no {
            assert!(!same_origin(origin, host), "{origin} vs {host}");
        }
    }

    /// With several marks, the one named is the first of
    /// [`PROXY_HEADERS`] (then `X-Forwarded-*`, then HTTP/1.0), whatever
    /// order the headers came in.
    #[test]
    fn with_several_proxy_marks_the_first_listed_is_named_in_any_order() {
        let all: Vec<(&'static str, &'static str)> = PROXY_HEADERS
            .into_iter()
            .chain([("x-forwarded-for", "X-Forwarded-*")])
            .collect();
        for (i, (first, shown)) in all.iter().enumerate() {
            for (later, _) in &all[i + 1..] {
                for names in [[first, later], [later, first]] {
                    let mut h = HeaderMap::new();
                    for name in names {
                        h.insert(
                            HeaderName::from_static(name),
                            header::HeaderValue::from_static("192.0.2.60"),
                        );
                    }
                    for version in [Version::HTTP_10, Version::HTTP_11] {
                        assert_eq!(
                            proxy_mark(&h, version),
                            Some(*shown),
                            "{names:?} over {version:?}"
                        );
                    }
                }
            }
        }
    }

    /// Each header a proxy adds, alone, marks a request as proxied, and so
    /// does HTTP/1.0 (nginx's default to its upstream); what a browser or
    /// curl sends on this machine does not.
    #[test]
    fn each_proxy_mark_alone_is_seen_and_a_local_client_bears_none() {
        let with = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                header::HeaderValue::from_str(value).unwrap(),
            );
            h
        };
        for (name, value, shown) in [
            ("Forwarded", "for=192.0.2.60;proto=https", "Forwarded"),
            ("Via", "1.1 proxy.example", "Via"),
            ("X-Real-IP", "192.0.2.60", "X-Real-IP"),
            ("X-Client-IP", "192.0.2.60", "X-Client-IP"),
            ("True-Client-IP", "192.0.2.60", "True-Client-IP"),
            ("CF-Connecting-IP", "192.0.2.60", "CF-Connecting-IP"),
            ("Fastly-Client-IP", "192.0.2.60", "Fastly-Client-IP"),
            ("X-Forwarded-For", "192.0.2.60", "X-Forwarded-*"),
            ("x-forwarded-host", "dedupd.example", "X-Forwarded-*"),
            ("X-Forwarded-Proto", "https", "X-Forwarded-*"),
            ("X-Forwarded-Port", "443", "X-Forwarded-*"),
            // An empty value is still the proxy's header.
            ("X-Forwarded-For", "", "X-Forwarded-*"),
        ] {
            for version in [Version::HTTP_11, Version::HTTP_2] {
                assert_eq!(
                    proxy_mark(&with(name, value), version),
                    Some(shown),
                    "{name}: {value:?} over {version:?}"
                );
            }
        }
        assert_eq!(
            proxy_mark(&HeaderMap::new(), Version::HTTP_10),
            Some("HTTP/1.0")
        );
        let browser = [
            ("user-agent", "Mozilla/5.0"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
            ("referer", "http://127.0.0.1:8080/ui"),
            ("x-forwarded", "not a forwarding header"),
            ("x-requested-with", "XMLHttpRequest"),
        ];
        let mut h = HeaderMap::new();
        for (k, v) in browser {
            h.insert(
                HeaderName::from_static(k),
                header::HeaderValue::from_static(v),
            );
        }
        for version in [Version::HTTP_11, Version::HTTP_2] {
            assert_eq!(proxy_mark(&h, version), None, "{version:?}");
            assert_eq!(proxy_mark(&HeaderMap::new(), version), None);
        }
    }

    #[test]
    fn only_json_media_types_in_utf_8() {
        for ct in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
            "application/merge-patch+json",
            "application/problem+json; charset=utf-8",
        ] {
            assert!(is_json(ct), "{ct}");
        }
        for ct in [
            "",
            "text/plain",
            "text/plain; charset=utf-8",
            "text/json",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
            "application/+json",
            "application/json; charset=utf-16",
            "application/jsonx",
            "application/json-seq",
            "application/json garbage",
            "text/plain; x=application/json",
        ] {
            assert!(!is_json(ct), "{ct}");
        }
    }
}
