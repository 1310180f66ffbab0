//! Code mode: Exec and ListRuntimes.
//!
//! An exec resolves its session and inputs through the access table,
//! resolves limits against the runtime defaults and the policy ceiling, runs
//! the script in [`crate::sandbox`], then keeps what the contract says:
//! stdout inline, or offloaded by the usual rules when large; files in `/out`
//! as payloads derived from the inputs when `keep_outputs` is set.

use std::collections::HashSet;
use std::io::Read as _;
use std::time::{Duration, Instant};

use super::{Service, in_place, joined, redact_bytes, redaction_detail};
use crate::audit::{NewEvent, action};
use crate::auth::Principal;
use crate::auth::access::{Access, Rpc, Source};
use crate::error::{ApiError, ApiResult};
use crate::ids::PayloadId;
use crate::redact::{RedactCounts, Redactor};
use crate::sandbox::limits::{self, ExecLimits};
use crate::sandbox::outcome::{self, INVALID_SCRIPT_MARKER, Status as ExecStatus};
use crate::sandbox::{Ending, ExecInput, ExecSpec, Finished, OutFile};
use crate::store::{PayloadRecord, SessionRecord, SessionState, Store, StoreError, UploadMeta};

pub use crate::sandbox::RuntimeInfo;

/// Most payloads one exec may read.
const MAX_INPUTS: usize = 1000;
/// Most files of `/out` one exec may keep.
const MAX_OUTPUTS: usize = 100;
/// Stdout up to this size is checked and redacted on the RPC thread (a
/// few microseconds); more goes to the sandbox's blocking pool.
const INLINE_SCAN_BYTES: usize = 16 << 10;

/// One script to run.
#[derive(Debug, Default)]
pub struct ExecRequest {
    /// The session whose payloads it reads, and which keeps its outputs.
    pub session_id: String,
    /// `jq`, `javascript`, `python` or `wasm`.
    pub runtime: String,
    /// The script (every runtime but `wasm`).
    pub source: String,
    /// The module (`wasm`: binary or WAT).
    pub module: bytes::Bytes,
    /// Arguments for the guest.
    pub args: Vec<String>,
    /// The payloads it reads; empty: the session's (or jq's `args[0]`).
    pub inputs: Vec<String>,
    /// Limits asked for (zero fields: the runtime's defaults).
    pub limits: ExecLimits,
    /// Keep the files of `/out` as payloads.
    pub keep_outputs: bool,
}

/// What a run used.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecUsage {
    /// Wall time of the run.
    pub wall_ms: u64,
    /// Fuel consumed.
    pub fuel_consumed: u64,
    /// Peak linear memory.
    pub peak_memory_bytes: u64,
    /// Bytes printed to stdout.
    pub stdout_bytes: u64,
    /// Bytes printed to stderr.
    pub stderr_bytes: u64,
    /// Bytes written under `/tmp` and `/out`.
    pub scratch_bytes: u64,
    /// Time spent waiting for a slot.
    pub queue_ms: u64,
    /// Building the exec directory and linking inputs.
    pub setup_us: u64,
    /// Instantiating the image.
    pub instantiate_us: u64,
    /// Running the guest.
    pub run_us: u64,
    /// Compiling the caller's module (zero for an image, or a module
    /// found compiled in the cache).
    pub compile_us: u64,
    /// Socket calls the guest made and the sandbox refused, counted once.
    pub denied_calls: u64,
    /// Files and directories under `/tmp` and `/out` at their peak.
    pub scratch_entries: u64,
    /// The part of the run spent waiting for a turn on the CPU while other
    /// guests ran (turns are shared by tenant, then session).
    pub cpu_wait_us: u64,
    /// All of the server's time on the exec, request to reply.
    pub server_us: u64,
    /// Session, policy and input lookups before the exec is queued.
    pub prepare_us: u64,
    /// `queue_ms` in microseconds.
    pub queue_us: u64,
    /// Finding the compiled image or module (`compile_us` within it).
    pub module_us: u64,
    /// Storing what the run produced.
    pub output_us: u64,
    /// Appending the durable audit event.
    pub audit_us: u64,
    /// Removing the exec directory (alongside the audit append).
    pub cleanup_us: u64,
}

/// The outcome of one exec.
#[derive(Debug)]
pub struct ExecReply {
    /// How it ended.
    pub status: ExecStatus,
    /// The guest's exit code (-1 when it did not exit).
    pub exit_code: i32,
    /// Stdout, or the notice of its payload when it was offloaded.
    pub stdout: String,
    /// Stderr, capped.
    pub stderr: String,
    /// The payload holding stdout, when it was offloaded.
    pub stdout_payload: Option<PayloadRecord>,
    /// The files of `/out` kept as payloads.
    pub outputs: Vec<PayloadRecord>,
    /// What happened and what to do next.
    pub message: String,
    /// What the run used.
    pub usage: ExecUsage,
    /// One line per clamped limit.
    pub clamped: Vec<String>,
    /// The limits it ran with.
    pub effective_limits: ExecLimits,
    /// Redactions in everything it produced.
    pub redactions: RedactCounts,
}

impl Service {
    /// Runs one script against the session's payloads.
    pub async fn exec(&self, p: &Principal, r: ExecRequest) -> ApiResult<ExecReply> {
        let started = Instant::now();
        let session = self.session_for(p, Rpc::Exec, &r.session_id).await?;
        let span = tracing::Span::current();
        span.record("session_id", tracing::field::display(&session.id));
        span.record("runtime", r.runtime.as_str());
        let (policy, redactor) = self.session_redactor(&session).await?;
        if !policy.allow_exec {
            let denied = ApiError::Denied(
                "code mode is disabled by this session's policy (allow_exec = false); use Read, Search and Inspect instead, or ask compliance to allow exec".into(),
            );
            self.refusal::<()>(p, Rpc::Exec, Err(denied), session.id.as_str(), "")
                .await?;
        }
        let sandbox = self.sandbox.clone();
        let defaults = sandbox.defaults(&r.runtime)?;
        if r.keep_outputs && session.state != SessionState::Open {
            return Err(StoreError::SessionClosed(session.id.clone()).into());
        }
        let (inputs, args) = {
            let store = self.store.clone();
            let mut scope = session.clone();
            scope.parent = self.readable_parent(p, &session).await?;
            let (s, ids, runtime, args) =
                (scope, r.inputs.clone(), r.runtime.clone(), r.args.clone());
            // Record lookups and opens: short, so no hop to the pool.
            let resolved = in_place(move || resolve_inputs(&store, &s, &ids, &runtime, args)).await;
            let sid = session.id.as_str();
            self.refusal(p, Rpc::Exec, resolved, sid, "").await?
        };
        let ceiling = policy.exec_ceiling;
        // A large answer is offloaded like any large tool result, so a
        // request that names no stdout limit may print up to the ceiling;
        // only output past it is a flood.
        let defaults = ExecLimits {
            max_stdout_bytes: match ceiling.max_stdout_bytes {
                0 => defaults.max_stdout_bytes,
                c => c,
            },
            ..defaults
        };
        let resolved = limits::resolve(r.limits, defaults, ceiling);
        let input_ids: Vec<PayloadId> = inputs.iter().map(|(p, _)| p.id.clone()).collect();
        let spec = ExecSpec {
            runtime: r.runtime.clone(),
            source: r.source,
            module: r.module,
            args,
            inputs: inputs.into_iter().map(|(_, i)| i).collect(),
            limits: resolved.limits,
            tenant: p.tenant.clone(),
            session: session.id.to_string(),
        };
        let event = NewEvent::new(action::EXEC_RUN).session(&session.id);
        let input_count = input_ids.len();
        let prepare = started.elapsed();
        let finished = match sandbox.exec(spec).await? {
            Ok(f) => f,
            Err(why) => {
                span.record("status", "invalid_script");
                let message =
                    format!("the module did not load, so nothing ran: {why}. Fix it and run again");
                let (message, redactions) = redactor.redact_str(&message);
                let reply = ExecReply {
                    status: ExecStatus::InvalidScript,
                    exit_code: -1,
                    stdout: String::new(),
                    stderr: String::new(),
                    stdout_payload: None,
                    outputs: Vec::new(),
                    message: message.into_owned(),
                    usage: ExecUsage::default(),
                    clamped: resolved.clamped,
                    effective_limits: resolved.limits,
                    redactions,
                };
                let detail = exec_detail(&r.runtime, input_count, &reply);
                crate::metrics::exec(&r.runtime, reply.status.name());
                self.audit(p, event.detail(detail)).await?;
                return Ok(reply);
            }
        };
        let verdict = outcome::judge(
            &r.runtime,
            finished.image,
            &finished.outcome,
            &resolved.limits,
            &ceiling,
            sandbox.scratch_limit(),
        );
        span.record("status", tracing::field::debug(verdict.status));
        let run = Run {
            runtime: &r.runtime,
            keep_outputs: r.keep_outputs,
            inputs: input_ids,
            resolved,
            redactor,
        };
        let mut reply = self.keep(&session, run, finished, verdict).await?;
        crate::metrics::exec(&r.runtime, reply.status.name());
        let detail = exec_detail(&r.runtime, input_count, &reply);
        let audit = Instant::now();
        self.audit(p, event.detail(detail)).await?;
        let u = &mut reply.usage;
        u.audit_us = micros(audit.elapsed());
        u.prepare_us = micros(prepare);
        u.server_us = micros(started.elapsed());
        Ok(reply)
    }

    /// The runtimes code mode offers.
    pub async fn list_runtimes(&self, p: &Principal) -> ApiResult<Vec<RuntimeInfo>> {
        self.authorize(p, Rpc::ListRuntimes).await?;
        Ok(self.sandbox.runtimes())
    }
}

/// What [`Service::keep`] needs of the request.
struct Run<'a> {
    runtime: &'a str,
    keep_outputs: bool,
    inputs: Vec<PayloadId>,
    resolved: limits::Resolved,
    redactor: Redactor,
}

impl Service {
    /// Turns a finished run into the reply: stdout inline or offloaded,
    /// outputs kept or mentioned. Everything the script produced (stdout,
    /// stderr, `/out` files and their names, the message that names them)
    /// is redacted before it is stored or returned; also returns the counts,
    /// over all of it.
    async fn keep(
        &self,
        session: &SessionRecord,
        run: Run<'_>,
        finished: Finished,
        verdict: outcome::Verdict,
    ) -> ApiResult<ExecReply> {
        let started = Instant::now();
        let Run {
            runtime,
            keep_outputs,
            inputs,
            resolved,
            redactor,
        } = run;
        let out = &finished.outcome;
        let mut message = verdict.message;
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if verdict.status == ExecStatus::InvalidScript
            && let Some(rest) = stderr.strip_prefix(INVALID_SCRIPT_MARKER)
        {
            stderr = rest.trim_start_matches('\n').to_owned();
        }
        let mut stderr = outcome::tidy_stderr(runtime, &stderr);
        let mut redacted = RedactCounts::default();
        let (text, counts) = redactor.redact_str(&stderr);
        if !counts.is_empty() {
            stderr = text.into_owned();
            redacted.add(&counts);
        }
        let stdout_bytes = out.stdout.len() as u64;

        // Large stdout goes through the offload rules, as a tool result of
        // its own, derived from the inputs.
        let quota = Service::quota(&self.effective_policy(session).await?);
        let store = self.store.clone();
        let config = self.config.clone();
        let sid = session.id.clone();
        let open = session.state == SessionState::Open;
        let tool_name = format!("exec:{runtime}");
        // Everything below that touches the output in bulk (the UTF-8
        // check, redaction, storing it) runs on the sandbox's blocking pool,
        // at exec priority: a session that floods its stdout pays for it.
        let sandbox = &self.sandbox;
        let scan = |content: bytes::Bytes, r: &Redactor| {
            let utf8 = std::str::from_utf8(&content).is_ok();
            let (content, counts) = redact_bytes(r, content);
            (content, counts, utf8)
        };
        let (content, counts, utf8) = if out.stdout.len() <= INLINE_SCAN_BYTES {
            // A few microseconds: not worth two thread hops.
            scan(out.stdout.clone(), &redactor)
        } else {
            let (content, r) = (out.stdout.clone(), redactor.clone());
            joined(sandbox.spawn_blocking(move || Ok::<_, ApiError>(scan(content, &r)))).await?
        };
        if !utf8 {
            message.push_str("; stdout was not valid UTF-8, and invalid bytes are shown as U+FFFD");
        }
        redacted.add(&counts);
        // A script stopped for flooding stdout left output that is cut off
        // at an arbitrary byte. Kept as a payload it would read like a whole
        // result, and every flood would write up to the stdout ceiling to
        // disk; so only its beginning is shown, as the message says.
        let flooded = matches!(out.ending, Ending::OutputLimit("stdout"));
        let derived = inputs.clone();
        let offloaded = if open && !flooded && !content.is_empty() {
            let content = content.clone();
            joined(sandbox.spawn_blocking(move || {
                let settings =
                    crate::offload::Settings::resolve(&config.offload, &Default::default())?;
                let result = crate::offload::ToolResult {
                    tool_call_id: String::new(),
                    tool_name,
                    content,
                    content_type: String::new(),
                    is_error: false,
                    derived_from: derived,
                    redactions: counts,
                };
                crate::offload::offload_turn(&store, &sid, vec![result], &settings, 1, quota)
            }))
            .await?
            .pop()
        } else {
            None
        };
        let max_inline = self.config.limits.max_response_message_bytes / 2;
        let (stdout, stdout_payload) = match offloaded {
            Some(o) if o.payload.is_some() => (o.content, o.payload),
            _ if flooded => {
                let (shown, _) = head(&content, self.config.offload.preview_size());
                message.push_str(&format!(
                    "; the stdout field holds its first {} bytes (after redaction), and the rest was not kept",
                    shown.len()
                ));
                (shown, None)
            }
            // Inline: what fits in a reply (a closed session cannot take
            // an offloaded copy), and the message says when that is not all.
            _ => {
                let (shown, whole) = head(&content, max_inline);
                if !whole {
                    let (why, how) = if open {
                        (", more than a reply may carry", "")
                    } else {
                        (
                            " and the session is closed, so it could not be offloaded",
                            ", or run it in an open session",
                        )
                    };
                    message.push_str(&format!(
                        "; stdout was {stdout_bytes} bytes{why}: only the first {} bytes are returned. Print less{how}",
                        shown.len()
                    ));
                }
                (shown, None)
            }
        };

        let (files, skipped) = (finished.out_files, finished.out_skipped);
        let mut outputs = Vec::new();
        if keep_outputs && !files.is_empty() {
            if files.len() > MAX_OUTPUTS {
                message.push_str(&format!(
                    "; /out held {} files and only the first {MAX_OUTPUTS} (by name) were kept",
                    files.len()
                ));
            }
            let store = self.store.clone();
            let sid = session.id.clone();
            let runtime = runtime.to_owned();
            let r = redactor.clone();
            let kept = joined(sandbox.spawn_blocking(move || {
                keep_outputs_as_payloads(&store, &sid, &runtime, files, &inputs, &r, quota)
            }))
            .await?;
            for p in &kept {
                redacted.add(&p.redactions);
            }
            outputs = kept;
        } else if !files.is_empty() {
            let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
            message.push_str(&format!(
                "; the script wrote {} file(s) to /out ({}) that were discarded: set keep_outputs to keep them as payloads",
                files.len(),
                names.join(", ")
            ));
        }
        if !skipped.is_empty() {
            message.push_str(&format!("; not kept from /out: {}", skipped.join(", ")));
        }
        // `/out` names come from the script.
        let (text, counts) = redactor.redact_str(&message);
        if !counts.is_empty() {
            message = text.into_owned();
            redacted.add(&counts);
        }
        let reply = ExecReply {
            status: verdict.status,
            exit_code: verdict.exit_code,
            stdout,
            stderr,
            stdout_payload,
            outputs,
            message,
            usage: ExecUsage {
                wall_ms: out.wall.as_millis() as u64,
                fuel_consumed: out.fuel_consumed,
                peak_memory_bytes: out.peak_memory_bytes,
                stdout_bytes,
                stderr_bytes: out.stderr.len() as u64,
                scratch_bytes: finished.scratch_bytes,
                queue_ms: finished.queued.as_millis() as u64,
                setup_us: finished.setup.as_micros() as u64,
                instantiate_us: out.instantiate.as_micros() as u64,
                run_us: out.wall.saturating_sub(out.instantiate).as_micros() as u64,
                compile_us: finished.compile.as_micros() as u64,
                denied_calls: out.denied_socket_calls,
                scratch_entries: finished.scratch_entries,
                cpu_wait_us: out.cpu_wait.as_micros() as u64,
                queue_us: micros(finished.queued),
                module_us: micros(finished.module),
                output_us: micros(started.elapsed()),
                cleanup_us: micros(finished.cleanup),
                ..ExecUsage::default()
            },
            clamped: resolved.clamped,
            effective_limits: resolved.limits,
            redactions: redacted,
        };
        Ok(reply)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What the audit log says of a run: the runtime, the status, the exit
/// code, how many inputs, the IDs of what it stored, and how many
/// redactions its output needed (per rule). Never the script, its arguments
/// or its output.
fn exec_detail(runtime: &str, inputs: usize, r: &ExecReply) -> String {
    let mut detail = format!(
        "runtime={runtime} status={} exit_code={} inputs={inputs}",
        r.status.name(),
        r.exit_code
    );
    if let Some(p) = &r.stdout_payload {
        detail.push_str(&format!(" stdout_payload={}", p.id));
    }
    if !r.outputs.is_empty() {
        let ids: Vec<&str> = r.outputs.iter().map(|p| p.id.as_str()).collect();
        detail.push_str(&format!(" outputs={}", ids.join(",")));
    }
    detail.push_str(&redaction_detail(&r.redactions));
    detail
}

/// The inputs, each with what the sandbox needs to link it, and the args
/// left for the guest.
type Resolved = (Vec<(PayloadRecord, ExecInput)>, Vec<String>);

/// The exec's inputs and the args left for the guest. Inputs come from the
/// session or its parent; anything else is reported as not found.
fn resolve_inputs(
    store: &Store,
    session: &SessionRecord,
    ids: &[String],
    runtime: &str,
    mut args: Vec<String>,
) -> ApiResult<Resolved> {
    let mut records: Vec<PayloadRecord> = Vec::new();
    if ids.is_empty() {
        // jq: `args[0]` may name the input payload, by ID or name.
        if runtime == "jq"
            && let Some(first) = args.first()
            && !first.starts_with('-')
        {
            let found = match PayloadId::parse(first) {
                Ok(id) => store
                    .payload(&id)
                    .ok()
                    .filter(|p| readable_from(session, p)),
                Err(_) => store.payload_by_name(&session.id, first)?,
            };
            match found {
                Some(p) => {
                    records.push(p);
                    args.remove(0);
                }
                None if first.starts_with("pl_") => {
                    return Err(ApiError::Hidden {
                        kind: "payload",
                        id: first.clone(),
                    });
                }
                None => {}
            }
        }
        if records.is_empty() {
            let mut token = String::new();
            loop {
                let page = store.list_payloads(&session.id, &token, 500)?;
                records.extend(page.items.into_iter().filter(|p| !p.missing));
                if records.len() > MAX_INPUTS {
                    return Err(too_many_inputs(records.len()));
                }
                if page.next_token.is_empty() {
                    break;
                }
                token = page.next_token;
            }
        }
    } else {
        if ids.len() > MAX_INPUTS {
            return Err(too_many_inputs(ids.len()));
        }
        let mut seen = HashSet::new();
        for raw in ids {
            let id = PayloadId::parse(raw)?;
            if !seen.insert(id.clone()) {
                continue;
            }
            let hidden = || ApiError::Hidden {
                kind: "payload",
                id: raw.clone(),
            };
            let p = match store.payload(&id) {
                Ok(p) => p,
                Err(StoreError::NotFound { .. }) => return Err(hidden()),
                Err(e) => return Err(e.into()),
            };
            if !readable_from(session, &p) {
                return Err(hidden());
            }
            records.push(p);
        }
    }
    // The session's own payloads take their names first; a parent's
    // payload whose name one of them holds is at `/payloads/<id>`, as the
    // exec's `/spillway/payloads.json` says. (The sort is stable: the
    // caller's order holds within each session.)
    records.sort_by_key(|p| p.session_id != session.id);
    let mut out = Vec::with_capacity(records.len());
    for p in records {
        let input = ExecInput {
            id: p.id.to_string(),
            name: p.name.clone(),
            size: p.size,
            content_type: p.content_type.clone(),
            dir: store.payload_dir(&p)?,
            file_name: p.name.clone(),
        };
        out.push((p, input));
    }
    Ok((out, args))
}

/// A script in `session` may read its own payloads and its parent's.
fn readable_from(session: &SessionRecord, p: &PayloadRecord) -> bool {
    let source = Source::of(&session.id, session.parent.as_ref(), &p.session_id);
    source.access() == Access::Allowed
}

fn too_many_inputs(n: usize) -> ApiError {
    ApiError::Limit(format!(
        "an exec reads at most {MAX_INPUTS} payloads and this one would read {n}; name the ones you need in `inputs`"
    ))
}

/// Stores the files of `/out` as payloads derived from the inputs, each
/// redacted as a stream (in bounded memory), its name too.
fn keep_outputs_as_payloads(
    store: &Store,
    session: &crate::ids::SessionId,
    runtime: &str,
    files: Vec<OutFile>,
    inputs: &[PayloadId],
    redactor: &Redactor,
    quota: crate::store::Quota,
) -> Result<Vec<PayloadRecord>, StoreError> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Vec::new();
    for mut f in files.into_iter().take(MAX_OUTPUTS) {
        let (name, name_counts) = redactor.redact_str(&f.name);
        let mut upload = store.begin_upload(
            session,
            UploadMeta {
                name: name.into_owned(),
                content_type: String::new(),
                tool_name: format!("exec:{runtime}"),
                tool_call_id: String::new(),
                is_error: false,
                expected_sha256: None,
                derived_from: inputs.to_vec(),
                archive_key: String::new(),
                quota,
                redactions: RedactCounts::default(),
            },
        )?;
        let mut stream = redactor.stream();
        loop {
            let n = f.file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.clear();
            stream.push(&buf[..n], &mut out);
            upload.write(&out)?;
        }
        out.clear();
        let mut counts = stream.finish(&mut out);
        upload.write(&out)?;
        counts.add(&name_counts);
        upload.set_redactions(counts);
        kept.push(upload.finish()?);
    }
    Ok(kept)
}

/// At most `max` bytes of text from the start of `bytes`, cut at a char
/// boundary (invalid UTF-8 shown as U+FFFD, which may make the text longer
/// than the bytes), and whether that is all of it. Converts only a prefix.
fn head(bytes: &[u8], max: usize) -> (String, bool) {
    // A char is at most 4 bytes: this prefix holds every char that can fit.
    let prefix = &bytes[..bytes.len().min(max.saturating_add(4))];
    let mut text = String::from_utf8_lossy(prefix).into_owned();
    let whole = prefix.len() == bytes.len() && text.len() <= max;
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    (text, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_cuts_at_a_char_boundary_and_shows_invalid_bytes_as_replacements() {
        assert_eq!(head(b"abcdef", 4), ("abcd".into(), false));
        assert_eq!(head(b"ab", 10), ("ab".into(), true));
        // 'é' is two bytes: a cut inside it drops it whole.
        assert_eq!(head("aéb".as_bytes(), 2), ("a".into(), false));
        assert_eq!(head("aéb".as_bytes(), 3), ("aé".into(), false));
        // An invalid byte becomes U+FFFD (3 bytes), and the cut counts it:
        // 3 bytes in may be 5 bytes of text, more than a limit of 4.
        assert_eq!(head(b"a\xffb", 4), ("a\u{fffd}".into(), false));
        assert_eq!(head(b"a\xffb", 3), ("a".into(), false));
        assert_eq!(head(b"a\xffb", 5), ("a\u{fffd}b".into(), true));
        // Only a prefix is converted, however long the input.
        let (text, whole) = head(&vec![b'x'; 10 << 20], 5);
        assert_eq!((text.len(), whole), (5, false));
    }

    fn reply(status: ExecStatus) -> ExecReply {
        ExecReply {
            status,
            exit_code: 0,
            stdout: String::new(),
            stderr: String::new(),
            stdout_payload: None,
            outputs: Vec::new(),
            message: String::new(),
            usage: ExecUsage::default(),
            clamped: Vec::new(),
            effective_limits: ExecLimits::default(),
            redactions: RedactCounts::default(),
        }
    }

    fn payload(id: &str) -> PayloadRecord {
        PayloadRecord {
            id: PayloadId::parse(id).unwrap(),
            session_id: crate::ids::SessionId::parse(&format!("ses_{}", "0".repeat(32))).unwrap(),
            name: "out.txt".into(),
            size: 0,
            line_count: 0,
            chars: 0,
            sha256: String::new(),
            content_type: String::new(),
            tool_name: String::new(),
            tool_call_id: String::new(),
            is_error: false,
            created_ms: 0,
            expires_ms: 0,
            derived_from: Vec::new(),
            utf8: true,
            missing: false,
            archive_key: String::new(),
            redactions: RedactCounts::default(),
        }
    }

    #[test]
    fn the_exec_audit_detail_names_runtime_status_and_stored_ids_only() {
        let (a, b, c) = (
            format!("pl_{}", "a".repeat(32)),
            format!("pl_{}", "b".repeat(32)),
            format!("pl_{}", "c".repeat(32)),
        );
        let r = ExecReply {
            exit_code: 3,
            stdout: "secret output".into(),
            stderr: "secret error".into(),
            stdout_payload: Some(payload(&a)),
            outputs: vec![payload(&b), payload(&c)],
            ..reply(ExecStatus::ExitNonzero)
        };
        assert_eq!(
            exec_detail("jq", 2, &r),
            format!(
                "runtime=jq status=exit_nonzero exit_code=3 inputs=2 stdout_payload={a} outputs={b},{c}"
            )
        );
        let (_, counts) = Redactor::compile(&["builtin:email".into()])
            .unwrap()
            .redact(b"a@b.io c@d.io");
        let r = ExecReply {
            redactions: counts,
            ..reply(ExecStatus::Ok)
        };
        assert_eq!(
            exec_detail("jq", 0, &r),
            "runtime=jq status=ok exit_code=0 inputs=0 redactions=2 (email=2)"
        );
    }
}
