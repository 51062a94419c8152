//! Fetched keys and values, copied into shared chunks: one allocation for many records.
//!
//! A record's key and value leave librdkafka's buffer as one copy each. Made one allocation
//! per copy, they cost the fetcher a `malloc`, and another thread (whoever drops the record
//! last: the application, a commit, a spill) a `free` that contends with it on glibc's
//! lock. Copied into a chunk shared by the records of one run instead (the messages of one
//! partition taken in one call), a record's bytes are a slice of it ([`Bytes`]): the chunk is
//! freed when its last record goes.
//!
//! * A chunk is filled before any slice of it is cut. A slice adds one to the chunk's
//!   reference count, a locked instruction, which waits until the thread's earlier
//!   stores have drained; cut after each copy, it waited for that copy (a quarter of the group
//!   member's thread at 1 KiB, in a profile). A chunk holds one run's records (up to 16 KiB;
//!   a longer run fills several), so the fetcher never cuts from a chunk whose earlier records
//!   the reader already clones.
//! * A run is one partition's, whose records are committed and spilled in offset order: a
//!   chunk is never held by one slow partition for records that other partitions let go (a
//!   live lane waiting behind its backlog does not keep other partitions' fresh records).
//! * Nothing is allocated that no record uses: the memory tier counts a record's bytes, not
//!   its chunk's, and a partition that sends a record now and then holds its records' bytes.
//!   A record held after the rest of its run went holds at most the chunks its key and value
//!   lie in (two, when a chunk ends between them).
//! * A chunk's reference count has a cache line of its own: the reader's clones and the
//!   application's drops of its records, on other threads, share it with nothing else.

use bytes::Bytes;

/// Bytes of a chunk at most: what a key or value held alone may keep beyond its own size.
const CHUNK_BYTES: usize = 16 * 1024;

/// A key or value larger than this gets an allocation of its own (a chunk would be mostly
/// that record, and the rest of the chunk wasted behind it).
const OWN_ALLOCATION_ABOVE: usize = CHUNK_BYTES / 4;

/// A chunk's bytes. Aligned to a cache line, so that the reference count [`Bytes`] keeps in
/// front of its owner has a line of its own.
#[repr(align(64))]
struct Chunk(Vec<u8>);

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Copies of a run's keys and values (`pieces`, in order; a null one stays null).
fn copy_run(pieces: &[Option<&[u8]>]) -> Vec<Option<Bytes>> {
    let shared_length = |piece: &Option<&[u8]>| match piece {
        Some(bytes) if bytes.len() <= OWN_ALLOCATION_ABOVE => bytes.len(),
        _ => 0,
    };
    let mut copies = Vec::with_capacity(pieces.len());
    let mut start = 0;
    while start < pieces.len() {
        // The pieces of the next chunk: as many as fit (at least one).
        let (mut end, mut chunk_bytes, mut shared_pieces) = (start, 0, 0);
        while let Some(piece) = pieces.get(end) {
            let length = shared_length(piece);
            if chunk_bytes + length > CHUNK_BYTES && end > start {
                break;
            }
            chunk_bytes += length;
            shared_pieces += usize::from(length > 0);
            end += 1;
        }
        // A piece alone (a value polled alone without a key) needs no chunk.
        let chunk = (shared_pieces > 1).then(|| {
            let mut bytes = Vec::with_capacity(chunk_bytes);
            for (index, piece) in pieces[start..end].iter().enumerate() {
                // The next record's piece of this kind (`copy_entries` lays a run out key,
                // value, key, ...), while this one is copied.
                if let Some(Some(next)) = pieces
                    .get(start + index + PREFETCH_AHEAD)
                    .filter(|next| shared_length(next) > 0)
                {
                    prefetch(next);
                }
                if shared_length(piece) > 0 {
                    bytes.extend_from_slice(piece.unwrap_or_default());
                }
            }
            Bytes::from_owner(Chunk(bytes))
        });
        let mut at = 0;
        for piece in &pieces[start..end] {
            copies.push(piece.map(|bytes| match (&chunk, shared_length(piece)) {
                (Some(chunk), length) if length > 0 => {
                    at += length;
                    chunk.slice(at - length..at)
                }
                _ => Bytes::copy_from_slice(bytes),
            }));
        }
        start = end;
    }
    copies
}

/// How many pieces ahead of the one being copied a piece is prefetched: the next record's
/// key while a key is copied, its value while a value is.
const PREFETCH_AHEAD: usize = 2;

/// A cache line.
const CACHE_LINE: usize = 64;

/// Asks the core to bring `bytes` (a piece of a chunk, at most [`OWN_ALLOCATION_ABOVE`])
/// into its cache. librdkafka read the fetch response from the socket on its broker thread,
/// and by the time the member copies a piece it has left this core's cache: profiles put
/// the copy's samples on its first load. Measured in `docs/performance.md` ("The copy out of
/// librdkafka's buffer").
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(CACHE_LINE) {
        // SAFETY: a prefetch is a hint; it never faults, and the address is of a live slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A record's key and value, copied as a run of their own (a message polled alone).
pub(crate) fn copy_record(pieces: [Option<&[u8]>; 2]) -> [Option<Bytes>; 2] {
    copy_entries(&[pieces], |&pieces| Some(pieces))
        .pop()
        .flatten()
        .unwrap_or_default()
}

/// Each of `entries` (records and others, in order) with its key and value copied, the
/// records' keys and values as one run; `pieces` gives a record's key and value, `None` for
/// an entry that is not a record.
pub(crate) fn copy_entries<'a, E>(
    entries: &[E],
    pieces: impl Fn(&E) -> Option<[Option<&'a [u8]>; 2]>,
) -> Vec<Option<[Option<Bytes>; 2]>> {
    let found: Vec<_> = entries.iter().map(pieces).collect();
    let run: Vec<_> = found.iter().flatten().flatten().copied().collect();
    let mut copies = copy_run(&run).into_iter();
    found
        .iter()
        .map(|record| record.map(|_| [copies.next().flatten(), copies.next().flatten()]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `next` lies right behind `previous` (cut from the same chunk).
    fn adjacent(previous: &Bytes, next: &Bytes) -> bool {
        next.as_ptr() == previous.as_ptr().wrapping_add(previous.len())
    }

    fn copied(pieces: &[Option<&[u8]>]) -> Vec<Bytes> {
        let copies = copy_run(pieces);
        assert_eq!(copies.len(), pieces.len());
        for (copy, piece) in copies.iter().zip(pieces) {
            assert_eq!(copy.as_deref(), *piece, "each copy holds its own bytes");
        }
        copies.into_iter().flatten().collect()
    }

    #[test]
    fn each_record_gets_its_own_key_and_value_whatever_comes_between() {
        // An end of partition or an error may come anywhere in a batch.
        let entries: [Option<[Option<&[u8]>; 2]>; 6] = [
            None,
            Some([Some(b"k1"), Some(b"v1")]),
            None,
            Some([None, Some(b"v2")]),
            Some([Some(b"k3"), None]),
            None,
        ];
        let copies = copy_entries(&entries, |entry| *entry);
        let read: Vec<_> = copies
            .iter()
            .map(|copied| {
                copied
                    .as_ref()
                    .map(|[key, value]| [key.as_deref(), value.as_deref()])
            })
            .collect();
        assert_eq!(read, entries);
    }

    #[test]
    fn a_runs_keys_and_values_share_a_chunk_and_nulls_stay_null() {
        let pieces = [Some(&b"key"[..]), None, Some(b""), Some(b"value")];
        let copies = copied(&pieces);
        assert!(adjacent(&copies[0], &copies[2]), "one chunk for the run");
    }

    #[test]
    fn a_long_run_fills_full_chunks_and_its_last_one_holds_the_rest() {
        let piece = [7u8; 1024];
        let pieces = vec![Some(&piece[..]); 40];
        let copies = copied(&pieces);
        let mut sizes = vec![piece.len()];
        for pair in copies.windows(2) {
            if !adjacent(&pair[0], &pair[1]) {
                sizes.push(0);
            }
            let last = sizes.len() - 1;
            sizes[last] += pair[1].len();
        }
        assert_eq!(sizes, [CHUNK_BYTES, CHUNK_BYTES, 8 * 1024]);
    }

    #[test]
    fn large_values_are_allocated_alone_between_their_neighbours_in_a_chunk() {
        let large = vec![1u8; OWN_ALLOCATION_ABOVE + 1];
        let copies = copied(&[Some(b"before"), Some(&large), Some(b"after")]);
        assert!(
            adjacent(&copies[0], &copies[2]),
            "the large value took no chunk"
        );
        assert!(!adjacent(&copies[0], &copies[1]));
        // Alone with a null: `copied` checks that each copy holds its piece's bytes.
        copied(&[Some(&large), None]);
        let largest_shared = vec![2u8; OWN_ALLOCATION_ABOVE];
        let copies = copied(&[Some(b"key"), Some(&largest_shared)]);
        assert!(
            adjacent(&copies[0], &copies[1]),
            "up to the bound, a value shares"
        );
    }

    #[test]
    fn a_key_and_value_may_lie_in_two_chunks_and_each_is_whole() {
        // 15 KiB, then a key and a value of 1 KiB each: the chunk ends between them.
        let filler = [3u8; 1024];
        let mut pieces = vec![Some(&filler[..]); 15];
        let (key, value) = ([4u8; 1024], [5u8; 1024]);
        pieces.extend([Some(&key[..]), Some(&value[..])]);
        let copies = copied(&pieces);
        assert!(
            adjacent(&copies[14], &copies[15]),
            "the key ends the first chunk"
        );
        assert!(
            !adjacent(&copies[15], &copies[16]),
            "the value starts the next"
        );
    }
}
