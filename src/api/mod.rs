//! The gRPC front door: the tonic services of `spillway.v1`. This is the
//! only code that sees prost types. Each RPC authenticates through
//! [`Authenticator`], converts its message to domain types
//! (`convert`), calls one [`Service`](crate::service::Service) operation,
//! and converts the reply; errors become statuses in [`crate::error`].
//! Access, policy, redaction and auditing all happen in the service layer.

/// Declares a tonic service struct over the service layer.
macro_rules! front {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            service: crate::service::Service,
        }

        impl $name {
            /// Serves `service`.
            pub fn new(service: crate::service::Service) -> Self {
                Self { service }
            }
        }
    };
}

/// Implements a tonic service trait whose every RPC has one shape: take
/// the caller and the message apart ([`parts`]), run the body, send what
/// it evaluates to. Written `fn rpc(&self, p, r: Request) -> Reply { … }`
/// (`_` for an unused message); `?` in the body turns a service error
/// into its status. Stream types come first, as `type … = …;`.
macro_rules! rpcs {
    (
        impl $trait:ident for $svc:ident {
            $(type $stream:ident = $stream_ty:ty;)*
            $(
                $(#[$attr:meta])*
                fn $name:ident(&$self:ident, $p:ident, $r:tt: $req:ty) -> $reply:ty $body:block
            )*
        }
    ) => {
        #[tonic::async_trait]
        impl $trait for $svc {
            $(type $stream = $stream_ty;)*
            $(
                $(#[$attr])*
                async fn $name(
                    &$self,
                    req: tonic::Request<$req>,
                ) -> Result<tonic::Response<$reply>, tonic::Status> {
                    let ($p, $r) = $crate::api::parts(req)?;
                    Ok(tonic::Response::new($body))
                }
            )*
        }
    };
}

mod audit;
mod codemode;
mod context;
mod convert;
mod payloads;
mod policies;
mod sessions;

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Status};

use crate::auth::{AuthError, Principal, TokenTable};
use crate::error::{ApiError, ApiResult};

pub use audit::{AuditService, event_to_proto};
pub use codemode::CodeModeService;
pub use context::{ContextService, messages_from_proto, messages_to_proto};
pub use convert::receipt as receipt_to_proto;
pub use payloads::PayloadsService;
pub use policies::PoliciesService;
pub use sessions::SessionsService;

/// A server stream of `P` messages.
pub type Relay<P> = Pin<Box<dyn Stream<Item = Result<P, Status>> + Send>>;

/// A service-layer stream as a server stream: each item converted by `f`,
/// each error mapped to its status.
fn relay<T, P>(
    rx: tokio::sync::mpsc::Receiver<ApiResult<T>>,
    f: impl Fn(T) -> P + Send + 'static,
) -> Relay<P>
where
    T: Send + 'static,
    P: Send + 'static,
{
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Box::pin(stream.map(move |item| item.map(&f).map_err(Status::from)))
}

/// The authenticated principal the interceptor attached to the request.
pub fn principal<T>(req: &Request<T>) -> ApiResult<Principal> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or(ApiError::Auth(AuthError::MissingToken))
}

/// The caller and the message of a request.
pub fn parts<T>(req: Request<T>) -> ApiResult<(Principal, T)> {
    let p = principal(&req)?;
    Ok((p, req.into_inner()))
}

/// The interceptor that authenticates every call of the services it wraps.
#[derive(Debug, Clone)]
pub struct Authenticator {
    tokens: Arc<TokenTable>,
}

impl Authenticator {
    /// Wraps a token table.
    pub fn new(tokens: Arc<TokenTable>) -> Self {
        Self { tokens }
    }
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        // Two headers could be read differently by a proxy in front and by
        // us: refuse rather than pick one.
        if req
            .metadata()
            .get_all("authorization")
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(Status::unauthenticated(
                "the request carries more than one authorization header; send exactly one: authorization: Bearer <token>",
            ));
        }
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let principal = self
            .tokens
            .authenticate(header)
            .map_err(|e| Status::from(ApiError::from(e)))?;
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}
