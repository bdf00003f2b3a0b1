//! What an attacker holding every file under a directory reads back: the
//! test of an erasure that erases (`tests/service/erasure.rs`,
//! `tests/store/backup.rs`). It knows the seal's format from the design
//! (docs/design/erasure.md), not from dedupd's code: a seal is
//! `DDSEAL1\0 | slot: u64 LE | len: u32 LE | nonce: 12 bytes | ciphertext
//! and tag (len bytes)`, its first 20 bytes authenticated; a key file is a
//! 32-byte header, then a key of 32 bytes per slot.

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

/// Every file under `dir`, read whole.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The keys a backup file holds (its keys frames).
fn backup_keys(bytes: &[u8]) -> Vec<[u8; 32]> {
    use dedupd::store::redb::backup::format::{FrameReader, Kind, keys};
    let Ok(mut frames) = FrameReader::new(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(frame)) = frames.next_frame() {
        if frame.kind == Kind::Keys {
            for (_, key) in keys(&frame.payload).unwrap() {
                out.push(<[u8; 32]>::try_from(key).unwrap());
            }
        }
    }
    out
}

/// What an attacker holding every file under `dir` reads back that holds
/// `marker`: each file where it is in plain, and each seal found anywhere
/// (by its `DDSEAL1\0` prefix: slot, length, nonce, ciphertext) that opens
/// with a key of any key file or backup there (the one its slot names, or
/// any other) into plaintext holding it.
pub fn recoverable(dir: &Path, marker: &str) -> Vec<String> {
    let all = files(dir);
    let keys: Vec<[u8; 32]> = all
        .iter()
        .filter(|(name, _)| name.ends_with(".keys"))
        .flat_map(|(_, bytes)| {
            bytes
                .get(32..)
                .unwrap_or_default()
                .chunks_exact(32)
                .map(|k| <[u8; 32]>::try_from(k).unwrap())
                .collect::<Vec<_>>()
        })
        .chain(all.iter().flat_map(|(_, bytes)| backup_keys(bytes)))
        .collect();
    let mut found = Vec::new();
    for (name, bytes) in &all {
        if contains(bytes, marker.as_bytes()) {
            found.push(format!("{name}: in plain"));
        }
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(8).position(|w| w == b"DDSEAL1\0") {
            let start = at + i;
            at = start + 1;
            let Some(header) = bytes.get(start..start + 32) else {
                continue;
            };
            let slot = u64::from_le_bytes(header[8..16].try_into().unwrap());
            let len = u32::from_le_bytes(header[16..20].try_into().unwrap()) as usize;
            let Some(sealed) = bytes.get(start + 32..start + 32 + len) else {
                continue;
            };
            let named = usize::try_from(slot).ok().and_then(|s| keys.get(s));
            for key in named.into_iter().chain(&keys) {
                let plain = Aes256Gcm::new(key.into()).decrypt(
                    Nonce::from_slice(&header[20..32]),
                    Payload {
                        msg: sealed,
                        aad: &header[..20],
                    },
                );
                if let Ok(plain) = plain
                    && contains(&plain, marker.as_bytes())
                {
                    found.push(format!(
                        "{name}: a seal at byte {start} (slot {slot}) opens"
                    ));
                    break;
                }
            }
        }
    }
    found
}
