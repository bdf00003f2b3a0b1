//! Which of a source's destinations an event goes to: a destination's
//! `filter`, fields by locator and the values they may have:
//!
//! ```toml
//! filter = { "body:/type" = ["run.updated", "invoice.*"], "body:/livemode" = "true" }
//! ```
//!
//! Every field must match (and), each against any of its values (or). A
//! value ending in `*` is a prefix (`invoice.*` takes `invoice.paid`; `*`
//! alone takes any value the field has); any other value is matched
//! whole. A string field is compared as it is, a number or boolean as its
//! JSON text (`"7"`, `"true"`); an absent field (or `null`, an object, an
//! array) matches nothing. No filter: every event.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::locate::{Found, Locator};

/// Most fields one filter reads.
pub const MAX_FIELDS: usize = 16;
/// Most values one field may have.
pub const MAX_VALUES: usize = 256;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// A filter's values for one field, as written: one, or a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FilterValues {
    One(String),
    Many(Vec<String>),
}

impl FilterValues {
    fn as_slice(&self) -> &[String] {
        match self {
            Self::One(v) => std::slice::from_ref(v),
            Self::Many(v) => v,
        }
    }
}

/// One value a field may have.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn matches(&self, text: &str) -> bool {
        match self {
            Self::Exact(v) => text == v,
            Self::Prefix(p) => text.starts_with(p.as_str()),
        }
    }
}

/// A destination's filter, parsed: every event, or those whose fields
/// match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteFilter {
    fields: Vec<(Locator, Vec<Pattern>)>,
}

impl RouteFilter {
    /// Parses a filter as configured; the error names the field.
    pub fn parse(raw: &BTreeMap<String, FilterValues>) -> Result<Self, String> {
        if raw.len() > MAX_FIELDS {
            return Err(format!("at most {MAX_FIELDS} fields (got {})", raw.len()));
        }
        let mut fields = Vec::with_capacity(raw.len());
        for (locator, values) in raw {
            let l = match Locator::parse(locator) {
                Ok(l @ (Locator::Header(_) | Locator::Body(_))) => l,
                Ok(_) => {
                    return Err(format!(
                        "{locator:?}: a filter reads one field, header:NAME or body:/pointer"
                    ));
                }
                Err(e) => return Err(e),
            };
            let values = values.as_slice();
            if values.is_empty() {
                return Err(format!(
                    "{locator:?} has no values: give one, a list, or \"*\" for any"
                ));
            }
            if values.len() > MAX_VALUES {
                return Err(format!("{locator:?}: at most {MAX_VALUES} values"));
            }
            let mut patterns = Vec::with_capacity(values.len());
            for v in values {
                if v.len() > MAX_VALUE_BYTES {
                    return Err(format!(
                        "{locator:?}: a value is at most {MAX_VALUE_BYTES} bytes"
                    ));
                }
                patterns.push(match v.strip_suffix('*') {
                    Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                    None => Pattern::Exact(v.clone()),
                });
            }
            fields.push((l, patterns));
        }
        Ok(Self { fields })
    }

    /// Whether it takes every event.
    pub fn is_all(&self) -> bool {
        self.fields.is_empty()
    }

    /// Whether matching reads the body.
    pub fn needs_body(&self) -> bool {
        self.fields.iter().any(|(l, _)| l.needs_body())
    }

    /// The header names it reads.
    pub fn headers(&self) -> Vec<&str> {
        self.fields.iter().flat_map(|(l, _)| l.headers()).collect()
    }

    /// Whether an event with these headers and body goes to the
    /// destination.
    pub fn matches<'h>(
        &self,
        header: &dyn Fn(&str) -> Option<&'h str>,
        body: Option<&Value>,
    ) -> bool {
        self.fields.iter().all(|(locator, patterns)| {
            let text = match locator.find(header, body) {
                Found::Text(t) => t.to_owned(),
                Found::Other(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                Found::Other(_) | Found::Missing | Found::Joined(_) => return false,
            };
            patterns.iter().any(|p| p.matches(&text))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(toml_text: &str) -> Result<RouteFilter, String> {
        #[derive(Deserialize)]
        struct F {
            filter: BTreeMap<String, FilterValues>,
        }
        let f: F = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        RouteFilter::parse(&f.filter)
    }

    fn no_headers(_: &str) -> Option<&'static str> {
        None
    }

    #[test]
    fn values_lists_and_prefixes_match_as_documented() {
        let f = filter(
            r#"filter = { "body:/type" = ["run.updated", "invoice.*"], "body:/livemode" = "true" }"#,
        )
        .unwrap();
        assert!(f.needs_body());
        let event = |t: &str, live: Value| json!({ "type": t, "livemode": live });
        for (t, live, takes) in [
            ("run.updated", json!(true), true),
            ("invoice.paid", json!(true), true),
            ("invoice.", json!(true), true),
            ("invoice", json!(true), false),
            ("run.updated", json!(false), false),
            ("run.updated", json!("true"), true),
            ("run.completed", json!(true), false),
        ] {
            assert_eq!(
                f.matches(&no_headers, Some(&event(t, live.clone()))),
                takes,
                "{t} {live}"
            );
        }
        // Absent, null, or an object: no match.
        assert!(!f.matches(&no_headers, Some(&json!({ "type": "run.updated" }))));
        assert!(!f.matches(
            &no_headers,
            Some(&json!({ "type": {"a": 1}, "livemode": true }))
        ));
        assert!(!f.matches(&no_headers, None));
    }

    #[test]
    fn a_star_takes_any_value_and_no_filter_takes_everything() {
        let f = filter(r#"filter = { "body:/data/id" = "*" }"#).unwrap();
        assert!(f.matches(&no_headers, Some(&json!({ "data": { "id": 7 } }))));
        assert!(!f.matches(&no_headers, Some(&json!({ "data": {} }))));
        let all = filter("filter = {}").unwrap();
        assert!(all.is_all() && all.matches(&no_headers, None));
    }

    #[test]
    fn a_header_field_is_read_from_the_request() {
        let f = filter(r#"filter = { "header:x-kind" = "billing" }"#).unwrap();
        assert_eq!(f.headers(), ["x-kind"]);
        let h = |name: &str| (name == "x-kind").then_some("billing");
        assert!(f.matches(&h, None));
        assert!(!f.matches(&no_headers, None));
    }

    #[test]
    fn bad_filters_are_refused_by_field() {
        for (text, says) in [
            (r#"filter = { "body:type" = "x" }"#, "not a JSON pointer"),
            (r#"filter = { "body-sha256" = "x" }"#, "reads one field"),
            (
                r#"filter = { "body:/a + body:/b" = "x" }"#,
                "reads one field",
            ),
            (r#"filter = { "body:/type" = [] }"#, "has no values"),
            (r#"filter = { "query:type" = "x" }"#, "must be header:NAME"),
        ] {
            let err = filter(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        let many: BTreeMap<String, FilterValues> = (0..=MAX_FIELDS)
            .map(|i| (format!("body:/f{i}"), FilterValues::One("x".into())))
            .collect();
        assert!(
            RouteFilter::parse(&many)
                .unwrap_err()
                .contains("at most 16 fields")
        );
        let long = BTreeMap::from([(
            "body:/t".to_owned(),
            FilterValues::One("x".repeat(MAX_VALUE_BYTES + 1)),
        )]);
        assert!(
            RouteFilter::parse(&long)
                .unwrap_err()
                .contains("at most 1024 bytes")
        );
    }
}
