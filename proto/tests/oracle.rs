//! Independent oracle: the C codec that Debian's `rpcgen` generates from the RFC 8166 XDR
//! (tests/oracle/rpcrdma1.x) must agree with this crate byte for byte and field for field.
//!
//! Needs `rpcgen` (package rpcsvc-proto), `cc` and libtirpc-dev; fails if they are missing.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::{decode, v1, Error, Limits, Message};

const CASES: usize = 10_000;
const SEED: u64 = 0x5eed_8166;

fn oracle_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle"))
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {what} ({e}): install rpcsvc-proto (rpcgen), a C compiler and libtirpc-dev"
        )
    });
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Generates the C codec with rpcgen and builds the driver once; returns its path.
fn build_driver() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(build_driver_now).clone()
}

fn build_driver_now() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rpcrdma-oracle");
    // rpcgen refuses to overwrite its outputs: start from an empty directory.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let x = dir.join("rpcrdma1.x");
    std::fs::copy(oracle_dir().join("rpcrdma1.x"), &x).unwrap();
    run(
        Command::new("rpcgen")
            .current_dir(&dir)
            .args(["-h", "-o", "rpcrdma1.h", "rpcrdma1.x"]),
        "rpcgen -h",
    );
    run(
        Command::new("rpcgen")
            .current_dir(&dir)
            .args(["-c", "-o", "rpcrdma1_xdr.c", "rpcrdma1.x"]),
        "rpcgen -c",
    );
    let driver = dir.join("driver");
    run(
        Command::new("cc")
            .current_dir(&dir)
            .arg("-O1")
            .arg("-I/usr/include/tirpc")
            .arg("-I.")
            .arg(oracle_dir().join("driver.c"))
            .arg("rpcrdma1_xdr.c")
            .args(["-ltirpc", "-o"])
            .arg(&driver),
        "cc (with -ltirpc)",
    );
    driver
}

/// xorshift64*: a small deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2_685_821_657_736_338_717)
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
    fn segment(&mut self, max_len: u32) -> Segment {
        Segment::new(self.next() as u32, self.below(max_len), self.next() >> 1)
    }
}

/// Owned chunk lists to build a `Repr` from.
struct Lists {
    reads: Vec<ReadSegment>,
    writes: Vec<Vec<Segment>>,
    reply: Option<Vec<Segment>>,
}

impl Lists {
    fn random(rng: &mut Rng, pzrc: bool) -> Lists {
        let mut reads = Vec::new();
        if pzrc && rng.below(2) == 1 {
            for _ in 0..=rng.below(3) {
                reads.push(ReadSegment::new(0, rng.segment(1 << 16)));
            }
        }
        let mut pos = 4 * (1 + rng.below(8));
        for _ in 0..rng.below(3) {
            let mut total = 0;
            for _ in 0..=rng.below(3) {
                let s = rng.segment(1 << 16);
                total += s.length;
                reads.push(ReadSegment::new(pos, s));
            }
            pos = ((pos + total + 3) & !3) + 4 * rng.below(4);
        }
        let chunk = |rng: &mut Rng| (0..rng.below(4)).map(|_| rng.segment(1 << 20)).collect();
        let writes = (0..rng.below(3)).map(|_| chunk(rng)).collect();
        let reply = (rng.below(2) == 1).then(|| chunk(rng));
        Lists {
            reads,
            writes,
            reply,
        }
    }

    fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty() && self.reply.is_none()
    }
}

fn fmt_chunk(s: &mut String, c: &Chunk<'_>) {
    write!(s, " {}", c.len()).unwrap();
    for seg in c.segments() {
        write!(s, " {} {} {}", seg.handle, seg.length, seg.offset).unwrap();
    }
}

/// The driver's field line for a header.
fn fields(h: &v1::Header<'_>) -> String {
    let mut s = format!("F {} 1 {} {}", h.xid, h.credit, h.body.proc());
    match &h.body {
        v1::Body::Msg(c) | v1::Body::Nomsg(c) => {
            write!(s, " R {}", c.reads.len()).unwrap();
            for r in c.reads.iter() {
                let t = r.target;
                write!(s, " {} {} {} {}", r.position, t.handle, t.length, t.offset).unwrap();
            }
            write!(s, " W {}", c.writes.len()).unwrap();
            for w in c.writes.iter() {
                fmt_chunk(&mut s, &w);
            }
            match &c.reply {
                Some(r) => {
                    s.push_str(" P 1");
                    fmt_chunk(&mut s, r);
                }
                None => s.push_str(" P 0"),
            }
        }
        v1::Body::Error(v1::ErrorBody::Vers { low, high }) => {
            write!(s, " E 1 {low} {high}").unwrap()
        }
        v1::Body::Error(v1::ErrorBody::Chunk) => s.push_str(" E 2"),
    }
    s
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Decodes a header alone; an RDMA_MSG gets an RPC stub appended so it has its payload.
fn decode_header(bytes: &[u8]) -> Result<(String, Vec<u8>), Error> {
    let mut msg = bytes.to_vec();
    msg.extend_from_slice(bytes.get(..4).unwrap_or(&[]));
    msg.extend_from_slice(&[0; 4]);
    let d = decode(&msg, &Limits::DEFAULT).map_err(|r| r.error)?;
    let Message::V1(h) = d.message else {
        panic!("not a v1 header")
    };
    assert_eq!(d.header_len, bytes.len(), "header length");
    let mut out = vec![0u8; h.buffer_len()];
    h.emit(&mut out).unwrap();
    Ok((fields(&h), out))
}

#[test]
fn r8166_4_1_a_rust_encodings_decode_identically_in_rpcgen_c() {
    let driver = build_driver();
    let mut rng = Rng(SEED);
    let mut expected = Vec::with_capacity(CASES);
    let mut input = String::new();
    for _ in 0..CASES {
        let xid = rng.next() as u32;
        let credit = rng.below(256);
        let kind = rng.below(10);
        let lists = Lists::random(&mut rng, kind >= 4);
        let chunks: Vec<Chunk<'_>> = lists
            .writes
            .iter()
            .map(|c| Chunk::from_segments(c))
            .collect();
        let cl = ChunkLists {
            reads: ReadList::from_segments(&lists.reads),
            writes: WriteList::from_chunks(&chunks),
            reply: lists.reply.as_deref().map(Chunk::from_segments),
        };
        let body = match kind {
            0..=3 => v1::Body::Msg(cl),
            4..=7 if !lists.is_empty() => v1::Body::Nomsg(cl),
            4..=7 => v1::Body::Msg(ChunkLists::EMPTY),
            8 => v1::Body::Error(v1::ErrorBody::Vers {
                low: rng.below(3),
                high: rng.below(3),
            }),
            _ => v1::Body::Error(v1::ErrorBody::Chunk),
        };
        let h = v1::Header { xid, credit, body };
        let mut out = vec![0u8; h.buffer_len()];
        h.emit(&mut out).unwrap();
        writeln!(input, "{}", hex(&out)).unwrap();
        expected.push((fields(&h), hex(&out)));
    }
    let mut child = Command::new(&driver)
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the oracle driver");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "driver exited with {}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    for (i, (f, h)) in expected.iter().enumerate() {
        let cf = lines.next().unwrap_or("missing");
        assert_eq!(cf, f, "case {i}: C decoded other fields from {h}");
        let ch = lines.next().unwrap_or("missing");
        assert_eq!(&ch[2..], h, "case {i}: C re-encoded other bytes");
    }
    assert_eq!(lines.next(), None);
}

#[test]
fn r8166_4_1_a_rpcgen_c_encodings_decode_identically_in_rust() {
    let driver = build_driver();
    let out = Command::new(&driver)
        .args(["gen", &CASES.to_string(), &SEED.to_string()])
        .output()
        .expect("run the oracle driver");
    assert!(out.status.success(), "driver exited with {}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * CASES);
    let (mut ok, mut retired) = (0, 0);
    for (i, pair) in lines.chunks(2).enumerate() {
        let (cf, ch) = (pair[0], &pair[1][2..]);
        let bytes = unhex(ch);
        let proc = cf.split(' ').nth(4).unwrap();
        match decode_header(&bytes) {
            Ok((f, again)) => {
                assert_eq!(f, cf, "case {i}: Rust decoded other fields from {ch}");
                assert_eq!(hex(&again), ch, "case {i}: Rust re-encoded other bytes");
                ok += 1;
            }
            // RDMA_MSGP is rejected (R8166-4.6.1-b); RDMA_DONE is 16 bytes (AMB-1).
            Err(Error::Msgp) if proc == "2" => retired += 1,
            Err(Error::TooShort) if proc == "3" => retired += 1,
            Err(e) => panic!("case {i}: {e:?} for valid header {ch} ({cf})"),
        }
    }
    assert!(
        ok > CASES * 8 / 10 && retired > 0,
        "{ok} decoded, {retired} retired"
    );
}
