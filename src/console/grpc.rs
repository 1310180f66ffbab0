//! The console's way into the server: the server's own gRPC API, over one
//! loopback channel, with the signed-in user's bearer token on every call.
//! Access decisions and audit therefore happen exactly as for any other
//! gRPC client.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::proto::{
    audit_client::AuditClient, payloads_client::PayloadsClient, policies_client::PoliciesClient,
    sessions_client::SessionsClient,
};

/// Longest wait for one gRPC call of a page.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Adds one user's bearer token to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Bearer>;

/// The channel to the server; cheap to clone.
#[derive(Debug, Clone)]
pub struct Grpc {
    channel: Channel,
    max_message: usize,
}

/// The clients for one user's calls.
pub struct Calls {
    /// Sessions.
    pub sessions: SessionsClient<Svc>,
    /// Payloads.
    pub payloads: PayloadsClient<Svc>,
    /// Policies.
    pub policies: PoliciesClient<Svc>,
    /// Audit.
    pub audit: AuditClient<Svc>,
}

impl Grpc {
    /// A lazily connected channel to `endpoint` (`http://127.0.0.1:port`,
    /// or `https://` with a client TLS config).
    pub fn new(
        endpoint: &str,
        tls: Option<tonic::transport::ClientTlsConfig>,
        max_message: usize,
    ) -> Result<Self, tonic::transport::Error> {
        let mut e = Endpoint::from_shared(endpoint.to_owned())?
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            e = e.tls_config(tls)?;
        }
        Ok(Self {
            channel: e.connect_lazy(),
            max_message,
        })
    }

    /// Clients that send `token`; `None` when the token cannot go in a
    /// header (it then cannot be a valid token either).
    pub fn with_token(&self, token: &str) -> Option<Calls> {
        let value: MetadataValue<Ascii> = format!("Bearer {token}").parse().ok()?;
        let svc = || InterceptedService::new(self.channel.clone(), Bearer(value.clone()));
        let m = self.max_message;
        Some(Calls {
            sessions: SessionsClient::new(svc()).max_decoding_message_size(m),
            payloads: PayloadsClient::new(svc()).max_decoding_message_size(m),
            policies: PoliciesClient::new(svc()).max_decoding_message_size(m),
            audit: AuditClient::new(svc()).max_decoding_message_size(m),
        })
    }
}
