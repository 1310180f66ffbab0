//! `spillway policy get|set` and `spillway hold on|off`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::proto::{self, get_policy_request::Target};

/// `spillway policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Show a tenant's policy as set, or a session's effective policy.
    Get {
        /// The tenant whose policy to show (default: your own).
        #[arg(long, conflicts_with = "session")]
        tenant: Option<String>,
        /// The session whose effective policy to show.
        #[arg(long)]
        session: Option<String>,
    },
    /// Replace a tenant's policy. Fields not given defer to the server
    /// default; a locked policy can only be tightened.
    Set(SetArgs),
}

/// `spillway policy set`.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The tenant (default: your own).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start from this policy, in proto3 JSON; the flags below override it.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Maximum payload age, e.g. `7d`, `12h`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention: Option<std::time::Duration>,
    /// Maximum session age, e.g. `7d`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub session_ttl: Option<std::time::Duration>,
    /// Byte quota of a session.
    #[arg(long)]
    pub max_session_bytes: Option<u64>,
    /// Largest payload, in bytes.
    #[arg(long)]
    pub max_payload_bytes: Option<u64>,
    /// Payload count quota of a session.
    #[arg(long)]
    pub max_payloads: Option<u64>,
    /// Delete a session's payloads when it is closed.
    #[arg(long)]
    pub delete_on_close: bool,
    /// Forbid downloads (and Reads beyond the preview size).
    #[arg(long)]
    pub no_download: bool,
    /// Forbid code mode (Exec).
    #[arg(long)]
    pub no_exec: bool,
    /// Let compliance principals read content.
    #[arg(long)]
    pub compliance_can_read: bool,
    /// Exec ceiling: wall-clock milliseconds.
    #[arg(long)]
    pub exec_timeout_ms: Option<u64>,
    /// Exec ceiling: memory bytes.
    #[arg(long)]
    pub exec_memory_bytes: Option<u64>,
    /// Exec ceiling: stdout bytes kept.
    #[arg(long)]
    pub exec_max_stdout_bytes: Option<u64>,
    /// A redaction rule (`builtin:email`, or a regex); repeat for more.
    #[arg(long = "redact")]
    pub redact: Vec<String>,
    /// Lock the policy: afterwards it can only be tightened.
    #[arg(long)]
    pub locked: bool,
}

/// `spillway hold on|off`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Place (`on`) or lift (`off`) the hold.
    pub state: HoldState,
    /// The session.
    #[arg(long)]
    pub session: String,
    /// Why (required to place a hold).
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// On or off.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HoldState {
    /// Place the hold.
    On,
    /// Lift it.
    Off,
}

/// The GetPolicy request for `policy get`.
pub fn get_request(tenant: Option<String>, session: Option<String>) -> proto::GetPolicyRequest {
    proto::GetPolicyRequest {
        target: match (tenant, session) {
            (Some(t), _) => Some(Target::Tenant(t)),
            (None, Some(s)) => Some(Target::SessionId(s)),
            (None, None) => None,
        },
    }
}

/// The SetPolicy request for `policy set`.
pub fn set_request(a: SetArgs) -> anyhow::Result<proto::SetPolicyRequest> {
    let mut p = match &a.file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<proto::Policy>(&text)
                .with_context(|| format!("{} is not a Policy in proto3 JSON", path.display()))?
        }
        None => proto::Policy::default(),
    };
    let duration = |d: std::time::Duration| pbjson_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    };
    if let Some(d) = a.retention {
        p.retention = Some(duration(d));
    }
    if let Some(d) = a.session_ttl {
        p.session_ttl = Some(duration(d));
    }
    if let Some(n) = a.max_session_bytes {
        p.max_session_bytes = n;
    }
    if let Some(n) = a.max_payload_bytes {
        p.max_payload_bytes = n;
    }
    if let Some(n) = a.max_payloads {
        p.max_payloads = n;
    }
    if a.delete_on_close {
        p.delete_on_close = Some(true);
    }
    if a.no_download {
        p.allow_download = Some(false);
    }
    if a.no_exec {
        p.allow_exec = Some(false);
    }
    if a.compliance_can_read {
        p.compliance_can_read = Some(true);
    }
    if a.exec_timeout_ms.is_some()
        || a.exec_memory_bytes.is_some()
        || a.exec_max_stdout_bytes.is_some()
    {
        let c = p.exec_ceiling.get_or_insert_with(Default::default);
        if let Some(n) = a.exec_timeout_ms {
            c.timeout_ms = n;
        }
        if let Some(n) = a.exec_memory_bytes {
            c.memory_bytes = n;
        }
        if let Some(n) = a.exec_max_stdout_bytes {
            c.max_stdout_bytes = n;
        }
    }
    p.redact.extend(a.redact);
    if a.locked {
        p.locked = true;
    }
    Ok(proto::SetPolicyRequest {
        tenant: a.tenant.unwrap_or_default(),
        policy: Some(p),
    })
}

/// The SetLegalHold request for `hold`.
pub fn hold_request(a: HoldArgs) -> proto::SetLegalHoldRequest {
    proto::SetLegalHoldRequest {
        session_id: a.session,
        hold: matches!(a.state, HoldState::On),
        reason: a.reason,
    }
}

/// A policy, one field a line; what a tenant policy leaves unset shows as
/// `(server default)`.
pub fn show(p: &proto::Policy) {
    const DEFAULT: &str = "(server default)";
    let duration = |d: &Option<pbjson_types::Duration>| match d {
        Some(d) => humantime::format_duration(std::time::Duration::new(
            d.seconds.max(0) as u64,
            d.nanos.max(0) as u32,
        ))
        .to_string(),
        None => DEFAULT.into(),
    };
    let quota = |n: u64| {
        if n == 0 {
            "none".to_owned()
        } else {
            n.to_string()
        }
    };
    let flag = |b: Option<bool>| match b {
        Some(true) => "yes",
        Some(false) => "no",
        None => DEFAULT,
    };
    println!("retention            {}", duration(&p.retention));
    println!("session_ttl          {}", duration(&p.session_ttl));
    println!("max_session_bytes    {}", quota(p.max_session_bytes));
    println!("max_payload_bytes    {}", quota(p.max_payload_bytes));
    println!("max_payloads         {}", quota(p.max_payloads));
    println!("delete_on_close      {}", flag(p.delete_on_close));
    println!("allow_download       {}", flag(p.allow_download));
    println!("allow_exec           {}", flag(p.allow_exec));
    println!("compliance_can_read  {}", flag(p.compliance_can_read));
    match &p.exec_ceiling {
        Some(c) => println!(
            "exec_ceiling         timeout_ms {}, memory_bytes {}, max_stdout_bytes {}",
            quota(c.timeout_ms),
            quota(c.memory_bytes),
            quota(c.max_stdout_bytes)
        ),
        None => println!("exec_ceiling         {DEFAULT}"),
    }
    if p.redact.is_empty() {
        println!("redact               none");
    } else {
        println!("redact               {}", p.redact.join(" "));
    }
    println!(
        "locked               {}",
        if p.locked { "yes" } else { "no" }
    );
}
