//! [`Engine`] over redb: one table per tree, one write transaction per batch.
//! redb's default durability makes `commit` return only after `fdatasync`,
//! and an interrupted commit is rolled back when the file is next opened.

use std::ops::Bound;
use std::path::Path;

use redb::{Database, ReadableDatabase, TableDefinition};

use super::engine::{Batch, Engine, EngineError, Entry, Tree};

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
    /// Opens or creates the database file and every tree in it.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        Self::open_with_cache(path, super::engine::DEFAULT_CACHE_BYTES)
    }

    /// Opens (creating if needed) the database at `path`, caching at most
    /// `cache_bytes` of its pages in memory (redb's own default is 1 GiB,
    /// which a long-running server fills as the database grows).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, EngineError> {
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

    fn range(
        &self,
        tree: Tree,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, EngineError> {
        let txn = self.db.begin_read().map_err(err)?;
        let t = txn.open_table(table(tree)).map_err(err)?;
        let mut out = Vec::new();
        for item in t.range::<&[u8]>((start, end)).map_err(err)?.take(limit) {
            let (k, v) = item.map_err(err)?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: &Batch) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(err)?;
        {
            let mut tables = Vec::with_capacity(Tree::ALL.len());
            for tree in Tree::ALL {
                tables.push(txn.open_table(table(tree)).map_err(err)?);
            }
            for op in batch.ops() {
                let t = &mut tables[op.tree.index()];
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

    fn flush(&self) -> Result<(), EngineError> {
        // Every commit is already durable.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_engine_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RedbEngine::open(&dir.path().join("meta.redb")).unwrap();
        super::super::engine::conformance(&engine);
    }

    #[test]
    fn committed_data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        RedbEngine::open(&path)
            .unwrap()
            .put(Tree::Meta, b"k", b"v")
            .unwrap();
        let again = RedbEngine::open(&path).unwrap();
        assert_eq!(again.get(Tree::Meta, b"k").unwrap(), Some(b"v".to_vec()));
    }
}
