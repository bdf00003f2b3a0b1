//! Upgrades lose nothing: for every schema version of the data file and
//! every format of the write-ahead log there is a golden file under
//! `tests/golden/`, left by a real build of that version after the same
//! scenario (`tests/golden/make.sh`; its README says what each holds). This
//! build opens a copy of each (never the committed file) and must find
//! everything that build acknowledged, exactly: claims, applied events and
//! heads, gateway inbox rows with their indexes, keyspace keys, erased
//! events, replay marks and bulk jobs. A log of
//! any format is replayed, then rewritten in the current one; the
//! migration runs once and sticks (a second open finds the same).
//!
//! The generator froze the clock at [`T0`], so every time in the files is
//! known here.

use std::path::{Path, PathBuf};

use dedupd::clock::Millis;
use dedupd::domain::{ClaimResult, CreatedAt, Fingerprint, Key, Namespace, ScopedKey, Token, Ttl};
use dedupd::gateway::jobs::{Job, JobKind, JobState};
use dedupd::store::inbox::{
    EventStatus, Inbox, InboxEvent, IngestOutcome, ListOrder, NewEvent, RedeliverOutcome,
    ReplayMark, ReplayState,
};
use dedupd::store::keyspace::KvEntry;
use dedupd::store::redb::faults::FaultPlan;
use dedupd::store::redb::{OpenError, RedbOptions, RedbStore};
use dedupd::store::{
    ApplyOutcome, ClaimOutcome, ClaimState, ClaimView, DoneOutcome, ExtendOutcome, Head, Store,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tempfile::TempDir;

/// The generator's frozen clock: 2027-01-15T08:00:00Z.
const T0: Millis = 1_800_000_000_000;
/// When this test reads: everything written is still live.
const NOW: Millis = T0 + 1;
const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// Which gateway the build that wrote a case had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gateway {
    /// None (claims and ordering only).
    Absent,
    /// The first releases: inbox rows without a lease generation, and a
    /// claim per delivered event in the gateway's namespace.
    NoLease,
    /// Lease generations, and still the delivered events' claims.
    WithClaims,
    /// Lease generations, no claims.
    Current,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    /// Its directory under `tests/golden/`.
    name: &'static str,
    /// The schema version the file records.
    schema: u64,
    /// The format of its write-ahead log, if it has one.
    log: Option<u32>,
    /// Whether the log holds batches the file does not (a SIGKILL before
    /// any checkpoint): opening replays them.
    replays: bool,
    gateway: Gateway,
    /// Whether the build had the Redis-protocol keyspace.
    keyspace: bool,
    /// Whether the build kept attempt timelines (schema 8 on).
    timelines: bool,
    /// Whether the build had bulk jobs and erasure (schema 9 on): the
    /// scenario's third source, `bulk`.
    jobs: bool,
    /// Whether the build's dones keep a result (schema 13 on):
    /// `job-result` and `job-result-large`.
    results: bool,
}

const fn case(name: &'static str, schema: u64, gateway: Gateway) -> Case {
    Case {
        name,
        schema,
        log: None,
        replays: false,
        gateway,
        keyspace: false,
        timelines: false,
        jobs: false,
        results: false,
    }
}

fn golden_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn wal_of(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    p.into()
}

/// The case's files, unpacked into a new directory: the data file, and its
/// log unless `with_log` is false.
fn copy(case: &Case, with_log: bool) -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let src = golden_dir(case.name);
    let path = dir.path().join("dedupd.redb");
    std::fs::write(&path, unpack(&src.join("dedupd.redb.b64"))).unwrap();
    let log = src.join("dedupd.redb.wal.b64");
    assert_eq!(log.exists(), case.log.is_some(), "{}: its log", case.name);
    if with_log && log.exists() {
        std::fs::write(wal_of(&path), unpack(&log)).unwrap();
        // The log's second segment, from the builds that keep one.
        let second = src.join("dedupd.redb.wal2.b64");
        if second.exists() {
            let mut to = wal_of(&path).into_os_string();
            to.push("2");
            std::fs::write(to, unpack(&second)).unwrap();
        }
    }
    // The key file its sealed events open with (schema 12 on).
    let keys = src.join("dedupd.redb.keys.b64");
    if keys.exists() {
        let mut to = path.as_os_str().to_owned();
        to.push(".keys");
        std::fs::write(PathBuf::from(to), unpack(&keys)).unwrap();
    }
    (dir, path)
}

/// A golden file as `tests/golden/pack.py` packed it: its size, then runs
/// of non-zero bytes as `offset base64`; zeros elsewhere. (The tree holds
/// no data file dedupd could open, only this text.)
fn unpack(packed: &Path) -> Vec<u8> {
    use base64::Engine as _;
    let text =
        std::fs::read_to_string(packed).unwrap_or_else(|e| panic!("{}: {e}", packed.display()));
    let mut out: Option<Vec<u8>> = None;
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (first, rest) = line.split_once(' ').expect("`size N` or `offset base64`");
        if first == "size" {
            out = Some(vec![0; rest.parse().expect("size")]);
            continue;
        }
        let buf = out.as_mut().expect("the size comes first");
        let at: usize = first.parse().expect("offset");
        let run = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .expect("base64");
        buf[at..at + run.len()].copy_from_slice(&run);
    }
    out.expect("a size line")
}

fn options(path: &Path) -> RedbOptions {
    RedbOptions::new(path)
}

/// The `meta` table of a closed data file (read on a copy: redb may write
/// to a file it opens).
fn meta(path: &Path) -> Vec<(String, u64)> {
    let dir = TempDir::new().unwrap();
    let copy = dir.path().join("copy.redb");
    std::fs::copy(path, &copy).unwrap();
    let db = redb::Database::open(&copy).unwrap();
    let tx = db.begin_read().unwrap();
    let def: TableDefinition<&str, u64> = TableDefinition::new("meta");
    let table = tx.open_table(def).unwrap();
    table
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_owned(), v.value())
        })
        .collect()
}

fn meta_value(path: &Path, key: &str) -> Option<u64> {
    meta(path)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// The data file's id, as its log must name it.
fn file_id(path: &Path) -> u128 {
    let hi = meta_value(path, "file_id_hi").expect("the file has an id");
    let lo = meta_value(path, "file_id_lo").expect("the file has an id");
    u128::from(hi) << 64 | u128::from(lo)
}

/// The schema version this build gives a new file.
async fn current_schema() -> u64 {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("new.redb");
    RedbStore::open(&options(&path)).unwrap().close().await;
    meta_value(&path, "schema_version").unwrap()
}

fn api(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

fn gateway_key(source: &str, k: &str) -> ScopedKey {
    ScopedKey::new(
        &Namespace::Gateway(source.to_owned()),
        &Key::parse(k, "key").unwrap(),
    )
}

fn at(rfc3339: &str) -> CreatedAt {
    CreatedAt::parse(rfc3339, "created_at").unwrap()
}

/// What the build answered to the first request that starts with
/// `request`, with `status` (from the generator's record of every answer).
fn answer(case: &Case, request: &str, status: u16) -> serde_json::Value {
    let answers = std::fs::read_to_string(golden_dir(case.name).join("answers.txt")).unwrap();
    let line = answers
        .lines()
        .find(|l| l.starts_with(request))
        .unwrap_or_else(|| panic!("{}: no {request:?} in answers.txt", case.name));
    let (_, body) = line
        .split_once(&format!(" -> {status} "))
        .unwrap_or_else(|| panic!("{}: not answered {status}: {line}", case.name));
    serde_json::from_str(body).unwrap()
}

/// The token the build answered for a claim of `key`.
fn token(case: &Case, key: &str) -> Token {
    let body = answer(case, &format!("POST /v1/claims/{key} "), 201);
    Token::parse(body["token"].as_str().unwrap()).unwrap()
}

/// The ids of the scenario's two bulk jobs, as the build answered their
/// starts: the redeliver job of `bulk`'s delivered events (done), and
/// that of its stale events (cancelled while it waited).
fn job_ids(case: &Case) -> (String, String) {
    let started = |status: &str| {
        let request = format!(
            r#"POST /v1/sources/bulk/jobs {{"kind":"redeliver","filter":{{"status":"{status}"}}}} "#
        );
        answer(case, &request, 201)["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    (started("delivered"), started("stale"))
}

/// The claim by which an instance runs `job` (the runner's).
fn job_claim(job: &str) -> ScopedKey {
    ScopedKey::new(
        &Namespace::GatewayStream("bulk#jobs".to_owned()),
        &Key::parse(job, "job").unwrap(),
    )
}

fn claim_view(state: ClaimState, fence: u64, expires_at_ms: Millis) -> Option<ClaimView> {
    Some(ClaimView {
        state,
        fence,
        expires_at_ms,
        result: None,
    })
}

/// The webhook bodies the generator posted, byte for byte.
const BODIES: [(&str, &str, &str); 6] = [
    (
        "fragile",
        "fail-2",
        r#"{"id":"fail-2","created_at":"2027-01-15T07:40:00Z"}"#,
    ),
    (
        "sume",
        "fail-1",
        r#"{"id":"fail-1","stream":"run-2","created_at":"2027-01-15T07:00:00Z"}"#,
    ),
    (
        "sume",
        "ok-0",
        r#"{"id":"ok-0","stream":"run-1","created_at":"2027-01-15T06:00:00Z"}"#,
    ),
    (
        "sume",
        "ok-1",
        r#"{"id":"ok-1","stream":"run-1","created_at":"2027-01-15T07:00:00Z"}"#,
    ),
    (
        "sume",
        "ok-2",
        r#"{"id":"ok-2","stream":"run-2","created_at":"2027-01-15T07:30:00Z","note":"waits behind fail-1"}"#,
    ),
    (
        "sume",
        "ok-3",
        r#"{"id":"ok-3","created_at":"2027-01-15T07:20:00Z"}"#,
    ),
];

/// The bodies posted to `bulk`, in builds with jobs.
const BULK_BODIES: [(&str, &str, &str); 3] = [
    (
        "bulk",
        "late-1",
        r#"{"id":"late-1","stream":"run-3","created_at":"2027-01-15T06:00:00Z"}"#,
    ),
    (
        "bulk",
        "ok-4",
        r#"{"id":"ok-4","stream":"run-3","created_at":"2027-01-15T07:00:00Z"}"#,
    ),
    (
        "bulk",
        "ok-5",
        r#"{"id":"ok-5","created_at":"2027-01-15T07:50:00Z"}"#,
    ),
];

/// The bodies a case's build was posted.
fn bodies(
    case: &Case,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
    let bulk: &[_] = if case.jobs { &BULK_BODIES } else { &[] };
    BODIES.iter().chain(bulk)
}

fn body(event_id: &str) -> &'static [u8] {
    BODIES
        .iter()
        .chain(&BULK_BODIES)
        .find(|(_, id, _)| *id == event_id)
        .unwrap()
        .2
        .as_bytes()
}

/// The results the scenario's dones kept (builds with results), and none
/// for the keys of builds without.
async fn check_results(case: &Case, store: &RedbStore) {
    let name = case.name;
    let (small, large) = (api("job-result"), api("job-result-large"));
    if !case.results {
        assert_eq!(store.get(&small, NOW).await.unwrap(), None, "{name}");
        return;
    }
    let small_result =
        ClaimResult::from_stored(r#"{"charge":"ch_1","amount":12345678901234567890123}"#).unwrap();
    let large_result = ClaimResult::from_stored(&format!("\"{}\"", "r".repeat(300))).unwrap();
    assert_eq!(
        store.get(&small, NOW).await.unwrap(),
        Some(ClaimView {
            state: ClaimState::Done,
            fence: 7,
            expires_at_ms: T0 + DAY,
            result: Some(small_result.clone()),
        }),
        "{name}"
    );
    assert_eq!(
        store.get(&large, NOW).await.unwrap(),
        Some(ClaimView {
            state: ClaimState::Done,
            fence: 8,
            expires_at_ms: T0 + DAY,
            result: Some(large_result),
        }),
        "{name}"
    );
    let ttl = Ttl::from_ms_unchecked(HOUR);
    assert_eq!(
        store.claim(&small, ttl, None, NOW).await.unwrap(),
        ClaimOutcome::Done {
            expires_at_ms: T0 + DAY,
            result: Some(small_result),
        },
        "{name}"
    );
    // The fingerprint kept beside the result.
    assert_eq!(
        store
            .claim(
                &large,
                ttl,
                Some(Fingerprint::parse("sha256:dd").unwrap()),
                NOW
            )
            .await
            .unwrap(),
        ClaimOutcome::FingerprintMismatch {
            state: ClaimState::Done,
            expires_at_ms: T0 + DAY
        },
        "{name}"
    );
}

/// Everything the scenario left, read through the store without changing
/// anything.
async fn check_contents(case: &Case, store: &RedbStore) {
    let name = case.name;
    // Claims: state, fence, expiry; the released one is gone.
    assert_eq!(
        store.get(&api("job-processing"), NOW).await.unwrap(),
        claim_view(ClaimState::Processing, 1, T0 + HOUR),
        "{name}"
    );
    assert_eq!(
        store.get(&api("job-done"), NOW).await.unwrap(),
        claim_view(ClaimState::Done, 2, T0 + DAY),
        "{name}"
    );
    assert_eq!(
        store.get(&api("job-extended"), NOW).await.unwrap(),
        claim_view(ClaimState::Processing, 3, T0 + 2 * HOUR),
        "{name}"
    );
    assert_eq!(store.get(&api("job-released"), NOW).await.unwrap(), None);
    check_results(case, store).await;
    // The fingerprint is kept: another one is refused as a mismatch, the
    // same one as busy. (Neither changes anything.)
    let fingerprint = |f: &str| Some(Fingerprint::parse(f).unwrap());
    let ttl = Ttl::from_ms_unchecked(HOUR);
    assert_eq!(
        store
            .claim(&api("job-processing"), ttl, fingerprint("sha256:bb"), NOW)
            .await
            .unwrap(),
        ClaimOutcome::FingerprintMismatch {
            state: ClaimState::Processing,
            expires_at_ms: T0 + HOUR
        },
        "{name}"
    );
    assert_eq!(
        store
            .claim(&api("job-processing"), ttl, fingerprint("sha256:aa"), NOW)
            .await
            .unwrap(),
        ClaimOutcome::Busy {
            expires_at_ms: T0 + HOUR
        },
        "{name}"
    );

    // Stream heads.
    let head = |event: ScopedKey, created_at: &str| {
        Some(Head {
            created_at: at(created_at),
            event_id: event,
        })
    };
    assert_eq!(
        store.head(&api("orders"), NOW).await.unwrap(),
        head(api("evt-b"), "2027-01-15T07:05:00Z"),
        "{name}"
    );
    assert_eq!(
        store.head(&api("payments"), NOW).await.unwrap(),
        head(api("evt-c"), "2027-01-15T07:10:00Z"),
        "{name}"
    );
    let run = |r: &str| gateway_key("sume", r);
    assert_eq!(
        store.head(&run("run-1"), NOW).await.unwrap(),
        if case.gateway == Gateway::Absent {
            None
        } else {
            head(gateway_key("sume", "ok-1"), "2027-01-15T07:00:00Z")
        },
        "{name}: a delivered event moves its stream's head"
    );
    assert_eq!(store.head(&run("run-2"), NOW).await.unwrap(), None);
    assert_eq!(
        store
            .head(&gateway_key("bulk", "run-3"), NOW)
            .await
            .unwrap(),
        if case.jobs {
            head(gateway_key("bulk", "ok-4"), "2027-01-15T07:00:00Z")
        } else {
            None
        },
        "{name}: ok-4 moved run-3's head; its replay, an event already applied, did not"
    );

    if case.jobs {
        check_jobs(case, store).await;
    }
    if case.gateway != Gateway::Absent {
        check_inbox(case, store).await;
    } else {
        let indexes = store.inbox().inbox_indexes().await.unwrap();
        assert!(indexes.rows.is_empty() && indexes.status.is_empty());
    }

    // The keyspace.
    let keyspace = store.keyspace();
    let kv = |k: &str| keyspace.get(k.as_bytes().to_vec(), NOW);
    let entry = |value: &[u8], expires_at_ms: Option<Millis>| {
        Some(KvEntry {
            value: value.to_vec(),
            expires_at_ms,
        })
    };
    let keys = [
        ("kv:plain", entry(b"value-1", None)),
        ("kv:temp", entry(b"value-2", Some(T0 + HOUR))),
        ("kv:bin", entry(b"bin\x00\xff", None)),
        ("kv:gone", None),
        ("kv:persisted", entry(b"value-3", None)),
    ];
    for (key, expected) in keys {
        let expected = if case.keyspace { expected } else { None };
        assert_eq!(kv(key).await.unwrap(), expected, "{name}: {key}");
    }
}

async fn check_inbox(case: &Case, store: &RedbStore) {
    let name = case.name;
    let indexes = store.inbox().inbox_indexes().await.unwrap();
    // (source, id, status, stream, created_at, attempts, expires_at_ms)
    let settled = T0 + 7 * DAY;
    let dead = T0 + 30 * DAY;
    let expected = [
        (
            "fragile",
            "fail-2",
            EventStatus::Dead,
            None,
            "07:40",
            1,
            dead,
        ),
        (
            "sume",
            "fail-1",
            EventStatus::Pending,
            Some("run-2"),
            "07:00",
            1,
            0,
        ),
        (
            "sume",
            "ok-0",
            EventStatus::Stale,
            Some("run-1"),
            "06:00",
            0,
            settled,
        ),
        (
            "sume",
            "ok-1",
            EventStatus::Delivered,
            Some("run-1"),
            "07:00",
            1,
            settled,
        ),
        (
            "sume",
            "ok-2",
            EventStatus::Pending,
            Some("run-2"),
            "07:30",
            0,
            0,
        ),
        (
            "sume",
            "ok-3",
            EventStatus::Delivered,
            None,
            "07:20",
            1,
            settled,
        ),
    ];
    // The bulk source's rows (cases with jobs) come first; they are
    // checked apart.
    let (bulk, rows): (Vec<&InboxEvent>, Vec<&InboxEvent>) =
        indexes.rows.iter().partition(|r| r.source == "bulk");
    assert_eq!(rows.len(), expected.len(), "{name}: {:?}", indexes.rows);
    // fail-1 failed once: retried after backoff_min (1 h) jittered to
    // [30 min, 1 h].
    let retry_at = rows[1].due_at_ms;
    assert!(
        (T0 + HOUR / 2..=T0 + HOUR).contains(&retry_at),
        "{name}: fail-1 due at {retry_at}"
    );
    let bulk_retry_at = check_bulk_rows(case, &bulk);
    for (row, (source, id, status, stream, created, attempts, expires)) in
        rows.into_iter().zip(expected)
    {
        let failed = id.starts_with("fail");
        // Every event the build leased has generation 1, except in a file
        // of the first releases, which had none (0 once migrated).
        let leased = attempts > 0 || status == EventStatus::Stale;
        let lease = u64::from(case.gateway != Gateway::NoLease && leased);
        assert_eq!(
            (row.source.as_str(), row.event_id.as_str()),
            (source, id),
            "{name}"
        );
        assert_eq!(row.status, status, "{name}: {id}");
        assert_eq!(row.stream.as_deref(), stream, "{name}: {id}");
        assert_eq!(
            row.created_at,
            at(&format!("2027-01-15T{created}:00Z")),
            "{name}: {id}"
        );
        assert_eq!(row.received_at_ms, T0, "{name}: {id}");
        assert_eq!(row.attempts, attempts, "{name}: {id}");
        assert_eq!(
            row.due_at_ms,
            if id == "fail-1" { retry_at } else { T0 },
            "{name}: {id}"
        );
        assert_eq!(
            row.last_error.as_deref(),
            failed.then_some("HTTP 503 Service Unavailable"),
            "{name}: {id}"
        );
        assert!(!row.force, "{name}: {id}");
        assert_eq!(row.replay, None, "{name}: {id}");
        // Each attempted event kept its one attempt, sent at the frozen
        // clock; builds before timelines kept none.
        let timeline: Vec<_> = row
            .timeline
            .iter()
            .map(|a| (a.attempt, a.at_ms, a.status, a.error.as_deref()))
            .collect();
        let expected_timeline = if case.timelines && attempts > 0 {
            let status = if failed { 503 } else { 200 };
            let error = failed.then_some("HTTP 503 Service Unavailable");
            vec![(1, T0, Some(status), error)]
        } else {
            Vec::new()
        };
        assert_eq!(timeline, expected_timeline, "{name}: {id}");
        assert!(
            row.timeline.iter().all(|a| a.latency_us > 0),
            "{name}: {id}"
        );
        assert_eq!(
            row.headers,
            [("content-type".to_owned(), "application/json".to_owned())],
            "{name}: {id}"
        );
        assert_eq!(row.body, body(id), "{name}: {id}");
        assert_eq!(row.body_bytes, body(id).len(), "{name}: {id}");
        assert_eq!(row.expires_at_ms, expires, "{name}: {id}");
        assert_eq!(row.lease, lease, "{name}: {id}");
    }
    // The indexes, as migrated: only fail-1 is runnable (ok-2 waits behind
    // it on run-2), both queue on run-2, one status entry per event, an
    // expiry per settled event.
    // With jobs, bulk's too (its entries sort first): late-1 runnable at
    // its retry, alone in run-3's queue (ok-4 was delivered there), one
    // status entry each (ok-5's as erased), an expiry for ok-4 (delivered)
    // and ok-5 (erased, kept as long as a dead event).
    let s = |v: &str| v.to_owned();
    let nanos = |hm: &str| at(&format!("2027-01-15T{hm}:00Z")).unix_nanos();
    let mut runnable = vec![(s("sume"), retry_at, s("fail-1"))];
    let mut queue = vec![
        (s("sume"), s("run-2"), nanos("07:00"), T0, s("fail-1")),
        (s("sume"), s("run-2"), nanos("07:30"), T0, s("ok-2")),
    ];
    let mut status = vec![
        (s("fragile"), 3, T0, s("fail-2")),
        (s("sume"), 0, T0, s("fail-1")),
        (s("sume"), 0, T0, s("ok-2")),
        (s("sume"), 1, T0, s("ok-1")),
        (s("sume"), 1, T0, s("ok-3")),
        (s("sume"), 2, T0, s("ok-0")),
    ];
    let mut expiry = vec![
        (settled, s("sume"), s("ok-0")),
        (settled, s("sume"), s("ok-1")),
        (settled, s("sume"), s("ok-3")),
        (dead, s("fragile"), s("fail-2")),
    ];
    if let Some(bulk_retry_at) = bulk_retry_at {
        runnable.insert(0, (s("bulk"), bulk_retry_at, s("late-1")));
        queue.insert(0, (s("bulk"), s("run-3"), nanos("06:00"), T0, s("late-1")));
        status.splice(
            0..0,
            [
                (s("bulk"), 0, T0, s("late-1")),
                (s("bulk"), 1, T0, s("ok-4")),
                (s("bulk"), 4, T0, s("ok-5")),
            ],
        );
        expiry.push((settled, s("bulk"), s("ok-4")));
        expiry.push((dead, s("bulk"), s("ok-5")));
        expiry.sort();
    }
    assert_eq!(indexes.runnable, runnable, "{name}");
    assert_eq!(indexes.queue, queue, "{name}");
    assert_eq!(indexes.status, status, "{name}");
    assert_eq!(indexes.expiry, expiry, "{name}");
    assert!(indexes.orphan_bodies.is_empty(), "{name}");
    assert!(indexes.orphan_timelines.is_empty(), "{name}");
    assert!(indexes.orphan_marks.is_empty(), "{name}");
    assert!(indexes.erased_bodies.is_empty(), "{name}");
    assert!(indexes.dedupe.is_empty(), "{name}");
    assert!(indexes.dedupe_expiry.is_empty(), "{name}");
    // The counts a listing and /metrics show, rebuilt on open.
    let summary: Vec<_> = store
        .inbox()
        .inbox_summary()
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.source, s.pending, s.delivered, s.stale, s.dead, s.erased))
        .collect();
    let mut expected = vec![(s("fragile"), 0, 0, 0, 1, 0), (s("sume"), 2, 2, 1, 0, 0)];
    if case.jobs {
        expected.insert(0, (s("bulk"), 1, 1, 0, 0, 1));
    }
    assert_eq!(summary, expected, "{name}");
    if case.jobs {
        check_bulk_reads(case, store).await;
    }
}

/// The rows of the bulk source (cases with jobs; none in others), exactly:
/// ok-4 replayed by the done job and delivered again (a second attempt,
/// its mark kept), late-1 stale, replayed by the cancelled job and pending
/// after its 503, ok-5 delivered, then erased. Answers late-1's retry time.
fn check_bulk_rows(case: &Case, rows: &[&InboxEvent]) -> Option<Millis> {
    let name = case.name;
    if !case.jobs {
        assert!(rows.is_empty(), "{name}: {rows:?}");
        return None;
    }
    let (done, cancelled) = job_ids(case);
    let ids: Vec<_> = rows.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(ids, ["late-1", "ok-4", "ok-5"], "{name}");
    let (late, ok4, ok5) = (rows[0], rows[1], rows[2]);
    // Its one attempt failed: retried after backoff_min, jittered.
    let retry_at = late.due_at_ms;
    assert!(
        (T0 + HOUR / 2..=T0 + HOUR).contains(&retry_at),
        "{name}: late-1 due at {retry_at}"
    );
    let json = vec![("content-type".to_owned(), "application/json".to_owned())];
    let error = "HTTP 503 Service Unavailable";
    let timeline = |e: &InboxEvent| -> Vec<_> {
        e.timeline
            .iter()
            .map(|a| (a.attempt, a.at_ms, a.status, a.error.clone()))
            .collect()
    };
    let mark = |job: &str, base_attempts| {
        Some(ReplayMark {
            job: job.to_owned(),
            base_attempts,
        })
    };
    // Everything but the timeline (its latencies vary), field by field:
    // what the three share, then each one's own.
    let without_timeline = |e: &InboxEvent| InboxEvent {
        timeline: Vec::new(),
        ..e.clone()
    };
    let shared = InboxEvent {
        source: "bulk".to_owned(),
        event_id: String::new(),
        status: EventStatus::Pending,
        stream: None,
        created_at: at("2027-01-15T07:00:00Z"),
        received_at_ms: T0,
        attempts: 0,
        due_at_ms: T0,
        last_error: None,
        force: false,
        headers: json,
        body: Vec::new(),
        expires_at_ms: 0,
        lease: 0,
        body_bytes: 0,
        timeline: Vec::new(),
        replay: None,
    };
    let with_body = |id: &str| InboxEvent {
        event_id: id.to_owned(),
        body: body(id).to_vec(),
        body_bytes: body(id).len(),
        ..shared.clone()
    };
    // late-1: leased once (found stale), replayed (a new generation),
    // leased again; forced past run-3's head (a replay of a stale event);
    // its mark counts from its 0 attempts.
    assert_eq!(
        without_timeline(late),
        InboxEvent {
            stream: Some("run-3".to_owned()),
            created_at: at("2027-01-15T06:00:00Z"),
            attempts: 1,
            due_at_ms: retry_at,
            last_error: Some(error.to_owned()),
            force: true,
            lease: 3,
            replay: mark(&cancelled, 0),
            ..with_body("late-1")
        },
        "{name}: late-1"
    );
    assert_eq!(
        timeline(late),
        [(1, T0, Some(503), Some(error.to_owned()))],
        "{name}: late-1"
    );
    // ok-4: delivered, replayed from its 1 attempt, delivered again as
    // attempt 2 (forced: a replay of a delivered event).
    assert_eq!(
        without_timeline(ok4),
        InboxEvent {
            status: EventStatus::Delivered,
            stream: Some("run-3".to_owned()),
            attempts: 2,
            force: true,
            expires_at_ms: T0 + 7 * DAY,
            lease: 3,
            replay: mark(&done, 1),
            ..with_body("ok-4")
        },
        "{name}: ok-4"
    );
    assert_eq!(
        timeline(ok4),
        [(1, T0, Some(200), None), (2, T0, Some(200), None)],
        "{name}: ok-4"
    );
    // ok-5: erased: no body, no headers, a new lease generation, kept as
    // long as a dead event; its attempt stays in its timeline.
    assert_eq!(
        without_timeline(ok5),
        InboxEvent {
            event_id: "ok-5".to_owned(),
            status: EventStatus::Erased,
            created_at: at("2027-01-15T07:50:00Z"),
            attempts: 1,
            headers: Vec::new(),
            expires_at_ms: T0 + 30 * DAY,
            lease: 2,
            ..shared.clone()
        },
        "{name}: ok-5"
    );
    assert_eq!(timeline(ok5), [(1, T0, Some(200), None)], "{name}: ok-5");
    for row in rows {
        assert!(
            row.timeline.iter().all(|a| a.latency_us > 0),
            "{name}: {}",
            row.event_id
        );
    }
    Some(retry_at)
}

/// The bulk source as the operator API reads it: the erased event shown
/// and listed as erased, the replayed ones with their marks.
async fn check_bulk_reads(case: &Case, store: &RedbStore) {
    let name = case.name;
    let inbox = &store.inbox();
    let (done, cancelled) = job_ids(case);
    let erased = inbox.inbox_event("bulk", "ok-5").await.unwrap().unwrap();
    assert_eq!(
        (
            erased.status,
            erased.headers.is_empty(),
            erased.body.is_empty(),
            erased.body_bytes,
            erased.replay.clone()
        ),
        (EventStatus::Erased, true, true, 0, None),
        "{name}: {erased:?}"
    );
    let replay = |id: &'static str| async move {
        let e = inbox.inbox_event("bulk", id).await.unwrap().unwrap();
        e.replay.map(|m| (m.job, m.base_attempts))
    };
    assert_eq!(replay("ok-4").await, Some((done.clone(), 1)), "{name}");
    assert_eq!(
        replay("late-1").await,
        Some((cancelled.clone(), 0)),
        "{name}"
    );
    let listed = |status| async move {
        let (events, next) = inbox
            .list_events("bulk", status, ListOrder::OldestFirst, None, 10)
            .await
            .unwrap();
        assert_eq!(next, None);
        events
            .into_iter()
            .map(|e| (e.event_id, e.replay.map(|m| m.job)))
            .collect::<Vec<_>>()
    };
    let s = |v: &str| v.to_owned();
    assert_eq!(
        listed(EventStatus::Erased).await,
        [(s("ok-5"), None)],
        "{name}"
    );
    assert_eq!(
        listed(EventStatus::Delivered).await,
        [(s("ok-4"), Some(done.clone()))],
        "{name}"
    );
    assert_eq!(
        listed(EventStatus::Pending).await,
        [(s("late-1"), Some(cancelled.clone()))],
        "{name}"
    );
    assert_eq!(listed(EventStatus::Stale).await, [], "{name}");
    let ids = ["late-1", "ok-4", "ok-5", "ok-6"].map(s).to_vec();
    let states: Vec<Option<(EventStatus, Option<String>)>> = inbox
        .replay_states("bulk", ids)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.map(|ReplayState { status, job, .. }| (status, job)))
        .collect();
    assert_eq!(
        states,
        [
            Some((EventStatus::Pending, Some(cancelled))),
            Some((EventStatus::Delivered, Some(done))),
            Some((EventStatus::Erased, None)),
            None,
        ],
        "{name}"
    );
}

/// The bulk jobs' records (cases with jobs), exactly as the build wrote
/// them, and as this build decodes them; the claim by which the runner
/// ran the cancelled one, kept only when the process was killed.
async fn check_jobs(case: &Case, store: &RedbStore) {
    let name = case.name;
    let (done, cancelled) = job_ids(case);
    let jobs = store.inbox().jobs().await.unwrap();
    let mut expected = vec![(done.clone(), false), (cancelled.clone(), true)];
    expected.sort();
    assert_eq!(
        jobs.iter()
            .map(|j| (j.id.clone(), j.cancelled))
            .collect::<Vec<_>>(),
        expected,
        "{name}"
    );
    // Every field of the filter is written, null when not given.
    let filter = |status: &str| {
        serde_json::json!({
            "status": status,
            "received_from": null,
            "received_to": null,
            "created_from": null,
            "created_to": null,
            "stream": null,
            "field": null,
            "error_contains": null,
        })
    };
    for stored in &jobs {
        let record: serde_json::Value = serde_json::from_slice(&stored.record).unwrap();
        let expected = if stored.id == done {
            serde_json::json!({
                "id": done,
                "source": "bulk",
                "kind": "redeliver",
                "filter": filter("delivered"),
                "state": "done",
                "created_ms": T0,
                "finished_ms": T0,
                "cursor": [T0, "ok-4"],
                "scanned_all": true,
                "scanned": 1,
                "matched": 1,
                "delivered": 1,
                "failed": 0,
                "erased": 0,
                "skipped": 0,
                "window": [],
                "error": null,
            })
        } else {
            serde_json::json!({
                "id": cancelled,
                "source": "bulk",
                "kind": "redeliver",
                "filter": filter("stale"),
                "state": "running",
                "created_ms": T0,
                "finished_ms": null,
                "cursor": [T0, "late-1"],
                "scanned_all": true,
                "scanned": 1,
                "matched": 1,
                "delivered": 0,
                "failed": 0,
                "erased": 0,
                "skipped": 0,
                "window": ["late-1"],
                "error": null,
            })
        };
        // From schema 12 on, a job names the lanes it reads and the lane
        // its scan is in, and its cursor stays where a pass left it (a
        // pass that read to the end leaves none).
        let mut expected = expected;
        if case.schema >= 12 {
            expected["lanes"] = serde_json::json!(["bulk"]);
            expected["lane"] = serde_json::Value::Null;
            expected["cursor"] = serde_json::Value::Null;
        }
        assert_eq!(record, expected, "{name}: {}", stored.id);
        let job = Job::decode(stored).unwrap_or_else(|| panic!("{name}: {}", stored.id));
        let state = if stored.id == done {
            JobState::Done
        } else {
            JobState::Running
        };
        assert_eq!(
            (job.kind, job.state, job.cancelled),
            (JobKind::Redeliver, state, stored.cancelled),
            "{name}"
        );
    }
    // The runner released the done job's claim when it finished, and the
    // cancelled one's when it stopped (SIGTERM); after a SIGKILL, that
    // claim is there, for 30 s from the frozen clock.
    assert_eq!(
        store.get(&job_claim(&done), NOW).await.unwrap(),
        None,
        "{name}"
    );
    assert_eq!(
        store.get(&job_claim(&cancelled), NOW).await.unwrap(),
        if case.replays {
            claim_view(ClaimState::Processing, 6, T0 + 30_000)
        } else {
            None
        },
        "{name}"
    );
}

/// A table keyed by row id, as `claim_rows` and `kv_rows`: (key, value,
/// expiry).
type ByRowId = TableDefinition<'static, u64, (&'static [u8], &'static [u8], Option<u64>)>;

/// Every applied event as stored, and the delivered events' claims the
/// first gateways kept, read from the closed file.
fn check_tables(case: &Case, path: &Path) {
    let dir = TempDir::new().unwrap();
    let copy = dir.path().join("copy.redb");
    std::fs::copy(path, &copy).unwrap();
    let db = redb::Database::open(&copy).unwrap();
    let tx = db.begin_read().unwrap();
    let events: TableDefinition<&str, (&str, i128, u64, u64, u8)> =
        TableDefinition::new("applied_events");
    let events: Vec<_> = tx
        .open_table(events)
        .unwrap()
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            let (stream, created_at, applied_at, expires_at, outcome) = v.value();
            (
                k.value().to_owned(),
                stream.to_owned(),
                created_at,
                applied_at,
                expires_at,
                outcome,
            )
        })
        .collect();
    let retention = T0 + 30 * DAY;
    let nanos = |t: &str| at(t).unix_nanos();
    let mut expected = vec![
        // (event, stream, created_at, applied at, expires, 0 applied / 1 stale)
        (
            "a/evt-a".to_owned(),
            "a/orders".to_owned(),
            nanos("2027-01-15T07:00:00Z"),
            T0,
            retention,
            1,
        ),
        (
            "a/evt-b".to_owned(),
            "a/orders".to_owned(),
            nanos("2027-01-15T07:05:00Z"),
            T0,
            retention,
            0,
        ),
        (
            "a/evt-c".to_owned(),
            "a/payments".to_owned(),
            nanos("2027-01-15T07:10:00Z"),
            T0,
            retention,
            0,
        ),
    ];
    if case.jobs {
        expected.push((
            "g/bulk/ok-4".to_owned(),
            "g/bulk/run-3".to_owned(),
            nanos("2027-01-15T07:00:00Z"),
            T0,
            retention,
            0,
        ));
    }
    if case.gateway != Gateway::Absent {
        expected.push((
            "g/sume/ok-1".to_owned(),
            "g/sume/run-1".to_owned(),
            nanos("2027-01-15T07:00:00Z"),
            T0,
            retention,
            0,
        ));
    }
    assert_eq!(events, expected, "{}", case.name);

    // Claims by row id (schema 10 on): (key, value, expiry), the value
    // being state, token, fence (little-endian) and fingerprint.
    let claims: ByRowId = TableDefinition::new("claim_rows");
    let mut claims: Vec<_> = tx
        .open_table(claims)
        .unwrap()
        .iter()
        .unwrap()
        .map(|e| {
            let (_, v) = e.unwrap();
            let (k, value, expires_at) = v.value();
            let fence = u64::from_le_bytes(value[17..25].try_into().unwrap());
            (
                String::from_utf8(k.to_vec()).unwrap(),
                value[0],
                fence,
                expires_at.unwrap(),
            )
        })
        .collect();
    claims.sort();
    // The job runner's claims: only the cancelled job's, still running
    // when the process was killed.
    let job_claims: Vec<_> = claims
        .iter()
        .filter(|(k, ..)| k.starts_with("s/"))
        .cloned()
        .collect();
    let expected_job_claims = if case.jobs && case.replays {
        let (_, cancelled) = job_ids(case);
        vec![(job_claim(&cancelled).as_str().to_owned(), 0, 6, T0 + 30_000)]
    } else {
        Vec::new()
    };
    assert_eq!(job_claims, expected_job_claims, "{}", case.name);
    let claims: Vec<_> = claims
        .into_iter()
        .filter(|(k, ..)| k.starts_with("g/"))
        .collect();
    let gateway_claims = match case.gateway {
        Gateway::NoLease | Gateway::WithClaims => vec![
            ("g/sume/ok-1".to_owned(), 1, 5, T0 + 7 * DAY),
            ("g/sume/ok-3".to_owned(), 1, 6, T0 + 7 * DAY),
        ],
        Gateway::Absent | Gateway::Current => Vec::new(),
    };
    assert_eq!(claims, gateway_claims, "{}", case.name);
}

/// What a user does next, on the file opened again: the claims' owners
/// finish with their tokens, repeats stay duplicates.
async fn check_use(case: &Case, store: &RedbStore, last_fence: u64) {
    let name = case.name;
    let ttl = Ttl::from_ms_unchecked(DAY);
    assert_eq!(
        store
            .done(
                &api("job-processing"),
                token(case, "job-processing"),
                ttl,
                NOW
            )
            .await
            .unwrap(),
        DoneOutcome::Done {
            expires_at_ms: NOW + DAY
        },
        "{name}: the claim's owner finishes it"
    );
    assert_eq!(
        store
            .extend(&api("job-extended"), token(case, "job-extended"), ttl, NOW)
            .await
            .unwrap(),
        ExtendOutcome::Extended {
            expires_at_ms: NOW + DAY
        },
        "{name}"
    );
    assert!(matches!(
        store.claim(&api("job-done"), ttl, None, NOW).await.unwrap(),
        ClaimOutcome::Done { .. }
    ));
    let claimed = store
        .claim(&api("job-released"), ttl, None, NOW)
        .await
        .unwrap();
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { fence, .. } if fence == last_fence + 1),
        "{name}: fences go on from the last one handed out ({last_fence}): {claimed:?}"
    );
    for (stream, event, created_at) in [
        ("orders", "evt-b", "2027-01-15T07:05:00Z"),
        ("orders", "evt-a", "2027-01-15T07:00:00Z"),
        ("payments", "evt-c", "2027-01-15T07:10:00Z"),
    ] {
        let result = store
            .apply(&api(stream), &api(event), at(created_at), DAY, NOW)
            .await
            .unwrap();
        assert_eq!(result.outcome, ApplyOutcome::Duplicate, "{name}: {event}");
    }
    if case.gateway != Gateway::Absent {
        for &(source, id, body) in bodies(case) {
            let again = NewEvent {
                source: source.to_owned(),
                event_id: id.to_owned(),
                stream: None,
                created_at: at("2027-01-15T07:00:00Z"),
                received_at_ms: NOW,
                headers: Vec::new(),
                body: body.as_bytes().to_vec(),
            };
            assert_eq!(
                store.inbox().ingest(again, NOW).await.unwrap(),
                IngestOutcome::Duplicate,
                "{name}: {source}/{id} again"
            );
        }
    }
    if case.jobs {
        // A job replays an event once: ok-4 again by the job that
        // replayed it is refused (and changes nothing).
        let (done, _) = job_ids(case);
        assert_eq!(
            store
                .inbox()
                .replay("bulk", "ok-4", &done, NOW)
                .await
                .unwrap(),
            RedeliverOutcome::NotRedeliverable(EventStatus::Delivered),
            "{name}"
        );
    }
}

/// Opens a copy of `case` twice with this build and checks both times.
async fn open_golden(case: Case) {
    let (_dir, path) = copy(&case, true);
    let name = case.name;
    // The file is what the case says: a guard against a golden file
    // written by the wrong build.
    assert_eq!(
        meta_value(&path, "schema_version"),
        Some(case.schema),
        "{name}"
    );
    let log = wal_of(&path);
    if let Some(format) = case.log {
        let header = format!("DDWAL{format:02}\n");
        assert!(
            std::fs::read(&log).unwrap().starts_with(header.as_bytes()),
            "{name}: a format {format} log"
        );
    }
    let bound_before = meta_value(&path, "file_id_hi").is_some();
    assert_eq!(
        bound_before,
        case.log.is_some_and(|f| f >= 2),
        "{name}: its id"
    );

    opens_with_everything(&case, &path).await;
}

/// Opens `path`, a copy of `case` (migrated or not yet), and finds
/// everything: migrated for good, the log rewritten, and the store in use.
async fn opens_with_everything(case: &Case, path: &Path) {
    let name = case.name;
    let log = wal_of(path);
    let store = RedbStore::open(&options(path)).unwrap();
    check_contents(case, &store).await;
    store.close().await;

    // Migrated for good: this build's schema, an id, and a log bound to it
    // in this build's format.
    assert_eq!(
        meta_value(path, "schema_version"),
        Some(current_schema().await),
        "{name}"
    );
    let id = file_id(path);
    let header = std::fs::read(&log).unwrap();
    assert!(
        header.starts_with(b"DDWAL07\n"),
        "{name}: {:?}",
        &header[..8]
    );
    assert_eq!(
        header[8..24],
        id.to_le_bytes(),
        "{name}: the log names its file"
    );
    check_tables(case, path);
    let last_fence = meta_value(path, "fence").unwrap();

    let store = RedbStore::open(&options(path)).unwrap();
    check_contents(case, &store).await;
    check_use(case, &store, last_fence).await;
    store.close().await;
    assert_eq!(file_id(path), id, "{name}: the id is given once");
}

/// A log case's data file alone holds none of the scenario: what the
/// first open finds came from replaying the log.
async fn data_file_alone_is_empty(case: Case) {
    assert!(case.replays);
    let (_dir, path) = copy(&case, false);
    let store = match RedbStore::open(&options(&path)) {
        Ok(store) => store,
        // Builds from log format 3 on mark a file whose log holds batches,
        // and refuse it alone: read its tables raw instead.
        Err(OpenError::MissingLog { .. }) if case.log.is_some_and(|f| f >= 3) => {
            let db = redb::Database::open(&path).unwrap();
            let tx = db.begin_read().unwrap();
            for table in tx.list_tables().unwrap() {
                let name = redb::TableHandle::name(&table).to_owned();
                if name == "meta" {
                    continue;
                }
                let rows = redb::ReadableTableMetadata::len(&tx.open_untyped_table(table).unwrap())
                    .unwrap();
                assert_eq!(rows, 0, "{}: table {name} of the file alone", case.name);
            }
            return;
        }
        Err(e) => panic!("{}: {e}", case.name),
    };
    assert_eq!(store.get(&api("job-processing"), NOW).await.unwrap(), None);
    assert_eq!(store.head(&api("orders"), NOW).await.unwrap(), None);
    assert!(store.inbox().inbox_indexes().await.unwrap().rows.is_empty());
    assert_eq!(
        store
            .keyspace()
            .get(b"kv:plain".to_vec(), NOW)
            .await
            .unwrap(),
        None
    );
    store.close().await;
}

const SCHEMA_1_CLAIMS: Case = case("schema-1-claims", 1, Gateway::Absent);
const SCHEMA_1_NO_LEASE: Case = case("schema-1-no-lease", 1, Gateway::NoLease);
const SCHEMA_1: Case = case("schema-1", 1, Gateway::WithClaims);
const SCHEMA_2: Case = case("schema-2", 2, Gateway::Current);
const SCHEMA_3: Case = Case {
    log: Some(1),
    ..case("schema-3", 3, Gateway::Current)
};
const SCHEMA_4: Case = Case {
    log: Some(1),
    keyspace: true,
    ..case("schema-4", 4, Gateway::Current)
};
const SCHEMA_5: Case = Case {
    log: Some(1),
    keyspace: true,
    ..case("schema-5", 5, Gateway::Current)
};
const SCHEMA_6: Case = Case {
    log: Some(1),
    keyspace: true,
    ..case("schema-6", 6, Gateway::Current)
};
const SCHEMA_7: Case = Case {
    log: Some(2),
    keyspace: true,
    ..case("schema-7", 7, Gateway::Current)
};
const SCHEMA_8: Case = Case {
    log: Some(3),
    keyspace: true,
    timelines: true,
    ..case("schema-8", 8, Gateway::Current)
};
const LOG_FORMAT_1: Case = Case {
    log: Some(1),
    replays: true,
    keyspace: true,
    ..case("log-format-1", 6, Gateway::Current)
};
const LOG_FORMAT_2: Case = Case {
    log: Some(2),
    replays: true,
    keyspace: true,
    ..case("log-format-2", 6, Gateway::Current)
};
const LOG_FORMAT_3: Case = Case {
    log: Some(3),
    replays: true,
    keyspace: true,
    timelines: true,
    ..case("log-format-3", 8, Gateway::Current)
};
const SCHEMA_9: Case = Case {
    log: Some(4),
    keyspace: true,
    timelines: true,
    jobs: true,
    ..case("schema-9", 9, Gateway::Current)
};
const SCHEMA_10: Case = Case {
    log: Some(5),
    keyspace: true,
    timelines: true,
    jobs: true,
    ..case("schema-10", 10, Gateway::Current)
};
const SCHEMA_11: Case = Case {
    log: Some(5),
    keyspace: true,
    timelines: true,
    jobs: true,
    ..case("schema-11", 11, Gateway::Current)
};
const SCHEMA_12: Case = Case {
    log: Some(6),
    keyspace: true,
    timelines: true,
    jobs: true,
    ..case("schema-12", 12, Gateway::Current)
};
const SCHEMA_13: Case = Case {
    log: Some(7),
    keyspace: true,
    timelines: true,
    jobs: true,
    results: true,
    ..case("schema-13", 13, Gateway::Current)
};
const SCHEMA_14: Case = Case {
    log: Some(7),
    keyspace: true,
    timelines: true,
    jobs: true,
    results: true,
    ..case("schema-14", 14, Gateway::Current)
};
const LOG_FORMAT_7: Case = Case {
    log: Some(7),
    replays: true,
    keyspace: true,
    timelines: true,
    jobs: true,
    results: true,
    ..case("log-format-7", 13, Gateway::Current)
};
const LOG_FORMAT_4: Case = Case {
    log: Some(4),
    replays: true,
    keyspace: true,
    timelines: true,
    jobs: true,
    ..case("log-format-4", 9, Gateway::Current)
};

#[tokio::test]
async fn a_schema_1_file_of_claims_only_opens_with_everything() {
    open_golden(SCHEMA_1_CLAIMS).await;
}

#[tokio::test]
async fn a_schema_1_file_without_lease_generations_opens_with_everything() {
    open_golden(SCHEMA_1_NO_LEASE).await;
}

#[tokio::test]
async fn a_schema_1_file_opens_with_everything() {
    open_golden(SCHEMA_1).await;
}

#[tokio::test]
async fn a_schema_2_file_opens_with_everything() {
    open_golden(SCHEMA_2).await;
}

#[tokio::test]
async fn a_schema_7_file_and_its_log_open_with_everything() {
    open_golden(SCHEMA_7).await;
}

#[tokio::test]
async fn a_schema_8_file_and_its_log_open_with_every_attempt_timeline() {
    open_golden(SCHEMA_8).await;
}

#[tokio::test]
async fn a_schema_9_file_and_its_log_open_with_erased_events_replay_marks_and_jobs() {
    open_golden(SCHEMA_9).await;
}

/// The migration from schema 9 copies the claims (schema 10) in the
/// transaction of the version bump (to the current one): a disk that fills
/// anywhere in an upgrade's first open fails the open and loses nothing.
/// The file is at schema 9 or the current one, never between, and the next
/// open, with room, finds everything.
#[tokio::test]
async fn a_disk_that_fills_during_the_schema_10_migration_loses_nothing() {
    let mut left_at_9 = 0;
    // Every cut point while the upgrade is small, then doubling.
    for room in (0..64).chain((6..20).map(|i| 1u64 << i)) {
        let (_dir, path) = copy(&SCHEMA_9, true);
        let plan = FaultPlan::new();
        plan.fill_after_writes(room);
        let mut opts = options(&path);
        opts.faults = Some(plan.clone());
        match RedbStore::open(&opts) {
            Ok(store) => {
                // Room enough for the whole upgrade.
                assert_eq!(plan.injected(), 0, "after {room} writes");
                store.close().await;
                // Cuts before the migration's commit and inside it leave
                // schema 9 (its two writes to the data file come after
                // five others of the open, and the log's writes count
                // too); the later ones, in the log's rewrite, the
                // checkpoint and the key file's creation, leave the current.
                assert!(
                    left_at_9 > 1,
                    "only {left_at_9} cut points left the file at schema 9"
                );
                return;
            }
            Err(e) => {
                assert!(plan.injected() > 0, "after {room} writes: {e}");
                let schema = meta_value(&path, "schema_version");
                let current = current_schema().await;
                assert!(
                    schema == Some(9) || schema == Some(current),
                    "after {room} writes: schema {schema:?} ({e})"
                );
                left_at_9 += usize::from(schema == Some(9));
                opens_with_everything(&SCHEMA_9, &path).await;
            }
        }
    }
    panic!("the upgrade never finished within 2^19 writes");
}

#[tokio::test]
async fn a_schema_10_file_with_claims_by_row_id_opens_with_everything() {
    open_golden(SCHEMA_10).await;
}

/// The first schema whose log is two files (`.wal` and `.wal2`), both
/// as the build left them.
#[tokio::test]
async fn a_schema_11_file_and_its_two_log_segments_open_with_everything() {
    open_golden(SCHEMA_11).await;
}

/// The first schema whose dones keep a result: each result as it was
/// sent, on a later claim and a read, the one past the index's inline
/// size too.
#[tokio::test]
async fn a_schema_13_file_opens_with_every_done_result() {
    open_golden(SCHEMA_13).await;
}

/// The first schema whose bulk jobs' records are sealed (each under a key
/// slot of its own, in the key file beside): every record opens, exactly
/// as the build wrote it, and the open keeps their keys.
#[tokio::test]
async fn a_schema_14_file_opens_with_its_sealed_job_records() {
    let (_dir, path) = copy(&SCHEMA_14, true);
    let db = redb::Database::open(&path).unwrap();
    let jobs: TableDefinition<&str, (&[u8], bool)> = TableDefinition::new("inbox_jobs");
    let tx = db.begin_read().unwrap();
    let table = tx.open_table(jobs).unwrap();
    let mut sealed = 0;
    for row in table.iter().unwrap() {
        let (_, v) = row.unwrap();
        assert!(v.value().0.starts_with(b"DDSEAL1\0"), "a sealed record");
        sealed += 1;
    }
    assert_eq!(sealed, 2);
    drop((table, tx, db));
    open_golden(SCHEMA_14).await;
}

/// A format 7 log holding dones that keep a result (`DoneResult`), every
/// batch replayed after a SIGKILL.
#[tokio::test]
async fn a_format_7_log_replays_dones_with_their_results() {
    open_golden(LOG_FORMAT_7).await;
}

/// The first schema whose inbox events are sealed: every body and its
/// headers open with the key file the build left beside it.
#[tokio::test]
async fn a_schema_12_file_its_log_and_its_key_file_open_with_everything() {
    open_golden(SCHEMA_12).await;
}

#[tokio::test]
async fn a_schema_3_file_and_its_log_open_with_everything() {
    open_golden(SCHEMA_3).await;
}

#[tokio::test]
async fn a_schema_4_file_and_its_log_open_with_everything() {
    open_golden(SCHEMA_4).await;
}

#[tokio::test]
async fn a_schema_5_file_and_its_log_open_with_everything() {
    open_golden(SCHEMA_5).await;
}

#[tokio::test]
async fn a_schema_6_file_and_its_log_open_with_everything() {
    open_golden(SCHEMA_6).await;
}

#[tokio::test]
async fn a_format_1_log_is_replayed_then_rewritten_in_the_current_format() {
    data_file_alone_is_empty(LOG_FORMAT_1).await;
    open_golden(LOG_FORMAT_1).await;
}

#[tokio::test]
async fn a_format_2_log_is_replayed() {
    data_file_alone_is_empty(LOG_FORMAT_2).await;
    open_golden(LOG_FORMAT_2).await;
}

#[tokio::test]
async fn a_format_3_log_is_replayed_with_its_attempts() {
    data_file_alone_is_empty(LOG_FORMAT_3).await;
    open_golden(LOG_FORMAT_3).await;
}

#[tokio::test]
async fn a_format_4_log_is_replayed_with_its_erasure_replays_and_jobs() {
    data_file_alone_is_empty(LOG_FORMAT_4).await;
    open_golden(LOG_FORMAT_4).await;
}

/// Every directory under tests/golden/ is a case checked here.
#[test]
fn every_golden_file_is_checked() {
    let cases = [
        SCHEMA_1_CLAIMS,
        SCHEMA_1_NO_LEASE,
        SCHEMA_1,
        SCHEMA_2,
        SCHEMA_3,
        SCHEMA_4,
        SCHEMA_5,
        SCHEMA_6,
        SCHEMA_7,
        SCHEMA_8,
        SCHEMA_9,
        SCHEMA_10,
        SCHEMA_11,
        SCHEMA_12,
        SCHEMA_13,
        SCHEMA_14,
        LOG_FORMAT_1,
        LOG_FORMAT_2,
        LOG_FORMAT_3,
        LOG_FORMAT_4,
        LOG_FORMAT_7,
    ];
    let mut dirs: Vec<String> = std::fs::read_dir(golden_dir(""))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    dirs.sort();
    let mut names: Vec<String> = cases.iter().map(|c| c.name.to_owned()).collect();
    names.sort();
    assert_eq!(dirs, names);
}

/// Destinations over a file of schema 9 (before destinations): its rows
/// are the deliveries of each source's destination `default`, in the
/// lane of the source's own name, with their state, order and stream
/// heads; nothing is rewritten. A source given destinations `default`
/// and `extra` dedupes a provider's retry of an event from before against
/// those rows, routes a new event into both lanes, keeps one neither
/// takes as filtered, and a new lane starts with nothing pending.
#[tokio::test]
async fn a_schema_9_files_rows_are_the_default_destinations_deliveries() {
    let (_dir, path) = copy(&SCHEMA_9, true);
    let store = RedbStore::open(&options(&path)).unwrap();
    let inbox = store.inbox();
    let lanes = vec!["sume".to_owned(), "sume.extra".to_owned()];
    let new = |id: &str, stream: &str, created: &str| NewEvent {
        source: "sume".to_owned(),
        event_id: id.to_owned(),
        stream: Some(stream.to_owned()),
        created_at: at(created),
        received_at_ms: NOW,
        headers: Vec::new(),
        body: format!(r#"{{"request_id":"{id}"}}"#).into_bytes(),
    };
    // The pending rows from before stay where they were, as they were.
    let fail_1 = inbox.inbox_event("sume", "fail-1").await.unwrap().unwrap();
    assert_eq!((fail_1.status, fail_1.attempts), (EventStatus::Pending, 1));
    // A retry of an event from before: a duplicate, into no lane.
    assert_eq!(
        inbox
            .ingest_routed(
                new("ok-1", "run-1", "2027-01-15T07:30:00Z"),
                lanes.clone(),
                lanes.clone(),
                DAY,
                NOW
            )
            .await
            .unwrap(),
        IngestOutcome::Duplicate
    );
    assert!(
        inbox
            .inbox_event("sume.extra", "ok-1")
            .await
            .unwrap()
            .is_none()
    );
    // A new event goes into both lanes; one neither takes is filtered.
    assert_eq!(
        inbox
            .ingest_routed(
                new("new-1", "run-9", "2027-01-15T07:40:00Z"),
                lanes.clone(),
                lanes.clone(),
                DAY,
                NOW
            )
            .await
            .unwrap(),
        IngestOutcome::Accepted
    );
    for lane in &lanes {
        let e = inbox.inbox_event(lane, "new-1").await.unwrap().unwrap();
        assert_eq!(e.status, EventStatus::Pending, "{lane}");
        assert_eq!(e.body, br#"{"request_id":"new-1"}"#, "{lane}");
    }
    assert_eq!(
        inbox
            .ingest_routed(
                new("new-2", "run-9", "2027-01-15T07:41:00Z"),
                Vec::new(),
                lanes.clone(),
                DAY,
                NOW
            )
            .await
            .unwrap(),
        IngestOutcome::Accepted
    );
    let filtered = inbox.inbox_event("sume", "new-2").await.unwrap().unwrap();
    assert_eq!(
        (filtered.status, filtered.expires_at_ms),
        (EventStatus::Filtered, NOW + DAY)
    );
    // The counts by lane: the old rows and new-1 in sume (default),
    // new-1 alone in sume.extra; new-2 filtered.
    let summary = inbox.inbox_summary().await.unwrap();
    let of = |lane: &str| summary.iter().find(|s| s.source == lane).cloned().unwrap();
    assert_eq!((of("sume").pending, of("sume").filtered), (3, 1));
    assert_eq!(
        (of("sume.extra").pending, of("sume.extra").delivered),
        (1, 0)
    );
    // The head of run-1 (moved by ok-1 before the upgrade) still holds in
    // the default destination's lane: an older event of run-1 routed there
    // is stale when its turn comes.
    let head = store
        .head(&gateway_key("sume", "run-1"), NOW)
        .await
        .unwrap();
    assert!(head.is_some(), "the head of run-1 is the default lane's");
    let extra = store
        .head(&gateway_key("sume.extra", "run-1"), NOW)
        .await
        .unwrap();
    assert!(extra.is_none(), "a new lane has heads of its own");
    store.close().await;
}
