//! The MCP front's only way into Spillway: a gRPC client of a Spillway
//! server, authenticated with the caller's token, exactly like the CLI. So
//! access, audit, redaction and quotas apply unchanged.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::spool::{Piece, stream_pieces};
use crate::client::{Bearer, ClientSettings, connect};
use crate::proto::{
    self, code_mode_client::CodeModeClient, context_client::ContextClient,
    payloads_client::PayloadsClient, sessions_client::SessionsClient,
};

type Svc = InterceptedService<Channel, Bearer>;

/// Bytes per upload chunk: well under the server's 4 MiB message limit.
pub const UPLOAD_CHUNK: usize = 1 << 20;

/// One connection to a Spillway server; cheap to clone.
#[derive(Clone)]
pub struct Backend {
    sessions: SessionsClient<Svc>,
    payloads: PayloadsClient<Svc>,
    codemode: CodeModeClient<Svc>,
    context: ContextClient<Svc>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

/// Backend methods that pass a whole request to one RPC and return its
/// reply: `name(Request) -> Reply via client, "doc"`.
macro_rules! unary {
    ($($method:ident($req:ident) -> $reply:ident via $client:ident, $doc:literal;)+) => {$(
        #[doc = $doc]
        pub async fn $method(&self, req: proto::$req) -> Result<proto::$reply, tonic::Status> {
            Ok(self.$client.clone().$method(req).await?.into_inner())
        }
    )+};
}

impl Backend {
    unary! {
        search(SearchRequest) -> SearchResponse via payloads, "Searches a session's payloads.";
        read(ReadRequest) -> ReadResponse via payloads, "Reads part of a payload.";
        exec(ExecRequest) -> ExecResult via codemode, "Runs a script.";
        offload(OffloadRequest) -> OffloadResponse via payloads,
            "One turn of results through the offload decision.";
    }

    /// Connects with the CLI's settings (address, token, TLS).
    pub async fn connect(settings: &ClientSettings) -> anyhow::Result<Self> {
        let (channel, bearer) = connect(settings).await?;
        Ok(Self {
            sessions: SessionsClient::with_interceptor(channel.clone(), bearer.clone()),
            payloads: PayloadsClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(64 << 20),
            codemode: CodeModeClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(64 << 20),
            context: ContextClient::with_interceptor(channel, bearer)
                .max_decoding_message_size(64 << 20),
        })
    }

    /// Opens a session labelled after the MCP client.
    pub async fn create_session(&self, label: &str) -> Result<proto::Session, tonic::Status> {
        let mut labels = std::collections::HashMap::new();
        labels.insert("front".to_owned(), "mcp".to_owned());
        let req = proto::CreateSessionRequest {
            label: label.chars().take(200).collect(),
            labels,
            ..Default::default()
        };
        Ok(self
            .sessions
            .clone()
            .create_session(req)
            .await?
            .into_inner())
    }

    /// Checks that a session exists and the caller may use it.
    pub async fn get_session(&self, id: &str) -> Result<proto::Session, tonic::Status> {
        let req = proto::GetSessionRequest {
            session_id: id.to_owned(),
        };
        Ok(self.sessions.clone().get_session(req).await?.into_inner())
    }

    /// Closes a session (read-only from then on).
    pub async fn close_session(&self, id: &str) -> Result<(), tonic::Status> {
        let req = proto::CloseSessionRequest {
            session_id: id.to_owned(),
        };
        self.sessions.clone().close_session(req).await?;
        Ok(())
    }

    /// One page of a session's payloads.
    pub async fn list(
        &self,
        session: &str,
        page_token: String,
    ) -> Result<proto::ListPayloadsResponse, tonic::Status> {
        let req = proto::ListPayloadsRequest {
            session_id: session.to_owned(),
            page_size: 200,
            page_token,
        };
        Ok(self.payloads.clone().list_payloads(req).await?.into_inner())
    }

    /// A payload's metadata.
    pub async fn stat(&self, id: &str) -> Result<proto::Payload, tonic::Status> {
        let req = proto::PayloadRequest {
            payload_id: id.to_owned(),
        };
        Ok(self.payloads.clone().stat(req).await?.into_inner())
    }

    /// A payload's structure.
    pub async fn inspect(&self, id: &str) -> Result<proto::Structure, tonic::Status> {
        let req = proto::PayloadRequest {
            payload_id: id.to_owned(),
        };
        Ok(self.payloads.clone().inspect(req).await?.into_inner())
    }

    /// Recalls an archived original.
    pub async fn recall(
        &self,
        session: &str,
        key: &str,
    ) -> Result<proto::RecallResponse, tonic::Status> {
        let req = proto::RecallRequest {
            session_id: session.to_owned(),
            key: key.to_owned(),
        };
        Ok(self.context.clone().recall(req).await?.into_inner())
    }

    /// Streams `data` into a payload, chunk by chunk, without copying it
    /// whole again.
    ///
    /// The body is streamed in [`UPLOAD_CHUNK`]s as it is read, on a blocking
    /// thread (pieces may be files). When a file cannot be read, the call is
    /// cancelled before its stream ends, so nothing cut short is stored.
    pub async fn upload(
        &self,
        header: proto::UploadHeader,
        body: Vec<Piece>,
    ) -> Result<proto::Payload, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        let feeder = tokio::task::spawn_blocking(move || {
            let first = proto::UploadChunk {
                chunk: Some(proto::upload_chunk::Chunk::Header(header)),
            };
            if tx.blocking_send(first).is_err() {
                return (Ok(()), tx);
            }
            let read = stream_pieces(body, UPLOAD_CHUNK, |b| {
                tx.blocking_send(proto::UploadChunk {
                    chunk: Some(proto::upload_chunk::Chunk::Data(b)),
                })
                .is_ok()
            });
            // The sender goes back with the outcome: the stream must not end
            // (which would complete the upload) before a failure cancels it.
            (read, tx)
        });
        let mut client = self.payloads.clone();
        let mut call = Box::pin(client.upload(ReceiverStream::new(rx)));
        tokio::select! {
            r = &mut call => r.map(tonic::Response::into_inner),
            fed = feeder => match fed {
                Ok((Ok(()), tx)) => {
                    drop(tx);
                    call.await.map(tonic::Response::into_inner)
                }
                Ok((Err(e), tx)) => {
                    drop(call);
                    drop(tx);
                    Err(tonic::Status::aborted(format!(
                        "the proxy could not read back the result it kept on its disk ({e}); nothing was stored"
                    )))
                }
                Err(e) => {
                    drop(call);
                    Err(tonic::Status::aborted(format!(
                        "the proxy's upload feeder failed ({e}); nothing was stored"
                    )))
                }
            },
        }
    }
}
