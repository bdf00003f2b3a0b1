//! The configured sources: built from the settings ([`build_sources`], at
//! the start and at each reload), and held by the gateway as one snapshot
//! ([`Sources`]) that a reload replaces whole.

use std::collections::HashMap;
use std::sync::Arc;

use super::Source;
use crate::config::alerts::ALERT_SOURCE;
use crate::config::{ConfigErrors, Loaded};

/// The configured sources by name, as one configuration (the start, or a
/// reload) made them. A reload installs a new one whole; whoever loaded
/// the old one (a request, a turn in flight) keeps it to its end.
#[derive(Debug, Default)]
pub struct Sources {
    /// Sources (and destinations' lanes) by name.
    by_name: HashMap<String, Arc<Source>>,
    /// The lanes (`SOURCE.DESTINATION`) the inbox held events in when this
    /// configuration was first looked at, by source: a destination since
    /// removed or renamed keeps copies there until they are reaped (read
    /// once per configuration: a reload can remove destinations, and a
    /// new configuration reads again, as a restart would).
    pub(super) stored_lanes: tokio::sync::OnceCell<HashMap<String, Vec<String>>>,
}

impl Sources {
    /// `sources` by name.
    pub fn new(sources: impl IntoIterator<Item = Arc<Source>>) -> Self {
        Self {
            by_name: sources.into_iter().map(|s| (s.name.clone(), s)).collect(),
            stored_lanes: tokio::sync::OnceCell::new(),
        }
    }

    /// The source (or destination's lane) called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Source>> {
        self.by_name.get(name)
    }

    /// Every source and lane.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Source>> {
        self.by_name.values()
    }

    /// Every source's and lane's name.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }
}

/// Builds the configured sources: every setting parsed and checked. Each
/// error names its key (`sources.NAME.KEY`) and where the value came from.
pub fn build_sources(loaded: &Loaded) -> Result<Vec<Arc<Source>>, ConfigErrors> {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    // A source with an unreadable secret file fails without an error of
    // its own (`Settings::validate` reported it): none is left out here.
    let mut failed = false;
    for (name, src) in &loaded.settings.sources {
        let secrets: Vec<String> = src.all_secrets().map(|s| s.expose().to_owned()).collect();
        let destination: Vec<String> = src
            .all_destination_secrets()
            .map(|s| s.expose().to_owned())
            .collect();
        match Source::build_all(name, src, &secrets, &destination) {
            Ok(built) => sources.extend(built.into_iter().map(Arc::new)),
            Err(problems) => {
                failed = true;
                errors.extend(
                    problems.into_iter().map(|(key, message)| {
                        loaded.error(&format!("sources.{name}.{key}"), message)
                    }),
                );
            }
        }
    }
    if let Some(alerts) = &loaded.settings.alerts {
        // Nobody posts to the alerts source (routes::ingest refuses it):
        // its signing secret is random, only to satisfy the builder.
        let signing = format!("whsec_{}", {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
        });
        let destination: Vec<String> = alerts
            .destination_secret
            .iter()
            .chain(&alerts.destination_secrets)
            .map(|s| s.expose().to_owned())
            .collect();
        match Source::build(ALERT_SOURCE, &alerts.source(), &[signing], &destination) {
            Ok(source) => sources.push(Arc::new(source)),
            Err(problems) => {
                failed = true;
                errors.extend(
                    problems
                        .into_iter()
                        .map(|(key, message)| loaded.error(&format!("alerts.{key}"), message)),
                );
            }
        }
    }
    if !failed {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The names of the sources dedupd delivers: the configured ones and, with
/// `[alerts]`, its own alerts source.
pub fn source_names(s: &crate::config::Settings) -> Vec<String> {
    let alerts = s.alerts.as_ref().map(|_| ALERT_SOURCE.to_owned());
    // A destination's lane counts as a source of its own
    // (`SOURCE.DESTINATION`), `default` as the source.
    let lanes = s.sources.iter().flat_map(|(name, src)| {
        src.destinations
            .iter()
            .map(|d| super::source::lane_name(name, &d.name))
            .filter(move |lane| lane != name)
    });
    s.sources
        .keys()
        .cloned()
        .chain(lanes)
        .chain(alerts)
        .collect()
}
