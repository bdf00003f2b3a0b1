//! The fleet's shared delivery lanes ([`Lanes`], `lanes.lua`) against
//! real redis-servers, with explicit times: several instances' handles on
//! one lane share one token bucket, one `Retry-After` hold and one breaker
//! with one probe at a time; on the three-master cluster each lane is one
//! slot and the lanes spread over the masters.

use dedupd::store::inbox::Inbox;
use dedupd::store::lanes::{
    FleetLane, GateAsk, LaneGate, LaneReport, LaneState, LaneTransition, Lanes, Outcome,
};
use dedupd::store::redis::RedisInbox;

use crate::backends::redis::{shared_cluster, shared_inbox};
use crate::support::redis::RedisServer;

const T: u64 = 1_800_000_000_000;

/// One instance's handle on the shared inbox.
fn instance(url: String, nodes: Vec<String>, prefix: &str) -> RedisInbox {
    shared_inbox(url, nodes, prefix, 4)
}

fn lanes(inbox: &RedisInbox) -> &dyn Lanes {
    inbox.lanes().expect("the shared inbox shares its lanes")
}

/// Asks for `want` at `rate` per second with `burst`.
fn ask(want: u32, rate: Option<(f64, u32)>) -> GateAsk {
    GateAsk {
        want,
        rate: rate.map(|(per_s, burst)| (per_s / 1000.0, burst)),
        probe_until: 0,
    }
}

fn report(outcome: Outcome) -> LaneReport {
    LaneReport {
        outcome,
        pause_after: 3,
        backoff_min_ms: 1_000,
        backoff_max_ms: 8_000,
    }
}

async fn gate(l: &dyn Lanes, lane: &str, a: &GateAsk, now: u64) -> LaneGate {
    l.gate(lane, a, now).await.unwrap()
}

async fn tell(l: &dyn Lanes, lane: &str, outcome: Outcome, now: u64) -> LaneGate {
    l.report(lane, &report(outcome), now).await.unwrap()
}

/// Three handles asking all they can, in turn, every 10 ms for 10 s: the
/// fleet never starts more than `burst + rate × t` over any `t` from the
/// start, and starts about the rate (tokens neither multiply nor leak).
async fn one_bucket_for_three(handles: &[RedisInbox; 3], lane: &str) {
    let rate = Some((20.0, 10));
    let mut granted = 0u64;
    for step in 0..1000u64 {
        let now = T + step * 10;
        for (i, h) in handles.iter().enumerate() {
            let g = gate(lanes(h), lane, &ask(50, rate), now + i as u64).await;
            if g.granted == 0 {
                assert_eq!(g.state, LaneState::Limited);
                assert!(g.until > now, "the next token is ahead: {g:?}");
            }
            granted += u64::from(g.granted);
        }
        // burst + rate × elapsed, elapsed since the bucket started empty.
        let bound = 10 + (step * 10 + 2) * 20 / 1000;
        assert!(
            granted <= bound,
            "{granted} started by {step}0 ms > {bound}"
        );
    }
    // It starts empty, so no burst: about 20/s over the 10 s.
    assert!((195..=200).contains(&granted), "{granted} in 10 s at 20/s");
}

#[tokio::test]
async fn three_instances_share_one_token_bucket() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let handles = [0, 1, 2].map(|_| instance(server.url(), Vec::new(), "bucket"));
    one_bucket_for_three(&handles, "sume").await;
    // Tokens not used go back, up to the burst; a new rate keeps them, up
    // to its burst.
    let l = lanes(&handles[0]);
    let now = T + 60_000;
    let full = gate(l, "sume", &ask(100, Some((20.0, 10))), now).await;
    assert_eq!(full.granted, 10, "a quiet minute refills to the burst only");
    tell(l, "sume", Outcome::Refund(4), now).await;
    tell(l, "sume", Outcome::Refund(40), now).await;
    assert_eq!(
        gate(l, "sume", &ask(100, Some((20.0, 10))), now)
            .await
            .granted,
        10
    );
    let changed = gate(l, "sume", &ask(100, Some((5.0, 4))), now + 60_000).await;
    assert_eq!(changed.granted, 4, "refilled, up to the new burst");
    let empty = gate(l, "sume", &ask(100, Some((5.0, 4))), now + 60_000).await;
    assert_eq!((empty.granted, empty.state), (0, LaneState::Limited));
    assert_eq!(empty.until, now + 60_000 + 200, "one token at 5/s");
    // Two instances that disagree on the rate (a rolling reload) do not
    // keep emptying the bucket: tokens still come at about either rate.
    let b = lanes(&handles[1]);
    let mut granted = 0;
    for step in 1..=20u64 {
        let at = now + 60_000 + step * 300;
        let (who, rate) = if step % 2 == 0 {
            (l, (5.0, 4))
        } else {
            (b, (6.0, 4))
        };
        granted += gate(who, "sume", &ask(100, Some(rate)), at).await.granted;
    }
    assert!((29..=36).contains(&granted), "{granted} in 6 s at 5 or 6/s");
    let now = now + 60_000 + 6_000;
    // Without a rate, no bucket: everything asked is granted.
    assert_eq!(
        gate(l, "sume", &ask(7, None), now + 60_001).await.granted,
        7
    );
    let state = l.state("sume", now + 60_001).await.unwrap();
    assert_eq!(
        state,
        FleetLane::default(),
        "no bucket, hold or breaker left"
    );
}

#[tokio::test]
async fn a_retry_after_from_one_instance_holds_every_instance_until_its_end() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "hold");
    let b = instance(server.url(), Vec::new(), "hold");
    let told = tell(
        lanes(&a),
        "sume.billing",
        Outcome::Failed {
            hold_until: Some(T + 3_000),
        },
        T,
    )
    .await;
    assert_eq!((told.state, told.until), (LaneState::Held, T + 3_000));
    // An earlier hold reported later does not shorten it; a later one wins.
    tell(
        lanes(&b),
        "sume.billing",
        Outcome::Failed {
            hold_until: Some(T + 2_000),
        },
        T + 1,
    )
    .await;
    let held = gate(lanes(&b), "sume.billing", &ask(5, None), T + 2_500).await;
    assert_eq!(
        (held.granted, held.state, held.until),
        (0, LaneState::Held, T + 3_000)
    );
    let state = lanes(&a).state("sume.billing", T + 2_500).await.unwrap();
    assert_eq!(state.held_until, Some(T + 3_000));
    assert_eq!(state.failures, 2);
    // Another lane is not held.
    assert_eq!(
        gate(lanes(&b), "sume", &ask(5, None), T + 2_500)
            .await
            .granted,
        5
    );
    let over = gate(lanes(&b), "sume.billing", &ask(5, None), T + 3_000).await;
    assert_eq!((over.granted, over.state), (5, LaneState::Open));
    assert_eq!(
        lanes(&a)
            .state("sume.billing", T + 3_000)
            .await
            .unwrap()
            .held_until,
        None
    );
}

#[tokio::test]
async fn one_breaker_pauses_once_lets_one_probe_through_and_resumes_once() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let handles = [0, 1, 2].map(|_| instance(server.url(), Vec::new(), "breaker"));
    let l = |i: usize| lanes(&handles[i]);
    let failed = Outcome::Failed { hold_until: None };
    // Three failures from three instances: one of them pauses the lane.
    let mut paused = 0;
    for i in 0..3 {
        let g = tell(l(i), "sume", failed, T + i as u64).await;
        if g.transition == Some(LaneTransition::Paused) {
            paused += 1;
            assert_eq!(
                (g.state, g.until, g.failures),
                (LaneState::Paused, T + 2 + 1_000, 3)
            );
        }
    }
    assert_eq!(paused, 1);
    // A late failure while paused changes nothing but the count.
    let late = tell(l(0), "sume", failed, T + 10).await;
    assert_eq!((late.transition, late.failures), (None, 4));
    let g = gate(l(1), "sume", &ask(5, None), T + 500).await;
    assert_eq!(
        (g.granted, g.state, g.until),
        (0, LaneState::Paused, T + 1_002)
    );
    // The pause over: the first asker gets the probe, alone.
    let probe_ask = GateAsk {
        probe_until: T + 31_002,
        ..ask(5, None)
    };
    let p = gate(l(1), "sume", &probe_ask, T + 1_002).await;
    assert_eq!((p.granted, p.state), (1, LaneState::Probe));
    for i in 0..3 {
        let g = gate(l(i), "sume", &probe_ask, T + 1_100).await;
        assert_eq!(
            (g.granted, g.state, g.until),
            (0, LaneState::Probing, T + 31_002)
        );
    }
    let state = l(2).state("sume", T + 1_100).await.unwrap();
    assert!(state.probing && state.paused_until.is_none(), "{state:?}");
    // Someone else's failure does not end the probe; its own does, longer.
    assert_eq!(tell(l(0), "sume", failed, T + 1_200).await.transition, None);
    let again = tell(l(1), "sume", failed, T + 1_300).await;
    assert_eq!(again.transition, Some(LaneTransition::PausedAgain));
    assert_eq!(
        again.until,
        T + 1_300 + 2_000,
        "the second pause is twice the first"
    );
    // The next probe: taken, handed on unused (neutral), taken by another.
    let next = T + 3_300;
    assert_eq!(
        gate(l(0), "sume", &probe_ask, next).await.state,
        LaneState::Probe
    );
    tell(l(0), "sume", Outcome::Neutral, next).await;
    assert_eq!(
        gate(l(2), "sume", &probe_ask, next).await.state,
        LaneState::Probe
    );
    // Its holder dies: once its hold ends, another takes the probe.
    let dead = gate(l(0), "sume", &probe_ask, T + 31_002).await;
    assert_eq!((dead.granted, dead.state), (1, LaneState::Probe));
    // A success resumes the lane, once.
    let ok = tell(l(0), "sume", Outcome::Succeeded, T + 31_100).await;
    assert_eq!(
        (ok.transition, ok.state, ok.failures),
        (Some(LaneTransition::Resumed), LaneState::Open, 0)
    );
    let ok = tell(l(2), "sume", Outcome::Succeeded, T + 31_101).await;
    assert_eq!(ok.transition, None);
    assert_eq!(
        gate(l(1), "sume", &ask(5, None), T + 31_102).await.granted,
        5
    );
    assert_eq!(
        l(1).state("sume", T + 31_102).await.unwrap(),
        FleetLane::default()
    );
    // A new destination: the first instance to reload forgets the lane's
    // state; the next ones, reloading with the same destination later,
    // keep what the new destination earned meanwhile.
    let hold = |until: u64| Outcome::Failed {
        hold_until: Some(until),
    };
    tell(l(1), "sume", hold(T + 99_000), T + 31_200).await;
    assert!(l(1).reset("sume", "dest-2").await.unwrap());
    assert_eq!(
        gate(l(0), "sume", &ask(5, None), T + 31_300).await.granted,
        5
    );
    tell(l(0), "sume", hold(T + 40_000), T + 31_400).await;
    assert!(!l(2).reset("sume", "dest-2").await.unwrap());
    let held = gate(l(2), "sume", &ask(5, None), T + 31_500).await;
    assert_eq!((held.state, held.until), (LaneState::Held, T + 40_000));
}

/// On a cluster: each lane is one slot, so its bucket is exact there too;
/// and the lanes spread over every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_lane_is_one_slot_and_the_lanes_spread_over_the_masters() {
    let cluster = shared_cluster().await;
    let handles =
        [0, 1, 2].map(|_| instance(String::new(), cluster.nodes.clone(), "lanes-cluster"));
    one_bucket_for_three(&handles, "sume.billing").await;
    for n in 0..30 {
        let lane = format!("s{n}.d");
        tell(
            lanes(&handles[n % 3]),
            &lane,
            Outcome::Failed {
                hold_until: Some(T + 5_000),
            },
            T,
        )
        .await;
        let g = gate(lanes(&handles[(n + 1) % 3]), &lane, &ask(1, None), T + 1).await;
        assert_eq!(g.state, LaneState::Held, "{lane}");
    }
    let mut total = 0;
    for i in 0..cluster.nodes.len() {
        let here = cluster
            .cli(i, &["--scan", "--pattern", "lanes-cluster:{d:*"])
            .unwrap()
            .lines()
            .count();
        assert!(here > 0, "master {i} holds no lane");
        total += here;
    }
    assert_eq!(total, 31);
}

/// An idle lane's key goes by itself: an hour past the last time it holds.
#[tokio::test]
async fn a_lanes_key_expires_an_hour_after_what_it_holds() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "expiry");
    tell(
        lanes(&a),
        "sume",
        Outcome::Failed {
            hold_until: Some(T + 5_000),
        },
        T,
    )
    .await;
    let ttl: u64 = server.cli(&["pttl", "expiry:{d:sume}"]).parse().unwrap();
    assert!(
        ttl > 3_600_000 && ttl <= 3_605_000,
        "an hour past the hold's end: {ttl} ms"
    );
}

/// Once: a lane's key that no instance wrote (another program's string, a
/// hand edit, `inf`, a time in 40 days) failed every gate (`WRONGTYPE`, a
/// reply the instance could not read) or held the lane until that time,
/// and the key's expiry was renewed at each ask: the source delivered
/// nothing until someone deleted it. Such a key, or field, is now taken as
/// absent: the lane starts as new.
#[tokio::test]
async fn a_lanes_key_no_instance_wrote_is_taken_as_absent_not_obeyed() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "planted");
    let key = "planted:{d:sume}";
    server.cli(&["set", key, "garbage"]);
    let g = gate(lanes(&a), "sume", &ask(2, None), T).await;
    assert_eq!((g.state, g.granted), (LaneState::Open, 2), "a string");
    let far = (T + 40 * 86_400_000).to_string();
    let planted: [&[&str]; 8] = [
        &["ra", "inf"],
        &["ra", "nan"],
        &["ra", "-1"],
        &["ra", &far],
        &["bf", "1e20"],
        &["bf", "-1"],
        &["bs", "x", "bu", "inf"],
        &["bs", "x", "bf", "nan", "bu", &far],
    ];
    for fields in planted {
        server.cli(&["del", key]);
        let mut hset = vec!["hset", key];
        hset.extend_from_slice(fields);
        server.cli(&hset);
        let g = lanes(&a).gate("sume", &ask(2, None), T).await;
        let g = g.unwrap_or_else(|e| panic!("{fields:?}: {e}"));
        assert_eq!((g.state, g.granted), (LaneState::Open, 2), "{fields:?}");
        let seen = lanes(&a).state("sume", T).await.unwrap();
        assert_eq!(seen.held_until, None, "{fields:?}");
        assert!(
            server.cli(&["pttl", key]).parse::<i64>().unwrap() <= 3_600_000,
            "{fields:?}: its expiry follows what it holds"
        );
    }
    // A breaker open with a pause that is no time: its probe goes now.
    server.cli(&["del", key]);
    server.cli(&["hset", key, "bs", "o", "bu", "inf", "bq", "nan"]);
    let g = gate(lanes(&a), "sume", &ask(2, None), T).await;
    assert_eq!((g.state, g.granted), (LaneState::Probe, 1));
}

/// Once: a bucket counted by an instance whose clock ran ten minutes
/// ahead held every other instance ten minutes (no refill before that
/// clock's time, and a "limited" answer that far ahead). The count is now
/// taken as made at the caller's now; and a rate-limited lane keeps its
/// bucket 30 days, so a lane quiet for an hour keeps its burst (its key
/// went after an hour, and the bucket started again empty).
#[tokio::test]
async fn a_bucket_from_a_clock_ahead_refills_from_now_and_outlives_an_idle_hour() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = instance(server.url(), Vec::new(), "skew");
    let b = instance(server.url(), Vec::new(), "skew");
    let one_a_second = ask(1, Some((1.0, 5)));
    let ahead = gate(lanes(&a), "sume", &one_a_second, T + 600_000).await;
    assert_eq!(ahead.state, LaneState::Limited, "a new bucket is empty");
    let g = gate(lanes(&b), "sume", &one_a_second, T).await;
    assert_eq!(g.state, LaneState::Limited);
    assert!(g.until <= T + 1_000, "limited until {}", g.until - T);
    let g = gate(lanes(&b), "sume", &one_a_second, T + 1_000).await;
    assert_eq!((g.state, g.granted), (LaneState::Open, 1));
    let ttl: i64 = server.cli(&["pttl", "skew:{d:sume}"]).parse().unwrap();
    assert!(ttl > 29 * 86_400_000, "kept {ttl} ms");
    // An idle hour later: the burst is there.
    let g = gate(lanes(&b), "sume", &ask(5, Some((1.0, 5))), T + 3_601_000).await;
    assert_eq!((g.state, g.granted), (LaneState::Open, 5));
}
