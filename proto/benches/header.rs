//! Decode + encode cost of one RPC-over-RDMA header (median ns over many batches).
//!
//! Run with `cargo bench -p rpcrdma-proto --bench header`. A plain `std::time` loop keeps
//! CI builds light; it measures, it asserts nothing about time.

use std::hint::black_box;
use std::time::Instant;

use rpcrdma_proto::chunk::{Chunk, ChunkLists, ReadList, ReadSegment, Segment, WriteList};
use rpcrdma_proto::{decode, v1, Limits, Message};

const BATCH: u32 = 20_000;
const BATCHES: usize = 101;

/// Encodes `h` followed by an RPC stub (its XID and msg_type).
fn message(h: &v1::Header<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; h.buffer_len() + 8];
    let n = h.emit(&mut buf).expect("encode");
    buf[n..n + 4].copy_from_slice(&h.xid.to_be_bytes());
    buf
}

/// Median ns per decode + re-encode of `msg`.
fn measure(msg: &[u8]) -> f64 {
    let limits = Limits::DEFAULT;
    let mut out = [0u8; 256];
    let mut samples = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let start = Instant::now();
        for _ in 0..BATCH {
            let d = decode(black_box(msg), &limits).expect("decode");
            let n = match d.message {
                Message::V1(h) => h.emit(&mut out).expect("encode"),
                _ => unreachable!("v1 header"),
            };
            black_box((&out, n));
        }
        samples.push(start.elapsed().as_nanos() as f64 / f64::from(BATCH));
    }
    samples.sort_by(f64::total_cmp);
    samples[BATCHES / 2]
}

fn main() {
    let reads = [ReadSegment::new(
        48,
        Segment::new(0x1122_3344, 8192, 0x7f00_1234_0000),
    )];
    let write = [Segment::new(0x5566_7788, 65536, 0x7f00_1238_0000)];
    let writes = [Chunk::from_segments(&write)];
    let chunked = v1::Header {
        xid: 0x2f4e_6a80,
        credit: 32,
        body: v1::Body::Msg(ChunkLists {
            reads: ReadList::from_segments(&reads),
            writes: WriteList::from_chunks(&writes),
            reply: None,
        }),
    };
    let empty = v1::Header {
        xid: 0x8a3b_2c1d,
        credit: 32,
        body: v1::Body::Msg(ChunkLists::EMPTY),
    };
    for (name, h) in [
        ("RDMA_MSG, 1 read chunk + 1 write chunk", &chunked),
        ("RDMA_MSG, empty chunk lists", &empty),
    ] {
        let msg = message(h);
        let ns = measure(&msg);
        println!(
            "decode+encode {name} ({} header bytes): median {ns:.1} ns/header ({BATCHES} batches of {BATCH})",
            h.buffer_len()
        );
    }
}
