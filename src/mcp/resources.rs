//! Payloads as MCP resources: `spillway://payloads/{id}`, listed per session
//! and read in bounded pieces.

use base64::Engine as _;
use rmcp::ErrorData;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};

use super::backend::Backend;
use super::tools::payload_uri;
use crate::proto;

/// The URI prefix of payload resources.
pub const PREFIX: &str = "spillway://payloads/";

/// Most bytes one `resources/read` returns; the rest is for `spillway_read`.
pub const READ_LIMIT: u64 = 1 << 20;

/// A payload as a resource.
pub fn resource(p: &proto::Payload) -> Resource {
    let mime = if p.content_type.is_empty() {
        "application/octet-stream".to_owned()
    } else {
        p.content_type.clone()
    };
    Resource::new(payload_uri(&p.id), p.name.clone())
        .with_title(format!("Spillway payload {}", p.name))
        .with_description(format!(
            "{} bytes, {} lines, about {} tokens{}; saved by Spillway. Read at most 1 MiB here; use spillway_read, spillway_search or spillway_exec with payload_id {} for the rest.",
            p.size_bytes,
            p.line_count,
            p.estimated_tokens,
            if p.tool_name.is_empty() { String::new() } else { format!(", from {}", p.tool_name) },
            p.id
        ))
        .with_mime_type(mime)
        .with_size(p.size_bytes)
}

/// The session's payloads (at most 2000).
pub async fn list(backend: &Backend, session: &str) -> Result<Vec<Resource>, ErrorData> {
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = backend
            .list(session, token)
            .await
            .map_err(|s| status_error("resources/list", &s))?;
        out.extend(page.payloads.iter().map(resource));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    Ok(out)
}

/// `resources/list` for `mcp serve`.
pub async fn list_result(
    backend: &Backend,
    session: &str,
) -> Result<ListResourcesResult, ErrorData> {
    Ok(ListResourcesResult::with_all_items(
        list(backend, session).await?,
    ))
}

/// The payload URI template.
pub fn template() -> ResourceTemplate {
    ResourceTemplate::new(format!("{PREFIX}{{id}}"), "spillway-payload")
        .with_title("A Spillway payload")
        .with_description("A saved tool result, by its payload_id (pl_...). Reads return at most 1 MiB; use spillway_read for ranges.")
}

/// `resources/templates/list` for `mcp serve`.
pub fn templates_result() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![template()])
}

fn status_error(what: &str, s: &tonic::Status) -> ErrorData {
    let msg = format!("{what} was refused ({:?}): {}", s.code(), s.message());
    match s.code() {
        tonic::Code::NotFound => ErrorData::resource_not_found(msg, None),
        tonic::Code::InvalidArgument => ErrorData::invalid_params(msg, None),
        _ => ErrorData::internal_error(msg, None),
    }
}

fn texty(content_type: &str) -> bool {
    let c = content_type.to_ascii_lowercase();
    c.starts_with("text/")
        || c.contains("json")
        || c.contains("xml")
        || c.contains("csv")
        || c.contains("yaml")
        || c.contains("javascript")
}

/// Reads a payload resource, at most [`READ_LIMIT`] bytes. A longer payload
/// gets a second text item saying where the read stopped and how to go on.
pub async fn read(backend: &Backend, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let Some(id) = uri.strip_prefix(PREFIX) else {
        return Err(ErrorData::resource_not_found(
            format!("{uri} is not a Spillway payload URI ({PREFIX}pl_...)"),
            None,
        ));
    };
    let meta = backend
        .stat(id)
        .await
        .map_err(|s| status_error("resources/read", &s))?;
    let r = backend
        .read(proto::ReadRequest {
            payload_id: id.to_owned(),
            max_bytes: READ_LIMIT,
            range: Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                offset: 0,
                length: READ_LIMIT,
            })),
        })
        .await
        .map_err(|s| status_error("resources/read", &s))?;
    let mime = (!meta.content_type.is_empty()).then(|| meta.content_type.clone());
    let mut contents = Vec::new();
    let text = if texty(&meta.content_type) || meta.content_type.is_empty() {
        std::str::from_utf8(&r.data).ok().map(str::to_owned)
    } else {
        None
    };
    match text {
        Some(text) => contents.push(ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: mime,
            text,
            meta: None,
        }),
        None => contents.push(ResourceContents::BlobResourceContents {
            uri: uri.to_owned(),
            mime_type: mime.or(Some("application/octet-stream".into())),
            blob: base64::engine::general_purpose::STANDARD.encode(&r.data),
            meta: None,
        }),
    }
    if !r.eof {
        contents.push(ResourceContents::text(
            format!(
                "[Spillway: this read stopped at byte {} of {} (the resources/read limit is 1 MiB). Read the rest with spillway_read {{\"payload_id\": \"{id}\", \"offset\": {}}}, or query it with spillway_search or spillway_exec.]",
                r.end_offset, r.total_bytes, r.end_offset
            ),
            format!("{uri}#continuation"),
        ));
    }
    Ok(ReadResourceResult::new(contents))
}
