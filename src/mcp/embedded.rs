//! The embedded default: with no `--server`, the MCP front uses a Spillway
//! server on the user's data directory (`$XDG_DATA_HOME/spillway`, or
//! `~/.local/share/spillway`), and starts one if none is running.
//!
//! Several fronts started at once (an MCP client often starts five) share
//! one server: each takes an exclusive `flock` on `mcp-server.lock` in the
//! data directory, then either finds the address in `mcp-server.addr`
//! answering, or starts `spillway serve` on a free loopback port, waits
//! until it answers, and writes the address. Only the lock holder may start
//! a server, and the server itself holds the metadata database exclusively,
//! so two servers never open one data directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::McpError;

/// The lock file that serializes server starts.
pub const LOCK_FILE: &str = "mcp-server.lock";
/// Where the running server's address is written.
pub const ADDR_FILE: &str = "mcp-server.addr";
/// The embedded server's log.
pub const LOG_FILE: &str = "mcp-server.log";

/// `$XDG_DATA_HOME/spillway`, or `~/.local/share/spillway`.
pub fn default_data_dir() -> Result<PathBuf, McpError> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("spillway"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".local/share/spillway")),
        None => Err(McpError::Embedded(
            "neither XDG_DATA_HOME nor HOME is set, so there is no default data directory; pass --data-dir, or --server for a running Spillway".into(),
        )),
    }
}

struct Lock(std::fs::File);

impl Lock {
    fn take(dir: &Path) -> Result<Self, McpError> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| {
                McpError::Embedded(format!(
                    "cannot open the lock file in the data directory: {e}"
                ))
            })?;
        // An exclusive flock; it blocks until granted.
        f.lock()
            .map_err(|e| McpError::Embedded(format!("cannot lock the data directory: {e}")))?;
        Ok(Self(f))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

async fn answers(addr: &str) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr)
        )
        .await,
        Ok(Ok(_))
    )
}

fn images_dir() -> Option<PathBuf> {
    if std::env::var_os("SPILLWAY_SANDBOX__IMAGES_DIR").is_some() {
        return None;
    }
    let mut candidates = vec![PathBuf::from("sandbox-images")];
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.push(dir.join("sandbox-images"));
        if let Some(up) = dir.parent().and_then(Path::parent) {
            candidates.push(up.join("sandbox-images"));
        }
    }
    candidates
        .into_iter()
        .find(|c| c.join("jq.wasm").is_file())
        .and_then(|c| std::fs::canonicalize(c).ok())
}

/// Returns the address of the data directory's server, starting it if none
/// answers.
pub async fn ensure_server(dir: &Path) -> Result<String, McpError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| McpError::Embedded(format!("cannot create the data directory: {e}")))?;
    let d = dir.to_path_buf();
    let lock = tokio::task::spawn_blocking(move || Lock::take(&d))
        .await
        .map_err(|e| McpError::Embedded(e.to_string()))??;
    let addr_file = dir.join(ADDR_FILE);
    if let Ok(addr) = std::fs::read_to_string(&addr_file) {
        let addr = addr.trim().to_owned();
        if !addr.is_empty() && answers(&addr).await {
            drop(lock);
            return Ok(addr);
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| McpError::Embedded(format!("no free loopback port: {e}")))?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let exe = std::env::current_exe()
        .map_err(|e| McpError::Embedded(format!("cannot find the spillway binary: {e}")))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG_FILE))
        .map_err(|e| McpError::Embedded(format!("cannot open the server log: {e}")))?;
    let log2 = log
        .try_clone()
        .map_err(|e| McpError::Embedded(e.to_string()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .arg("--listen")
        .arg(&addr)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    if let Some(images) = images_dir() {
        cmd.env("SPILLWAY_SANDBOX__IMAGES_DIR", images);
    }
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: a Ctrl-C meant for the MCP client does not
        // stop the server the other fronts share.
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| McpError::Embedded(format!("cannot start `spillway serve`: {e}")))?;
    let started = Instant::now();
    let log_name = dir.join(LOG_FILE);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(McpError::Embedded(format!(
                "the embedded Spillway server exited at startup ({status}); its log is {}",
                log_name.display()
            )));
        }
        if answers(&addr).await && dir.join(crate::auth::DEV_TOKEN_FILE).is_file() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err(McpError::Embedded(format!(
                "the embedded Spillway server did not answer within 60 s; its log is {}",
                log_name.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&addr_file, &addr)
        .map_err(|e| McpError::Embedded(format!("cannot write the server address: {e}")))?;
    tracing::info!(pid = child.id(), "embedded spillway server started");
    drop(lock);
    Ok(addr)
}
