//! Fetched keys and values, copied into shared chunks: one allocation for many records.
//!
//! A record's key and value leave librdkafka's buffer as one copy each. Made one allocation
//! per copy, they cost the fetcher a `malloc`, and another thread (whoever drops the record
//! last: the application, a commit, a spill) a `free` that contends with it on glibc's
//! lock. Copied into a chunk shared by the partition's next records instead, a record's bytes
//! are a slice of it ([`Bytes`]): the chunk is freed when its last record goes.
//!
//! Chunks are per partition: a partition's records are committed and spilled in offset
//! order, so a chunk is never held by one slow partition for records that other partitions
//! let go (with one chunk for all, a live lane waiting behind its backlog would keep the
//! chunks of every partition's fresh records).

use bytes::{Bytes, BytesMut};

/// Bytes of one chunk: what one partition's newest records may hold beyond their own size.
const CHUNK_BYTES: usize = 16 * 1024;

/// A key or value larger than this gets an allocation of its own (a chunk would be mostly
/// that record, and the rest of the chunk wasted behind it).
const OWN_ALLOCATION_ABOVE: usize = CHUNK_BYTES / 4;

/// Partitions whose chunk is kept, at most: beyond them (assignments come and go) every
/// chunk is let go and chunks start anew.
const MAX_PARTITIONS: usize = 1024;

/// The chunk each partition's records are copied into.
#[derive(Default)]
pub(crate) struct Arenas {
    chunks: Vec<(String, i32, BytesMut)>,
    /// The entry used last: records come in runs of one partition.
    last: usize,
}

impl Arenas {
    /// `bytes` of a record of `topic`/`partition`, copied.
    pub fn copy(&mut self, topic: &str, partition: i32, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::new();
        }
        if bytes.len() > OWN_ALLOCATION_ABOVE {
            return Bytes::copy_from_slice(bytes);
        }
        let chunk = self.chunk(topic, partition);
        if chunk.capacity() < bytes.len() {
            // What is left of the old chunk is freed with its last record.
            *chunk = BytesMut::with_capacity(CHUNK_BYTES);
        }
        chunk.extend_from_slice(bytes);
        chunk.split().freeze()
    }

    fn chunk(&mut self, topic: &str, partition: i32) -> &mut BytesMut {
        let matches = |(t, p, _): &(String, i32, BytesMut)| *p == partition && t == topic;
        let found = if self.chunks.get(self.last).is_some_and(matches) {
            Some(self.last)
        } else {
            self.chunks.iter().position(matches)
        };
        self.last = match found {
            Some(index) => index,
            None => {
                if self.chunks.len() >= MAX_PARTITIONS {
                    self.chunks.clear();
                }
                self.chunks
                    .push((topic.to_owned(), partition, BytesMut::new()));
                self.chunks.len() - 1
            }
        };
        &mut self.chunks[self.last].2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_records_share_a_chunk_and_keep_their_own_bytes() {
        let mut arenas = Arenas::default();
        let first = arenas.copy("t", 0, b"first");
        let other = arenas.copy("t", 1, b"other partition");
        let second = arenas.copy("t", 0, b"second");
        assert_eq!(
            (&first[..], &second[..], &other[..]),
            (&b"first"[..], &b"second"[..], &b"other partition"[..])
        );
        // One chunk per partition: the second record lies right behind the first.
        assert_eq!(second.as_ptr(), first.as_ptr().wrapping_add(first.len()));
        assert_ne!(other.as_ptr(), first.as_ptr().wrapping_add(first.len()));
        assert_eq!(arenas.copy("u", 0, b"").len(), 0);
    }

    #[test]
    fn a_full_chunk_is_replaced_and_large_values_are_allocated_alone() {
        let mut arenas = Arenas::default();
        let piece = vec![7u8; OWN_ALLOCATION_ABOVE];
        let copies: Vec<Bytes> = (0..CHUNK_BYTES / piece.len() + 1)
            .map(|_| arenas.copy("t", 0, &piece))
            .collect();
        assert!(copies.iter().all(|copy| copy[..] == piece[..]));
        let last = &copies[copies.len() - 1];
        let before = &copies[copies.len() - 2];
        assert_ne!(last.as_ptr(), before.as_ptr().wrapping_add(before.len()));
        let large = vec![1u8; OWN_ALLOCATION_ABOVE + 1];
        assert_eq!(arenas.copy("t", 0, &large)[..], large[..]);
        assert_eq!(
            arenas.chunk("t", 0).capacity(),
            CHUNK_BYTES - piece.len(),
            "the large value took nothing of the chunk"
        );
    }

    #[test]
    fn partitions_beyond_the_bound_start_anew() {
        let mut arenas = Arenas::default();
        for partition in 0..MAX_PARTITIONS as i32 + 5 {
            assert_eq!(&arenas.copy("t", partition, b"x")[..], b"x");
        }
        assert_eq!(arenas.chunks.len(), 5);
    }
}
