//! The `spillway` binary: parses flags, then either serves or runs a client
//! subcommand.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Parser;
use spillway::cli::{Cli, Command};
use spillway::config::{Config, EngineKind, Overrides};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        // Before any thread exists, so every thread shares the few arenas.
        spillway::server::bound_malloc_arenas();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        Command::Mcp(cmd) => {
            let conn = spillway::mcp::Connection {
                addr: cli.addr,
                token: cli.token,
                tls: spillway::client::TlsFiles {
                    ca: cli.tls_ca,
                    cert: cli.tls_cert,
                    key: cli.tls_key,
                },
            };
            runtime.block_on(spillway::mcp::run(cmd, conn))
        }
        _ => runtime.block_on(spillway::cli::run_client(cli)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `spillway read … | head`: the reader went away, which is not an error.
            let closed = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if closed {
                return ExitCode::SUCCESS;
            }
            let text = match e.downcast_ref::<tonic::Status>() {
                Some(s) => format!("error: {:?}: {}", s.code(), s.message()),
                None => format!("error: {e:#}"),
            };
            eprintln!("{}", spillway::cli::escape_controls(&text));
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: spillway::cli::ServeArgs) -> anyhow::Result<()> {
    spillway::telemetry::init();
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let engine = match args.engine.as_deref() {
        None => None,
        Some("redb") => Some(EngineKind::Redb),
        Some("sled") => Some(EngineKind::Sled),
        Some("postgres") => Some(EngineKind::Postgres),
        Some(other) => anyhow::bail!(
            "--engine {other:?} is not an engine; use redb (the default), sled, or postgres (with store.postgres_url)"
        ),
    };
    let flags = Overrides {
        listen: args.listen,
        data_dir: args.data_dir,
        engine,
    };
    let config = Config::load(args.config.as_deref(), &env, &flags)?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    spillway::server::run(config, listener, spillway::shutdown::signal()).await?;
    Ok(())
}
