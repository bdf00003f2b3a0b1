//! Conformance cases. Time is passed to the store explicitly, so "moving
//! the clock" is passing a later `now`.

use std::sync::Arc;

use dedupd::domain::{ClaimResult, CreatedAt, Fingerprint, Key, ScopedKey, Token, Ttl};
use dedupd::reaper::Reaper;
use dedupd::store::{
    ApplyOutcome, ClaimOutcome, ClaimState, DoneOutcome, ExtendOutcome, ReleaseOutcome, Store,
};

use crate::Backend;

/// An ordinary instant.
const T: u64 = 1_800_000_000_000;

fn key(s: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(s, "key").unwrap())
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_ms_unchecked(ms)
}

fn at(s: &str) -> CreatedAt {
    CreatedAt::parse(s, "created_at").unwrap()
}

async fn claim(s: &dyn Store, k: &str, ms: u64, now: u64) -> (Token, u64) {
    match s.claim(&key(k), ttl(ms), None, now).await.unwrap() {
        ClaimOutcome::Claimed { token, fence, .. } => (token, fence),
        other => panic!("expected a claim of {k}, got {other:?}"),
    }
}

pub async fn claim_from_absent_gives_processing_token_and_fence(b: &mut dyn Backend) {
    let s = b.store();
    let out = s.claim(&key("k"), ttl(1_000), None, T).await.unwrap();
    let ClaimOutcome::Claimed {
        fence,
        expires_at_ms,
        ..
    } = out
    else {
        panic!("{out:?}")
    };
    assert!(fence >= 1);
    assert_eq!(expires_at_ms, T + 1_000);
    let view = s.get(&key("k"), T).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.fence, view.expires_at_ms),
        (ClaimState::Processing, fence, T + 1_000)
    );
}

pub async fn claim_refuses_busy_and_done_keys(b: &mut dyn Backend) {
    let s = b.store();
    let (token, fence) = claim(&*s, "k", 1_000, T).await;
    assert_eq!(
        s.claim(&key("k"), ttl(5), None, T + 1).await.unwrap(),
        ClaimOutcome::Busy {
            expires_at_ms: T + 1_000
        }
    );
    // The refused claim changed nothing: the owner's claim is as it was.
    let held = s.get(&key("k"), T + 1).await.unwrap().unwrap();
    assert_eq!(
        (held.state, held.fence, held.expires_at_ms),
        (ClaimState::Processing, fence, T + 1_000)
    );
    // The key's next fence is the one after: the refused claim took none.
    // (The same key, as fences grow per key in a Redis Cluster.)
    assert_eq!(
        s.release(&key("k"), token, T + 1).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (token, next) = claim(&*s, "k", 1_000, T + 1).await;
    assert_eq!(next, fence + 1, "a refused claim takes no fence");
    s.done(&key("k"), token, ttl(10_000), T + 2).await.unwrap();
    assert_eq!(
        s.claim(&key("k"), ttl(5), None, T + 3).await.unwrap(),
        ClaimOutcome::Done {
            expires_at_ms: T + 10_002,
            result: None,
        }
    );
}

pub async fn done_follows_the_state_table(b: &mut dyn Backend) {
    let s = b.store();
    let stranger = Token::random();
    // absent → done
    assert_eq!(
        s.done(&key("a"), stranger, ttl(500), T).await.unwrap(),
        DoneOutcome::Done {
            expires_at_ms: T + 500
        }
    );
    assert_eq!(
        s.get(&key("a"), T).await.unwrap().unwrap().state,
        ClaimState::Done
    );
    // processing, owner → done; other → not owner
    let (token, fence) = claim(&*s, "p", 1_000, T).await;
    assert_eq!(
        s.done(&key("p"), stranger, ttl(500), T).await.unwrap(),
        DoneOutcome::NotOwner {
            state: ClaimState::Processing,
            expires_at_ms: T + 1_000
        }
    );
    assert_eq!(
        s.done(&key("p"), token, ttl(5_000), T + 10).await.unwrap(),
        DoneOutcome::Done {
            expires_at_ms: T + 5_010
        }
    );
    assert_eq!(
        s.get(&key("p"), T + 10).await.unwrap().unwrap().fence,
        fence
    );
    // done, same token → ok, unchanged; other → refused
    assert_eq!(
        s.done(&key("p"), token, ttl(99_999), T + 20).await.unwrap(),
        DoneOutcome::Done {
            expires_at_ms: T + 5_010
        }
    );
    assert_eq!(
        s.done(&key("p"), stranger, ttl(500), T + 20).await.unwrap(),
        DoneOutcome::NotOwner {
            state: ClaimState::Done,
            expires_at_ms: T + 5_010
        }
    );
}

pub async fn release_follows_the_state_table(b: &mut dyn Backend) {
    let s = b.store();
    let stranger = Token::random();
    assert_eq!(
        s.release(&key("a"), stranger, T).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    let (token, _) = claim(&*s, "p", 1_000, T).await;
    assert_eq!(
        s.release(&key("p"), stranger, T).await.unwrap(),
        ReleaseOutcome::NotOwner {
            expires_at_ms: T + 1_000
        }
    );
    assert_eq!(
        s.release(&key("p"), token, T).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(s.get(&key("p"), T).await.unwrap(), None);
    let (token, _) = claim(&*s, "d", 1_000, T).await;
    s.done(&key("d"), token, ttl(2_000), T).await.unwrap();
    assert_eq!(
        s.release(&key("d"), token, T).await.unwrap(),
        ReleaseOutcome::Done {
            expires_at_ms: T + 2_000
        }
    );
}

pub async fn extend_follows_the_state_table(b: &mut dyn Backend) {
    let s = b.store();
    let stranger = Token::random();
    assert_eq!(
        s.extend(&key("a"), stranger, ttl(5), T).await.unwrap(),
        ExtendOutcome::Lost
    );
    let (token, _) = claim(&*s, "p", 1_000, T).await;
    assert_eq!(
        s.extend(&key("p"), stranger, ttl(5), T).await.unwrap(),
        ExtendOutcome::NotOwner {
            expires_at_ms: T + 1_000
        }
    );
    assert_eq!(
        s.extend(&key("p"), token, ttl(3_000), T + 900)
            .await
            .unwrap(),
        ExtendOutcome::Extended {
            expires_at_ms: T + 3_900
        }
    );
    assert!(s.get(&key("p"), T + 3_899).await.unwrap().is_some());
    assert_eq!(
        s.extend(&key("p"), token, ttl(5), T + 3_900).await.unwrap(),
        ExtendOutcome::Lost
    );
    let (token, _) = claim(&*s, "d", 1_000, T).await;
    s.done(&key("d"), token, ttl(2_000), T).await.unwrap();
    assert_eq!(
        s.extend(&key("d"), token, ttl(5), T).await.unwrap(),
        ExtendOutcome::Done {
            expires_at_ms: T + 2_000
        }
    );
}

pub async fn a_stale_token_cannot_touch_the_takeover_claim(b: &mut dyn Backend) {
    let s = b.store();
    let (slow, _) = claim(&*s, "k", 1_000, T).await;
    let (fast, fence) = claim(&*s, "k", 60_000, T + 1_000).await;
    let now = T + 2_000;
    assert!(matches!(
        s.release(&key("k"), slow, now).await.unwrap(),
        ReleaseOutcome::NotOwner { .. }
    ));
    assert!(matches!(
        s.done(&key("k"), slow, ttl(9), now).await.unwrap(),
        DoneOutcome::NotOwner { .. }
    ));
    assert!(matches!(
        s.extend(&key("k"), slow, ttl(9), now).await.unwrap(),
        ExtendOutcome::NotOwner { .. }
    ));
    let view = s.get(&key("k"), now).await.unwrap().unwrap();
    assert_eq!((view.state, view.fence), (ClaimState::Processing, fence));
    assert!(matches!(
        s.done(&key("k"), fast, ttl(9), now).await.unwrap(),
        DoneOutcome::Done { .. }
    ));
}

pub async fn fences_strictly_increase_also_across_restarts(b: &mut dyn Backend) {
    // Per key on every backend; over the whole store too, but in a Redis
    // Cluster (a counter per slot).
    let whole_store = !b.fences_per_key();
    let mut last = 0;
    let mut last_of = std::collections::HashMap::new();
    let mut check = |k: &str, fence: u64| {
        let before = last_of.insert(k.to_owned(), fence).unwrap_or(0);
        assert!(fence > before, "{k}: {fence} after {before}");
        if whole_store {
            assert!(fence > last, "{k}: {fence} after {last}");
        }
        last = fence;
    };
    for round in 0..3 {
        let s = b.store();
        // The same keys each round: the last round's records have expired.
        let now = T + round * 100;
        for i in 0..4 {
            let k = format!("k{i}");
            check(&k, claim(&*s, &k, 10, now).await.1);
        }
        // A done from absent takes a fence too.
        s.done(&key("d"), Token::random(), ttl(10), now)
            .await
            .unwrap();
        check("d", s.get(&key("d"), now).await.unwrap().unwrap().fence);
        drop(s);
        b.restart().await;
    }
    check("k0", claim(&*b.store(), "k0", 10, T + 10_000).await.1);
}

pub async fn fingerprints_are_compared_on_claim(b: &mut dyn Backend) {
    let s = b.store();
    let fp = |x: &str| Some(Fingerprint::parse(x).unwrap());
    let ClaimOutcome::Claimed { token, .. } =
        s.claim(&key("k"), ttl(1_000), fp("aaa"), T).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(
        s.claim(&key("k"), ttl(1_000), fp("bbb"), T).await.unwrap(),
        ClaimOutcome::FingerprintMismatch {
            state: ClaimState::Processing,
            expires_at_ms: T + 1_000
        }
    );
    assert!(matches!(
        s.claim(&key("k"), ttl(1), fp("aaa"), T).await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
    assert!(matches!(
        s.claim(&key("k"), ttl(1), None, T).await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
    s.done(&key("k"), token, ttl(5_000), T).await.unwrap();
    assert_eq!(
        s.claim(&key("k"), ttl(1_000), fp("bbb"), T).await.unwrap(),
        ClaimOutcome::FingerprintMismatch {
            state: ClaimState::Done,
            expires_at_ms: T + 5_000
        }
    );
    // An expired record is absent: no comparison.
    assert!(matches!(
        s.claim(&key("k"), ttl(1_000), fp("bbb"), T + 5_000)
            .await
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

pub async fn records_expire_exactly_at_their_expiry(b: &mut dyn Backend) {
    let s = b.store();
    claim(&*s, "k", 1_000, T).await;
    assert!(s.get(&key("k"), T + 999).await.unwrap().is_some());
    assert!(s.get(&key("k"), T + 1_000).await.unwrap().is_none());
    assert!(matches!(
        s.claim(&key("k"), ttl(1), None, T + 999).await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
    claim(&*s, "k", 1_000, T + 1_000).await;
}

pub async fn apply_gives_applied_stale_and_duplicate(b: &mut dyn Backend) {
    let s = b.store();
    let (st, a, bb, c) = (key("run"), key("A"), key("B"), key("C"));
    let r = s
        .apply(&st, &bb, at("2026-11-29T10:05:00Z"), 60_000, T)
        .await
        .unwrap();
    assert_eq!(r.outcome, ApplyOutcome::Applied);
    assert_eq!(r.head.as_ref().unwrap().event_id, bb);
    let r = s
        .apply(&st, &a, at("2026-11-29T10:00:00Z"), 60_000, T)
        .await
        .unwrap();
    assert_eq!(r.outcome, ApplyOutcome::Stale);
    assert_eq!(r.head.as_ref().unwrap().event_id, bb);
    for (id, ts) in [(&bb, "2026-11-29T10:05:00Z"), (&a, "2026-11-29T12:00:00Z")] {
        let r = s.apply(&st, id, at(ts), 60_000, T).await.unwrap();
        assert_eq!(r.outcome, ApplyOutcome::Duplicate);
    }
    // Equal instant, other offset: applied.
    let r = s
        .apply(&st, &c, at("2026-11-29T11:05:00+01:00"), 60_000, T)
        .await
        .unwrap();
    assert_eq!(r.outcome, ApplyOutcome::Applied);
    let head = s.head(&st, T).await.unwrap().unwrap();
    assert_eq!(
        (head.event_id, head.created_at),
        (c, at("2026-11-29T10:05:00Z"))
    );
}

pub async fn applied_events_and_heads_expire_after_retention(b: &mut dyn Backend) {
    let s = b.store();
    let (st, e) = (key("s"), key("e"));
    s.apply(&st, &e, at("2026-11-29T10:00:00Z"), 1_000, T)
        .await
        .unwrap();
    assert!(s.head(&st, T + 999).await.unwrap().is_some());
    assert!(s.head(&st, T + 1_000).await.unwrap().is_none());
    let r = s
        .apply(&st, &e, at("2026-11-29T09:00:00Z"), 1_000, T + 1_000)
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        ApplyOutcome::Applied,
        "forgotten after retention"
    );
}

pub async fn the_reaper_removes_exactly_the_expired_records(b: &mut dyn Backend) {
    let s = b.store();
    for i in 0..10u64 {
        claim(&*s, &format!("short-{i}"), 100 + i, T).await;
        claim(&*s, &format!("long-{i}"), 10_000, T).await;
    }
    let (token, _) = claim(&*s, "extended", 100, T).await;
    s.extend(&key("extended"), token, ttl(10_000), T)
        .await
        .unwrap();
    s.apply(&key("s"), &key("old"), at("2026-01-01T00:00:00Z"), 50, T)
        .await
        .unwrap();
    s.apply(
        &key("s2"),
        &key("new"),
        at("2026-01-01T00:00:00Z"),
        50_000,
        T,
    )
    .await
    .unwrap();

    let reaper = Reaper::new(
        s.clone(),
        Arc::new(dedupd::clock::ManualClock::new(T)),
        std::time::Duration::from_secs(1),
        1_000,
    );
    let now = T + 109;
    let report = reaper.purge_once(now).await.unwrap();
    if b.expires_by_itself() {
        assert_eq!(report.total(), 0, "nothing for the reaper to do");
    } else {
        assert_eq!((report.claims, report.events, report.heads), (10, 1, 1));
        assert!(s.next_expiry().await.unwrap().unwrap() > now);
    }
    for i in 0..10 {
        assert!(
            s.get(&key(&format!("short-{i}")), now)
                .await
                .unwrap()
                .is_none()
        );
    }
    assert!(s.head(&key("s"), now).await.unwrap().is_none());
    for i in 0..10 {
        assert!(
            s.get(&key(&format!("long-{i}")), now)
                .await
                .unwrap()
                .is_some()
        );
    }
    assert!(
        s.get(&key("extended"), now).await.unwrap().is_some(),
        "its old expiry entry did not remove it"
    );
    assert!(s.head(&key("s2"), now).await.unwrap().is_some());
    // Nothing more is due: a second pass removes nothing.
    assert_eq!(reaper.purge_once(now).await.unwrap().total(), 0);
}

pub async fn the_reaper_works_in_bounded_batches(b: &mut dyn Backend) {
    if b.expires_by_itself() {
        return;
    }
    let s = b.store();
    for i in 0..25 {
        claim(&*s, &format!("k{i}"), 10, T).await;
    }
    let first = s.purge_expired(T + 10, 10).await.unwrap();
    assert_eq!((first.claims, first.more), (10, true));
    let reaper = Reaper::new(
        s.clone(),
        Arc::new(dedupd::clock::ManualClock::new(T)),
        std::time::Duration::from_secs(1),
        4,
    );
    assert_eq!(reaper.purge_once(T + 10).await.unwrap().claims, 15);
    assert_eq!(s.next_expiry().await.unwrap(), None);
}

fn result(text: &str) -> ClaimResult {
    ClaimResult::from_stored(text).unwrap()
}

/// A done keeps the work's result, exactly as given: a later claim and a
/// read of the key get it, a repeated done keeps the first, a done without
/// one keeps none, and all of it survives a restart. A result as large as
/// the default cap (64 KiB) and one a float would round included.
pub async fn a_done_keeps_its_result_for_repeats_and_restarts(b: &mut dyn Backend) {
    let s = b.store();
    let first = result(r#"{"charge": "ch_1", "amount": 12345678901234567890123, "ok": true}"#);
    let large = result(&format!("\"{}\"", "x".repeat(64 * 1024 - 2)));
    // processing → done with a result
    let (token, fence) = claim(&*s, "p", 1_000, T).await;
    assert_eq!(
        s.done_with(&key("p"), token, ttl(5_000), Some(first.clone()), T + 1)
            .await
            .unwrap(),
        DoneOutcome::Done {
            expires_at_ms: T + 5_001
        }
    );
    // a repeated done, with another result: ok, the first one stays
    assert_eq!(
        s.done_with(&key("p"), token, ttl(9_000), Some(result("2")), T + 2)
            .await
            .unwrap(),
        DoneOutcome::Done {
            expires_at_ms: T + 5_001
        }
    );
    // absent → done with a result; and a done with none
    s.done_with(
        &key("a"),
        Token::random(),
        ttl(5_000),
        Some(large.clone()),
        T,
    )
    .await
    .unwrap();
    let (plain, _) = claim(&*s, "n", 1_000, T).await;
    s.done(&key("n"), plain, ttl(5_000), T).await.unwrap();
    for restart in [false, true] {
        if restart {
            b.restart().await;
        }
        let s = b.store();
        let view = s.get(&key("p"), T + 3).await.unwrap().unwrap();
        assert_eq!(
            (view.state, view.fence, view.result.as_ref()),
            (ClaimState::Done, fence, Some(&first)),
            "restarted: {restart}"
        );
        assert_eq!(
            s.claim(&key("p"), ttl(1_000), None, T + 3).await.unwrap(),
            ClaimOutcome::Done {
                expires_at_ms: T + 5_001,
                result: Some(first.clone()),
            },
            "restarted: {restart}"
        );
        assert_eq!(
            s.get(&key("a"), T + 3).await.unwrap().unwrap().result,
            Some(large.clone()),
            "restarted: {restart}"
        );
        assert_eq!(
            s.claim(&key("n"), ttl(1_000), None, T + 3).await.unwrap(),
            ClaimOutcome::Done {
                expires_at_ms: T + 5_000,
                result: None,
            },
            "restarted: {restart}"
        );
        // At its expiry the record is gone, result and all.
        assert_eq!(s.get(&key("p"), T + 5_001).await.unwrap(), None);
    }
    // Expired, the key is claimable again, and a new claim has no result.
    let s = b.store();
    let (again, _) = claim(&*s, "p", 1_000, T + 5_001).await;
    assert_eq!(
        s.get(&key("p"), T + 5_002).await.unwrap().unwrap().result,
        None
    );
    s.release(&key("p"), again, T + 5_002).await.unwrap();
}

pub async fn state_survives_a_restart(b: &mut dyn Backend) {
    let s = b.store();
    let (token, fence) = claim(&*s, "k", 60_000, T).await;
    s.apply(&key("s"), &key("e"), at("2026-11-29T10:00:00Z"), 60_000, T)
        .await
        .unwrap();
    drop(s);
    b.restart().await;
    let s = b.store();
    let view = s.get(&key("k"), T).await.unwrap().unwrap();
    assert_eq!(view.fence, fence);
    assert_eq!(
        s.head(&key("s"), T).await.unwrap().unwrap().event_id,
        key("e")
    );
    assert_eq!(
        s.release(&key("k"), token, T).await.unwrap(),
        ReleaseOutcome::Released
    );
}

pub async fn sixty_four_concurrent_claims_give_one_owner(b: &mut dyn Backend) {
    let s = b.store();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.claim(&key("hot"), ttl(1_000), None, T).await.unwrap() })
        })
        .collect();
    let mut claimed = 0;
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Claimed { .. } => claimed += 1,
            ClaimOutcome::Busy { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(claimed, 1);
}

pub async fn thirty_two_concurrent_applies_give_one_applied(b: &mut dyn Backend) {
    let s = b.store();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                s.apply(&key("s"), &key("e"), at("2026-11-29T10:00:00Z"), 60_000, T)
                    .await
                    .unwrap()
                    .outcome
            })
        })
        .collect();
    let mut applied = 0;
    for t in tasks {
        match t.await.unwrap() {
            ApplyOutcome::Applied => applied += 1,
            ApplyOutcome::Duplicate => {}
            ApplyOutcome::Stale => panic!("stale"),
        }
    }
    assert_eq!(applied, 1);
}

pub async fn the_background_reaper_wakes_for_the_next_expiry_and_stops_when_told(
    b: &mut dyn Backend,
) {
    if b.expires_by_itself() {
        return;
    }
    let s = b.store();
    let clock = dedupd::clock::ManualClock::new(T);
    claim(&*s, "soon", 50, T).await;
    claim(&*s, "later", 3_600_000, T).await;
    // The interval is far off: only the next expiry can wake the reaper.
    let reaper = Reaper::new(
        s.clone(),
        Arc::new(clock.clone()),
        std::time::Duration::from_secs(3600),
        100,
    );
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(reaper.run(stop_rx));
    clock.advance(std::time::Duration::from_millis(50));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.next_expiry().await.unwrap() != Some(T + 3_600_000) {
        assert!(
            std::time::Instant::now() < deadline,
            "the reaper never removed the expired claim"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(s.get(&key("later"), T + 50).await.unwrap().is_some());
    stop.send(true).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}

pub async fn names_with_braces_and_colons_never_collide(b: &mut dyn Backend) {
    let s = b.store();
    let t = at("2026-11-29T10:00:00Z");
    // In a naive Redis layout the head of stream "s}:e:a/x" and the record
    // of event "x}:head" in stream "s" would be one key.
    let r = s
        .apply(&key("s}:e:a/x"), &key("y"), t, 60_000, T)
        .await
        .unwrap();
    assert_eq!(r.outcome, ApplyOutcome::Applied);
    let r = s
        .apply(&key("s"), &key("x}:head"), t, 60_000, T)
        .await
        .unwrap();
    assert_eq!(r.outcome, ApplyOutcome::Applied);
    assert_eq!(
        s.head(&key("s}:e:a/x"), T).await.unwrap().unwrap().event_id,
        key("y")
    );
    for k in ["{a}", "a", "{a", "a}", "}{", ":fence", "c:x"] {
        claim(&*s, k, 1_000, T).await;
    }
    assert_eq!(
        s.get(&key("{a}"), T).await.unwrap().unwrap().state,
        ClaimState::Processing
    );
}

pub async fn created_at_is_compared_to_the_nanosecond_also_before_1970(b: &mut dyn Backend) {
    let s = b.store();
    let apply = |stream: &'static str, id: &'static str, ts: &'static str| {
        let s = s.clone();
        async move {
            s.apply(&key(stream), &key(id), at(ts), 60_000, T)
                .await
                .unwrap()
                .outcome
        }
    };
    assert_eq!(
        apply("moon", "e1", "1969-07-20T20:17:40.000000001Z").await,
        ApplyOutcome::Applied
    );
    assert_eq!(
        apply("moon", "e2", "1969-07-20T20:17:40Z").await,
        ApplyOutcome::Stale
    );
    assert_eq!(
        apply("moon", "e3", "1969-07-20T21:17:40.000000001+01:00").await,
        ApplyOutcome::Applied
    );
    let head = s.head(&key("moon"), T).await.unwrap().unwrap();
    assert_eq!(
        (head.event_id, head.created_at),
        (key("e3"), at("1969-07-20T20:17:40.000000001Z"))
    );
    assert_eq!(
        apply("now", "n1", "2026-11-29T10:00:00.123456789Z").await,
        ApplyOutcome::Applied
    );
    assert_eq!(
        apply("now", "n2", "2026-11-29T10:00:00.123456788Z").await,
        ApplyOutcome::Stale
    );
    assert_eq!(
        apply("now", "n3", "2026-11-29T10:00:00.12345679Z").await,
        ApplyOutcome::Applied
    );
}

pub async fn an_event_id_stays_a_duplicate_on_other_streams_for_the_whole_retention(
    b: &mut dyn Backend,
) {
    let s = b.store();
    let t = at("2026-11-29T10:00:00Z");
    let hour = 3_600_000;
    assert_eq!(
        s.apply(&key("a"), &key("e"), t, hour, T)
            .await
            .unwrap()
            .outcome,
        ApplyOutcome::Applied
    );
    // Well past any short-lived bookkeeping, still inside the retention.
    for later in [T + 120_000, T + hour - 1] {
        let r = s.apply(&key("b"), &key("e"), t, hour, later).await.unwrap();
        assert_eq!(r.outcome, ApplyOutcome::Duplicate, "at +{} ms", later - T);
    }
    let r = s
        .apply(&key("b"), &key("e"), t, hour, T + hour)
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        ApplyOutcome::Applied,
        "forgotten after the retention"
    );
}
