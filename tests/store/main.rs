//! The store conformance suite: the behaviour every [`Store`] backend must
//! share, written once and instantiated per backend with `conformance!`.
#![allow(clippy::unwrap_used)]

mod backends;
mod backup;
mod backup_hostile;
mod cases;
mod checkpoint_sync;
mod disk_faults;
#[cfg(feature = "redis")]
mod fleet;
mod golden;
mod held_commit;
mod inbox_model;
mod key_file;
mod keyspace;
#[cfg(feature = "redis")]
mod lanes;
mod log_identity;
mod low_space;
mod model;
mod redb_file;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_durability;
#[cfg(feature = "redis")]
mod shared_inbox;
#[path = "../support/mod.rs"]
mod support;
mod timeline;

use std::sync::Arc;

use async_trait::async_trait;
use dedupd::store::Store;

/// A backend under test: a store that can be restarted on the same data.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The store as it is now.
    fn store(&self) -> Arc<dyn Store>;
    /// Closes the store and opens it again on the same data.
    async fn restart(&mut self);
    /// True when the backend deletes expired records itself (Redis), so
    /// the reaper has nothing to count there.
    fn expires_by_itself(&self) -> bool {
        false
    }
    /// True when fences grow per key only (a Redis Cluster, where each slot
    /// has its own counter), not over the whole store.
    fn fences_per_key(&self) -> bool {
        false
    }
}

/// Instantiates every conformance case for one backend. `$open` is an async
/// fn returning a fresh, empty `impl Backend`.
#[macro_export]
macro_rules! conformance {
    ($name:ident, $open:path) => {
        mod $name {
            use $crate::cases;

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $case() {
                        let mut backend = $open().await;
                        cases::$case(&mut backend).await;
                    }
                };
            }

            case!(claim_from_absent_gives_processing_token_and_fence);
            case!(claim_refuses_busy_and_done_keys);
            case!(done_follows_the_state_table);
            case!(a_done_keeps_its_result_for_repeats_and_restarts);
            case!(release_follows_the_state_table);
            case!(extend_follows_the_state_table);
            case!(a_stale_token_cannot_touch_the_takeover_claim);
            case!(fences_strictly_increase_also_across_restarts);
            case!(fingerprints_are_compared_on_claim);
            case!(records_expire_exactly_at_their_expiry);
            case!(apply_gives_applied_stale_and_duplicate);
            case!(applied_events_and_heads_expire_after_retention);
            case!(the_reaper_removes_exactly_the_expired_records);
            case!(the_reaper_works_in_bounded_batches);
            case!(state_survives_a_restart);
            case!(sixty_four_concurrent_claims_give_one_owner);
            case!(thirty_two_concurrent_applies_give_one_applied);
            case!(names_with_braces_and_colons_never_collide);
            case!(an_event_id_stays_a_duplicate_on_other_streams_for_the_whole_retention);
            case!(created_at_is_compared_to_the_nanosecond_also_before_1970);
            case!(the_background_reaper_wakes_for_the_next_expiry_and_stops_when_told);

            #[test]
            fn random_operations_agree_with_the_model() {
                $crate::model::check(|| {
                    Box::pin(async { Box::new($open().await) as Box<dyn $crate::Backend> })
                });
            }
        }
    };
}
