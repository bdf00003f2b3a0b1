//! Log lines that join the traces: a line written inside a sampled span
//! (an ingest, a delivery attempt, a claims or ordering request) carries
//! that span's `trace_id` and `span_id`, as fields of its own at the end
//! of a text line, or as top-level keys of a JSON one (where log shippers
//! look for them). The ids are asked of the writing task when a line is
//! written, so a request that logs nothing pays nothing.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::spans::log_ids;

/// A line format (`inner`, tracing-subscriber's own) with the trace's ids.
#[derive(Debug, Clone)]
pub struct WithTraceIds<E> {
    inner: E,
    json: bool,
}

impl<E> WithTraceIds<E> {
    /// Text lines, which end in ` trace_id=… span_id=…`.
    pub fn text(inner: E) -> Self {
        Self { inner, json: false }
    }

    /// JSON lines (one object each), with `trace_id` and `span_id` keys.
    pub fn json(inner: E) -> Self {
        Self { inner, json: true }
    }
}

impl<S, N, E> FormatEvent<S, N> for WithTraceIds<E>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    E: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = log_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        // The line as the format writes it (without colours: a traced
        // task's lines are the service's, read from its journal), then
        // the ids before its end.
        let mut line = String::with_capacity(256);
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.strip_suffix('\n').unwrap_or(&line);
        if self.json
            && let Some(open) = body.strip_suffix('}')
        {
            let comma = if open.ends_with('{') { "" } else { "," };
            return writeln!(
                writer,
                "{open}{comma}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            );
        }
        writer.write_str(body)?;
        writeln!(writer, " trace_id={trace_id} span_id={span_id}")
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::super::spans::tests::in_a_sampled_span;
    use crate::config::LogFormat;
    use crate::telemetry::TestLines as Lines;

    /// Logs a line outside a span and one inside a sampled span, as
    /// `serve` writes them in `format`; answers both, and the span's
    /// `(trace_id, span_id)`.
    async fn log_both(
        lines: &Lines,
        format: LogFormat,
        event_id: &str,
    ) -> (String, String, (String, String)) {
        let layer = crate::telemetry::lines(format, lines.clone(), false);
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        tracing::warn!(source = "sume", event_id = %event_id, "outside");
        let ids = in_a_sampled_span(async {
            tracing::warn!(source = "sume", event_id = %event_id, "inside");
        })
        .await;
        let [outside, inside] = <[String; 2]>::try_from(lines.take()).expect("two lines");
        (outside, inside, ids)
    }

    #[tokio::test]
    async fn a_json_line_in_a_sampled_span_has_its_ids_as_keys_of_its_own() {
        let lines = Lines::default();
        let (outside, inside, (trace_id, span_id)) = log_both(&lines, LogFormat::Json, "e1").await;
        let outside: serde_json::Value = serde_json::from_str(&outside).unwrap();
        assert_eq!(outside["message"], "outside");
        assert!(outside.get("trace_id").is_none(), "{outside}");
        let inside: serde_json::Value = serde_json::from_str(&inside).expect("still one object");
        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["source"], "sume");
        assert_eq!(inside["event_id"], "e1");
        assert_eq!(inside["trace_id"], trace_id.as_str());
        assert_eq!(inside["span_id"], span_id.as_str());
    }

    #[tokio::test]
    async fn a_text_line_in_a_sampled_span_ends_with_its_ids() {
        let lines = Lines::default();
        let (outside, inside, (trace_id, span_id)) = log_both(&lines, LogFormat::Text, "e1").await;
        assert!(
            outside.ends_with("outside source=\"sume\" event_id=e1"),
            "{outside}"
        );
        assert!(!outside.contains("trace_id"), "{outside}");
        assert!(
            inside.ends_with(&format!(
                "inside source=\"sume\" event_id=e1 trace_id={trace_id} span_id={span_id}"
            )),
            "{inside}"
        );
    }

    /// A sender chooses its event ids: one that reads as fields of their
    /// own is written quoted, so the only `trace_id=` a reader finds is the
    /// line's own, and one that would break the line cannot.
    #[tokio::test]
    async fn an_event_id_cannot_pass_for_the_lines_trace_ids_or_end_the_line() {
        let lines = Lines::default();
        let forged = "e2 trace_id=00000000000000000000000000000bad span_id=0000000000000bad";
        let (outside, inside, (trace_id, span_id)) =
            log_both(&lines, LogFormat::Text, forged).await;
        assert!(
            outside.ends_with(&format!("outside source=\"sume\" event_id=\"{forged}\"")),
            "{outside}"
        );
        assert!(
            inside.ends_with(&format!(
                "event_id=\"{forged}\" trace_id={trace_id} span_id={span_id}"
            )),
            "{inside}"
        );
        // Read as a reader of `key=value` fields reads it.
        let unquoted: Vec<&str> = inside
            .split('"')
            .step_by(2)
            .flat_map(str::split_whitespace)
            .filter(|f| f.starts_with("trace_id="))
            .collect();
        assert_eq!(unquoted, [format!("trace_id={trace_id}")], "{inside}");

        for tricky in ["a\"b", "a=b", "a\\\" trace_id=bad \"", "x\u{2028}y"] {
            let (outside, _, _) = log_both(&lines, LogFormat::Text, tricky).await;
            assert!(
                outside.ends_with(&format!("event_id={tricky:?}")),
                "{tricky}: {outside}"
            );
        }
    }

    /// A message keeps its words, but a line break in it is escaped.
    #[test]
    fn a_message_stays_on_its_line() {
        let lines = Lines::default();
        let layer = crate::telemetry::lines(LogFormat::Text, lines.clone(), false);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let said = "first\nINFO forged line";
            tracing::warn!("{said}");
            tracing::warn!(error = %"a\nb", n = 3, ok = true, "two words");
        });
        let text = lines.take();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].ends_with("first\\nINFO forged line"), "{text:?}");
        assert!(
            text[1].ends_with("two words error=\"a\\nb\" n=3 ok=true"),
            "{text:?}"
        );
    }
}
