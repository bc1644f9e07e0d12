//! Latency and throughput benchmarks of RDMATEST through rpcrdmad's shared-memory API
//! (`rpcrdma-bench`; see `README.md` next to this crate's `Cargo.toml`).
//!
//! - [`case`]: procedure × transfer mode × size, and parsing/formatting of sizes and durations.
//! - [`workload`]: builds each case's calls and checks every reply's data.
//! - [`run`]: the closed-loop driver and its HdrHistogram recording.
//! - [`report`]: table, versioned JSON (`SCHEMA.md`), `.hlog` and SVG plot.
//! - [`target`]: attach to a socket, start a loopback harness, or start `rpcrdmad` daemons.
//! - [`serve`]: the RDMATEST server behind a daemon; [`compare`] and [`tirpc`]: the side-by-side run.
#![forbid(unsafe_code)]

pub mod case;
pub mod compare;
pub mod report;
pub mod run;
pub mod serve;
pub mod target;
pub mod tirpc;
pub mod workload;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The files a run writes next to each other: `<stem>.json`, `<stem>.hlog`, `<stem>.svg`.
#[derive(Debug, Clone)]
pub struct OutFiles {
    /// `<dir>/<stem>` without extension.
    pub stem: PathBuf,
}

impl OutFiles {
    /// `dir/run-<unix-ms>`.
    pub fn new(dir: &Path, prefix: &str, started: SystemTime) -> std::io::Result<OutFiles> {
        std::fs::create_dir_all(dir)?;
        let ms = started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Ok(OutFiles {
            stem: dir.join(format!("{prefix}-{ms}")),
        })
    }

    /// The path with extension `ext`.
    pub fn with(&self, ext: &str) -> PathBuf {
        self.stem.with_extension(ext)
    }
}

/// Runs `cases` on an attached client, then writes the `.hlog`, the SVG and the JSON document.
pub fn run_cases(
    client: &mut rpcrdma_shm::Client,
    peer: u32,
    cases: &[case::Case],
    opts: &run::RunOptions,
    env: report::Environment,
    out: &OutFiles,
    command: Vec<String>,
) -> anyhow::Result<(report::RunDoc, Vec<run::CaseResult>)> {
    let started = SystemTime::now();
    let t0 = std::time::Instant::now();
    let mut results = Vec::with_capacity(cases.len());
    for c in cases {
        results.push(run::run_case(client, peer, *c, opts, t0)?);
    }
    let hlog = out.with("hlog");
    report::write_hlog(&hlog, started, &results)?;
    let svg = out.with("svg");
    let series: Vec<(String, &hdrhistogram::Histogram<u64>)> =
        results.iter().map(|r| (r.case.name(), &r.hist)).collect();
    let open = opts.rate.map_or(String::new(), |r| {
        format!("open loop at {r:.0} calls/s, at most ")
    });
    let title = format!(
        "rpcrdma-bench round trips by percentile ({}, {open}{} in flight)",
        env.target.kind, opts.in_flight
    );
    std::fs::write(&svg, report::svg(&title, &series))?;
    let doc = report::RunDoc {
        schema: report::SCHEMA.into(),
        started_unix_ms: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        command,
        environment: env,
        settings: report::Settings::from(opts),
        cases: results.iter().map(report::CaseSummary::of).collect(),
        files: report::Files {
            hlog: Some(hlog.display().to_string()),
            svg: Some(svg.display().to_string()),
        },
    };
    std::fs::write(out.with("json"), serde_json::to_string_pretty(&doc)?)?;
    Ok((doc, results))
}

/// Attaches a client to `socket`, resolving `peer` (or the daemon's first peer).
pub fn attach(
    socket: &Path,
    peer: &str,
    wait: impl Into<rpcrdma_shm::WaitPolicy>,
) -> anyhow::Result<(rpcrdma_shm::Client, u32, String)> {
    let mut c = rpcrdma_shm::Client::connect(socket)
        .map_err(|e| anyhow::anyhow!("cannot attach to {}: {e}", socket.display()))?;
    c.set_wait(wait.into());
    let name = if peer.is_empty() {
        c.peers().first().cloned().unwrap_or_default()
    } else {
        peer.to_string()
    };
    let Some(idx) = c.peer(&name) else {
        anyhow::bail!(
            "the daemon at {} has no peer {name:?} (it has {:?})",
            socket.display(),
            c.peers()
        );
    };
    Ok((c, idx, name))
}
