//! The write-ahead log's decoder over arbitrary and mutated logs: a real
//! log written by the store (claims, dones, applies, an ingested webhook,
//! keyspace writes) with bytes flipped, records cut, declared lengths up to
//! 4 GiB, and payloads replaced by any bytes under a valid checksum (so
//! they reach the batch decoder). It must stop or refuse — never panic, and
//! never allocate by a length a record declares.

use std::sync::{Arc, OnceLock};

use dedupd::domain::{CreatedAt, Key, ScopedKey, Token, Ttl};
use dedupd::store::Store;
use dedupd::store::inbox::{Inbox, NewEvent};
use dedupd::store::keyspace::{KvRequest, SetCondition, SetExpiry};
use dedupd::store::redb::{RedbOptions, RedbStore, WalContents, decode_wal};
use proptest::prelude::*;
use tempfile::TempDir;

use crate::{bounded, config, config_with, hostile_bytes, serial};

/// Bytes of a log's header (format 2: magic, data file id, checksum).
const HEADER: usize = 28;

/// A log the store wrote, cut at the end of its valid records, with where
/// each record starts and ends.
struct Seed {
    /// The data file's bytes after a clean close (the log's records are
    /// numbered up to what it holds). Kept in memory: a directory held by
    /// a static is never removed, and each run left one behind.
    data: Vec<u8>,
    /// The log's bytes up to its last valid record.
    bytes: Vec<u8>,
    /// (start, end) of each record.
    records: Vec<(usize, usize)>,
    /// The last batch's sequence number.
    last: u64,
}

const NOW: u64 = 1_800_000_000_000;

fn key(k: &str) -> ScopedKey {
    ScopedKey::api(&Key::parse(k, "key").unwrap())
}

/// Writes one of each kind of request through a real store, closes it and
/// reads its log.
fn seed() -> &'static Seed {
    static SEED: OnceLock<Seed> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = TempDir::new().unwrap();
        let mut opts = RedbOptions::new(dir.path().join("seed.redb"));
        opts.cache_bytes = 4 * 1024 * 1024;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Arc::new(RedbStore::open(&opts).unwrap());
            let ttl = Ttl::from_ms_unchecked(60_000);
            for i in 0..4 {
                let k = key(&format!("claim-{i}"));
                let outcome = store.claim(&k, ttl, None, NOW + i).await.unwrap();
                if let dedupd::store::ClaimOutcome::Claimed { token, .. } = outcome {
                    let _ = store.done(&k, token, ttl, NOW + i).await.unwrap();
                }
            }
            let _ = store.release(&key("claim-x"), Token::random(), NOW).await;
            let at = CreatedAt::parse("2026-11-30T10:00:00Z", "created_at").unwrap();
            let _ = store
                .apply(&key("stream"), &key("event-1"), at, 60_000, NOW)
                .await
                .unwrap();
            let _ = store
                .inbox()
                .ingest(
                    NewEvent {
                        source: "fuzz".into(),
                        event_id: "evt_1".into(),
                        stream: Some("run_1".into()),
                        created_at: at,
                        received_at_ms: NOW,
                        headers: vec![("content-type".into(), "application/json".into())],
                        body: br#"{"id":"evt_1","data":"\u001b[31m"}"#.to_vec(),
                    },
                    NOW,
                )
                .await
                .unwrap();
            let set = store
                .keyspace()
                .submit(
                    KvRequest::Set {
                        key: b"k".to_vec(),
                        value: vec![0xff; 300],
                        condition: SetCondition::Always,
                        expiry: SetExpiry::At(i64::try_from(NOW).unwrap() + 60_000),
                        get: true,
                    },
                    NOW,
                )
                .await
                .unwrap();
            let _ = set.await.unwrap();
            store.close().await;
        });
        let bytes = std::fs::read(dir.path().join("seed.redb.wal")).unwrap();
        let WalContents::Log { seqs, end, .. } = decode_wal(&bytes, 0) else {
            panic!("the store's own log does not decode")
        };
        assert!(seqs.len() >= 5, "{seqs:?}");
        let bytes = bytes[..end].to_vec();
        let mut records = Vec::new();
        assert!(bytes.starts_with(b"DDWAL07\n"));
        let mut at = HEADER;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            records.push((at, at + 8 + len));
            at += 8 + len;
        }
        let data = std::fs::read(dir.path().join("seed.redb")).unwrap();
        Seed {
            data,
            bytes,
            records,
            last: *seqs.last().unwrap(),
        }
    })
}

/// The seed log's header: a valid one, bound to the seed's data file.
fn seed_header() -> Vec<u8> {
    seed().bytes[..HEADER].to_vec()
}

/// A record: `len | crc32(payload) | payload`.
fn record(payload: &[u8]) -> Vec<u8> {
    let mut r = u32::try_from(payload.len()).unwrap().to_le_bytes().to_vec();
    r.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// A postcard varint.
fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// What is done to the seed log.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR the byte at an index with a mask.
    Flip(prop::sample::Index, u8),
    /// Cut the log at an index.
    Cut(prop::sample::Index),
    /// Declare a record's length as this (its checksum left as it is).
    Length(prop::sample::Index, u32),
    /// Replace a record's payload (numbered `seq`, then these bytes) and
    /// give it a valid checksum, so the batch decoder reads it.
    Payload(prop::sample::Index, u64, Vec<u8>),
    /// Append a record with this payload and a valid checksum.
    Append(Vec<u8>),
}

/// Payload bytes a decoder must survive: any bytes, and a batch that
/// declares up to 2^63 requests or bytes where a few follow.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => hostile_bytes(),
        2 => (prop_oneof![Just(u64::MAX >> 1), Just(u64::from(u32::MAX)), Just(1u64 << 28), 0u64..64], prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(count, rest)| [varint(count), rest].concat()),
        1 => (0u64..64, prop::collection::vec(any::<u8>(), 0..8), prop_oneof![Just(u64::MAX >> 1), Just(1u64 << 30)])
            .prop_map(|(ops, mid, len)| [varint(ops), mid, varint(len)].concat()),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let index = any::<prop::sample::Index>;
    prop_oneof![
        3 => (index(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        1 => index().prop_map(Mutation::Cut),
        2 => (index(), prop_oneof![Just(u32::MAX), Just(1 << 31), Just(1 << 28), any::<u32>()])
            .prop_map(|(i, n)| Mutation::Length(i, n)),
        3 => (index(), prop_oneof![Just(0u64), 1u64..16, Just(u64::MAX)], payload())
            .prop_map(|(i, seq, p)| Mutation::Payload(i, seq, p)),
        1 => payload().prop_map(Mutation::Append),
    ]
}

/// The seed with `mutation` done, and the offset before which it is left
/// as it was.
fn mutate(seed: &Seed, mutation: &Mutation) -> (Vec<u8>, usize) {
    let mut bytes = seed.bytes.clone();
    match mutation {
        Mutation::Flip(i, mask) => {
            let at = i.index(bytes.len());
            bytes[at] ^= mask;
            (bytes, at)
        }
        Mutation::Cut(i) => {
            let at = i.index(bytes.len() + 1);
            bytes.truncate(at);
            (bytes, at)
        }
        Mutation::Length(i, len) => {
            let (start, _) = seed.records[i.index(seed.records.len())];
            bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
            (bytes, start)
        }
        Mutation::Payload(i, seq, rest) => {
            let (start, end) = seed.records[i.index(seed.records.len())];
            let replaced = record(&[varint(*seq), rest.clone()].concat());
            bytes.splice(start..end, replaced);
            (bytes, start)
        }
        Mutation::Append(payload) => {
            let at = bytes.len();
            bytes.extend(record(&[varint(seed.last + 1), payload.clone()].concat()));
            (bytes, at)
        }
    }
}

/// The seed's records that end at or before `at`, as the decoder numbers
/// them.
fn intact_before(seed: &Seed, at: usize) -> usize {
    seed.records.iter().filter(|(_, end)| *end <= at).count()
}

/// A mutated log decodes to the records before the damage, in order, and
/// stops there: what follows is refused or read as more records, never a
/// panic or an allocation by a declared length.
#[test]
fn a_damaged_log_decodes_up_to_the_damage() {
    let _serial = serial();
    let seed = seed();
    proptest!(config(), |(mutation in mutation(), after in prop_oneof![Just(0u64), 0u64..8])| {
        bounded(|| {
            let (bytes, at) = mutate(seed, &mutation);
            match decode_wal(&bytes, after) {
                WalContents::Log { seqs, ops, end } => {
                    prop_assert!(end <= bytes.len());
                    prop_assert_eq!(seqs.len(), ops.len());
                    prop_assert!(seqs.iter().all(|s| *s > after), "{:?}", seqs);
                    prop_assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{:?}", seqs);
                    // Every record before the damage is still read.
                    let intact = intact_before(seed, at) as u64;
                    let wanted: Vec<u64> = (after + 1..=intact).collect();
                    prop_assert!(seqs.starts_with(&wanted), "{:?} lost some of {:?}", seqs, wanted);
                }
                WalContents::New => prop_assert!(at < HEADER),
                // A damaged header; a record that passes its checksum but
                // does not decode; or a damaged record with intact later
                // batches after it (corruption, never cut off as a torn
                // tail): only where the mutation made one.
                WalContents::Refused(why) => prop_assert!(
                    at < HEADER
                        || matches!(mutation, Mutation::Payload(..) | Mutation::Append(_))
                        || why.contains("is damaged, but batch"),
                    "refused at {}: {}", at, why
                ),
            }
            // A bit flipped or a length changed in a record that intact
            // later batches to replay follow: refused, not cut there.
            let damaged = seed.records.iter().position(|(start, end)| (*start..*end).contains(&at));
            if let (Mutation::Flip(..) | Mutation::Length(..), Some(i)) = (&mutation, damaged) {
                let n = seed.records.len() as u64;
                if n > after.max(i as u64 + 1) {
                    prop_assert!(
                        matches!(decode_wal(&bytes, after), WalContents::Refused(_)),
                        "record {} damaged, later ones intact: not refused", i
                    );
                }
            }
            Ok(())
        })?;
    });
}

/// Any bytes at all, with or without the magic line in front.
#[test]
fn any_bytes_are_refused_or_decoded() {
    let _serial = serial();
    let header = seed_header();
    proptest!(config(), |(bytes in hostile_bytes(), magic in any::<bool>(), after in any::<u64>())| {
        bounded(|| {
            let bytes = if magic { [&header[..], &bytes].concat() } else { bytes };
            if let WalContents::Log { end, .. } = decode_wal(&bytes, after) {
                prop_assert!(bytes.starts_with(b"DDWAL"));
                prop_assert!(end <= bytes.len());
            }
            Ok(())
        })?;
    });
}

/// Opening a store over a damaged log (its data file intact) either opens
/// it — replaying whatever records are intact and numbered after the data
/// file — or refuses with an error: never a panic. Slower (a store per
/// case), so it runs a sixteenth of the cases.
#[test]
fn a_store_opens_or_refuses_over_a_damaged_log() {
    let _serial = serial();
    let seed = seed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cases = (crate::cases() / 16).max(8);
    proptest!(config_with(cases), |(mutation in mutation())| {
        bounded(|| {
            let dir = TempDir::new().unwrap();
            let data = dir.path().join("seed.redb");
            std::fs::write(&data, &seed.data).unwrap();
            let (bytes, _) = mutate(seed, &mutation);
            std::fs::write(dir.path().join("seed.redb.wal"), &bytes).unwrap();
            let mut opts = RedbOptions::new(&data);
            opts.cache_bytes = 4 * 1024 * 1024;
            if let Ok(store) = RedbStore::open(&opts) {
                rt.block_on(store.close());
            }
            Ok(())
        })?;
    });
}
