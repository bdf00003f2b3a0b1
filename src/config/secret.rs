//! Secrets in settings: read like strings, never printed.

use std::cell::Cell;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A secret string. `Debug` and `Serialize` show `<redacted>`, so printing
/// settings (check-config, logs) never leaks it; only [`exposed`] lets
/// `Serialize` write the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

thread_local! {
    /// Set while [`exposed`] runs on this thread.
    static EXPOSED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every [`Secret`] serializing as its value instead of
/// `<redacted>`, on this thread only. For one use: handing the defaults to
/// figment, whose defaults layer is made by serializing
/// [`Settings::default`](super::Settings) — through the redacted form, a
/// default secret (`storage.redis.url`) would be loaded as the string
/// `<redacted>`. Nothing serialized inside `f` may be printed.
pub(crate) fn exposed<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the flag back however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            EXPOSED.with(|e| e.set(self.0));
        }
    }
    let _restore = Restore(EXPOSED.with(|e| e.replace(true)));
    f()
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if EXPOSED.with(Cell::get) {
            s.serialize_str(&self.0)
        } else {
            s.serialize_str("<redacted>")
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}
