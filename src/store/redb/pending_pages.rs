//! A handed-over checkpoint's page writes, held in memory until the
//! flusher thread writes them to the file, just before the checkpoint's
//! sync (see [`super::sync_gate`]).
//!
//! redb's durable commit writes out every page dirtied since the last one:
//! about a thousand `pwrite`s, most of a checkpoint's time on the writer
//! (measured in docs/performance.md). Copying them here instead takes a
//! fraction of that, and the writer goes on. Until they are in the file,
//! every read of the file sees them laid over it, in the order they were
//! written, so nothing reads differently from a file they were written to.

/// Memory kept from one checkpoint to the next, so copying the next one's
/// pages does not fault in fresh pages of memory (that cost as much as the
/// writes it replaces).
const KEEP: usize = 16 << 20;

/// The writes, in the order they were made: their bytes one after the
/// other in `bytes`, and where each goes.
#[derive(Debug, Default)]
pub struct PendingPages {
    bytes: Vec<u8>,
    /// (file offset, start in `bytes`, length), in order.
    writes: Vec<(u64, usize, usize)>,
    /// Where the last byte written ends.
    end: u64,
}

impl PendingPages {
    /// Holds a copy of a write of `data` at `offset`.
    pub fn push(&mut self, offset: u64, data: &[u8]) {
        self.writes.push((offset, self.bytes.len(), data.len()));
        self.bytes.extend_from_slice(data);
        self.end = self.end.max(offset + data.len() as u64);
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Forgets every write held (written out, or the file given up),
    /// keeping up to [`KEEP`] of memory for the next.
    pub fn clear(&mut self) {
        self.writes.clear();
        self.bytes.clear();
        self.end = 0;
        self.bytes.shrink_to(KEEP);
    }

    /// How many writes are held.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// The writes, in order.
    fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.writes
            .iter()
            .map(|&(offset, start, len)| (offset, &self.bytes[start..start + len]))
    }

    /// Where the last byte written ends: the file is at least this long
    /// once they are written.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Lays the held writes over `out`, the file's bytes from `offset`, in
    /// the order they were made: `out` then reads as the file will once
    /// they are written.
    pub fn overlay(&self, offset: u64, out: &mut [u8]) {
        let end = offset + out.len() as u64;
        for (at, data) in self.iter() {
            let from = offset.max(at);
            let to = end.min(at + data.len() as u64);
            if from >= to {
                continue;
            }
            let (src, dst) = ((from - at) as usize, (from - offset) as usize);
            let n = (to - from) as usize;
            out[dst..dst + n].copy_from_slice(&data[src..src + n]);
        }
    }

    /// Writes them in order with `write`; stops at the first error, and
    /// forgets nothing.
    pub fn write_all(
        &self,
        mut write: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.iter()
            .try_for_each(|(offset, data)| write(offset, data))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A file as bytes in memory.
    fn apply(file: &mut Vec<u8>, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if file.len() < end {
            file.resize(end, 0);
        }
        file[offset as usize..end].copy_from_slice(data);
    }

    #[test]
    fn a_read_sees_the_held_writes_over_the_file_the_later_one_winning() {
        let mut p = PendingPages::default();
        p.push(4, &[1; 8]);
        p.push(8, &[2; 2]);
        let mut out = [9u8; 8];
        p.overlay(2, &mut out);
        assert_eq!(out, [9, 9, 1, 1, 1, 1, 2, 2]);
        assert_eq!(p.end(), 12);
        let mut outside = [7u8; 4];
        p.overlay(12, &mut outside);
        assert_eq!(outside, [7; 4], "a read past the writes reads the file");
    }

    #[test]
    fn writing_out_stops_at_the_first_error_and_keeps_the_order() {
        let mut p = PendingPages::default();
        p.push(0, b"a");
        p.push(1, b"b");
        p.push(2, b"c");
        let mut seen = Vec::new();
        let e = p
            .write_all(|offset, data| {
                seen.push((offset, data.to_vec()));
                if offset == 1 {
                    Err(std::io::Error::other("no space left on device"))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
        assert!(e.to_string().contains("no space"));
        assert_eq!(seen, vec![(0, b"a".to_vec()), (1, b"b".to_vec())]);
        assert!(!p.is_empty(), "a failed write-out forgets nothing");
        assert_eq!(p.len(), 3);
        p.clear();
        assert!(p.is_empty());
        assert_eq!(p.end(), 0);
        p.push(5, b"d");
        let mut out = [0u8; 2];
        p.overlay(4, &mut out);
        assert_eq!(&out, b"\0d", "a cleared buffer holds nothing of before");
    }

    proptest! {
        /// Any reads over any overlapping writes read what the file reads
        /// once they are written out.
        #[test]
        fn reads_through_the_overlay_match_the_file_written(
            base in proptest::collection::vec(any::<u8>(), 0..64),
            writes in proptest::collection::vec(
                (0u64..80, proptest::collection::vec(any::<u8>(), 1..24)), 0..12),
            reads in proptest::collection::vec((0u64..100, 0usize..40), 1..8),
        ) {
            let mut p = PendingPages::default();
            let mut after = base.clone();
            for (offset, data) in &writes {
                p.push(*offset, data);
                apply(&mut after, *offset, data);
            }
            let mut written = base.clone();
            p.write_all(|offset, data| {
                apply(&mut written, offset, data);
                Ok(())
            }).unwrap();
            prop_assert_eq!(&written, &after);
            prop_assert_eq!(p.end().max(base.len() as u64), after.len() as u64);
            for (offset, len) in reads {
                // The file before, zero past its end, as a read of a
                // sparse file gives.
                let mut out: Vec<u8> = (0..len)
                    .map(|i| base.get(offset as usize + i).copied().unwrap_or(0))
                    .collect();
                p.overlay(offset, &mut out);
                let want: Vec<u8> = (0..len)
                    .map(|i| after.get(offset as usize + i).copied().unwrap_or(0))
                    .collect();
                prop_assert_eq!(out, want);
            }
        }
    }
}
