//! The shared inbox in Redis, against real redis-servers: what the model
//! test (`inbox_model`) does not reach — a cluster, several instances on
//! one inbox, the fixed layout, and the bytes of a body.

use std::time::Duration;

use dedupd::domain::CreatedAt;
use dedupd::store::inbox::{
    EraseOutcome, EventKey, EventStatus, Inbox, IngestOutcome, ListOrder, NewEvent,
    RedeliverOutcome, Renewal, ReplayMark, Retention, Settle, StoredJob,
};
use dedupd::store::redis::RedisInbox;

use crate::backends::redis::{shared_cluster, shared_inbox as inbox};
use crate::support::redis::RedisServer;

const T: u64 = 1_800_000_000_000;
const RETENTION: Retention = Retention {
    delivered_ms: 60_000,
    dead_ms: 120_000,
};

fn event(id: &str, stream: Option<&str>, minute: i128, body: Vec<u8>) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: stream.map(str::to_owned),
        created_at: CreatedAt::from_unix_nanos((1_800_000_000 + minute * 60) * 1_000_000_000),
        received_at_ms: T,
        headers: vec![("webhook-id".into(), id.into())],
        body,
    }
}

/// Delivers everything runnable until nothing is pending.
async fn deliver_all(inbox: &RedisInbox, now: u64) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..1000 {
        let due = inbox
            .due_events(now, vec![("sume".into(), 50)], u64::MAX)
            .await
            .unwrap();
        if due[0].events.is_empty() {
            break;
        }
        let keys = due[0]
            .events
            .iter()
            .map(|e| (e.key(), now + 30_000))
            .collect();
        let leased = inbox.lease(keys, Some(RETENTION), now).await.unwrap();
        for l in leased.leased {
            let e = due[0]
                .events
                .iter()
                .find(|e| e.event_id == l.event_id)
                .unwrap();
            let apply = e.stream.as_ref().map(|_| {
                let k = dedupd::domain::Key::parse("x", "k").unwrap();
                let sk = dedupd::domain::ScopedKey::api(&k);
                (sk.clone(), sk, e.created_at, 60_000)
            });
            inbox
                .settle_delivered(&e.key(), l.lease, apply, None, RETENTION, now)
                .await
                .unwrap();
            order.push(l.event_id);
        }
    }
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_one_sources_buckets_spread_over_every_master() {
    let cluster = shared_cluster().await;
    let inbox = inbox(String::new(), cluster.nodes.clone(), "spread-inbox", 16);
    for n in 0..120i128 {
        let stream = format!("run_{}", n % 40);
        let e = event(&format!("e{n:03}"), Some(&stream), n, b"{}".to_vec());
        assert_eq!(inbox.ingest(e, T).await.unwrap(), IngestOutcome::Accepted);
    }
    for i in 0..cluster.nodes.len() {
        let here = cluster
            .cli(i, &["--scan", "--pattern", "spread-inbox:{i:sume:*}:e:*"])
            .unwrap()
            .lines()
            .count();
        assert!(here > 0, "master {i} holds none of the source's events");
    }
    let order = deliver_all(&inbox, T + 1).await;
    assert_eq!(order.len(), 120);
    // Each stream in created_at order (e{n} of stream n % 40, n growing).
    for s in 0..40 {
        let mine: Vec<&String> = order
            .iter()
            .filter(|id| id[1..].parse::<i128>().unwrap() % 40 == s)
            .collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "run_{s}: {mine:?}");
    }
    let summary = inbox.inbox_summary().await.unwrap();
    assert_eq!(summary.len(), 1);
    assert_eq!((summary[0].pending, summary[0].delivered), (0, 120));
    // A listing pages over every bucket, in receive order then id.
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = inbox
            .list_events(
                "sume",
                EventStatus::Delivered,
                ListOrder::OldestFirst,
                after,
                7,
            )
            .await
            .unwrap();
        listed.extend(page.into_iter().map(|e| e.event_id));
        match next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    let mut want: Vec<String> = (0..120).map(|n| format!("e{n:03}")).collect();
    want.sort();
    assert_eq!(listed, want);
}

#[tokio::test]
async fn an_instance_with_another_bucket_count_is_refused_naming_both() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let first = inbox(server.url(), Vec::new(), "layout", 4);
    let e = event("a", Some("run"), 0, b"{}".to_vec());
    assert_eq!(first.ingest(e, T).await.unwrap(), IngestOutcome::Accepted);
    let second = inbox(server.url(), Vec::new(), "layout", 8);
    let refused = second.ready().await.unwrap_err().chain().to_string();
    assert!(
        refused.contains("buckets=4") && refused.contains("buckets=8"),
        "{refused}"
    );
    let e = event("b", Some("run"), 1, b"{}".to_vec());
    assert!(
        second.ingest(e, T).await.is_err(),
        "nothing stored elsewhere"
    );
    assert!(first.ready().await.is_ok());
    assert!(first.inbox_event("sume", "b").await.unwrap().is_none());
}

/// Two instances on one inbox: while one has a stream's event leased, an
/// older event of that stream that reaches the other waits; once the
/// leased one is delivered, the older one is stale.
#[tokio::test]
async fn a_stream_stays_with_its_leased_event_across_instances() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = inbox(server.url(), Vec::new(), "turns", 4);
    let b = inbox(server.url(), Vec::new(), "turns", 4);
    let newer = event("newer", Some("run"), 5, b"{}".to_vec());
    a.ingest(newer, T).await.unwrap();
    let due = a
        .due_events(T, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    let key = due[0].events[0].key();
    let leased = a
        .lease(vec![(key.clone(), T + 30_000)], Some(RETENTION), T)
        .await
        .unwrap();
    assert_eq!(leased.leased.len(), 1);
    let older = event("older", Some("run"), 0, b"{}".to_vec());
    b.ingest(older, T + 1).await.unwrap();
    let due = b
        .due_events(T + 2, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    assert!(
        due[0].events.is_empty(),
        "the older event waits while the newer one is in flight: {:?}",
        due[0].events
    );
    let k = dedupd::domain::ScopedKey::api(&dedupd::domain::Key::parse("x", "k").unwrap());
    let created = CreatedAt::from_unix_nanos((1_800_000_000 + 5 * 60) * 1_000_000_000);
    a.settle_delivered(
        &key,
        leased.leased[0].lease,
        Some((k.clone(), k, created, 60_000)),
        None,
        RETENTION,
        T + 3,
    )
    .await
    .unwrap();
    let due = b
        .due_events(T + 4, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    assert_eq!(due[0].events.len(), 1);
    assert_eq!(due[0].events[0].event_id, "older");
    let leased = b
        .lease(
            vec![(due[0].events[0].key(), T + 30_000)],
            Some(RETENTION),
            T + 4,
        )
        .await
        .unwrap();
    assert_eq!(leased.stale, [("sume".to_owned(), "older".to_owned())]);
    let e = a.inbox_event("sume", "older").await.unwrap().unwrap();
    assert_eq!(e.status, EventStatus::Stale);
}

/// An instance that died with a stream's event leased: once the lease ran
/// out, the stream's oldest event goes first, whichever instance asks.
#[tokio::test]
async fn a_lease_that_ran_out_hands_the_stream_to_its_oldest_event() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let dead = inbox(server.url(), Vec::new(), "expiry", 4);
    let alive = inbox(server.url(), Vec::new(), "expiry", 4);
    dead.ingest(event("newer", Some("run"), 5, b"{}".to_vec()), T)
        .await
        .unwrap();
    let key = EventKey::new("sume", "newer", Some("run"));
    let leased = dead
        .lease(vec![(key.clone(), T + 30_000)], Some(RETENTION), T)
        .await
        .unwrap();
    assert_eq!(leased.leased.len(), 1);
    alive
        .ingest(event("older", Some("run"), 0, b"{}".to_vec()), T + 1)
        .await
        .unwrap();
    let later = T + 30_001;
    let gone = alive
        .lease(vec![(key.clone(), later + 30_000)], Some(RETENTION), later)
        .await
        .unwrap();
    assert!(gone.leased.is_empty(), "the newer event waits its turn");
    assert_eq!(deliver_all(&alive, later).await, ["older", "newer"]);
    // The dead instance's late settle changes nothing.
    dead.settle(
        &key,
        leased.leased[0].lease,
        Settle::Dead {
            error: "late".into(),
        },
        RETENTION,
        later + 1,
    )
    .await
    .unwrap();
    let e = alive.inbox_event("sume", "newer").await.unwrap().unwrap();
    assert_eq!(e.status, EventStatus::Delivered);
}

/// Bodies are stored byte for byte (not UTF-8, a megabyte), and ids may
/// hold what a key name of Redis would otherwise misread.
#[tokio::test]
async fn bodies_and_odd_ids_come_back_as_they_went_in() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "bytes", 4);
    let body: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    for id in ["a:b", "{tag}", "x}y{z", "ümlaut id", "s:0"] {
        let e = event(id, Some(id), 0, body.clone());
        assert_eq!(inbox.ingest(e, T).await.unwrap(), IngestOutcome::Accepted);
        let got = inbox.inbox_event("sume", id).await.unwrap().unwrap();
        assert_eq!(got.body, body, "{id}");
        assert_eq!(got.stream.as_deref(), Some(id));
        assert_eq!(got.headers, [("webhook-id".to_owned(), id.to_owned())]);
        assert!(
            inbox
                .knows_event(&EventKey::new("sume", id, Some(id)), T)
                .await
                .unwrap()
        );
    }
    let (listed, _) = inbox
        .list_events(
            "sume",
            EventStatus::Pending,
            ListOrder::NewestFirst,
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 5);
    assert!(
        listed
            .iter()
            .all(|e| e.body.is_empty() && e.body_bytes == body.len())
    );
    assert_eq!(deliver_all(&inbox, T + 1).await.len(), 5);
}

fn cli(server: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(&server.socket)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Deletes the row of event `id` by hand, as an operator might, or as an
/// `allkeys-*` eviction policy would.
fn lose_row(server: &RedisServer, prefix: &str, id: &str) {
    let keys = cli(
        server,
        &[
            "--scan",
            "--pattern",
            &format!("{prefix}:{{i:sume:*}}:e:{id}"),
        ],
    );
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    cli(server, &["DEL", keys[0]]);
}

/// A settled event whose row is gone is dropped from the expiry index:
/// the reaper's next pass finds nothing more (it looped on it forever).
#[tokio::test]
async fn a_settled_event_whose_row_is_gone_leaves_nothing_for_the_reaper() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "ghost-x", 4);
    inbox
        .ingest(event("x", None, 0, b"{}".to_vec()), T)
        .await
        .unwrap();
    assert_eq!(deliver_all(&inbox, T).await, ["x"]);
    lose_row(&server, "ghost-x", "x");
    let later = T + RETENTION.delivered_ms + 1;
    assert_eq!(inbox.purge_settled(later, 100).await.unwrap(), (0, false));
    assert_eq!(inbox.purge_settled(later, 100).await.unwrap(), (0, false));
}

/// A pending event whose row is gone, holding its stream's turn or queued
/// behind it: the stream moves on past it, and ingest into the stream
/// keeps working (a script failed part-way on it before).
#[tokio::test]
async fn a_stream_moves_on_past_a_pending_event_whose_row_is_gone() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "ghost-s", 4);
    for (id, minute) in [("a", 0), ("b", 1), ("c", 2), ("d", 3)] {
        let e = event(id, Some("s"), minute, b"{}".to_vec());
        inbox.ingest(e, T).await.unwrap();
    }
    // The turn holder, and one queued behind the next.
    lose_row(&server, "ghost-s", "a");
    lose_row(&server, "ghost-s", "c");
    let e = event("e", Some("s"), 4, b"{}".to_vec());
    assert_eq!(
        inbox.ingest(e, T + 1).await.unwrap(),
        IngestOutcome::Accepted
    );
    assert_eq!(deliver_all(&inbox, T + 2).await, ["b", "d", "e"]);
}

/// A Redis that lost its data (restarted without persistence) gets the
/// layout and the instances' sources back at their next readiness check:
/// another bucket count is refused again, and new events are counted.
#[tokio::test]
async fn after_redis_lost_its_data_readiness_records_the_layout_and_sources_again() {
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = inbox(server.url(), Vec::new(), "lost", 16);
    a.ingest(event("before", Some("s"), 0, b"{}".to_vec()), T)
        .await
        .unwrap();
    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.ready().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "never ready again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = inbox(server.url(), Vec::new(), "lost", 5);
    assert!(b.ready().await.is_err(), "5 buckets beside 16");
    a.ingest(event("after", Some("s"), 1, b"{}".to_vec()), T + 1)
        .await
        .unwrap();
    let summary = a.inbox_summary().await.unwrap();
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(summary[0].pending, 1);
}

/// An id posted with two streams is stored twice (docs/redis.md); the
/// operator's redeliver finds the copy that can be redelivered.
#[tokio::test]
async fn redeliver_finds_the_dead_copy_of_an_id_posted_with_two_streams() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "twice", 16);
    // Two streams in two buckets.
    let streams: Vec<String> = (0..64).map(|i| format!("run_{i}")).collect();
    let mut copies = Vec::new();
    for s in &streams {
        let e = event("x", Some(s), 0, b"{}".to_vec());
        if inbox.ingest(e, T).await.unwrap() == IngestOutcome::Accepted {
            copies.push(s.clone());
        }
        if copies.len() == 2 {
            break;
        }
    }
    assert_eq!(copies.len(), 2, "two streams in two buckets");
    for (i, s) in copies.iter().enumerate() {
        let key = EventKey::new("sume", "x", Some(s));
        let leased = inbox
            .lease(vec![(key.clone(), T + 30_000)], Some(RETENTION), T)
            .await
            .unwrap();
        let settle = if i == 0 {
            Settle::Delivered { attempted: true }
        } else {
            Settle::Dead {
                error: "HTTP 500".into(),
            }
        };
        inbox
            .settle(&key, leased.leased[0].lease, settle, RETENTION, T)
            .await
            .unwrap();
    }
    assert_eq!(
        inbox.redeliver("sume", "x", T + 1).await.unwrap(),
        dedupd::store::inbox::RedeliverOutcome::Requeued
    );
}

/// Leases event `key` at `now` and settles its turn with `settle` (an
/// attempt made): the lease generation it had.
async fn turn(inbox: &RedisInbox, key: &EventKey, settle: Settle, now: u64) -> u64 {
    let leased = inbox
        .lease(vec![(key.clone(), now + 30_000)], None, now)
        .await
        .unwrap();
    assert_eq!(leased.leased.len(), 1, "{key:?} is not runnable at {now}");
    let lease = leased.leased[0].lease;
    inbox
        .settle(key, lease, settle, RETENTION, now)
        .await
        .unwrap();
    lease
}

fn mark(job: &str, base_attempts: u32) -> Option<ReplayMark> {
    Some(ReplayMark {
        job: job.into(),
        base_attempts,
    })
}

/// A bulk job's replay puts a delivered event back to pending with its
/// attempts kept and a mark naming the job and those attempts, which the
/// lease hands to the turn; the turn in flight before it is superseded.
/// An operator's redeliver starts afresh and clears the mark.
#[tokio::test]
async fn a_replay_keeps_the_attempts_and_marks_the_event_with_its_job() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "replay", 4);
    inbox
        .ingest(event("x", Some("s"), 0, b"{}".to_vec()), T)
        .await
        .unwrap();
    let key = EventKey::new("sume", "x", Some("s"));
    let retry = Settle::Retry {
        retry_at: T + 1,
        error: "HTTP 503".into(),
        attempted: true,
    };
    turn(&inbox, &key, retry, T).await;
    let before = turn(&inbox, &key, Settle::Delivered { attempted: true }, T + 1).await;
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.replay),
        (EventStatus::Delivered, 2, None)
    );

    assert_eq!(
        inbox.replay("sume", "x", "job_a", T + 2).await.unwrap(),
        RedeliverOutcome::Requeued
    );
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!(e.status, EventStatus::Pending);
    assert_eq!(e.attempts, 2, "attempts continue");
    assert_eq!(e.replay, mark("job_a", 2));
    assert!(e.force, "a delivered event is sent again despite the head");
    assert_eq!(e.lease, before + 1);
    assert_eq!(e.expires_at_ms, 0);
    let (listed, _) = inbox
        .list_events(
            "sume",
            EventStatus::Pending,
            ListOrder::OldestFirst,
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].replay, mark("job_a", 2));
    let summary = inbox.inbox_summary().await.unwrap();
    assert_eq!((summary[0].pending, summary[0].delivered), (1, 0));

    // The turn that delivered it before, settling late, changes nothing.
    inbox
        .settle(
            &key,
            before,
            Settle::Dead {
                error: "late".into(),
            },
            RETENTION,
            T + 3,
        )
        .await
        .unwrap();
    let leased = inbox
        .lease(vec![(key.clone(), T + 30_000)], Some(RETENTION), T + 3)
        .await
        .unwrap();
    assert_eq!(leased.leased.len(), 1, "{leased:?}");
    let l = &leased.leased[0];
    assert_eq!((l.attempts, l.force), (2, true));
    assert_eq!(l.replay, mark("job_a", 2));
    inbox
        .settle(
            &key,
            l.lease,
            Settle::Dead {
                error: "HTTP 500".into(),
            },
            RETENTION,
            T + 4,
        )
        .await
        .unwrap();
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!((e.status, e.attempts), (EventStatus::Dead, 3));
    assert_eq!(e.replay, mark("job_a", 2), "the mark stays once settled");

    // Another job replays it again; a dead event yields to the head.
    assert_eq!(
        inbox.replay("sume", "x", "job_b", T + 5).await.unwrap(),
        RedeliverOutcome::Requeued
    );
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!((e.attempts, e.force), (3, false));
    assert_eq!(e.replay, mark("job_b", 3));
    turn(&inbox, &key, Settle::Stale, T + 6).await;
    assert_eq!(
        inbox.redeliver("sume", "x", T + 7).await.unwrap(),
        RedeliverOutcome::Requeued
    );
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.replay),
        (EventStatus::Pending, 0, None)
    );
}

/// A job that asks twice sends once: the second replay by the same job is
/// refused, whatever the status; a pending, erased or unknown event is
/// not replayed at all.
#[tokio::test]
async fn a_replay_by_the_same_job_twice_is_refused() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "replay-twice", 4);
    inbox
        .ingest(event("x", None, 0, b"{}".to_vec()), T)
        .await
        .unwrap();
    let key = EventKey::new("sume", "x", None);
    assert_eq!(
        inbox.replay("sume", "x", "job_a", T).await.unwrap(),
        RedeliverOutcome::NotRedeliverable(EventStatus::Pending)
    );
    turn(&inbox, &key, Settle::Delivered { attempted: true }, T).await;
    assert_eq!(
        inbox.replay("sume", "x", "job_a", T + 1).await.unwrap(),
        RedeliverOutcome::Requeued
    );
    assert_eq!(
        inbox.replay("sume", "x", "job_a", T + 2).await.unwrap(),
        RedeliverOutcome::NotRedeliverable(EventStatus::Pending)
    );
    turn(&inbox, &key, Settle::Delivered { attempted: true }, T + 3).await;
    assert_eq!(
        inbox.replay("sume", "x", "job_a", T + 4).await.unwrap(),
        RedeliverOutcome::NotRedeliverable(EventStatus::Delivered),
        "the job replayed it already"
    );
    let e = inbox.inbox_event("sume", "x").await.unwrap().unwrap();
    assert_eq!((e.status, e.attempts), (EventStatus::Delivered, 2));
    assert_eq!(e.replay, mark("job_a", 1));
    assert_eq!(
        inbox.replay("sume", "nope", "job_a", T + 4).await.unwrap(),
        RedeliverOutcome::NotFound
    );
    assert_eq!(
        inbox.erase("sume", "x", 60_000, T + 5).await.unwrap(),
        EraseOutcome::Erased
    );
    assert_eq!(
        inbox.replay("sume", "x", "job_b", T + 6).await.unwrap(),
        RedeliverOutcome::NotRedeliverable(EventStatus::Erased)
    );
}

/// Erasing a pending event that holds its stream's turn, leased: the
/// stream's next event is runnable at once, the turn in flight finds its
/// lease superseded, and the erased row keeps nothing of the body or
/// headers.
#[tokio::test]
async fn erasing_a_pending_event_unblocks_its_stream() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "erase-pending", 4);
    for (id, minute) in [("a", 0), ("b", 1), ("c", 2)] {
        let e = event(id, Some("s"), minute, b"secret body".to_vec());
        inbox.ingest(e, T).await.unwrap();
    }
    let a = EventKey::new("sume", "a", Some("s"));
    let leased = inbox
        .lease(vec![(a.clone(), T + 30_000)], Some(RETENTION), T)
        .await
        .unwrap();
    let lease = leased.leased[0].lease;
    let due = inbox
        .due_events(T + 1, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    assert!(due[0].events.is_empty(), "a holds the stream's turn");

    assert_eq!(
        inbox.erase("sume", "a", 60_000, T + 1).await.unwrap(),
        EraseOutcome::Erased
    );
    let due = inbox
        .due_events(T + 1, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    let ids: Vec<&str> = due[0].events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    // The turn in flight delivers late: ignored.
    inbox
        .settle(
            &a,
            lease,
            Settle::Delivered { attempted: true },
            RETENTION,
            T + 2,
        )
        .await
        .unwrap();
    let e = inbox.inbox_event("sume", "a").await.unwrap().unwrap();
    assert_eq!(e.status, EventStatus::Erased);
    assert!(
        e.body.is_empty() && e.headers.is_empty() && e.body_bytes == 0,
        "{e:?}"
    );
    assert_eq!(e.lease, lease + 1);
    assert_eq!(e.expires_at_ms, T + 1 + 60_000);
    assert!(!e.force && e.replay.is_none());
    assert_eq!(
        inbox.erase("sume", "a", 60_000, T + 3).await.unwrap(),
        EraseOutcome::AlreadyErased
    );
    assert_eq!(
        inbox.erase("sume", "nope", 60_000, T + 3).await.unwrap(),
        EraseOutcome::NotFound
    );
    // Erasing one queued behind the turn holder: skipped when its turn
    // would come.
    assert_eq!(
        inbox.erase("sume", "c", 60_000, T + 3).await.unwrap(),
        EraseOutcome::Erased
    );
    assert_eq!(deliver_all(&inbox, T + 4).await, ["b"]);
    let summary = inbox.inbox_summary().await.unwrap();
    assert_eq!(
        (summary[0].pending, summary[0].delivered, summary[0].erased),
        (0, 1, 2)
    );
    assert_eq!(
        inbox.redeliver("sume", "a", T + 5).await.unwrap(),
        RedeliverOutcome::NotRedeliverable(EventStatus::Erased)
    );
}

/// An erased event is listed under its status until the reaper takes it
/// at its expiry, and its id stays a duplicate, before and after, for the
/// dedupe window, as a delivered event's does.
#[tokio::test]
async fn an_erased_event_is_listed_and_its_id_stays_a_duplicate() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "erase-settled", 4);
    inbox
        .ingest(event("x", Some("s"), 0, b"secret".to_vec()), T)
        .await
        .unwrap();
    inbox
        .ingest(event("y", None, 0, b"{}".to_vec()), T)
        .await
        .unwrap();
    assert_eq!(deliver_all(&inbox, T).await.len(), 2);
    assert_eq!(
        inbox.erase("sume", "x", 10_000, T + 1).await.unwrap(),
        EraseOutcome::Erased
    );
    let (listed, next) = inbox
        .list_events(
            "sume",
            EventStatus::Erased,
            ListOrder::NewestFirst,
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(next, None);
    let ids: Vec<&str> = listed.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["x"]);
    let (delivered, _) = inbox
        .list_events(
            "sume",
            EventStatus::Delivered,
            ListOrder::OldestFirst,
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].event_id, "y");
    let again = || event("x", Some("s"), 0, b"again".to_vec());
    assert_eq!(
        inbox.ingest(again(), T + 2).await.unwrap(),
        IngestOutcome::Duplicate
    );
    let key = EventKey::new("sume", "x", Some("s"));
    assert!(inbox.knows_event(&key, T + 2).await.unwrap());

    // The delivered one goes at its retention, the erased one at its own.
    let later = T + 1 + 10_000;
    assert_eq!(
        inbox.purge_settled(later - 1, 100).await.unwrap(),
        (0, false)
    );
    assert_eq!(inbox.purge_settled(later, 100).await.unwrap(), (1, false));
    assert!(inbox.inbox_event("sume", "x").await.unwrap().is_none());
    assert!(inbox.inbox_summary().await.unwrap()[0].erased == 0);
    assert_eq!(
        inbox.ingest(again(), later + 1).await.unwrap(),
        IngestOutcome::Duplicate,
        "its id is a duplicate for the window after its receipt"
    );
    assert!(inbox.knows_event(&key, later + 1).await.unwrap());
    assert_eq!(
        inbox.erase("sume", "x", 10_000, later + 1).await.unwrap(),
        EraseOutcome::NotFound
    );
}

fn job(id: &str, record: &[u8], cancelled: bool) -> StoredJob {
    StoredJob {
        id: id.into(),
        record: record.to_vec(),
        cancelled,
    }
}

/// Bulk jobs' records: written, cancelled (the mark kept when the record
/// is written again), deleted with their mark, listed in id order.
async fn jobs_are_kept(inbox: &RedisInbox) {
    assert_eq!(inbox.jobs().await.unwrap(), []);
    inbox
        .put_job("job_b", b"{\"n\":1}".to_vec(), T)
        .await
        .unwrap();
    inbox.put_job("job_a", vec![0, 159, 255], T).await.unwrap();
    assert!(!inbox.cancel_job("job_c", T).await.unwrap(), "no such job");
    assert!(inbox.cancel_job("job_b", T).await.unwrap());
    assert_eq!(
        inbox.jobs().await.unwrap(),
        [
            job("job_a", &[0, 159, 255], false),
            job("job_b", b"{\"n\":1}", true)
        ]
    );
    inbox
        .put_job("job_b", b"{\"n\":2}".to_vec(), T + 1)
        .await
        .unwrap();
    assert_eq!(
        inbox.jobs().await.unwrap()[1],
        job("job_b", b"{\"n\":2}", true),
        "the cancel mark stays"
    );
    inbox.delete_job("job_b", T + 2).await.unwrap();
    inbox.delete_job("job_c", T + 2).await.unwrap();
    assert_eq!(
        inbox.jobs().await.unwrap(),
        [job("job_a", &[0, 159, 255], false)]
    );
    inbox.put_job("job_b", b"{}".to_vec(), T + 3).await.unwrap();
    assert_eq!(
        inbox.jobs().await.unwrap()[1],
        job("job_b", b"{}", false),
        "a deleted job's mark went with it"
    );
}

#[tokio::test]
async fn jobs_are_put_cancelled_deleted_and_listed() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let inbox = inbox(server.url(), Vec::new(), "jobs", 4);
    jobs_are_kept(&inbox).await;
    // Another instance on the same Redis sees them.
    let other = self::inbox(server.url(), Vec::new(), "jobs", 4);
    assert_eq!(other.jobs().await.unwrap().len(), 2);
}

/// On a cluster: the jobs' two keys share a slot, and replay and erase run
/// in the event's bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_jobs_replays_and_erasures_work() {
    let cluster = shared_cluster().await;
    let inbox = inbox(String::new(), cluster.nodes.clone(), "jobs-cluster", 16);
    jobs_are_kept(&inbox).await;
    for n in 0..8i128 {
        let e = event(&format!("e{n}"), Some(&format!("s{n}")), n, b"{}".to_vec());
        inbox.ingest(e, T).await.unwrap();
    }
    assert_eq!(deliver_all(&inbox, T).await.len(), 8);
    for n in 0..8 {
        let id = format!("e{n}");
        let replayed = inbox.replay("sume", &id, "job_a", T + 1).await.unwrap();
        assert_eq!(replayed, RedeliverOutcome::Requeued, "{id}");
    }
    assert_eq!(
        inbox.erase("sume", "e0", 60_000, T + 2).await.unwrap(),
        EraseOutcome::Erased
    );
    assert_eq!(deliver_all(&inbox, T + 3).await.len(), 7);
    let summary = inbox.inbox_summary().await.unwrap();
    assert_eq!((summary[0].delivered, summary[0].erased), (7, 1));
}

/// Renews `leases` from `until` on, all at once; whether each was.
async fn renew(inbox: &RedisInbox, leases: &[(EventKey, u64)], until: u64, now: u64) -> Vec<bool> {
    inbox
        .renew_leases(leases.to_vec(), until, now)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every bucket answers") == Renewal::Renewed)
        .collect()
}

/// A renewed lease keeps its event and its stream's turn past the lease's
/// first end; a wrong generation, a lease that ran out (even untaken), a
/// settled, erased or unknown event is not renewed; the instance that
/// takes the event after a lapse holds it, and the first one's renewal
/// and late settle change nothing.
#[tokio::test]
async fn a_renewed_lease_holds_and_only_a_live_lease_of_its_generation_is_renewed() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let a = inbox(server.url(), Vec::new(), "renew", 4);
    let b = inbox(server.url(), Vec::new(), "renew", 4);
    a.ingest(event("newer", Some("run"), 5, b"{}".to_vec()), T)
        .await
        .unwrap();
    let key = EventKey::new("sume", "newer", Some("run"));
    let lease = a
        .lease(vec![(key.clone(), T + 10_000)], Some(RETENTION), T)
        .await
        .unwrap()
        .leased[0]
        .lease;
    b.ingest(event("older", Some("run"), 0, b"{}".to_vec()), T + 1)
        .await
        .unwrap();
    assert_eq!(
        renew(
            &a,
            &[(key.clone(), lease + 1), (key.clone(), lease)],
            T + 13_000,
            T + 3_000
        )
        .await,
        [false, true],
        "only the lease's own generation renews it"
    );
    // Past the first lease's end: still a's, and the stream waits for it.
    let due = b
        .due_events(T + 12_000, vec![("sume".into(), 10)], u64::MAX)
        .await
        .unwrap();
    assert!(due[0].events.is_empty(), "{:?}", due[0].events);
    let held = b
        .lease(vec![(key.clone(), T + 22_000)], Some(RETENTION), T + 12_000)
        .await
        .unwrap();
    assert!(held.leased.is_empty(), "a renewed lease is not taken");
    let e = b.inbox_event("sume", "newer").await.unwrap().unwrap();
    assert_eq!(e.due_at_ms, T + 13_000);
    // A renewal never shortens a lease.
    assert_eq!(
        renew(&a, &[(key.clone(), lease)], T + 12_500, T + 12_000).await,
        [true]
    );
    let e = b.inbox_event("sume", "newer").await.unwrap().unwrap();
    assert_eq!(e.due_at_ms, T + 13_000);
    // Ran out: not renewed, though nobody took it yet.
    assert_eq!(
        renew(&a, &[(key.clone(), lease)], T + 23_000, T + 13_000).await,
        [false]
    );
    // The stream's turn went to its oldest event: b delivers both.
    assert_eq!(deliver_all(&b, T + 13_001).await, ["older", "newer"]);
    assert_eq!(
        renew(&a, &[(key.clone(), lease)], T + 23_000, T + 13_002).await,
        [false]
    );
    a.settle(
        &key,
        lease,
        Settle::Dead {
            error: "late".into(),
        },
        RETENTION,
        T + 13_003,
    )
    .await
    .unwrap();
    let e = b.inbox_event("sume", "newer").await.unwrap().unwrap();
    assert_eq!(e.status, EventStatus::Delivered);
    // A renewal that reaches Redis late (its caller's clock behind, or
    // held up) after the stream's turn passed to an older event: not
    // renewed, even though its lease's end is still ahead by that clock.
    a.ingest(event("late_b", Some("late"), 5, b"{}".to_vec()), T)
        .await
        .unwrap();
    let late = EventKey::new("sume", "late_b", Some("late"));
    let late_lease = a
        .lease(vec![(late.clone(), T + 10_000)], Some(RETENTION), T)
        .await
        .unwrap()
        .leased[0]
        .lease;
    b.ingest(event("late_a", Some("late"), 0, b"{}".to_vec()), T + 12_000)
        .await
        .unwrap();
    assert_eq!(
        renew(&a, &[(late.clone(), late_lease)], T + 19_500, T + 9_500).await,
        [false]
    );
    let taken = b
        .lease(
            vec![(EventKey::new("sume", "late_a", Some("late")), T + 22_000)],
            Some(RETENTION),
            T + 12_000,
        )
        .await
        .unwrap();
    assert_eq!(taken.leased.len(), 1, "the older event's turn");
    // Settled under its own lease (a retry, the turn over): ended, not lost.
    a.ingest(event("retried", None, 7, b"{}".to_vec()), T)
        .await
        .unwrap();
    let retried = EventKey::new("sume", "retried", None);
    let lease_r = a
        .lease(
            vec![(retried.clone(), T + 30_000)],
            Some(RETENTION),
            T + 14_000,
        )
        .await
        .unwrap()
        .leased[0]
        .lease;
    let settle = Settle::Retry {
        retry_at: T + 20_000,
        error: "503".into(),
        attempted: true,
    };
    a.settle(&retried, lease_r, settle, RETENTION, T + 14_001)
        .await
        .unwrap();
    let answered = a
        .renew_leases(
            vec![(retried, lease_r), (late.clone(), late_lease)],
            T + 40_000,
            T + 14_002,
        )
        .await
        .unwrap();
    assert_eq!(answered, [Some(Renewal::Ended), Some(Renewal::Lost)]);
    // Erased while leased, or unknown: not renewed.
    a.ingest(event("gone", None, 6, b"{}".to_vec()), T)
        .await
        .unwrap();
    let gone = EventKey::new("sume", "gone", None);
    let lease = a
        .lease(
            vec![(gone.clone(), T + 30_000)],
            Some(RETENTION),
            T + 14_000,
        )
        .await
        .unwrap()
        .leased[0]
        .lease;
    assert_eq!(
        a.erase("sume", "gone", 60_000, T + 14_001).await.unwrap(),
        EraseOutcome::Erased
    );
    let unknown = EventKey::new("sume", "unknown", None);
    assert_eq!(
        renew(&a, &[(gone, lease), (unknown, 1)], T + 40_000, T + 14_002).await,
        [false, false]
    );
}

/// On a cluster, renewals go to every master holding a bucket of the
/// leases, and answer in the order asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_leases_over_every_master_are_renewed_in_order() {
    let cluster = shared_cluster().await;
    let inbox = inbox(String::new(), cluster.nodes.clone(), "renew-cluster", 16);
    let mut keys = Vec::new();
    for n in 0..24i128 {
        let id = format!("e{n}");
        let stream = format!("s{n}");
        inbox
            .ingest(event(&id, Some(&stream), n, b"{}".to_vec()), T)
            .await
            .unwrap();
        keys.push(EventKey::new("sume", &id, Some(&stream)));
    }
    // Every other one leased; the rest asked with a generation never given.
    let leased = inbox
        .lease(
            keys.iter()
                .step_by(2)
                .map(|k| (k.clone(), T + 10_000))
                .collect(),
            Some(RETENTION),
            T,
        )
        .await
        .unwrap();
    assert_eq!(leased.leased.len(), 12);
    let asked: Vec<(EventKey, u64)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let lease = leased
                .leased
                .iter()
                .find(|l| l.event_id == k.event_id)
                .map_or(7, |l| l.lease);
            assert_eq!(i % 2 == 0, lease != 7);
            (k.clone(), lease)
        })
        .collect();
    let renewed = renew(&inbox, &asked, T + 20_000, T + 5_000).await;
    let want: Vec<bool> = (0..24).map(|i| i % 2 == 0).collect();
    assert_eq!(renewed, want);
    // Past the first leases' end, only the never-leased ones are due.
    let due = inbox
        .due_events(T + 15_000, vec![("sume".into(), 50)], u64::MAX)
        .await
        .unwrap();
    let mut ids: Vec<&str> = due[0].events.iter().map(|e| e.event_id.as_str()).collect();
    ids.sort_unstable();
    let mut odd: Vec<String> = (0..24)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("e{i}"))
        .collect();
    odd.sort_unstable();
    assert_eq!(ids, odd);
}
