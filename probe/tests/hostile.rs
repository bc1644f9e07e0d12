//! Hostile replies: arbitrary and mutated bytes never panic the decoders, and declared lengths are bounded.

use proptest::prelude::*;
use rpcrdma_nfsprobe::nfs3;
use rpcrdma_nfsprobe::tcprpc::{mnt_res, parse_reply, read_record};
use rpcrdma_nfsprobe::xdr::XdrError;

fn all(b: &[u8]) {
    let _ = nfs3::getattr_res(b);
    let _ = nfs3::lookup_res(b);
    let _ = nfs3::read_res(b, 1 << 20);
    let _ = nfs3::write_res(b);
    let _ = nfs3::readdirplus_res(b);
    let _ = nfs3::symlink_res(b);
    let _ = nfs3::readlink_res(b, nfs3::MAXPATHLEN);
    let _ = nfs3::remove_res(b);
    let _ = mnt_res(b);
    let _ = parse_reply(b, 1);
    let _ = read_record(&mut &b[..]);
}

/// A valid READDIRPLUS3resok with `n` entries (no attributes, with handles).
fn rdp(n: u32) -> Vec<u8> {
    let mut v: Vec<u8> = Vec::new();
    let mut u = |x: u32| v.extend_from_slice(&x.to_be_bytes());
    u(0);
    u(0);
    u(1);
    u(2);
    for i in 0..n {
        u(1);
        u(0);
        u(i);
        u(1);
        u(u32::from_be_bytes(*b"x\0\0\0"));
        u(0);
        u(i + 1);
        u(0);
        u(1);
        u(4);
        u(i);
    }
    u(0);
    u(1);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic_any_decoder(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        all(&b);
    }

    #[test]
    fn mutated_valid_readdirplus_never_panics(n in 0u32..30, flips in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8)) {
        let mut b = rdp(n);
        prop_assert_eq!(nfs3::readdirplus_res(&b).unwrap().unwrap().entries.len(), n as usize);
        for (at, x) in flips {
            let i = usize::from(at) % b.len();
            b[i] ^= x;
        }
        all(&b);
    }
}

#[test]
fn oversized_handles_names_and_data_are_refused_not_allocated() {
    // LOOKUP3resok whose file handle claims 65 bytes (NFS3_FHSIZE is 64).
    let mut b = vec![0, 0, 0, 0, 0, 0, 0, 65];
    b.extend_from_slice(&[0; 68]);
    assert_eq!(nfs3::lookup_res(&b), Err(XdrError::TooLong(65)));
    // READ3resok with data longer than the count asked for.
    let b = [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8,
    ];
    assert_eq!(nfs3::read_res(&b, 4), Err(XdrError::TooLong(8)));
    // mountres3 claiming 2^30 auth flavors in 4 bytes.
    let b = [0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 1];
    assert!(mnt_res(&b).is_err());
    // A record marker announcing more than the record limit.
    assert!(read_record(&mut &[0xff, 0xff, 0xff, 0xff][..]).is_err());
}
