//! File-system helpers shared by rooms that keep secrets or tenants' data
//! on disk (the dev token, the receipt key, payloads, exec directories).
//! Depends on nothing else in the crate.

use std::io::Write;
use std::path::Path;

/// Mode of a directory that holds tenants' data: its owner only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of a file that holds tenants' data: its owner only.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `path` and any missing parents with [`PRIVATE_DIR_MODE`]. A
/// directory that already exists keeps its mode (it may be one the
/// operator made and owns); use [`make_private`] for the server's own.
pub fn create_private_dir_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(path)
}

/// Creates `path` if needed (parents as [`create_private_dir_all`]) and
/// sets it to [`PRIVATE_DIR_MODE`] even when it existed: for directories
/// only the server makes (`sessions/`, `exec/`), which an older version
/// may have left group- and world-readable.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    create_private_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))
}

/// Writes a file readable by its owner only, durably (dev token, receipt key).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_file_is_owner_only_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_private(&path, b"one").unwrap();
        write_private(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!path.with_extension("tmp").exists());
    }

    #[test]
    fn private_directories_are_owner_only_and_existing_ones_are_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let nested = dir.path().join("a/b");
        create_private_dir_all(&nested).unwrap();
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(mode(&nested), 0o700);
        let old = dir.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir_all(&old).unwrap();
        assert_eq!(mode(&old), 0o755, "an existing directory keeps its mode");
        make_private(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
    }
}
