//! Upgrades and downgrades of the binary over a data file, as the package
//! manager makes them: `dedupd serve` on a file a newer release wrote.
//! (The upgrade itself, a schema-11 file migrated under systemd, is in
//! `.ci/systemd-drill.sh`; the migrations in `tests/store/golden.rs`.)

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::StatusCode;
use tempfile::TempDir;

use crate::support::http::client;
use crate::support::process::{dedupd, serve, stop};

/// Every file in `dir` with its length and SHA-256.
fn snapshot(dir: &Path) -> BTreeMap<String, (usize, String)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                digest(&std::fs::read(e.path()).unwrap()),
            )
        })
        .collect()
}

fn digest(bytes: &[u8]) -> (usize, String) {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(bytes);
    (bytes.len(), hex::encode(hash))
}

/// A downgrade: the older binary refuses the file at the start, naming
/// the file's schema, the one it reads and its own version, and saying
/// what to do; the data file, its log and its key file are left byte for
/// byte as they were, so the newer release still opens them.
/// What a release with the next schema leaves behind: its file closed
/// cleanly, or (`crashed`) the bytes its disk holds while it runs, which a
/// crash or a power cut leaves, and which redb repairs when it opens them.
async fn newer_release_file(crashed: bool) -> TempDir {
    let dir = TempDir::new().unwrap();
    let (child, port, drain) = serve(&dir);
    let claim = client()
        .post(format!("http://127.0.0.1:{port}/v1/claims/job-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(claim.status(), StatusCode::CREATED);
    assert!(stop(child, "-TERM", drain).await.success());

    let data = dir.path().join("dedupd.redb");
    let running = dir.path().join("running.copy");
    {
        let db = redb::Database::create(&data).unwrap();
        let tx = db.begin_write().unwrap();
        let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
        tx.open_table(meta)
            .unwrap()
            .insert("schema_version", 15)
            .unwrap();
        tx.commit().unwrap();
        if crashed {
            std::fs::copy(&data, &running).unwrap();
        }
    }
    if crashed {
        std::fs::rename(&running, &data).unwrap();
        assert!(
            matches!(
                redb::ReadOnlyDatabase::open(&data),
                Err(redb::DatabaseError::RepairAborted)
            ),
            "the copy must be one redb repairs"
        );
    }
    dir
}

#[tokio::test]
async fn a_data_file_from_a_newer_release_is_refused_naming_both_versions_and_left_as_it_was() {
    for crashed in [false, true] {
        let dir = newer_release_file(crashed).await;
        let before = snapshot(dir.path());
        assert!(before.contains_key("dedupd.redb"), "{:?}", before.keys());

        let out = dedupd()
            .arg("serve")
            .current_dir(dir.path())
            .env("DEDUPD_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "served a newer file: {stderr}");
        for part in [
            "has schema version 15",
            "reads schema version 14",
            concat!("this dedupd (", env!("CARGO_PKG_VERSION"), ")"),
            "Nothing was changed",
            "Install that newer release again",
        ] {
            assert!(
                stderr.contains(part),
                "crashed {crashed}: no {part:?} in: {stderr}"
            );
        }
        assert_eq!(
            snapshot(dir.path()),
            before,
            "crashed {crashed}: the refused start changed the data directory"
        );
    }
}
