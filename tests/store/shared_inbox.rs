//! The shared inbox in Redis, against real redis-servers: what the model
//! test (`inbox_model`) does not reach — a cluster, several instances on
//! one inbox, the fixed layout, and the bytes of a body.

use std::time::Duration;

use dedupd::domain::CreatedAt;
use dedupd::store::inbox::{
    EventKey, EventStatus, Inbox, IngestOutcome, ListOrder, NewEvent, Retention, Settle,
};
use dedupd::store::redis::{RedisInbox, SharedInboxOptions};

use crate::backends::redis::{options, shared_cluster};
use crate::support::redis::RedisServer;

const T: u64 = 1_800_000_000_000;
const RETENTION: Retention = Retention {
    delivered_ms: 60_000,
    dead_ms: 120_000,
};

fn inbox(url: String, nodes: Vec<String>, prefix: &str, buckets: u16) -> RedisInbox {
    RedisInbox::connect(
        options(url, nodes, prefix.into()),
        SharedInboxOptions {
            buckets,
            dedupe_window: Duration::from_secs(3600),
        },
    )
    .unwrap()
}

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
