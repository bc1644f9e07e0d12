//! Builds each case's calls with the shm `Client` and checks every reply's data.

use crate::case::{Case, Mode, Proc};
use rpcrdma_shm::client::{CallBuilder, Client, Error, Reply, Ticket};
use rpcrdma_shm::rdmatest::{self, pattern, XdrReader};

/// How many different seeds a case rotates through, so a stale or misplaced reply shows up as a mismatch.
pub const SEEDS: usize = 4;

/// How a case sizes each call's reply buffer (`rpcrdma-bench run --reply-buffer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyBuffer {
    /// The procedure's largest reduced reply and some slack ([`reply_room`]), as the Linux
    /// client sizes replies per procedure.
    #[default]
    Sized,
    /// What the shm `Client` gives a call that does not size its reply (the daemon's inline
    /// room for the peer): what an app that never calls `max_reply` pays.
    Default,
    /// This many bytes for every call.
    Bytes(u32),
}

impl std::str::FromStr for ReplyBuffer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sized" => Ok(ReplyBuffer::Sized),
            "default" => Ok(ReplyBuffer::Default),
            n => n.parse().map(ReplyBuffer::Bytes).map_err(|_| {
                format!("bad reply buffer {s:?}: sized, default, or a number of bytes")
            }),
        }
    }
}

impl std::fmt::Display for ReplyBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyBuffer::Sized => f.write_str("sized"),
            ReplyBuffer::Default => f.write_str("default"),
            ReplyBuffer::Bytes(n) => write!(f, "{n}"),
        }
    }
}

/// The precomputed payloads of one case (one per seed), built before timing starts.
#[derive(Debug)]
pub struct Workload {
    case: Case,
    reply: ReplyBuffer,
    data: Vec<(u32, Vec<u8>)>,
}

/// The reply buffer a call of `size` data bytes asks for: the largest reply its procedure can
/// give (RPC reply header, a length word, the data and its pad) and some slack, as the Linux
/// client sizes replies per procedure. A larger buffer that may not fit the inline threshold
/// would make the daemon offer a Reply chunk (R8166-3.5.3-c), so an `inline` case would not
/// measure the inline path.
fn reply_room(size: u32) -> u32 {
    size.saturating_add(64)
}

impl Workload {
    /// Payloads for `case`: `pattern(seed)` of the case's size for seeds 1..=[`SEEDS`]; reply
    /// buffers as `reply` says.
    pub fn new(case: Case, reply: ReplyBuffer) -> Workload {
        let len = match case.proc_ {
            Proc::Echo | Proc::Read | Proc::Write => case.size as usize,
            _ => 0,
        };
        let data = (1..=SEEDS as u32).map(|s| (s, pattern(s, len))).collect();
        Workload { case, reply, data }
    }

    /// The case.
    pub fn case(&self) -> Case {
        self.case
    }

    fn seed(&self, k: usize) -> (u32, &[u8]) {
        let (s, d) = &self.data[k % SEEDS];
        (*s, d)
    }

    /// Submits call number `k` of this case to `peer`.
    pub fn submit(&self, c: &mut Client, peer: u32, k: usize) -> Result<Ticket, Error> {
        let (seed, data) = self.seed(k);
        let size = self.case.size;
        let mut b = c.call(
            peer,
            rdmatest::PROG,
            rdmatest::VERS,
            self.case.proc_.number(),
        );
        match self.case.proc_ {
            Proc::Null => {
                self.size_reply(&mut b, reply_room(0));
            }
            Proc::Echo => {
                if self.case.mode == Mode::ReadChunk {
                    b.args().put_ddp_opaque(data);
                } else {
                    b.args().put_opaque(data);
                }
                if self.case.mode == Mode::WriteChunk && size > 0 {
                    // The reduced reply holds the result's length word.
                    b.result_buffer(size);
                    self.size_reply(&mut b, reply_room(0));
                } else {
                    self.size_reply(&mut b, reply_room(size));
                }
            }
            Proc::Read => {
                b.args().put_u32(size).put_u32(seed);
                if self.case.mode == Mode::WriteChunk && size > 0 {
                    // The reduced reply holds the result's length word.
                    b.result_buffer(size);
                    self.size_reply(&mut b, reply_room(0));
                } else {
                    self.size_reply(&mut b, reply_room(size));
                }
            }
            Proc::Write => {
                self.size_reply(&mut b, reply_room(0));
                b.args().put_u32(seed);
                if self.case.mode == Mode::ReadChunk {
                    b.args().put_ddp_opaque(data);
                } else {
                    b.args().put_opaque(data);
                }
            }
            Proc::Sleep => {
                self.size_reply(&mut b, reply_room(0));
                b.args().put_u32(size);
            }
            Proc::Callback => {
                self.size_reply(&mut b, reply_room(0));
                b.args().put_u32(1).put_u32(size);
            }
        }
        b.submit()
    }

    /// Gives call `b` the reply buffer `sized` unless the case sizes replies another way.
    fn size_reply(&self, b: &mut CallBuilder<'_>, sized: u32) {
        match self.reply {
            ReplyBuffer::Sized => {
                b.max_reply(sized);
            }
            ReplyBuffer::Default => {}
            ReplyBuffer::Bytes(n) => {
                b.max_reply(n);
            }
        }
    }

    /// Checks the reply to call number `k`: accept_stat SUCCESS and exactly the data TESTPROG prescribes.
    pub fn check(&self, k: usize, r: &Reply) -> Result<(), String> {
        if r.accept_stat != 0 {
            return Err(format!("accept_stat {}", r.accept_stat));
        }
        let (_, data) = self.seed(k);
        let mut x = XdrReader::new(&r.body);
        let ok = match self.case.proc_ {
            Proc::Null | Proc::Sleep => r.body.is_empty(),
            Proc::Echo | Proc::Read => {
                x.opaque() == Some(data) && r.body.len() == 4 + data.len().next_multiple_of(4)
            }
            Proc::Write => x.u32() == Some(self.case.size) && r.body.len() == 4,
            Proc::Callback => x.u32() == Some(1) && r.body.len() == 4,
        };
        if !ok {
            return Err(format!(
                "{}: reply of {} bytes does not hold the expected data",
                self.case,
                r.body.len()
            ));
        }
        if self.case.mode == Mode::WriteChunk && self.case.size > 0 && r.ddp_bytes != self.case.size
        {
            return Err(format!(
                "{}: {} result bytes came through the result buffer, expected {}",
                self.case, r.ddp_bytes, self.case.size
            ));
        }
        Ok(())
    }
}
