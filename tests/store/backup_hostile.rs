//! Hostile backups and restore targets: backup files whose SHA-256 and
//! crc32s were recomputed over forged contents (a checksum is not a
//! signature: anyone who can hand the operator a file can make every check
//! of the container pass), and a restore's target directory in the hands
//! of its owner. Each test's comment says what once went wrong.

use std::io::Write;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use dedupd::domain::CreatedAt;
use dedupd::store::inbox::{Inbox, NewEvent};
use dedupd::store::redb::backup::format::{
    FrameReader, FrameWriter, Header, Kind, keys as key_slots, push_row, rows as rows_of,
};
use dedupd::store::redb::backup::restore::{RestoreError, RestoreOptions, restore};
use dedupd::store::redb::backup::verify::{MAX_KEY_SLOTS, verify_backup};
use dedupd::store::redb::{RedbOptions, RedbStore};
use dedupd::store::{ClaimOutcome, Store};
use tempfile::TempDir;

use crate::backup::{file, key, snapshot_of, ttl};
use crate::support::process::dedupd;

const T: u64 = 1_800_000_000_000;
/// `T` as a restore names the files it moves aside.
const STAMP: &str = "20270115T080000Z";

/// Table indexes in a backup (`raw::TABLES`' order).
const SEALS: usize = 0;
const META: usize = 1;
const CLAIM_ROWS: usize = 2;
const EVENT_EXPIRY: usize = 5;
const BODIES: usize = 9;

fn event(id: &str, body: &[u8]) -> NewEvent {
    NewEvent {
        source: "sume".into(),
        event_id: id.into(),
        stream: Some("run_1".into()),
        created_at: CreatedAt::from_unix_nanos(i128::from(T) * 1_000_000),
        received_at_ms: T,
        headers: vec![("x-customer".into(), "h".into())],
        body: body.to_vec(),
    }
}

fn open(dir: &Path) -> RedbStore {
    RedbStore::open(&RedbOptions::new(dir.join("dedupd.redb"))).unwrap()
}

async fn claim(store: &RedbStore, k: &str) -> u64 {
    match store.claim(&key(k), ttl(), None, T).await.unwrap() {
        ClaimOutcome::Claimed { fence, .. } => fence,
        other => panic!("{k}: {other:?}"),
    }
}

/// A backup's contents, decoded, to be changed and written again with
/// every checksum recomputed.
#[derive(Debug, Clone)]
struct Forged {
    header: Header,
    tables: Vec<Vec<(Vec<u8>, Vec<u8>)>>,
    keys: Vec<(u64, Vec<u8>)>,
}

impl Forged {
    fn parse(bytes: &[u8]) -> Self {
        let mut r = FrameReader::new(bytes).unwrap();
        let mut header = None;
        let mut tables = vec![Vec::new(); 21];
        let mut keys = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            match f.kind {
                Kind::Header => header = Some(serde_json::from_slice(&f.payload).unwrap()),
                Kind::Rows => {
                    let (t, rows) = rows_of(&f.payload).unwrap();
                    tables[usize::from(t)]
                        .extend(rows.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())));
                }
                Kind::Keys => keys.extend(
                    key_slots(&f.payload)
                        .unwrap()
                        .into_iter()
                        .map(|(s, k)| (s, k.to_vec())),
                ),
                Kind::End => {}
            }
        }
        Self {
            header: header.unwrap(),
            tables,
            keys,
        }
    }

    /// The bytes, every checksum made to hold.
    fn bytes(&self) -> Vec<u8> {
        let mut w = FrameWriter::new(Vec::new()).unwrap();
        w.header(&self.header).unwrap();
        for (i, rows) in self.tables.iter().enumerate() {
            if !rows.is_empty() {
                let mut payload = u16::try_from(i).unwrap().to_le_bytes().to_vec();
                for (k, v) in rows {
                    push_row(&mut payload, k, v).unwrap();
                }
                w.frame(Kind::Rows, &payload).unwrap();
            }
            if i == SEALS && !self.keys.is_empty() {
                let mut payload = Vec::new();
                for (s, k) in &self.keys {
                    payload.extend_from_slice(&s.to_le_bytes());
                    payload.extend_from_slice(k);
                }
                w.frame(Kind::Keys, &payload).unwrap();
            }
        }
        let counts = self.tables.iter().map(|t| t.len() as u64).collect();
        w.finish(counts, self.keys.len() as u64).unwrap().0
    }

    fn set_meta(&mut self, name: &str, value: u64) {
        let row = self.tables[META]
            .iter_mut()
            .find(|(k, _)| k == name.as_bytes())
            .unwrap();
        row.1 = value.to_le_bytes().to_vec();
    }
}

/// A backup of a store holding one sealed event, `sume/e1`.
async fn backup_with_a_sealed_event() -> Vec<u8> {
    let dir = TempDir::new().unwrap();
    let store = open(dir.path());
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    claim(&store, "k").await;
    let (bytes, _) = store.backups().write_to(T, Vec::new()).await.unwrap();
    store.close().await;
    bytes
}

/// `seal` opened with `key` and sealed again naming slot `slot` (the
/// seal format of `store::redb::seal`: magic, slot, len, nonce; AAD the
/// first 20 bytes).
fn reseal(seal: &[u8], key: &[u8], slot: u64) -> Vec<u8> {
    let cipher = Aes256Gcm::new(key.into());
    let plain = cipher
        .decrypt(
            Nonce::from_slice(&seal[20..32]),
            Payload {
                msg: &seal[32..],
                aad: &seal[..20],
            },
        )
        .unwrap();
    let mut out = seal[..32].to_vec();
    out[8..16].copy_from_slice(&slot.to_le_bytes());
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&out[20..32]),
            Payload {
                msg: &plain,
                aad: &out[..20],
            },
        )
        .unwrap();
    out.extend_from_slice(&sealed);
    out
}

/// The backup with its one sealed event moved to key slot `slot`: a
/// consistent backup by every check `verify` makes.
async fn sealed_at_slot(slot: u64) -> Vec<u8> {
    let mut f = Forged::parse(&backup_with_a_sealed_event().await);
    assert_eq!(f.tables[SEALS].len(), 1);
    assert_eq!(f.keys.len(), 1);
    let key = f.keys[0].1.clone();
    f.tables[SEALS][0].1 = slot.to_le_bytes().to_vec();
    f.keys[0].0 = slot;
    let event = f.tables[SEALS][0].0.clone();
    let body = f.tables[BODIES]
        .iter_mut()
        .find(|(k, _)| *k == event)
        .unwrap();
    body.1 = reseal(&body.1, &key, slot);
    f.bytes()
}

fn opts(backup: &Path, dir: &Path) -> RestoreOptions {
    RestoreOptions {
        backup: backup.to_owned(),
        data: dir.join("dedupd.redb"),
        replace: true,
        now_ms: T,
        keep_free: 8 << 20,
    }
}

/// Once: a backup of a few kilobytes whose one sealed event names key
/// slot 2^40 passes `dedupd verify`, and `dedupd restore` allocates 32 TiB
/// for the key file (`restore::write_keys`: `vec![0; (max slot + 1) * 32]`)
/// and dies (SIGABRT "memory allocation failed" under a memory limit; with
/// none, it fills the machine's memory until the OOM killer ends it)
/// instead of refusing.
/// A slot of 2^27 or so instead makes it write a 4 GiB key file (and every
/// later open rewrites it and lists every free slot in memory).
#[tokio::test]
async fn a_backup_naming_a_huge_key_slot_is_refused_not_an_abort_of_restore() {
    let dir = TempDir::new().unwrap();
    let path = file(dir.path(), "hostile.backup", &sealed_at_slot(1 << 40).await);
    assert!(std::fs::metadata(&path).unwrap().len() < 64 * 1024);
    let verified = verify_backup(&path);
    let target = TempDir::new().unwrap();
    let config = restore_config(target.path(), target.path());
    // Under a limit of 4 GiB of address space: unbounded, the 32 TiB
    // calloc succeeds lazily and filling it with random keys took every
    // byte of a 24 GiB machine until the OOM killer ended it (SIGKILL,
    // after four minutes).
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new("prlimit");
        cmd.arg("--as=4294967296")
            .arg("--")
            .arg(dedupd().get_program());
        for (k, _) in std::env::vars() {
            if k.starts_with("DEDUPD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.arg("restore")
            .arg(&path)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "restore was killed by a signal ({:?}) instead of refusing the backup (verify said \
         {verified:?}): {stderr}",
        std::os::unix::process::ExitStatusExt::signal(&out.status)
    );
    assert!(!out.status.success(), "a slot of 2^40 restored: {stderr}");
    let left: Vec<_> = std::fs::read_dir(target.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(".dedupd-restore-"))
        .collect();
    assert!(left.is_empty(), "a staging directory was left: {left:?}");
    assert!(
        !target.path().join("dedupd.redb").exists(),
        "a restore that failed left a data file"
    );
}

/// Once: a backup whose one sealed event names key slot `u64::MAX` (its
/// key, its seal, the crc32s and the SHA-256 made to match) passed
/// `dedupd verify`, and `dedupd restore` of it panicked ("attempt to add
/// with overflow" in `write_keys`, counting the slots up to the highest).
/// Both refuse it now, as every slot past the last a key file holds, with
/// the same cause, and the target is left as it was; the last slot a key
/// file holds verifies.
#[tokio::test]
async fn verify_and_restore_refuse_a_key_slot_past_the_last_a_key_file_holds() {
    for slot in [u64::MAX, MAX_KEY_SLOTS] {
        let scratch = TempDir::new().unwrap();
        let path = file(
            scratch.path(),
            "hostile.backup",
            &sealed_at_slot(slot).await,
        );
        let said = format!("a key in slot {slot}, past the last a key file holds");
        let verified = verify_backup(&path);
        assert!(
            verified
                .as_ref()
                .is_err_and(|e| e.to_string().contains(&said)),
            "slot {slot}: {verified:?}"
        );
        // An instance's files at the target: a refused restore leaves them.
        let target = TempDir::new().unwrap();
        drop(instance_and_backup(target.path()).await);
        let there = snapshot_of(target.path());
        let restored = restore(opts(&path, target.path())).await;
        assert!(
            matches!(&restored, Err(RestoreError::Backup { cause, .. }) if cause.to_string().contains(&said)),
            "slot {slot}: {restored:?}"
        );
        assert_eq!(snapshot_of(target.path()), there, "slot {slot}");
        // The commands: exit 1, the cause said, no panic.
        let config = restore_config(scratch.path(), target.path());
        for args in [
            vec!["verify".as_ref(), path.as_os_str()],
            vec![
                "restore".as_ref(),
                path.as_os_str(),
                "--config".as_ref(),
                config.as_os_str(),
                "--replace".as_ref(),
            ],
        ] {
            let out = dedupd().args(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&said) && !stderr.contains("panicked"),
                "{args:?}: {stderr}"
            );
        }
        assert_eq!(snapshot_of(target.path()), there, "slot {slot}");
    }
    let scratch = TempDir::new().unwrap();
    let last = sealed_at_slot(MAX_KEY_SLOTS - 1).await;
    verify_backup(&file(scratch.path(), "last.backup", &last)).unwrap();
}

/// Once: `dedupd verify` of a stopped data file whose sealed event's row
/// names key slot `u64::MAX` panicked ("attempt to multiply with
/// overflow", finding the slot's key in the key file) instead of saying
/// the slot is past the key file's end.
#[tokio::test]
async fn verify_of_a_data_file_whose_event_names_a_huge_key_slot_refuses_it() {
    let dir = TempDir::new().unwrap();
    drop(instance_and_backup(dir.path()).await);
    let data = dir.path().join("dedupd.redb");
    {
        let seals: redb::TableDefinition<(&str, &str), u64> =
            redb::TableDefinition::new("inbox_seals");
        let db = redb::Database::open(&data).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(seals)
            .unwrap()
            .insert(("sume", "e1"), u64::MAX)
            .unwrap();
        tx.commit().unwrap();
    }
    let out = dedupd().arg("verify").arg(&data).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "uses key slot {}, past the end of key file",
            u64::MAX
        )) && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// Once: the fence counter of a restore is the backup's (header and
/// `meta.fence`, which verify only checks agree) plus a margin, with
/// saturating adds. A backup whose counter is near `u64::MAX` verifies and
/// restores to a counter of `u64::MAX`; the next claim's `*fence += 1`
/// overflows: a panic of the writer thread in a debug build (every later
/// write answers that the store is closed), a wrap to fence 0 in release
/// (below every fence handed out, the opposite of what fences promise).
#[tokio::test]
async fn a_restored_counter_at_the_top_never_hands_out_a_fence_that_overflows() {
    let mut f = Forged::parse(&backup_with_a_sealed_event().await);
    let top = u64::MAX - 10;
    f.header.fence = top;
    f.set_meta("fence", top);
    let dir = TempDir::new().unwrap();
    let path = file(dir.path(), "hostile.backup", &f.bytes());
    let refused = verify_backup(&path).unwrap_err();
    assert!(refused.to_string().contains("fence counter"), "{refused}");
    let target = TempDir::new().unwrap();
    let refused = restore(opts(&path, target.path())).await.unwrap_err();
    assert!(
        refused.to_string().contains("nothing was restored"),
        "{refused}"
    );
    assert!(!target.path().join("dedupd.redb").exists());
}

/// Once: a claim row's fence is not checked against the counter. A
/// backup holding claim `k` at fence F above the header's counter (by
/// more than the restore's margin of a million) verifies and restores, and
/// the next claims are handed fences below F: a holder of a later claim
/// is fenced off by an older one.
#[tokio::test]
async fn fences_after_a_restore_are_above_every_fence_its_rows_hold() {
    let mut f = Forged::parse(&backup_with_a_sealed_event().await);
    let high = 1_000_000_000_000u64;
    assert_eq!(f.tables[CLAIM_ROWS].len(), 1);
    // The claim's value: state, token (16), fence (8 LE), fingerprint;
    // inside the row's (key, value, expiry) tuple. Its fence is the
    // header's counter (the only claim taken).
    let at_fence = f.header.fence.to_le_bytes();
    let value = &mut f.tables[CLAIM_ROWS][0].1;
    let pos = value
        .windows(8)
        .rposition(|w| w == at_fence)
        .expect("the claim's fence in its row");
    value[pos..pos + 8].copy_from_slice(&high.to_le_bytes());
    let dir = TempDir::new().unwrap();
    let path = file(dir.path(), "hostile.backup", &f.bytes());
    let refused = verify_backup(&path).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("above the backup's fence counter"),
        "{refused}"
    );
    let target = TempDir::new().unwrap();
    let refused = restore(opts(&path, target.path())).await.unwrap_err();
    assert!(
        refused.to_string().contains("nothing was restored"),
        "{refused}"
    );
    assert!(!target.path().join("dedupd.redb").exists());
}

/// Once: rows are restored as bytes and never decoded, so a row that
/// does not decode as its table's type (here an `event_expiry` key whose
/// event id is not UTF-8, due long ago) passes verify and restore (whose
/// open reads only the claims' and keyspace's rows); the reaper's first
/// purge decodes it on the writer thread, which panics: every write after
/// that fails (`Closed`) until the process restarts, and the same again.
#[tokio::test]
async fn a_restored_row_that_does_not_decode_never_wedges_the_writer() {
    let mut f = Forged::parse(&backup_with_a_sealed_event().await);
    let mut bad = <(u64, &str) as redb::Value>::as_bytes(&(1u64, "zz")).to_vec();
    let n = bad.len();
    bad[n - 2..].copy_from_slice(&[0xff, 0xfe]);
    f.tables[EVENT_EXPIRY].push((bad, Vec::new()));
    let dir = TempDir::new().unwrap();
    let path = file(dir.path(), "hostile.backup", &f.bytes());
    let refused = verify_backup(&path).unwrap_err();
    assert!(
        refused.to_string().contains("does not read as its type"),
        "{refused}"
    );
    // The CLI says so in one line, not with the panic it caught.
    let out = dedupd().arg("verify").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not read as its type"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let target = TempDir::new().unwrap();
    let refused = restore(opts(&path, target.path())).await.unwrap_err();
    assert!(
        refused.to_string().contains("nothing was restored"),
        "{refused}"
    );
    assert!(!target.path().join("dedupd.redb").exists());
}

/// Once: verify says a backup with a row twice is whole, and
/// restore refuses it (a table short of its count): `dedupd verify` is not
/// the check of a restore it says it is.
#[tokio::test]
async fn verify_refuses_what_restore_refuses_a_row_twice() {
    let mut f = Forged::parse(&backup_with_a_sealed_event().await);
    let row = f.tables[CLAIM_ROWS][0].clone();
    f.tables[CLAIM_ROWS].push(row);
    let dir = TempDir::new().unwrap();
    let path = file(dir.path(), "dup.backup", &f.bytes());
    let target = TempDir::new().unwrap();
    let restored = restore(opts(&path, target.path())).await;
    assert!(restored.is_err(), "restore takes a row twice");
    let verified = verify_backup(&path);
    assert!(
        verified.is_err(),
        "verify passes a backup restore refuses ({}): {verified:?}",
        restored.unwrap_err()
    );
}

/// A data directory with an instance's four files, closed, and a backup
/// outside it (removed when the returned path is dropped, also when the
/// test fails).
async fn instance_and_backup(dir: &Path) -> tempfile::TempPath {
    let store = open(dir);
    store.inbox().ingest(event("e1", b"one"), T).await.unwrap();
    claim(&store, "k").await;
    let (bytes, _) = store.backups().write_to(T, Vec::new()).await.unwrap();
    store.close().await;
    let mut scratch = tempfile::Builder::new()
        .prefix("attack-backup-")
        .suffix(".backup")
        .tempfile()
        .unwrap();
    scratch.write_all(&bytes).unwrap();
    scratch.into_temp_path()
}

/// Once: files are moved aside to NAME.before-restore-SECOND with a
/// plain rename, which replaces whatever is there. Two restores in the
/// same second (a script restoring, checking, restoring another backup)
/// move the first restore's files over the originals it had moved aside:
/// the original data file, log and key file are gone, silently.
#[tokio::test]
async fn a_second_restore_in_the_same_second_keeps_the_original_files_it_moved_aside() {
    let target = TempDir::new().unwrap();
    let backup = instance_and_backup(target.path()).await;
    let original = std::fs::read(target.path().join("dedupd.redb")).unwrap();
    let original_keys = std::fs::read(target.path().join("dedupd.redb.keys")).unwrap();
    restore(opts(&backup, target.path())).await.unwrap();
    restore(opts(&backup, target.path())).await.unwrap();
    let files = snapshot_of(target.path());
    assert!(
        files.iter().any(|(_, b)| *b == original),
        "the original data file is nowhere in {:?}",
        files.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert!(
        files.iter().any(|(_, b)| *b == original_keys),
        "the original key file is nowhere"
    );
}

/// Files are moved aside to names no file has: with a directory planted
/// at the log's first aside name, the log goes to the next one, and
/// nothing that was there is lost.
#[tokio::test]
async fn a_restore_moves_files_aside_to_names_no_file_has() {
    let target = TempDir::new().unwrap();
    let backup = instance_and_backup(target.path()).await;
    let wal = std::fs::read(target.path().join("dedupd.redb.wal")).unwrap();
    let blocker = target
        .path()
        .join(format!("dedupd.redb.wal.before-restore-{STAMP}"));
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), b"x").unwrap();
    let done = restore(opts(&backup, target.path())).await.unwrap();
    assert_eq!(std::fs::read(blocker.join("x")).unwrap(), b"x");
    let next = target
        .path()
        .join(format!("dedupd.redb.wal.before-restore-{STAMP}-2"));
    assert_eq!(std::fs::read(&next).unwrap(), wal);
    assert!(done.moved_aside.contains(&next), "{:?}", done.moved_aside);
}

/// A restore that fails while it moves the old files aside (here the
/// log's name is a mount point, which cannot be renamed: EBUSY) puts back
/// those it had moved: the target is as it was, and still opens.
#[tokio::test]
#[ignore = "needs root to mount a tmpfs: .ci/run runs it"]
async fn a_restore_that_fails_moving_files_aside_leaves_the_target_as_it_was() {
    let target = TempDir::new().unwrap();
    let backup = instance_and_backup(target.path()).await;
    // The log's second segment made a mount point: the key file and the
    // log's first segment are moved aside before it.
    let wal2 = target.path().join("dedupd.redb.wal2");
    let saved = std::fs::read(&wal2).unwrap();
    std::fs::remove_file(&wal2).unwrap();
    std::fs::create_dir(&wal2).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&wal2)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a tmpfs needs root");
    std::fs::write(wal2.join("x"), b"x").unwrap();
    let there = snapshot_of(target.path());
    let err = restore(opts(&backup, target.path())).await.unwrap_err();
    let now = snapshot_of(target.path());
    let _ = std::process::Command::new("umount").arg(&wal2).status();
    assert!(err.to_string().contains("left as they were"), "{err}");
    assert_eq!(
        now.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        there.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "restore failed ({err}) and the target changed"
    );
    std::fs::remove_dir(&wal2).unwrap();
    std::fs::write(&wal2, saved).unwrap();
    // As served: the old instance still opens.
    let reopened = RedbStore::open(&RedbOptions::new(target.path().join("dedupd.redb")));
    assert!(
        reopened.is_ok(),
        "after the failed restore: {:?}",
        reopened.err()
    );
    reopened.unwrap().close().await;
}

/// Once: a restore gives the files it put in place to the
/// owner of their directory (`restore::give_to_owner_of`) with `metadata`
/// and `chown`, both of which follow links, by path, after the files were
/// renamed into a directory that owner can write. The directory's owner
/// (the service's user, whose `StateDirectory` a root `dedupd restore`
/// writes into) swaps `dedupd.redb.keys` for a link to a file of root's
/// between the rename and the chown (the window holds a directory fsync
/// and the staging directory's removal: the first try wins), and root
/// gives it that file: here a root-only file becomes uid 65534's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to chown: .ci/run runs it"]
async fn a_restore_as_root_never_gives_the_directory_owner_a_file_a_link_names() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let source = TempDir::new().unwrap();
    let backup = instance_and_backup(source.path()).await;
    let root_only = TempDir::new().unwrap();
    let victim = root_only.path().join("shadow");
    std::fs::write(&victim, b"root:$6$secret\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let target = TempDir::new().unwrap();
    std::os::unix::fs::chown(target.path(), Some(65534), Some(65534)).unwrap();
    // What the directory's owner can do: rename over entries of its own
    // directory.
    let dir = target.path().to_owned();
    let link_to = victim.clone();
    let racer = std::thread::spawn(move || {
        let keys = dir.join("dedupd.redb.keys");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            match std::fs::symlink_metadata(&keys) {
                Ok(m) if !m.file_type().is_symlink() && !m.file_type().is_fifo() => {
                    let tmp = dir.join(".l");
                    std::os::unix::fs::symlink(&link_to, &tmp).unwrap();
                    std::fs::rename(&tmp, &keys).unwrap();
                    return true;
                }
                _ => std::hint::spin_loop(),
            }
        }
        false
    });
    let mut o = opts(&backup, target.path());
    o.replace = false;
    let done = restore(o).await;
    let swapped = racer.join().unwrap();
    let owner = std::fs::metadata(&victim).unwrap().uid();
    assert_eq!(
        owner,
        0,
        "root's file {} now belongs to uid {owner} (the link was planted: {swapped}; restore: \
         {:?})",
        victim.display(),
        done.map(|d| d.owner_warning)
    );
}

/// Once: a frame is read whole (up to `MAX_FRAME`, 1 GiB) and
/// `format::rows` then lists its rows as a `Vec` of slice pairs, 32 bytes
/// for each row of 8: a rows frame of empty rows costs about 5 times its
/// length (7 times in peak RSS: a 256 MiB file took 1.9 GB, so a 1 GiB
/// one about 7.5 GB). Here a 64 MiB file (no end frame, refused anyway)
/// makes `dedupd verify` under a 512 MiB address-space limit abort on a
/// 256 MiB allocation instead of answering that the file is cut short.
#[tokio::test]
async fn verify_of_a_frame_of_empty_rows_stays_within_memory_a_few_times_its_size() {
    let good = backup_with_a_sealed_event().await;
    let mut r = FrameReader::new(&good[..]).unwrap();
    let header: Header = serde_json::from_slice(&r.next_frame().unwrap().unwrap().payload).unwrap();
    let mut w = FrameWriter::new(Vec::new()).unwrap();
    w.header(&header).unwrap();
    let mut payload = 3u16.to_le_bytes().to_vec();
    payload.resize(2 + (64 << 20), 0);
    w.frame(Kind::Rows, &payload).unwrap();
    let dir = TempDir::new().unwrap();
    // Cut before its end: what matters is the memory of reading it.
    let (bytes, end, _) = w.finish(vec![0; 21], 0).unwrap();
    let cut = usize::try_from(end.bytes).unwrap();
    let path = file(dir.path(), "wide.backup", &bytes[..cut]);
    drop(bytes);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("prlimit")
            .arg("--as=536870912")
            .arg("--")
            .arg(dedupd().get_program())
            .arg("verify")
            .arg(&path)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "verify of a 64 MiB file under 512 MiB: {:?}: {}",
        out.status,
        stderr.lines().next().unwrap_or_default()
    );
}

/// A configuration file in `dir` whose data file is in `target`: what
/// `dedupd restore --config` restores into.
fn restore_config(dir: &std::path::Path, target: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("restore.toml");
    std::fs::write(
        &config,
        format!(
            "data_path = {:?}\n",
            target.join("dedupd.redb").display().to_string()
        ),
    )
    .unwrap();
    config
}
