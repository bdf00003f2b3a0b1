//! `[telemetry.traces]`: OpenTelemetry traces over OTLP/HTTP (protobuf),
//! off unless an endpoint is set here or in the standard
//! `OTEL_EXPORTER_OTLP_*` environment variables.

use serde::{Deserialize, Serialize};

/// The standard variables that name the collector; either one turns
/// export on, and it overrides `otlp_endpoint`.
pub const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];
/// The standard variable that overrides `service_name`.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
/// The standard variable that turns every signal off (`true`).
pub const DISABLED_ENV: &str = "OTEL_SDK_DISABLED";

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

/// Where the spans go, as settings and environment decided.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceExport {
    /// The settings' endpoint, with `/v1/traces`; `None` when an
    /// `OTEL_EXPORTER_OTLP_*` variable names it (the exporter reads it).
    pub endpoint: Option<String>,
    pub service_name: String,
    pub sample_ratio: f64,
    pub queue: usize,
}

impl TraceSettings {
    /// Whether and where spans are exported, with `env` the process's
    /// environment: off when no endpoint is set anywhere, or when
    /// `OTEL_SDK_DISABLED=true`.
    pub fn export(&self, env: impl Fn(&str) -> Option<String>) -> Option<TraceExport> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if set(DISABLED_ENV).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let from_env = ENDPOINT_ENV.iter().any(|name| set(name).is_some());
        let endpoint = match (&self.otlp_endpoint, from_env) {
            (_, true) => None,
            // Checked when the settings were loaded.
            (Some(base), false) => Some(traces_url(base)?),
            (None, false) => return None,
        };
        Some(TraceExport {
            endpoint,
            service_name: set(SERVICE_NAME_ENV).unwrap_or_else(|| self.service_name.clone()),
            sample_ratio: self.sample_ratio,
            queue: self.queue,
        })
    }

    /// What is wrong with these settings, by key.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut bad = Vec::new();
        if let Some(endpoint) = &self.otlp_endpoint
            && traces_url(endpoint).is_none()
        {
            // Not quoted: it may hold credentials.
            bad.push((
                "telemetry.traces.otlp_endpoint",
                "must be an http:// or https:// URL with a host, such as http://127.0.0.1:4318"
                    .to_owned(),
            ));
        }
        let name = self.service_name.trim();
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            bad.push((
                "telemetry.traces.service_name",
                "must be 1 to 255 characters, without control characters".to_owned(),
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

/// The OTLP/HTTP traces URL under a collector's base URL (as the
/// `OTEL_EXPORTER_OTLP_ENDPOINT` rule says: `/v1/traces` added to its
/// path, its query kept); a URL whose path already ends so stays. Written
/// out in ASCII (punycode, percent-encoding), as the exporter parses it.
fn traces_url(base: &str) -> Option<String> {
    let mut url = reqwest::Url::parse(base.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return None;
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if !path.ends_with("/v1/traces") {
        url.set_path(&format!("{path}/v1/traces"));
    }
    let text = url.to_string();
    text.parse::<actix_web::http::Uri>().ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_set_somewhere() {
        let off = TraceSettings::default();
        assert_eq!(off.export(env(&[])), None);
        assert_eq!(
            off.export(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            None
        );
        let on = off.export(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]));
        assert_eq!(
            on.map(|e| (e.endpoint, e.service_name)),
            Some((None, "dedupd".to_owned()))
        );
    }

    #[test]
    fn the_environment_overrides_the_settings() {
        let s = TraceSettings {
            otlp_endpoint: Some("http://collector:4318/".into()),
            ..TraceSettings::default()
        };
        let e = s.export(env(&[])).unwrap();
        assert_eq!(
            e.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        let e = s
            .export(env(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://other:4318/v1/traces",
                ),
                ("OTEL_SERVICE_NAME", "gateway-eu"),
            ]))
            .unwrap();
        assert_eq!(e.endpoint, None, "the exporter reads the variable");
        assert_eq!(e.service_name, "gateway-eu");
        assert_eq!(s.export(env(&[("OTEL_SDK_DISABLED", "TRUE")])), None);
        let with_query = TraceSettings {
            otlp_endpoint: Some("https://h.example/otlp/?tenant=a".into()),
            ..TraceSettings::default()
        };
        assert_eq!(
            with_query.export(env(&[])).unwrap().endpoint.as_deref(),
            Some("https://h.example/otlp/v1/traces?tenant=a"),
            "the path grows, the query stays"
        );
        assert!(s.export(env(&[("OTEL_SDK_DISABLED", "false")])).is_some());
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
        let nan = TraceSettings {
            sample_ratio: f64::NAN,
            ..TraceSettings::default()
        };
        assert_eq!(nan.problems().len(), 1);
        assert!(TraceSettings::default().problems().is_empty());
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
