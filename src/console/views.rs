//! The page frame and the pieces every page shares, as maud templates.
//! maud escapes every interpolated value; the only unescaped markup is the
//! SVG the chart library draws from numbers and fixed captions.

use maud::{DOCTYPE, Markup, html};

use crate::auth::Role;
use crate::auth::access::Rpc;

/// The signed-in user as the page frame shows them.
pub struct Chrome<'a> {
    /// Principal ID.
    pub principal: &'a str,
    /// Tenant.
    pub tenant: &'a str,
    /// Roles.
    pub roles: &'a [Role],
    /// The CSRF token for the frame's own forms (sign-out).
    pub csrf: &'a str,
    /// The section of the current page, for `aria-current`.
    pub section: Section,
}

/// The console's sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The overview.
    Overview,
    /// The tenant policy.
    Policy,
    /// Sessions.
    Sessions,
    /// The audit log and receipts.
    Audit,
    /// Sign-in and error pages with no section.
    None,
}

/// True when one of `roles` may call `rpc` at all, by the server's own
/// access table: used only to leave out links and buttons the server would
/// refuse; the server still decides every call.
pub fn may(roles: &[Role], rpc: Rpc) -> bool {
    rpc.rule().any_roles().iter().any(|r| roles.contains(r))
}

/// The full page: head, skip link, navigation, the user, and `body`.
pub fn page(title: &str, chrome: Option<&Chrome<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Spillway console" }
                link rel="stylesheet" href="/static/console.css";
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                header class="top" {
                    span class="brand" { "Spillway" span class="brand-sub" { " compliance console" } }
                    @if let Some(c) = chrome {
                        (nav(c))
                        div class="who" {
                            span { (c.principal) " · tenant " (c.tenant) " · " (Role::names(c.roles)) }
                            form method="post" action="/signout" class="inline" {
                                input type="hidden" name="csrf" value=(c.csrf);
                                button type="submit" class="link" { "Sign out" }
                            }
                        }
                    }
                }
                main id="main" tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

fn nav(c: &Chrome<'_>) -> Markup {
    let items = [
        (Section::Overview, "/overview", "Overview", true),
        (
            Section::Policy,
            "/policy",
            "Policy",
            may(c.roles, Rpc::SetPolicy) || c.roles.contains(&Role::Auditor),
        ),
        (
            Section::Sessions,
            "/sessions",
            "Sessions",
            may(c.roles, Rpc::ListSessions),
        ),
        (
            Section::Audit,
            "/audit",
            "Audit",
            may(c.roles, Rpc::QueryAudit),
        ),
    ];
    html! {
        nav aria-label="Console sections" {
            ul {
                @for (section, href, name, shown) in items {
                    @if shown {
                        li {
                            @if section == c.section {
                                a href=(href) aria-current="page" { (name) }
                            } @else {
                                a href=(href) { (name) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A notice box: `kind` is `ok`, `info` or `error` (errors are announced).
pub fn notice(kind: &str, text: &str) -> Markup {
    html! {
        @if kind == "error" {
            p class=(format!("notice notice-{kind}")) role="alert" { (text) }
        } @else {
            p class=(format!("notice notice-{kind}")) role="status" { (text) }
        }
    }
}

/// A hidden CSRF field for a form.
pub fn csrf(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

/// Bytes in the largest fitting binary unit.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC to the second; `—` before it.
pub fn time(ms: crate::clock::Millis) -> String {
    let Ok(ms) = u64::try_from(ms) else {
        return "—".into();
    };
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// `path` with the filters of a list as its query (their non-empty fields,
/// in field order), on page `page`: `filters` is a struct of string fields
/// with a `page` field.
pub fn filters_url<F: serde::Serialize>(path: &str, filters: &F, page: &str) -> String {
    let qs = serde_urlencoded::to_string(filters).unwrap_or_default();
    let mut pairs: Vec<(String, String)> = serde_urlencoded::from_str(&qs).unwrap_or_default();
    if let Some((_, v)) = pairs.iter_mut().find(|(k, _)| k == "page") {
        page.clone_into(v);
    }
    pairs.retain(|(_, v)| !v.is_empty());
    let qs = serde_urlencoded::to_string(pairs).unwrap_or_default();
    if qs.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{qs}")
    }
}

/// Cuts `s` to at most `max` chars, saying so.
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}… ({} more chars)", &s[..at], s[at..].chars().count()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frame of principal `a` of tenant `t` with these roles.
    fn chrome(roles: &[Role], section: Section) -> Chrome<'_> {
        Chrome {
            principal: "a",
            tenant: "t",
            roles,
            csrf: "c",
            section,
        }
    }

    #[test]
    fn interpolated_text_is_escaped_and_never_markup() {
        let chrome = Chrome {
            principal: "<script>alert(1)</script>",
            tenant: "\"><img src=x onerror=alert(1)>",
            csrf: "\"><b>",
            ..chrome(&[Role::Compliance], Section::Overview)
        };
        let out = page("<i>t</i>", Some(&chrome), html! { p { "x" } }).into_string();
        assert!(!out.contains("<script>alert"), "{out}");
        assert!(!out.contains("<img src=x"), "{out}");
        assert!(!out.contains("<i>t</i>"), "{out}");
        assert!(out.contains("&lt;script&gt;"), "{out}");
    }

    #[test]
    fn only_sections_the_access_table_allows_are_linked() {
        let agent = chrome(&[Role::Agent], Section::Sessions);
        let out = page("x", Some(&agent), html! {}).into_string();
        assert!(out.contains("href=\"/sessions\""));
        assert!(!out.contains("href=\"/audit\""));
        assert!(!out.contains("href=\"/policy\""));
    }

    #[test]
    fn sizes_and_cuts_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(cut("abcdef", 3), "abc… (3 more chars)");
        assert_eq!(cut("ab", 3), "ab");
    }
}
