//! A hostile peer: after a valid MPA Request, arbitrary bytes go to a connected soft endpoint
//! (in memory, CRC off). The endpoint must not panic and must not touch memory outside its
//! registered region. In the input, `KEYW`/`KEYM` are replaced by the window's and region's
//! keys and `ADDRESS!` by the region's address, so the fuzzer can reach valid placements.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma_verbs::soft::link::{Link, MemFabric, Transport};
use rpcrdma_verbs::soft::{wire, SoftConfig, SoftProvider};
use rpcrdma_verbs::{Access, CmEvent, ConnParams, Provider, QpInit, WorkCompletion};

const GUARD: usize = 4096;

fn replace(data: &mut [u8], pat: &[u8], with: &[u8]) {
    let mut i = 0;
    while i + pat.len() <= data.len() {
        if &data[i..i + pat.len()] == pat {
            data[i..i + pat.len()].copy_from_slice(with);
            i += pat.len();
        } else {
            i += 1;
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let fabric = MemFabric::new();
    let cfg = SoftConfig { crc: false, ..SoftConfig::default() };
    let mut p = SoftProvider::memory(&fabric, cfg);
    let pd = p.alloc_pd().unwrap();
    let cq = p.create_cq(64).unwrap();
    let mut mem = vec![0xeeu8; 3 * GUARD];
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    // SAFETY: the region is the middle of `mem`, which outlives the provider (dropped first
    // at the end of this closure) and is not resized.
    let mr = unsafe { p.register(pd, mem.as_mut_ptr().add(GUARD), GUARD, all) }.unwrap();
    let l = p.listen("10.0.0.1:1".parse().unwrap()).unwrap();
    let addr = p.listen_addr(l).unwrap();
    let mut t = fabric.port();
    let mut link = t.connect(addr).unwrap();
    let mut req = Vec::new();
    wire::emit_mpa(&mut req, false, wire::MPA_ENHANCED, 2, Some((4, 4)), &[]);
    link.write(&req).unwrap();
    let req_id = loop {
        match p.poll_cm() {
            Some(CmEvent::ConnectRequest { req, .. }) => break req,
            Some(_) => {}
            None => return,
        }
    };
    let qp = p
        .create_qp(&QpInit {
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 8,
            max_recv_wr: 8,
            max_sge: 2,
        })
        .unwrap();
    let sge = |off: u64, len: u32| rpcrdma_verbs::Sge { addr: mr.addr_at(off), len, lkey: mr.lkey };
    p.post_recv(qp, 1, &[sge(0, 64)]).unwrap();
    p.post_recv(qp, 2, &[sge(64, 32), sge(2048, 32)]).unwrap();
    p.accept(req_id, qp, &ConnParams { private_data: &[], responder_resources: 4, initiator_depth: 4 })
        .unwrap();
    let win = p.expose(qp, mr.id, 1024, 1024, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    let mut data = input.to_vec();
    replace(&mut data, b"KEYW", &win.to_be_bytes());
    replace(&mut data, b"KEYM", &mr.rkey.to_be_bytes());
    replace(&mut data, b"ADDRESS!", &mr.addr.to_be_bytes());
    let _ = link.write(&data);
    let mut wcs = [WorkCompletion::default(); 8];
    let mut sink = vec![0u8; 1 << 16];
    for _ in 0..8 {
        let _ = p.poll_cq(cq, &mut wcs);
        while p.poll_cm().is_some() {}
        while matches!(link.read(&mut sink), Ok(n) if n > 0) {}
    }
    drop(p);
    assert!(mem[..GUARD].iter().all(|&b| b == 0xee), "wrote below the region");
    assert!(mem[2 * GUARD..].iter().all(|&b| b == 0xee), "wrote above the region");
});
