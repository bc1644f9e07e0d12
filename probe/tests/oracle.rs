//! Independent oracle: the C codec Debian's `rpcgen` generates from an RFC 1813 transcription
//! (tests/oracle/nfs3.x; Debian's own /usr/include/rpcsvc/nfs_prot.x and mount.x are NFSv2/MOUNTv1 only)
//! must agree with the probe's decoders field for field, and decode the probe's arguments to its inputs.
//!
//! Needs `rpcgen` (package rpcsvc-proto), `cc` and libtirpc-dev; fails if they are missing.

use rpcrdma_nfsprobe::nfs3::{self, Fattr3};
use rpcrdma_nfsprobe::probe::Rng;
use rpcrdma_nfsprobe::tcprpc::{mnt_res, RpcError};
use rpcrdma_nfsprobe::xdr::XdrError;
use rpcrdma_shm::client::XdrBuilder;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const SEEDS: u64 = 120;

fn run(cmd: &mut Command, what: &str) -> String {
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
    String::from_utf8(out.stdout).unwrap()
}

fn driver() -> PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let src = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle"));
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nfs3-oracle");
        // rpcgen refuses to overwrite its outputs: start from an empty directory.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(src.join("nfs3.x"), dir.join("nfs3.x")).unwrap();
        for (flag, out) in [("-h", "nfs3.h"), ("-c", "nfs3_xdr.c")] {
            run(
                Command::new("rpcgen")
                    .current_dir(&dir)
                    .args([flag, "-o", out, "nfs3.x"]),
                "rpcgen",
            );
        }
        let exe = dir.join("driver");
        run(
            Command::new("cc")
                .current_dir(&dir)
                .args(["-O1", "-I/usr/include/tirpc", "-I."])
                .arg(src.join("driver.c"))
                .args(["nfs3_xdr.c", "-ltirpc", "-o"])
                .arg(&exe),
            "cc (with -ltirpc)",
        );
        exe
    })
    .clone()
}

/// `(bytes, canonical field line)` of rpcgen's encoding of case `c` for `seed`.
fn enc(c: &str, seed: u64) -> (Vec<u8>, String) {
    let out = run(
        Command::new(driver()).args(["enc", c, &seed.to_string()]),
        "driver enc",
    );
    let mut lines = out.lines();
    let hex = lines.next().unwrap().trim();
    let fields = lines.next().unwrap().to_string();
    (unhex(if hex == "." { "" } else { hex }), fields)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(d: &[u8]) -> String {
    if d.is_empty() {
        return " .".into();
    }
    let mut s = String::from(" ");
    for b in d {
        write!(s, "{b:02x}").unwrap();
    }
    s
}

fn fattr(a: &Fattr3) -> String {
    format!(
        " A {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
        a.ftype,
        a.mode,
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        a.used,
        a.rdev.0,
        a.rdev.1,
        a.fsid,
        a.fileid,
        a.times[0].0,
        a.times[0].1,
        a.times[1].0,
        a.times[1].1,
        a.times[2].0,
        a.times[2].1
    )
}

fn poa(a: &Option<Fattr3>) -> String {
    a.as_ref().map_or(" -".into(), fattr)
}

/// Decodes `b` as case `c` with the probe's decoders and prints the canonical field line.
fn ours(c: &str, b: &[u8]) -> Result<String, String> {
    let e = |e: XdrError| e.to_string();
    Ok(match c {
        "getattr" => match nfs3::getattr_res(b).map_err(e)? {
            Ok(a) => format!("0{}", fattr(&a)),
            Err((s, ())) => s.to_string(),
        },
        "lookup" => match nfs3::lookup_res(b).map_err(e)? {
            Ok(k) => format!("0{}{}{}", hex(&k.fh), poa(&k.obj), poa(&k.dir)),
            Err((s, d)) => format!("{s}{}", poa(&d)),
        },
        "read" => match nfs3::read_res(b, u32::MAX).map_err(e)? {
            Ok(k) => format!(
                "0{} {} {}{}",
                poa(&k.attr),
                k.count,
                u8::from(k.eof),
                hex(&k.data)
            ),
            Err((s, a)) => format!("{s}{}", poa(&a)),
        },
        "write" => {
            let (s, w, ok) = match nfs3::write_res(b).map_err(e)? {
                Ok(k) => (0, k.wcc.clone(), Some(k)),
                Err((s, w)) => (s, w, None),
            };
            let mut l = s.to_string();
            match &w.before {
                Some(b) => write!(
                    l,
                    " B {} {} {} {} {}",
                    b.size, b.mtime.0, b.mtime.1, b.ctime.0, b.ctime.1
                )
                .unwrap(),
                None => l.push_str(" -"),
            }
            l.push_str(&poa(&w.after));
            if let Some(k) = ok {
                write!(l, " {} {}{}", k.count, k.committed, hex(&k.verf)).unwrap();
            }
            l
        }
        "rdp" => match nfs3::readdirplus_res(b).map_err(e)? {
            Ok(k) => {
                let mut l = format!("0{}{}", poa(&k.dir), hex(&k.verf));
                for en in &k.entries {
                    write!(
                        l,
                        " E {} {} {}{}",
                        en.fileid,
                        String::from_utf8_lossy(&en.name),
                        en.cookie,
                        poa(&en.attr)
                    )
                    .unwrap();
                    l.push_str(&en.fh.as_deref().map_or(" -".into(), hex));
                }
                write!(l, " eof {}", u8::from(k.eof)).unwrap();
                l
            }
            Err((s, a)) => format!("{s}{}", poa(&a)),
        },
        "mnt" => match mnt_res(b) {
            Ok((fh, fl)) => {
                let mut l = format!("0{}", hex(&fh));
                for f in fl {
                    write!(l, " {f}").unwrap();
                }
                l
            }
            Err(RpcError::Mount(s)) => s.to_string(),
            Err(e) => return Err(e.to_string()),
        },
        _ => unreachable!(),
    })
}

const CASES: [&str; 6] = ["getattr", "lookup", "read", "write", "rdp", "mnt"];

#[test]
fn rfc1813_results_encoded_by_rpcgen_decode_to_the_same_fields() {
    let mut ok_arms = 0;
    for c in CASES {
        for seed in 0..SEEDS {
            let (b, want) = enc(c, seed);
            let got = ours(c, &b).unwrap_or_else(|e| panic!("{c} seed {seed}: {e}\n{want}"));
            assert_eq!(got, want, "{c} seed {seed}");
            ok_arms += usize::from(want.starts_with("0 ") || want == "0");
        }
    }
    // Both arms of every union were exercised (the driver picks NFS3_OK about two times in three).
    assert!(ok_arms > CASES.len() * SEEDS as usize / 2 && ok_arms < CASES.len() * SEEDS as usize);
}

#[test]
fn rfc1813_every_strict_prefix_of_a_valid_result_is_rejected() {
    for c in CASES {
        for seed in 0..20 {
            let (b, _) = enc(c, seed);
            for cut in 0..b.len() {
                assert!(
                    ours(c, &b[..cut]).is_err(),
                    "{c} seed {seed}: prefix of {cut}/{} bytes accepted",
                    b.len()
                );
            }
        }
    }
}

fn dec(c: &str, x: &XdrBuilder) -> String {
    let full = x.to_full();
    let h = hex(&full);
    run(
        Command::new(driver()).args(["dec", c, h.trim().trim_start_matches('.')]),
        "driver dec",
    )
    .trim_end()
    .to_string()
}

fn fh(rng: &mut Rng) -> Vec<u8> {
    (0..rng.range(0, 64))
        .map(|_| rng.next_u64() as u8)
        .collect()
}

#[test]
fn rfc1813_arguments_built_by_the_probe_decode_in_rpcgen_to_the_inputs() {
    let mut rng = Rng::new(1813);
    for _ in 0..40 {
        let f = fh(&mut rng);
        let (off, count) = (rng.next_u64(), rng.next_u64() as u32);

        let mut x = XdrBuilder::default();
        nfs3::getattr_args(&mut x, &f);
        assert_eq!(dec("getattr", &x), format!("{} rest 0", hex(&f)));

        let name: String = (0..rng.range(1, 40))
            .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
            .collect();
        let mut x = XdrBuilder::default();
        nfs3::lookup_args(&mut x, &f, &name);
        assert_eq!(dec("lookup", &x), format!("{} {name} rest 0", hex(&f)));

        let mut x = XdrBuilder::default();
        nfs3::read_args(&mut x, &f, off, count);
        assert_eq!(dec("read", &x), format!("{} {off} {count} rest 0", hex(&f)));

        let data: Vec<u8> = (0..rng.range(0, 300))
            .map(|_| rng.next_u64() as u8)
            .collect();
        for ddp in [false, true] {
            let mut x = XdrBuilder::default();
            nfs3::write_args(&mut x, &f, off, &data, ddp);
            assert_eq!(
                dec("write", &x),
                format!(
                    "{} {off} {} {}{} rest 0",
                    hex(&f),
                    data.len(),
                    nfs3::FILE_SYNC,
                    hex(&data)
                )
            );
        }

        let verf = rng.next_u64().to_be_bytes();
        let mut x = XdrBuilder::default();
        nfs3::readdirplus_args(&mut x, &f, off, verf, count, count ^ 1);
        assert_eq!(
            dec("rdp", &x),
            format!(
                "{} {off}{} {count} {} rest 0",
                hex(&f),
                hex(&verf),
                count ^ 1
            )
        );
    }
}
