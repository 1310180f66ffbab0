//! `spillway.v1.Payloads`: each RPC converts its message, calls one
//! [`Service`] operation and converts the reply.

use tokio_stream::StreamExt as _;
use tonic::Streaming;
use tracing::instrument;

use super::convert;
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

rpcs! {
    impl Payloads for PayloadsService {
        type DownloadStream = super::Relay<proto::DataChunk>;

        #[instrument(name = "payloads.offload", skip_all, fields(session_id), err(level = "info"))]
        fn offload(&self, p, r: proto::OffloadRequest) -> proto::OffloadResponse {
            let overrides = r.settings.map_or_else(Overrides::default, |s| Overrides {
                per_call_tokens: s.per_call_tokens,
                aggregate_tokens: s.aggregate_tokens,
                estimator: s.estimator,
                preview_style: s.preview_style,
                preview_chars: s.preview_chars,
                dialect: s.dialect.map(convert::notice_dialect),
            });
            let turn = crate::service::OffloadTurn {
                session_id: r.session_id,
                results: r.results.into_iter().map(tool_result).collect(),
                overrides,
            };
            let reply = self.service.offload(&p, turn).await?;
            proto::OffloadResponse {
                outcomes: reply.outcomes.into_iter().map(convert::outcome).collect(),
                inline_tokens: reply.inline_tokens,
                offloaded_tokens: reply.offloaded_tokens,
            }
        }

        #[instrument(
            name = "payloads.upload",
            skip_all,
            fields(session_id, payload_id),
            err(level = "info")
        )]
        fn upload(&self, p, r: Streaming<proto::UploadChunk>) -> proto::Payload {
            let limits = self.service.config().limits.clone();
            let parts = r.map(move |m| match m {
                Ok(proto::UploadChunk { chunk }) => Ok(match chunk {
                    Some(Chunk::Header(h)) => header_meta(h),
                    Some(Chunk::Data(d)) => UploadPart::Data(d),
                    None => UploadPart::Empty,
                }),
                Err(s) => Err(stream_error(s, &limits)),
            });
            convert::payload(&self.service.upload(&p, parts).await?)
        }

        #[instrument(name = "payloads.inspect", skip_all, err(level = "info"))]
        fn inspect(&self, p, r: proto::PayloadRequest) -> proto::Structure {
            let (payload, structure) = self.service.inspect(&p, &r.payload_id).await?;
            convert::structure(payload.id.as_str(), &structure)
        }

        #[instrument(name = "payloads.search", skip_all, fields(session_id), err(level = "info"))]
        fn search(&self, p, r: proto::SearchRequest) -> proto::SearchResponse {
            let query = SearchRequest {
                session_id: r.session_id,
                pattern: r.pattern,
                fixed_string: r.fixed_string,
                case_insensitive: r.case_insensitive,
                context_lines: r.context_lines,
                max_matches: r.max_matches,
                payload_ids: r.payload_ids,
            };
            convert::search(self.service.search(&p, query).await?)
        }

        #[instrument(name = "payloads.stat", skip_all, err(level = "info"))]
        fn stat(&self, p, r: proto::PayloadRequest) -> proto::Payload {
            convert::payload(&self.service.stat(&p, &r.payload_id).await?)
        }

        #[instrument(name = "payloads.list", skip_all, err(level = "info"))]
        fn list_payloads(&self, p, r: proto::ListPayloadsRequest) -> proto::ListPayloadsResponse {
            let page = self
                .service
                .list_payloads(&p, &r.session_id, &r.page_token, r.page_size)
                .await?;
            proto::ListPayloadsResponse {
                payloads: page.items.iter().map(convert::payload).collect(),
                next_page_token: page.next_token,
            }
        }

        #[instrument(name = "payloads.read", skip_all, err(level = "info"))]
        fn read(&self, p, r: proto::ReadRequest) -> proto::ReadResponse {
            let read = ReadRequest {
                payload_id: r.payload_id,
                spec: read_spec(r.range),
                max_bytes: r.max_bytes,
            };
            let reply = self.service.read(&p, read).await?;
            let out = reply.out;
            proto::ReadResponse {
                data: out.data,
                start_offset: out.start_offset,
                end_offset: out.end_offset,
                first_line: out.first_line,
                last_line: out.last_line,
                total_bytes: reply.total_bytes,
                total_lines: reply.total_lines,
                eof: out.eof,
            }
        }

        #[instrument(name = "payloads.download", skip_all, err(level = "info"))]
        fn download(&self, p, r: proto::PayloadRequest) -> Self::DownloadStream {
            let chunks = self.service.download(&p, &r.payload_id).await?;
            super::relay(chunks, |data| proto::DataChunk { data })
        }

        #[instrument(name = "payloads.delete", skip_all, err(level = "info"))]
        fn delete_payload(&self, p, r: proto::DeletePayloadRequest) -> proto::DeletionReceipt {
            let receipt = self.service.delete_payload(&p, &r.payload_id, &r.reason).await?;
            convert::receipt(&receipt)
        }
    }
}
