//! The policy page: the tenant's effective policy with where each value
//! comes from, and the edit form. The service decides every change
//! ([`Service::set_policy`](crate::service::Service::set_policy), as
//! SetPolicy does); a refusal is shown next to the field it names. The
//! merge shown is [`crate::policy::effective`], the function the service
//! applies.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::ctx::{Ctx, status};
use super::views::{self, Section, may};
use crate::auth::access::Rpc;
use crate::policy::{self, ExecCeiling, Policy, PolicyOverrides};
use crate::service::{PolicyTarget, PolicyView};

/// How a field is edited.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Duration,
    Quota,
    Flag,
    Ceiling,
    Redact,
}

/// The fields of a policy, in page order: (wire name, label, kind, help).
const FIELDS: &[(&str, &str, Kind, &str)] = &[
    (
        "retention",
        "Retention",
        Kind::Duration,
        "Longest a payload is kept, e.g. 3d or 12h. Shorter is stricter.",
    ),
    (
        "session_ttl",
        "Session TTL",
        Kind::Duration,
        "Longest a session lives, e.g. 7d. Shorter is stricter.",
    ),
    (
        "max_session_bytes",
        "Bytes per session",
        Kind::Quota,
        "0 or empty: no quota at this level. Smaller is stricter.",
    ),
    (
        "max_payload_bytes",
        "Bytes per payload",
        Kind::Quota,
        "0 or empty: no quota at this level.",
    ),
    (
        "max_payloads",
        "Payloads per session",
        Kind::Quota,
        "0 or empty: no quota at this level.",
    ),
    (
        "delete_on_close",
        "Delete on close",
        Kind::Flag,
        "Yes is stricter.",
    ),
    (
        "allow_download",
        "Allow download",
        Kind::Flag,
        "No is stricter.",
    ),
    ("allow_exec", "Allow scripts", Kind::Flag, "No is stricter."),
    (
        "compliance_can_read",
        "Compliance may read content",
        Kind::Flag,
        "No is stricter. Granted only where the server allows it too.",
    ),
    (
        "exec_ceiling",
        "Script ceiling",
        Kind::Ceiling,
        "Most a script may use: timeout ms, memory bytes, stdout bytes, fuel. 0: no ceiling at this level.",
    ),
    (
        "redact",
        "Redaction rules",
        Kind::Redact,
        "One per line: a regex, or builtin:email, builtin:aws_access_key, builtin:bearer_token, builtin:private_key.",
    ),
];

const CEILING: [(&str, &str); 4] = [
    ("timeout_ms", "Timeout (ms)"),
    ("memory_bytes", "Memory (bytes)"),
    ("max_stdout_bytes", "Stdout (bytes)"),
    ("fuel", "Fuel"),
];

fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn quota(v: u64) -> String {
    if v == 0 { "none".into() } else { v.to_string() }
}

fn flag(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn ceiling(l: &ExecCeiling) -> String {
    format!(
        "{} ms, {} memory, {} stdout, fuel {}",
        l.timeout_ms,
        views::bytes(l.memory_bytes),
        views::bytes(l.max_stdout_bytes),
        quota(l.fuel)
    )
}

/// A field's value in a full policy, as shown.
fn shown(p: &Policy, field: &str) -> String {
    match field {
        "retention" => dur(p.retention),
        "session_ttl" => dur(p.session_ttl),
        "max_session_bytes" => quota(p.max_session_bytes),
        "max_payload_bytes" => quota(p.max_payload_bytes),
        "max_payloads" => quota(p.max_payloads),
        "delete_on_close" => flag(p.delete_on_close).into(),
        "allow_download" => flag(p.allow_download).into(),
        "allow_exec" => flag(p.allow_exec).into(),
        "compliance_can_read" => flag(p.compliance_can_read).into(),
        "exec_ceiling" => ceiling(&p.exec_ceiling),
        "redact" if p.redact.is_empty() => "none".into(),
        "redact" => p.redact.join(", "),
        _ => String::new(),
    }
}

/// A field's value at one level, as shown; `None` when the level leaves it
/// to the next.
fn level_shown(l: &PolicyOverrides, field: &str) -> Option<String> {
    let ms = |v: Option<u64>| v.map(|ms| dur(Duration::from_millis(ms)));
    match field {
        "retention" => ms(l.retention_ms),
        "session_ttl" => ms(l.session_ttl_ms),
        "max_session_bytes" => l.max_session_bytes.map(quota),
        "max_payload_bytes" => l.max_payload_bytes.map(quota),
        "max_payloads" => l.max_payloads.map(quota),
        "delete_on_close" => l.delete_on_close.map(|b| flag(b).into()),
        "allow_download" => l.allow_download.map(|b| flag(b).into()),
        "allow_exec" => l.allow_exec.map(|b| flag(b).into()),
        "compliance_can_read" => l.compliance_can_read.map(|b| flag(b).into()),
        "exec_ceiling" => l.exec_ceiling.as_ref().map(ceiling),
        "redact" if l.redact.is_empty() => None,
        "redact" => Some(l.redact.join(", ")),
        _ => None,
    }
}

/// Where an effective value comes from: `session` when the session level
/// changed it, else `tenant` when the tenant level did, else `server`.
pub fn source(
    server: &Policy,
    tenant: &PolicyOverrides,
    session: &Policy,
    field: &str,
) -> &'static str {
    let tenant_eff = policy::effective(server, tenant, &PolicyOverrides::default());
    if shown(session, field) != shown(&tenant_eff, field) {
        "session"
    } else if shown(&tenant_eff, field) != shown(server, field) {
        "tenant"
    } else if level_shown(tenant, field).is_some() {
        "tenant (same as server)"
    } else {
        "server"
    }
}

/// The form's current text for a field: what was submitted, or the tenant
/// level's value.
fn form_value(l: &PolicyOverrides, field: &str) -> String {
    let ms = |v: Option<u64>| {
        v.map(|ms| dur(Duration::from_millis(ms)))
            .unwrap_or_default()
    };
    let b = |v: Option<bool>| match v {
        None => String::new(),
        Some(true) => "true".into(),
        Some(false) => "false".into(),
    };
    let q = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    match field {
        "retention" => ms(l.retention_ms),
        "session_ttl" => ms(l.session_ttl_ms),
        "max_session_bytes" => q(l.max_session_bytes),
        "max_payload_bytes" => q(l.max_payload_bytes),
        "max_payloads" => q(l.max_payloads),
        "delete_on_close" => b(l.delete_on_close),
        "allow_download" => b(l.allow_download),
        "allow_exec" => b(l.allow_exec),
        "compliance_can_read" => b(l.compliance_can_read),
        "redact" => l.redact.join("\n"),
        "locked" => {
            if l.locked {
                "on".into()
            } else {
                String::new()
            }
        }
        _ => String::new(),
    }
}

/// What the form holds: values by input name.
type Submitted = Vec<(String, String)>;

fn get<'a>(form: &'a Submitted, name: &str) -> &'a str {
    form.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

fn submitted_from(l: &PolicyOverrides) -> Submitted {
    let mut out: Submitted = FIELDS
        .iter()
        .filter(|f| f.2 != Kind::Ceiling)
        .map(|f| (f.0.to_owned(), form_value(l, f.0)))
        .collect();
    let c = l.exec_ceiling.unwrap_or(ExecCeiling::ZERO);
    for (name, v) in [
        ("timeout_ms", c.timeout_ms),
        ("memory_bytes", c.memory_bytes),
        ("max_stdout_bytes", c.max_stdout_bytes),
        ("fuel", c.fuel),
    ] {
        out.push((
            format!("exec_ceiling.{name}"),
            if v == 0 { String::new() } else { v.to_string() },
        ));
    }
    out.push(("locked".into(), form_value(l, "locked")));
    out
}

/// Reads the form into a tenant level; or the field and what is wrong.
/// Empty fields, and zero quotas and ceilings, defer to the server.
fn policy_from(form: &Submitted) -> Result<PolicyOverrides, (String, String)> {
    let duration = |name: &str| -> Result<Option<u64>, (String, String)> {
        let v = get(form, name).trim();
        if v.is_empty() {
            return Ok(None);
        }
        let d = humantime::parse_duration(v).map_err(|e| {
            (
                name.to_owned(),
                format!(
                    "{v:?} is not a duration ({e}); write e.g. 3d, 12h or 90m, or leave it empty"
                ),
            )
        })?;
        Ok(Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    };
    let number = |name: &str| -> Result<u64, (String, String)> {
        let v = get(form, name).trim();
        if v.is_empty() {
            return Ok(0);
        }
        v.parse().map_err(|_| {
            (
                name.split('.').next().unwrap_or(name).to_owned(),
                format!("{v:?} is not a whole number of at least 0"),
            )
        })
    };
    let quota = |name: &str| number(name).map(|v| (v != 0).then_some(v));
    let flag = |name: &str| -> Result<Option<bool>, (String, String)> {
        match get(form, name) {
            "" => Ok(None),
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err((
                name.to_owned(),
                format!("{other:?} is not yes, no or server default"),
            )),
        }
    };
    let ceiling = ExecCeiling {
        timeout_ms: number("exec_ceiling.timeout_ms")?,
        memory_bytes: number("exec_ceiling.memory_bytes")?,
        max_stdout_bytes: number("exec_ceiling.max_stdout_bytes")?,
        fuel: number("exec_ceiling.fuel")?,
    };
    let redact: Vec<String> = get(form, "redact")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(PolicyOverrides {
        retention_ms: duration("retention")?,
        session_ttl_ms: duration("session_ttl")?,
        max_session_bytes: quota("max_session_bytes")?,
        max_payload_bytes: quota("max_payload_bytes")?,
        max_payloads: quota("max_payloads")?,
        delete_on_close: flag("delete_on_close")?,
        allow_download: flag("allow_download")?,
        allow_exec: flag("allow_exec")?,
        compliance_can_read: flag("compliance_can_read")?,
        exec_ceiling: (ceiling != ExecCeiling::ZERO).then_some(ceiling),
        redact,
        locked: get(form, "locked") == "on",
    })
}

/// The field a server message is about: its `policy.<field>:` prefix.
fn field_of(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("policy.")?;
    let field = rest.split([':', ' ', '.']).next()?;
    FIELDS
        .iter()
        .map(|f| f.0)
        .chain(["locked"])
        .find(|f| *f == field)
}

async fn tenant_level(ctx: &Ctx) -> Result<PolicyOverrides, tonic::Status> {
    let (service, p) = ctx.service();
    let target = PolicyTarget::Tenant(p.tenant.clone());
    match service.get_policy(p, target).await.map_err(status)? {
        PolicyView::Level(l) => Ok(l),
        PolicyView::Effective(_) => Err(tonic::Status::internal(
            "the service answered a tenant's policy with a session's",
        )),
    }
}

/// GET /policy.
pub async fn show(
    ctx: Ctx,
    axum::extract::Query(q): axum::extract::Query<Vec<(String, String)>>,
) -> Response {
    let level = match tenant_level(&ctx).await {
        Ok(l) => l,
        Err(s) => return ctx.refused(Section::Policy, &s),
    };
    if let Some((_, id)) = q.iter().find(|(k, _)| k == "session") {
        return session_policy(&ctx, &level, id).await;
    }
    let saved = q.iter().any(|(k, v)| k == "saved" && v == "1");
    let form = submitted_from(&level);
    render(&ctx, StatusCode::OK, &level, &form, None, saved)
}

/// POST /policy: SetPolicy with the form's values.
pub async fn update(ctx: Ctx, axum::Form(form): axum::Form<Submitted>) -> Response {
    if let Some(r) = ctx.csrf_refusal(get(&form, "csrf")) {
        return r;
    }
    let level = match tenant_level(&ctx).await {
        Ok(l) => l,
        Err(s) => return ctx.refused(Section::Policy, &s),
    };
    let policy = match policy_from(&form) {
        Ok(p) => p,
        Err((field, why)) => {
            return render(
                &ctx,
                StatusCode::BAD_REQUEST,
                &level,
                &form,
                Some((field, why)),
                false,
            );
        }
    };
    let (service, p) = ctx.service();
    match service
        .set_policy(p, &p.tenant, Some(policy))
        .await
        .map_err(status)
    {
        Ok(_) => Redirect::to("/policy?saved=1").into_response(),
        Err(s) if s.code() == tonic::Code::Unauthenticated => ctx.refused(Section::Policy, &s),
        Err(s) => {
            let (status, _) = super::ctx::status_of(s.code());
            let field = field_of(s.message()).unwrap_or("").to_owned();
            render(
                &ctx,
                status,
                &level,
                &form,
                Some((field, super::ctx::message(&s))),
                false,
            )
        }
    }
}

/// GET /policy?session=…: a session's effective policy, and for each
/// value the level it comes from (server, tenant or session).
async fn session_policy(ctx: &Ctx, level: &PolicyOverrides, id: &str) -> Response {
    if id.len() > super::ctx::MAX_ID {
        return ctx.id_too_long(Section::Policy, "session");
    }
    let (service, p) = ctx.service();
    let target = PolicyTarget::Session(id.to_owned());
    let effective = match service.get_policy(p, target).await.map_err(status) {
        Ok(PolicyView::Effective(e)) => e,
        Ok(PolicyView::Level(_)) => {
            return ctx.refused(
                Section::Policy,
                &tonic::Status::internal("the service answered a session's policy with a tenant's"),
            );
        }
        Err(s) => return ctx.refused(Section::Policy, &s),
    };
    let server = Policy::server_default(&ctx.app.config.policy);
    let body = html! {
        section class="card" aria-labelledby="eff-h" {
            h2 id="eff-h" { "Effective policy of session " code { (id) } }
            (effective_table(&server, level, &effective, true))
            p { a href=(format!("/sessions/{id}")) { "Back to the session" } " " a href="/policy" { "The tenant policy" } }
        }
    };
    ctx.page(Section::Policy, "Session policy", body)
}

/// Each field's effective value, the level it comes from, the server
/// default and the tenant's value. The session page (`session`) marks each
/// source cell with `data-source`; the tenant page marks locked fields.
fn effective_table(
    server: &Policy,
    level: &PolicyOverrides,
    effective: &Policy,
    session: bool,
) -> Markup {
    html! {
        table {
            caption { "Each value, and the level it comes from" }
            thead { tr { th scope="col" { "Field" } th scope="col" { "Effective" } th scope="col" { "Source" } th scope="col" { "Server default" } th scope="col" { "Tenant" } } }
            tbody {
                @for (name, label, _, _) in FIELDS {
                    tr {
                        th scope="row" { (label) @if !session && level.locked { " " span class="badge" { "locked" } } }
                        td data-field=(name) { (shown(effective, name)) }
                        td data-source=[session.then_some(name)] { (source(server, level, effective, name)) }
                        td { (shown(server, name)) }
                        td { (level_shown(level, name).unwrap_or_else(|| "—".into())) }
                    }
                }
            }
        }
    }
}

fn render(
    ctx: &Ctx,
    status: StatusCode,
    level: &PolicyOverrides,
    form: &Submitted,
    refusal: Option<(String, String)>,
    saved: bool,
) -> Response {
    let server = Policy::server_default(&ctx.app.config.policy);
    let effective = policy::effective(&server, level, &PolicyOverrides::default());
    let can_edit = may(&ctx.signed.principal.roles, Rpc::SetPolicy);
    let (bad_field, bad_text) = refusal.clone().unwrap_or_default();
    let body = html! {
        @if saved { (views::notice("ok", "Saved. The new tenant policy applies to existing sessions at once.")) }
        @if let Some((field, text)) = &refusal {
            @if field.is_empty() || !FIELDS.iter().any(|f| f.0 == field) && field != "locked" {
                (views::notice("error", &format!("The server refused the change, nothing was saved: {text}")))
            } @else {
                (views::notice("error", "The server refused the change, nothing was saved. See the message next to the field."))
            }
        }
        @if level.locked {
            (views::notice("info", "This tenant policy is locked: every field can only be tightened, and the lock cannot be lifted."))
        }
        section class="card" aria-labelledby="eff-h" {
            h2 id="eff-h" { "Effective tenant policy" }
            (effective_table(&server, level, &effective, false))
        }
        @if can_edit {
            (edit_form(ctx, level, form, &bad_field, &bad_text))
        } @else {
            p { "Your roles may read the policy but not change it." }
        }
    };
    ctx.page_with(status, Section::Policy, "Policy", body)
}

fn edit_form(
    ctx: &Ctx,
    level: &PolicyOverrides,
    form: &Submitted,
    bad_field: &str,
    bad_text: &str,
) -> Markup {
    let err = |name: &str| -> Markup {
        html! {
            @if bad_field == name {
                p class="field-error" id=(format!("{name}-error")) role="alert" { (bad_text) }
            }
        }
    };
    let described = |name: &str| -> String {
        if bad_field == name {
            format!("{name}-help {name}-error")
        } else {
            format!("{name}-help")
        }
    };
    html! {
        section class="card" aria-labelledby="edit-h" {
            h2 id="edit-h" { "Change the tenant policy" }
            p class="help" { "Leave a field empty to defer to the server default. The server refuses any change that loosens a locked policy, and says which field." }
            form method="post" action="/policy" class="policy-form" {
                (views::csrf(&ctx.signed.csrf))
                @for (name, label, kind, help) in FIELDS {
                    div class=(if bad_field == *name { "field invalid" } else { "field" }) {
                        @match kind {
                            Kind::Flag => {
                                label for=(name) { (label) @if level.locked { " " span class="badge" { "locked: tighten only" } } }
                                select id=(name) name=(name) aria-describedby=(described(name)) {
                                    @for (v, text) in [("", "server default"), ("true", "yes"), ("false", "no")] {
                                        option value=(v) selected[get(form, name) == v] { (text) }
                                    }
                                }
                            }
                            Kind::Ceiling => {
                                fieldset aria-describedby=(described(name)) {
                                    legend { (label) @if level.locked { " " span class="badge" { "locked: tighten only" } } }
                                    @for (sub, sub_label) in CEILING {
                                        @let id = format!("exec_ceiling.{sub}");
                                        label for=(id) { (sub_label) }
                                        input id=(id) name=(id) inputmode="numeric" value=(get(form, &id));
                                    }
                                }
                            }
                            Kind::Redact => {
                                label for=(name) { (label) @if level.locked { " " span class="badge" { "locked: tighten only" } } }
                                textarea id=(name) name=(name) rows="3" aria-describedby=(described(name)) { (get(form, name)) }
                            }
                            _ => {
                                label for=(name) { (label) @if level.locked { " " span class="badge" { "locked: tighten only" } } }
                                input id=(name) name=(name) value=(get(form, name)) aria-describedby=(described(name)) inputmode=(if *kind == Kind::Quota { "numeric" } else { "text" });
                            }
                        }
                        p class="help" id=(format!("{name}-help")) { (help) }
                        (err(name))
                    }
                }
                div class=(if bad_field == "locked" { "field invalid" } else { "field" }) {
                    @if level.locked {
                        input type="hidden" name="locked" value="on";
                        p id="locked-help" { span class="badge" { "locked" } " The policy is locked; the lock stays." }
                    } @else {
                        label class="check" {
                            input type="checkbox" name="locked" aria-describedby="locked-help" checked[get(form, "locked") == "on"];
                            " Lock the policy (from then on it can only be tightened)"
                        }
                        p class="help" id="locked-help" { "A lock cannot be lifted from the console or the API." }
                    }
                    (err("locked"))
                }
                p { button type="submit" { "Save policy" } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_message_is_placed_next_to_its_field() {
        assert_eq!(
            field_of(
                "policy.retention: 10days would loosen the locked tenant policy (3days); a locked policy can only be tightened"
            ),
            Some("retention")
        );
        assert_eq!(
            field_of("policy.locked: false would loosen"),
            Some("locked")
        );
        assert_eq!(
            field_of("policy.exec_ceiling.timeout_ms: x"),
            Some("exec_ceiling")
        );
        assert_eq!(field_of("something else"), None);
    }

    #[test]
    fn the_form_reads_into_a_policy_and_bad_values_name_their_field() {
        let form: Submitted = vec![
            ("retention".into(), "3d".into()),
            ("max_payloads".into(), "10".into()),
            ("allow_exec".into(), "false".into()),
            ("redact".into(), "builtin:email\n\n".into()),
            ("locked".into(), "on".into()),
        ];
        let p = policy_from(&form).unwrap();
        assert_eq!(p.retention_ms, Some(3 * 86_400_000));
        assert_eq!(p.max_payloads, Some(10));
        assert_eq!(p.max_session_bytes, None);
        assert_eq!(p.exec_ceiling, None);
        assert_eq!(p.allow_exec, Some(false));
        assert_eq!(p.allow_download, None);
        assert_eq!(p.redact, vec!["builtin:email".to_owned()]);
        assert!(p.locked);
        let bad: Submitted = vec![("session_ttl".into(), "soon".into())];
        assert_eq!(policy_from(&bad).unwrap_err().0, "session_ttl");
    }

    #[test]
    fn sources_name_the_level_that_set_each_value() {
        let server = Policy {
            retention: Duration::from_secs(7 * 86400),
            session_ttl: Duration::from_secs(7 * 86400),
            max_session_bytes: 0,
            max_payload_bytes: 0,
            max_payloads: 0,
            delete_on_close: false,
            allow_download: true,
            allow_exec: true,
            compliance_can_read: false,
            exec_ceiling: ExecCeiling::CEILING,
            redact: vec![],
            locked: false,
        };
        let tenant = PolicyOverrides {
            retention_ms: Some(3 * 86_400_000),
            ..Default::default()
        };
        let eff = policy::effective(&server, &tenant, &PolicyOverrides::default());
        assert_eq!(source(&server, &tenant, &eff, "retention"), "tenant");
        assert_eq!(source(&server, &tenant, &eff, "session_ttl"), "server");
        let session = PolicyOverrides {
            allow_exec: Some(false),
            ..Default::default()
        };
        let s_eff = policy::effective(&server, &tenant, &session);
        assert_eq!(source(&server, &tenant, &s_eff, "allow_exec"), "session");
    }
}
