//! Builds each case's calls with the shm `Client` and checks every reply's data.

use crate::case::{Case, Mode, Proc};
use rpcrdma_shm::client::{Client, Error, Reply, Ticket};
use rpcrdma_shm::rdmatest::{self, pattern, XdrReader};

/// How many different seeds a case rotates through, so a stale or misplaced reply shows up as a mismatch.
pub const SEEDS: usize = 4;

/// The precomputed payloads of one case (one per seed), built before timing starts.
#[derive(Debug)]
pub struct Workload {
    case: Case,
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
    /// Payloads for `case`: `pattern(seed)` of the case's size for seeds 1..=[`SEEDS`].
    pub fn new(case: Case) -> Workload {
        let len = match case.proc_ {
            Proc::Echo | Proc::Read | Proc::Write => case.size as usize,
            _ => 0,
        };
        let data = (1..=SEEDS as u32).map(|s| (s, pattern(s, len))).collect();
        Workload { case, data }
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
                b.max_reply(reply_room(0));
            }
            Proc::Echo => {
                if self.case.mode == Mode::ReadChunk {
                    b.args().put_ddp_opaque(data);
                } else {
                    b.args().put_opaque(data);
                }
                if self.case.mode == Mode::WriteChunk && size > 0 {
                    b.result_buffer(size);
                } else {
                    b.max_reply(reply_room(size));
                }
            }
            Proc::Read => {
                b.args().put_u32(size).put_u32(seed);
                if self.case.mode == Mode::WriteChunk && size > 0 {
                    b.result_buffer(size);
                } else {
                    b.max_reply(reply_room(size));
                }
            }
            Proc::Write => {
                b.max_reply(reply_room(0));
                b.args().put_u32(seed);
                if self.case.mode == Mode::ReadChunk {
                    b.args().put_ddp_opaque(data);
                } else {
                    b.args().put_opaque(data);
                }
            }
            Proc::Sleep => {
                b.max_reply(reply_room(0));
                b.args().put_u32(size);
            }
            Proc::Callback => {
                b.max_reply(reply_room(0));
                b.args().put_u32(1).put_u32(size);
            }
        }
        b.submit()
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
