//! The model run against the shared inbox in Redis (`RedisInbox`), on a
//! redis-server the test starts, under [`Rules::Shared`]: with one bucket
//! per source (the bucket is the whole source, as the data file is), and
//! with four, where each event id keeps one stream. After every step the
//! keys of each bucket, read with a plain connection, must keep the
//! invariants `src/store/redis/inbox/common.lua` documents.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use dedupd::store::inbox::Inbox;
use dedupd::store::redis::{RedisInbox, RedisOptions, SharedInboxOptions};
use proptest::prelude::*;
use redis::aio::MultiplexedConnection;

use super::{DEDUPE_MS, Model, Rules, SOURCES, Subject, TIMELINE_ATTEMPTS, op, run};
use crate::backends::redis::options;
use crate::support::redis::RedisServer;

/// A shared inbox under a key prefix of its own, and a plain connection
/// to read its keys.
struct Shared {
    redis: RedisOptions,
    opts: SharedInboxOptions,
    inbox: RedisInbox,
    raw: MultiplexedConnection,
}

impl Shared {
    async fn connect(url: &str, buckets: u16) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!("m{}", NEXT.fetch_add(1, Ordering::SeqCst));
        // A large expiry slack: Redis must not expire a record the model's
        // clock, far ahead of real time, still reads.
        let redis = options(url.to_owned(), Vec::new(), prefix);
        let opts = SharedInboxOptions {
            buckets,
            dedupe_window: std::time::Duration::from_millis(DEDUPE_MS),
            lease_grace: std::time::Duration::from_secs(10),
        };
        let raw = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Self {
            inbox: RedisInbox::connect(redis.clone(), opts.clone()).unwrap(),
            redis,
            opts,
            raw,
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        cmd.query_async(&mut self.raw.clone()).await.unwrap()
    }

    /// Every key of bucket `b` of `source`, read whole.
    async fn read_bucket(&self, source: &str, b: u16) -> Bucket {
        let t = format!("{}:{{i:{source}:{b}}}:", self.redis.prefix);
        let keys: Vec<String> = self.query(redis::cmd("KEYS").arg(format!("{t}*"))).await;
        let mut out = Bucket::default();
        for key in keys {
            let name = key.strip_prefix(&t).unwrap();
            let (kind, rest) = name.split_once(':').unwrap_or((name, ""));
            let (zrange, hgetall, get) = (
                || redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).clone(),
                || redis::cmd("HGETALL").arg(&key).clone(),
                || redis::cmd("GET").arg(&key).clone(),
            );
            let rest = rest.to_owned();
            match kind {
                "e" => {
                    out.rows.insert(rest, self.query(&mut hgetall()).await);
                }
                "t" => {
                    let n: usize = self.query(redis::cmd("LLEN").arg(&key)).await;
                    out.timelines.insert(rest, n);
                }
                "d" => {
                    out.dedupe.insert(rest, self.query(&mut get()).await);
                }
                "a" => {
                    out.applied.insert(rest, self.query(&mut get()).await);
                }
                "h" => {
                    out.heads.insert(rest, self.query(&mut hgetall()).await);
                }
                "q" => {
                    out.queues.insert(rest, self.query(&mut zrange()).await);
                }
                "s" => {
                    out.status.insert(rest, self.query(&mut zrange()).await);
                }
                "run" => out.run = scored(self.query(zrange().arg("WITHSCORES")).await),
                "x" => out.settled = scored(self.query(zrange().arg("WITHSCORES")).await),
                "rn" => out.turns = self.query(&mut hgetall()).await,
                "n" => out.counts = self.query(&mut hgetall()).await,
                _ => panic!("a key the layout does not have: {key}"),
            }
        }
        out
    }
}

/// The keys of one bucket (`common.lua`), by the name after its prefix.
#[derive(Debug, Default)]
struct Bucket {
    /// `e:ID`: ID → its fields.
    rows: BTreeMap<String, BTreeMap<String, String>>,
    /// `t:ID`: ID → attempts kept.
    timelines: BTreeMap<String, usize>,
    /// `d:ID`: ID → until when it is a duplicate.
    dedupe: BTreeMap<String, u64>,
    /// `a:ID`: ID → until when it counts as applied.
    applied: BTreeMap<String, u64>,
    /// `h:HS`: HS → the head's fields.
    heads: BTreeMap<String, BTreeMap<String, String>>,
    /// `q:HS`: HS → members `ca:r2:ID`.
    queues: BTreeMap<String, BTreeSet<String>>,
    /// `s:N`: N → members `r2:ID`.
    status: BTreeMap<String, BTreeSet<String>>,
    /// `run`: ID → due.
    run: BTreeMap<String, u64>,
    /// `x`: ID → expiry.
    settled: BTreeMap<String, u64>,
    /// `rn`: HS → the event whose turn it is.
    turns: BTreeMap<String, String>,
    /// `n`: N → count.
    counts: BTreeMap<String, i64>,
}

fn scored(entries: Vec<(String, f64)>) -> BTreeMap<String, u64> {
    entries
        .into_iter()
        .map(|(id, score)| (id, score as u64))
        .collect()
}

/// A stream as the layout names it (lower-case hex).
fn hex(stream: &str) -> String {
    stream.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `created_at` nanoseconds from its sortable key (shifted by 10^21).
fn from_created_key(key: &str) -> i128 {
    key.parse::<i128>().unwrap() - 1_000_000_000_000_000_000_000
}

impl Bucket {
    /// The bucket against the invariants of `common.lua`.
    fn check(&self, ctx: &str) {
        let field = |id: &str, f: &str| -> String {
            self.rows[id]
                .get(f)
                .cloned()
                .unwrap_or_else(|| panic!("{ctx}: event {id} has no field {f}"))
        };
        let member = |id: &str| format!("{}:{id}", field(id, "r2"));
        let pending: Vec<&String> = self
            .rows
            .keys()
            .filter(|id| field(id, "st") == "0")
            .collect();
        for st in ["0", "1", "2", "3", "4"] {
            let want: BTreeSet<String> = self
                .rows
                .keys()
                .filter(|id| field(id, "st") == st)
                .map(|id| member(id))
                .collect();
            let got = self.status.get(st).cloned().unwrap_or_default();
            assert_eq!(got, want, "{ctx}: s:{st} != the events of status {st}");
            let count = self.counts.get(st).copied().unwrap_or(0);
            assert_eq!(count, want.len() as i64, "{ctx}: n[{st}] != |s:{st}|");
        }
        for (id, fields) in &self.rows {
            assert_eq!(
                fields.contains_key("rj"),
                fields.contains_key("rb"),
                "{ctx}: {id}'s replay mark is half there: {fields:?}"
            );
            if field(id, "st") == "4" {
                assert!(
                    !fields.contains_key("bd") && field(id, "hd") == "[]" && field(id, "bb") == "0",
                    "{ctx}: erased event {id} keeps its body or headers: {fields:?}"
                );
                assert!(
                    !fields.contains_key("rj") && !fields.contains_key("lu"),
                    "{ctx}: erased event {id} keeps a mark or a lease: {fields:?}"
                );
            } else {
                assert!(
                    fields.contains_key("bd"),
                    "{ctx}: event {id} has no body: {fields:?}"
                );
            }
        }
        let settled: BTreeMap<String, u64> = self
            .rows
            .keys()
            .filter(|id| field(id, "st") != "0")
            .map(|id| (id.clone(), field(id, "ex").parse().unwrap()))
            .collect();
        assert_eq!(
            self.settled, settled,
            "{ctx}: x != the settled events at their expiry"
        );
        let mut queues: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for id in &pending {
            let hs = field(id, "hs");
            if !hs.is_empty() {
                queues
                    .entry(hs)
                    .or_default()
                    .insert(format!("{}:{}", field(id, "ca"), member(id)));
            }
        }
        assert_eq!(
            self.queues, queues,
            "{ctx}: q:HS != the pending events of stream HS"
        );
        assert_eq!(
            self.turns.keys().collect::<Vec<_>>(),
            queues.keys().collect::<Vec<_>>(),
            "{ctx}: rn != one turn per stream with pending events"
        );
        let mut run = BTreeMap::new();
        for (hs, id) in &self.turns {
            assert!(
                self.rows.contains_key(id) && field(id, "st") == "0" && &field(id, "hs") == hs,
                "{ctx}: the turn of {hs} is with {id}, not a pending event of it"
            );
            run.insert(id.clone(), field(id, "du").parse::<u64>().unwrap());
        }
        for id in pending.iter().filter(|id| field(id, "hs").is_empty()) {
            run.insert((*id).clone(), field(id, "du").parse::<u64>().unwrap());
        }
        assert_eq!(
            self.run, run,
            "{ctx}: run != turn holders and streamless pending events at their due time"
        );
        for (id, n) in &self.timelines {
            assert!(
                self.rows.contains_key(id),
                "{ctx}: a timeline without an event: {id}"
            );
            assert!(
                (1..=TIMELINE_ATTEMPTS).contains(n),
                "{ctx}: {id}'s timeline keeps {n} attempts"
            );
        }
    }
}

#[async_trait]
impl Subject for Shared {
    fn inbox(&self) -> &dyn Inbox {
        &self.inbox
    }

    /// A new connection: the data stays in the server.
    async fn restart(&mut self) {
        self.inbox = RedisInbox::connect(self.redis.clone(), self.opts.clone()).unwrap();
    }

    /// `purge_settled`: any `limit` of the expired settled events may go
    /// when the limit cuts; the model follows the store's pick, and `more`
    /// says exactly whether expired ones are left.
    async fn reap(&mut self, m: &mut Model, limit: u64, ctx: &str) {
        let expired = m.expired_settled();
        let (deleted, more) = self.inbox.purge_settled(m.now, limit).await.unwrap();
        let cut = limit.min(expired.len() as u64);
        assert_eq!(deleted, cut, "{ctx}: events reaped of {expired:?}");
        assert_eq!(
            more,
            cut < expired.len() as u64,
            "{ctx}: more = {more} after {deleted} of {expired:?}"
        );
        let mut gone = 0;
        for (source, id) in expired {
            if self
                .inbox
                .inbox_event(&source, &id)
                .await
                .unwrap()
                .is_none()
            {
                m.events.remove(&(source, id));
                gone += 1;
            }
        }
        assert_eq!(gone, deleted, "{ctx}: events reaped, as reads show them");
    }

    async fn check_store(&self, m: &Model, ctx: &str) {
        for source in SOURCES {
            let mut rows = BTreeMap::new();
            let mut turns = BTreeMap::new();
            let mut dedupe = BTreeMap::new();
            let mut applied = BTreeMap::new();
            let mut heads = BTreeMap::new();
            for b in 0..self.opts.buckets {
                let bucket = self.read_bucket(source, b).await;
                let ctx = format!("{ctx}: bucket {b} of {source}");
                bucket.check(&ctx);
                for (id, fields) in bucket.rows {
                    assert!(
                        rows.insert(id.clone(), fields).is_none(),
                        "{ctx}: {source}/{id} in two buckets"
                    );
                }
                turns.extend(bucket.turns);
                dedupe.extend(bucket.dedupe);
                applied.extend(bucket.applied);
                for (hs, h) in bucket.heads {
                    let created = from_created_key(&h["c"]);
                    heads.insert(hs, (created, h["e"].parse::<u64>().unwrap()));
                }
            }
            let ctx = format!("{ctx}: {source}");
            let ids: Vec<&String> = rows.keys().collect();
            let want: Vec<&String> = m
                .events
                .keys()
                .filter(|(s, _)| s == source)
                .map(|(_, id)| id)
                .collect();
            assert_eq!(ids, want, "{ctx}: events");
            for (id, fields) in &rows {
                let lu = fields.get("lu").map(|v| v.parse::<u64>().unwrap());
                let want = m
                    .leased_until
                    .get(&(source.to_owned(), id.clone()))
                    .copied();
                assert_eq!(lu, want, "{ctx}: {id} leased until");
                let e = m.get(source, id).unwrap();
                assert_eq!(fields["st"], e.status.to_byte().to_string(), "{ctx}: {id}");
            }
            let of_source = |(s, k): &(String, String)| (s == source).then(|| k.clone());
            let want: BTreeMap<String, String> = m
                .turns
                .iter()
                .filter_map(|(k, id)| Some((hex(&of_source(k)?), id.clone())))
                .collect();
            assert_eq!(turns, want, "{ctx}: whose turn it is, by stream");
            let want: BTreeMap<String, u64> = m
                .dedupe
                .iter()
                .filter_map(|(k, until)| Some((of_source(k)?, *until)))
                .collect();
            assert_eq!(dedupe, want, "{ctx}: dedupe records");
            let want: BTreeMap<String, u64> = m
                .applied
                .iter()
                .filter_map(|(k, until)| Some((of_source(k)?, *until)))
                .collect();
            assert_eq!(applied, want, "{ctx}: applied events");
            let want: BTreeMap<String, (i128, u64)> = m
                .heads
                .iter()
                .filter_map(|(k, (c, exp))| Some((hex(&of_source(k)?), (c.unix_nanos(), *exp))))
                .collect();
            assert_eq!(heads, want, "{ctx}: stream heads");
        }
    }

    async fn close(self: Box<Self>) {}
}

/// `cases` random runs against a shared inbox with `buckets` buckets per
/// source, each under a key prefix of its own on one server.
fn check(buckets: u16, cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let url = server.url();
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..100))| {
        rt.block_on(async {
            let subject = Shared::connect(&url, buckets).await;
            run(Box::new(subject), Model::new(Rules::Shared, buckets > 1), ops).await;
        });
    });
}

#[test]
fn random_inbox_operations_agree_with_the_model_on_the_shared_inbox() {
    check(1, 48);
}

/// Several buckets: events of one source in four, each id keeping its
/// stream (an id posted again on another stream would land in another
/// bucket, whose dedupe records do not know it).
#[test]
fn random_inbox_operations_agree_with_the_model_on_the_shared_inbox_over_four_buckets() {
    check(4, 16);
}
