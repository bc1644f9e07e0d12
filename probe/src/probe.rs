//! The probe's steps (issue 8 item 2): each is timed and reported PASS or FAIL.

use crate::nfs::{pattern_at, Nfs, R};
use crate::nfs3::{NF3DIR, NF3REG};
use rpcrdma_shm::client::Ticket;
use std::collections::HashMap;
use std::collections::HashSet;
use std::time::Instant;

/// What the probe expects to find in the export.
#[derive(Debug, Clone)]
pub struct Expect {
    /// File made by `nfs-probe gen --seed read_seed --size read_size`.
    pub read_file: String,
    /// Its size (at least 1 MiB).
    pub read_size: u64,
    /// Its pattern seed.
    pub read_seed: u32,
    /// A regular file the probe may overwrite (first 4 MiB + long-call area).
    pub write_file: String,
    /// A directory holding exactly `dir_entries` entries besides `.` and `..`.
    pub dir: String,
    /// Expected entry count.
    pub dir_entries: usize,
    /// Seed of the random sizes.
    pub random_seed: u64,
    /// Number of random READ and WRITE rounds.
    pub random_rounds: u32,
    /// Size of the inline (DDP disabled) WRITE that forces a Long call.
    pub long_size: u32,
    /// Calls kept in flight at once.
    pub inflight: u32,
    /// READDIRPLUS maxcount.
    pub rdp_maxcount: u32,
    /// Also run the NFSv4.1 steps (`nfs4_chunks`, `nfs4_symlink_read_chunk`,
    /// `nfs4_readlink_write_chunk`, `nfs4_backchannel`).
    pub nfs4: bool,
    /// A regular file nobody else opens, for `nfs4_backchannel`'s delegation (fresh per run:
    /// a server gives no delegation on a file it recalled one of while that file's state
    /// lives, nor on one it holds open for writing).
    pub deleg_file: String,
}

/// One step's outcome.
#[derive(Debug, Clone)]
pub struct StepResult {
    /// Step name.
    pub name: &'static str,
    /// Passed?
    pub pass: bool,
    /// Wall time in milliseconds.
    pub ms: f64,
    /// What was checked, or why it failed.
    pub detail: String,
}

const MIB: u32 = 1 << 20;

/// xorshift64*: deterministic, so a failing size sequence reproduces from its seed.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeds the generator (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi` (hi ≥ lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

fn check_data(what: &str, got: &[u8], want: &[u8]) -> R<()> {
    match first_diff(got, want) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} bytes, expected {}; first difference at byte {i}",
            got.len(),
            want.len()
        )),
    }
}

/// The handles the steps work on.
#[derive(Debug, Default)]
struct Handles {
    read: Vec<u8>,
    write: Vec<u8>,
    dir: Vec<u8>,
}

/// Runs every step against the export whose root handle is `root`; results in order.
pub fn run(nfs: &mut Nfs, root: &[u8], ex: &Expect) -> Vec<StepResult> {
    let mut out = Vec::new();
    let mut h = Handles::default();
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> R<String>| {
        let t = Instant::now();
        let r = f();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let (pass, detail) = match r {
            Ok(d) => (true, d),
            Err(e) => (false, e),
        };
        out.push(StepResult {
            name,
            pass,
            ms,
            detail,
        });
    };
    step("null", &mut || nfs.null().map(|_| "void reply".into()));
    step("getattr", &mut || {
        let a = nfs.getattr(root)?;
        if a.ftype != NF3DIR {
            return Err(format!("root is ftype {}, not a directory", a.ftype));
        }
        Ok(format!("root dir fileid {} mode {:o}", a.fileid, a.mode))
    });
    step("lookup", &mut || {
        let r = nfs.lookup(root, &ex.read_file)?;
        let a = r.obj.ok_or("LOOKUP returned no attributes")?;
        if a.ftype != NF3REG || a.size != ex.read_size {
            return Err(format!(
                "{}: ftype {} size {}, expected a regular file of {}",
                ex.read_file, a.ftype, a.size, ex.read_size
            ));
        }
        h.read = r.fh;
        h.write = nfs.lookup(root, &ex.write_file)?.fh;
        h.dir = nfs.lookup(root, &ex.dir)?.fh;
        Ok(format!(
            "{} ({} B, fh {} B), {}, {}",
            ex.read_file,
            a.size,
            h.read.len(),
            ex.write_file,
            ex.dir
        ))
    });
    step("read_1mib_write_chunk", &mut || {
        let (r, ddp) = nfs.read(&h.read, 0, MIB)?;
        check_data("READ", &r.data, &pattern_at(ex.read_seed, 0, MIB as usize))?;
        if ddp != MIB {
            return Err(format!(
                "data correct but {ddp} of {MIB} bytes came by DDP (no Write chunk used?)"
            ));
        }
        Ok(format!("{MIB} B checked, {ddp} B by DDP"))
    });
    step("write_1mib_read_chunk", &mut || {
        let data = pattern_at(ex.read_seed ^ 0x55, 0, MIB as usize);
        let w = nfs.write(&h.write, 0, &data, true)?;
        let (r, _) = nfs.read(&h.write, 0, MIB)?;
        check_data("read back", &r.data, &data)?;
        Ok(format!(
            "{MIB} B written (committed {}), read back equal",
            w.committed
        ))
    });
    step("random_sizes", &mut || random(nfs, &h, ex));
    step("readdirplus_reply_chunk", &mut || {
        readdirplus(nfs, &h.dir, ex)
    });
    step("long_call_inline_write", &mut || {
        let off = u64::from(4 * MIB);
        let data = pattern_at(ex.read_seed ^ 0xaa, off, ex.long_size as usize);
        nfs.write(&h.write, off, &data, false)?;
        let (r, _) = nfs.read(&h.write, off, ex.long_size)?;
        check_data("read back", &r.data, &data)?;
        Ok(format!("{} B inline WRITE, read back equal", ex.long_size))
    });
    step("symlink_readlink_chunks", &mut || {
        symlink_readlink(nfs, root)
    });
    step("inflight", &mut || inflight(nfs, &h.read, ex));
    if ex.nfs4 {
        step("nfs4_chunks", &mut || nfs4_chunks(nfs, &h, ex));
        step("nfs4_symlink_read_chunk", &mut || {
            nfs4_link(nfs, root, false)
        });
        step("nfs4_readlink_write_chunk", &mut || {
            nfs4_link(nfs, root, true)
        });
        step("nfs4_backchannel", &mut || nfs4_backchannel(nfs, root, ex));
    }
    out
}

/// The name of the probe's symbolic link in the export's root.
pub const LINK_NAME: &str = "rpcrdmad-probe-link";
/// Length of its target: past the daemon's default DDP threshold (1024), so the target goes
/// in a Read chunk, and under Linux's PATH_MAX.
const LINK_TARGET_LEN: usize = 3001;

/// The probe's link target: [`LINK_TARGET_LEN`] bytes of a path, no NUL in it.
fn link_target() -> Vec<u8> {
    (0..LINK_TARGET_LEN)
        .map(|i| {
            if i % 16 == 0 {
                b'/'
            } else {
                b'a' + (i % 26) as u8
            }
        })
        .collect()
}

/// The other two DDP-eligible items of NFSv3 (RFC 8267 §4): a SYMLINK whose long target goes
/// in a Read chunk, then a READLINK whose result must come back through the Write chunk
/// offered for it, equal; the link is removed before and after.
fn symlink_readlink(nfs: &mut Nfs, root: &[u8]) -> R<String> {
    let target = link_target();
    nfs.remove(root, LINK_NAME)?;
    let fh = match nfs.symlink(root, LINK_NAME, &target, true)? {
        Some(fh) => fh,
        None => nfs.lookup(root, LINK_NAME)?.fh,
    };
    let (got, ddp) = nfs.readlink(&fh)?;
    check_data("READLINK", &got, &target)?;
    if ddp as usize != target.len() {
        return Err(format!(
            "target correct but {ddp} of {} bytes came by DDP (no Write chunk used?)",
            target.len()
        ));
    }
    if !nfs.remove(root, LINK_NAME)? {
        return Err(format!("{LINK_NAME} gone before its REMOVE"));
    }
    Ok(format!(
        "{} B target sent as DDP piece, read back equal, {ddp} B by DDP",
        target.len()
    ))
}

/// NFSv4.1 through chunks (RFC 8267 §5): a session, a READ whose data comes in a Write
/// chunk, a WRITE whose data goes in a Read chunk with a GETATTR after it (odd-sized, so the
/// chunk's pad is in play), the written bytes read back, the session ended.
fn nfs4_chunks(nfs: &mut Nfs, h: &Handles, ex: &Expect) -> R<String> {
    let owner = format!(
        "rpcrdmad-nfs-probe/{}/{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let mut s = nfs.session(owner.as_bytes())?;
    let (off, len) = (4096u64, 256u32 << 10);
    let (data, ddp) = nfs.read4(&mut s, &h.read, off, len)?;
    check_data(
        "NFSv4 READ",
        &data,
        &pattern_at(ex.read_seed, off, len as usize),
    )?;
    if ddp != len {
        return Err(format!(
            "NFSv4 READ: data correct but {ddp} of {len} B came by DDP"
        ));
    }
    let wlen = 200_001usize;
    let out = pattern_at(ex.read_seed ^ 0x44, 0, wlen);
    let w = nfs.write4(&mut s, &h.write, 0, &out)?;
    if w.count as usize != wlen || w.size < wlen as u64 {
        return Err(format!(
            "NFSv4 WRITE: count {} size {} for {wlen} B",
            w.count, w.size
        ));
    }
    let (back, ddp_back) = nfs.read4(&mut s, &h.write, 0, wlen as u32)?;
    check_data("NFSv4 read back", &back, &out)?;
    nfs.end_session(s)?;
    Ok(format!(
        "session; READ {len} B ({ddp} by DDP); WRITE {wlen} B through a Read chunk, GETATTR \
         after it (size {}); read back equal ({ddp_back} by DDP); session ended",
        w.size
    ))
}

/// How long the server gets to make each callback.
const CALLBACK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the server may keep answering OPEN without a delegation (its grace period).
const DELEGATION_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// The server's callbacks over the backward direction of the probe's own connection (RFC
/// 8167), the way an NFSv4.1 client takes them: a callback server attached to the daemon, a
/// session whose connection carries its back channel; a read delegation on `deleg_file`; an
/// NFSv3 WRITE of nothing to that file, which the server answers NFS3ERR_JUKEBOX while it
/// recalls the delegation with CB_COMPOUND (CB_SEQUENCE + CB_RECALL); the recall answered and
/// the delegation returned; the WRITE then accepted; SEQUENCE's status flags saying the back
/// channel is up. (Linux's nfsd sends no CB_NULL to an NFSv4.1 client: the recall is its first
/// callback. Probes that come, CB_NULL or CB_SEQUENCE alone, are answered and counted.)
fn nfs4_backchannel(nfs: &mut Nfs, root: &[u8], ex: &Expect) -> R<String> {
    use crate::callback::{Callbacks, Recall, Seen};
    use crate::nfs4::{FLAG_CONN_BACK_CHAN, SEQ4_STATUS_CB_DOWN};
    let fh = nfs.lookup(root, &ex.deleg_file)?.fh;
    let cb = Callbacks::start(&nfs.socket)?;
    let owner = format!("rpcrdmad-nfs-probe/{}/backchannel", std::process::id());
    let mut s = nfs.session_back_channel(owner.as_bytes())?;
    if s.flags & FLAG_CONN_BACK_CHAN == 0 {
        return Err(format!(
            "CREATE_SESSION did not take the back channel (csr_flags {:#x})",
            s.flags
        ));
    }
    // Probes of the back channel (CB_NULL, or CB_SEQUENCE alone) are answered and counted.
    let id = s.id();
    let probe = move |c: &Seen| match c {
        Seen::Null => true,
        Seen::Compound {
            session, recall, ..
        } => *session == id && recall.is_none(),
        Seen::Other(_) => false,
    };
    let mut probes = 0;
    // A server gives no delegation while it is in its grace period (Linux's nfsd: its own and
    // lockd's, about 50 s after lockd starts), answering WND4_RESOURCE: the open is closed and
    // made again until it comes or DELEGATION_WAIT passes.
    let t = Instant::now();
    let mut attempts = 1;
    let (opened, deleg) = loop {
        let opened = nfs.open_read(&mut s, &fh, b"backchannel")?;
        match opened.delegation {
            Ok(d) => break (opened, d),
            Err(why) if t.elapsed() >= DELEGATION_WAIT => {
                return Err(format!("{why}, {attempts} OPENs in {DELEGATION_WAIT:?}"))
            }
            Err(_) => {
                nfs.close(&mut s, &fh, &opened.stateid)?;
                std::thread::sleep(std::time::Duration::from_secs(2));
                attempts += 1;
            }
        }
    };
    let st = nfs.write_status(&fh, 0, &[])?;
    if st != crate::nfs3::ERR_JUKEBOX {
        return Err(format!(
            "NFSv3 WRITE under the read delegation answered nfsstat3 {st}, not JUKEBOX (no recall?)"
        ));
    }
    let t = Instant::now();
    let recall = loop {
        match cb.seen.recv_timeout(CALLBACK_WAIT) {
            Ok(c) if probe(&c) => probes += 1,
            Ok(Seen::Compound {
                session,
                recall: Some(r),
                ..
            }) if session == s.id() => break r,
            Ok(other) => {
                return Err(format!(
                    "expected CB_COMPOUND with CB_RECALL, got {other:?}"
                ))
            }
            Err(_) => return Err(format!("no CB_RECALL within {CALLBACK_WAIT:?}")),
        }
    };
    let recall_ms = t.elapsed().as_millis();
    if recall
        != (Recall {
            stateid: deleg,
            truncate: false,
            fh: fh.clone(),
        })
    {
        return Err(format!(
            "CB_RECALL of {recall:?}, not of the delegation {deleg:?} on {fh:?}"
        ));
    }
    nfs.delegreturn(&mut s, &fh, &deleg)?;
    // The server may take a moment to see the delegation gone; JUKEBOX until then.
    let t = Instant::now();
    let mut st = nfs.write_status(&fh, 0, &[])?;
    while st == crate::nfs3::ERR_JUKEBOX && t.elapsed() < CALLBACK_WAIT {
        std::thread::sleep(std::time::Duration::from_millis(100));
        st = nfs.write_status(&fh, 0, &[])?;
    }
    if st != 0 {
        return Err(format!(
            "NFSv3 WRITE after DELEGRETURN answered nfsstat3 {st}"
        ));
    }
    nfs.close(&mut s, &fh, &opened.stateid)?;
    let flags = nfs.sequence_flags(&mut s)?;
    if flags & SEQ4_STATUS_CB_DOWN != 0 {
        return Err(format!(
            "SEQUENCE says the back channel is down: sr_status_flags {flags:#x}"
        ));
    }
    nfs.end_session(s)?;
    let others: Vec<Seen> = cb.seen.try_iter().filter(|c| !probe(c)).collect();
    if !others.is_empty() {
        return Err(format!("unexpected callbacks after the recall: {others:?}"));
    }
    Ok(format!(
        "back channel taken; read delegation (OPEN {attempts}); NFSv3 WRITE JUKEBOX; CB_RECALL of it after \
         {recall_ms} ms, answered; DELEGRETURN; WRITE accepted; sr_status_flags {flags:#x}; \
         session ended; back-channel probes answered before the recall: {probes}"
    ))
}

/// NFSv4.1's other two DDP-eligible items (RFC 8267 §5): in a session, the link of
/// `symlink_readlink_chunks` made again with CREATE (NF4LNK), its target a DDP piece (a Read
/// chunk, with the name and attributes after it), then READLINK: with `write_chunk`, the
/// target must come back through the Write chunk offered for it, all of it by DDP; without,
/// it comes back in the reply. The link is removed before and after.
fn nfs4_link(nfs: &mut Nfs, root: &[u8], write_chunk: bool) -> R<String> {
    let owner = format!(
        "rpcrdmad-nfs-probe/{}/link/{write_chunk}",
        std::process::id()
    );
    let mut s = nfs.session(owner.as_bytes())?;
    let target = link_target();
    nfs.remove4(&mut s, root, LINK_NAME)?;
    let link = nfs.symlink4(&mut s, root, LINK_NAME, &target)?;
    let (got, ddp) = nfs.readlink4(&mut s, &link, write_chunk)?;
    check_data("NFSv4 READLINK", &got, &target)?;
    let want = if write_chunk { target.len() } else { 0 };
    if ddp as usize != want {
        return Err(format!(
            "NFSv4 READLINK: target correct but {ddp} B came by DDP, expected {want}"
        ));
    }
    if !nfs.remove4(&mut s, root, LINK_NAME)? {
        return Err(format!("{LINK_NAME} gone before its REMOVE"));
    }
    nfs.end_session(s)?;
    Ok(format!(
        "CREATE of a link, its {} B target a DDP piece; READLINK, {ddp} B by DDP; removed",
        target.len()
    ))
}

fn random(nfs: &mut Nfs, h: &Handles, ex: &Expect) -> R<String> {
    let mut rng = Rng::new(ex.random_seed);
    let max = 256u64 << 10;
    let mut bytes = 0u64;
    for i in 0..ex.random_rounds {
        let len = rng.range(1, max.min(ex.read_size));
        let off = rng.range(0, ex.read_size - len);
        let (r, _) = nfs
            .read(&h.read, off, len as u32)
            .map_err(|e| format!("round {i}: READ {len} B at {off}: {e}"))?;
        check_data(
            &format!("round {i}: READ {len} B at {off}"),
            &r.data,
            &pattern_at(ex.read_seed, off, len as usize),
        )?;
        let woff = rng.range(0, u64::from(4 * MIB) - len);
        let data = pattern_at(ex.read_seed.wrapping_add(i), woff, len as usize);
        nfs.write(&h.write, woff, &data, true)
            .map_err(|e| format!("round {i}: WRITE {len} B at {woff}: {e}"))?;
        let (r, _) = nfs
            .read(&h.write, woff, len as u32)
            .map_err(|e| format!("round {i}: read back {len} B at {woff}: {e}"))?;
        check_data(
            &format!("round {i}: read back {len} B at {woff}"),
            &r.data,
            &data,
        )?;
        bytes += 3 * len;
    }
    Ok(format!(
        "{} rounds of READ + WRITE + read back, {bytes} B, seed {}",
        ex.random_rounds, ex.random_seed
    ))
}

fn readdirplus(nfs: &mut Nfs, dir: &[u8], ex: &Expect) -> R<String> {
    let mut names = HashSet::new();
    let (mut cookie, mut verf, mut calls) = (0u64, [0u8; 8], 0u32);
    loop {
        let r = nfs.readdirplus(dir, cookie, verf, ex.rdp_maxcount)?;
        calls += 1;
        for e in &r.entries {
            if e.name != b"." && e.name != b".." && !names.insert(e.name.clone()) {
                return Err(format!(
                    "entry {:?} listed twice",
                    String::from_utf8_lossy(&e.name)
                ));
            }
        }
        if r.eof {
            break;
        }
        let last = r.entries.last().ok_or("no entries and not eof")?;
        cookie = last.cookie;
        verf = r.verf;
        if calls > 10_000 {
            return Err("more than 10000 READDIRPLUS calls without eof".into());
        }
    }
    if names.len() != ex.dir_entries {
        return Err(format!(
            "{} entries, expected {}",
            names.len(),
            ex.dir_entries
        ));
    }
    Ok(format!(
        "{} entries in {calls} calls (maxcount {})",
        names.len(),
        ex.rdp_maxcount
    ))
}

fn inflight(nfs: &mut Nfs, fh: &[u8], ex: &Expect) -> R<String> {
    let len = 16u32 << 10;
    let slots = (ex.read_size / u64::from(len)).max(1);
    let mut pending: HashMap<Ticket, u64> = HashMap::new();
    for i in 0..u64::from(ex.inflight) {
        let off = (i % slots) * u64::from(len);
        let n = u64::from(len).min(ex.read_size - off) as u32;
        let t = nfs.submit_read(fh, off, n)?;
        pending.insert(t, off);
    }
    let most = nfs.client.in_flight();
    while !pending.is_empty() {
        let (t, r) = nfs
            .client
            .wait_any(Some(nfs.timeout))
            .map_err(|e| format!("{} calls unanswered: {e}", pending.len()))?;
        let off = pending.remove(&t).ok_or("completion for a call not made")?;
        let r = crate::nfs::check_accept(r.map_err(|e| format!("READ at {off}: {e}"))?)?;
        let n = u64::from(len).min(ex.read_size - off) as u32;
        let (ok, _) = Nfs::read_reply(&r, n)?;
        check_data(
            &format!("READ at {off}"),
            &ok.data,
            &pattern_at(ex.read_seed, off, n as usize),
        )?;
    }
    Ok(format!(
        "{} READs of {len} B submitted before waiting ({most} in flight), all checked",
        ex.inflight
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..1000 {
            let x = a.range(1, 256 << 10);
            assert_eq!(x, b.range(1, 256 << 10));
            assert!((1..=256 << 10).contains(&x));
        }
    }

    #[test]
    fn first_diff_finds_the_first_mismatch_and_length_changes() {
        assert_eq!(first_diff(b"abc", b"abc"), None);
        assert_eq!(first_diff(b"abd", b"abc"), Some(2));
        assert_eq!(first_diff(b"ab", b"abc"), Some(2));
    }
}
