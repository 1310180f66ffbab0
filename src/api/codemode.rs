//! `spillway.v1.CodeMode`: Exec and ListRuntimes.

use tracing::instrument;

use super::convert;
use crate::proto::{self, code_mode_server::CodeMode};
use crate::service::ExecRequest;

front!(
    /// The CodeMode service.
    CodeModeService
);

rpcs! {
    impl CodeMode for CodeModeService {
        #[instrument(skip_all, fields(session_id, runtime, status))]
        fn exec(&self, p, r: proto::ExecRequest) -> proto::ExecResult {
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
            convert::exec_result(self.service.exec(&p, exec).await?)
        }

        fn list_runtimes(&self, p, _: proto::ListRuntimesRequest) -> proto::ListRuntimesResponse {
            let runtimes = self.service.list_runtimes(&p).await?;
            proto::ListRuntimesResponse {
                runtimes: runtimes.into_iter().map(convert::runtime).collect(),
            }
        }
    }
}
