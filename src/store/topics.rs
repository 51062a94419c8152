//! Topic ids, layout ids, partition locks and partition states: what every read and write
//! of a partition looks up first.

use super::*;

impl Buffer {
    pub(super) fn load_meta(&self, create: bool) -> Result<(), StoreError> {
        match self
            .db()?
            .get(keys::META)
            .map_err(|err| self.sled_error(err))?
        {
            Some(value) => match codec::decode::<BufferMeta>(&value) {
                Ok(_) => Ok(()),
                Err(CodecError::NewerVersion { found }) => Err(StoreError::NewerFormat {
                    dir: self.dir.clone(),
                    found,
                }),
                Err(err) => Err(self.damaged(format!("buffer metadata: {err}"))),
            },
            None if create && self.db()?.is_empty() => {
                let meta = BufferMeta { next_topic_id: 0 };
                self.db()?
                    .insert(keys::META, codec::encode(&meta))
                    .map_err(|err| self.sled_error(err))?;
                Ok(())
            }
            None => Err(StoreError::NotABuffer {
                dir: self.dir.clone(),
                reason: if self.db()?.is_empty() {
                    "the database is empty".into()
                } else {
                    "a sled database without catchup metadata".into()
                },
            }),
        }
    }

    pub(super) fn load_topics(&self) -> Result<(), StoreError> {
        let mut topics = HashMap::new();
        for entry in self.db()?.scan_prefix(keys::topic_prefix()) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let name = String::from_utf8(key[1..].to_vec())
                .map_err(|_| self.damaged("a topic name is not UTF-8".into()))?;
            let id: u32 = codec::decode(&value)
                .map_err(|err| self.damaged(format!("topic id of '{name}': {err}")))?;
            topics.insert(name, id);
        }
        *write_lock(&self.topics) = topics;
        Ok(())
    }

    /// Removes the entries of topics nothing is buffered for any more (every partition
    /// discarded or pruned): their name-to-id mapping and incarnation record. Only
    /// at open, before any writer: a writer resolves a topic's id before taking
    /// the partition's lock, so removing a mapping while writers run could orphan records.
    pub(super) fn forget_unused_topics(&self) -> Result<(), StoreError> {
        let db = self.db()?;
        let unused: Vec<(String, u32)> = read_lock(&self.topics)
            .iter()
            .map(|(name, id)| (name.clone(), *id))
            .filter(|(_, id)| {
                keys::topic_id_prefixes(*id)
                    .iter()
                    .all(|prefix| db.scan_prefix(prefix).next().is_none())
            })
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        let mut batch = compact::Batch::default();
        for (name, _) in &unused {
            batch.remove(keys::topic(name));
            batch.remove(keys::incarnation(name));
        }
        self.apply(batch)?;
        let mut topics = write_lock(&self.topics);
        for (name, _) in &unused {
            topics.remove(name);
        }
        tracing::debug!(
            count = unused.len(),
            "forgot topics nothing is buffered for"
        );
        Ok(())
    }

    /// The id of `topic`, if the buffer has seen it.
    pub(super) fn topic_id(&self, topic: &str) -> Option<u32> {
        read_lock(&self.topics).get(topic).copied()
    }

    pub(super) fn topic_name(&self, topic_id: u32) -> Option<String> {
        read_lock(&self.topics)
            .iter()
            .find(|(_, id)| **id == topic_id)
            .map(|(name, _)| name.clone())
    }

    /// The id of `topic`, allocated (durably with the next batch) on first use.
    pub(super) fn topic_id_or_insert(&self, topic: &str) -> Result<u32, StoreError> {
        if let Some(id) = self.topic_id(topic) {
            return Ok(id);
        }
        let _alloc = lock(&self.topic_alloc);
        if let Some(id) = self.topic_id(topic) {
            return Ok(id);
        }
        let meta: BufferMeta = match self
            .db()?
            .get(keys::META)
            .map_err(|err| self.sled_error(err))?
        {
            Some(value) => codec::decode(&value)
                .map_err(|err| self.damaged(format!("buffer metadata: {err}")))?,
            None => return Err(self.damaged("buffer metadata is missing".into())),
        };
        let id = meta.next_topic_id;
        if let Some((other, _)) = read_lock(&self.topics)
            .iter()
            .find(|(_, used)| **used == id)
        {
            // Only a damaged or crafted buffer gets here; sharing the id would mix two
            // topics' records under the same keys.
            return Err(self.damaged(format!(
                "the next topic id {id} in the buffer metadata is already used by topic {other}"
            )));
        }
        let next = BufferMeta {
            next_topic_id: id
                .checked_add(1)
                .ok_or_else(|| self.damaged("topic ids exhausted".into()))?,
        };
        let mut batch = compact::Batch::default();
        batch.insert(keys::topic(topic), codec::encode(&id));
        batch.insert(keys::META, codec::encode(&next));
        self.apply(batch)?;
        write_lock(&self.topics).insert(topic.to_owned(), id);
        Ok(id)
    }

    /// The current layout of `topic`/`partition`, to name in appends; `None` when the
    /// partition is not laid out.
    pub fn layout_id(&self, topic: &str, partition: i32) -> Result<Option<LayoutId>, StoreError> {
        let Some(part) = self.partition_key(topic, partition)? else {
            return Ok(None);
        };
        let _guard = self.partition_lock(part);
        if self.load_state(part)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.layout_id_of(part)))
    }

    /// The layout id of `part`, allocated on first use (a state reused from an earlier run).
    /// Call with the partition's lock held.
    pub(super) fn layout_id_of(&self, part: PartitionKey) -> LayoutId {
        *lock(&self.layouts).entry(part).or_insert_with(|| {
            LayoutId(
                self.next_layout
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// Gives `part` a new layout id: every writer positioned under the old one is stale.
    /// Call with the partition's lock held.
    pub(super) fn new_layout_id(&self, part: PartitionKey) {
        let id = LayoutId(
            self.next_layout
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        lock(&self.layouts).insert(part, id);
    }

    pub(super) fn partition_key(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<PartitionKey>, StoreError> {
        let partition = self.partition_number(topic, partition)?;
        Ok(self.topic_id(topic).map(|topic_id| PartitionKey {
            topic_id,
            partition,
        }))
    }

    pub(super) fn partition_number(&self, topic: &str, partition: i32) -> Result<u32, StoreError> {
        u32::try_from(partition)
            .map_err(|_| self.rejected(topic, partition, "negative partition".into()))
    }

    pub(super) fn partition_lock(&self, part: PartitionKey) -> MutexGuard<'_, Shard> {
        let shard = (part.topic_id as usize)
            .wrapping_mul(31)
            .wrapping_add(part.partition as usize);
        lock(&self.partition_locks[shard % LOCK_SHARDS])
    }

    pub(super) fn load_state(
        &self,
        part: PartitionKey,
    ) -> Result<Option<PartitionState>, StoreError> {
        match self
            .db()?
            .get(keys::state(part))
            .map_err(|err| self.sled_error(err))?
        {
            None => Ok(None),
            Some(value) => codec::decode(&value).map(Some).map_err(|err| {
                self.damaged(format!(
                    "state of topic id {} partition {}: {err}",
                    part.topic_id, part.partition
                ))
            }),
        }
    }

    pub(super) fn sled_error(&self, source: sled::Error) -> StoreError {
        sled_error(&self.dir, &self.sled_dir(), source)
    }

    pub(super) fn damaged(&self, reason: String) -> StoreError {
        StoreError::Damaged {
            dir: self.dir.clone(),
            reason,
        }
    }

    pub(super) fn rejected(&self, topic: &str, partition: i32, reason: String) -> StoreError {
        StoreError::Rejected {
            dir: self.dir.clone(),
            topic: topic.to_owned(),
            partition,
            reason,
        }
    }
}
