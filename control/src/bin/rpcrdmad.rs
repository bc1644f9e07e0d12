//! `rpcrdmad`: the RPC-over-RDMA daemon.
#![forbid(unsafe_code)]

use clap::Parser;
use rpcrdma_config::{LogFormat, LogLevel};
use rpcrdma_control::daemon::{self, Daemon, Options};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;
use tracing_subscriber::reload;

/// Exit status for a configuration with errors.
const EXIT_CONFIG: u8 = 1;
/// Exit status for a start-up failure (device, memlock, core, socket in use).
const EXIT_START: u8 = 3;

/// RPC-over-RDMA daemon: carries ONC RPC for local apps (shared-memory rings) over RDMA.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML; see config/CONFIG.md).
    #[arg(short, long, default_value = "/etc/rpcrdmad/rpcrdmad.toml")]
    config: PathBuf,
    /// Check FILE, print every finding with file:line:column, and exit (1 if it has errors).
    #[arg(long, value_name = "FILE")]
    check_config: Option<PathBuf>,
    /// How long SIGTERM/SIGINT waits for RPCs in flight before closing connections.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    drain_timeout_ms: u64,
    /// Override daemon.log-format.
    #[arg(long, value_enum)]
    log_format: Option<Format>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Format {
    Human,
    Json,
}

fn level(l: LogLevel) -> LevelFilter {
    match l {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

fn check_config(path: &PathBuf) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let report = rpcrdma_config::check(
        &text,
        &path.display().to_string(),
        &rpcrdma_config::HostFacts::detect(),
    );
    for d in report.diagnostics.iter() {
        eprintln!("{d}");
    }
    if report.is_ok() {
        println!("{}: ok", path.display());
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "{}: {} error(s)",
            path.display(),
            report.diagnostics.error_count()
        );
        ExitCode::from(EXIT_CONFIG)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(p) = &cli.check_config {
        return check_config(p);
    }
    let (cfg, warnings) = match daemon::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("rpcrdmad: the configuration has errors; nothing started");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let (filter, handle) = reload::Layer::new(level(cfg.daemon.log_level));
    let json = match cli.log_format {
        Some(Format::Json) => true,
        Some(Format::Human) => false,
        None => cfg.daemon.log_format == LogFormat::Json,
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = if json {
        fmt.json().flatten_event(true).boxed()
    } else {
        fmt.boxed()
    };
    tracing_subscriber::registry().with(filter).with(fmt).init();
    for w in warnings.iter() {
        tracing::warn!("{w}");
    }
    let opts = Options {
        config_path: cli.config.clone(),
        drain_timeout: Duration::from_millis(cli.drain_timeout_ms),
        set_log_level: Box::new(move |l| {
            let _ = handle.modify(|f| *f = level(l));
        }),
    };
    let started = Daemon::start(cfg, opts).and_then(Daemon::run);
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "rpcrdmad cannot run");
            eprintln!("rpcrdmad: error: {e}");
            ExitCode::from(EXIT_START)
        }
    }
}
