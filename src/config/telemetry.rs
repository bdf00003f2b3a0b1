//! `[telemetry.traces]`: OpenTelemetry traces over OTLP/HTTP (protobuf),
//! off unless an endpoint is set here or in the standard
//! `OTEL_EXPORTER_OTLP_*` environment variables.

use std::env::VarError;

use serde::{Deserialize, Serialize};

/// The standard variables that name the collector; either one turns
/// export on, and it overrides `otlp_endpoint`. The first is the traces'
/// URL as is, the second a base URL `/v1/traces` is added to; the first
/// wins.
pub const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];
/// The standard variable that overrides `service_name`.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
/// The standard variable that turns every signal off (`true`).
pub const DISABLED_ENV: &str = "OTEL_SDK_DISABLED";
/// The standard variable that picks the traces' exporter: `otlp`, or
/// `none` (off).
pub const EXPORTER_ENV: &str = "OTEL_TRACES_EXPORTER";
/// The standard variables that pick the protocol (the traces' own first):
/// dedupd speaks `http/protobuf` only.
pub const PROTOCOL_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
/// The standard variables that compress the exports (the traces' own
/// first; the exporter reads them): `gzip` or `none`.
pub const COMPRESSION_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
];
/// The standard variables that cut an export off (the traces' own first;
/// the exporter reads them): whole milliseconds.
pub const TIMEOUT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];
/// The standard variables of headers sent with every export (the traces'
/// own first; the exporter reads them): `key=value` pairs, comma
/// separated, the values percent-encoded.
pub const HEADERS_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
];
/// The standard variables of the collector's CA and a client certificate:
/// not supported.
pub const TLS_ENV: [&str; 6] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];
/// The standard variables that override `sample_ratio`: a sampler and its
/// argument.
pub const SAMPLER_ENV: &str = "OTEL_TRACES_SAMPLER";
pub const SAMPLER_ARG_ENV: &str = "OTEL_TRACES_SAMPLER_ARG";

/// The standard variable of attributes added to every span's resource
/// (the SDK reads it; `service.name` and `process.pid` stay dedupd's).
pub const RESOURCE_ENV: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The standard variables set (not empty) in `env` that change what
/// `[telemetry.traces]` says, by name (their values may hold credentials).
pub fn standard_variables_set(env: impl Fn(&str) -> Result<String, VarError>) -> Vec<&'static str> {
    ENDPOINT_ENV
        .iter()
        .chain(&[SERVICE_NAME_ENV, DISABLED_ENV, EXPORTER_ENV])
        .chain(&[SAMPLER_ENV, SAMPLER_ARG_ENV, RESOURCE_ENV])
        .chain(PROTOCOL_ENV.iter().chain(&COMPRESSION_ENV))
        .chain(TIMEOUT_ENV.iter().chain(&HEADERS_ENV))
        .copied()
        .filter(|name| env(name).is_ok_and(|v| !v.trim().is_empty()))
        .collect()
}

/// What dedupd tells about itself besides logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    pub traces: TraceSettings,
}

/// Trace export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSettings {
    /// The collector's OTLP/HTTP base URL, such as
    /// `http://127.0.0.1:4318` (spans are posted to `/v1/traces` under it);
    /// absent: no traces, and no span is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of every span.
    pub service_name: String,
    /// The share of new traces kept, 0.0 to 1.0. A forward continues its
    /// event's trace whatever this says (the decision was the ingest's).
    pub sample_ratio: f64,
    /// Most finished spans waiting for the exporter; more are dropped and
    /// counted (`dedupd_trace_spans_dropped_total`), never waited for.
    pub queue: usize,
}

impl Default for TraceSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "dedupd".into(),
            sample_ratio: 1.0,
            queue: 4096,
        }
    }
}

/// Why no span is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Off {
    /// `OTEL_SDK_DISABLED=true`.
    Disabled,
    /// `OTEL_TRACES_EXPORTER=none`.
    ExporterNone,
    /// No endpoint in the settings or the variables.
    NoCollector,
}

impl std::fmt::Display for Off {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Off::Disabled => write!(f, "{DISABLED_ENV}=true"),
            Off::ExporterNone => write!(f, "{EXPORTER_ENV}=none"),
            Off::NoCollector => write!(
                f,
                "no collector set (telemetry.traces.otlp_endpoint, {} or {})",
                ENDPOINT_ENV[1], ENDPOINT_ENV[0]
            ),
        }
    }
}

/// Where the spans go, as settings and environment decided.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceExport {
    /// The traces' URL: an `OTEL_EXPORTER_OTLP_*` variable's, or the
    /// settings' endpoint's, with `/v1/traces`.
    pub endpoint: String,
    pub service_name: String,
    pub sample_ratio: f64,
    pub queue: usize,
    /// `OTEL_RESOURCE_ATTRIBUTES`'s pairs, values percent-decoded, in
    /// order (a key set twice: the last wins, as in the resource).
    pub resource: Vec<(String, String)>,
}

impl TraceSettings {
    /// Whether and where spans are exported, with `env` the process's
    /// environment (`std::env::var`): off when no endpoint is set
    /// anywhere, or when `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`. A standard variable dedupd cannot
    /// follow is an error naming it (never quoting it: an endpoint or a
    /// header may hold credentials), not a setting silently ignored; those
    /// the exporter reads itself (headers, compression, timeout) are
    /// checked as it reads them.
    pub fn export(
        &self,
        env: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Option<TraceExport>, String> {
        self.decide(env).map(Result::ok)
    }

    /// As [`Self::export`], saying why traces are off when they are.
    pub fn decide(
        &self,
        env: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Result<TraceExport, Off>, String> {
        // As set: none when absent or empty (as the exporter reads).
        let raw = |name: &str| match env(name) {
            Ok(v) if v.is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(VarError::NotPresent) => Ok(None),
            Err(VarError::NotUnicode(_)) => Err(format!("{name} is not UTF-8")),
        };
        // What dedupd reads itself: trimmed, and none when blank.
        let set = |name: &str| {
            raw(name).map(|v| v.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()))
        };
        if set(DISABLED_ENV)?.is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(Err(Off::Disabled));
        }
        if let Some(exporter) = set(EXPORTER_ENV)? {
            match exporter.to_ascii_lowercase().as_str() {
                "none" => return Ok(Err(Off::ExporterNone)),
                "otlp" => {}
                _ => {
                    return Err(format!(
                        "{EXPORTER_ENV} must be otlp or none: dedupd exports traces over OTLP only"
                    ));
                }
            }
        }
        // Resolved here and given to the exporter, so the URL checked is
        // the one posted to.
        let endpoint = match (set(ENDPOINT_ENV[0])?, set(ENDPOINT_ENV[1])?) {
            // Posted to as written: it must parse as it is.
            (Some(url), _) => match usable_url(&url).and_then(|_| parses(&url)) {
                Ok(()) => url,
                Err(bad) => return Err(format!("{} {bad}", ENDPOINT_ENV[0])),
            },
            (None, Some(base)) => {
                traces_url(&base).map_err(|bad| format!("{} {bad}", ENDPOINT_ENV[1]))?
            }
            // Checked when the settings were loaded.
            (None, None) => match &self.otlp_endpoint {
                Some(base) => traces_url(base)
                    .map_err(|bad| format!("telemetry.traces.otlp_endpoint {bad}"))?,
                None => return Ok(Err(Off::NoCollector)),
            },
        };
        for name in PROTOCOL_ENV {
            if let Some(protocol) = set(name)? {
                if !protocol.eq_ignore_ascii_case("http/protobuf") {
                    return Err(format!(
                        "{name} must be http/protobuf: dedupd sends OTLP over HTTP in protobuf \
                         only (not grpc, not http/json)"
                    ));
                }
                break;
            }
        }
        for name in TLS_ENV {
            if set(name)?.is_some() {
                return Err(format!(
                    "{name} is not supported: dedupd checks the collector's certificate against \
                     the system's trust store (add a private CA there, with \
                     update-ca-certificates) and sends no client certificate"
                ));
            }
        }
        // The exporter takes the first it can read, as it is written.
        for name in COMPRESSION_ENV {
            if let Some(compression) = raw(name)? {
                if !["gzip", "none"].contains(&compression.to_ascii_lowercase().as_str()) {
                    return Err(format!("{name} must be gzip or none"));
                }
                break;
            }
        }
        for name in TIMEOUT_ENV {
            if let Some(ms) = raw(name)? {
                if !ms.parse::<u64>().is_ok_and(|ms| ms > 0) {
                    return Err(format!(
                        "{name} must be a whole number of milliseconds, more than 0"
                    ));
                }
                break;
            }
        }
        check_headers(&env)?;
        let sample_ratio = match set(SAMPLER_ENV)? {
            None => self.sample_ratio,
            Some(sampler) => sampler_ratio(&sampler, set(SAMPLER_ARG_ENV)?.as_deref())?,
        };
        let service_name = match set(SERVICE_NAME_ENV)? {
            None => self.service_name.clone(),
            Some(name) if service_name_ok(&name) => name,
            Some(_) => return Err(format!("{SERVICE_NAME_ENV} {SERVICE_NAME_RULE}")),
        };
        let resource = match raw(RESOURCE_ENV)? {
            Some(text) => resource_attributes(&text)?,
            None => Vec::new(),
        };
        Ok(Ok(TraceExport {
            endpoint,
            service_name,
            sample_ratio,
            queue: self.queue,
            resource,
        }))
    }

    /// What is wrong with these settings, by key.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut bad = Vec::new();
        if let Some(endpoint) = &self.otlp_endpoint
            && let Err(why) = traces_url(endpoint)
        {
            // Not quoted: it may hold credentials.
            bad.push(("telemetry.traces.otlp_endpoint", why.to_string()));
        }
        if !service_name_ok(&self.service_name) {
            bad.push((
                "telemetry.traces.service_name",
                SERVICE_NAME_RULE.to_owned(),
            ));
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            bad.push((
                "telemetry.traces.sample_ratio",
                "must be 0.0 to 1.0 (the share of new traces kept)".to_owned(),
            ));
        }
        // A span waiting takes about a kilobyte: the bound keeps a hung
        // collector's cost in memory near 100 MB at most.
        if !(64..=100_000).contains(&self.queue) {
            bad.push(("telemetry.traces.queue", "must be 64 to 100000".to_owned()));
        }
        bad
    }
}

/// Why the exporter cannot post to a collector's endpoint: said after the
/// variable's or the setting's name, and never quoting the URL (it may
/// hold credentials, in its user name, password or query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadEndpoint {
    /// Not a URL, or not an http:// or https:// one with a host.
    NotHttp,
    /// A user name or password, which the exporter would drop.
    Credentials,
    /// Port 0: no collector listens there, so every export would fail.
    PortZero,
    /// Longer than the exporter's URI parser takes ([`LONGEST_URI`]).
    TooLong,
    /// Refused by the exporter's URI parser for another reason.
    Unparsable,
}

impl std::fmt::Display for BadEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadEndpoint::NotHttp => f.write_str(
                "must be an http:// or https:// URL with a host, such as http://127.0.0.1:4318",
            ),
            BadEndpoint::Credentials => f.write_str(
                "must not hold a user name or password (the exporter does not send them): put \
                 an Authorization header in OTEL_EXPORTER_OTLP_HEADERS",
            ),
            BadEndpoint::PortZero => f.write_str(
                "must not name port 0: no collector listens there, and every span would be \
                 dropped (name the collector's port: OTLP/HTTP's is 4318)",
            ),
            BadEndpoint::TooLong => write!(
                f,
                "is too long: the exporter takes a URL of at most {LONGEST_URI} bytes, as it \
                 posts to it (written out in ASCII, its path ending in /v1/traces)"
            ),
            BadEndpoint::Unparsable => f.write_str(
                "is not a URL the exporter can parse as it posts to it: write it out in ASCII \
                 (a host name in punycode, anything else percent-encoded)",
            ),
        }
    }
}

/// The longest URI the exporter's parser (the `http` crate's) takes, in
/// bytes.
const LONGEST_URI: usize = u16::MAX as usize - 1;

/// What a service name must be.
const SERVICE_NAME_RULE: &str =
    "must be 1 to 255 characters, without control characters or line breaks";

fn service_name_ok(name: &str) -> bool {
    let name = name.trim();
    let breaks = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
    !name.is_empty() && name.len() <= 255 && !name.chars().any(breaks)
}

/// `url` parsed, when the exporter can post to it: http or https, a
/// host, no userinfo (which it would drop), a port other than 0, and a
/// URI it can parse.
fn usable_url(url: &str) -> Result<reqwest::Url, BadEndpoint> {
    let url = reqwest::Url::parse(url.trim()).map_err(|_| BadEndpoint::NotHttp)?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(BadEndpoint::NotHttp);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BadEndpoint::Credentials);
    }
    if url.port() == Some(0) {
        return Err(BadEndpoint::PortZero);
    }
    parses(url.as_str())?;
    Ok(url)
}

/// Whether the exporter's URI parser takes `text`.
fn parses(text: &str) -> Result<(), BadEndpoint> {
    if text.len() > LONGEST_URI {
        return Err(BadEndpoint::TooLong);
    }
    text.parse::<actix_web::http::Uri>()
        .map(drop)
        .map_err(|_| BadEndpoint::Unparsable)
}

/// The OTLP/HTTP traces URL under a collector's base URL (as the
/// `OTEL_EXPORTER_OTLP_ENDPOINT` rule says: `/v1/traces` added to its
/// path, its query kept); a URL whose path already ends so stays. Written
/// out in ASCII (punycode, percent-encoding), as the exporter parses it.
fn traces_url(base: &str) -> Result<String, BadEndpoint> {
    let mut url = usable_url(base)?;
    let path = url.path().trim_end_matches('/').to_owned();
    if !path.ends_with("/v1/traces") {
        url.set_path(&format!("{path}/v1/traces"));
    }
    let text = url.to_string();
    parses(&text)?;
    Ok(text)
}

/// Checks the headers variable the exporter will read: the first set,
/// even empty, as it does (the traces' own then hides the general one).
/// It sends each `key=value` pair, comma separated, trimmed and with the
/// value percent-decoded, and drops without a word one it cannot send:
/// the collector would then refuse every export for want of its key.
fn check_headers(env: &impl Fn(&str) -> Result<String, VarError>) -> Result<(), String> {
    use reqwest::header::{HeaderName, HeaderValue};
    let [traces, general] = HEADERS_ENV;
    let (name, headers) = match env(traces) {
        Ok(v) => (traces, v),
        Err(VarError::NotUnicode(_)) => return Err(format!("{traces} is not UTF-8")),
        Err(VarError::NotPresent) => match env(general) {
            Ok(v) => (general, v),
            Err(VarError::NotUnicode(_)) => return Err(format!("{general} is not UTF-8")),
            Err(VarError::NotPresent) => return Ok(()),
        },
    };
    if name == traces && headers.trim().is_empty() && env(general).is_ok_and(|v| !v.is_empty()) {
        return Err(format!(
            "{traces} is set but empty: the exporter would send no header at all, not \
             {general}'s (unset it)"
        ));
    }
    // A blank pair (`a=1,,b=2`) is no header: skipped, as it is there.
    let mut seen: Vec<HeaderName> = Vec::new();
    for pair in headers.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |why: &str| {
            Err(format!(
                "{name} must be key=value pairs separated by commas, each key a header name and \
                 each value, once percent-decoded, not empty and without control characters: \
                 {why}"
            ))
        };
        let Some((key, value)) = pair.split_once('=') else {
            return bad("a pair has no `=`");
        };
        let Ok(key) = HeaderName::from_bytes(key.trim().as_bytes()) else {
            return bad("a key is not a header name");
        };
        // The exporter sends a value it cannot decode as written (`100%`).
        let value = percent_decoded(value.trim()).unwrap_or_else(|| value.to_owned());
        // Blank once decoded (`%20`): the receiver trims it to nothing.
        if value.trim().is_empty() || HeaderValue::from_str(&value).is_err() {
            return bad(&format!("{key}'s value is empty or has control characters"));
        }
        if FRAMING.contains(&key.as_str()) {
            return Err(format!(
                "{name} sets {key}, which says how the export's request is framed or \
                 carried (the exporter sets it, or must not): the collector would misread \
                 every export"
            ));
        }
        // The exporter keeps the last of two: one would be dropped unseen.
        if seen.contains(&key) {
            return Err(format!("{name} sets {key} twice"));
        }
        seen.push(key);
    }
    Ok(())
}

/// `OTEL_RESOURCE_ATTRIBUTES` read as the OpenTelemetry specification
/// writes it: `key=value` pairs separated by commas, each trimmed, with
/// the value percent-decoded (how a value holds a comma, `=` or a space:
/// `region=eu%2Cwest`). The SDK's own reader does not decode, so a value
/// reached the collector still encoded. A value that does not decode
/// (`100%`) is kept as written, as the exporter keeps such a header; a
/// pair without `=` or without a key is an error, which the SDK dropped
/// without a word.
fn resource_attributes(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    // A blank pair (`a=1,,b=2`) is none, as in the headers.
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| {
                format!(
                    "{RESOURCE_ENV} must be key=value pairs separated by commas (a value's comma \
                     written %2C): a pair has no `=` or no key"
                )
            })?;
        let value = percent_decoded(value).unwrap_or_else(|| value.to_owned());
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

/// Headers `OTEL_EXPORTER_OTLP_HEADERS` may not set: those that frame or
/// carry the export's request. Sent as given, `content-length=5` cut the
/// request short (the collector took 5 bytes and answered 200, and the
/// rest of the body stood on the connection as the next request).
const FRAMING: [&str; 12] = [
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "expect",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// `text` percent-decoded as the exporter decodes a header's value: every
/// `%` starts two hex digits, and what they make is UTF-8; `None`
/// otherwise (the exporter then sends the value as written).
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = bytes[i..].iter().position(|&b| b == b'%') {
        let hex = bytes.get(i + at + 1..i + at + 3)?;
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        i += at + 3;
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|v| v.into_owned())
}

/// The share of new traces `OTEL_TRACES_SAMPLER` (with its `arg`) keeps.
/// dedupd's roots are sampled by ratio and its attempts follow their
/// event's decision whatever the sampler, so each standard sampler comes
/// down to a ratio; the parent-based ones mean the same (an incoming
/// `traceparent` is linked, never a parent).
fn sampler_ratio(sampler: &str, arg: Option<&str>) -> Result<f64, String> {
    match sampler.to_ascii_lowercase().as_str() {
        "always_on" | "parentbased_always_on" => Ok(1.0),
        "always_off" | "parentbased_always_off" => Ok(0.0),
        "traceidratio" | "parentbased_traceidratio" => match arg {
            // The specification's default.
            None => Ok(1.0),
            Some(arg) => arg
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("{SAMPLER_ARG_ENV} must be 0.0 to 1.0")),
        },
        _ => Err(format!(
            "{SAMPLER_ENV} must be always_on, always_off, traceidratio or their parentbased_ forms"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Result<String, VarError> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
                .ok_or(VarError::NotPresent)
        }
    }

    /// The export `vars` make of the default settings with `endpoint`.
    fn with(endpoint: Option<&str>, vars: &[(&str, &str)]) -> Result<Option<TraceExport>, String> {
        let s = TraceSettings {
            otlp_endpoint: endpoint.map(Into::into),
            ..TraceSettings::default()
        };
        s.export(env(vars))
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_set_somewhere() {
        let off = TraceSettings::default();
        assert_eq!(off.export(env(&[])), Ok(None));
        assert_eq!(
            off.export(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Ok(None)
        );
        let on = off
            .export(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]))
            .unwrap();
        assert_eq!(
            on.map(|e| (e.endpoint, e.service_name)),
            Some(("http://c:4318/v1/traces".to_owned(), "dedupd".to_owned()))
        );
    }

    /// Once: the SDK's reader kept `OTEL_RESOURCE_ATTRIBUTES`'s values
    /// percent-encoded (`eu%2Cwest` reached the collector as written), and
    /// dropped a pair without `=` without a word.
    #[test]
    fn resource_attributes_are_percent_decoded_and_a_pair_without_a_key_is_refused() {
        let on = |value: &str| {
            with(
                Some("http://c:4318"),
                &[("OTEL_RESOURCE_ATTRIBUTES", value)],
            )
        };
        let got = on(" region=eu%2Cwest, team = a%20b ,,note=100%,k=%E2%82%AC").unwrap();
        assert_eq!(
            got.unwrap().resource,
            [
                ("region".to_owned(), "eu,west".to_owned()),
                ("team".to_owned(), "a b".to_owned()),
                ("note".to_owned(), "100%".to_owned()),
                ("k".to_owned(), "€".to_owned()),
            ]
        );
        assert_eq!(on("").unwrap().unwrap().resource, []);
        for bad in ["region", "a=1,=2", "a=1, b"] {
            let refused = on(bad).unwrap_err();
            assert!(
                refused.starts_with("OTEL_RESOURCE_ATTRIBUTES must be key=value pairs")
                    && !refused.contains(bad),
                "{bad:?}: {refused}"
            );
        }
    }

    #[test]
    fn the_environment_overrides_the_settings() {
        let s = TraceSettings {
            otlp_endpoint: Some("http://collector:4318/".into()),
            ..TraceSettings::default()
        };
        let e = s.export(env(&[])).unwrap().unwrap();
        assert_eq!(e.endpoint, "http://collector:4318/v1/traces");
        let e = s
            .export(env(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://other:4318/v1/traces",
                ),
                ("OTEL_SERVICE_NAME", "gateway-eu"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(e.endpoint, "http://other:4318/v1/traces", "used as is");
        assert_eq!(e.service_name, "gateway-eu");
        assert_eq!(s.export(env(&[("OTEL_SDK_DISABLED", "TRUE")])), Ok(None));
        let with_query = TraceSettings {
            otlp_endpoint: Some("https://h.example/otlp/?tenant=a".into()),
            ..TraceSettings::default()
        };
        assert_eq!(
            with_query.export(env(&[])).unwrap().unwrap().endpoint,
            "https://h.example/otlp/v1/traces?tenant=a",
            "the path grows, the query stays"
        );
        // The general variable is read the same way (the exporter would
        // have put `/v1/traces` after the query).
        let general = TraceSettings::default()
            .export(env(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "https://h.example/otlp?tenant=a",
            )]))
            .unwrap()
            .unwrap();
        assert_eq!(
            general.endpoint,
            "https://h.example/otlp/v1/traces?tenant=a"
        );
        assert!(
            s.export(env(&[("OTEL_SDK_DISABLED", "false")]))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn a_standard_variable_dedupd_cannot_follow_stops_it_by_name_and_unquoted() {
        let secret = "s3cret";
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://c:21/s3cret"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://u:s3cret@c:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "s3cret"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:21/s3cret"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://s3cret@c:4318"),
        ] {
            let e = with(Some("http://ok:4318"), &[(name, value)]).expect_err(value);
            assert!(e.starts_with(name) && !e.contains(secret), "{e}");
        }
        let file = with(Some("http://ok:4318"), &[]).unwrap().unwrap();
        assert_eq!(file.endpoint, "http://ok:4318/v1/traces");
        // The traces' own variable wins; the general one is then not ours.
        let e = with(
            None,
            &[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces",
                ),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "grpc-only"),
            ],
        );
        assert!(e.unwrap().is_some());

        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        let refused = |vars: &[(&str, &str)], named: &str| {
            let all: Vec<_> = on.iter().chain(vars).copied().collect();
            let e = with(None, &all).expect_err(named);
            assert!(e.starts_with(named), "{e}");
        };
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "bogus"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "-5"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "10s"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_TRACES_EXPORTER", "otlp,console"),
            ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
            ("OTEL_SERVICE_NAME", "evil\nline"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer s3cret"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=1,bad key=2"),
            // Empty (an unset `$TOKEN`), or a control character once
            // decoded: the exporter would drop the pair.
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization="),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x=a%0Ab"),
            // Blank once decoded: the collector reads it as nothing.
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=%20"),
            // The exporter keeps the last: the first is dropped unseen.
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=a,Authorization=b",
            ),
            // The request's framing and carriage: the exporter's own.
            ("OTEL_EXPORTER_OTLP_HEADERS", "content-length=5"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "Transfer-Encoding=chunked",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x=1,content-encoding=gzip"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "host=evil.example"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "content-type=text/html"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "connection=close"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "upgrade=h2c"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "expect=100-continue"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/etc/key.pem"),
            // The exporter reads these as written: it would ignore them.
            ("OTEL_EXPORTER_OTLP_COMPRESSION", " gzip"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5000 "),
        ] {
            refused(&[(name, value)], name);
        }
        refused(
            &[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        );
        let long = "n".repeat(256);
        refused(&[("OTEL_SERVICE_NAME", &long)], "OTEL_SERVICE_NAME");
        // What it can follow.
        for vars in [
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")][..],
            &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
            &[("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none")],
            &[("OTEL_EXPORTER_OTLP_TIMEOUT", "5000")],
            &[("OTEL_TRACES_EXPORTER", "otlp")],
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/Protobuf")],
            &[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Basic dTpw==,k= v%3Dw ",
            )],
            &[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20k, x-tenant=a,",
            )],
            &[("OTEL_EXPORTER_OTLP_HEADERS", "x-name=caf%C3%A9%2C%25")],
            // Not decodable: sent as written, as the exporter does.
            &[("OTEL_EXPORTER_OTLP_HEADERS", "x-scope=100%")],
        ] {
            let all: Vec<_> = on.iter().chain(vars).copied().collect();
            assert!(with(None, &all).unwrap().is_some(), "{vars:?}");
        }
        let not_utf8 = |name: &str| {
            if name == "OTEL_SERVICE_NAME" {
                Err(VarError::NotUnicode("x".into()))
            } else {
                env(&on)(name)
            }
        };
        let e = TraceSettings::default().export(not_utf8).unwrap_err();
        assert_eq!(e, "OTEL_SERVICE_NAME is not UTF-8");
        // The exporter takes the traces' own headers when set, even empty:
        // the general one's key would never be sent.
        let hidden = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", ""),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20s3cret",
            ),
        ];
        let e = with(None, &hidden).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_TRACES_HEADERS") && !e.contains("s3cret"));
        // Only the one it reads is checked.
        let shadowed = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "not a pair"),
        ];
        assert!(with(None, &shadowed).unwrap().is_some());
    }

    /// Port 0 is refused, from either variable or the file: no collector
    /// listens there, and every span would be dropped. An endpoint too
    /// long for the exporter's parser, or one it cannot parse as
    /// written, is refused saying so, not as if it held credentials.
    /// Neither quotes the URL.
    #[test]
    fn an_endpoint_on_port_0_or_one_the_exporter_cannot_parse_is_refused_saying_why() {
        let said = |e: &str, name: &str, why: &str| {
            assert!(e.starts_with(name), "{e}");
            assert!(e.contains(why), "{e}");
            assert!(!e.contains("user name") && !e.contains("s3cret"), "{e}");
        };
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:00/?k=s3cret"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:0/v1/traces",
            ),
        ] {
            let e = with(Some("http://ok:4318"), &[(name, value)]).expect_err(value);
            said(&e, name, "must not name port 0");
        }
        let file = TraceSettings {
            otlp_endpoint: Some("http://127.0.0.1:0".into()),
            ..TraceSettings::default()
        };
        let problems = file.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "telemetry.traces.otlp_endpoint");
        said(&problems[0].1, "must not", "port 0");
        let e = file.export(env(&[])).unwrap_err();
        said(&e, "telemetry.traces.otlp_endpoint", "must not name port 0");
        // A port it can post to.
        for ok in ["http://c:1", "http://c:65535", "http://c", "https://c:443"] {
            assert!(with(Some(ok), &[]).unwrap().is_some(), "{ok}");
        }

        // The traces URL (`/v1/traces` added) at the parser's limit, and
        // one byte over it.
        let at = |n: usize| format!("http://c:4318/{}", "a".repeat(n));
        let longest = LONGEST_URI - "http://c:4318//v1/traces".len();
        let e = with(Some(&at(longest)), &[]).unwrap().unwrap();
        assert_eq!(e.endpoint.len(), LONGEST_URI);
        let over = TraceSettings {
            otlp_endpoint: Some(at(longest + 1)),
            ..TraceSettings::default()
        };
        let problems = over.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        said(&problems[0].1, "is too long", "65534 bytes");
        // 80 KB, with a secret in its query, from either variable.
        let long = format!("http://c:4318/{}?k=s3cret", "a".repeat(80_000));
        for name in ENDPOINT_ENV {
            let e = with(None, &[(name, &long)]).unwrap_err();
            said(&e, name, "is too long");
        }
        // The traces' own variable is posted to as written: not in ASCII,
        // the exporter cannot parse it.
        let name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
        let e = with(
            None,
            &[(name, "http://\u{fc}.example:4318/v1/traces?k=s3cret")],
        )
        .unwrap_err();
        said(&e, name, "ASCII");
        assert!(
            with(None, &[(name, "http://xn--tda.example:4318/v1/traces")])
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn the_standard_sampler_and_exporter_variables_are_followed() {
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        let ratio = |vars: &[(&str, &str)]| {
            let all: Vec<_> = on.iter().chain(vars).copied().collect();
            with(None, &all).unwrap().map(|e| e.sample_ratio)
        };
        assert_eq!(ratio(&[]), Some(1.0), "the file's (its default)");
        assert_eq!(ratio(&[("OTEL_TRACES_SAMPLER", "always_off")]), Some(0.0));
        assert_eq!(
            ratio(&[("OTEL_TRACES_SAMPLER", "parentbased_always_on")]),
            Some(1.0)
        );
        assert_eq!(
            ratio(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25")
            ]),
            Some(0.25)
        );
        assert_eq!(ratio(&[("OTEL_TRACES_SAMPLER", "TraceIdRatio")]), Some(1.0));
        // The specification's off switch for traces alone.
        assert_eq!(ratio(&[("OTEL_TRACES_EXPORTER", "none")]), None);
        assert_eq!(ratio(&[("OTEL_TRACES_EXPORTER", "NONE")]), None);
        assert_eq!(
            with(Some("http://c:4318"), &[("OTEL_TRACES_EXPORTER", "none")]),
            Ok(None)
        );
    }

    #[test]
    fn bad_trace_settings_are_named() {
        let s = TraceSettings {
            otlp_endpoint: Some("collector:4318".into()),
            service_name: " ".into(),
            sample_ratio: 1.5,
            queue: 100_001,
        };
        let keys: Vec<&str> = s.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "telemetry.traces.otlp_endpoint",
                "telemetry.traces.service_name",
                "telemetry.traces.sample_ratio",
                "telemetry.traces.queue"
            ]
        );
        for name in ["a\nb", "a\u{2028}b", "a\u{2029}b", "a\u{85}b"] {
            let s = TraceSettings {
                service_name: name.into(),
                ..TraceSettings::default()
            };
            assert_eq!(s.problems().len(), 1, "{name:?}");
        }
        let nan = TraceSettings {
            sample_ratio: f64::NAN,
            ..TraceSettings::default()
        };
        assert_eq!(nan.problems().len(), 1);
        assert!(TraceSettings::default().problems().is_empty());
        let userinfo = TraceSettings {
            otlp_endpoint: Some("http://user:pw@127.0.0.1:4318".into()),
            ..TraceSettings::default()
        };
        let said = userinfo.problems();
        assert_eq!(said.len(), 1);
        assert!(said[0].1.contains("OTEL_EXPORTER_OTLP_HEADERS") && !said[0].1.contains("pw"));
        for ok in [
            "http://127.0.0.1:4318",
            "https://otel.example.com/v1/traces",
        ] {
            let s = TraceSettings {
                otlp_endpoint: Some(ok.into()),
                ..TraceSettings::default()
            };
            assert!(s.problems().is_empty(), "{ok}");
        }
    }
}
