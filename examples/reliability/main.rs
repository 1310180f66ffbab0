//! The reliability suite: runs the real `spillway` binary on loopback
//! through eight scenarios and reports a table, each scenario PASS, FAIL or
//! SKIPPED with its figures.
//!
//! ```text
//! make reliability                 # release build, full suite, RELIABILITY.md
//! make reliability-smoke           # what CI runs: debug build, --smoke
//! cargo run --release --example reliability -- --smoke
//! cargo run --release --example reliability -- --scenario crash --out /tmp/r.md
//! cargo run --release --example reliability -- --smoke --scenario hostile --attacks flood
//! cargo run --release --example reliability -- --scenario tenants --tenant-attacks socket-floods
//! ```
//!
//! Scenarios: `load`, `hostile`, `crash`, `disk-full`, `slow-clients`,
//! `protocol-abuse`, `tenants` (one tenant attacks, another must not
//! notice), `fleet` (three replicas on Postgres and SeaweedFS: kill -9 of
//! replicas, Postgres restarted, S3 stopped, all under load). Every loop is bounded by a count or a deadline, and
//! every server listens on 127.0.0.1. The disk-full scenario mounts a
//! 64 MiB tmpfs (or a loop-mounted ext4 image), so it needs root; without
//! it, it reports SKIPPED with the reason.

mod abuse;
mod crash;
mod diskfull;
mod fleet;
mod harness;
mod load;
mod tenants;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;

use harness::{Opts, Outcome, Verdict};

const SCENARIOS: &[&str] = &[
    "load",
    "hostile",
    "crash",
    "disk-full",
    "slow-clients",
    "protocol-abuse",
    "tenants",
    "fleet",
];

#[derive(Parser)]
#[command(about = "Spillway's reliability suite against the real binary")]
struct Args {
    /// Short durations and fewer rounds, for CI (under 5 minutes).
    #[arg(long)]
    smoke: bool,
    /// Run only these scenarios (repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// Write the markdown report here (it is printed either way).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The server binary (default: `spillway` of the same build profile as
    /// this program, e.g. target/release/spillway).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Metadata engine: redb or sled (the fleet scenario always uses
    /// Postgres).
    #[arg(long, default_value = "redb")]
    engine: String,
    /// Seed for every random choice (default: random; printed to replay).
    #[arg(long)]
    seed: Option<u64>,
    /// The hostile scenario's attacks (repeat or comma-separate; default:
    /// all three at once). One at a time tells which one hurts neighbours.
    #[arg(long, value_delimiter = ',', default_values_t = load::ATTACKS.map(String::from))]
    attacks: Vec<String>,
    /// The tenants scenario's attacks (repeat or comma-separate; default:
    /// all five, one after the other).
    #[arg(long, value_delimiter = ',', default_values_t = tenants::ATTACKS.map(String::from))]
    tenant_attacks: Vec<String>,
    /// Where the servers' temporary data dirs go.
    #[arg(long, default_value = "target/reliability")]
    work_dir: PathBuf,
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or("?".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / (1 << 20) as f64)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    format!("{cpu}, {cores} cores, {mem} RAM, Linux {kernel}")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn report(
    args: &Args,
    opts: &Opts,
    outcomes: &[Outcome],
    total: Duration,
    load_before: &str,
) -> String {
    let mut cmd = String::from(if cfg!(debug_assertions) {
        "cargo run --example reliability --"
    } else {
        "cargo run --release --example reliability --"
    });
    if args.smoke {
        cmd.push_str(" --smoke");
    }
    if !args.scenario.is_empty() {
        cmd.push_str(&format!(" --scenario {}", args.scenario.join(",")));
    }
    if opts.attacks.len() != load::ATTACKS.len() {
        cmd.push_str(&format!(" --attacks {}", opts.attacks.join(",")));
    }
    cmd.push_str(&format!(" --engine {} --seed {}", opts.engine, opts.seed));
    let mut md = format!(
        "# Reliability\n\n`{cmd}` ({} run, {:.0} s in all), against `{}` as a child process on 127.0.0.1.\n\n\
         Machine: {}. Load average {load_before} before, {} after; the machine is shared, so latencies carry other work's noise.\n\n\
         | scenario | result | figures |\n| --- | --- | --- |\n",
        if opts.smoke { "smoke" } else { "full" },
        total.as_secs_f64(),
        opts.binary.display(),
        machine(),
        loadavg(),
    );
    for o in outcomes {
        let verdict = match o.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "**FAIL**",
            Verdict::Skipped => "SKIPPED",
        };
        md.push_str(&format!(
            "| {} | {verdict} | {} |\n",
            o.name,
            o.figures.join("; ").replace('|', "\\|")
        ));
    }
    for o in outcomes {
        md.push_str(&format!(
            "\n## {} ({:.0} s)\n\n",
            o.name,
            o.elapsed.as_secs_f64()
        ));
        for n in &o.notes {
            md.push_str(&format!("- {n}\n"));
        }
        md.push_str(&o.detail);
    }
    md
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    for a in &args.attacks {
        anyhow::ensure!(
            load::ATTACKS.contains(&a.as_str()),
            "unknown attack {a:?}; the attacks are {}",
            load::ATTACKS.join(", ")
        );
    }
    for a in &args.tenant_attacks {
        anyhow::ensure!(
            tenants::ATTACKS.contains(&a.as_str()),
            "unknown tenant attack {a:?}; the attacks are {}",
            tenants::ATTACKS.join(", ")
        );
    }
    for s in &args.scenario {
        anyhow::ensure!(
            SCENARIOS.contains(&s.as_str()),
            "unknown scenario {s:?}; the scenarios are {}",
            SCENARIOS.join(", ")
        );
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // This program is <target>/<profile>/examples/reliability.
    let sibling = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("spillway"));
    let binary = match (&args.binary, sibling) {
        (Some(b), _) => b.clone(),
        (None, Some(s)) => s,
        (None, None) => anyhow::bail!("cannot tell where the spillway binary is; pass --binary"),
    };
    anyhow::ensure!(
        binary.exists(),
        "{} does not exist; build it first with `cargo build --bin spillway` in the same profile (make reliability does)",
        binary.display()
    );
    std::fs::create_dir_all(&args.work_dir)?;
    let opts = Opts {
        binary,
        images_dir: root.join("sandbox-images"),
        cache_dir: root
            .join("sandbox-images")
            .join("build")
            .join("compile-cache"),
        engine: args.engine.clone(),
        smoke: args.smoke,
        work_dir: std::fs::canonicalize(&args.work_dir)?,
        seed: args.seed.unwrap_or_else(rand::random),
        attacks: args.attacks.clone(),
        tenant_attacks: args.tenant_attacks.clone(),
    };
    eprintln!("reliability: seed {} (--seed to replay)", opts.seed);
    let load_before = loadavg();
    let started = Instant::now();
    let wanted = |name: &str| args.scenario.is_empty() || args.scenario.iter().any(|s| s == name);
    let mut outcomes = Vec::new();
    for &name in SCENARIOS {
        if !wanted(name) {
            continue;
        }
        eprintln!("reliability: {name} ...");
        let t = Instant::now();
        let result = match name {
            "load" => load::load(&opts).await,
            "hostile" => load::hostile(&opts).await,
            "crash" => crash::crash(&opts).await,
            "disk-full" => diskfull::diskfull(&opts).await,
            "slow-clients" => abuse::slow_clients(&opts).await,
            "protocol-abuse" => abuse::protocol_abuse(&opts).await,
            "tenants" => tenants::tenants(&opts).await,
            "fleet" => fleet::fleet(&opts).await,
            _ => unreachable!("checked above"),
        };
        let mut outcome = result.unwrap_or_else(|e| {
            let mut o = Outcome::new(name);
            o.check(false, format!("the scenario could not run: {e:#}"));
            o
        });
        outcome.elapsed = t.elapsed();
        eprintln!(
            "reliability: {name} {:?} in {:.0} s",
            outcome.verdict,
            outcome.elapsed.as_secs_f64()
        );
        outcomes.push(outcome);
        // Written after every scenario, so an interrupted run keeps the
        // scenarios it finished.
        if let Some(out) = &args.out {
            let md = report(&args, &opts, &outcomes, started.elapsed(), &load_before);
            std::fs::write(out, md)?;
        }
    }
    let md = report(&args, &opts, &outcomes, started.elapsed(), &load_before);
    println!("{md}");
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| o.verdict == Verdict::Fail)
        .map(|o| o.name)
        .collect();
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}
