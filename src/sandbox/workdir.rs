//! The per-exec directory a guest sees, built through cap-std.
//!
//! Each exec gets `<data_dir>/exec/<id>/` with four directories, preopened
//! in the guest as:
//! - `/payloads` (read-only): the inputs, hard-linked from their session
//!   directories under their names and their IDs, so nothing is copied and
//!   nothing outside the inputs is reachable;
//! - `/spillway` (read-only): `script` and `payloads.json`;
//! - `/tmp` and `/out` (read-write): scratch and outputs, whose combined
//!   bytes and entries are capped by [`WorkDir::usage`] checks.
//!
//! The directory is removed when the [`WorkDir`] drops, and leftovers of a
//! crash are removed when the server starts.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, File};
use serde::Serialize;

use super::SandboxError;

/// Deepest directory nesting [`WorkDir::usage`] follows.
const MAX_DEPTH: usize = 32;

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
}

impl WorkRoot {
    /// Opens (creating if needed) `<data_dir>/exec` and removes what a crash
    /// left there.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        let path = data_dir.join("exec");
        std::fs::create_dir_all(&path)?;
        let root = Dir::open_ambient_dir(&path, ambient_authority())?;
        for entry in root.entries()? {
            let name = entry?.file_name();
            root.remove_dir_all(&name)?;
        }
        Ok(Self {
            root: Arc::new(root),
        })
    }

    /// Builds the directory of one exec. An input whose file is gone (the
    /// payload was deleted after the caller resolved it) is
    /// [`SandboxError::InputGone`], not a host I/O failure.
    pub fn create(
        &self,
        exec_id: &str,
        inputs: &[ExecInput],
        script: &str,
    ) -> Result<WorkDir, SandboxError> {
        self.root.create_dir(exec_id)?;
        // From here on, dropping `work` removes the directory.
        let mut work = WorkDir {
            root: self.root.clone(),
            name: exec_id.to_owned(),
            dirs: None,
        };
        let base = self.root.open_dir(exec_id)?;
        for sub in ["payloads", "spillway", "tmp", "out"] {
            base.create_dir(sub)?;
        }
        let dirs = Dirs {
            payloads: base.open_dir("payloads")?,
            spillway: base.open_dir("spillway")?,
            tmp: base.open_dir("tmp")?,
            out: base.open_dir("out")?,
        };
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
        work.dirs = Some(dirs);
        Ok(work)
    }
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
    /// Sum of file lengths (a sparse file counts at its length).
    pub bytes: u64,
    /// Files, directories and links.
    pub entries: u64,
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

/// One exec's directory; removed on drop.
#[derive(Debug)]
pub struct WorkDir {
    root: Arc<Dir>,
    name: String,
    dirs: Option<Dirs>,
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

    /// Bytes and entries under `/tmp` and `/out`, counting at most
    /// `max_entries` entries (the caller treats reaching it as over).
    pub fn usage(&self, max_entries: u64) -> io::Result<Usage> {
        let mut usage = Usage::default();
        for m in [Mount::Tmp, Mount::Out] {
            walk(self.dir(m), 0, max_entries, &mut usage)?;
        }
        Ok(usage)
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

fn walk(dir: &Dir, depth: usize, max_entries: u64, usage: &mut Usage) -> io::Result<()> {
    for entry in dir.entries()? {
        let entry = entry?;
        usage.entries += 1;
        if usage.entries >= max_entries {
            return Ok(());
        }
        let ty = entry.file_type()?;
        if ty.is_dir() {
            if depth < MAX_DEPTH {
                walk(&entry.open_dir()?, depth + 1, max_entries, usage)?;
            }
        } else if ty.is_file() {
            usage.bytes = usage.bytes.saturating_add(entry.metadata()?.len());
        }
    }
    Ok(())
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        self.dirs = None;
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

    #[test]
    fn an_input_deleted_before_linking_is_input_gone_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session");
        std::fs::create_dir(&session).unwrap();
        std::fs::write(session.join("a.txt"), b"a").unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(&session, ambient_authority()).unwrap());
        let root = WorkRoot::open(&tmp.path().join("data")).unwrap();

        let work = root
            .create("x1", &[input(&dir, "pay_a", "a.txt")], "")
            .unwrap();
        drop(work);
        // The payload's file went away between resolving and linking, as
        // when a DeletePayload races the exec.
        let Err(err) = root.create(
            "x2",
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
}
