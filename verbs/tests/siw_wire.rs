//! The soft provider against a peer that speaks raw bytes the way Linux siw does
//! (spec/IWARP.md): MPA exchange in both roles, CRC on and off, Terminates byte by byte.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rpcrdma_verbs::conformance::readable;
use rpcrdma_verbs::soft::{wire, SoftConfig, SoftProvider, SoftTcp};
use rpcrdma_verbs::{
    Access, CmEvent, ConnParams, ConnectFailure, CqId, Mr, Provider, QpId, QpInit, SendOp, SendWr,
    Sge, WcStatus, WorkCompletion,
};

const CLIENT_PD: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03];
const SERVER_PD: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x00, 0x03, 0x03];

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// IWARP.md §6 Send FPDU (MSN 1, CRC on).
fn golden_send() -> Vec<u8> {
    hex("00 56 41 43 00 00 00 00 00 00 00 00 00 00 00 01
         00 00 00 00 12 34 56 78 00 00 00 01 00 00 00 20
         00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
         12 34 56 78 00 00 00 00 00 00 00 02 00 01 86 a3
         00 00 00 03 00 00 00 00 00 00 00 00 00 00 00 00
         00 00 00 00 00 00 00 00 f2 00 c7 3b")
}

struct Node {
    p: SoftTcp,
    cq: CqId,
    mr: Mr,
    qp: Option<QpId>,
    init: QpInit,
    events: Vec<CmEvent>,
    wcs: Vec<WorkCompletion>,
    _buf: Vec<u8>,
}

impl Node {
    fn new(cfg: SoftConfig) -> Node {
        let mut p = SoftProvider::tcp(cfg).unwrap();
        let pd = p.alloc_pd().unwrap();
        let cq = p.create_cq(64).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        // SAFETY: `buf` is owned by the node and outlives the provider's use of it (the node
        // drops both together); it is never resized.
        let mr = unsafe {
            p.register(
                pd,
                buf.as_mut_ptr(),
                buf.len(),
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
        }
        .unwrap();
        let init = QpInit {
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_sge: 2,
        };
        Node {
            p,
            cq,
            mr,
            qp: None,
            init,
            events: Vec::new(),
            wcs: Vec::new(),
            _buf: buf,
        }
    }

    fn step(&mut self) {
        while let Some(e) = self.p.poll_cm() {
            self.events.push(e);
        }
        let mut w = [WorkCompletion::default(); 8];
        let n = self.p.poll_cq(self.cq, &mut w).unwrap();
        self.wcs.extend_from_slice(&w[..n]);
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr_at(off),
            len,
            lkey: self.mr.lkey,
        }
    }
}

/// Read exactly `n` bytes from the raw peer while driving the node.
fn read_exact(node: &mut Node, s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    let start = Instant::now();
    while got < n {
        node.step();
        match s.read(&mut out[got..]) {
            Ok(0) => panic!("peer closed after {got} of {n} bytes: {:02x?}", &out[..got]),
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "hang guard: {got}/{n}"
        );
    }
    out
}

/// Drive the node until the raw peer sees end of stream (after any bytes).
fn expect_close(node: &mut Node, s: &mut TcpStream) {
    let start = Instant::now();
    let mut b = [0u8; 256];
    loop {
        node.step();
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(n) => panic!("unexpected bytes {:02x?}", &b[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("read: {e}"),
        }
        assert!(start.elapsed() < Duration::from_secs(20), "hang guard");
    }
}

fn wait(node: &mut Node, what: &str, f: impl Fn(&Node) -> bool) {
    let start = Instant::now();
    while !f(node) {
        node.step();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "hang guard: {what}"
        );
    }
}

/// Listen, connect a raw socket, send `request`, accept with the given depths.
fn accept_raw(cfg: SoftConfig, request: &[u8], ird: u16, ord: u16) -> (Node, TcpStream, CmEvent) {
    let mut n = Node::new(cfg);
    let l = n.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = n.p.listen_addr(l).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    s.write_all(request).unwrap();
    wait(&mut n, "connect request", |n| !n.events.is_empty());
    let ev = n.events.remove(0);
    let CmEvent::ConnectRequest { req, .. } = ev else {
        panic!("{ev:?}")
    };
    let qp = n.p.create_qp(&n.init).unwrap();
    n.qp = Some(qp);
    n.p.accept(
        req,
        qp,
        &ConnParams {
            private_data: &SERVER_PD,
            responder_resources: ird,
            initiator_depth: ord,
        },
    )
    .unwrap();
    (n, s, ev)
}

fn siw_request(flags: u8, ird: u16, ord: u16) -> Vec<u8> {
    let mut r = Vec::new();
    wire::emit_mpa(&mut r, false, flags, 2, Some((ird, ord)), &CLIENT_PD);
    r
}

#[test]
fn iwarp_1_4_responder_answers_siw_request_and_terminates_send_without_receive() {
    // The Request exactly as xprtrdma over siw sends it (IWARP.md §6).
    let req = hex("4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65
         10 02 00 0c 00 80 00 00 f6 ab 0e 18 01 01 03 03");
    let cfg = SoftConfig {
        crc: false,
        ..SoftConfig::default()
    };
    let (mut n, mut s, ev) = accept_raw(cfg, &req, 0, 128);
    assert_eq!(
        ev,
        CmEvent::ConnectRequest {
            listener: rpcrdma_verbs::ListenerId(0),
            req: rpcrdma_verbs::ConnReqId(0),
            private_data: rpcrdma_verbs::PrivateData::new(&CLIENT_PD),
            // The connecting socket's own address, as the listener saw it.
            remote: Some(s.local_addr().unwrap()),
            responder_resources: 128,
            initiator_depth: 0,
        }
    );
    // The Reply svcrdma over siw would send: echoed word, IRD 0, ORD 128, RFC 8797 data.
    let rep = read_exact(&mut n, &mut s, 32);
    let mut want = wire::MPA_REP_KEY.to_vec();
    want.extend(hex("10 02 00 0c 00 00 00 80 f6 ab 0e 18 01 00 03 03"));
    assert_eq!(rep, want);

    let qp = n.qp.unwrap();
    let r = n.sge(0, 1024);
    n.p.post_recv(qp, 1, &[r]).unwrap();
    let send = golden_send();
    s.write_all(&send).unwrap();
    wait(&mut n, "receive", |n| !n.wcs.is_empty());
    assert_eq!(n.wcs[0].status, WcStatus::Success);
    assert_eq!(n.wcs[0].byte_len, 68);

    // MSN 2 with no receive posted: Terminate DDP / untagged / no buffer, M D, then close.
    let mut send2 = send.clone();
    send2[15] = 2;
    s.write_all(&send2).unwrap();
    let term = read_exact(&mut n, &mut s, 48);
    let want = hex("00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
         00 00 00 00 12 02 c0 00 00 44 41 43 00 00 00 00
         00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00");
    assert_eq!(term, want, "CRC off: zero CRC field");
    expect_close(&mut n, &mut s);
    wait(&mut n, "disconnected", |n| {
        n.events.contains(&CmEvent::Disconnected { qp })
    });
}

#[test]
fn iwarp_2_bad_crc_answered_with_llp_crc_terminate() {
    let (mut n, mut s, _) = accept_raw(
        SoftConfig::default(),
        &siw_request(wire::MPA_ENHANCED | wire::MPA_C, 4, 4),
        4,
        4,
    );
    let rep = read_exact(&mut n, &mut s, 32);
    assert_eq!(rep[16], wire::MPA_ENHANCED | wire::MPA_C);
    let qp = n.qp.unwrap();
    let r = n.sge(0, 1024);
    n.p.post_recv(qp, 1, &[r]).unwrap();
    let mut send = golden_send();
    send[40] ^= 0x80;
    s.write_all(&send).unwrap();
    let term = read_exact(&mut n, &mut s, 28);
    assert_eq!(
        term,
        hex("00 16 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 20 02 00 00 7f e4 25 85")
    );
    expect_close(&mut n, &mut s);
    wait(&mut n, "receive flushed", |n| {
        n.wcs
            .iter()
            .any(|w| w.wr_id == 1 && w.status == WcStatus::Flushed)
    });
}

#[test]
fn iwarp_4_ird_exceeded_answered_with_rdmap_terminate() {
    // Peer ORD 0, our IRD 1 (relaxed negotiation keeps max(ULP IRD, peer ORD)).
    let (mut n, mut s, _) = accept_raw(
        SoftConfig {
            crc: false,
            ..SoftConfig::default()
        },
        &siw_request(wire::MPA_ENHANCED, 1, 0),
        1,
        0,
    );
    let rep = read_exact(&mut n, &mut s, 32);
    assert_eq!(&rep[20..24], &[0, 1, 0, 0], "IRD 1, ORD min(0, peer IRD)");
    let mut two = Vec::new();
    for msn in [1, 2] {
        let r = wire::ReadRequest {
            msn,
            sink_stag: 0x1234,
            sink_to: 0,
            size: 8,
            src_stag: n.mr.rkey,
            src_to: n.mr.addr,
        };
        wire::emit_read_request(&mut two, &r, false);
    }
    s.write_all(&two).unwrap();
    // Possibly one Read Response first (8 bytes of data, 28-byte FPDU), then the Terminate.
    let first = read_exact(&mut n, &mut s, 4);
    let term = if first[2..4] == [0xc1, 0x42] {
        let _ = read_exact(&mut n, &mut s, 24);
        read_exact(&mut n, &mut s, 48)
    } else {
        let mut t = first;
        t.extend(read_exact(&mut n, &mut s, 44));
        t
    };
    assert_eq!(&term[..4], &[0x00, 0x2a, 0x41, 0x47]);
    assert_eq!(
        &term[20..24],
        &[0x02, 0x07, 0xc0, 0x00],
        "RDMAP/remote op/IRD, M D"
    );
    assert_eq!(
        &term[26..44],
        &two[52 + 2..52 + 2 + 18],
        "second Request's DDP header"
    );
    expect_close(&mut n, &mut s);
}

#[test]
fn iwarp_1_4_initiator_request_bytes_and_siw_style_reply() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut n = Node::new(SoftConfig::default());
    let qp = n.p.create_qp(&n.init).unwrap();
    n.p.connect(
        qp,
        addr,
        &ConnParams {
            private_data: &CLIENT_PD,
            responder_resources: 128,
            initiator_depth: 0,
        },
    )
    .unwrap();
    let mut s = loop {
        n.step();
        listener.set_nonblocking(true).unwrap();
        if let Ok((s, _)) = listener.accept() {
            break s;
        }
    };
    s.set_nonblocking(true).unwrap();
    let req = read_exact(&mut n, &mut s, 32);
    let mut want = wire::MPA_REQ_KEY.to_vec();
    want.extend(hex("50 02 00 0c 00 80 00 00 f6 ab 0e 18 01 01 03 03"));
    assert_eq!(
        req, want,
        "rev 2, Enhanced + CRC, IRD 128 ORD 0, RFC 8797 data"
    );
    // siw echoes the word; IRD 0, ORD min(ULP ord, our IRD).
    let mut rep = Vec::new();
    wire::emit_mpa(
        &mut rep,
        true,
        wire::MPA_ENHANCED | wire::MPA_C,
        2,
        Some((0, 128)),
        &SERVER_PD,
    );
    s.write_all(&rep).unwrap();
    wait(&mut n, "established", |n| {
        n.events
            .iter()
            .any(|e| matches!(e, CmEvent::Established { .. }))
    });
    let Some(CmEvent::Established { private_data, .. }) = n.events.first().copied() else {
        panic!("{:?}", n.events)
    };
    assert_eq!(private_data.as_slice(), &SERVER_PD);
    // Our first FPDU: Send MSN 1 with a good CRC.
    let payload = &golden_send()[20..88];
    // SAFETY: offset 0..68 lies inside the registered buffer owned by `n`.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), n.mr.addr as usize as *mut u8, 68) };
    let sg = [n.sge(0, 68)];
    n.p.post_send(
        qp,
        &SendWr {
            wr_id: 5,
            op: SendOp::Send,
            sg: &sg,
            signaled: true,
        },
    )
    .unwrap();
    let fpdu = read_exact(&mut n, &mut s, 92);
    assert_eq!(fpdu, golden_send(), "byte-identical to IWARP.md §6");
}

#[test]
fn iwarp_1_4_reply_with_excess_ord_fails_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut n = Node::new(SoftConfig {
        crc: false,
        ..SoftConfig::default()
    });
    let qp = n.p.create_qp(&n.init).unwrap();
    n.p.connect(
        qp,
        addr,
        &ConnParams {
            private_data: &[],
            responder_resources: 2,
            initiator_depth: 0,
        },
    )
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut s = loop {
        n.step();
        if let Ok((s, _)) = listener.accept() {
            break s;
        }
    };
    s.set_nonblocking(true).unwrap();
    let _ = read_exact(&mut n, &mut s, 24);
    let mut rep = Vec::new();
    wire::emit_mpa(&mut rep, true, wire::MPA_ENHANCED, 2, Some((0, 3)), &[]);
    s.write_all(&rep).unwrap();
    wait(&mut n, "connect error", |n| {
        n.events.contains(&CmEvent::ConnectError {
            qp,
            cause: ConnectFailure::Handshake,
        })
    });
    let term = read_exact(&mut n, &mut s, 28);
    assert_eq!(
        &term[20..24],
        &[0x20, 0x06, 0x00, 0x00],
        "LLP insufficient IRD"
    );
}

/// How long a test waits for the event fd (a hang guard, not a timing assertion).
const HANG_GUARD_MS: i32 = 20_000;

fn event_fd(n: &Node) -> std::os::fd::BorrowedFd<'_> {
    n.p.event_fd().expect("the TCP provider has an event fd")
}

#[test]
fn cm_event_fd_wakes_on_connect_request_and_quiets_after_poll() {
    let mut n = Node::new(SoftConfig::default());
    let l = n.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = n.p.listen_addr(l).unwrap();
    assert!(n.p.poll_cm().is_none());
    let mut s = TcpStream::connect(addr).unwrap();
    assert!(
        readable(event_fd(&n), HANG_GUARD_MS),
        "event fd readable after a connection arrives"
    );
    s.write_all(&siw_request(wire::MPA_ENHANCED, 1, 1)).unwrap();
    wait(&mut n, "connect request", |n| {
        n.events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
    // Everything was consumed: the descriptor is quiet again.
    assert!(n.p.poll_cm().is_none());
    assert!(
        !readable(event_fd(&n), 0),
        "no readiness left after poll_cm drained it"
    );
}

/// Data that makes the event fd readable is read by the `poll_cm` that consumes that
/// readiness, even on a link resting after empty reads (`rx_skip`). A poll thread parked on the
/// event fd is woken by the readiness once; data left unread then would wait, unannounced, for
/// the park's timeout (it did: 2 ms per call on a soft-provider daemon that parks).
#[test]
fn data_that_raised_the_event_fd_is_read_by_the_poll_cm_that_consumes_it() {
    let cfg = SoftConfig {
        crc: false,
        ..SoftConfig::default()
    };
    let (mut n, mut s, _) = accept_raw(cfg, &siw_request(wire::MPA_ENHANCED, 0, 128), 0, 128);
    // The MPA Reply: its fixed part, then the private data.
    let _ = read_exact(&mut n, &mut s, wire::MPA_HDR_LEN + SERVER_PD.len());
    let qp = n.qp.unwrap();
    let mut send = golden_send();
    // Rest the link for a different number of empty polls each time, so that some sends find
    // it skipping reads.
    for (msn, idle) in (1u8..).zip(1..=16) {
        let r = n.sge(0, 1024);
        n.p.post_recv(qp, u64::from(msn), &[r]).unwrap();
        for _ in 0..idle {
            n.step();
        }
        assert!(n.wcs.is_empty() && n.p.poll_cm().is_none());
        send[15] = msn;
        s.write_all(&send).unwrap();
        assert!(
            readable(event_fd(&n), HANG_GUARD_MS),
            "send {msn}: the event fd wakes a sleeper"
        );
        assert!(n.p.poll_cm().is_none());
        let mut w = [WorkCompletion::default(); 4];
        let got = n.p.poll_cq(n.cq, &mut w).unwrap();
        assert_eq!(
            got, 1,
            "send {msn} after {idle} idle polls: read by the poll_cm that woke"
        );
        assert_eq!((w[0].wr_id, w[0].byte_len), (u64::from(msn), 68));
    }
}

#[test]
fn iwarp_1_5_rev1_request_with_markers_rejected_like_siw() {
    let mut n = Node::new(SoftConfig::default());
    let l = n.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = n.p.listen_addr(l).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut req = wire::MPA_REQ_KEY.to_vec();
    req.extend([0xc0, 0x01, 0x00, 0x00]);
    s.write_all(&req).unwrap();
    let rep = read_exact(&mut n, &mut s, 20);
    let mut want = wire::MPA_REP_KEY.to_vec();
    want.extend([0x60, 0x01, 0x00, 0x00]);
    assert_eq!(
        rep, want,
        "IWARP.md §1.5: M cleared, C kept, R set, no private data"
    );
    expect_close(&mut n, &mut s);
    assert!(
        n.events.is_empty(),
        "no connect request for a refused frame"
    );
}

#[test]
fn iwarp_1_4_rev1_request_gets_rev1_reply_without_prefix() {
    let mut req = Vec::new();
    wire::emit_mpa(&mut req, false, 0, 1, None, &CLIENT_PD);
    let cfg = SoftConfig {
        crc: false,
        ..SoftConfig::default()
    };
    let (mut n, mut s, ev) = accept_raw(cfg, &req, 4, 4);
    assert!(matches!(
        ev,
        CmEvent::ConnectRequest {
            responder_resources: 0,
            initiator_depth: 0,
            ..
        }
    ));
    let rep = read_exact(&mut n, &mut s, 28);
    let mut want = wire::MPA_REP_KEY.to_vec();
    want.extend([0x00, 0x01, 0x00, 0x08]);
    want.extend(SERVER_PD);
    assert_eq!(rep, want);
}

/// Non-last FPDUs of a long message are exactly the FPDU size (siw: MSS rounded down to 8),
/// with L clear and no pad; the last carries the rest.
fn segmentation_case(fpdu_size: Option<usize>, want_seg: usize) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut n = Node::new(SoftConfig {
        crc: true,
        mpa_revision: 2,
        fpdu_size,
        ..SoftConfig::default()
    });
    let qp = n.p.create_qp(&n.init).unwrap();
    n.p.connect(
        qp,
        addr,
        &ConnParams {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
        },
    )
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut s = loop {
        n.step();
        if let Ok((s, _)) = listener.accept() {
            break s;
        }
    };
    s.set_nonblocking(true).unwrap();
    let _ = read_exact(&mut n, &mut s, 24);
    let mut rep = Vec::new();
    wire::emit_mpa(
        &mut rep,
        true,
        wire::MPA_ENHANCED | wire::MPA_C,
        2,
        Some((1, 1)),
        &[],
    );
    s.write_all(&rep).unwrap();
    wait(&mut n, "established", |n| !n.events.is_empty());
    let len = 2 * want_seg + 100;
    let sg = [n.sge(0, len as u32)];
    n.p.post_send(
        qp,
        &SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0xabcd,
            },
            sg: &sg,
            signaled: true,
        },
    )
    .unwrap();
    let mut placed = 0usize;
    let mut segs = Vec::new();
    while placed < len {
        let hdr = read_exact(&mut n, &mut s, 2);
        let ulen = usize::from(u16::from_be_bytes([hdr[0], hdr[1]]));
        let total = wire::fpdu_len(ulen);
        let mut f = hdr.clone();
        f.extend(read_exact(&mut n, &mut s, total - 2));
        let (seg, used) = wire::parse_fpdu(&f, true).expect("our FPDU parses with a good CRC");
        assert_eq!(used, total);
        let wire::Segment::Write {
            stag,
            to,
            last,
            payload,
        } = seg
        else {
            panic!("{seg:?}")
        };
        assert_eq!((stag, to), (0xabcd, 0x1000 + placed as u64));
        placed += payload.len();
        segs.push((total, last));
    }
    assert_eq!(placed, len);
    let (last_seg, firsts) = segs.split_last().unwrap();
    assert!(last_seg.1, "L on the last segment");
    for &(total, last) in firsts {
        assert_eq!(total, want_seg, "non-last FPDU size");
        assert!(!last);
    }
}

#[test]
fn iwarp_2_segmentation_configured_fpdu_size() {
    segmentation_case(Some(1448), 1448);
}

#[test]
fn iwarp_2_segmentation_default_is_mss_rounded_to_8() {
    let mss = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        use std::os::fd::AsRawFd;
        // SAFETY: valid socket fd and correctly sized out-parameters for TCP_MAXSEG.
        let rc = unsafe {
            libc::getsockopt(
                c.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v as usize
    };
    segmentation_case(None, (mss.min(65528)) & !7);
}

#[test]
fn iwarp_4_ord_limits_outstanding_reads_to_peer_ird() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut n = Node::new(SoftConfig {
        crc: false,
        ..SoftConfig::default()
    });
    let qp = n.p.create_qp(&n.init).unwrap();
    n.p.connect(
        qp,
        addr,
        &ConnParams {
            private_data: &[],
            responder_resources: 4,
            initiator_depth: 16,
        },
    )
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut s = loop {
        n.step();
        if let Ok((s, _)) = listener.accept() {
            break s;
        }
    };
    s.set_nonblocking(true).unwrap();
    let _ = read_exact(&mut n, &mut s, 24);
    // The responder grants IRD 1: at most one Read may be outstanding.
    let mut rep = Vec::new();
    wire::emit_mpa(&mut rep, true, wire::MPA_ENHANCED, 2, Some((1, 0)), &[]);
    s.write_all(&rep).unwrap();
    wait(&mut n, "established", |n| !n.events.is_empty());
    for i in 0..3u64 {
        let sg = [n.sge(i * 8, 8)];
        n.p.post_send(
            qp,
            &SendWr {
                wr_id: i,
                op: SendOp::RdmaRead {
                    remote_addr: 0x5000 + i * 8,
                    rkey: 0x77,
                },
                sg: &sg,
                signaled: true,
            },
        )
        .unwrap();
    }
    for i in 0..3u64 {
        let req = read_exact(&mut n, &mut s, 52);
        let (seg, _) = wire::parse_fpdu(&req, false).unwrap();
        let wire::Segment::ReadRequest(r) = seg else {
            panic!("{seg:?}")
        };
        assert_eq!((r.msn, r.src_to, r.size), (i as u32 + 1, 0x5000 + i * 8, 8));
        // No second Request while this one is unanswered.
        for _ in 0..200 {
            n.step();
        }
        let mut b = [0u8; 1];
        assert!(
            matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock),
            "a Read Request beyond ORD 1 was sent"
        );
        let mut resp = Vec::new();
        let st = wire::begin_fpdu(&mut resp);
        wire::put_tagged(&mut resp, wire::OP_READ_RESP, true, r.sink_stag, r.sink_to);
        resp.extend_from_slice(&[i as u8 + 1; 8]);
        wire::finish_fpdu(&mut resp, st, false);
        s.write_all(&resp).unwrap();
    }
    wait(&mut n, "three reads", |n| n.wcs.len() == 3);
    for (i, w) in n.wcs.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (i as u64, WcStatus::Success, 8)
        );
    }
}

#[test]
fn iwarp_1_4_silent_responder_times_out_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut n = Node::new(SoftConfig {
        connect_timeout: Duration::from_millis(50),
        ..SoftConfig::default()
    });
    let qp = n.p.create_qp(&n.init).unwrap();
    n.p.connect(
        qp,
        addr,
        &ConnParams {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
        },
    )
    .unwrap();
    // The TCP connection is accepted (by the kernel backlog) but no Reply ever comes.
    wait(&mut n, "connect error", |n| {
        n.events.contains(&CmEvent::ConnectError {
            qp,
            cause: ConnectFailure::Unreachable,
        })
    });
    drop(listener);
}

#[test]
fn iwarp_1_4_silent_requester_is_dropped() {
    let mut n = Node::new(SoftConfig {
        request_timeout: Duration::from_millis(50),
        ..SoftConfig::default()
    });
    let l = n.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = n.p.listen_addr(l).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    s.write_all(&wire::MPA_REQ_KEY[..10]).unwrap();
    expect_close(&mut n, &mut s);
    assert!(n.events.is_empty());
}

/// A flood of silent TCP connections holds at most `max_pending` accepted streams: one beyond
/// them waits in the listen backlog, not accepted (its MPA Request is not read, no connection
/// request) and not closed, until one held goes; then it is accepted and its request comes.
#[test]
fn streams_beyond_max_pending_wait_in_the_backlog() {
    let mut n = Node::new(SoftConfig {
        max_pending: 2,
        ..SoftConfig::default()
    });
    let l = n.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = n.p.listen_addr(l).unwrap();
    let connect = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    };
    let turns = |n: &mut Node| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            n.step();
        }
    };
    let (a, mut b) = (connect(), connect());
    turns(&mut n);
    let mut c = connect();
    let mut req = Vec::new();
    wire::emit_mpa(&mut req, false, 0, 1, None, &CLIENT_PD);
    c.write_all(&req).unwrap();
    turns(&mut n);
    assert!(
        n.events.is_empty(),
        "a request beyond the cap was read: {:?}",
        n.events
    );
    let mut buf = [0u8; 16];
    for s in [&mut b, &mut c] {
        match s.read(&mut buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a stream was closed: {other:?}"),
        }
    }
    // One held stream goes away: the waiting one is accepted and its request read.
    drop(a);
    wait(&mut n, "the waiting stream's request", |n| {
        n.events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
}

/// A TCP stream's connection request moves between soft providers (two poll threads'): the
/// listener's provider hands it over and no longer knows it; the other provider answers the
/// MPA Request and carries the stream's traffic while the giver is not even polled.
#[test]
fn a_connection_request_moves_to_another_soft_provider() {
    let mut giver = Node::new(SoftConfig::default());
    let l = giver.p.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = giver.p.listen_addr(l).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    s.write_all(&siw_request(0, 16, 16)).unwrap();
    wait(&mut giver, "connect request", |n| !n.events.is_empty());
    let CmEvent::ConnectRequest { req, .. } = giver.events.remove(0) else {
        panic!("{:?}", giver.events)
    };
    let moved = giver.p.hand_over(req).expect("a TCP request moves");
    let qp = giver.p.create_qp(&giver.init).unwrap();
    let params = ConnParams {
        private_data: &SERVER_PD,
        responder_resources: 16,
        initiator_depth: 16,
    };
    assert!(
        giver.p.accept(req, qp, &params).is_err(),
        "the giver still answers a request it handed over"
    );
    let mut taker = Node::new(SoftConfig::default());
    let req = taker.p.take_over(moved).unwrap();
    let qp = taker.p.create_qp(&taker.init).unwrap();
    taker.qp = Some(qp);
    taker.p.accept(req, qp, &params).unwrap();
    let reply = read_exact(&mut taker, &mut s, wire::MPA_HDR_LEN + SERVER_PD.len());
    assert_eq!(&reply[..16], &wire::MPA_REP_KEY[..]);
    assert_eq!(&reply[reply.len() - SERVER_PD.len()..], &SERVER_PD);
    let r = taker.sge(0, 1024);
    taker.p.post_recv(qp, 1, &[r]).unwrap();
    s.write_all(&golden_send()).unwrap();
    wait(&mut taker, "the Send on the moved stream", |n| {
        !n.wcs.is_empty()
    });
    assert_eq!(
        (taker.wcs[0].status, taker.wcs[0].byte_len),
        (WcStatus::Success, 68)
    );
}

/// A listener's accept filter closes streams from refused addresses as they are accepted,
/// before any MPA byte and without holding a place (`max_pending` 1 here): on a dual-stack
/// listener admitting only `::1`, a stream from 127.0.0.1 is closed and reported as
/// `Filtered`, and a stream from `::1` then has its request read.
#[test]
fn a_listeners_filter_closes_refused_streams_at_accept() {
    let mut n = Node::new(SoftConfig {
        max_pending: 1,
        ..SoftConfig::default()
    });
    let l = n.p.listen("[::]:0".parse().unwrap()).unwrap();
    let port = n.p.listen_addr(l).unwrap().port();
    let only_v6_loopback = rpcrdma_verbs::AcceptFilter::new(|ip| ip.is_loopback() && ip.is_ipv6());
    n.p.filter_listener(l, Some(only_v6_loopback)).unwrap();
    let mut v4 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    v4.set_nonblocking(true).unwrap();
    v4.write_all(&siw_request(0, 16, 16)).unwrap();
    wait(&mut n, "the refused stream reported", |n| {
        !n.events.is_empty()
    });
    let CmEvent::Filtered { listener, remote } = n.events.remove(0) else {
        panic!("{:?}", n.events)
    };
    assert_eq!(listener, l);
    assert_eq!(
        remote.map(|a| a.ip().to_canonical()),
        Some("127.0.0.1".parse().unwrap())
    );
    expect_close(&mut n, &mut v4);
    let mut v6 = TcpStream::connect(("::1", port)).unwrap();
    v6.set_nonblocking(true).unwrap();
    v6.write_all(&siw_request(0, 16, 16)).unwrap();
    wait(&mut n, "the admitted stream's request", |n| {
        n.events
            .iter()
            .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))
    });
}
