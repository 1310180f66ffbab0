//! `spillway.v1.CodeMode`: Exec and ListRuntimes.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{convert, parts, principal};
use crate::proto::{self, code_mode_server::CodeMode};
use crate::service::ExecRequest;

front!(
    /// The CodeMode service.
    CodeModeService
);

#[tonic::async_trait]
impl CodeMode for CodeModeService {
    #[instrument(skip_all, fields(session_id, runtime, status))]
    async fn exec(
        &self,
        req: Request<proto::ExecRequest>,
    ) -> Result<Response<proto::ExecResult>, Status> {
        let (p, r) = parts(req)?;
        let exec = ExecRequest {
            session_id: r.session_id,
            runtime: r.runtime,
            source: r.source,
            module: r.module,
            args: r.args,
            inputs: r.inputs,
            limits: convert::exec_limits_from(r.limits),
            keep_outputs: r.keep_outputs,
        };
        let reply = self.service.exec(&p, exec).await?;
        Ok(Response::new(convert::exec_result(reply)))
    }

    async fn list_runtimes(
        &self,
        req: Request<proto::ListRuntimesRequest>,
    ) -> Result<Response<proto::ListRuntimesResponse>, Status> {
        let p = principal(&req)?;
        let runtimes = self.service.list_runtimes(&p).await?;
        Ok(Response::new(proto::ListRuntimesResponse {
            runtimes: runtimes.into_iter().map(convert::runtime).collect(),
        }))
    }
}
