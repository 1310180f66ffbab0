//! Payload bytes on disk: one directory per session under
//! `<data_dir>/sessions/`, reached only through `cap_std::fs::Dir` handles.
//! The ambient file system is touched in exactly one place,
//! [`BlobStore::open`]; everything after goes through capabilities, so a
//! name can never walk out of its session directory.
//!
//! Writes are crash-safe: bytes stream into a temporary file in the session
//! directory, which is fsynced, renamed into place, and followed by an fsync
//! of the directory.
//!
//! Writeback is paced: every [`WRITEBACK_CHUNK`] bytes a temporary file
//! starts writing that chunk to disk and waits for the one before it, so a
//! large payload never leaves more than two chunks dirty. Without this, the
//! final fsync of a 64 MiB file flushes it in one burst, and other
//! sessions' small fsyncs (audit appends, metadata commits) queue behind
//! the whole of it. An error here (ENOSPC included) fails the write like
//! any other.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt as _, File, OpenOptions, OpenOptionsExt as _};

use crate::ids::SessionId;

/// Prefix of temporary upload files; reconciliation removes any it finds.
pub const TEMP_PREFIX: &str = ".upload-";
/// Bytes a temporary file writes before it starts flushing them (see the
/// module docs).
pub const WRITEBACK_CHUNK: u64 = 4 << 20;
/// Open session directories kept cached.
const DIR_CACHE: usize = 1024;

/// The session directories.
#[derive(Debug)]
pub struct BlobStore {
    root: Dir,
    cache: Mutex<HashMap<SessionId, Arc<Dir>>>,
    /// Fleet mode: sessions are made on any replica, and this replica's
    /// directory for one appears when it first stores into it.
    create_on_use: bool,
}

impl BlobStore {
    /// Opens (creating if needed) `<data_dir>/sessions`, owner-only: it
    /// holds every tenant's payloads.
    ///
    /// With `create_on_use` (fleet mode), a session's directory is made
    /// when first asked for, since another replica made the session.
    pub fn open(data_dir: &Path, create_on_use: bool) -> io::Result<Self> {
        let path = data_dir.join("sessions");
        crate::fsutil::make_private(&path)?;
        let root = Dir::open_ambient_dir(&path, ambient_authority())?;
        Ok(Self {
            root,
            cache: Mutex::new(HashMap::new()),
            create_on_use,
        })
    }

    /// Creates a session's directory (owner-only), durably.
    pub fn create_session_dir(&self, id: &SessionId) -> io::Result<()> {
        let mut private = DirBuilder::new();
        private.mode(crate::fsutil::PRIVATE_DIR_MODE);
        match self.root.create_dir_with(id.as_str(), &private) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        fsync_dir(&self.root)
    }

    /// The session's directory handle.
    pub fn session_dir(&self, id: &SessionId) -> io::Result<Arc<Dir>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = cache.get(id) {
            return Ok(d.clone());
        }
        let dir = match self.root.open_dir(id.as_str()) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.create_on_use => {
                self.create_session_dir(id)?;
                self.root.open_dir(id.as_str())?
            }
            other => other?,
        };
        let dir = Arc::new(dir);
        if cache.len() >= DIR_CACHE {
            cache.clear();
        }
        cache.insert(id.clone(), dir.clone());
        Ok(dir)
    }

    /// Removes a session's directory and everything in it.
    pub fn remove_session_dir(&self, id: &SessionId) -> io::Result<()> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.remove_dir_named(id.as_str())
    }

    /// Removes a directory directly under the root by name (reconciliation).
    pub fn remove_dir_named(&self, name: &str) -> io::Result<()> {
        match self.root.remove_dir_all(name) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        fsync_dir(&self.root)
    }

    /// Names of the entries directly under the root.
    pub fn list_session_dirs(&self) -> io::Result<Vec<String>> {
        list_names(&self.root)
    }
}

/// Names of the entries of a directory (non-UTF-8 names are shown lossily).
pub fn list_names(dir: &Dir) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in dir.entries()? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub fn fsync_dir(dir: &Dir) -> io::Result<()> {
    // Directory handles are O_PATH, which cannot be fsynced; open the
    // directory itself for reading, through the same capability.
    dir.open(".")?.sync_all()
}

/// A temporary file being written. Dropped unfinished, it removes itself.
#[derive(Debug)]
pub struct TempFile {
    dir: Arc<Dir>,
    name: String,
    file: Option<File>,
    /// Bytes written so far.
    written: u64,
    /// Where the chunk whose writeback was started last begins, and ends.
    flushing: (u64, u64),
}

impl TempFile {
    /// Creates a fresh temporary file in `dir`, readable by its owner only
    /// (it keeps that mode when persisted: payloads are tenants' data).
    pub fn create(dir: Arc<Dir>) -> io::Result<Self> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(io::Error::other)?;
        let name = format!("{TEMP_PREFIX}{}.tmp", hex::encode(raw));
        let file = dir.open_with(
            &name,
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::fsutil::PRIVATE_FILE_MODE),
        )?;
        Ok(Self {
            dir,
            name,
            file: Some(file),
            written: 0,
            flushing: (0, 0),
        })
    }

    /// Appends bytes; a large write is paced chunk by chunk like a stream
    /// of small ones.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        let file = self.file.as_mut().expect("open until persisted");
        while !bytes.is_empty() {
            let room = WRITEBACK_CHUNK - (self.written - self.flushing.1);
            let n = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            file.write_all(&bytes[..n])?;
            bytes = &bytes[n..];
            self.written += n as u64;
            if self.written - self.flushing.1 == WRITEBACK_CHUNK {
                let (start, end) = (self.flushing.1, self.written);
                // Wait for the previous chunk, then start this one.
                writeback(file, self.flushing.0, start - self.flushing.0, true)?;
                writeback(file, start, end - start, false)?;
                self.flushing = (start, end);
            }
        }
        Ok(())
    }

    /// A second handle on the file, for writers that need a std file
    /// (a fetch from object storage).
    pub fn std_file(&self) -> io::Result<std::fs::File> {
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("temp file already persisted"))?;
        Ok(file.try_clone()?.into_std())
    }

    /// The file opened again for reading (the writer's handle is
    /// write-only), for an upload to object storage.
    pub fn reader(&self) -> io::Result<std::fs::File> {
        Ok(self.dir.open(&self.name)?.into_std())
    }

    /// Flushes the bytes to disk; call before [`TempFile::persist`].
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.as_mut().expect("open until persisted").sync_all()
    }

    /// Renames the file to `final_name` and makes the rename durable.
    pub fn persist(mut self, final_name: &str) -> io::Result<()> {
        drop(self.file.take());
        self.dir.rename(&self.name, &self.dir, final_name)?;
        self.name.clear();
        fsync_dir(&self.dir)
    }
}

/// Starts writeback of `len` bytes at `offset` (`sync_file_range`), and with
/// `wait`, waits until they are written. This paces the writes; durability
/// still comes from the fsync in [`TempFile::sync`], since this flushes no
/// metadata.
fn writeback(file: &File, offset: u64, len: u64, wait: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Ok(());
    };
    // SAFETY: a plain syscall on a descriptor this file owns; it reads no
    // memory of ours.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // Some file systems do not support it; the final fsync still holds.
        if e.raw_os_error() != Some(libc::ENOSYS) && e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    Ok(())
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            drop(self.file.take());
            if let Err(e) = self.dir.remove_file(&self.name) {
                tracing::warn!(error = %e, "could not remove an abandoned upload file; startup reconciliation will");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob store under `root` with one new session's directory.
    fn new_session_dir(root: &Path) -> (SessionId, Arc<Dir>) {
        let store = BlobStore::open(root, false).unwrap();
        let id = SessionId::generate();
        store.create_session_dir(&id).unwrap();
        let dir = store.session_dir(&id).unwrap();
        (id, dir)
    }

    /// Writes `bytes` as the file `name` in `dir`, synced, as an upload
    /// does.
    fn persist(dir: &Arc<Dir>, name: &str, bytes: &[u8]) {
        let mut t = TempFile::create(dir.clone()).unwrap();
        t.write_all(bytes).unwrap();
        t.sync().unwrap();
        t.persist(name).unwrap();
    }

    #[test]
    fn a_large_temp_file_is_written_back_in_chunks_and_keeps_every_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, dir) = new_session_dir(tmp.path());
        // Three and a half chunks, streamed in uneven pieces (chunk ends
        // fall mid-piece) or written at once (as Offload does).
        let total = usize::try_from(WRITEBACK_CHUNK * 7 / 2).unwrap();
        let bytes: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        for (name, piece) in [("streamed.bin", 100_003), ("whole.bin", total)] {
            let mut t = TempFile::create(dir.clone()).unwrap();
            for part in bytes.chunks(piece) {
                t.write_all(part).unwrap();
            }
            assert_eq!(t.written, total as u64, "{name}");
            // Writeback was started at each of the three chunk ends; the
            // final fsync is left less than a chunk.
            assert_eq!(
                t.flushing,
                (2 * WRITEBACK_CHUNK, 3 * WRITEBACK_CHUNK),
                "{name}"
            );
            t.sync().unwrap();
            t.persist(name).unwrap();
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut dir.open(name).unwrap(), &mut back).unwrap();
            assert!(
                back == bytes,
                "{name}: the persisted file differs from what was written"
            );
        }
    }

    #[test]
    fn payload_files_and_directories_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let sessions = tmp.path().join("sessions");
        // A sessions directory an older version left world-readable.
        std::fs::create_dir(&sessions).unwrap();
        std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (id, dir) = new_session_dir(tmp.path());
        persist(&dir, "p.txt", b"someone's data");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&sessions), 0o700);
        assert_eq!(mode(&sessions.join(id.as_str())), 0o700);
        assert_eq!(mode(&sessions.join(id.as_str()).join("p.txt")), 0o600);
    }

    #[test]
    fn temp_file_vanishes_unless_persisted() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, dir) = new_session_dir(tmp.path());
        let mut t = TempFile::create(dir.clone()).unwrap();
        t.write_all(b"abandoned").unwrap();
        drop(t);
        assert!(list_names(&dir).unwrap().is_empty());
        persist(&dir, "kept.txt", b"kept");
        assert_eq!(list_names(&dir).unwrap(), vec!["kept.txt".to_string()]);
        assert_eq!(dir.read("kept.txt").unwrap(), b"kept");
    }

    #[test]
    fn session_dirs_refuse_escaping_names() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, dir) = new_session_dir(tmp.path());
        assert!(dir.open("../../etc/passwd").is_err());
        assert!(dir.open("/etc/passwd").is_err());
    }
}
