//! Events to and from their hash in Redis, and the sortable keys of the
//! indexes (fixed-width digits, so a lexical range is a numeric one).

use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::store::StoreError;
use crate::store::inbox::{EventStatus, InboxEvent, ReplayMark};

/// `created_at` as 22 digits: nanoseconds shifted by 10^21, so dates
/// before 1970 sort before later ones. RFC 3339 years 0000–9999 lie
/// within ±3·10^20 ns; anything further is clamped.
pub fn created_key(c: CreatedAt) -> String {
    const SHIFT: i128 = 1_000_000_000_000_000_000_000;
    let n = c.unix_nanos().clamp(-SHIFT, 9 * SHIFT - 1);
    format!("{:022}", n + SHIFT)
}

/// A receive time as 20 digits.
pub fn received_key(ms: Millis) -> String {
    format!("{ms:020}")
}

/// The fields of an event's hash that a listing reads (all but the body).
pub const LIST_FIELDS: &[&str] = &[
    "st", "sm", "cr", "rc", "at", "du", "er", "fo", "ex", "ls", "hd", "bb", "rj", "rb",
];

/// An event's fields as read.
#[derive(Debug, Default)]
pub struct Fields {
    values: Vec<(&'static str, Vec<u8>)>,
    /// The body, when it was read.
    pub body: Option<Vec<u8>>,
}

impl Fields {
    /// From an `HMGET` of `names`.
    pub fn from_hmget(names: &[&'static str], values: &[Option<Vec<u8>>]) -> Self {
        Self {
            values: names
                .iter()
                .zip(values)
                .filter_map(|(n, v)| Some((*n, v.clone()?)))
                .collect(),
            body: None,
        }
    }

    fn text(&self, name: &str) -> Option<String> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    fn num<T: std::str::FromStr>(&self, name: &str) -> Result<T, StoreError> {
        self.text(name).and_then(|v| v.parse().ok()).ok_or_else(|| {
            StoreError::failed(format!("a shared inbox event's field {name} is malformed"))
        })
    }
}

/// The event the fields hold; `None` when there is none (no status).
pub fn decode(source: &str, id: &str, f: &Fields) -> Result<Option<InboxEvent>, StoreError> {
    let Some(status) = f.text("st") else {
        return Ok(None);
    };
    let status = status
        .parse::<u8>()
        .map(EventStatus::from_byte)
        .map_err(|_| StoreError::failed("a shared inbox event's status is malformed"))?;
    Ok(Some(InboxEvent {
        source: source.to_owned(),
        event_id: id.to_owned(),
        status,
        stream: f.text("sm"),
        created_at: CreatedAt::from_unix_nanos(f.num("cr")?),
        received_at_ms: f.num("rc")?,
        attempts: f.num("at")?,
        due_at_ms: f.num("du")?,
        last_error: f.text("er"),
        force: f.text("fo").as_deref() == Some("1"),
        headers: f
            .text("hd")
            .and_then(|h| serde_json::from_str(&h).ok())
            .unwrap_or_default(),
        body: f.body.clone().unwrap_or_default(),
        expires_at_ms: f.num("ex")?,
        lease: f.num("ls")?,
        body_bytes: f.num("bb")?,
        timeline: Vec::new(),
        replay: match f.text("rj") {
            Some(job) => Some(ReplayMark {
                job,
                base_attempts: f.num("rb")?,
            }),
            None => None,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sortable_keys_sort_as_their_numbers() {
        // The ends are clamped: equal to their neighbours at most.
        let times = [
            i128::MIN,
            -62_135_596_800_000_000_000i128,
            -1,
            0,
            1,
            1_800_000_000_000_000_000,
            i128::MAX,
        ];
        let keys: Vec<String> = times
            .iter()
            .map(|n| created_key(CreatedAt::from_unix_nanos(*n)))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
        assert!(
            keys[1..keys.len() - 1].windows(2).all(|w| w[0] < w[1]),
            "{keys:?}"
        );
        assert!(keys.iter().all(|k| k.len() == 22), "{keys:?}");
        assert!(received_key(9) < received_key(10));
        assert_eq!(received_key(u64::MAX).len(), 20);
    }
}
