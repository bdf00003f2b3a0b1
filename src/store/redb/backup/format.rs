//! The backup file's container: frames, each with its own checksum, and a
//! SHA-256 of the whole at the end. No redb here: what the frames carry is
//! [`super::tables`]'s and [`super::snapshot`]'s.
//!
//! ```text
//! file   := MAGIC frame*
//! frame  := kind: u8 | len: u32 LE | crc32(kind, len, payload): u32 LE | payload
//! ```
//!
//! The frames, in this order: one [`Kind::Header`] (JSON: [`Header`]),
//! then [`Kind::Rows`] frames (`table: u16 LE | (klen: u32 LE | key |
//! vlen: u32 LE | value)*`, a table's rows in key order, tables in the
//! header's order, a table's rows over as many frames as they take) with
//! one [`Kind::Keys`] run (`(slot: u64 LE | key: 32 bytes)*`) after the
//! first table's rows, and last one [`Kind::End`] (JSON: [`End`], with the
//! SHA-256 of every byte before it). Nothing follows it.
//!
//! A reader checks each frame's crc32 before it hands the frame out, and
//! the SHA-256 at the end: what it handed out before the end is only
//! trusted once the end is reached (a restore builds aside and moves into
//! place only then). It never allocates by a length the bytes declare: a
//! payload grows as its bytes arrive, and a frame longer than
//! [`MAX_FRAME`] is refused before it is read.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"DDBACK1\n";
/// The container format this build writes and reads.
pub const FORMAT: u32 = 1;
/// A frame's payload is cut once it holds this much (a row larger than
/// this takes a frame of its own).
pub const FRAME_TARGET: usize = 1 << 20;
/// The longest payload a frame may declare.
pub const MAX_FRAME: u32 = 1 << 30;
/// Bytes before a payload: kind, length, crc32.
const FRAME_HEAD: usize = 1 + 4 + 4;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The [`Header`], as JSON.
    Header = 1,
    /// Rows of one table.
    Rows = 2,
    /// Key slots of the sealed events in the backup.
    Keys = 3,
    /// The [`End`], as JSON.
    End = 4,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Header,
            2 => Kind::Rows,
            3 => Kind::Keys,
            4 => Kind::End,
            _ => return None,
        })
    }
}

/// What a backup says about itself, first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Header {
    /// The container's format ([`FORMAT`]).
    pub format: u32,
    /// The build that wrote it (`dedupd 0.1.0`).
    pub written_by: String,
    /// The data file's schema version.
    pub schema: u64,
    /// When it was taken, Unix ms (the server's clock).
    pub taken_at_ms: u64,
    /// The id of the data file it was taken from, 32 hex digits.
    pub data_file: String,
    /// The last write-ahead-log batch it holds: every batch answered
    /// before the backup began, and perhaps some after.
    pub batch: u64,
    /// The last fence handed out in it.
    pub fence: u64,
    /// Its tables, in the order their rows follow.
    pub tables: Vec<TableInfo>,
}

/// A table as the header names it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableInfo {
    /// Its redb name.
    pub name: String,
    /// Its key's redb type name.
    pub key: String,
    /// Its value's redb type name.
    pub value: String,
}

/// What a backup says about itself, last.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct End {
    /// Rows of each table, in the header's order.
    pub rows: Vec<u64>,
    /// Key slots in the [`Kind::Keys`] frames.
    pub keys: u64,
    /// Bytes before the end frame.
    pub bytes: u64,
    /// SHA-256 of those bytes, in hex.
    pub sha256: String,
}

/// Why a backup file cannot be read. Each names where.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// It does not start as a backup does.
    #[error(
        "not a dedupd backup (it does not start with {:?}; a data file is not one: \
         `dedupd backup --offline` makes one from a stopped instance's files, and `dedupd \
         verify` checks a data file)",
        String::from_utf8_lossy(MAGIC)
    )]
    NotABackup,
    /// It ends before its end frame.
    #[error(
        "cut short: it ends at byte {at} without its end frame (a copy that did not finish, or a truncated file)"
    )]
    Truncated {
        /// Bytes read.
        at: u64,
    },
    /// A frame's checksum does not hold.
    #[error("damaged: frame {frame} at byte {at} fails its checksum")]
    Damaged { frame: u64, at: u64 },
    /// A frame declares a length past [`MAX_FRAME`].
    #[error("damaged: frame {frame} at byte {at} declares {len} bytes, more than any frame holds")]
    TooLong { frame: u64, at: u64, len: u32 },
    /// A frame of a kind this build does not know.
    #[error("frame {frame} at byte {at} is of kind {kind}, which this build does not know")]
    UnknownKind { frame: u64, at: u64, kind: u8 },
    /// Frames out of their order, or a payload that does not parse.
    #[error("malformed: {0}")]
    Malformed(String),
    /// The SHA-256 at the end is not the bytes'.
    #[error(
        "damaged: the SHA-256 of its {bytes} bytes is {found}, and its end frame says {expected}"
    )]
    Checksum {
        bytes: u64,
        expected: String,
        found: String,
    },
    /// Bytes follow the end frame.
    #[error("bytes follow its end frame at byte {at}: two files joined, or a damaged one")]
    Trailing { at: u64 },
    /// A container of a later format.
    #[error("it is of backup format {0}, and this build reads format {FORMAT}")]
    Format(u32),
}

/// Writes frames to `out`, hashing them.
#[derive(Debug)]
pub struct FrameWriter<W: Write> {
    out: W,
    sha: Sha256,
    bytes: u64,
}

impl<W: Write> FrameWriter<W> {
    /// Starts a backup in `out`: its magic.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        let mut sha = Sha256::new();
        sha.update(MAGIC);
        Ok(Self {
            out,
            sha,
            bytes: MAGIC.len() as u64,
        })
    }

    /// Writes one frame of `kind` holding `payload`.
    pub fn frame(&mut self, kind: Kind, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= MAX_FRAME)
            .ok_or_else(|| io::Error::other("a backup frame over 1 GiB"))?;
        let head = frame_head(kind as u8, len, payload);
        self.out.write_all(&head)?;
        self.out.write_all(payload)?;
        self.sha.update(head);
        self.sha.update(payload);
        self.bytes += (FRAME_HEAD + payload.len()) as u64;
        Ok(())
    }

    /// Writes `header` as the first frame.
    pub fn header(&mut self, header: &Header) -> io::Result<()> {
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        self.frame(Kind::Header, &json)
    }

    /// Writes the end frame (`rows` and `keys` as counted) and flushes;
    /// returns the output, the end written, and the file's length.
    pub fn finish(mut self, rows: Vec<u64>, keys: u64) -> io::Result<(W, End, u64)> {
        let end = End {
            rows,
            keys,
            bytes: self.bytes,
            sha256: hex::encode(self.sha.clone().finalize()),
        };
        let json = serde_json::to_vec(&end).map_err(io::Error::other)?;
        self.frame(Kind::End, &json)?;
        self.out.flush()?;
        Ok((self.out, end, self.bytes))
    }
}

/// A frame's head: kind, length, crc32 of the three.
fn frame_head(kind: u8, len: u32, payload: &[u8]) -> [u8; FRAME_HEAD] {
    let mut head = [0u8; FRAME_HEAD];
    head[0] = kind;
    head[1..5].copy_from_slice(&len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[..5]);
    crc.update(payload);
    head[5..9].copy_from_slice(&crc.finalize().to_le_bytes());
    head
}

/// A frame as read: its kind, where it starts, its payload (checked).
#[derive(Debug)]
pub struct Frame {
    pub kind: Kind,
    /// Its offset in the file.
    pub at: u64,
    pub payload: Vec<u8>,
}

/// Reads frames, checking each, and the whole at the end.
#[derive(Debug)]
pub struct FrameReader<R: Read> {
    inner: R,
    sha: Sha256,
    /// Bytes read.
    at: u64,
    /// Frames read.
    frames: u64,
    /// The end frame was read and checked.
    ended: bool,
}

impl<R: Read> FrameReader<R> {
    /// Reads the magic.
    pub fn new(mut inner: R) -> Result<Self, FormatError> {
        let mut magic = [0u8; 8];
        match read_full(&mut inner, &mut magic)? {
            8 if &magic == MAGIC => {}
            _ => return Err(FormatError::NotABackup),
        }
        let mut sha = Sha256::new();
        sha.update(MAGIC);
        Ok(Self {
            inner,
            sha,
            at: MAGIC.len() as u64,
            frames: 0,
            ended: false,
        })
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// The next frame; `None` after the end frame (checked against the
    /// SHA-256 of everything before it, and followed by nothing).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FormatError> {
        if self.ended {
            return Ok(None);
        }
        let at = self.at;
        let frame = self.frames;
        let mut head = [0u8; FRAME_HEAD];
        if read_full(&mut self.inner, &mut head)? < FRAME_HEAD {
            return Err(FormatError::Truncated { at });
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len > MAX_FRAME {
            return Err(FormatError::TooLong { frame, at, len });
        }
        let payload = read_payload(&mut self.inner, len as usize)?;
        if payload.len() < len as usize {
            return Err(FormatError::Truncated {
                at: at + (FRAME_HEAD + payload.len()) as u64,
            });
        }
        if frame_head(head[0], len, &payload) != head {
            return Err(FormatError::Damaged { frame, at });
        }
        let kind = Kind::from_byte(head[0]).ok_or(FormatError::UnknownKind {
            frame,
            at,
            kind: head[0],
        })?;
        if kind == Kind::End {
            let end: End = serde_json::from_slice(&payload)
                .map_err(|e| FormatError::Malformed(format!("its end frame: {e}")))?;
            let found = hex::encode(self.sha.clone().finalize());
            if end.bytes != at || end.sha256 != found {
                return Err(FormatError::Checksum {
                    bytes: at,
                    expected: end.sha256,
                    found,
                });
            }
            let mut more = [0u8; 1];
            if read_full(&mut self.inner, &mut more)? > 0 {
                return Err(FormatError::Trailing {
                    at: at + (FRAME_HEAD + payload.len()) as u64,
                });
            }
            self.ended = true;
        } else {
            self.sha.update(head);
            self.sha.update(&payload);
        }
        self.at += (FRAME_HEAD + payload.len()) as u64;
        self.frames += 1;
        Ok(Some(Frame { kind, at, payload }))
    }
}

/// Up to `len` bytes of a frame's payload (fewer when the input ends). The
/// buffer grows as the bytes arrive, doubling, never past `len`: grown as
/// `read_to_end` grows, a forged frame declaring 1 GiB took 2 GiB.
fn read_payload(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut payload = Vec::new();
    let mut want = len.min(FRAME_TARGET + 64 * 1024);
    loop {
        let filled = payload.len();
        payload.reserve_exact(want - filled);
        payload.resize(want, 0);
        let got = read_full(r, &mut payload[filled..])?;
        if filled + got < want || want == len {
            payload.truncate(filled + got);
            return Ok(payload);
        }
        want = want.saturating_mul(2).min(len);
    }
}

/// Reads until `buf` is full or the input ends; how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Rows as a [`Kind::Rows`] payload carries them, appended to `payload`.
pub fn push_row(payload: &mut Vec<u8>, key: &[u8], value: &[u8]) -> io::Result<()> {
    for part in [key, value] {
        let len = u32::try_from(part.len())
            .map_err(|_| io::Error::other("a key or value of 4 GiB or more"))?;
        payload.extend_from_slice(&len.to_le_bytes());
        payload.extend_from_slice(part);
    }
    Ok(())
}

/// A row as stored: its key's bytes and its value's.
pub type Row<'a> = (&'a [u8], &'a [u8]);

/// The table index and the rows of a [`Kind::Rows`] payload.
pub fn rows(payload: &[u8]) -> Result<(u16, Vec<Row<'_>>), FormatError> {
    let (table, rows) = rows_of(payload)?;
    Ok((table, rows.collect::<Result<_, _>>()?))
}

/// The table index of a [`Kind::Rows`] payload and its rows, read one at a
/// time: a frame of a million empty rows is never listed whole (a slice
/// pair is 32 bytes, an empty row 8).
pub fn rows_of(payload: &[u8]) -> Result<(u16, RowIter<'_>), FormatError> {
    let (table, rest) = payload
        .split_first_chunk::<2>()
        .ok_or_else(|| FormatError::Malformed("a rows frame has no table".into()))?;
    Ok((u16::from_le_bytes(*table), RowIter { rest }))
}

/// The rows of a [`Kind::Rows`] payload ([`rows_of`]).
#[derive(Debug)]
pub struct RowIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for RowIter<'a> {
    type Item = Result<Row<'a>, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let row = part(&mut self.rest).and_then(|key| Ok((key, part(&mut self.rest)?)));
        if row.is_err() {
            self.rest = &[];
        }
        Some(row)
    }
}

/// The next length-prefixed part of a row in `rest`.
fn part<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], FormatError> {
    let cut = || FormatError::Malformed("a rows frame is cut inside a row".into());
    let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(cut)?;
    let len = u32::from_le_bytes(*len) as usize;
    if tail.len() < len {
        return Err(cut());
    }
    let (bytes, tail) = tail.split_at(len);
    *rest = tail;
    Ok(bytes)
}

/// Bytes of a key slot in a [`Kind::Keys`] payload: slot and key.
pub const KEY_ENTRY: usize = 8 + super::super::seal::KEY_LEN;

/// The slots and keys of a [`Kind::Keys`] payload.
pub fn keys(payload: &[u8]) -> Result<Vec<(u64, &[u8])>, FormatError> {
    if !payload.len().is_multiple_of(KEY_ENTRY) {
        return Err(FormatError::Malformed(
            "a keys frame is not whole slots".into(),
        ));
    }
    Ok(payload
        .chunks_exact(KEY_ENTRY)
        .map(|c| {
            let (slot, key) = c.split_at(8);
            let mut s = [0u8; 8];
            s.copy_from_slice(slot);
            (u64::from_le_bytes(s), key)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = FrameWriter::new(Vec::new()).expect("new");
        w.header(&Header {
            format: FORMAT,
            written_by: "test".into(),
            schema: 12,
            taken_at_ms: 1,
            data_file: "00".into(),
            batch: 7,
            fence: 3,
            tables: vec![],
        })
        .expect("header");
        let mut rows = 0u16.to_le_bytes().to_vec();
        push_row(&mut rows, b"k", b"value").expect("row");
        w.frame(Kind::Rows, &rows).expect("rows");
        let (out, _, _) = w.finish(vec![1], 0).expect("finish");
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Frame>, FormatError> {
        let mut r = FrameReader::new(bytes)?;
        let mut frames = Vec::new();
        while let Some(f) = r.next_frame()? {
            frames.push(f);
        }
        Ok(frames)
    }

    #[test]
    fn frames_read_back_as_written() {
        let frames = read_all(&sample()).expect("reads");
        let kinds: Vec<Kind> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [Kind::Header, Kind::Rows, Kind::End]);
        let (table, rows) = rows(&frames[1].payload).expect("rows");
        assert_eq!(table, 0);
        assert_eq!(rows, [(&b"k"[..], &b"value"[..])]);
    }

    #[test]
    fn every_byte_changed_or_cut_is_refused() {
        let good = sample();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x20;
            assert!(read_all(&bad).is_err(), "byte {i} changed");
            assert!(read_all(&good[..i]).is_err(), "cut at {i}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(
            read_all(&longer),
            Err(FormatError::Trailing { .. })
        ));
    }

    /// A payload larger than the first buffer is read whole, into no more
    /// room than it declares (a forged 1 GiB frame took 2 GiB).
    #[test]
    fn a_payload_takes_no_more_room_than_its_length() {
        for len in [0, 1, FRAME_TARGET, 3 * FRAME_TARGET + 1] {
            let bytes: Vec<u8> = (0..len + 7).map(|i| i as u8).collect();
            let payload = read_payload(&mut &bytes[..], len).expect("read");
            assert_eq!(payload, bytes[..len], "{len}");
            assert!(
                payload.capacity() <= len.max(1),
                "{len}: {}",
                payload.capacity()
            );
            // Cut short: what there is.
            let cut = read_payload(&mut &bytes[..len / 2], len).expect("read");
            assert_eq!(cut, bytes[..len / 2], "{len}");
        }
    }

    #[test]
    fn a_declared_length_is_not_allocated_before_its_bytes_arrive() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&frame_head(2, MAX_FRAME, &[]));
        // Cut short: refused as such, without taking a gigabyte.
        assert!(matches!(
            read_all(&bytes),
            Err(FormatError::Truncated { .. })
        ));
        let mut bytes = MAGIC.to_vec();
        bytes.push(2);
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        assert!(matches!(read_all(&bytes), Err(FormatError::TooLong { .. })));
    }
}
