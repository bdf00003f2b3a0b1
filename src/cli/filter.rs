//! Which events an operator command means: the filter of `events count`
//! and of a bulk job (`events redeliver|erase` with filter flags), and a
//! count's answer for people (what a dry run shows).

use serde_json::Value;

use super::out::{Printed, outln};
use super::table;

/// Which events: the filter of a count or a bulk job.
#[derive(Debug, Clone, clap::Args)]
pub struct FilterArgs {
    /// pending, delivered, stale, dead, erased or filtered [default: dead].
    #[arg(long, value_parser = ["pending", "delivered", "stale", "dead", "erased", "filtered"])]
    pub status: Option<String>,
    /// Received within this long before now (`2h`, `30m`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Created at or after this time (RFC 3339).
    #[arg(long)]
    pub created_from: Option<String>,
    /// Created before this time (RFC 3339).
    #[arg(long)]
    pub created_to: Option<String>,
    /// In this stream.
    #[arg(long)]
    pub stream: Option<String>,
    /// A body field and its value, `POINTER=VALUE` (`/type=run.failed`).
    #[arg(long, value_parser = parse_field)]
    pub field: Option<(String, String)>,
    /// The last error contains this text.
    #[arg(long)]
    pub error_contains: Option<String>,
}

/// A bulk job's filter and how to run it.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Count what the filter matches and the first ids; start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Follow the job's progress until it finishes.
    #[arg(long)]
    pub wait: bool,
}

impl FilterArgs {
    /// Whether any filter flag was given.
    pub fn given(&self) -> bool {
        self.status.is_some()
            || self.since.is_some()
            || self.created_from.is_some()
            || self.created_to.is_some()
            || self.stream.is_some()
            || self.field.is_some()
            || self.error_contains.is_some()
    }

    /// The status, or dead.
    pub fn status(&self) -> &str {
        self.status.as_deref().unwrap_or("dead")
    }

    /// The filter as the count's query parameters.
    pub fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = vec![("status", self.status().to_owned())];
        if let Some(since) = self.since {
            let ago = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
            query.push((
                "received_from",
                table::now_ms().saturating_sub(ago).to_string(),
            ));
        }
        let optional = [
            ("created_from", &self.created_from),
            ("created_to", &self.created_to),
            ("stream", &self.stream),
            ("error_contains", &self.error_contains),
        ];
        for (name, value) in optional {
            if let Some(v) = value {
                query.push((name, v.clone()));
            }
        }
        if let Some((pointer, value)) = &self.field {
            query.push(("field", pointer.clone()));
            query.push(("value", value.clone()));
        }
        query
    }

    /// The filter as a job's JSON.
    pub fn json(&self) -> Value {
        let mut object = serde_json::Map::new();
        for (name, value) in self.query() {
            let value = match name {
                "received_from" => Value::from(value.parse::<u64>().unwrap_or(0)),
                _ => Value::from(value),
            };
            object.insert(name.to_owned(), value);
        }
        Value::Object(object)
    }
}

/// A count's answer, for people.
pub fn print_count(v: &Value, source: &str, status: &str) -> Printed {
    let matched = v["matched"].as_u64().unwrap_or(0);
    let bound = if v["complete"].as_bool() == Some(false) {
        "at least "
    } else {
        ""
    };
    let ids: Vec<String> = v["first_ids"]
        .as_array()
        .map(|a| a.iter().map(table::word).collect())
        .unwrap_or_default();
    let named = if ids.is_empty() {
        String::new()
    } else {
        let more = if (ids.len() as u64) < matched {
            ", …"
        } else {
            ""
        };
        format!(": {}{more}", ids.join(", "))
    };
    outln!(
        "{bound}{matched} {status} events of source {source} match (of {} read){named}",
        v["scanned"].as_u64().unwrap_or(0)
    )?;
    // The cursor is the server's, maybe an id a sender chose: one word.
    match v["next"].as_str() {
        Some(next) => outln!(
            "the count stopped at the server's scan budget: count on with --after {} \
             (and add the counts up)",
            table::shell(next)
        ),
        None => Ok(()),
    }
}

/// `POINTER=VALUE` of `--field`.
fn parse_field(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((pointer, value)) if pointer.starts_with('/') => {
            Ok((pointer.to_owned(), value.to_owned()))
        }
        _ => Err(format!(
            "expected POINTER=VALUE with a JSON pointer, such as /type=run.failed; got {raw:?}"
        )),
    }
}
