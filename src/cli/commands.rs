//! The client subcommands.

use std::io::{IsTerminal, Read, Write};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::output;
use super::{AuditCommand, Cli, Command, ContextCommand, HistoryFormat, SessionCommand};
use crate::client::{Bearer, ClientSettings, connect};
use crate::proto::{
    self, audit_client::AuditClient, code_mode_client::CodeModeClient,
    context_client::ContextClient, payloads_client::PayloadsClient,
    policies_client::PoliciesClient, sessions_client::SessionsClient,
};

/// Bytes per upload chunk: well under the server's 4 MiB message limit.
const UPLOAD_CHUNK: usize = 1 << 20;

type Svc = InterceptedService<Channel, Bearer>;

/// One unary call, `rpc!(c.payloads.stat(request))`: its reply message,
/// or its status as the error.
macro_rules! rpc {
    ($($call:tt)+) => {
        $($call)+.await?.into_inner()
    };
}

struct Clients {
    sessions: SessionsClient<Svc>,
    payloads: PayloadsClient<Svc>,
    context: ContextClient<Svc>,
    codemode: CodeModeClient<Svc>,
    audit: AuditClient<Svc>,
    policies: PoliciesClient<Svc>,
}

impl Clients {
    /// Connects to the server `settings` name, with every call naming
    /// `session` (when the command has one) for a balancer's hash.
    async fn connect(settings: &ClientSettings, session: Option<&str>) -> anyhow::Result<Self> {
        let (channel, bearer) = connect(settings).await?;
        // Every call names the command's session, for a balancer's hash.
        let bearer = bearer.for_session(session.unwrap_or_default())?;
        Ok(Clients {
            sessions: SessionsClient::with_interceptor(channel.clone(), bearer.clone()),
            policies: PoliciesClient::with_interceptor(channel.clone(), bearer.clone()),
            context: ContextClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
            codemode: CodeModeClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
            audit: AuditClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(64 << 20),
            payloads: PayloadsClient::with_interceptor(channel, bearer)
                .max_decoding_message_size(64 << 20),
        })
    }
}

/// A call that failed below gRPC over a plaintext connection: say that the
/// server may want TLS.
fn plaintext_hint(e: anyhow::Error, settings: &ClientSettings) -> anyhow::Error {
    let transport = e
        .downcast_ref::<tonic::Status>()
        .is_some_and(|s| std::error::Error::source(s).is_some());
    if !transport || settings.tls.ca.is_some() {
        return e;
    }
    let s = e.downcast_ref::<tonic::Status>().expect("checked above");
    anyhow::anyhow!(
        "{:?}: {}; the connection to {} failed below gRPC: if the server serves TLS, pass --ca (and --cert/--key when it requires client certificates)",
        s.code(),
        s.message(),
        settings.endpoint
    )
}

/// Runs a client subcommand against the server.
pub async fn run_client(cli: Cli) -> anyhow::Result<()> {
    let data_dir = std::env::var_os("SPILLWAY_DATA_DIR").map(std::path::PathBuf::from);
    // Local commands need no server.
    if let Command::Audit(AuditCommand::VerifyReceipt {
        file,
        data_dir: dir,
    }) = &cli.command
    {
        let dir = dir
            .clone()
            .or(data_dir)
            .unwrap_or_else(|| std::path::PathBuf::from("./spillway-data"));
        return verify_receipt(file, &dir);
    }
    let tls = super::TlsFiles {
        ca: cli.tls_ca.clone(),
        cert: cli.tls_cert.clone(),
        key: cli.tls_key.clone(),
    };
    let settings = ClientSettings::resolve(
        cli.addr.as_deref(),
        cli.token.as_deref(),
        data_dir.as_deref(),
        tls,
    )?;
    let mut c = Clients::connect(&settings, cli.command.session()).await?;
    let result = dispatch(&mut c, cli.command, cli.json).await;
    result.map_err(|e| plaintext_hint(e, &settings))
}

/// `spillway download`: the payload's bytes to `out` or stdout, checked
/// against its size.
async fn download(
    c: &mut Clients,
    payload: String,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let stat = rpc!(c.payloads.stat(proto::PayloadRequest {
        payload_id: payload.clone(),
    }));
    let mut stream = rpc!(c.payloads.download(proto::PayloadRequest {
        payload_id: payload,
    }));
    let mut sink = sink(out)?;
    let bar = progress(stat.size_bytes);
    let mut got = 0u64;
    while let Some(chunk) = stream.message().await? {
        sink.write_all(&chunk.data)?;
        got += chunk.data.len() as u64;
        bar.set_position(got);
    }
    sink.flush()?;
    bar.finish_and_clear();
    if got != stat.size_bytes {
        bail!("download ended after {got} of {} bytes", stat.size_bytes);
    }
    if let Some(path) = out {
        eprintln!("wrote {got} bytes to {}", path.display());
    }
    Ok(())
}

/// `spillway offload`'s tool results: one per file, named by its stem and
/// typed by its extension.
fn tool_results(files: &[std::path::PathBuf]) -> anyhow::Result<Vec<proto::ToolResult>> {
    files
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let content =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            Ok(proto::ToolResult {
                tool_call_id: format!("call_{}", i + 1),
                tool_name: path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                content: content.into(),
                content_type: content_type_for(ext).to_owned(),
                is_error: false,
            })
        })
        .collect()
}

/// `spillway exec`'s script: `--source` text, or `--file` as text (or as a
/// binary module for the wasm runtime).
fn script(
    runtime: &str,
    source: Option<String>,
    file: Option<std::path::PathBuf>,
) -> anyhow::Result<(String, Vec<u8>)> {
    match (source, file) {
        (Some(s), _) => Ok((s, Vec::new())),
        (None, Some(f)) => {
            let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
            if runtime == "wasm" && bytes.starts_with(b"\0asm") {
                Ok((String::new(), bytes))
            } else {
                let text = String::from_utf8(bytes)
                    .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", f.display()))?;
                Ok((text, Vec::new()))
            }
        }
        (None, None) => bail!("give the script with --source or --file"),
    }
}

/// `spillway read`'s range: `--lines A-B`, `--bytes OFFSET-LENGTH`, or the
/// payload's start.
fn read_range(
    lines: Option<String>,
    bytes: Option<String>,
) -> anyhow::Result<Option<proto::read_request::Range>> {
    Ok(match (lines, bytes) {
        (Some(l), _) => {
            let (a, b) = split_range(&l, "--lines")?;
            Some(proto::read_request::Range::LineRange(proto::LineRange {
                start_line: a,
                end_line: b,
            }))
        }
        (None, Some(b)) => {
            let (offset, length) = split_range(&b, "--bytes")?;
            Some(proto::read_request::Range::ByteRange(proto::ByteRange {
                offset,
                length,
            }))
        }
        (None, None) => None,
    })
}

/// A Read's bytes on stdout, and where they sit in the payload on stderr.
fn print_read(r: &proto::ReadResponse) -> anyhow::Result<()> {
    std::io::stdout().write_all(&r.data)?;
    if !r.data.ends_with(b"\n") && !r.data.is_empty() {
        println!();
    }
    let end = if r.eof { ", end of payload" } else { "" };
    eprintln!("-- {}{end}", r.span());
    Ok(())
}

/// Runs one client command over `c`.
async fn dispatch(c: &mut Clients, command: Command, json: bool) -> anyhow::Result<()> {
    match command {
        Command::Serve(_) | Command::Mcp(_) => unreachable!("serve and mcp are handled by main"),
        Command::Audit(cmd) => audit(c, cmd, json).await,
        Command::Session(cmd) => session(c, cmd, json).await,
        Command::Policy(super::PolicyCommand::Get { tenant, session }) => {
            let p = rpc!(
                c.policies
                    .get_policy(super::policy::get_request(tenant, session))
            );
            output::show(json, &p, super::policy::show)
        }
        Command::Policy(super::PolicyCommand::Set(args)) => {
            let p = rpc!(c.policies.set_policy(super::policy::set_request(args)?));
            output::show(json, &p, super::policy::show)
        }
        Command::Hold(args) => {
            let s = rpc!(c.policies.set_legal_hold(super::policy::hold_request(args)));
            output::show(json, &s, output::session)
        }
        Command::Context(cmd) => context(c, cmd, json).await,
        Command::Upload {
            session,
            file,
            name,
            content_type,
            tool_name,
            tool_call_id,
            sha256,
        } => {
            let name = name.unwrap_or_else(|| {
                file.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
            let header = proto::UploadHeader {
                session_id: session,
                name,
                content_type: content_type.unwrap_or_default(),
                tool_name,
                tool_call_id,
                expected_sha256: sha256.unwrap_or_default(),
                is_error: false,
            };
            let p = upload(c, header, &file).await?;
            output::show(json, &p, output::payload)
        }
        Command::Offload {
            session,
            files,
            turn,
            per_call_tokens,
            aggregate_tokens,
            estimator,
            preview_style,
        } => {
            let results = tool_results(&files)?;
            let settings = proto::OffloadSettings {
                per_call_tokens,
                aggregate_tokens,
                estimator,
                preview_style,
                preview_chars: None,
                dialect: None,
            };
            let reply = rpc!(c.payloads.offload(proto::OffloadRequest {
                session_id: session,
                turn,
                results,
                settings: Some(settings),
            }));
            output::show(json, &reply, output::offload)
        }
        Command::Inspect { payload, .. } => {
            let s = rpc!(c.payloads.inspect(proto::PayloadRequest {
                payload_id: payload,
            }));
            output::show(json, &s, output::structure)
        }
        Command::Grep {
            session,
            pattern,
            payloads,
            fixed_strings,
            ignore_case,
            context,
            max_matches,
        } => {
            let r = rpc!(c.payloads.search(proto::SearchRequest {
                session_id: session,
                payload_ids: payloads,
                pattern,
                fixed_string: fixed_strings,
                case_insensitive: ignore_case,
                context_lines: context,
                max_matches,
            }));
            output::show(json, &r, output::search)
        }
        Command::Exec {
            session,
            runtime,
            source,
            file,
            inputs,
            timeout_ms,
            memory_bytes,
            keep_outputs,
            args,
        } => {
            let (source, module) = script(&runtime, source, file)?;
            let r = rpc!(c.codemode.exec(proto::ExecRequest {
                session_id: session,
                runtime,
                source,
                module: module.into(),
                inputs,
                args,
                limits: Some(proto::ExecLimits {
                    timeout_ms,
                    memory_bytes,
                    max_stdout_bytes: 0,
                    fuel: 0,
                }),
                keep_outputs,
            }));
            output::show(json, &r, output::exec)?;
            if r.status != proto::ExecStatus::Ok as i32 {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Runtimes => {
            let r = rpc!(c.codemode.list_runtimes(proto::ListRuntimesRequest {}));
            output::show(json, &r, output::runtimes)
        }
        Command::Stat { payload, .. } => {
            let p = rpc!(c.payloads.stat(proto::PayloadRequest {
                payload_id: payload,
            }));
            output::show(json, &p, output::payload)
        }
        Command::Ls { session } => {
            let list = async |page_token| {
                Ok(rpc!(c.payloads.list_payloads(proto::ListPayloadsRequest {
                    session_id: session.clone(),
                    page_size: 1000,
                    page_token,
                })))
            };
            every_page(json, list, |p| &p.next_page_token, output::payload_page).await
        }
        Command::Read {
            payload,
            lines,
            bytes,
            max_bytes,
            ..
        } => {
            let r = rpc!(c.payloads.read(proto::ReadRequest {
                payload_id: payload,
                max_bytes,
                range: read_range(lines, bytes)?,
            }));
            if json {
                return output::json(&r);
            }
            print_read(&r)
        }
        Command::Download {
            payload,
            output: out,
            ..
        } => download(c, payload, out.as_deref()).await,
        Command::Rm {
            payload, reason, ..
        } => {
            let r = rpc!(c.payloads.delete_payload(proto::DeletePayloadRequest {
                payload_id: payload,
                reason,
            }));
            output::show(json, &r, output::receipt)
        }
    }
}

async fn context(c: &mut Clients, cmd: ContextCommand, json: bool) -> anyhow::Result<()> {
    use crate::context::MAX_HISTORY_JSON_BYTES;
    // The server converts: the file goes as it is, with its format.
    let fmt = |f: HistoryFormat| match f {
        HistoryFormat::Openai => proto::HistoryFormat::OpenaiChat,
        HistoryFormat::OpenaiResponses => proto::HistoryFormat::OpenaiResponses,
        HistoryFormat::Anthropic => proto::HistoryFormat::Anthropic,
    } as i32;
    let load = |file: &std::path::Path| -> anyhow::Result<String> {
        let size = std::fs::metadata(file)
            .with_context(|| format!("cannot read {}", file.display()))?
            .len();
        if size > MAX_HISTORY_JSON_BYTES as u64 {
            bail!(
                "{} is {size} bytes; the server takes histories of at most {MAX_HISTORY_JSON_BYTES} bytes: compact the older part first",
                file.display()
            );
        }
        std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {} as UTF-8 text", file.display()))
    };
    // Pretty, as the file would be written. Written as one string, so a
    // closed pipe is the io::Error that main ends quietly on (serde_json's
    // writer would wrap it and hide it).
    let save = |history_json: &str| -> anyhow::Result<()> {
        let value: serde_json::Value = serde_json::from_str(history_json)
            .context("the server returned a history that is not JSON")?;
        let mut text = serde_json::to_string_pretty(&value)?;
        text.push('\n');
        std::io::stdout().lock().write_all(text.as_bytes())?;
        Ok(())
    };
    match cmd {
        ContextCommand::Repair { format, file } => {
            let reply = rpc!(c.context.repair_history(proto::RepairHistoryRequest {
                messages: Vec::new(),
                format: fmt(format),
                history_json: load(&file)?,
            }));
            eprintln!(
                "{}",
                serde_json::to_string(&reply.report.unwrap_or_default())?
            );
            save(&reply.history_json)
        }
        ContextCommand::Compact {
            format,
            session,
            current_turn,
            file,
        } => {
            let reply = rpc!(c.context.compact_history(proto::CompactHistoryRequest {
                session_id: session,
                messages: Vec::new(),
                current_turn,
                settings: None,
                format: fmt(format),
                history_json: load(&file)?,
            }));
            eprintln!(
                "{}",
                serde_json::to_string(
                    &serde_json::json!({ "compact": reply.report.unwrap_or_default(), "repair": reply.repair.unwrap_or_default() })
                )?
            );
            save(&reply.history_json)
        }
        ContextCommand::Recall { session, key } => {
            let r = rpc!(c.context.recall(proto::RecallRequest {
                session_id: session,
                key,
            }));
            if json {
                return output::json(&r);
            }
            std::io::stdout().write_all(r.content.as_bytes())?;
            eprintln!("-- archived as {}", r.payload_id);
            Ok(())
        }
    }
}

async fn session(c: &mut Clients, cmd: SessionCommand, json: bool) -> anyhow::Result<()> {
    match cmd {
        SessionCommand::Create {
            label,
            labels,
            share_with,
            parent,
        } => {
            let mut map = std::collections::HashMap::new();
            for kv in labels {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("label {kv:?} is not KEY=VALUE"))?;
                map.insert(k.to_owned(), v.to_owned());
            }
            let s = rpc!(c.sessions.create_session(proto::CreateSessionRequest {
                label,
                labels: map,
                policy: None,
                parent_session_id: parent.unwrap_or_default(),
                share_with,
            }));
            output::show(json, &s, output::session)
        }
        SessionCommand::Get { session } => {
            let s = rpc!(c.sessions.get_session(proto::GetSessionRequest {
                session_id: session,
            }));
            output::show(json, &s, output::session)
        }
        SessionCommand::Ls { state } => {
            let state = match state.as_deref() {
                Some("open") => proto::SessionState::Open,
                Some("closed") => proto::SessionState::Closed,
                _ => proto::SessionState::Unspecified,
            } as i32;
            let list = async |page_token| {
                Ok(rpc!(c.sessions.list_sessions(proto::ListSessionsRequest {
                    page_size: 1000,
                    page_token,
                    state,
                    ..Default::default()
                })))
            };
            every_page(json, list, |p| &p.next_page_token, output::session_page).await
        }
        SessionCommand::Close { session } => {
            let s = rpc!(c.sessions.close_session(proto::CloseSessionRequest {
                session_id: session,
            }));
            output::show(json, &s, output::session)
        }
        SessionCommand::Rm { session, reason } => {
            let r = rpc!(c.sessions.delete_session(proto::DeleteSessionRequest {
                session_id: session,
                reason,
            }));
            output::show(json, &r, output::receipt)
        }
    }
}

async fn upload(
    c: &mut Clients,
    header: proto::UploadHeader,
    path: &std::path::Path,
) -> anyhow::Result<proto::Payload> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata()?.len();
    let (tx, rx) = mpsc::channel(4);
    tx.send(proto::UploadChunk {
        chunk: Some(proto::upload_chunk::Chunk::Header(header)),
    })
    .await?;
    let bar = progress(size);
    let reader_bar = bar.clone();
    let reader = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        loop {
            // Each chunk is read into its own buffer, which the message
            // then owns: no copy between the file and the encoder.
            let mut buf = Vec::with_capacity(UPLOAD_CHUNK);
            let n = (&mut file)
                .take(UPLOAD_CHUNK as u64)
                .read_to_end(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            reader_bar.inc(n as u64);
            let chunk = proto::UploadChunk {
                chunk: Some(proto::upload_chunk::Chunk::Data(buf.into())),
            };
            if tx.blocking_send(chunk).is_err() {
                return Ok(()); // the call ended; its status says why
            }
        }
    });
    let result = c.payloads.upload(ReceiverStream::new(rx)).await;
    bar.finish_and_clear();
    reader.await??;
    Ok(result?.into_inner())
}

/// Prints every page of a listing, from the first: each reply as JSON
/// with `--json`, else a line an item.
async fn every_page<T: serde::Serialize>(
    json: bool,
    mut list: impl AsyncFnMut(String) -> anyhow::Result<T>,
    next_token: fn(&T) -> &String,
    human: fn(&T),
) -> anyhow::Result<()> {
    let mut token = String::new();
    loop {
        let page = list(token).await?;
        output::show(json, &page, human)?;
        if next_token(&page).is_empty() {
            return Ok(());
        }
        token = next_token(&page).clone();
    }
}

/// Where a download or an export goes: the file `--output` names, or
/// stdout.
fn sink(out: Option<&std::path::Path>) -> anyhow::Result<Box<dyn Write>> {
    Ok(match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    })
}

fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() || total < (8 << 20) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// `spillway audit query|verify|export`.
async fn audit(c: &mut Clients, cmd: AuditCommand, json: bool) -> anyhow::Result<()> {
    match cmd {
        AuditCommand::VerifyReceipt { .. } => {
            unreachable!("verify-receipt is local and handled above")
        }
        AuditCommand::Query {
            session,
            payload,
            principal,
            action,
            since,
            until,
            limit,
        } => {
            let mut left = limit.unwrap_or(u64::MAX);
            let mut query = proto::AuditQuery {
                session_id: session.unwrap_or_default(),
                payload_id: payload.unwrap_or_default(),
                principal: principal.unwrap_or_default(),
                action: action.unwrap_or_default(),
                since: since
                    .as_deref()
                    .map(|t| timestamp(t, "--since"))
                    .transpose()?,
                until: until
                    .as_deref()
                    .map(|t| timestamp(t, "--until"))
                    .transpose()?,
                page_size: 1000,
                page_token: String::new(),
                ..Default::default()
            };
            while left > 0 {
                let mut page = rpc!(c.audit.query_audit(query.clone()));
                page.events
                    .truncate(usize::try_from(left).unwrap_or(usize::MAX));
                left -= page.events.len() as u64;
                output::show(json, &page, |p| {
                    p.events.iter().for_each(output::audit_event_line)
                })?;
                if page.next_page_token.is_empty() {
                    break;
                }
                query.page_token = page.next_page_token;
            }
            Ok(())
        }
        AuditCommand::Receipt { id } => {
            let req = if id.starts_with(crate::ids::ReceiptId::PREFIX) {
                proto::GetReceiptRequest {
                    receipt_id: id,
                    target_id: String::new(),
                }
            } else {
                proto::GetReceiptRequest {
                    receipt_id: String::new(),
                    target_id: id,
                }
            };
            let r = rpc!(c.audit.get_receipt(req));
            output::show(json, &r, output::receipt)
        }
        AuditCommand::Verify => {
            let r = rpc!(c.audit.verify_audit(proto::VerifyAuditRequest {}));
            output::show(json, &r, output::audit_verify)?;
            if !r.ok {
                std::process::exit(1);
            }
            Ok(())
        }
        AuditCommand::Export { output: out } => {
            let mut stream = rpc!(c.audit.export_audit(proto::ExportAuditRequest {}));
            let mut sink = sink(out.as_deref())?;
            let mut n = 0u64;
            while let Some(e) = stream.message().await? {
                let line = output::event_from_proto(e).to_export_line();
                sink.write_all(line.as_bytes())?;
                sink.write_all(b"\n")?;
                n += 1;
            }
            sink.flush()?;
            if let Some(path) = out {
                eprintln!("wrote {n} audit events to {}", path.display());
            }
            Ok(())
        }
    }
}

/// Parses an RFC 3339 time (`2026-11-30T09:00:00Z`; a missing zone is UTC).
fn timestamp(text: &str, flag: &str) -> anyhow::Result<pbjson_types::Timestamp> {
    let at = humantime::parse_rfc3339_weak(text.trim()).with_context(|| {
        format!("{flag} takes an RFC 3339 time such as 2026-11-30T09:00:00Z, got {text:?}")
    })?;
    let since_epoch = at
        .duration_since(std::time::UNIX_EPOCH)
        .with_context(|| format!("{flag}: {text:?} is before 1970"))?;
    Ok(pbjson_types::Timestamp {
        seconds: i64::try_from(since_epoch.as_secs())?,
        nanos: i32::try_from(since_epoch.subsec_nanos())?,
    })
}

/// Verifies a receipt file's signature with the key in `data_dir`.
fn verify_receipt(file: &std::path::Path, data_dir: &std::path::Path) -> anyhow::Result<()> {
    use crate::receipt::{KEY_FILE, PurgeConfirmation, ReceiptKey, RemovedItem, Signed};
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let r: proto::DeletionReceipt = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a receipt in proto3 JSON", file.display()))?;
    let key_path = data_dir.join(KEY_FILE);
    let key_text = std::fs::read_to_string(&key_path).with_context(|| {
        format!(
            "cannot read the receipt key {}; pass --data-dir",
            key_path.display()
        )
    })?;
    let key = ReceiptKey::from_hex(key_text.trim())
        .context("the receipt key file is not 64 hex digits")?;
    let at = r.deleted_at.unwrap_or_default();
    let removed: Vec<RemovedItem> = r.removed.iter().cloned().map(RemovedItem::from).collect();
    let signed = Signed {
        id: &r.id,
        target_id: &r.target_id,
        reason: &r.reason,
        requested_by: &r.requested_by,
        deleted_ms: crate::receipt::timestamp_millis(at.seconds, at.nanos),
        deleted_payload_ids: r.deleted_payload_ids.iter().map(String::as_str).collect(),
        bytes_deleted: r.bytes_deleted,
        content_sha256: r.content_sha256.iter().map(String::as_str).collect(),
        removed: &removed,
        purge_confirmed: PurgeConfirmation::from_message(
            r.purge_confirmed_at.as_ref().map(|t| (t.seconds, t.nanos)),
            r.purge_replicas,
        ),
    };
    if key.verify(&signed, &r.signature) {
        println!(
            "receipt {} verifies: signed by this server's key, unchanged",
            r.id
        );
        Ok(())
    } else {
        bail!(
            "receipt {} does NOT verify: it was changed after signing, or another server signed it",
            r.id
        )
    }
}

/// A content type for a file extension, so the server keeps it.
fn content_type_for(ext: &str) -> &'static str {
    match ext.to_ascii_lowercase().as_str() {
        "json" => "application/json",
        "ndjson" | "jsonl" => "application/x-ndjson",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "md" => "text/markdown",
        "txt" | "log" => "text/plain",
        _ => "",
    }
}

/// Parses `A:B` or `A:` (B = 0).
fn split_range(s: &str, flag: &str) -> anyhow::Result<(u64, u64)> {
    let (a, b) = s
        .split_once(':')
        .with_context(|| format!("{flag} takes A:B, got {s:?}"))?;
    let a = a
        .trim()
        .parse()
        .with_context(|| format!("{flag}: {a:?} is not a number"))?;
    let b = if b.trim().is_empty() {
        0
    } else {
        b.trim()
            .parse()
            .with_context(|| format!("{flag}: {b:?} is not a number"))?
    };
    Ok((a, b))
}
