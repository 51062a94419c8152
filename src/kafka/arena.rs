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
//! chunks of every partition's fresh records). A partition's first chunk is small and each
//! next one twice as large, up to 16 KiB: the memory tier counts a record's bytes, not its
//! chunk's, and a partition that sends a record now and then — or one of thousands, whose
//! chunk is let go before its next record — holds little more than its records.

use bytes::{Bytes, BytesMut};

/// Bytes of a chunk at most: what one partition's newest records may hold beyond their own
/// size.
const CHUNK_BYTES: usize = 16 * 1024;

/// Bytes of a partition's first chunk (each next one is twice as large, up to
/// [`CHUNK_BYTES`]).
const FIRST_CHUNK_BYTES: usize = 512;

/// A key or value larger than this gets an allocation of its own (a chunk would be mostly
/// that record, and the rest of the chunk wasted behind it).
const OWN_ALLOCATION_ABOVE: usize = CHUNK_BYTES / 4;

/// Partitions whose chunk is kept, at most: beyond them (assignments come and go) every
/// chunk is let go and chunks start anew.
const MAX_PARTITIONS: usize = 1024;

/// One partition's chunk.
struct Chunk {
    topic: Vec<u8>,
    partition: i32,
    bytes: BytesMut,
    /// The size of its next chunk.
    next_size: usize,
}

/// The chunk each partition's records are copied into.
#[derive(Default)]
pub(crate) struct Arenas {
    chunks: Vec<Chunk>,
    /// The entry used last: records come in runs of one partition.
    last: usize,
}

impl Arenas {
    /// `bytes` of a record of `topic` (its name's bytes)/`partition`, copied.
    pub fn copy(&mut self, topic: &[u8], partition: i32, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::new();
        }
        if bytes.len() > OWN_ALLOCATION_ABOVE {
            return Bytes::copy_from_slice(bytes);
        }
        let chunk = self.chunk(topic, partition);
        if chunk.bytes.capacity() < bytes.len() {
            // What is left of the old chunk is freed with its last record.
            chunk.bytes = BytesMut::with_capacity(chunk.next_size.max(bytes.len()));
            chunk.next_size = (chunk.next_size * 2).min(CHUNK_BYTES);
        }
        chunk.bytes.extend_from_slice(bytes);
        chunk.bytes.split().freeze()
    }

    fn chunk(&mut self, topic: &[u8], partition: i32) -> &mut Chunk {
        let matches = |chunk: &Chunk| chunk.partition == partition && chunk.topic == topic;
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
                self.chunks.push(Chunk {
                    topic: topic.to_vec(),
                    partition,
                    bytes: BytesMut::new(),
                    next_size: FIRST_CHUNK_BYTES,
                });
                self.chunks.len() - 1
            }
        };
        &mut self.chunks[self.last]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_records_share_a_chunk_and_keep_their_own_bytes() {
        let mut arenas = Arenas::default();
        let first = arenas.copy(b"t", 0, b"first");
        let other = arenas.copy(b"t", 1, b"other partition");
        let second = arenas.copy(b"t", 0, b"second");
        assert_eq!(
            (&first[..], &second[..], &other[..]),
            (&b"first"[..], &b"second"[..], &b"other partition"[..])
        );
        // One chunk per partition: the second record lies right behind the first.
        assert_eq!(second.as_ptr(), first.as_ptr().wrapping_add(first.len()));
        assert_ne!(other.as_ptr(), first.as_ptr().wrapping_add(first.len()));
        assert_eq!(arenas.copy(b"u", 0, b"").len(), 0);
    }

    #[test]
    fn chunks_grow_from_small_to_full_size_and_large_values_are_allocated_alone() {
        let mut arenas = Arenas::default();
        let piece = [7u8; FIRST_CHUNK_BYTES / 2];
        // A chunk is replaced when the next value does not fit; each is twice the last.
        let mut sizes = Vec::new();
        let mut previous: Option<Bytes> = None;
        let mut in_chunk = 0;
        for _ in 0..200 {
            let copy = arenas.copy(b"t", 0, &piece);
            assert_eq!(copy[..], piece[..]);
            let adjacent = previous
                .as_ref()
                .is_some_and(|p| copy.as_ptr() == p.as_ptr().wrapping_add(p.len()));
            if !adjacent && in_chunk > 0 {
                sizes.push(in_chunk * piece.len());
                in_chunk = 0;
            }
            in_chunk += 1;
            previous = Some(copy);
        }
        assert_eq!(sizes[..6], [512, 1024, 2048, 4096, 8192, 16384]);
        assert!(sizes[6..].iter().all(|&size| size == CHUNK_BYTES));
        let large = vec![1u8; OWN_ALLOCATION_ABOVE + 1];
        let room = arenas.chunk(b"t", 0).bytes.capacity();
        assert_eq!(arenas.copy(b"t", 0, &large)[..], large[..]);
        assert_eq!(
            arenas.chunk(b"t", 0).bytes.capacity(),
            room,
            "the large value took nothing of the chunk"
        );
    }

    #[test]
    fn partitions_beyond_the_bound_start_anew() {
        let mut arenas = Arenas::default();
        for partition in 0..MAX_PARTITIONS as i32 + 5 {
            assert_eq!(&arenas.copy(b"t", partition, b"x")[..], b"x");
        }
        assert_eq!(arenas.chunks.len(), 5);
    }
}
