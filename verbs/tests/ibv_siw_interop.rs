//! Wire interoperability: our user-space iWARP (the soft provider over TCP) against the Linux
//! kernel's `siw`, driven through the rdma-core provider, in both roles. Needs an iWARP device:
//! `tests/vm/run` runs it on siw0 (`RPCRDMA_IBV_DEVICE=siw0`, `RPCRDMA_IBV_ADDR=10.99.1.1`).
//! Without one every test fails (this suite never passes by skipping).
#![cfg(feature = "ibv")]

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use rpcrdma_verbs::conformance::{Side, CLIENT_PD, SERVER_PD};
use rpcrdma_verbs::ibv::{IbvConfig, IbvProvider};
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider, SoftTcp};
use rpcrdma_verbs::{
    Access, CmEvent, ConnParams, Provider, QpInit, SendOp, WcOpcode, WcStatus, WorkCompletion,
};

fn siw() -> (IbvProvider, IpAddr) {
    let device = std::env::var("RPCRDMA_IBV_DEVICE")
        .expect("RPCRDMA_IBV_DEVICE names an iWARP device (this suite runs in tests/vm/run)");
    let addr: IpAddr = std::env::var("RPCRDMA_IBV_ADDR")
        .expect("RPCRDMA_IBV_ADDR is the device's IP address")
        .parse()
        .expect("RPCRDMA_IBV_ADDR is an IP address");
    let p = IbvProvider::open(IbvConfig {
        device: Some(device.clone()),
        ..IbvConfig::default()
    })
    .unwrap_or_else(|e| panic!("open {device}: {e}"));
    assert!(p.is_iwarp(), "{device} is not an iWARP device");
    (p, addr)
}

fn soft(crc: bool) -> SoftTcp {
    SoftProvider::tcp(SoftConfig {
        crc,
        ..SoftConfig::default()
    })
    .expect("soft provider")
}

fn step<P: Provider>(s: &mut Side<P>) {
    while let Some(e) = s.p.poll_cm() {
        s.events.push(e);
    }
    let mut w = [WorkCompletion::default(); 16];
    let n = s.p.poll_cq(s.cq, &mut w).expect("poll_cq");
    s.wcs.extend_from_slice(&w[..n]);
}

/// Drive both sides until `done` (a hang guard, not a timing assertion).
fn wait(
    k: &mut Side<IbvProvider>,
    s: &mut Side<SoftTcp>,
    what: &str,
    done: impl Fn(&Side<IbvProvider>, &Side<SoftTcp>) -> bool,
) {
    let start = Instant::now();
    while !done(k, s) {
        step(k);
        step(s);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}\n kernel events {:?} wcs {:?}\n soft events {:?} wcs {:?}",
            k.events,
            k.wcs,
            s.events,
            s.wcs
        );
        std::thread::yield_now();
    }
}

fn init<P: Provider>(s: &Side<P>) -> QpInit {
    QpInit {
        pd: s.pd,
        send_cq: s.cq,
        recv_cq: s.cq,
        srq: None,
        max_send_wr: 64,
        max_recv_wr: 64,
        max_sge: 1,
    }
}

fn params(pd: &[u8]) -> ConnParams<'_> {
    ConnParams {
        private_data: pd,
        responder_resources: 8,
        initiator_depth: 8,
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn request<P: Provider>(s: &Side<P>) -> Option<(rpcrdma_verbs::ConnReqId, Vec<u8>, u16)> {
    s.events.iter().find_map(|e| match e {
        CmEvent::ConnectRequest {
            req,
            private_data,
            responder_resources,
            ..
        } => Some((*req, private_data.as_slice().to_vec(), *responder_resources)),
        _ => None,
    })
}

fn established<P: Provider>(s: &Side<P>) -> Option<Vec<u8>> {
    s.events.iter().find_map(|e| match e {
        CmEvent::Established { private_data, .. } => Some(private_data.as_slice().to_vec()),
        _ => None,
    })
}

/// Sends both ways (one larger than an FPDU), then one-sided operations both ways: the soft
/// side Writes into and Reads from the kernel's exposure, the kernel side Writes into and Reads
/// from the soft side's; every byte checked, then a disconnect reaches both.
fn exchange(k: &mut Side<IbvProvider>, s: &mut Side<SoftTcp>) {
    let (kq, sq) = (k.qp(), s.qp());
    // Sends, soft to kernel and kernel to soft.
    let big = pattern(1, 100_000);
    k.recv(1, &[k.sge(0, 128 * 1024)]);
    k.recv(2, &[k.sge(200_000, 64)]);
    s.recv(11, &[s.sge(0, 4096)]);
    s.fill(300_000, &big);
    s.post(21, SendOp::Send, &[s.sge(300_000, big.len())], true);
    s.fill(500_000, b"hello siw");
    s.post(22, SendOp::Send, &[s.sge(500_000, 9)], true);
    k.fill(400_000, b"hello soft iwarp");
    k.post(31, SendOp::Send, &[k.sge(400_000, 16)], true);
    wait(k, s, "sends both ways", |k, s| {
        k.wc(2).is_some() && s.wc(11).is_some() && k.wc(31).is_some() && s.wc(22).is_some()
    });
    let r = k.wc(1).unwrap();
    assert_eq!(
        (r.status, r.opcode, r.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 100_000)
    );
    assert_eq!(k.mem(0, 100_000), &big[..]);
    assert_eq!(k.wc(2).unwrap().byte_len, 9);
    assert_eq!(k.mem(200_000, 9), b"hello siw");
    assert_eq!(s.wc(11).unwrap().byte_len, 16);
    assert_eq!(s.mem(0, 16), b"hello soft iwarp");

    // Soft Writes into and Reads from the kernel side's exposure.
    let krkey =
        k.p.expose(
            kq,
            k.mr.id,
            600_000,
            300_000,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .expect("kernel side exposure");
    let wdata = pattern(7, 200_000);
    s.fill(0, &wdata);
    s.post(
        23,
        SendOp::RdmaWrite {
            remote_addr: k.mr.addr_at(600_000),
            rkey: krkey,
        },
        &[s.sge(0, 200_000)],
        true,
    );
    k.recv(3, &[k.sge(200_000, 64)]);
    s.post(24, SendOp::Send, &[s.sge(500_000, 4)], true);
    wait(k, s, "write then send", |k, _| k.wc(3).is_some());
    assert_eq!(
        k.mem(600_000, 200_000),
        &wdata[..],
        "Write visible at the Send"
    );
    let rdata = pattern(9, 150_000);
    k.fill(750_000, &rdata);
    s.post(
        25,
        SendOp::RdmaRead {
            remote_addr: k.mr.addr_at(750_000),
            rkey: krkey,
        },
        &[s.sge(700_000, 150_000)],
        true,
    );
    wait(k, s, "soft Read", |_, s| s.wc(25).is_some());
    let w = s.wc(25).unwrap();
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 150_000));
    assert_eq!(s.mem(700_000, 150_000), &rdata[..]);

    // The kernel side Writes into and Reads from the soft side's exposure.
    let srkey =
        s.p.expose(
            sq,
            s.mr.id,
            100_000,
            100_000,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .expect("soft side exposure");
    let kdata = pattern(3, 80_000);
    k.fill(0, &kdata);
    k.post(
        32,
        SendOp::RdmaWrite {
            remote_addr: s.mr.addr_at(100_000),
            rkey: srkey,
        },
        &[k.sge(0, 80_000)],
        true,
    );
    s.recv(12, &[s.sge(0, 64)]);
    k.post(33, SendOp::Send, &[k.sge(400_000, 4)], true);
    wait(k, s, "kernel write then send", |_, s| s.wc(12).is_some());
    assert_eq!(s.mem(100_000, 80_000), &kdata[..]);
    let back = pattern(5, 60_000);
    s.fill(140_000, &back);
    k.post(
        34,
        SendOp::RdmaRead {
            remote_addr: s.mr.addr_at(140_000),
            rkey: srkey,
        },
        &[k.sge(900_000, 60_000)],
        true,
    );
    wait(k, s, "kernel Read", |k, _| k.wc(34).is_some());
    let w = k.wc(34).unwrap();
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 60_000));
    assert_eq!(k.mem(900_000, 60_000), &back[..]);
    let all_ok = k
        .wcs
        .iter()
        .chain(s.wcs.iter())
        .all(|w| w.status == WcStatus::Success);
    assert!(all_ok, "kernel {:?}\nsoft {:?}", k.wcs, s.wcs);

    s.p.disconnect(sq).unwrap();
    wait(k, s, "disconnect on both sides", |k, s| {
        k.events
            .iter()
            .any(|e| matches!(e, CmEvent::Disconnected { .. }))
            && s.events
                .iter()
                .any(|e| matches!(e, CmEvent::Disconnected { .. }))
    });
}

/// The soft side connects to a kernel siw listener, asking for MPA CRC-32C (`crc`) or not.
fn soft_to_kernel(crc: bool) {
    let (kp, ip) = siw();
    let mut k = Side::new(kp);
    let mut s = Side::new(soft(crc));
    let l = k.p.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = k.p.listen_addr(l).unwrap();
    let sq = s.p.create_qp(&init(&s)).unwrap();
    s.p.connect(sq, addr, &params(&CLIENT_PD)).expect("connect");
    wait(&mut k, &mut s, "connect request at siw", |k, _| {
        request(k).is_some()
    });
    let (req, pd, ird) = request(&k).unwrap();
    assert_eq!(pd, CLIENT_PD, "siw delivers our MPA private data exactly");
    assert_eq!(ird, 8, "siw reads our MPA revision 2 IRD");
    let kq = k.p.create_qp(&init(&k)).unwrap();
    k.p.accept(req, kq, &params(&SERVER_PD)).expect("accept");
    wait(&mut k, &mut s, "established", |k, s| {
        established(k).is_some() && established(s).is_some()
    });
    assert_eq!(established(&s).unwrap(), SERVER_PD);
    k.qps.push(kq);
    s.qps.push(sq);
    exchange(&mut k, &mut s);
}

#[test]
fn soft_initiator_with_crc_to_kernel_siw_listener() {
    soft_to_kernel(true);
}

#[test]
fn soft_initiator_without_crc_to_kernel_siw_listener() {
    soft_to_kernel(false);
}

#[test]
fn kernel_siw_initiator_to_soft_listener() {
    let (kp, ip) = siw();
    let mut s = Side::new(soft(true));
    let l = s.p.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = s.p.listen_addr(l).unwrap();
    let (mut k, mut s) = kernel_to_soft(Side::new(kp), s, addr);
    exchange(&mut k, &mut s);
}

/// rdma_cm picks an iWARP connection's source port from its own port space, blind to TCP's,
/// and siw binds a TCP socket to it: a port a TCP listener holds fails the connect with
/// EADDRINUSE (seen once in 400 connects in this VM, where mountd and statd listen on
/// ephemeral ports). Here TCP listeners hold three of the four ports rdma_cm may pick: the
/// provider moves on to another port until the connection stands, on the one port left.
#[test]
fn kernel_siw_initiator_moves_off_source_ports_tcp_holds() {
    let (kp, ip) = siw();
    let mut s = Side::new(soft(true));
    let l = s.p.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = s.p.listen_addr(l).unwrap();
    let lo = (40_000..60_000)
        .step_by(8)
        .find(|&p| {
            !(p..p + 4).contains(&addr.port())
                && (p..p + 4).all(|q| TcpListener::bind((ip, q)).is_ok())
        })
        .expect("four free ports");
    let _held: Vec<TcpListener> = (lo..lo + 3)
        .map(|q| TcpListener::bind((ip, q)).expect("hold a port"))
        .collect();
    let range = PortRange::narrow(lo, lo + 3);
    let (mut k, mut s) = kernel_to_soft(Side::new(kp), s, addr);
    drop(range);
    assert_eq!(
        tcp_source_ports_to(addr),
        [lo + 3],
        "the connection stands on the port TCP left free"
    );
    exchange(&mut k, &mut s);
}

/// The kernel side connects to the soft listener at `addr`: private data and IRD arrive.
fn kernel_to_soft(
    mut k: Side<IbvProvider>,
    mut s: Side<SoftTcp>,
    addr: SocketAddr,
) -> (Side<IbvProvider>, Side<SoftTcp>) {
    let kq = k.p.create_qp(&init(&k)).unwrap();
    k.p.connect(kq, addr, &params(&CLIENT_PD)).expect("connect");
    wait(&mut k, &mut s, "connect request at soft", |_, s| {
        request(s).is_some()
    });
    let (req, pd, ird) = request(&s).unwrap();
    assert_eq!(pd, CLIENT_PD, "we read siw's MPA private data exactly");
    assert_eq!(ird, 8, "we read siw's MPA revision 2 IRD");
    let sq = s.p.create_qp(&init(&s)).unwrap();
    s.p.accept(req, sq, &params(&SERVER_PD)).expect("accept");
    wait(&mut k, &mut s, "established", |k, s| {
        established(k).is_some() && established(s).is_some()
    });
    assert_eq!(established(&k).unwrap(), SERVER_PD);
    k.qps.push(kq);
    s.qps.push(sq);
    (k, s)
}

/// Source ports of the established TCP connections to `to` (IPv4, from /proc/net/tcp, whose
/// addresses are the in-memory word in hex and ports big-endian in hex).
fn tcp_source_ports_to(to: SocketAddr) -> Vec<u16> {
    let IpAddr::V4(ip) = to.ip() else {
        panic!("the VM's siw0 address is IPv4")
    };
    let rem = format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), to.port());
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp")
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let established = f.get(3) == Some(&"01");
            let port = f.get(1)?.rsplit(':').next()?;
            (established && f.get(2) == Some(&rem.as_str()))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

const PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The kernel's ephemeral port range (where rdma_cm takes source ports) narrowed while this
/// lives (the VM runs the suite as root, one test at a time); restored on drop.
struct PortRange(String);

impl PortRange {
    fn narrow(lo: u16, hi: u16) -> Self {
        let saved = std::fs::read_to_string(PORT_RANGE).expect("read the port range");
        std::fs::write(PORT_RANGE, format!("{lo} {hi}")).expect("narrow the port range");
        PortRange(saved)
    }
}

impl Drop for PortRange {
    fn drop(&mut self) {
        let _ = std::fs::write(PORT_RANGE, self.0.trim());
    }
}
