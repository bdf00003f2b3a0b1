//! Settings that are valid but bound nothing where they are given: a
//! `tolerance` for a scheme that signs no timestamp. `serve` logs a warning
//! for each at start and `check-config` prints the same, so nobody counts on
//! a protection that is not there.

use super::{ConfigError, Loaded};

impl Loaded {
    /// Each such setting given in a file or the environment (a default is
    /// nobody's choice), naming where it came from and why it does nothing.
    pub fn settings_without_effect(&self) -> Vec<ConfigError> {
        let Some(fig) = &self.figment else {
            return Vec::new();
        };
        self.settings
            .sources
            .iter()
            .filter(|(_, s)| !s.scheme.signs_timestamp())
            .filter_map(|(name, s)| {
                let key = format!("sources.{name}.tolerance");
                fig.find_value(&key).ok()?;
                Some(self.error(
                    &key,
                    format!(
                        "has no effect: {} signs no timestamp for it to bound. A replay is \
                         a duplicate only while dedupd knows the event id: the event's \
                         retention, then gateway.dedupe_window (docs/gateway.md, \"How long \
                         replay protection lasts\")",
                        s.scheme.name()
                    ),
                ))
            })
            .collect()
    }

    /// Logs a warning for each of [`Loaded::settings_without_effect`].
    pub fn warn_about_settings_without_effect(&self) {
        for e in self.settings_without_effect() {
            tracing::warn!(setting = %e.key, from = %e.origin, "{}", e.message);
        }
    }
}
