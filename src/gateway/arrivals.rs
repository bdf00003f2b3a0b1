//! Events that may have jumped ahead of others of their stream: a new event
//! (or one an operator redelivered) older than the event its stream was
//! going to deliver next. The inbox puts it first in its stream at once;
//! the dispatcher hears of it here, and hands back any newer event of that
//! stream it had leased ahead (see `delivery::ahead`), so the stream still
//! goes oldest first.

use std::sync::{Mutex, PoisonError};

use crate::domain::CreatedAt;

/// Most arrivals kept between two dispatcher passes; past it, the next pass
/// hands back everything it leased ahead.
const MAX: usize = 10_000;

/// An event of `stream` created at `created_at`, runnable now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub source: String,
    pub stream: String,
    pub created_at: CreatedAt,
}

/// The arrivals since the dispatcher last looked.
#[derive(Debug, Default)]
pub struct Arrivals {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    list: Vec<Arrival>,
    /// Too many to keep, or one whose stream is unknown: every stream.
    all: bool,
}

impl Arrivals {
    /// Notes an event of `source` that became runnable: its stream and
    /// `created_at` (events without a stream have no order to keep).
    pub fn push(&self, source: &str, stream: Option<&str>, created_at: CreatedAt) {
        let Some(stream) = stream else {
            return;
        };
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.all {
            return;
        }
        if inner.list.len() >= MAX {
            inner.list.clear();
            inner.all = true;
            return;
        }
        inner.list.push(Arrival {
            source: source.to_owned(),
            stream: stream.to_owned(),
            created_at,
        });
    }

    /// Notes that any stream may have changed.
    pub fn push_unknown(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.list.clear();
        inner.all = true;
    }

    /// The arrivals since the last call, or `None` for "any stream".
    pub fn take(&self) -> Option<Vec<Arrival>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let list = std::mem::take(&mut inner.list);
        (!std::mem::take(&mut inner.all)).then_some(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_arrivals_mean_every_stream() {
        let a = Arrivals::default();
        let t = CreatedAt::from_unix_nanos(1);
        a.push("s", None, t);
        assert_eq!(a.take(), Some(Vec::new()), "no stream, nothing to keep");
        a.push("s", Some("r"), t);
        assert_eq!(a.take().map(|l| l.len()), Some(1));
        for _ in 0..=MAX {
            a.push("s", Some("r"), t);
        }
        assert_eq!(a.take(), None);
        assert_eq!(a.take(), Some(Vec::new()), "taken once");
    }
}
