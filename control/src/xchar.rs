//! Transport characteristics (draft-dnoveck-nfsv4-rpcrdma-xcharext-02) of one version-two
//! connection: what we announce (INITXCH), how we answer a peer's REQXCH (RESPXCH, then
//! UPDXCH for pending changes), what we record of the peer. Sans-IO: messages in, actions out.

use rpcrdma_proto::xchar::{
    subset_insert, BkReqSup, Operation, Xchar, XcharSpec, XcharSubset, ROPT_INITXCH, ROPT_REQXCH,
    ROPT_RESPXCH, ROPT_UPDXCH, XCHAR_BRS, XCHAR_RBSIZ, XCHAR_REQREMINV,
};
use rpcrdma_proto::xdr::Writer;
use serde::{Deserialize, Serialize};

/// Most characteristics in one request we build or answer.
const MAX_ITEMS: usize = 32;
/// Largest RBSIZ accepted from a peer (RFC 8797's limit); smaller than 1024 is ignored too.
const SANE_RBSIZ: std::ops::RangeInclusive<u32> = 1024..=256 * 1024;

/// Bounds from the configuration and our real buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// RBSIZ we announce first (the RFC 8797 receive size).
    pub rbsiz: u32,
    /// Size of our posted receive buffers (RBSIZ may go up to it without reposting).
    pub buffer_size: u32,
    /// Smallest RBSIZ a peer may ask for.
    pub min_rbsiz: u32,
    /// Largest RBSIZ a peer may ask for.
    pub max_rbsiz: u32,
    /// Our REQREMINV.
    pub reqreminv: bool,
    /// Whether a REQXCH may change REQREMINV.
    pub reqreminv_may_change: bool,
}

/// One side's characteristics as operators see them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Chars {
    /// XCHAR_RBSIZ.
    pub rbsiz: u32,
    /// XCHAR_REQREMINV.
    pub reqreminv: bool,
    /// XCHAR_BRS: "none", "inline" or "genl".
    pub brs: String,
}

impl Default for Chars {
    /// The draft's defaults (XCH-3-a).
    fn default() -> Chars {
        Chars {
            rbsiz: rpcrdma_proto::xchar::DEFAULT_RBSIZ,
            reqreminv: false,
            brs: "inline".into(),
        }
    }
}

fn brs_name(b: BkReqSup) -> &'static str {
    match b {
        BkReqSup::None => "none",
        BkReqSup::Inline => "inline",
        BkReqSup::Genl => "genl",
    }
}

/// A characteristic value in owned form (for requests and pending changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// RBSIZ.
    RbSiz(u32),
    /// REQREMINV.
    ReqRemInv(bool),
    /// BRS.
    Brs(BkReqSup),
    /// Any id, raw XDR data.
    Other(u32, Vec<u8>),
}

impl Value {
    fn is_reqreminv(&self) -> bool {
        matches!(self, Value::ReqRemInv(_))
    }

    fn as_xchar(&self) -> Xchar<'_> {
        match self {
            Value::RbSiz(v) => Xchar::RbSiz(*v),
            Value::ReqRemInv(v) => Xchar::ReqRemInv(*v),
            Value::Brs(v) => Xchar::Brs(*v),
            Value::Other(which, data) => Xchar::Other {
                which: *which,
                data,
            },
        }
    }

    fn name(&self) -> String {
        match self {
            Value::RbSiz(v) => format!("rbsiz={v}"),
            Value::ReqRemInv(v) => format!("reqreminv={v}"),
            Value::Brs(v) => format!("brs={}", brs_name(*v)),
            Value::Other(w, d) => format!("id:{w}={}", hex(d)),
        }
    }

    /// Parses `rbsiz=8192`, `reqreminv=true`, `brs=genl` or `id:4294967040=0001` (hex data).
    pub fn parse(s: &str) -> Result<Value, String> {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("{s}: expected name=value"))?;
        let bad = |what: &str| format!("{s}: {what}");
        match k {
            "rbsiz" | "rbsize" => v
                .parse()
                .map(Value::RbSiz)
                .map_err(|_| bad("expected a byte count")),
            "reqreminv" => v
                .parse()
                .map(Value::ReqRemInv)
                .map_err(|_| bad("expected true or false")),
            "brs" => match v {
                "none" => Ok(Value::Brs(BkReqSup::None)),
                "inline" => Ok(Value::Brs(BkReqSup::Inline)),
                "genl" => Ok(Value::Brs(BkReqSup::Genl)),
                _ => Err(bad("expected none, inline or genl")),
            },
            _ => {
                let id = k
                    .strip_prefix("id:")
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or_else(|| {
                        bad("unknown characteristic (use rbsiz, reqreminv, brs or id:N)")
                    })?;
                // A known characteristic with raw data would go out malformed (an RBSIZ
                // without its size): it is named instead.
                if let Some(name) = known_name(id) {
                    return Err(bad(&format!("id {id} is {name}: use {name}=")));
                }
                if v.len() % 2 != 0 {
                    return Err(bad("hex data needs an even number of digits"));
                }
                let data = (0..v.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(v.get(i..i + 2).unwrap_or("zz"), 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| bad("data must be hex"))?;
                Ok(Value::Other(id, data))
            }
        }
    }
}

/// The name of a characteristic this side knows, by id.
fn known_name(id: u32) -> Option<&'static str> {
    match id {
        XCHAR_RBSIZ => Some("rbsiz"),
        XCHAR_REQREMINV => Some("reqreminv"),
        XCHAR_BRS => Some("brs"),
        _ => None,
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the connection should do after a message or an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send an RDMA2_OPTIONAL message with this operation and body.
    Send {
        /// `rdma_xid`.
        xid: u32,
        /// `rdma_opttype`.
        opttype: u32,
        /// `rdma_optinfo`.
        body: Vec<u8>,
    },
    /// The peer's receive size changed: our inline threshold follows.
    PeerRbsiz(u32),
    /// Our receive size is about to be announced: the engine applies it first (the
    /// threshold for what the peer sends, which decides our Reply chunks).
    OwnRbsiz(u32),
    /// While our REQXCH lowering the peer's RBSIZ is outstanding, what we send is capped at
    /// the value asked (XCH-3.1-d); `None` lifts the cap.
    PeerRbsizCap(Option<u32>),
    /// The peer's REQREMINV changed: whether our replies may use Send With Invalidate.
    PeerReqRemInv(bool),
    /// Answer the message with RDMA2_ERR_INVAL_OPTION (unsupported or undecodable).
    Reject,
    /// Report when no call of this connection is in flight (a pending change waits for it).
    NotifyWhenIdle,
}

/// How the peer answered one of our REQXCH.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RespOutcome {
    /// Changes in effect.
    pub done: Vec<String>,
    /// Refused.
    pub rejected: Vec<String>,
    /// Not yet: UPDXCH will follow.
    pub pending: Vec<String>,
}

/// What operators see of a connection's characteristics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct XcharView {
    /// Ours, as announced.
    pub local: Chars,
    /// The peer's, as announced (defaults until told).
    pub peer: Chars,
    /// Ids the peer said will not change.
    pub peer_nochg: Vec<u32>,
    /// We sent INITXCH.
    pub initxch_sent: bool,
    /// The peer sent INITXCH.
    pub initxch_received: bool,
    /// Changes the peer asked of us that are pending.
    pub pending_local: Vec<String>,
    /// Changes we asked of the peer that are pending.
    pub pending_peer: Vec<String>,
    /// Our send limit while a request lowering the peer's RBSIZ is outstanding (XCH-3.1-d).
    pub peer_rbsiz_cap: Option<u32>,
    /// Unknown characteristics ignored.
    pub unknown_ignored: u64,
}

/// The xcharext state of one connection.
#[derive(Debug, Clone)]
pub struct ConnXchar {
    policy: Policy,
    view: XcharView,
    next_xid: u32,
    /// Our REQXCH awaiting RESPXCH: its xid and wanted values.
    asked: Vec<(u32, Vec<Value>)>,
    /// Values we asked the peer for that it left pending (awaiting UPDXCH with pendclr).
    peer_pending: Vec<Value>,
    /// Changes of ours the peer asked for that wait for quiescence.
    local_pending: Vec<Value>,
    answers: Vec<(u32, RespOutcome)>,
}

/// The smallest RBSIZ among `vals`.
fn min_rbsiz<'a>(vals: impl Iterator<Item = &'a Value>) -> Option<u32> {
    vals.filter_map(|v| match v {
        Value::RbSiz(n) => Some(*n),
        _ => None,
    })
    .min()
}

fn encode(op: &Operation<'_>) -> Vec<u8> {
    let mut body = vec![0u8; op.buffer_len()];
    let mut w = Writer::new(&mut body);
    match op.emit_body(&mut w) {
        Ok(()) => body,
        Err(_) => Vec::new(),
    }
}

impl ConnXchar {
    /// State for a new connection; `client` picks the xid space of our messages.
    pub fn new(policy: Policy, client: bool) -> ConnXchar {
        ConnXchar {
            view: XcharView {
                local: Chars {
                    rbsiz: policy.rbsiz,
                    reqreminv: policy.reqreminv,
                    brs: "inline".into(),
                },
                ..XcharView::default()
            },
            policy,
            next_xid: if client { 0xc000_0000 } else { 0xd000_0000 },
            asked: Vec::new(),
            peer_pending: Vec::new(),
            local_pending: Vec::new(),
            answers: Vec::new(),
        }
    }

    /// The operator view.
    pub fn view(&self) -> &XcharView {
        &self.view
    }

    fn xid(&mut self) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        self.next_xid
    }

    /// Our INITXCH: RBSIZ, REQREMINV, BRS; BRS never changes, REQREMINV only if allowed,
    /// RBSIZ only if the policy leaves room (XCH-4.1-b). The engine applies our RBSIZ
    /// before the message goes out.
    pub fn initxch(&mut self) -> Vec<Action> {
        let own = Action::OwnRbsiz(self.view.local.rbsiz);
        vec![own, self.initxch_msg()]
    }

    fn initxch_msg(&mut self) -> Action {
        let p = self.policy;
        let start = [
            Xchar::RbSiz(self.view.local.rbsiz),
            Xchar::ReqRemInv(self.view.local.reqreminv),
            Xchar::Brs(BkReqSup::Inline),
        ];
        let mut nochg = [0u32; 1];
        if p.min_rbsiz >= p.buffer_size.min(p.max_rbsiz) {
            subset_insert(&mut nochg, 0);
        }
        if !p.reqreminv_may_change {
            subset_insert(&mut nochg, 1);
        }
        subset_insert(&mut nochg, 2);
        let body = encode(&Operation::InitXch {
            start: XcharSpec::from_values(&start),
            nochg: XcharSubset::from_words(&nochg),
        });
        self.view.initxch_sent = true;
        Action::Send {
            xid: self.xid(),
            opttype: ROPT_INITXCH,
            body,
        }
    }

    /// Our REQXCH for `want`; the answer is collected by [`ConnXchar::take_answer`]. A
    /// lower RBSIZ asked of the peer caps what we send from now on (XCH-3.1-d): the cap
    /// comes first among the actions.
    pub fn request(&mut self, want: Vec<Value>) -> (u32, Vec<Action>) {
        let vals: Vec<Xchar<'_>> = want.iter().map(Value::as_xchar).collect();
        let body = encode(&Operation::ReqXch {
            want: XcharSpec::from_values(&vals),
        });
        let xid = self.xid();
        self.asked.push((xid, want));
        let mut out: Vec<Action> = self.recap().into_iter().collect();
        out.push(Action::Send {
            xid,
            opttype: ROPT_REQXCH,
            body,
        });
        (xid, out)
    }

    /// Gives up on our request `xid` (no RESPXCH came: the peer may not support REQXCH,
    /// XCH-3-d): it counts as rejected, and a send cap it set is lifted.
    pub fn abandon(&mut self, xid: u32) -> Vec<Action> {
        self.asked.retain(|(x, _)| *x != xid);
        self.recap().into_iter().collect()
    }

    /// The cap on what we send: the lowest RBSIZ we asked of the peer that is still
    /// outstanding (awaiting RESPXCH, or pending until UPDXCH with pendclr), if below what
    /// the peer announced. An action when it changed.
    fn recap(&mut self) -> Option<Action> {
        let asked = self.asked.iter().flat_map(|(_, w)| w.iter());
        let cap =
            min_rbsiz(asked.chain(self.peer_pending.iter())).filter(|&c| c < self.view.peer.rbsiz);
        (cap != self.view.peer_rbsiz_cap).then(|| {
            self.view.peer_rbsiz_cap = cap;
            Action::PeerRbsizCap(cap)
        })
    }

    /// The RESPXCH outcome of our request `xid`, once it arrived.
    pub fn take_answer(&mut self, xid: u32) -> Option<RespOutcome> {
        let i = self.answers.iter().position(|(x, _)| *x == xid)?;
        Some(self.answers.swap_remove(i).1)
    }

    /// An operator-initiated change of ours, announced with an unsolicited UPDXCH (a new
    /// RBSIZ is applied by the engine first).
    pub fn set(&mut self, v: Value) -> Result<Vec<Action>, String> {
        let mut out = Vec::new();
        match &v {
            Value::RbSiz(n) if (self.policy.min_rbsiz..=self.allowed_rbsiz()).contains(n) => {
                self.view.local.rbsiz = *n;
                out.push(Action::OwnRbsiz(*n));
            }
            Value::RbSiz(n) => {
                return Err(format!(
                    "rbsiz {n} outside {}..={} (receive buffers and xcharext bounds)",
                    self.policy.min_rbsiz,
                    self.allowed_rbsiz()
                ))
            }
            Value::ReqRemInv(b) if self.policy.reqreminv_may_change => {
                self.view.local.reqreminv = *b;
            }
            Value::ReqRemInv(_) => {
                return Err("reqreminv is fixed (transport.xcharext.reqreminv-may-change)".into())
            }
            Value::Brs(_) => return Err("brs is fixed for the connection".into()),
            Value::Other(..) => {}
        }
        out.push(self.update(&v, false));
        Ok(out)
    }

    fn update(&mut self, v: &Value, pendclr: bool) -> Action {
        let body = encode(&Operation::UpdXch {
            now: v.as_xchar(),
            pendclr,
        });
        Action::Send {
            xid: self.xid(),
            opttype: ROPT_UPDXCH,
            body,
        }
    }

    fn allowed_rbsiz(&self) -> u32 {
        self.policy.buffer_size.min(self.policy.max_rbsiz)
    }

    /// Records a peer value, returning the engine action it implies.
    fn learn(&mut self, x: &Xchar<'_>) -> Option<Action> {
        match *x {
            Xchar::RbSiz(v) if SANE_RBSIZ.contains(&v) => {
                self.view.peer.rbsiz = v;
                Some(Action::PeerRbsiz(v))
            }
            // XCH-7-a: an absurd size is not believed.
            Xchar::RbSiz(_) => None,
            Xchar::ReqRemInv(b) => {
                self.view.peer.reqreminv = b;
                Some(Action::PeerReqRemInv(b))
            }
            Xchar::Brs(b) => {
                self.view.peer.brs = brs_name(b).into();
                None
            }
            Xchar::Other { .. } => {
                self.view.unknown_ignored += 1;
                None
            }
        }
    }

    /// Handles a received RDMA2_OPTIONAL; `busy`: calls of this connection are in flight.
    pub fn on_message(&mut self, xid: u32, opttype: u32, body: &[u8], busy: bool) -> Vec<Action> {
        let mut out = Vec::new();
        let Ok(op) = Operation::parse(opttype, body) else {
            out.push(Action::Reject);
            return out;
        };
        match op {
            Operation::InitXch { start, nochg } => {
                self.view.initxch_received = true;
                self.view.peer_nochg.clear();
                for (i, x) in start.iter().enumerate() {
                    if nochg.contains(i) {
                        self.view.peer_nochg.push(x.which());
                    }
                    out.extend(self.learn(&x));
                }
                if !self.view.initxch_sent {
                    out.extend(self.initxch());
                }
                // A cap at or above the peer's new size no longer binds.
                out.extend(self.recap());
            }
            Operation::ReqXch { want } => {
                let before = self.view.local.rbsiz;
                let mut done = [0u32; MAX_ITEMS / 32];
                let mut rej = [0u32; MAX_ITEMS / 32];
                let mut pend = [0u32; MAX_ITEMS / 32];
                for (i, x) in want.iter().enumerate() {
                    let target = self.decide(&x, busy);
                    let set = match target {
                        Decision::Done => &mut done,
                        Decision::Rej => &mut rej,
                        Decision::Pend => &mut pend,
                    };
                    // Beyond MAX_ITEMS the index cannot be encoded: the request is refused whole.
                    if !subset_insert(set, i) {
                        self.view.local.rbsiz = before;
                        out.push(Action::Reject);
                        return out;
                    }
                }
                if !self.local_pending.is_empty() {
                    out.push(Action::NotifyWhenIdle);
                }
                // The engine uses a changed RBSIZ before the RESPXCH reports it.
                if self.view.local.rbsiz != before {
                    out.push(Action::OwnRbsiz(self.view.local.rbsiz));
                }
                out.push(Action::Send {
                    xid,
                    opttype: ROPT_RESPXCH,
                    body: encode(&Operation::RespXch {
                        done: XcharSubset::from_words(&done),
                        rej: XcharSubset::from_words(&rej),
                        pend: XcharSubset::from_words(&pend),
                    }),
                });
            }
            Operation::RespXch { done, rej, pend } => {
                let Some(i) = self.asked.iter().position(|(x, _)| *x == xid) else {
                    return out;
                };
                let (_, want) = self.asked.swap_remove(i);
                let mut o = RespOutcome::default();
                for (k, v) in want.iter().enumerate() {
                    if done.contains(k) {
                        o.done.push(v.name());
                        out.extend(self.learn(&v.as_xchar()));
                    } else if pend.contains(k) {
                        o.pending.push(v.name());
                        self.peer_pending.push(v.clone());
                    } else if rej.contains(k) {
                        o.rejected.push(v.name());
                    } else {
                        // AMB-29: an entry in no subset is taken as rejected.
                        o.rejected.push(v.name());
                    }
                }
                self.view.pending_peer = self.peer_pending.iter().map(Value::name).collect();
                out.extend(self.recap());
                self.answers.push((xid, o));
            }
            Operation::UpdXch { now, pendclr } => {
                out.extend(self.learn(&now));
                if pendclr {
                    let which = now.which();
                    self.peer_pending.retain(|v| v.as_xchar().which() != which);
                    self.view.pending_peer = self.peer_pending.iter().map(Value::name).collect();
                }
                // While a lower RBSIZ is still pending, a larger update does not lift the cap.
                out.extend(self.recap());
            }
        }
        out
    }

    fn decide(&mut self, x: &Xchar<'_>, busy: bool) -> Decision {
        match *x {
            Xchar::RbSiz(v) if v == self.view.local.rbsiz => Decision::Done,
            // Our buffers are already this large: announcing a size up to them needs no repost.
            Xchar::RbSiz(v) if (self.policy.min_rbsiz..=self.allowed_rbsiz()).contains(&v) => {
                self.view.local.rbsiz = v;
                Decision::Done
            }
            Xchar::RbSiz(_) => Decision::Rej,
            // A request while a change is pending replaces it and is pending too: the UPDXCH
            // with pendclr that ends it settles every request for the characteristic
            // (XCH-4.4-b), and repeated requests cannot grow the list.
            Xchar::ReqRemInv(b) if self.local_pending.iter().any(Value::is_reqreminv) => {
                self.set_pending(Value::ReqRemInv(b));
                Decision::Pend
            }
            Xchar::ReqRemInv(b) if b == self.view.local.reqreminv => Decision::Done,
            Xchar::ReqRemInv(_) if !self.policy.reqreminv_may_change => Decision::Rej,
            // Changing how the peer may answer our calls waits until none is in flight.
            Xchar::ReqRemInv(b) if busy => {
                self.set_pending(Value::ReqRemInv(b));
                Decision::Pend
            }
            Xchar::ReqRemInv(b) => {
                self.view.local.reqreminv = b;
                Decision::Done
            }
            Xchar::Brs(_) | Xchar::Other { .. } => Decision::Rej,
        }
    }

    /// Makes `v` the pending change of REQREMINV (the only characteristic whose change
    /// waits), replacing one pending already.
    fn set_pending(&mut self, v: Value) {
        self.local_pending.retain(|p| !p.is_reqreminv());
        self.local_pending.push(v);
        self.view.pending_local = self.local_pending.iter().map(Value::name).collect();
    }

    /// No call of the connection is in flight: pending changes take effect, each announced
    /// with UPDXCH and `pendclr` (XCH-4.4-b).
    pub fn on_idle(&mut self) -> Vec<Action> {
        let pending = std::mem::take(&mut self.local_pending);
        self.view.pending_local.clear();
        pending
            .into_iter()
            .map(|v| {
                if let Value::ReqRemInv(b) = v {
                    self.view.local.reqreminv = b;
                }
                self.update(&v, true)
            })
            .collect()
    }
}

enum Decision {
    Done,
    Rej,
    Pend,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            rbsiz: 4096,
            buffer_size: 8192,
            min_rbsiz: 1024,
            max_rbsiz: 8192,
            reqreminv: false,
            reqreminv_may_change: true,
        }
    }

    fn sent(a: &Action) -> (u32, u32, Vec<u8>) {
        match a {
            Action::Send { xid, opttype, body } => (*xid, *opttype, body.clone()),
            other => panic!("not a send: {other:?}"),
        }
    }

    /// Runs `a`'s REQXCH through a peer `b` and `b`'s RESPXCH back into `a`.
    fn exchange(
        a: &mut ConnXchar,
        b: &mut ConnXchar,
        want: Vec<Value>,
        busy: bool,
    ) -> (RespOutcome, Vec<Action>) {
        let (xid, req) = a.request(want);
        let (x, t, body) = sent(req.last().expect("REQXCH"));
        let acts = b.on_message(x, t, &body, busy);
        let resp = acts
            .iter()
            .find(|a| {
                matches!(
                    a,
                    Action::Send {
                        opttype: ROPT_RESPXCH,
                        ..
                    }
                )
            })
            .expect("RESPXCH");
        let (rx, rt, rbody) = sent(resp);
        assert_eq!(rx, xid, "XCH-4.3-a: RESPXCH carries the request's xid");
        a.on_message(rx, rt, &rbody, false);
        (a.take_answer(xid).expect("answer"), acts)
    }

    #[test]
    fn xch_4_1_b_initxch_is_recorded_with_nochg_and_answered_once() {
        let mut a = ConnXchar::new(
            Policy {
                reqreminv_may_change: false,
                ..policy()
            },
            true,
        );
        let mut b = ConnXchar::new(policy(), false);
        let init = a.initxch();
        assert_eq!(
            init[0],
            Action::OwnRbsiz(4096),
            "applied before it is announced"
        );
        let (x, t, body) = sent(&init[1]);
        assert_eq!(t, ROPT_INITXCH);
        let acts = b.on_message(x, t, &body, false);
        assert!(acts.contains(&Action::PeerRbsiz(4096)));
        assert!(acts.contains(&Action::PeerReqRemInv(false)));
        assert!(b.view().initxch_received);
        assert_eq!(b.view().peer_nochg, vec![XCHAR_REQREMINV, XCHAR_BRS]);
        // The server answers with its own INITXCH, once.
        let reply = acts
            .iter()
            .find(|a| matches!(a, Action::Send { .. }))
            .expect("INITXCH back");
        let (x, t, body) = sent(reply);
        assert_eq!(t, ROPT_INITXCH);
        let back = a.on_message(x, t, &body, false);
        assert!(!back.iter().any(|a| matches!(a, Action::Send { .. })));
        assert!(a.view().initxch_received);
    }

    #[test]
    fn xch_4_3_c_respxch_subsets_cover_the_request_exactly() {
        let mut a = ConnXchar::new(policy(), true);
        let mut b = ConnXchar::new(policy(), false);
        let want = vec![
            Value::RbSiz(2048),
            Value::Brs(BkReqSup::Genl),
            Value::Other(0xffff_ff10, vec![0, 0, 0, 1]),
            Value::RbSiz(1 << 20),
        ];
        let (o, _) = exchange(&mut a, &mut b, want, false);
        assert_eq!(o.done, vec!["rbsiz=2048"]);
        assert_eq!(
            o.rejected,
            vec!["brs=genl", "id:4294967056=00000001", "rbsiz=1048576"]
        );
        assert!(o.pending.is_empty());
        assert_eq!(b.view().local.rbsiz, 2048, "applied before it is reported");
        assert_eq!(a.view().peer.rbsiz, 2048);
    }

    #[test]
    fn xch_3_c_reqreminv_refused_when_configured_immutable() {
        let mut a = ConnXchar::new(policy(), true);
        let mut b = ConnXchar::new(
            Policy {
                reqreminv_may_change: false,
                ..policy()
            },
            false,
        );
        let (o, _) = exchange(&mut a, &mut b, vec![Value::ReqRemInv(true)], false);
        assert_eq!(o.rejected, vec!["reqreminv=true"]);
        assert!(!b.view().local.reqreminv);
    }

    #[test]
    fn xch_4_4_b_pending_change_completes_with_updxch_pendclr() {
        let mut a = ConnXchar::new(policy(), true);
        let mut b = ConnXchar::new(policy(), false);
        let (o, acts) = exchange(&mut a, &mut b, vec![Value::ReqRemInv(true)], true);
        assert_eq!(o.pending, vec!["reqreminv=true"]);
        assert!(acts.contains(&Action::NotifyWhenIdle));
        assert_eq!(a.view().pending_peer, vec!["reqreminv=true"]);
        assert!(
            !b.view().local.reqreminv,
            "not applied while calls are in flight"
        );
        let upd = b.on_idle();
        assert_eq!(upd.len(), 1);
        assert!(b.view().local.reqreminv);
        let (x, t, body) = sent(&upd[0]);
        assert_eq!(t, ROPT_UPDXCH);
        let acts = a.on_message(x, t, &body, false);
        assert!(acts.contains(&Action::PeerReqRemInv(true)));
        assert!(
            a.view().pending_peer.is_empty(),
            "pendclr clears the request"
        );
    }

    /// A peer repeating a request while calls are in flight keeps one pending change, the
    /// last asked: the list never grows with the requests (it did, one entry per REQXCH,
    /// without bound while the connection stayed busy), and a later request for the current
    /// value is not overtaken by an earlier change still pending (which was applied once
    /// idle, after the later request had been answered done).
    #[test]
    fn xch_4_4_b_repeated_requests_while_busy_keep_one_pending_change() {
        let mut b = ConnXchar::new(policy(), false);
        let ask = |b: &mut ConnXchar, k: u32, v: bool| {
            let body = encode(&Operation::ReqXch {
                want: XcharSpec::from_values(&[Xchar::ReqRemInv(v)]),
            });
            let acts = b.on_message(k, ROPT_REQXCH, &body, true);
            assert!(acts.iter().any(|a| matches!(
                a,
                Action::Send {
                    opttype: ROPT_RESPXCH,
                    ..
                }
            )));
        };
        for k in 0..1000u32 {
            ask(&mut b, k, true);
        }
        assert_eq!(b.view().pending_local, vec!["reqreminv=true"]);
        ask(&mut b, 1000, false);
        assert_eq!(b.view().pending_local, vec!["reqreminv=false"]);
        let upd = b.on_idle();
        assert_eq!(upd.len(), 1, "one UPDXCH (pendclr) settles every request");
        let Action::Send { opttype, body, .. } = &upd[0] else {
            panic!("{upd:?}")
        };
        assert_eq!(
            Operation::parse(*opttype, body).ok(),
            Some(Operation::UpdXch {
                now: Xchar::ReqRemInv(false),
                pendclr: true
            })
        );
        assert!(!b.view().local.reqreminv);
    }

    #[test]
    fn xch_4_1_d_unknown_characteristic_in_initxch_is_ignored() {
        let mut b = ConnXchar::new(policy(), false);
        let start = [
            Xchar::Other {
                which: 99,
                data: &[1, 2, 3, 4],
            },
            Xchar::RbSiz(8192),
        ];
        let body = encode(&Operation::InitXch {
            start: XcharSpec::from_values(&start),
            nochg: XcharSubset::EMPTY,
        });
        let acts = b.on_message(1, ROPT_INITXCH, &body, false);
        assert!(acts.contains(&Action::PeerRbsiz(8192)));
        assert!(!acts.contains(&Action::Reject));
        assert_eq!(b.view().unknown_ignored, 1);
    }

    #[test]
    fn xch_7_a_absurd_rbsiz_is_not_believed_and_garbage_is_rejected() {
        let mut b = ConnXchar::new(policy(), false);
        let body = encode(&Operation::UpdXch {
            now: Xchar::RbSiz(16),
            pendclr: false,
        });
        assert!(b.on_message(1, ROPT_UPDXCH, &body, false).is_empty());
        assert_eq!(b.view().peer.rbsiz, 4096);
        assert_eq!(
            b.on_message(2, ROPT_UPDXCH, &[0, 0, 0], false),
            vec![Action::Reject]
        );
        assert_eq!(b.on_message(3, 77, &[], false), vec![Action::Reject]);
    }

    #[test]
    fn operator_set_announces_unsolicited_update_within_bounds() {
        let mut a = ConnXchar::new(policy(), true);
        let acts = a.set(Value::RbSiz(8192)).expect("allowed");
        assert_eq!(
            acts[0],
            Action::OwnRbsiz(8192),
            "XCH-3-e: applied before UPDXCH"
        );
        let (_, t, body) = sent(&acts[1]);
        assert_eq!(t, ROPT_UPDXCH);
        assert_eq!(
            Operation::parse(t, &body).expect("decodes"),
            Operation::UpdXch {
                now: Xchar::RbSiz(8192),
                pendclr: false
            }
        );
        assert!(a.set(Value::RbSiz(16384)).is_err());
        assert!(a.set(Value::Brs(BkReqSup::None)).is_err());
    }

    /// Position of the first action matching `f`.
    fn pos(acts: &[Action], f: impl Fn(&Action) -> bool) -> usize {
        acts.iter().position(f).expect("action present")
    }

    #[test]
    fn xch_3_e_own_rbsiz_is_applied_before_the_respxch_announcing_it() {
        let mut a = ConnXchar::new(policy(), true);
        let mut b = ConnXchar::new(policy(), false);
        for size in [2048, 8192] {
            let (o, acts) = exchange(&mut a, &mut b, vec![Value::RbSiz(size)], false);
            assert_eq!(o.done, vec![format!("rbsiz={size}")]);
            let own = pos(&acts, |x| *x == Action::OwnRbsiz(size));
            let resp = pos(
                &acts,
                |x| matches!(x, Action::Send { opttype, .. } if *opttype == ROPT_RESPXCH),
            );
            assert!(own < resp, "{acts:?}");
        }
        // A size beyond the posted buffers is rejected and nothing is applied (XCH-3-c).
        let (o, acts) = exchange(&mut a, &mut b, vec![Value::RbSiz(16384)], false);
        assert_eq!(o.rejected, vec!["rbsiz=16384"]);
        assert!(!acts.iter().any(|x| matches!(x, Action::OwnRbsiz(_))));
    }

    #[test]
    fn xch_3_1_d_asking_a_lower_rbsiz_caps_sends_until_settled() {
        let mut a = ConnXchar::new(policy(), true);
        // Asked: the cap comes before the REQXCH leaves.
        let (xid, acts) = a.request(vec![Value::RbSiz(2048)]);
        assert_eq!(acts[0], Action::PeerRbsizCap(Some(2048)));
        assert!(matches!(acts[1], Action::Send { opttype, .. } if opttype == ROPT_REQXCH));
        assert_eq!(a.view().peer_rbsiz_cap, Some(2048));
        // Pending: still capped; an update above it while pending does not lift the cap.
        let resp = encode(&Operation::RespXch {
            done: XcharSubset::EMPTY,
            rej: XcharSubset::EMPTY,
            pend: XcharSubset::from_words(&[1]),
        });
        let acts = a.on_message(xid, ROPT_RESPXCH, &resp, false);
        assert!(!acts.iter().any(|x| matches!(x, Action::PeerRbsizCap(_))));
        let upd = |v, pendclr| {
            encode(&Operation::UpdXch {
                now: Xchar::RbSiz(v),
                pendclr,
            })
        };
        let acts = a.on_message(9, ROPT_UPDXCH, &upd(8192, false), false);
        assert_eq!(acts, vec![Action::PeerRbsiz(8192)]);
        assert_eq!(a.view().peer_rbsiz_cap, Some(2048));
        // Settled (UPDXCH with pendclr): the announced size rules again.
        let acts = a.on_message(10, ROPT_UPDXCH, &upd(2048, true), false);
        assert_eq!(
            acts,
            vec![Action::PeerRbsiz(2048), Action::PeerRbsizCap(None)]
        );
        // Rejected: the cap is lifted.
        let (xid, _) = a.request(vec![Value::RbSiz(1024)]);
        let resp = encode(&Operation::RespXch {
            done: XcharSubset::EMPTY,
            rej: XcharSubset::from_words(&[1]),
            pend: XcharSubset::EMPTY,
        });
        let acts = a.on_message(xid, ROPT_RESPXCH, &resp, false);
        assert_eq!(acts, vec![Action::PeerRbsizCap(None)]);
        // No answer at all (XCH-3-d): abandoning the request lifts it too.
        let (xid, acts) = a.request(vec![Value::RbSiz(1024)]);
        assert_eq!(acts[0], Action::PeerRbsizCap(Some(1024)));
        assert_eq!(a.abandon(xid), vec![Action::PeerRbsizCap(None)]);
    }

    #[test]
    fn values_parse_from_the_command_line() {
        assert_eq!(Value::parse("rbsize=8192"), Ok(Value::RbSiz(8192)));
        assert_eq!(Value::parse("reqreminv=true"), Ok(Value::ReqRemInv(true)));
        assert_eq!(Value::parse("brs=genl"), Ok(Value::Brs(BkReqSup::Genl)));
        assert_eq!(Value::parse("id:7=00ff"), Ok(Value::Other(7, vec![0, 255])));
        assert!(Value::parse("rbsiz").is_err());
        assert!(Value::parse("colour=red").is_err());
        assert!(Value::parse("id:7=0").is_err());
        assert!(Value::parse("id:7=zz").is_err());
        // A known characteristic by its id would go out with raw data, malformed (found by
        // the xchar_conn fuzz target: an UPDXCH of RBSIZ without its size).
        assert_eq!(
            Value::parse("id:1="),
            Err("id:1=: id 1 is rbsiz: use rbsiz=".to_string())
        );
        assert!(Value::parse("id:2=00000001").is_err());
        assert!(Value::parse("id:3=").is_err());
    }
}
