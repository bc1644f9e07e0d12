//! `rpcrdmactl`: administer a running rpcrdmad over its admin socket.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use rpcrdma_control::admin::{self, Request, Response};
use rpcrdma_control::{table, top};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Administer a running rpcrdmad (JSON over its admin Unix socket).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The daemon's admin socket (daemon.admin-socket).
    #[arg(
        short,
        long,
        env = "RPCRDMAD_ADMIN",
        default_value = "/run/rpcrdmad/admin.sock"
    )]
    socket: PathBuf,
    /// Print the daemon's JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Daemon state, listeners, peers, poll threads.
    Status,
    /// Connections: peer, version, credits, inline sizes, state.
    Conns,
    /// One connection: show or close.
    Conn {
        #[command(subcommand)]
        cmd: ConnCmd,
    },
    /// Counters per connection and per poll thread.
    Stats,
    /// Round-trip latency percentiles per connection.
    Latency,
    /// Attached apps: pid, programs served, operations in flight, calls and replies.
    Apps,
    /// Live traffic rates per peer and per connection, and each poll thread's busy share,
    /// from `stats` every INTERVAL seconds (until interrupted, or COUNT intervals); with
    /// --json, one JSON object per interval and line: each counter's difference and its rate
    /// (`NAME-per-s`).
    Top {
        /// Seconds between snapshots.
        #[arg(long, default_value_t = 1.0, value_parser = interval_secs)]
        interval: f64,
        /// Stop after this many intervals.
        #[arg(long)]
        count: Option<u64>,
    },
    /// A configured peer.
    Peer {
        #[command(subcommand)]
        cmd: PeerCmd,
    },
    /// Transport characteristics (RPC-over-RDMA version 2).
    Xchar {
        #[command(subcommand)]
        cmd: XcharCmd,
    },
    /// Re-read the config file: apply live settings, list the refused ones.
    Reload,
    /// Print a shell completion script for rpcrdmactl (asks no daemon), e.g.
    /// `rpcrdmactl completions bash > /etc/bash_completion.d/rpcrdmactl`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum ConnCmd {
    /// Everything about one connection.
    Show {
        /// Connection id (from `conns`).
        conn: u32,
    },
    /// Disconnect it (a configured peer reconnects after its backoff).
    Close {
        /// Connection id.
        conn: u32,
    },
}

#[derive(Debug, Subcommand)]
enum PeerCmd {
    /// Offer version 2 again to a peer marked version-1-only (VERS 1 in `status`) after it
    /// left a first version-2 call unanswered; its up connection is closed and made anew.
    RetryV2 {
        /// Peer name (as `status` lists it).
        peer: String,
    },
    /// Round-trip latency percentiles per peer, over all its connections (ended ones
    /// included; an accepting daemon's peers are its clients' hosts).
    Latency,
}

#[derive(Debug, Subcommand)]
enum XcharCmd {
    /// Ask the peer to change characteristics (ROPT_REQXCH), e.g. `rbsize=8192`.
    Request {
        /// Connection id.
        conn: u32,
        /// `name=value` pairs.
        #[arg(required = true)]
        set: Vec<String>,
    },
    /// Announce changed characteristics of ours (ROPT_UPDXCH).
    Set {
        /// Connection id.
        conn: u32,
        /// `name=value` pairs.
        #[arg(required = true)]
        set: Vec<String>,
    },
}

/// An interval of 0.05 to 3600 seconds.
fn interval_secs(a: &str) -> Result<f64, String> {
    match a.parse::<f64>() {
        Ok(f) if (0.05..=3600.0).contains(&f) => Ok(f),
        _ => Err("seconds from 0.05 to 3600".into()),
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        // A list of names (an app's programs): comma-separated, "-" when empty.
        Value::Array(a) if a.iter().all(Value::is_string) => {
            let names: Vec<String> = a.iter().map(s).collect();
            if names.is_empty() {
                "-".into()
            } else {
                names.join(", ")
            }
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => n.to_string(),
        },
        v => v.to_string(),
    }
}

/// One row per element of `v`, a cell per key (`a/b` reads key `b` of key `a`: a JSON
/// pointer without its leading slash).
fn rows(v: &Value, keys: &[&str]) -> Vec<Vec<String>> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    keys.iter()
                        .map(|k| s(r.pointer(&format!("/{k}")).unwrap_or(&Value::Null)))
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The traffic counters `stats` shows per connection and per peer: column, JSON key.
const TRAFFIC: [(&str, &str); 8] = [
    ("CALLS-OUT", "calls-out"),
    ("REPLIES-IN", "replies-in"),
    ("CALLS-IN", "calls-in"),
    ("REPLIES-OUT", "replies-out"),
    ("ERRORS", "call-errors"),
    ("PROTO-ERR", "protocol-errors"),
    ("BYTES-OUT", "bytes-out"),
    ("BYTES-IN", "bytes-in"),
];

/// The latency columns of `latency` and `peer latency`: column, JSON key.
const PERCENTILES: [(&str, &str); 7] = [
    ("COUNT", "count"),
    ("MEAN-US", "mean-us"),
    ("P50-US", "p50-us"),
    ("P90-US", "p90-us"),
    ("P99-US", "p99-us"),
    ("P99.9-US", "p999-us"),
    ("MAX-US", "max-us"),
];

/// The columns of `apps`: column, JSON key.
const APP_COLUMNS: [(&str, &str); 13] = [
    ("THREAD", "thread"),
    ("APP", "app"),
    ("PID", "pid"),
    ("PROGRAMS", "programs"),
    ("OPS", "ops"),
    ("LENT", "lent"),
    ("CALLS", "calls"),
    ("DONE", "calls-done"),
    ("SERVED", "served"),
    ("REPLIES", "replies"),
    ("BAD", "bad-submissions"),
    ("CANCELS", "cancels"),
    ("TIMEOUTS", "timeouts"),
];

/// A table of the objects in array `v`, one column per (header, key) of `groups`, in order.
fn columns(v: &Value, groups: &[&[(&str, &str)]]) -> String {
    let (heads, keys): (Vec<&str>, Vec<&str>) =
        groups.iter().flat_map(|g| g.iter().copied()).unzip();
    table::render(&heads, &rows(v, &keys))
}

fn human(req: &Request, r: &Value) -> String {
    match req {
        Request::Status => {
            let mut out = format!(
                "rpcrdmad {} pid {} up {}s, {} ({} provider), config {}\nlisteners: {}\nconnections up: {}, apps: {}\n\n",
                s(&r["version"]),
                s(&r["pid"]),
                s(&r["uptime-s"]),
                s(&r["state"]),
                s(&r["provider"]),
                s(&r["config"]),
                r["listeners"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .filter(|l| !l.is_empty())
                    .unwrap_or_else(|| "none".into()),
                s(&r["conns-up"]),
                s(&r["apps"]),
            );
            out += &table::render(
                &[
                    "PEER",
                    "ADDRESS",
                    "STATE",
                    "VERS",
                    "CONN",
                    "FAILURES",
                    "RETRY-MS",
                    "LAST-ERROR",
                ],
                &rows(
                    &r["peers"],
                    &[
                        "name",
                        "address",
                        "state",
                        "version",
                        "conn",
                        "failures",
                        "retry-in-ms",
                        "last-error",
                    ],
                ),
            );
            out.push('\n');
            let mut threads = rows(
                &r["threads"],
                &[
                    "index",
                    "core",
                    "busy-ratio",
                    "busy-polls",
                    "idle-polls",
                    "parks",
                    "apps",
                    "app-ops",
                ],
            );
            for t in &mut threads {
                if let Ok(f) = t[2].parse::<f64>() {
                    t[2] = format!("{:.1}%", f * 100.0);
                }
            }
            out += &table::render(
                &[
                    "THREAD",
                    "CORE",
                    "BUSY",
                    "BUSY-POLLS",
                    "IDLE-POLLS",
                    "PARKS",
                    "APPS",
                    "APP-OPS",
                ],
                &threads,
            );
            out
        }
        Request::Conns => table::render(
            &[
                "ID",
                "THREAD",
                "PEER",
                "REMOTE",
                "ROLE",
                "STATE",
                "VERS",
                "CREDITS",
                "INLINE(S/R)",
                "PEER-INLINE(S/R)",
                "REMINV",
            ],
            &r.as_array()
                .map(|a| {
                    a.iter()
                        .map(|c| -> Vec<String> {
                            vec![
                                s(&c["id"]),
                                s(&c["thread"]),
                                s(&c["peer"]),
                                s(&c["remote"]),
                                s(&c["role"]),
                                s(&c["state"]),
                                s(&c["version"]),
                                format!(
                                    "{}/{}",
                                    s(&c["credits-granted"]),
                                    s(&c["credits-offered"])
                                ),
                                format!("{}/{}", s(&c["inline-send"]), s(&c["inline-recv"])),
                                format!(
                                    "{}/{}",
                                    s(&c["peer-inline-send"]),
                                    s(&c["peer-inline-recv"])
                                ),
                                s(&c["peer-remote-invalidate"]),
                            ]
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        ),
        Request::Stats => {
            let mut out = columns(
                &r["conns"],
                &[
                    &[("CONN", "id"), ("PEER", "peer")],
                    &TRAFFIC,
                    &[
                        ("RDMA-RD", "rdma-read-bytes"),
                        ("RDMA-WR", "rdma-write-bytes"),
                        ("STALLS", "credit-stalls"),
                    ],
                ],
            );
            out.push('\n');
            out += &columns(
                &r["peers"],
                &[
                    &[("PEER", "peer")],
                    &TRAFFIC,
                    &[("OPENED", "conns-opened"), ("CLOSED", "conns-closed")],
                ],
            );
            out.push('\n');
            let codes = ["err-vers", "err-chunk", "bad-header", "inval-option"];
            let errors: Vec<Vec<String>> = r["conns"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|c| {
                            let mut row = vec![s(&c["id"]), s(&c["peer"])];
                            for dir in ["errors-sent-by-code", "errors-received-by-code"] {
                                row.extend(codes.iter().map(|k| s(&c[dir][*k])));
                            }
                            row
                        })
                        .collect()
                })
                .unwrap_or_default();
            out += &table::render(
                &[
                    "CONN",
                    "PEER",
                    "SENT-VERS",
                    "SENT-CHUNK",
                    "SENT-BADHDR",
                    "SENT-INVOPT",
                    "RECV-VERS",
                    "RECV-CHUNK",
                    "RECV-BADHDR",
                    "RECV-INVOPT",
                ],
                &errors,
            );
            out.push('\n');
            let mut threads = rows(
                &r["threads"],
                &[
                    "index",
                    "busy-polls",
                    "idle-polls",
                    "parks",
                    "hops-out",
                    "apps",
                    "app-ops",
                    "rpcs-in-flight",
                    "calls-held",
                    "regions",
                    "region-bytes",
                    "send-buffers-free",
                    "recv-buffers-free",
                    "bad-submissions",
                    "apps-detached",
                ],
            );
            let totals = rows(&r["threads"], &["send-buffers", "recv-buffers"]);
            let empty = Vec::new();
            let each = r["threads"].as_array().unwrap_or(&empty);
            for ((t, tot), each) in threads.iter_mut().zip(&totals).zip(each) {
                t[11] = format!("{}/{}", t[11], tot[0]);
                t[12] = format!("{}/{}", t[12], tot[1]);
                // Connection requests refused, every reason (`--json` has them by reason).
                let refused = each["connects-refused"].as_object().map_or(0, |o| {
                    o.values().filter_map(Value::as_u64).sum::<u64>()
                });
                t.push(refused.to_string());
            }
            out += &table::render(
                &[
                    "THREAD",
                    "BUSY-POLLS",
                    "IDLE-POLLS",
                    "PARKS",
                    "HOPS-OUT",
                    "APPS",
                    "APP-OPS",
                    "RPCS",
                    "HELD",
                    "REGIONS",
                    "REGION-BYTES",
                    "SEND-BUFS(FREE/ALL)",
                    "RECV-BUFS(FREE/ALL)",
                    "BAD-SUBMISSIONS",
                    "APPS-DETACHED",
                    "CONNS-REFUSED",
                ],
                &threads,
            );
            if r["listeners"].as_array().is_some_and(|a| !a.is_empty()) {
                out.push('\n');
                out += &columns(
                    &r["listeners"],
                    &[&[
                        ("LISTENER", "listener"),
                        ("THREAD", "thread"),
                        ("CONNS", "connections"),
                        ("ADMITTED", "admitted"),
                        ("NOT-ALLOWED", "connects-refused/not-allowed"),
                        ("HOST-LIMIT", "connects-refused/host-limit"),
                        ("RATE", "connects-refused/rate"),
                        ("FULL", "connects-refused/full"),
                        ("DRAINING", "connects-refused/draining"),
                    ]],
                );
            }
            out
        }
        Request::Latency => columns(r, &[&[("CONN", "id"), ("PEER", "peer")], &PERCENTILES]),
        Request::Apps => columns(r, &[&APP_COLUMNS]),
        Request::PeerLatency => columns(r, &[&[("PEER", "peer")], &PERCENTILES]),
        Request::PeerRetryV2 { peer } => match (r["was-v1-only"].as_bool(), r["closing"].as_u64()) {
            (Some(true), Some(conn)) => format!(
                "{peer}: version-1-only mark cleared; closing connection {conn}, the next one offers version 2\n"
            ),
            (Some(true), _) => {
                format!("{peer}: version-1-only mark cleared; the next connection offers version 2\n")
            }
            _ => format!("{peer}: not marked version-1-only; it is offered version 2 already\n"),
        },
        Request::Reload => {
            let mut out = String::new();
            for k in r["applied"].as_array().into_iter().flatten() {
                out += &format!("applied  {}\n", s(k));
            }
            for k in r["refused"].as_array().into_iter().flatten() {
                out += &format!("refused  {}: {}\n", s(&k["key"]), s(&k["reason"]));
            }
            if out.is_empty() {
                out = "nothing changed\n".into();
            }
            out
        }
        _ => {
            let mut out = String::new();
            if let Some(m) = r.as_object() {
                for (k, v) in m {
                    match v {
                        Value::Object(inner) => {
                            out += &format!("{k}:\n");
                            for (ik, iv) in inner {
                                out += &format!("  {ik:<24} {}\n", s(iv));
                            }
                        }
                        v => out += &format!("{k:<26} {}\n", s(v)),
                    }
                }
            }
            out
        }
    }
}

fn main() -> ExitCode {
    let Cli {
        socket,
        json,
        timeout_ms,
        cmd,
    } = Cli::parse();
    let cli = Admin {
        socket,
        json,
        timeout: Duration::from_millis(timeout_ms),
    };
    let req = match cmd {
        Cmd::Top { interval, count } => return top(&cli, interval, count),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "rpcrdmactl", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Cmd::Status => Request::Status,
        Cmd::Conns => Request::Conns,
        Cmd::Conn {
            cmd: ConnCmd::Show { conn },
        } => Request::ConnShow { conn },
        Cmd::Conn {
            cmd: ConnCmd::Close { conn },
        } => Request::ConnClose { conn },
        Cmd::Peer {
            cmd: PeerCmd::RetryV2 { peer },
        } => Request::PeerRetryV2 { peer },
        Cmd::Peer {
            cmd: PeerCmd::Latency,
        } => Request::PeerLatency,
        Cmd::Stats => Request::Stats,
        Cmd::Latency => Request::Latency,
        Cmd::Apps => Request::Apps,
        Cmd::Reload => Request::Reload,
        Cmd::Xchar {
            cmd: XcharCmd::Request { conn, set },
        } => Request::XcharRequest { conn, set },
        Cmd::Xchar {
            cmd: XcharCmd::Set { conn, set },
        } => Request::XcharSet { conn, set },
    };
    let result = match ask(&cli, &req) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    } else {
        print!("{}", human(&req, &result));
    }
    ExitCode::SUCCESS
}

/// Where and how to ask the daemon.
struct Admin {
    socket: PathBuf,
    json: bool,
    timeout: Duration,
}

/// The daemon's answer to `req`, or the exit code after saying why there is none (2: not
/// reached; 1: refused).
fn ask(cli: &Admin, req: &Request) -> Result<Value, ExitCode> {
    let resp: Response = match admin::call(&cli.socket, req, cli.timeout) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "rpcrdmactl: cannot reach rpcrdmad at {}: {e}\n  hint: is the daemon running? pass --socket (daemon.admin-socket) or set RPCRDMAD_ADMIN",
                cli.socket.display()
            );
            return Err(ExitCode::from(2));
        }
    };
    if !resp.ok {
        if cli.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&resp).unwrap_or_default()
            );
        }
        eprintln!("rpcrdmactl: {}", resp.error.unwrap_or_default());
        return Err(ExitCode::FAILURE);
    }
    Ok(resp.result.unwrap_or(Value::Null))
}

/// `top`: a `stats` snapshot every `interval` seconds, each printed against the one before.
fn top(cli: &Admin, interval: f64, count: Option<u64>) -> ExitCode {
    // `stats` with the `apps` answer under "apps".
    let snapshot = || {
        let mut stats = ask(cli, &Request::Stats)?;
        let apps = ask(cli, &Request::Apps)?;
        if let Some(o) = stats.as_object_mut() {
            o.insert("apps".into(), apps);
        }
        Ok((stats, Instant::now()))
    };
    let (mut before, mut then) = match snapshot() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let clear = !cli.json && std::io::stdout().is_terminal();
    let mut n = 0u64;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let (after, now) = match snapshot() {
            Ok(s) => s,
            Err(code) => return code,
        };
        n += 1;
        let r = top::interval(&before, &after, (now - then).as_secs_f64());
        let mut out = std::io::stdout().lock();
        let written = if cli.json {
            writeln!(out, "{r}")
        } else {
            let head = if clear {
                "\x1b[H\x1b[2J"
            } else if n > 1 {
                "\n"
            } else {
                ""
            };
            write!(out, "{head}{}", top_tables(&r, interval, n))
        };
        // A closed pipe (`rpcrdmactl top | head`) ends it quietly.
        if written.and_then(|()| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        (before, then) = (after, now);
    }
    ExitCode::SUCCESS
}

/// The rate columns of `top`: column, counter, divisor (bytes are shown in MB/s).
const RATES: [(&str, &str, f64); 8] = [
    ("CALLS-OUT/S", "calls-out", 1.0),
    ("REPLIES-IN/S", "replies-in", 1.0),
    ("CALLS-IN/S", "calls-in", 1.0),
    ("REPLIES-OUT/S", "replies-out", 1.0),
    ("ERRORS/S", "call-errors", 1.0),
    ("PROTO-ERR/S", "protocol-errors", 1.0),
    ("MB-OUT/S", "bytes-out", 1e6),
    ("MB-IN/S", "bytes-in", 1e6),
];

fn top_tables(r: &Value, interval: f64, n: u64) -> String {
    let each = |key: &str, f: &dyn Fn(&Value) -> Vec<String>| -> Vec<Vec<String>> {
        r[key]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(f)
            .collect()
    };
    let per_s = |row: &Value, c: &str, div: f64| {
        let rate = row[format!("{c}-per-s")].as_f64().unwrap_or(0.0) / div;
        if div > 1.0 {
            format!("{rate:.2}")
        } else {
            format!("{rate:.1}")
        }
    };
    let traffic = |key: &str, keys: &[(&str, &str)]| {
        let mut heads: Vec<&str> = keys.iter().map(|k| k.0).collect();
        heads.extend(RATES.iter().map(|r| r.0));
        let rows = each(key, &|row| {
            let mut cells: Vec<String> = keys.iter().map(|k| s(&row[k.1])).collect();
            cells.extend(RATES.iter().map(|(_, c, div)| per_s(row, c, *div)));
            cells
        });
        table::render(&heads, &rows)
    };
    let threads = each("threads", &|t| {
        vec![
            s(&t["index"]),
            format!("{:.1}%", t["busy"].as_f64().unwrap_or(0.0) * 100.0),
            per_s(t, "completions", 1.0),
            per_s(t, "parks", 1.0),
            per_s(t, "hops-out", 1.0),
            per_s(t, "hops-in", 1.0),
        ]
    });
    let apps = each("apps", &|a| {
        let mut row = vec![s(&a["thread"]), s(&a["app"]), s(&a["pid"])];
        row.extend(top::APP_COUNTERS.iter().map(|c| per_s(a, c, 1.0)));
        row.push(s(&a["ops"]));
        row
    });
    format!(
        "rpcrdmad traffic, every {interval} s: interval {n} ({:.3} s)\n\n{}\n{}\n{}\n{}",
        r["seconds"].as_f64().unwrap_or(0.0),
        traffic("peers", &[("PEER", "peer")]),
        traffic("conns", &[("ID", "id"), ("PEER", "peer")]),
        table::render(
            &[
                "THREAD",
                "BUSY",
                "COMPLETIONS/S",
                "PARKS/S",
                "HOPS-OUT/S",
                "HOPS-IN/S"
            ],
            &threads
        ),
        table::render(
            &[
                "THREAD",
                "APP",
                "PID",
                "CALLS/S",
                "DONE/S",
                "SERVED/S",
                "REPLIES/S",
                "BAD/S",
                "CANCELS/S",
                "TIMEOUTS/S",
                "OPS"
            ],
            &apps
        ),
    )
}
