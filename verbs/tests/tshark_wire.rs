//! Wireshark as the independent judge of the soft provider's wire: capture two soft endpoints
//! on loopback exchanging an RPC-over-RDMA call and reply, an RDMA Write and an RDMA Read,
//! and check what tshark decodes. Fails (never skips) when tshark is missing.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rpcrdma_verbs::conformance::{self, Harness, Pair};
use rpcrdma_verbs::soft::{SoftConfig, SoftProvider, SoftTcp};
use rpcrdma_verbs::{Access, Provider, SendOp, WcStatus};

struct Fixed(u16);

impl Harness for Fixed {
    type P = SoftTcp;
    fn pair(&mut self) -> (SoftTcp, SoftTcp) {
        (
            SoftProvider::tcp(SoftConfig::default()).unwrap(),
            SoftProvider::tcp(SoftConfig::default()).unwrap(),
        )
    }
    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.0))
    }
}

/// WIRE.md Example 1 with this test's xid and credits: v1 RDMA_MSG header, empty lists.
fn rdma_msg_header(xid: u32, credits: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&xid.to_be_bytes());
    h[4..8].copy_from_slice(&1u32.to_be_bytes());
    h[8..12].copy_from_slice(&credits.to_be_bytes());
    h
}

fn tshark_fields(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(file)
        .arg("-Y")
        .arg(filter)
        .arg("-T")
        .arg("fields");
    for f in fields {
        cmd.arg("-e").arg(f);
    }
    let out = cmd.output().expect("run tshark -r");
    assert!(
        out.status.success(),
        "tshark -r failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

fn start_capture(port: u16, file: &Path) -> Child {
    let mut child = Command::new("tshark")
        .args(["-i", "lo", "-f", &format!("tcp port {port}"), "-w"])
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("tshark is required for this test and could not be started ({e}); install it: DEBIAN_FRONTEND=noninteractive apt-get install -y tshark")
        });
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // "Capturing on" comes first; dumpcap's "Capture started" means packets flow.
            if line.contains("Capture started") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("tshark never reported that it is capturing");
    child
}

fn stop_capture(mut child: Child) {
    // Let the last segments reach the capture, then stop tshark cleanly (SIGINT flushes).
    std::thread::sleep(Duration::from_millis(500));
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "could not stop tshark");
    child.wait().expect("wait tshark");
}

fn num(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {s}")),
        None => s.parse().unwrap_or_else(|_| panic!("bad number {s}")),
    }
}

#[test]
fn iwarp_tshark_decodes_mpa_crc_rdmap_and_rpcordma() {
    let found = Command::new("tshark").arg("-v").output();
    assert!(
        matches!(&found, Ok(o) if o.status.success()),
        "tshark is required (the wire's independent judge) but was not found; install it: DEBIAN_FRONTEND=noninteractive apt-get install -y tshark"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir: PathBuf =
        std::env::temp_dir().join(format!("verbs-tshark-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("soft.pcapng");
    let cap = start_capture(port, &file);

    let mut p: Pair<SoftTcp> = conformance::connect(&mut Fixed(port), false);
    let (xid_call, xid_reply) = (0x8a3b_2c1d_u32, 0x8a3b_2c1d_u32);
    // Call: WIRE.md Example 1 (header + NFSv3 NULL call).
    let mut call = rdma_msg_header(xid_call, 32).to_vec();
    for w in [xid_call, 0, 2, 100003, 3, 0, 0, 0, 0, 0] {
        call.extend_from_slice(&w.to_be_bytes());
    }
    // Reply: header granting 16 credits + accepted, AUTH_NONE verifier, SUCCESS.
    let mut reply = rdma_msg_header(xid_reply, 16).to_vec();
    for w in [xid_reply, 1, 0, 0, 0, 0] {
        reply.extend_from_slice(&w.to_be_bytes());
    }
    p.b.recv(1, &[p.b.sge(0, 1024)]);
    p.a.recv(2, &[p.a.sge(4096, 1024)]);
    p.a.fill(0, &call);
    let s = [p.a.sge(0, call.len())];
    p.a.post(10, SendOp::Send, &s, true);
    p.wait("call received", |p| p.b.wc(1).is_some());
    assert_eq!(p.b.mem(0, call.len()), &call[..]);
    p.b.fill(8192, &reply);
    let s = [p.b.sge(8192, reply.len())];
    p.b.post(11, SendOp::Send, &s, true);
    p.wait("reply received", |p| p.a.wc(2).is_some());

    let qb = p.b.qp();
    let rkey =
        p.b.p
            .expose(
                qb,
                p.b.mr.id,
                65536,
                8192,
                Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    p.a.fill(16384, b"hello, world!");
    let s = [p.a.sge(16384, 13)];
    p.a.post(
        12,
        SendOp::RdmaWrite {
            remote_addr: p.b.mr.addr_at(65536),
            rkey,
        },
        &s,
        true,
    );
    p.wait("write done", |p| p.a.wc(12).is_some());
    let s = [p.a.sge(32768, 1000)];
    p.a.post(
        13,
        SendOp::RdmaRead {
            remote_addr: p.b.mr.addr_at(65536),
            rkey,
        },
        &s,
        true,
    );
    p.wait("read done", |p| p.a.wc(13).is_some());
    for id in [10, 12, 13] {
        assert_eq!(p.a.wc(id).unwrap().status, WcStatus::Success);
    }
    assert_eq!(p.a.mem(32768, 13), b"hello, world!");
    let qa = p.a.qp();
    p.a.p.disconnect(qa).unwrap();
    p.settle();
    stop_capture(cap);

    // MPA handshake: rev 2, CRC requested and granted, RFC 8797 data after the IRD/ORD prefix.
    let req = tshark_fields(
        &file,
        "iwarp_mpa.req",
        &[
            "iwarp_mpa.rev",
            "iwarp_mpa.crc_flag",
            "iwarp_mpa.privatedata",
        ],
    );
    assert_eq!(req.len(), 1, "one MPA Request decoded: {req:?}");
    assert_eq!(num(&req[0][0]), 2);
    assert!(
        matches!(req[0][1].as_str(), "1" | "True"),
        "C flag: {req:?}"
    );
    let pd = req[0][2].replace(':', "");
    assert_eq!(
        pd, "00100010f6ab0e1801010303",
        "IRD 16 ORD 16 + RFC 8797 client data"
    );
    let rep = tshark_fields(
        &file,
        "iwarp_mpa.rep",
        &[
            "iwarp_mpa.rev",
            "iwarp_mpa.crc_flag",
            "iwarp_mpa.rej_flag",
            "iwarp_mpa.privatedata",
        ],
    );
    assert_eq!(rep.len(), 1, "one MPA Reply decoded: {rep:?}");
    assert_eq!(num(&rep[0][0]), 2);
    assert!(
        matches!(rep[0][1].as_str(), "1" | "True"),
        "C flag: {rep:?}"
    );
    assert!(
        matches!(rep[0][2].as_str(), "0" | "False"),
        "R flag: {rep:?}"
    );
    assert_eq!(rep[0][3].replace(':', ""), "00100010f6ab0e1801000303");

    // Every FPDU's CRC is good.
    let fpdus = tshark_fields(
        &file,
        "iwarp_mpa.fpdu",
        &["frame.number", "iwarp_rdma.opcode"],
    );
    let verbose = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .arg("-V")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verbose.stdout);
    let good = text.matches("Good CRC32").count();
    assert!(!text.contains("Bad CRC32"), "a bad CRC in the capture");
    assert!(fpdus.len() >= 5, "at least 5 FPDUs: {fpdus:?}");
    assert_eq!(good, fpdus.len(), "'Good CRC32' on every FPDU");

    // DDP/RDMAP opcodes in order: Send, Send, Write, Read Request, Read Response.
    let ops: Vec<u64> = fpdus.iter().map(|f| num(&f[1])).collect();
    assert_eq!(ops, vec![3, 3, 0, 1, 2], "RDMAP opcodes");

    // RPC-over-RDMA header fields as sent.
    let rpc = tshark_fields(
        &file,
        "rpcordma",
        &[
            "rpcordma.xid",
            "rpcordma.version",
            "rpcordma.msg_type",
            "rpcordma.flow_control",
        ],
    );
    let got: Vec<Vec<u64>> = rpc
        .iter()
        .map(|r| r.iter().map(|v| num(v)).collect())
        .collect();
    assert_eq!(
        got,
        vec![
            vec![u64::from(xid_call), 1, 0, 32],
            vec![u64::from(xid_reply), 1, 0, 16]
        ],
        "rpcordma fields"
    );

    let malformed = tshark_fields(&file, "_ws.malformed", &["frame.number"]);
    assert!(malformed.is_empty(), "malformed frames: {malformed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
