//! The Spillway session of one MCP connection: created on first use and
//! labelled from the client's `clientInfo`, or an existing one given with
//! `--session`. A session this front created is closed when the connection
//! goes away, so the policy's `delete_on_close` and retention apply.

use tokio::sync::OnceCell;

use super::backend::Backend;

/// One connection's session.
#[derive(Debug)]
pub struct SessionSlot {
    backend: Backend,
    fixed: Option<String>,
    created: OnceCell<String>,
    label: std::sync::Mutex<String>,
}

impl SessionSlot {
    /// A slot that creates its session on first use, or uses `fixed`.
    pub fn new(backend: Backend, fixed: Option<String>) -> Self {
        Self {
            backend,
            fixed,
            created: OnceCell::new(),
            label: std::sync::Mutex::new("mcp".into()),
        }
    }

    /// Sets the label from the MCP client's name and version.
    pub fn set_client(&self, name: &str, version: &str) {
        if let Ok(mut l) = self.label.lock() {
            *l = format!("mcp: {name} {version}");
        }
    }

    /// The session ID, creating the session if needed.
    pub async fn id(&self) -> Result<String, tonic::Status> {
        if let Some(id) = &self.fixed {
            return Ok(id.clone());
        }
        let id = self
            .created
            .get_or_try_init(|| async {
                let label = self.label.lock().map(|l| l.clone()).unwrap_or_default();
                let s = self.backend.create_session(&label).await?;
                tracing::info!(session_id = %s.id, "mcp session opened");
                Ok::<_, tonic::Status>(s.id)
            })
            .await?;
        Ok(id.clone())
    }

    /// The session, if one exists yet (never creates one).
    pub fn existing(&self) -> Option<String> {
        self.fixed.clone().or_else(|| self.created.get().cloned())
    }

    /// Closes the session if this slot created it.
    pub async fn close(&self) {
        if let Some(id) = self.created.get() {
            match self.backend.close_session(id).await {
                Ok(()) => tracing::info!(session_id = %id, "mcp session closed"),
                Err(s) => {
                    tracing::warn!(session_id = %id, code = ?s.code(), "could not close the mcp session")
                }
            }
        }
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let Some(id) = self.created.get().cloned() else {
            return;
        };
        let backend = self.backend.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if backend.close_session(&id).await.is_ok() {
                    tracing::info!(session_id = %id, "mcp session closed");
                }
            });
        }
    }
}
