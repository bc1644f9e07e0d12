//! The probe's NFSv4.1 callback service (RFC 8881 §20), served over the backward direction of
//! the probe's own RPC-over-RDMA connection (RFC 8167): the server calls, the probe answers.
//!
//! Enough of it to hold a read delegation and give it back: CB_NULL, and CB_COMPOUND carrying
//! CB_SEQUENCE and CB_RECALL. [`answer`] is the pure part (arguments in, reply and what was
//! seen out); [`Callbacks`] serves it from an app attached to the daemon as the callback
//! program's server, reporting each call on a channel.

use crate::xdr::{Reader, Res, Writer};
use rpcrdma_shm::client::ReplyBuilder;
use rpcrdma_shm::Server;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The callback program number the probe names in CREATE_SESSION (`csa_cb_program`; the
/// Linux client's is the same).
pub const PROG: u32 = 0x4000_0000;
/// The callback program's version the server calls (Linux's nfsd: 1).
pub const VERS: u32 = 1;
/// CB_NULL.
pub const CB_NULL: u32 = 0;
/// CB_COMPOUND.
pub const CB_COMPOUND: u32 = 1;
/// `nfs_cb_opnum4` CB_RECALL.
pub const OP_CB_RECALL: u32 = 4;
/// `nfs_cb_opnum4` CB_SEQUENCE.
pub const OP_CB_SEQUENCE: u32 = 11;
/// `nfs_cb_opnum4` CB_ILLEGAL, and NFS4ERR_OP_ILLEGAL.
pub const OP_CB_ILLEGAL: u32 = 10_044;
/// NFS4ERR_MINOR_VERS_MISMATCH.
const ERR_MINOR_VERS_MISMATCH: u32 = 10_021;
/// accept_stat PROC_UNAVAIL and GARBAGE_ARGS.
const PROC_UNAVAIL: u32 = 3;
const GARBAGE_ARGS: u32 = 4;

/// A delegation the server recalled (CB_RECALL's arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recall {
    /// The delegation's stateid (`seqid` word and 12 `other` bytes).
    pub stateid: [u8; 16],
    /// Whether the server asked for the file to be truncated.
    pub truncate: bool,
    /// The file's handle.
    pub fh: Vec<u8>,
}

/// One callback the probe answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// CB_NULL (the server probing the back channel).
    Null,
    /// CB_COMPOUND: its CB_SEQUENCE's session and sequence id, and its CB_RECALL if any.
    Compound {
        /// `csa_sessionid`, echoed in the reply.
        session: [u8; 16],
        /// `csa_sequenceid`, echoed in the reply.
        seq: u32,
        /// The recall it carried.
        recall: Option<Recall>,
    },
    /// A call the probe does not serve (answered PROC_UNAVAIL, GARBAGE_ARGS or an NFSv4
    /// error; the text says which).
    Other(String),
}

/// Answers callback procedure `proc_` with arguments `args`: the accept_stat, the results
/// (XDR), and what the call was.
pub fn answer(proc_: u32, args: &[u8]) -> (u32, Vec<u8>, Seen) {
    match proc_ {
        CB_NULL => (0, Vec::new(), Seen::Null),
        CB_COMPOUND => match compound(args) {
            Ok((res, seen)) => (0, res, seen),
            Err(e) => (
                GARBAGE_ARGS,
                Vec::new(),
                Seen::Other(format!("CB_COMPOUND: {e}")),
            ),
        },
        p => (
            PROC_UNAVAIL,
            Vec::new(),
            Seen::Other(format!("procedure {p}")),
        ),
    }
}

/// CB_COMPOUND4args in, CB_COMPOUND4res out: each operation answered in order, stopping at
/// the first one not served (CB_ILLEGAL, as RFC 8881 §20.1 says of unknown operations).
fn compound(args: &[u8]) -> Res<(Vec<u8>, Seen)> {
    let mut r = Reader::new(args);
    let tag = r.opaque(1024)?;
    let minor = r.u32()?;
    let _callback_ident = r.u32()?;
    let n = r.u32()?;
    let mut results = Writer::default();
    let mut done = 0u32;
    let mut status = 0;
    let mut seen = (None, None);
    if minor != 1 {
        status = ERR_MINOR_VERS_MISMATCH;
    }
    while status == 0 && done < n {
        match r.u32()? {
            OP_CB_SEQUENCE => {
                let mut session = [0u8; 16];
                session.copy_from_slice(r.fixed(16)?);
                let (seq, slot, highest) = (r.u32()?, r.u32()?, r.u32()?);
                r.bool()?;
                // referring_call_lists: sessions and the calls each refers to.
                for _ in 0..r.u32()? {
                    r.fixed(16)?;
                    let calls = r.u32()?;
                    r.fixed(8 * calls.min(1 << 16) as usize)?;
                }
                // CB_SEQUENCE4resok echoes the session, sequence and slot (the server checks
                // them); the probe keeps one slot, so its highest and target are the server's.
                results.u32(OP_CB_SEQUENCE).u32(0).fixed(&session);
                results.u32(seq).u32(slot).u32(highest).u32(highest);
                seen.0 = Some((session, seq));
            }
            OP_CB_RECALL => {
                let mut stateid = [0u8; 16];
                stateid.copy_from_slice(r.fixed(16)?);
                let truncate = r.bool()?;
                let fh = r.opaque(128)?.to_vec();
                results.u32(OP_CB_RECALL).u32(0);
                seen.1 = Some(Recall {
                    stateid,
                    truncate,
                    fh,
                });
            }
            _ => {
                status = OP_CB_ILLEGAL;
                results.u32(OP_CB_ILLEGAL).u32(OP_CB_ILLEGAL);
            }
        }
        done += 1;
    }
    let mut out = Writer::default();
    out.u32(status).opaque(tag).u32(done);
    out.buf.extend_from_slice(&results.buf);
    let seen = match seen {
        (Some((session, seq)), recall) => Seen::Compound {
            session,
            seq,
            recall,
        },
        (None, _) if status != 0 => Seen::Other(format!("CB_COMPOUND answered nfsstat4 {status}")),
        (None, _) => Seen::Other(format!("CB_COMPOUND of {n} operations, no CB_SEQUENCE")),
    };
    Ok((out.buf, seen))
}

/// CB_COMPOUND4args as a server sends them (and as Linux's nfsd builds them,
/// `fs/nfsd/nfs4callback.c`): an empty tag, minor version 1, CB_SEQUENCE of session `session`
/// at sequence `seq` on slot 0 with no referring calls, then, given `recall` (a delegation's
/// stateid and its file's handle), CB_RECALL of it, not to be truncated; without, CB_SEQUENCE
/// alone (a probe of the back channel).
pub fn cb_compound_args(
    session: &[u8; 16],
    seq: u32,
    recall: Option<(&[u8; 16], &[u8])>,
) -> Vec<u8> {
    let mut w = Writer::default();
    w.opaque(b"")
        .u32(1)
        .u32(0)
        .u32(1 + u32::from(recall.is_some()));
    w.u32(OP_CB_SEQUENCE).fixed(session).u32(seq).u32(0).u32(0);
    w.u32(0).u32(0);
    if let Some((stateid, fh)) = recall {
        w.u32(OP_CB_RECALL).fixed(stateid).u32(0).opaque(fh);
    }
    w.buf
}

/// Whether `res` (CB_COMPOUND4res) answers [`cb_compound_args`] for `session` at `seq`, with
/// a recall or not, as a server requires (as nfsd's `decode_cb_sequence4resok` checks):
/// NFS4_OK, CB_SEQUENCE echoing the session, the sequence id and slot 0, and CB_RECALL's
/// NFS4_OK.
pub fn cb_compound_answered(res: &[u8], session: &[u8; 16], seq: u32, recall: bool) -> bool {
    let mut r = Reader::new(res);
    let ops = 1 + u32::from(recall);
    let mut check = || -> Res<bool> {
        let ok = r.u32()? == 0 && r.opaque(1024).is_ok() && r.u32()? == ops;
        let ok = ok && r.u32()? == OP_CB_SEQUENCE && r.u32()? == 0;
        let ok = ok && r.fixed(16)? == session && r.u32()? == seq && r.u32()? == 0;
        r.fixed(8)?;
        Ok(ok && (!recall || (r.u32()? == OP_CB_RECALL && r.u32()? == 0)))
    };
    check().unwrap_or(false)
}

/// NFS4ERR_DELAY: the client cannot take the callback now (Linux: its back-channel slot table
/// is being drained, as while it completes the session); the server sends it again later.
pub const ERR_DELAY: u32 = 10_008;

/// The status of CB_COMPOUND4res `res`, if readable.
pub fn cb_compound_status(res: &[u8]) -> Option<u32> {
    Reader::new(res).u32().ok()
}

/// The callback program served on a thread of its own from an app attached to the daemon;
/// every call answered is reported on [`Callbacks::seen`]. Stops when dropped.
#[derive(Debug)]
pub struct Callbacks {
    /// What the server called, in order.
    pub seen: Receiver<Seen>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Callbacks {
    /// Attaches to the daemon at `socket` and registers [`PROG`] version [`VERS`] as a
    /// callback program (backward-direction calls on the daemon's connections come to it);
    /// serving starts before this returns, so a session created after it finds its server.
    pub fn start(socket: &str) -> Result<Callbacks, String> {
        let mut s = Server::connect(socket).map_err(|e| format!("attach to {socket}: {e}"))?;
        s.receive_buffers(4, 8 << 10);
        s.register(PROG, VERS, true)
            .and_then(|()| s.start(PROG, VERS))
            .map_err(|e| format!("register the callback program: {e}"))?;
        let (tx, seen) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                let served = s.serve_ready(|c, rb: &mut ReplyBuilder| {
                    let (accept, res, what) = answer(c.proc_, c.args);
                    rb.accept_stat = accept;
                    crate::nfs4::put_fixed(&mut rb.xdr, &res);
                    let _ = tx.send(what);
                });
                match served {
                    Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        Ok(Callbacks {
            seen,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recall_is_answered_with_the_sequence_echoed_as_nfsd_checks_it() {
        let session = *b"0123456789abcdef";
        let stateid = [7u8; 16];
        let fh = [0x11u8; 28];
        let (accept, res, seen) = answer(
            CB_COMPOUND,
            &cb_compound_args(&session, 5, Some((&stateid, &fh))),
        );
        assert_eq!(accept, 0);
        assert_eq!(
            seen,
            Seen::Compound {
                session,
                seq: 5,
                recall: Some(Recall {
                    stateid,
                    truncate: false,
                    fh: fh.to_vec()
                })
            }
        );
        // CB_COMPOUND4res as nfsd's decode_cb_compound4res and decode_cb_sequence4resok read
        // it: status, tag, two results; CB_SEQUENCE's resok with the same session, sequence
        // and slot 0; CB_RECALL's status.
        let mut r = Reader::new(&res);
        assert_eq!(r.u32().unwrap(), 0);
        assert_eq!(r.opaque(64).unwrap(), b"");
        assert_eq!(r.u32().unwrap(), 2);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (OP_CB_SEQUENCE, 0));
        assert_eq!(r.fixed(16).unwrap(), &session);
        assert_eq!(r.u32().unwrap(), 5);
        assert_eq!(r.u32().unwrap(), 0);
        r.fixed(8).unwrap();
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (OP_CB_RECALL, 0));
        assert_eq!(r.remaining(), 0);
        assert!(cb_compound_answered(&res, &session, 5, true));
        assert!(!cb_compound_answered(&res, &session, 6, true));
        assert!(!cb_compound_answered(&res, b"another-session!", 5, true));
        assert!(!cb_compound_answered(
            &res[..res.len() - 4],
            &session,
            5,
            true
        ));
        // A probe: CB_SEQUENCE alone, answered alone.
        let (accept, res, seen) = answer(CB_COMPOUND, &cb_compound_args(&session, 6, None));
        assert_eq!(accept, 0);
        assert_eq!(
            seen,
            Seen::Compound {
                session,
                seq: 6,
                recall: None
            }
        );
        assert!(cb_compound_answered(&res, &session, 6, false));
        assert!(!cb_compound_answered(&res, &session, 6, true));
    }

    #[test]
    fn cb_null_is_a_void_success_and_other_procedures_are_unavailable() {
        assert_eq!(answer(CB_NULL, &[]), (0, Vec::new(), Seen::Null));
        let (accept, res, seen) = answer(9, &[]);
        assert_eq!((accept, res.len()), (PROC_UNAVAIL, 0));
        assert!(matches!(seen, Seen::Other(_)));
    }

    #[test]
    fn an_unknown_operation_ends_the_compound_with_cb_illegal() {
        let mut w = Writer::default();
        w.opaque(b"t")
            .u32(1)
            .u32(0)
            .u32(2)
            .u32(99)
            .u32(OP_CB_RECALL);
        let (accept, res, seen) = answer(CB_COMPOUND, &w.buf);
        assert_eq!(accept, 0);
        let mut r = Reader::new(&res);
        assert_eq!(r.u32().unwrap(), OP_CB_ILLEGAL);
        assert_eq!(r.opaque(64).unwrap(), b"t");
        assert_eq!(r.u32().unwrap(), 1);
        assert_eq!(
            (r.u32().unwrap(), r.u32().unwrap()),
            (OP_CB_ILLEGAL, OP_CB_ILLEGAL)
        );
        assert_eq!(r.remaining(), 0);
        assert!(matches!(seen, Seen::Other(_)));
    }

    #[test]
    fn truncated_or_wrong_minor_version_arguments_are_refused_not_trusted() {
        let full = cb_compound_args(&[1; 16], 1, Some((&[2; 16], &[3; 8])));
        for cut in 0..full.len() {
            let (accept, _, _) = answer(CB_COMPOUND, &full[..cut]);
            assert_eq!(accept, GARBAGE_ARGS, "cut at {cut}");
        }
        let mut w = Writer::default();
        w.opaque(b"").u32(0).u32(0).u32(0);
        let (accept, res, _) = answer(CB_COMPOUND, &w.buf);
        assert_eq!(accept, 0);
        assert_eq!(Reader::new(&res).u32().unwrap(), ERR_MINOR_VERS_MISMATCH);
    }
}
