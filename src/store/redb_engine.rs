//! [`Engine`] over redb: one table per tree, one write transaction per batch.
//! redb's default durability makes `commit` return only after `fdatasync`,
//! and an interrupted commit is rolled back when the file is next opened.

use std::path::Path;

use redb::{Database, ReadableDatabase, TableDefinition};

use super::engine::{Batch, Engine, EngineError, Entry, KeyRange, Tree};

const NAME: &str = "redb";

fn table(tree: Tree) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
    TableDefinition::new(tree.name())
}

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::new(NAME, e)
}

/// The redb engine.
#[derive(Debug)]
pub struct RedbEngine {
    db: Database,
}

impl RedbEngine {
    /// Opens (creating if needed) the database at `path`, caching at most
    /// `cache_bytes` of its pages in memory (redb's own default is 1 GiB,
    /// which a long-running server fills as the database grows).
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Self, EngineError> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(err)?;
        let txn = db.begin_write().map_err(err)?;
        for tree in Tree::ALL {
            txn.open_table(table(tree)).map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(Self { db })
    }

    /// Applies `batch` in one write transaction of `durability`.
    fn commit_with(&self, batch: &Batch, durability: redb::Durability) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(durability).map_err(err)?;
        {
            // Only the trees the batch touches are opened: most batches
            // (an audit append: events and their chain's head) touch two of
            // the eighteen, and each open table costs the commit a lookup.
            let mut tables: [Option<redb::Table<'_, &[u8], &[u8]>>; Tree::ALL.len()] =
                std::array::from_fn(|_| None);
            for op in batch.ops() {
                let t = match &mut tables[op.tree.index()] {
                    Some(t) => t,
                    open @ None => open.insert(txn.open_table(table(op.tree)).map_err(err)?),
                };
                match &op.value {
                    Some(v) => {
                        t.insert(op.key.as_slice(), v.as_slice()).map_err(err)?;
                    }
                    None => {
                        t.remove(op.key.as_slice()).map_err(err)?;
                    }
                }
            }
        }
        txn.commit().map_err(err)
    }
}

impl Engine for RedbEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let txn = self.db.begin_read().map_err(err)?;
        let t = txn.open_table(table(tree)).map_err(err)?;
        Ok(t.get(key).map_err(err)?.map(|v| v.value().to_vec()))
    }

    fn scan(&self, tree: Tree, keys: KeyRange<'_>) -> Result<Vec<Entry>, EngineError> {
        let txn = self.db.begin_read().map_err(err)?;
        let t = txn.open_table(table(tree)).map_err(err)?;
        let mut out = Vec::new();
        let items = t.range::<&[u8]>((keys.start, keys.end)).map_err(err)?;
        for item in items.take(keys.limit) {
            let (k, v) = item.map_err(err)?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: &Batch) -> Result<(), EngineError> {
        self.commit_with(batch, redb::Durability::Immediate)
    }

    fn commit_volatile(&self, batch: &Batch) -> Result<(), EngineError> {
        self.commit_with(batch, redb::Durability::None)
    }

    fn flush(&self) -> Result<(), EngineError> {
        // An empty durable commit makes every volatile one before it durable.
        self.db.begin_write().map_err(err)?.commit().map_err(err)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passes_the_engine_conformance_suite_and_keeps_commits_across_reopen() {
        super::super::engine::file_conformance("meta.redb", super::RedbEngine::open);
    }
}
