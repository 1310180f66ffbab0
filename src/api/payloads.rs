//! `spillway.v1.Payloads`: each RPC converts its message, calls one
//! [`Service`] operation and converts the reply.

use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use super::{convert, parts, principal};
use crate::error::stream_error;
use crate::offload::{Overrides, ToolResult};
use crate::proto::{self, payloads_server::Payloads, upload_chunk::Chunk};
use crate::service::{ReadRequest, SearchRequest, UploadPart};
use crate::store::ReadSpec;
use crate::store::UploadMeta;

front!(
    /// The Payloads service.
    PayloadsService
);

/// A header's metadata; the service checks it.
fn header_meta(h: proto::UploadHeader) -> UploadPart {
    UploadPart::Header {
        session_id: h.session_id,
        meta: Box::new(UploadMeta {
            name: h.name,
            content_type: h.content_type,
            tool_name: h.tool_name,
            tool_call_id: h.tool_call_id,
            is_error: h.is_error,
            expected_sha256: (!h.expected_sha256.is_empty()).then_some(h.expected_sha256),
            ..Default::default()
        }),
    }
}

fn tool_result(t: proto::ToolResult) -> ToolResult {
    ToolResult {
        tool_call_id: t.tool_call_id,
        tool_name: t.tool_name,
        content: t.content,
        content_type: t.content_type,
        is_error: t.is_error,
        derived_from: Vec::new(),
        redactions: Default::default(),
    }
}

fn read_spec(range: Option<proto::read_request::Range>) -> Option<ReadSpec> {
    use proto::read_request::Range;
    range.map(|r| match r {
        Range::ByteRange(b) => ReadSpec::Bytes {
            offset: b.offset,
            length: b.length,
        },
        Range::LineRange(l) => ReadSpec::Lines {
            start: l.start_line,
            end: l.end_line,
        },
    })
}

#[tonic::async_trait]
impl Payloads for PayloadsService {
    #[instrument(
        name = "payloads.offload",
        skip_all,
        fields(session_id),
        err(level = "info")
    )]
    async fn offload(
        &self,
        req: Request<proto::OffloadRequest>,
    ) -> Result<Response<proto::OffloadResponse>, Status> {
        let (p, r) = parts(req)?;
        let overrides = r.settings.map_or_else(Overrides::default, |s| Overrides {
            per_call_tokens: s.per_call_tokens,
            aggregate_tokens: s.aggregate_tokens,
            estimator: s.estimator,
            preview_style: s.preview_style,
            preview_chars: s.preview_chars,
        });
        let turn = crate::service::OffloadTurn {
            session_id: r.session_id,
            results: r.results.into_iter().map(tool_result).collect(),
            overrides,
        };
        let reply = self.service.offload(&p, turn).await?;
        Ok(Response::new(proto::OffloadResponse {
            outcomes: reply.outcomes.into_iter().map(convert::outcome).collect(),
            inline_tokens: reply.inline_tokens,
            offloaded_tokens: reply.offloaded_tokens,
        }))
    }

    #[instrument(
        name = "payloads.upload",
        skip_all,
        fields(session_id, payload_id),
        err(level = "info")
    )]
    async fn upload(
        &self,
        req: Request<Streaming<proto::UploadChunk>>,
    ) -> Result<Response<proto::Payload>, Status> {
        let p = principal(&req)?;
        let limits = self.service.config().limits.clone();
        let parts = req.into_inner().map(move |m| match m {
            Ok(proto::UploadChunk { chunk }) => Ok(match chunk {
                Some(Chunk::Header(h)) => header_meta(h),
                Some(Chunk::Data(d)) => UploadPart::Data(d),
                None => UploadPart::Empty,
            }),
            Err(s) => Err(stream_error(s, &limits)),
        });
        let record = self.service.upload(&p, parts).await?;
        Ok(Response::new(convert::payload(&record)))
    }

    #[instrument(name = "payloads.inspect", skip_all, err(level = "info"))]
    async fn inspect(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<proto::Structure>, Status> {
        let p = principal(&req)?;
        let id = &req.get_ref().payload_id;
        let (payload, structure) = self.service.inspect(&p, id).await?;
        Ok(Response::new(convert::structure(
            payload.id.as_str(),
            &structure,
        )))
    }

    #[instrument(
        name = "payloads.search",
        skip_all,
        fields(session_id),
        err(level = "info")
    )]
    async fn search(
        &self,
        req: Request<proto::SearchRequest>,
    ) -> Result<Response<proto::SearchResponse>, Status> {
        let (p, r) = parts(req)?;
        let query = SearchRequest {
            session_id: r.session_id,
            pattern: r.pattern,
            fixed_string: r.fixed_string,
            case_insensitive: r.case_insensitive,
            context_lines: r.context_lines,
            max_matches: r.max_matches,
            payload_ids: r.payload_ids,
        };
        let reply = self.service.search(&p, query).await?;
        Ok(Response::new(convert::search(reply)))
    }

    #[instrument(name = "payloads.stat", skip_all, err(level = "info"))]
    async fn stat(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<proto::Payload>, Status> {
        let p = principal(&req)?;
        let payload = self.service.stat(&p, &req.get_ref().payload_id).await?;
        Ok(Response::new(convert::payload(&payload)))
    }

    #[instrument(name = "payloads.list", skip_all, err(level = "info"))]
    async fn list_payloads(
        &self,
        req: Request<proto::ListPayloadsRequest>,
    ) -> Result<Response<proto::ListPayloadsResponse>, Status> {
        let (p, r) = parts(req)?;
        let page = self
            .service
            .list_payloads(&p, &r.session_id, &r.page_token, r.page_size)
            .await?;
        Ok(Response::new(proto::ListPayloadsResponse {
            payloads: page.items.iter().map(convert::payload).collect(),
            next_page_token: page.next_token,
        }))
    }

    #[instrument(name = "payloads.read", skip_all, err(level = "info"))]
    async fn read(
        &self,
        req: Request<proto::ReadRequest>,
    ) -> Result<Response<proto::ReadResponse>, Status> {
        let (p, r) = parts(req)?;
        let read = ReadRequest {
            payload_id: r.payload_id,
            spec: read_spec(r.range),
            max_bytes: r.max_bytes,
        };
        let reply = self.service.read(&p, read).await?;
        let out = reply.out;
        Ok(Response::new(proto::ReadResponse {
            data: out.data,
            start_offset: out.start_offset,
            end_offset: out.end_offset,
            first_line: out.first_line,
            last_line: out.last_line,
            total_bytes: reply.total_bytes,
            total_lines: reply.total_lines,
            eof: out.eof,
        }))
    }

    type DownloadStream = super::Relay<proto::DataChunk>;

    #[instrument(name = "payloads.download", skip_all, err(level = "info"))]
    async fn download(
        &self,
        req: Request<proto::PayloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let p = principal(&req)?;
        let chunks = self.service.download(&p, &req.get_ref().payload_id).await?;
        Ok(Response::new(super::relay(chunks, |data| {
            proto::DataChunk { data }
        })))
    }

    #[instrument(name = "payloads.delete", skip_all, err(level = "info"))]
    async fn delete_payload(
        &self,
        req: Request<proto::DeletePayloadRequest>,
    ) -> Result<Response<proto::DeletionReceipt>, Status> {
        let (p, r) = parts(req)?;
        let receipt = self
            .service
            .delete_payload(&p, &r.payload_id, &r.reason)
            .await?;
        Ok(Response::new(convert::receipt(&receipt)))
    }
}
