//! The overview: storage and payloads over time, what expires when, active
//! holds, and the audit chain's last verification. Computed from
//! [`Service::usage_history`](crate::service::Service::usage_history) (the
//! daily samples the reaper keeps, so deleted sessions stay in the past),
//! [`Service::list_sessions`](crate::service::Service::list_sessions) pages
//! (bounded by `console.overview_max_sessions`) and
//! [`Service::verify_audit`](crate::service::Service::verify_audit).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::Response;
use maud::{PreEscaped, html};

use super::charts;
use super::ctx::{Ctx, Verification, status};
use super::views::{self, Section, may};
use crate::auth::access::{self, Rpc};
use crate::service::StateFilter;
use crate::store::{SessionRecord, SessionState, UsageSample};

/// A verification older than this is redone when the overview is shown.
const VERIFY_STALE: Duration = Duration::from_secs(10 * 60);
/// Days the history charts span.
const DAYS: i64 = 30;
const DAY_SECS: i64 = 86_400;

/// What the charts need of one session.
struct Row {
    expires: i64,
    bytes: u64,
    payloads: u64,
}

/// The overview's figures.
#[derive(Default)]
struct Figures {
    sessions: u64,
    open: u64,
    bytes: u64,
    payloads: u64,
    holds: Vec<SessionRecord>,
    rows: Vec<Row>,
    truncated: bool,
    /// The tenant's daily samples, oldest first; `None` when the caller's
    /// roles do not see tenant-wide figures.
    samples: Option<Vec<UsageSample>>,
}

async fn figures(ctx: &Ctx) -> Result<Figures, tonic::Status> {
    let (service, p) = ctx.service();
    let mut f = Figures::default();
    let mut token = String::new();
    loop {
        let page = service
            .list_sessions(p, StateFilter::Any, &token, 1000)
            .await
            .map_err(status)?;
        for (s, e) in page.items {
            f.sessions += 1;
            f.open += u64::from(s.state == SessionState::Open);
            f.bytes += s.usage_bytes;
            f.payloads += s.usage_payloads;
            f.rows.push(Row {
                expires: super::sessions::expires_ms(&s, &e) / 1000,
                bytes: s.usage_bytes,
                payloads: s.usage_payloads,
            });
            if s.legal_hold {
                f.holds.push(s);
            }
        }
        token = page.next_token;
        if token.is_empty() {
            break;
        }
        if f.rows.len() >= ctx.app.overview_max_sessions {
            f.truncated = true;
            break;
        }
    }
    // Asked only of a principal the service would answer (a refusal would
    // be audited at every look at the page).
    f.samples = if access::sees_whole_tenant(p) {
        Some(service.usage_history(p, DAYS + 1).await.map_err(status)?)
    } else {
        None
    };
    Ok(f)
}

/// (days ago as a negative number, bytes, payloads) of each day of the last
/// [`DAYS`] that has a sample; with `live` (the figures counted just now),
/// today's point is those figures rather than the last hourly sample.
fn history(samples: &[UsageSample], now: i64, live: Option<(u64, u64)>) -> Vec<(i32, u64, u64)> {
    let today = now.div_euclid(DAY_SECS);
    let mut h: Vec<(i32, u64, u64)> = samples
        .iter()
        .filter(|s| (today - DAYS..=today).contains(&s.day))
        .filter(|s| live.is_none() || s.day != today)
        .map(|s| ((s.day - today) as i32, s.bytes, s.payloads))
        .collect();
    if let Some((bytes, payloads)) = live {
        h.push((0, bytes, payloads));
    }
    h
}

/// (caption, sessions, payloads, bytes) expiring within each window.
fn expiring(rows: &[Row], now: i64) -> Vec<(&'static str, u64, u64, u64)> {
    [("24 hours", 1), ("7 days", 7), ("30 days", 30)]
        .into_iter()
        .map(|(name, days)| {
            let until = now + days * DAY_SECS;
            rows.iter()
                .filter(|r| r.expires > 0 && r.expires <= until)
                .fold((name, 0, 0, 0), |(n, s, p, b), r| {
                    (n, s + 1, p + r.payloads, b + r.bytes)
                })
        })
        .collect()
}

/// Verifies the tenant's chain when the last check is missing or stale.
async fn verification(ctx: &Ctx) -> Result<Option<Verification>, tonic::Status> {
    if !may(&ctx.signed.principal.roles, Rpc::VerifyAudit) {
        return Ok(None);
    }
    if let Some(v) = super::audit::last_verification(ctx).await?
        && v.at.elapsed().unwrap_or_default() < VERIFY_STALE
    {
        return Ok(Some(v));
    }
    super::audit::run_verify(ctx).await.map(Some)
}

/// GET /overview.
pub async fn overview(ctx: Ctx) -> Response {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let f = if may(&ctx.signed.principal.roles, Rpc::ListSessions) {
        match figures(&ctx).await {
            Ok(f) => Some(f),
            Err(s) => return ctx.refused(Section::Overview, &s),
        }
    } else {
        None
    };
    let verified = match verification(&ctx).await {
        Ok(v) => v,
        Err(s) => return ctx.refused(Section::Overview, &s),
    };
    let body = html! {
        @if let Some(f) = &f {
            (storage(f, now))
            (expiry(f, now))
            (holds(f))
        } @else {
            (views::notice("info", "Your roles do not list sessions, so there are no storage figures to show. The audit pages are open to you."))
        }
        @if may(&ctx.signed.principal.roles, Rpc::VerifyAudit) {
            (audit_status(verified.as_ref(), &ctx.signed.csrf))
        }
    };
    ctx.page(Section::Overview, "Overview", body)
}

fn storage(f: &Figures, now: i64) -> maud::Markup {
    // Today's point is what was just counted, when that count is the
    // whole tenant's (the caller sees it all, and no session was left out).
    let live = (f.samples.is_some() && !f.truncated).then_some((f.bytes, f.payloads));
    let h = history(f.samples.as_deref().unwrap_or_default(), now, live);
    let (scale, unit) = unit_for(h.iter().map(|p| p.1).max().unwrap_or(0));
    let scaled: Vec<(i32, f64)> = h.iter().map(|(d, b, _)| (*d, *b as f64 / scale)).collect();
    let counts: Vec<(i32, f64)> = h.iter().map(|(d, _, p)| (*d, *p as f64)).collect();
    let bytes_svg = charts::daily_line(&scaled, unit, false);
    let count_svg = charts::daily_line(&counts, "payloads stored", true);
    html! {
        section aria-labelledby="storage-h" class="card" {
            h2 id="storage-h" { "Storage" }
            p class="figures" {
                span { strong { (f.sessions) } " sessions (" (f.open) " open)" }
                span { strong { (views::bytes(f.bytes)) } " stored" }
                span { strong { (f.payloads) } " payloads" }
            }
            @if f.truncated {
                (views::notice("info", &format!("Only the first {} sessions are counted (console.overview_max_sessions).", f.rows.len())))
            }
            @if f.samples.is_none() {
                p class="help" { "The history is tenant-wide, and your roles see only your own sessions." }
            } @else if h.len() < 2 {
                p class="help" { "The history starts when the server first sampled this tenant (hourly, one figure a day); until then the chart shows today's figures only." }
            } @else {
                p class="help" { "What the tenant stored at the end of each of the last 30 days (today: counted just now). Deleted sessions stay in the days they were stored." }
            }
            div class="charts" {
                figure {
                    @match &bytes_svg { Ok(svg) => { div role="img" aria-label="Line chart of bytes stored over the last 30 days" { (PreEscaped(svg)) } }, Err(e) => { (views::notice("error", &e.to_string())) } }
                    figcaption { "Bytes stored" }
                }
                figure {
                    @match &count_svg { Ok(svg) => { div role="img" aria-label="Line chart of payloads stored over the last 30 days" { (PreEscaped(svg)) } }, Err(e) => { (views::notice("error", &e.to_string())) } }
                    figcaption { "Payloads stored" }
                }
            }
            details {
                summary { "The figures as a table" }
                table {
                    caption { "Stored bytes and payloads, by days ago" }
                    thead { tr { th scope="col" { "Days ago" } th scope="col" { "Bytes" } th scope="col" { "Payloads" } } }
                    tbody {
                        @for (d, b, p) in h.iter().rev() {
                            tr { td { (-d) } td { (views::bytes(*b)) } td { (p) } }
                        }
                    }
                }
            }
        }
    }
}

/// The binary unit that suits a largest value of `max` bytes.
fn unit_for(max: u64) -> (f64, &'static str) {
    match max {
        m if m >= 1 << 30 => ((1u64 << 30) as f64, "GiB stored"),
        m if m >= 1 << 20 => ((1u64 << 20) as f64, "MiB stored"),
        m if m >= 1 << 10 => (1024.0, "KiB stored"),
        _ => (1.0, "bytes stored"),
    }
}

fn expiry(f: &Figures, now: i64) -> maud::Markup {
    let e = expiring(&f.rows, now);
    let bars: Vec<(&str, u64)> = e.iter().map(|(n, _, p, _)| (*n, *p)).collect();
    let svg = charts::bars(&bars, "payloads");
    html! {
        section aria-labelledby="expiry-h" class="card" {
            h2 id="expiry-h" { "Expiring" }
            p class="help" { "Payloads in sessions that expire within each window (a payload may go sooner, by its retention). Held sessions wait for their hold." }
            figure {
                @match &svg { Ok(svg) => { div role="img" aria-label="Bar chart of payloads expiring within 24 hours, 7 days and 30 days" { (PreEscaped(svg)) } }, Err(e) => { (views::notice("error", &e.to_string())) } }
                figcaption { "Payloads expiring" }
            }
            table {
                caption { "Expiring within" }
                thead { tr { th scope="col" { "Window" } th scope="col" { "Sessions" } th scope="col" { "Payloads" } th scope="col" { "Bytes" } } }
                tbody {
                    @for (n, s, p, b) in &e {
                        tr { th scope="row" { (n) } td { (s) } td { (p) } td { (views::bytes(*b)) } }
                    }
                }
            }
        }
    }
}

fn holds(f: &Figures) -> maud::Markup {
    html! {
        section aria-labelledby="holds-h" class="card" {
            h2 id="holds-h" { "Active legal holds" }
            @if f.holds.is_empty() {
                p { "No session is under a legal hold." }
            } @else {
                table {
                    caption { (f.holds.len()) " sessions held" }
                    thead { tr { th scope="col" { "Session" } th scope="col" { "Label" } th scope="col" { "Reason" } th scope="col" { "Placed by" } } }
                    tbody {
                        @for s in &f.holds {
                            @let (by, reason) = s.hold.as_ref().map_or(("", ""), |h| (h.by.as_str(), h.reason.as_str()));
                            tr {
                                td { a href=(format!("/sessions/{}", s.id)) { code { (s.id) } } }
                                td { (views::cut(&s.label, 80)) }
                                td { (views::cut(reason, 200)) }
                                td { (by) }
                            }
                        }
                    }
                }
            }
            p { a href="/sessions?hold=yes" { "All held sessions" } }
        }
    }
}

fn audit_status(v: Option<&Verification>, csrf: &str) -> maud::Markup {
    html! {
        section aria-labelledby="chain-h" class="card" {
            h2 id="chain-h" { "Audit chain" }
            (super::audit::verification_notice(v))
            form method="post" action="/audit/verify" {
                (views::csrf(csrf))
                input type="hidden" name="back" value="overview";
                button type="submit" { "Verify now" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(expires: i64, bytes: u64, payloads: u64) -> Row {
        Row {
            expires,
            bytes,
            payloads,
        }
    }

    fn sample(day: i64, bytes: u64, payloads: u64) -> UsageSample {
        UsageSample {
            day,
            at_ms: day * DAY_SECS * 1000,
            bytes,
            payloads,
            sessions: 1,
        }
    }

    #[test]
    fn history_places_each_sample_on_its_day_and_drops_older_ones() {
        let now = 100 * DAY_SECS + 5;
        let samples = [
            sample(40, 7, 7),
            sample(70, 10, 1),
            sample(98, 5, 2),
            sample(100, 15, 3),
        ];
        assert_eq!(
            history(&samples, now, None),
            vec![(-30, 10, 1), (-2, 5, 2), (0, 15, 3)]
        );
    }

    #[test]
    fn todays_point_is_the_live_count_when_there_is_one() {
        let now = 100 * DAY_SECS + 5;
        let samples = [sample(98, 5, 2), sample(100, 15, 3)];
        assert_eq!(
            history(&samples, now, Some((20, 4))),
            vec![(-2, 5, 2), (0, 20, 4)]
        );
        assert_eq!(history(&[], now, Some((20, 4))), vec![(0, 20, 4)]);
    }

    #[test]
    fn expiry_windows_include_the_shorter_ones() {
        let now = 0;
        let rows = [
            row(3600, 1, 1),
            row(3 * DAY_SECS, 2, 2),
            row(20 * DAY_SECS, 4, 4),
            row(90 * DAY_SECS, 8, 8),
        ];
        let e = expiring(&rows, now);
        assert_eq!(e[0], ("24 hours", 1, 1, 1));
        assert_eq!(e[1], ("7 days", 2, 3, 3));
        assert_eq!(e[2], ("30 days", 3, 7, 7));
    }
}
