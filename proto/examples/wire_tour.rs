//! A tour of the RPC-over-RDMA wire: decodes the ten worked examples of WIRE.md §5,
//! prints each as tshark would, re-encodes it and compares the bytes, then shows what
//! the codec answers to a few malformed messages.
//!
//! Run with `cargo run -p rpcrdma-proto --example wire_tour`.

use rpcrdma_proto::{decode, Limits, Message, Received};

/// The WIRE.md §5 examples: title, hex, and an RPC payload stub to append (a header that
/// announces an inline RPC message must be followed by one, starting with its XID).
const EXAMPLES: [(&str, &str, &str); 10] = [
    ("1: v1 RDMA_MSG, empty chunk lists, NFSv3 NULL call", "8a3b2c1d0000000100000020000000000000000000000000000000008a3b2c1d0000000000000002000186a3000000030000000000000000000000000000000000000000", ""),
    ("2: v1 RDMA_NOMSG, position-zero Read chunk + Reply chunk", "2f4e6a800000000100000010000000010000000100000000112233440000100000007f0012340000000000010000000011223345000004b000007f001236000000000000000000000000000100000001556677880000200000007f0012380000", ""),
    ("3: RDMA_ERROR / ERR_VERS from a v1-only responder", "2f4e6a81000000020000002000000004000000010000000100000001", ""),
    ("4: v2 RDMA2_OPTIONAL / ROPT_INITXCH", "00000001000000020000002000000005000000000000000100000024000000020000000100000004000010000000000300000004000000010000000100000001", ""),
    ("5: v1 RDMA_MSG reply returning a Write chunk", "2f4e6a8300000001000000200000000000000000000000010000000299aabbcc0000100000007f00aa00000099aabbcd0000038800007f00aa0010000000000000000000", "2f4e6a8300000001"),
    ("6: v2 RDMA2_ERROR / RDMA2_ERR_INVAL_OPTION", "0000000100000002000000200000000400000003", ""),
    ("7: v2 ROPT_REQXCH", "0000000200000002000000200000000500000000000000020000001c00000002000000010000000400002000000000020000000400000001", ""),
    ("8: v2 ROPT_RESPXCH", "000000020000000200000020000000050000000100000003000000140000000100000001000000010000000200000000", ""),
    ("9: v2 ROPT_UPDXCH", "0000000700000002000000200000000500000001000000040000001000000001000000040000200000000001", ""),
    ("10: v2 RDMA2_MSG, no chunks", "0000000300000002000000200000000000000000000000000000000000000000", "0000000300000000"),
];

/// Malformed messages: title, hex, and whether it arrives as a call or a reply.
const MALFORMED: [(&str, &str, Received); 4] = [
    ("a v1 call with rdma_vers = 7", "0000002a00000007000000200000000000000000000000000000000000000000", Received::Call),
    ("a v1 RDMA_NOMSG call with no chunk at all", "0000002b00000001000000200000000100000000000000000000000000000000", Received::Call),
    ("a v1 call whose read position 6 is not a multiple of 4", "0000002c000000010000002000000001000000010000000600000001000000080000000000000000000000000000000000000000", Received::Call),
    ("a reply with an unknown rdma_proc 9", "0000002d00000001000000200000000900000000000000000000000000000000", Received::Reply),
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Re-encodes a decoded message; ERR_VERS of an unknown version has no `Repr` encoder here.
fn reencode(m: &Message<'_>, out: &mut [u8]) -> Option<usize> {
    match m {
        Message::V1(h) => h.emit(out).ok(),
        Message::V2(h) => h.emit(out).ok(),
        Message::ErrVers(_) => None,
    }
}

fn main() {
    let limits = Limits::DEFAULT;
    println!("== The ten worked examples of WIRE.md §5 ==\n");
    let mut failures = 0;
    for (title, header_hex, payload_hex) in EXAMPLES {
        let mut msg = hex(header_hex);
        msg.extend_from_slice(&hex(payload_hex));
        println!("-- Example {title} ({} bytes)", msg.len());
        match decode(&msg, &limits) {
            Ok(d) => {
                print!("{}", d.message);
                if d.header_len < msg.len() {
                    println!("    [{} payload bytes follow]", msg.len() - d.header_len);
                }
                let mut out = [0u8; 256];
                match reencode(&d.message, &mut out) {
                    Some(n) if out[..n] == msg[..d.header_len] => {
                        println!("re-encoded: identical ({n} bytes)\n")
                    }
                    Some(n) => {
                        failures += 1;
                        println!("re-encoded: DIFFERENT ({n} bytes): {}\n", to_hex(&out[..n]));
                    }
                    None => println!("re-encoded: not encodable\n"),
                }
            }
            Err(r) => {
                failures += 1;
                println!("decode FAILED: {r}\n");
            }
        }
    }

    println!("== What the codec answers to malformed messages ==\n");
    for (title, h, received) in MALFORMED {
        let msg = hex(h);
        println!("-- {title}, received as a {received:?}");
        match decode(&msg, &limits) {
            Ok(d) => println!("unexpectedly decoded:\n{}", d.message),
            Err(r) => {
                println!("   error:  {}", r.error);
                println!("   answer: {:?}", r.answer(received));
                if let Some(reply) = r.reply(received, 32, &limits) {
                    let mut out = [0u8; 28];
                    if let Ok(n) = reply.emit(&mut out) {
                        println!("   sends:  {} ({n} bytes)", to_hex(&out[..n]));
                        if let Ok(d) = decode(&out[..n], &limits) {
                            for line in d.message.to_string().lines() {
                                println!("           {line}");
                            }
                        }
                    }
                }
            }
        }
        println!();
    }
    if failures > 0 {
        eprintln!("{failures} example(s) did not round-trip");
        std::process::exit(1);
    }
}
