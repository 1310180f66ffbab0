//! The per-exec directory a guest sees, built through cap-std.
//!
//! Each exec gets `<data_dir>/exec/<id>/` with four directories, preopened
//! in the guest as:
//! - `/payloads` (read-only): the inputs, hard-linked from their session
//!   directories under their names and their IDs, so nothing is copied and
//!   nothing outside the inputs is reachable;
//! - `/spillway` (read-only): `script` and `payloads.json`;
//! - `/tmp` and `/out` (read-write): scratch and outputs, whose combined
//!   bytes and entries are capped by [`WorkDir::usage`] checks: a walk with
//!   no depth limit that counts the blocks the file system charges (a
//!   sparse file counts what it takes, a hard-linked file counts once) and
//!   stops as soon as it has seen more entries than allowed.
//!
//! When the [`WorkDir`] drops, its four directories are emptied and kept,
//! up to a bound, for the next exec of the same tenant: creating and
//! removing directories is what an exec directory costs (on a disk mounted
//! with `discard`, removing one takes milliseconds), while emptying them
//! is a few unlinks. A directory that does not empty cleanly, that held
//! many entries, or whose run did not end cleanly ([`WorkDir::discard`]),
//! is removed instead. Leftovers
//! of a crash are removed when the server starts.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, MetadataExt};
use serde::Serialize;

use super::SandboxError;

/// Directory handles one walk keeps open at most; deeper directories are
/// reopened by path from the nearest open ancestor when they still have
/// subdirectories to visit.
const MAX_OPEN_DIRS: usize = 64;
/// Path components one walk may resolve to reopen directories, per entry
/// allowed: a tree shaped to make the walk quadratic is stopped, as over
/// its limit, instead of being walked slowly.
const REOPEN_WORK_PER_ENTRY: u64 = 16;
/// Most bytes of path handed to one reopen (well under `PATH_MAX`).
const REOPEN_PATH_BYTES: usize = 2048;

/// One input payload, as the sandbox needs it.
#[derive(Debug, Clone)]
pub struct ExecInput {
    /// Payload ID.
    pub id: String,
    /// Payload name (already sanitized by the store).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Content type.
    pub content_type: String,
    /// The session directory holding the bytes.
    pub dir: Arc<Dir>,
    /// The file's name in that directory.
    pub file_name: String,
}

/// One entry of `/spillway/payloads.json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GuestPayload<'a> {
    id: &'a str,
    name: &'a str,
    path: String,
    size: u64,
    content_type: &'a str,
}

/// Where exec directories live.
#[derive(Debug)]
pub struct WorkRoot {
    root: Arc<Dir>,
    spares: Arc<Mutex<Spares>>,
}

/// Emptied exec directories, by tenant, for reuse.
#[derive(Debug, Default)]
struct Spares {
    /// Most kept over all tenants.
    capacity: usize,
    count: usize,
    by_tenant: HashMap<String, Vec<(String, Dirs)>>,
}

impl Spares {
    fn take(&mut self, tenant: &str) -> Option<(String, Dirs)> {
        let list = self.by_tenant.get_mut(tenant)?;
        let spare = list.pop();
        if list.is_empty() {
            self.by_tenant.remove(tenant);
        }
        if spare.is_some() {
            self.count -= 1;
        }
        spare
    }

    /// Keeps `spare` for `tenant`, or gives it back when full.
    fn keep(&mut self, tenant: &str, spare: (String, Dirs)) -> Option<(String, Dirs)> {
        if self.count >= self.capacity {
            return Some(spare);
        }
        self.count += 1;
        self.by_tenant
            .entry(tenant.to_owned())
            .or_default()
            .push(spare);
        None
    }
}

impl WorkRoot {
    /// Opens (creating if needed) `<data_dir>/exec` and removes what a crash
    /// left there; up to `spares` emptied exec directories are kept for
    /// reuse.
    pub fn open(data_dir: &Path, spares: usize) -> io::Result<Self> {
        // Owner-only: exec directories hold links to tenants' payloads.
        let path = data_dir.join("exec");
        crate::fsutil::make_private(&path)?;
        let root = Dir::open_ambient_dir(&path, ambient_authority())?;
        for entry in root.entries()? {
            let name = entry?.file_name();
            root.remove_dir_all(&name)?;
        }
        Ok(Self {
            root: Arc::new(root),
            spares: Arc::new(Mutex::new(Spares {
                capacity: spares,
                ..Spares::default()
            })),
        })
    }

    /// Builds the directory of one exec. An input whose file is gone (the
    /// payload was deleted after the caller resolved it) is
    /// [`SandboxError::InputGone`], not a host I/O failure.
    pub fn create(
        &self,
        exec_id: &str,
        tenant: &str,
        inputs: &[ExecInput],
        script: &str,
    ) -> Result<WorkDir, SandboxError> {
        let spare = lock(&self.spares).take(tenant);
        let mut work = WorkDir {
            root: self.root.clone(),
            name: exec_id.to_owned(),
            dirs: None,
            tenant: tenant.to_owned(),
            spares: self.spares.clone(),
            reusable: AtomicBool::new(true),
        };
        match spare {
            Some((name, dirs)) => {
                work.name = name;
                work.dirs = Some(dirs);
            }
            None => {
                let mut private = cap_std::fs::DirBuilder::new();
                cap_std::fs::DirBuilderExt::mode(&mut private, crate::fsutil::PRIVATE_DIR_MODE);
                self.root.create_dir_with(exec_id, &private)?;
                // From here on, dropping `work` removes the directory.
                let base = self.root.open_dir(exec_id)?;
                for sub in ["payloads", "spillway", "tmp", "out"] {
                    base.create_dir(sub)?;
                }
                work.dirs = Some(Dirs {
                    payloads: base.open_dir("payloads")?,
                    spillway: base.open_dir("spillway")?,
                    tmp: base.open_dir("tmp")?,
                    out: base.open_dir("out")?,
                });
            }
        }
        // A directory that fails to fill is not reused.
        work.discard();
        work.fill(inputs, script)?;
        work.reusable.store(true, Ordering::Relaxed);
        Ok(work)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WorkDir {
    /// Links the inputs and writes `script` and `payloads.json`.
    fn fill(&self, inputs: &[ExecInput], script: &str) -> Result<(), SandboxError> {
        let dirs = self.dirs();
        let mut listed = Vec::with_capacity(inputs.len());
        for input in inputs {
            let path = link_input(input, &dirs.payloads).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    SandboxError::InputGone(input.id.clone())
                } else {
                    SandboxError::Io(e)
                }
            })?;
            listed.push(GuestPayload {
                id: &input.id,
                name: &input.name,
                path,
                size: input.size,
                content_type: &input.content_type,
            });
        }
        write_file(&dirs.spillway, "script", script.as_bytes())?;
        let json = serde_json::to_vec(&listed).map_err(io::Error::other)?;
        write_file(&dirs.spillway, "payloads.json", &json)?;
        Ok(())
    }

    /// Removes the directory when it drops instead of keeping it for reuse:
    /// for a run that did not end cleanly (a host call the guest was in may
    /// still be finishing).
    pub fn discard(&self) {
        self.reusable.store(false, Ordering::Relaxed);
    }
}

/// Entries an exec may leave directly in one of its directories for the
/// directory to be reused: past this, it is removed instead (a directory
/// that once held many entries keeps its size, and is slower to list).
const REUSE_MAX_ENTRIES: usize = 1000;

/// Empties the four directories of an exec, and checks that they are (a
/// listing that found nothing is itself the check).
fn empty(d: &Dirs) -> io::Result<()> {
    for dir in [&d.payloads, &d.spillway, &d.tmp, &d.out] {
        let mut removed = false;
        for (n, entry) in dir.entries()?.enumerate() {
            if n >= REUSE_MAX_ENTRIES {
                return Err(io::Error::other("too many entries to reuse it"));
            }
            let entry = entry?;
            let name = entry.file_name();
            if entry.file_type()?.is_dir() {
                dir.remove_dir_all(&name)?;
            } else {
                dir.remove_file(&name)?;
            }
            removed = true;
        }
        if removed && dir.entries()?.next().is_some() {
            return Err(io::Error::other("an entry came back while emptying"));
        }
    }
    Ok(())
}

/// Links an input under its name and its ID; returns the path the guest
/// should use. A name already taken (a shared parent's payload of the same
/// name) leaves the input reachable by ID only.
fn link_input(input: &ExecInput, payloads: &Dir) -> io::Result<String> {
    use crate::guest::guest_path;
    input.dir.hard_link(&input.file_name, payloads, &input.id)?;
    if input.name == input.id {
        return Ok(guest_path(&input.id));
    }
    match input.dir.hard_link(&input.file_name, payloads, &input.name) {
        Ok(()) => Ok(guest_path(&input.name)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(guest_path(&input.id)),
        Err(e) => Err(e),
    }
}

fn write_file(dir: &Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    let mut f = dir.create(name)?;
    f.write_all(bytes)
}

#[derive(Debug)]
struct Dirs {
    payloads: Dir,
    spillway: Dir,
    tmp: Dir,
    out: Dir,
}

/// Bytes and entries under `/tmp` and `/out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes the file system charges (allocated blocks) for every file,
    /// directory and link, each inode once: a sparse file counts the blocks
    /// it takes, a file with several names counts once.
    pub bytes: u64,
    /// Names seen: files, directories and links (each name of a
    /// hard-linked file is an entry). A walk stops one past its limit.
    pub entries: u64,
    /// The walk stopped before it had seen everything: more entries than
    /// allowed, a tree shaped to make the walk too costly, or an error
    /// reading it. Treated as over the limit.
    pub incomplete: Option<Incomplete>,
}

/// Why a walk did not see everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incomplete {
    /// More entries than allowed.
    Entries,
    /// So deep and branched that measuring it would take too long.
    TooDeep,
    /// An error other than an entry vanishing.
    Unreadable(io::ErrorKind),
}

/// A file a script left in `/out`.
#[derive(Debug)]
pub struct OutFile {
    /// Its name.
    pub name: String,
    /// The open file.
    pub file: File,
    /// Its length.
    pub len: u64,
}

/// One exec's directory; emptied and kept for reuse, or removed, on drop.
#[derive(Debug)]
pub struct WorkDir {
    root: Arc<Dir>,
    name: String,
    dirs: Option<Dirs>,
    tenant: String,
    spares: Arc<Mutex<Spares>>,
    reusable: AtomicBool,
}

/// A directory to preopen.
#[derive(Debug, Clone, Copy)]
pub enum Mount {
    /// `/payloads`.
    Payloads,
    /// `/spillway`.
    Spillway,
    /// `/tmp`.
    Tmp,
    /// `/out`.
    Out,
}

impl Mount {
    /// Where the guest sees it.
    pub fn guest_path(self) -> &'static str {
        match self {
            Mount::Payloads => crate::guest::MOUNT,
            Mount::Spillway => "/spillway",
            Mount::Tmp => "/tmp",
            Mount::Out => "/out",
        }
    }
}

impl WorkDir {
    fn dirs(&self) -> &Dirs {
        self.dirs
            .as_ref()
            .expect("a WorkDir is returned only when complete")
    }

    fn dir(&self, m: Mount) -> &Dir {
        let d = self.dirs();
        match m {
            Mount::Payloads => &d.payloads,
            Mount::Spillway => &d.spillway,
            Mount::Tmp => &d.tmp,
            Mount::Out => &d.out,
        }
    }

    /// A path that names the open directory handle itself
    /// (`/proc/self/fd/N`). wasmtime-wasi 48 preopens take a path; this one
    /// re-opens the capability we hold rather than resolving the data
    /// directory again.
    pub fn preopen_path(&self, m: Mount) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.dir(m).as_raw_fd()))
    }

    /// Bytes and entries under `/tmp` and `/out`, at any depth. The walk
    /// stops once it has seen more than `max_entries` entries (then
    /// `incomplete` says so), so its work is bounded by the limit.
    pub fn usage(&self, max_entries: u64) -> Usage {
        let mut walk = Walk::new(max_entries);
        for m in [Mount::Tmp, Mount::Out] {
            if let Err(stop) = walk.mount(self.dir(m)) {
                walk.usage.incomplete = Some(stop);
                break;
            }
        }
        walk.usage
    }

    /// The regular files directly under `/out`, and a note on what was left
    /// out (directories, links, names that are not UTF-8).
    pub fn out_files(&self) -> io::Result<(Vec<OutFile>, Vec<String>)> {
        let out = &self.dirs().out;
        let mut files = Vec::new();
        let mut skipped = Vec::new();
        for entry in out.entries()? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str().map(str::to_owned) else {
                skipped.push(format!("{} (name is not UTF-8)", name.to_string_lossy()));
                continue;
            };
            let ty = entry.file_type()?;
            if !ty.is_file() {
                skipped.push(format!("{name} (not a regular file)"));
                continue;
            }
            let file = out.open(&name)?;
            let len = file.metadata()?.len();
            files.push(OutFile { name, file, len });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((files, skipped))
    }
}

/// A subdirectory still to visit: its name and its (dev, ino).
type Subdir = (OsString, (u64, u64));

/// One directory on the walk's stack.
struct Frame {
    /// Its handle, while it has one (see [`MAX_OPEN_DIRS`]).
    dir: Option<Dir>,
    /// Its name in its parent.
    name: OsString,
    /// Subdirectories still to visit, with their (dev, ino).
    pending: Vec<Subdir>,
}

/// An iterative walk: an explicit stack, no recursion and no depth limit.
struct Walk {
    max_entries: u64,
    usage: Usage,
    /// Inodes already charged: directories (a rename during the walk could
    /// show one twice) and files with more than one name.
    seen: HashSet<(u64, u64)>,
    reopen_work: u64,
    /// Handles held on the stack.
    open: usize,
}

impl Walk {
    fn new(max_entries: u64) -> Self {
        Self {
            max_entries,
            usage: Usage::default(),
            seen: HashSet::new(),
            reopen_work: 0,
            open: 0,
        }
    }

    /// Walks everything under `root`.
    fn mount(&mut self, root: &Dir) -> Result<(), Incomplete> {
        let mut stack = vec![Frame {
            dir: None,
            name: OsString::new(),
            pending: self.list(root)?,
        }];
        self.open = 0;
        while let Some(top) = stack.last_mut() {
            let Some((name, id)) = top.pending.pop() else {
                if stack.pop().is_some_and(|f| f.dir.is_some()) {
                    self.open = self.open.saturating_sub(1);
                }
                continue;
            };
            let depth = stack.len() - 1;
            let child = {
                let parent = match self.handle(root, &mut stack, depth) {
                    Ok(p) => p,
                    Err(Incomplete::Unreadable(io::ErrorKind::NotFound)) => continue,
                    Err(e) => return Err(e),
                };
                match parent.open_dir(&name) {
                    Ok(d) => d,
                    // Removed or replaced since it was listed.
                    Err(e) if vanished(&e) => continue,
                    Err(e) => return Err(Incomplete::Unreadable(e.kind())),
                }
            };
            // Only the directory that was listed and charged, not whatever
            // a rename put under its name since.
            match child.dir_metadata() {
                Ok(m) if (m.dev(), m.ino()) == id => {}
                Ok(_) => continue,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(Incomplete::Unreadable(e.kind())),
            }
            let pending = match self.list(&child) {
                Ok(p) => p,
                Err(Incomplete::Unreadable(io::ErrorKind::NotFound)) => continue,
                Err(e) => return Err(e),
            };
            if pending.is_empty() {
                continue;
            }
            // A parent with nothing left to visit needs no handle.
            if let Some(parent) = stack.last_mut()
                && parent.pending.is_empty()
                && parent.dir.take().is_some()
            {
                self.open = self.open.saturating_sub(1);
            }
            if self.open >= MAX_OPEN_DIRS
                && let Some(oldest) = stack.iter_mut().find(|f| f.dir.is_some())
            {
                oldest.dir = None;
                self.open = self.open.saturating_sub(1);
            }
            stack.push(Frame {
                dir: Some(child),
                name,
                pending,
            });
            self.open += 1;
        }
        Ok(())
    }

    /// The handle of `stack[depth]`, reopened by path from the nearest
    /// ancestor that has one when it was closed.
    fn handle<'a>(
        &mut self,
        root: &'a Dir,
        stack: &'a mut [Frame],
        depth: usize,
    ) -> Result<&'a Dir, Incomplete> {
        if depth == 0 {
            return Ok(root);
        }
        if stack[depth].dir.is_none() {
            let base = (1..depth).rev().find(|&i| stack[i].dir.is_some());
            let mut names: Vec<&OsString> = Vec::new();
            for f in &stack[base.map_or(1, |b| b + 1)..=depth] {
                names.push(&f.name);
            }
            self.reopen_work += names.len() as u64;
            if self.reopen_work > self.max_entries.saturating_mul(REOPEN_WORK_PER_ENTRY) {
                return Err(Incomplete::TooDeep);
            }
            let mut dir: Option<Dir> = None;
            for chunk in chunks(&names) {
                let from = match (&dir, base) {
                    (Some(d), _) => d,
                    (None, Some(b)) => stack[b].dir.as_ref().unwrap_or(root),
                    (None, None) => root,
                };
                dir = Some(
                    from.open_dir(&chunk)
                        .map_err(|e| Incomplete::Unreadable(e.kind()))?,
                );
            }
            if dir.is_some() {
                self.open += 1;
            }
            stack[depth].dir = dir;
        }
        Ok(stack[depth].dir.as_ref().unwrap_or(root))
    }

    /// Charges every entry of `dir`; returns its subdirectories.
    fn list(&mut self, dir: &Dir) -> Result<Vec<Subdir>, Incomplete> {
        let mut subdirs = Vec::new();
        let entries = match dir.entries() {
            Ok(e) => e,
            Err(e) if vanished(&e) => return Ok(subdirs),
            Err(e) => return Err(Incomplete::Unreadable(e.kind())),
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(Incomplete::Unreadable(e.kind())),
            };
            self.usage.entries += 1;
            if self.usage.entries > self.max_entries {
                return Err(Incomplete::Entries);
            }
            // Not following links: a link is charged as itself.
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(Incomplete::Unreadable(e.kind())),
            };
            let id = (meta.dev(), meta.ino());
            let charged = meta.blocks().saturating_mul(512);
            if meta.is_dir() {
                if self.seen.insert(id) {
                    self.usage.bytes = self.usage.bytes.saturating_add(charged);
                    subdirs.push((entry.file_name(), id));
                }
            } else if meta.nlink() <= 1 || self.seen.insert(id) {
                self.usage.bytes = self.usage.bytes.saturating_add(charged);
            }
        }
        Ok(subdirs)
    }
}

/// Names joined into relative paths of at most [`REOPEN_PATH_BYTES`].
fn chunks(names: &[&OsString]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut cur = PathBuf::new();
    let mut len = 0;
    for n in names {
        if len > 0 && len + n.len() + 1 > REOPEN_PATH_BYTES {
            out.push(std::mem::take(&mut cur));
            len = 0;
        }
        cur.push(n);
        len += n.len() + 1;
    }
    if len > 0 {
        out.push(cur);
    }
    out
}

/// An entry removed (or turned into something else) while it was walked:
/// scripts change their scratch all the time.
fn vanished(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    ) || e.raw_os_error() == Some(libc::ELOOP)
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(dirs) = self.dirs.take()
            && self.reusable.load(Ordering::Relaxed)
            && empty(&dirs).is_ok()
        {
            let spare = (std::mem::take(&mut self.name), dirs);
            match lock(&self.spares).keep(&self.tenant, spare) {
                None => return,
                // No room: removed after all.
                Some((name, _)) => self.name = name,
            }
        }
        if let Err(e) = self.root.remove_dir_all(&self.name) {
            tracing::warn!(exec = %self.name, error = %e, "could not remove an exec directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(dir: &Arc<Dir>, id: &str, file_name: &str) -> ExecInput {
        ExecInput {
            id: id.into(),
            name: format!("{id}.txt"),
            size: 1,
            content_type: "text/plain".into(),
            dir: dir.clone(),
            file_name: file_name.into(),
        }
    }

    /// A session directory under `tmp` holding `a.txt` ("a"): its path and
    /// the directory opened as inputs are read from it.
    fn session_dir(tmp: &Path) -> (PathBuf, Arc<Dir>) {
        let session = tmp.join("session");
        std::fs::create_dir(&session).unwrap();
        std::fs::write(session.join("a.txt"), b"a").unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(&session, ambient_authority()).unwrap());
        (session, dir)
    }

    /// A tree `depth` deep whose every level has a leaf directory holding
    /// one 4 KiB file beside the way down: the walk must close handles past
    /// [`MAX_OPEN_DIRS`] and reopen them for the leaves.
    fn branched(root: &Path, depth: usize) -> u64 {
        let mut d = root.to_path_buf();
        let mut entries = 0;
        for _ in 0..depth {
            std::fs::create_dir(d.join("leaf")).unwrap();
            std::fs::write(d.join("leaf").join("f"), [7u8; 4096]).unwrap();
            d.push("down");
            std::fs::create_dir(&d).unwrap();
            entries += 3;
        }
        entries
    }

    #[test]
    fn the_walk_counts_every_entry_of_a_deep_branched_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = WorkRoot::open(&tmp.path().join("data"), 0).unwrap();
        let work = root.create("x1", "t", &[], "").unwrap();
        let tmp_dir = tmp.path().join("data/exec/x1/tmp");
        let want = branched(&tmp_dir, 3 * MAX_OPEN_DIRS);
        let u = work.usage(100_000);
        assert_eq!(u.incomplete, None);
        assert_eq!(u.entries, want);
        let files = (3 * MAX_OPEN_DIRS) as u64 * 4096;
        assert!(u.bytes >= files, "{} < {files}", u.bytes);
        // One past the limit, the walk stops and says so.
        let u = work.usage(want - 1);
        assert_eq!(u.incomplete, Some(Incomplete::Entries));
    }

    #[test]
    fn a_hard_linked_file_is_charged_once_and_a_sparse_one_by_its_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = WorkRoot::open(&tmp.path().join("data"), 0).unwrap();
        let work = root.create("x1", "t", &[], "").unwrap();
        let t = tmp.path().join("data/exec/x1/tmp");
        std::fs::write(t.join("a"), vec![1u8; 1 << 20]).unwrap();
        for i in 0..10 {
            std::fs::hard_link(t.join("a"), t.join(format!("l{i}"))).unwrap();
        }
        let f = std::fs::File::create(t.join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        let u = work.usage(1000);
        assert_eq!(u.entries, 12);
        assert!(
            (1 << 20..(1 << 20) + (64 << 10)).contains(&u.bytes),
            "{}",
            u.bytes
        );
    }

    #[test]
    fn an_input_deleted_before_linking_is_input_gone_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, dir) = session_dir(tmp.path());
        let root = WorkRoot::open(&tmp.path().join("data"), 0).unwrap();

        let work = root
            .create("x1", "t", &[input(&dir, "pay_a", "a.txt")], "")
            .unwrap();
        drop(work);
        // The payload's file went away between resolving and linking, as
        // when a DeletePayload races the exec.
        let Err(err) = root.create(
            "x2",
            "t",
            &[input(&dir, "pay_a", "a.txt"), input(&dir, "pay_b", "b.txt")],
            "",
        ) else {
            panic!("a missing input fails the exec");
        };
        assert!(
            matches!(&err, SandboxError::InputGone(id) if id == "pay_b"),
            "{err:?}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("data").join("exec"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "the exec directory is removed: {left:?}");
    }

    #[test]
    fn a_reused_directory_holds_nothing_of_the_last_exec_and_only_its_tenant_gets_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (session, dir) = session_dir(tmp.path());
        let root = WorkRoot::open(&tmp.path().join("data"), 1).unwrap();
        let exec = tmp.path().join("data").join("exec");

        let work = root
            .create("x1", "t", &[input(&dir, "pay_a", "a.txt")], "first")
            .unwrap();
        let x1 = exec.join("x1");
        std::fs::write(x1.join("tmp/left"), b"secret").unwrap();
        std::fs::create_dir_all(x1.join("out/d/e")).unwrap();
        std::fs::write(x1.join("out/d/e/f"), b"secret").unwrap();
        std::os::unix::fs::symlink("../payloads", x1.join("out/link")).unwrap();
        drop(work);
        // Kept, emptied: the payload the link pointed into is untouched.
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&exec), ["x1"]);
        for sub in ["payloads", "spillway", "tmp", "out"] {
            assert!(names(&x1.join(sub)).is_empty(), "{sub} was not emptied");
        }
        assert_eq!(std::fs::read(session.join("a.txt")).unwrap(), b"a");

        // Another tenant gets a new directory; the pool is full (one), so
        // that one is removed when it drops.
        let other = root.create("x2", "u", &[], "other").unwrap();
        assert_eq!(names(&exec), ["x1", "x2"]);
        drop(other);
        assert_eq!(names(&exec), ["x1"]);

        // The same tenant gets the emptied one, with only its own files.
        let again = root.create("x3", "t", &[], "second").unwrap();
        assert_eq!(names(&exec), ["x1"]);
        assert_eq!(names(&x1.join("spillway")), ["payloads.json", "script"]);
        assert_eq!(
            std::fs::read(x1.join("spillway/script")).unwrap(),
            b"second"
        );
        assert!(names(&x1.join("payloads")).is_empty());
        assert!(names(&x1.join("tmp")).is_empty() && names(&x1.join("out")).is_empty());

        // After an unclean run it is removed, not kept; so is one left with
        // more entries than are worth emptying.
        again.discard();
        drop(again);
        assert!(names(&exec).is_empty());
        let full = root.create("x4", "t", &[], "").unwrap();
        for i in 0..=REUSE_MAX_ENTRIES {
            std::fs::write(exec.join("x4/tmp").join(format!("f{i}")), b"").unwrap();
        }
        drop(full);
        assert!(names(&exec).is_empty());
        let small = root.create("x5", "t", &[], "").unwrap();
        std::fs::write(exec.join("x5/tmp/f"), b"").unwrap();
        drop(small);
        assert_eq!(names(&exec), ["x5"]);
    }
}
