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
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::super::spans::tests::in_a_sampled_span;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    impl Lines {
        fn take(&self) -> Vec<String> {
            let bytes = std::mem::take(&mut *self.0.lock().unwrap());
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    /// Logs a line outside a span and one inside a sampled span; answers
    /// both, and the span's `(trace_id, span_id)`.
    async fn log_both(lines: &Lines, json: bool) -> (String, String, (String, String)) {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(lines.clone())
            .with_ansi(false);
        let subscriber: Box<dyn tracing::Subscriber + Send + Sync> = if json {
            let layer = layer
                .json()
                .flatten_event(true)
                .map_event_format(super::WithTraceIds::json);
            Box::new(tracing_subscriber::registry().with(layer))
        } else {
            let layer = layer.map_event_format(super::WithTraceIds::text);
            Box::new(tracing_subscriber::registry().with(layer))
        };
        let _guard = tracing::subscriber::set_default(subscriber);
        tracing::warn!(source = "sume", "outside");
        let ids = in_a_sampled_span(async {
            tracing::warn!(source = "sume", "inside");
        })
        .await;
        let [outside, inside] = <[String; 2]>::try_from(lines.take()).expect("two lines");
        (outside, inside, ids)
    }

    #[tokio::test]
    async fn a_json_line_in_a_sampled_span_has_its_ids_as_keys_of_its_own() {
        let lines = Lines::default();
        let (outside, inside, (trace_id, span_id)) = log_both(&lines, true).await;
        let outside: serde_json::Value = serde_json::from_str(&outside).unwrap();
        assert_eq!(outside["message"], "outside");
        assert!(outside.get("trace_id").is_none(), "{outside}");
        let inside: serde_json::Value = serde_json::from_str(&inside).expect("still one object");
        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["source"], "sume");
        assert_eq!(inside["trace_id"], trace_id.as_str());
        assert_eq!(inside["span_id"], span_id.as_str());
    }

    #[tokio::test]
    async fn a_text_line_in_a_sampled_span_ends_with_its_ids() {
        let lines = Lines::default();
        let (outside, inside, (trace_id, span_id)) = log_both(&lines, false).await;
        assert!(outside.ends_with("outside source=\"sume\""), "{outside}");
        assert!(!outside.contains("trace_id"), "{outside}");
        assert!(
            inside.ends_with(&format!(
                "inside source=\"sume\" trace_id={trace_id} span_id={span_id}"
            )),
            "{inside}"
        );
    }
}
