//! The loopback router: a stand-in for the dataplane's routing, used by the `shm-loopback` harness.
//!
//! It drives a real [`AppTable`] exactly as a poll thread would, but instead of sending a call to a remote
//! peer over RPC-over-RDMA it hands it to the local app that registered the program ("loopback peer") and
//! copies the reply back, placing DDP-eligible results in the caller's result buffers when they fit (as a
//! Write chunk would) and inline otherwise. It is test tooling, not the daemon.

use crate::abi::{status, xdr_pad, Geometry};
use crate::attach::Listener;
use crate::daemon::{
    AppId, AppTable, CallOutcome, CallRequest, Detached, IncomingCall, OpId, ReplyRequest,
    Submission, TableConfig, TableStats,
};
use crate::region::{regions_live, Region};
use rustix::fd::AsFd;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

/// The harness state: listener, table and scratch buffers.
#[derive(Debug)]
pub struct Loopback {
    listener: Listener,
    ctl: UnixListener,
    table: AppTable,
    subs: Vec<(AppId, Submission)>,
    scratch: Vec<u8>,
    out: Vec<u8>,
    results: Vec<(u32, u32)>,
    waiting: VecDeque<CallRequest>,
    expired: Vec<OpId>,
    dropped_replies: u64,
    stall_limit: Duration,
}

/// Calls held while their server has no receive buffer posted (beyond this they fail with NO_RECV_BUFFER).
const MAX_WAITING: usize = 4096;

fn zeros(v: &mut Vec<u8>, n: usize) {
    v.extend(std::iter::repeat_n(0, n));
}

/// Appends `len` bytes of `r`'s arena at `off`/`len` to `v`.
fn append(region: &Region, off: u32, len: u32, v: &mut Vec<u8>) {
    if let Some(r) = region.range(off, len) {
        let at = v.len();
        zeros(v, len as usize);
        region.read_arena(r, &mut v[at..]);
    }
}

impl Loopback {
    /// Listens on `path` (apps) and `path.ctl` (one stats line per connection).
    pub fn bind(path: &Path, geometry: Geometry) -> io::Result<Loopback> {
        let listener = Listener::bind(path, geometry, vec!["loopback".into()])?;
        let mut ctl_path = path.as_os_str().to_owned();
        ctl_path.push(".ctl");
        let _ = std::fs::remove_file(&ctl_path);
        let ctl = UnixListener::bind(&ctl_path)?;
        ctl.set_nonblocking(true)?;
        Ok(Loopback {
            listener,
            ctl,
            table: AppTable::new(TableConfig {
                peers: 1,
                ..TableConfig::default()
            })?,
            subs: Vec::with_capacity(1024),
            scratch: Vec::new(),
            out: Vec::new(),
            results: Vec::new(),
            waiting: VecDeque::with_capacity(MAX_WAITING),
            expired: Vec::new(),
            dropped_replies: 0,
            stall_limit: Duration::from_secs(10),
        })
    }

    /// Detach apps that leave completions undrained for longer than `limit` (default 10 s).
    pub fn set_stall_limit(&mut self, limit: Duration) {
        self.stall_limit = limit;
    }

    /// The table's counters.
    pub fn stats(&self) -> TableStats {
        self.table.stats()
    }

    /// One stats line: `apps= ops= backlog= regions= bad= stale= faults= detached= dropped=`.
    pub fn stats_line(&self) -> String {
        let s = self.stats();
        format!(
            "apps={} ops={} backlog={} regions={} bad={} stale={} faults={} detached={} dropped={}\n",
            s.apps,
            s.ops,
            s.backlog,
            regions_live(),
            s.bad_submissions,
            s.stale_completions,
            s.faults,
            s.detached,
            self.dropped_replies
        )
    }

    /// Runs forever: accept, poll, route, reap; after `spin` without work, park (20 ms at most).
    pub fn run(&mut self, spin: Duration) -> io::Result<()> {
        let mut idle_since: Option<Instant> = None;
        let mut loops = 0u32;
        loop {
            let mut work = self.step()?;
            loops = loops.wrapping_add(1);
            if loops % 4096 == 0 {
                work |= self.housekeeping();
            }
            if work {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= spin {
                if self.housekeeping() {
                    idle_since = None;
                    continue;
                }
                let l = self.listener.as_fd();
                let c = self.ctl.as_fd();
                self.table.park(Duration::from_millis(20), &[l, c]);
                idle_since = None;
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Accepts apps, answers stats requests and reaps dead apps; true if anything happened.
    pub fn housekeeping(&mut self) -> bool {
        let mut work = false;
        while let Ok(Some(att)) = self.listener.accept() {
            work = true;
            let _ = self.table.attach(att);
        }
        while let Ok((mut s, _)) = self.ctl.accept() {
            let _ = s.write_all(self.stats_line().as_bytes());
        }
        let mut gone = self.table.reap();
        gone.extend(self.table.evict_stalled(self.stall_limit));
        for d in gone {
            work = true;
            self.on_detached(d);
        }
        work
    }

    /// Polls every app once and routes what it submitted; true if there was work.
    pub fn step(&mut self) -> io::Result<bool> {
        let mut subs = std::mem::take(&mut self.subs);
        subs.clear();
        self.table.poll_submissions(&mut subs, 32);
        let mut work = !subs.is_empty();
        for _ in 0..self.waiting.len() {
            let Some(c) = self.waiting.pop_front() else {
                break;
            };
            if self.table.call_request(c.id).is_some() {
                let held = self.waiting.len();
                self.route_call(c.id.app(), c);
                work |= self.waiting.len() == held;
            }
        }
        for (app, s) in subs.drain(..) {
            match s {
                Submission::Call(id) => {
                    if let Some(&c) = self.table.call_request(id) {
                        self.route_call(app, c);
                    }
                }
                Submission::Reply(id) => {
                    if let Some(&r) = self.table.reply_request(id) {
                        self.route_reply(r);
                    }
                }
                Submission::Registered { ack, .. } => self.table.acknowledge(app, ack),
                Submission::Unregistered { .. } => {}
                Submission::Detach => {
                    if let Some(d) = self.table.detach(app, "closed") {
                        self.on_detached(d);
                    }
                }
                // Nothing of the caller's memory is in use here between a call's delivery
                // and its reply (both are copies), so it ends at once; a late reply is dropped.
                Submission::Cancel(id) => self.fail(id, status::CANCELLED),
            }
        }
        self.subs = subs;
        if self.table.next_deadline().is_some() {
            let mut late = std::mem::take(&mut self.expired);
            self.table.expired(Instant::now(), &mut late);
            work |= !late.is_empty();
            for id in late.drain(..) {
                self.fail(id, status::TIMEOUT);
            }
            self.expired = late;
        }
        Ok(work)
    }

    fn on_detached(&mut self, d: Detached) {
        for tag in d.serving_tags {
            self.table.complete_call(
                OpId::from_u64(tag),
                CallOutcome {
                    status: status::CANCELLED,
                    ..CallOutcome::default()
                },
            );
        }
    }

    fn fail(&mut self, id: OpId, code: u32) {
        self.table.complete_call(
            id,
            CallOutcome {
                status: code,
                ..CallOutcome::default()
            },
        );
    }

    /// Reassembles the caller's arguments and delivers them to the serving app's receive buffer.
    fn route_call(&mut self, app: AppId, c: CallRequest) {
        // Forward servers first; a callback program answers the backward direction (the loopback has no
        // connections, so any app's callback registration stands for "the client on this connection").
        let server = self
            .table
            .lookup(c.prog, c.vers)
            .or_else(|| self.table.lookup_backchannel(c.prog, c.vers));
        let Some(server) = server else {
            return self.fail(c.id, status::UNKNOWN_PROGRAM);
        };
        self.scratch.clear();
        if let Some(region) = self.table.region(app) {
            let mut cur = 0u32;
            for p in c.args.as_slice() {
                append(
                    region,
                    c.msg.off() + cur,
                    p.xdr_pos.saturating_sub(cur),
                    &mut self.scratch,
                );
                append(region, p.off, p.len, &mut self.scratch);
                zeros(
                    &mut self.scratch,
                    xdr_pad(p.len).unwrap_or(0).saturating_sub(p.len) as usize,
                );
                cur = p.xdr_pos;
            }
            append(
                region,
                c.msg.off() + cur,
                c.msg.len().saturating_sub(cur),
                &mut self.scratch,
            );
        }
        let Ok(need) = u32::try_from(self.scratch.len()) else {
            return self.fail(c.id, status::NO_RECV_BUFFER);
        };
        let rb = match self.table.take_recv(server, need) {
            Ok(rb) => rb,
            // Every buffer is busy with another call: hold this one until the server reposts.
            Err(_) if self.table.recv_posted(server) == 0 && self.waiting.len() < MAX_WAITING => {
                self.waiting.push_back(c);
                return;
            }
            Err(code) => return self.fail(c.id, code),
        };
        if let Some(r) = self.table.region(server) {
            r.write_arena(rb.buf, &self.scratch);
        }
        let call = IncomingCall {
            peer: 0,
            prog: c.prog,
            vers: c.vers,
            proc_: c.proc_,
            xid: c.xid,
            args_len: need,
            auth: c.auth,
            tag: c.id.to_u64(),
        };
        if let Err(code) = self.table.deliver_call(rb, call) {
            self.fail(c.id, code);
        }
    }

    /// Places a server's reply in the caller's reply buffer and result buffers, then completes both sides.
    fn route_reply(&mut self, r: ReplyRequest) {
        let caller = OpId::from_u64(r.tag);
        let Some(c) = self.table.call_request(caller).copied() else {
            self.dropped_replies += 1;
            self.table.complete_reply(r.id, status::OK);
            return;
        };
        self.out.clear();
        self.results.clear();
        let mut too_large = false;
        if let (Some(srv), Some(cli)) = (
            self.table.region(r.id.app()),
            self.table.region(caller.app()),
        ) {
            let mut cur = 0u32;
            for (i, p) in r.results.as_slice().iter().enumerate() {
                append(
                    srv,
                    r.msg.off() + cur,
                    p.xdr_pos.saturating_sub(cur),
                    &mut self.out,
                );
                cur = p.xdr_pos;
                match c.results.as_slice().get(i) {
                    // A result buffer big enough: the Write-chunk path.
                    Some(buf) if buf.len >= p.len => {
                        self.scratch.clear();
                        append(srv, p.off, p.len, &mut self.scratch);
                        if let Some(dst) = cli.range(buf.off, p.len) {
                            cli.write_arena(dst, &self.scratch);
                        }
                        self.results.push((self.out.len() as u32, p.len));
                    }
                    // No buffer (or too small): the result travels inline.
                    Some(_) | None => {
                        if i < c.results.as_slice().len() {
                            self.results.push((self.out.len() as u32, 0));
                        }
                        append(srv, p.off, p.len, &mut self.out);
                        zeros(
                            &mut self.out,
                            xdr_pad(p.len).unwrap_or(0).saturating_sub(p.len) as usize,
                        );
                    }
                }
            }
            append(
                srv,
                r.msg.off() + cur,
                r.msg.len().saturating_sub(cur),
                &mut self.out,
            );
            match u32::try_from(self.out.len())
                .ok()
                .and_then(|n| c.reply.prefix(n))
            {
                Some(dst) => {
                    cli.write_arena(dst, &self.out);
                }
                None => too_large = true,
            }
        }
        let outcome = if too_large {
            CallOutcome {
                status: status::REPLY_TOO_LARGE,
                ..CallOutcome::default()
            }
        } else {
            CallOutcome {
                status: status::OK,
                rpc_stat: r.accept_stat,
                reply_len: self.out.len() as u32,
                results: &self.results,
                lent: false,
            }
        };
        self.table.complete_call(caller, outcome);
        self.table.complete_reply(r.id, status::OK);
    }
}
