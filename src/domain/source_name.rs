//! The rule for source names, shared by the settings and `dedupd init`.

/// Whether `name` may name a source: 1 to 64 of `[A-Za-z0-9_-]`. (No `/`:
/// the store's namespace encoding depends on it.)
pub fn valid_source_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}
