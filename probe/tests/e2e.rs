//! The real `nfs-probe` process against a tiny NFSv3-subset server app served through real shared memory
//! (the `shm-loopback` routing of rpcrdma-shm, standing in for rpcrdmad) and a real TCP MOUNT server.
//! It proves the probe's NFS layer, DDP marking and checks end to end; the kernel server is the VM's job.

use rpcrdma_nfsprobe::nfs::pattern_at;
use rpcrdma_nfsprobe::nfs3;
use rpcrdma_nfsprobe::tcprpc::read_record;
use rpcrdma_nfsprobe::xdr::{Reader, Writer};
use rpcrdma_shm::abi::Geometry;
use rpcrdma_shm::client::{Call, ReplyBuilder, XdrBuilder};
use rpcrdma_shm::loopback::Loopback;
use rpcrdma_shm::Server;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const READ_SIZE: usize = 2 << 20;
const SEED: u32 = 7;
const ROOT: &[u8] = b"root-fh-0001";
const FH_READ: &[u8] = b"fh-read";
const FH_WRITE: &[u8] = b"fh-write";
const FH_DIR: &[u8] = b"fh-dir";

fn put_fattr(x: &mut XdrBuilder, ftype: u32, size: u64, fileid: u64) {
    x.put_u32(ftype)
        .put_u32(0o644)
        .put_u32(1)
        .put_u32(0)
        .put_u32(0);
    for v in [size, size, 0, 1, fileid] {
        x.put_u32((v >> 32) as u32).put_u32(v as u32);
    }
    for _ in 0..6 {
        x.put_u32(0);
    }
}

/// The tiny file system: one pattern file, one writable file and a directory of `entries` names.
struct Fs {
    read: Vec<u8>,
    write: Vec<u8>,
    entries: u64,
}

impl Fs {
    fn attr(&self, fh: &[u8]) -> Option<(u32, u64, u64)> {
        match fh {
            ROOT => Some((nfs3::NF3DIR, 4096, 1)),
            FH_READ => Some((nfs3::NF3REG, self.read.len() as u64, 2)),
            FH_WRITE => Some((nfs3::NF3REG, self.write.len() as u64, 3)),
            FH_DIR => Some((nfs3::NF3DIR, 4096, 4)),
            _ => None,
        }
    }

    fn post_op(&self, x: &mut XdrBuilder, fh: &[u8]) {
        match self.attr(fh) {
            Some((t, s, id)) => {
                x.put_u32(1);
                put_fattr(x, t, s, id);
            }
            None => {
                x.put_u32(0);
            }
        }
    }

    fn serve(&mut self, call: &Call<'_>, reply: &mut ReplyBuilder) {
        let mut r = Reader::new(call.args);
        if self.proc(call.proc_, &mut r, &mut reply.xdr).is_none() {
            reply.xdr = XdrBuilder::default();
            reply.accept_stat = 4; // GARBAGE_ARGS
        }
    }

    fn proc(&mut self, p: u32, r: &mut Reader<'_>, x: &mut XdrBuilder) -> Option<()> {
        match p {
            nfs3::NULL => {}
            nfs3::GETATTR => {
                let fh = r.opaque(64).ok()?;
                let (t, s, id) = self.attr(fh)?;
                x.put_u32(0);
                put_fattr(x, t, s, id);
            }
            nfs3::LOOKUP => {
                let _dir = r.opaque(64).ok()?;
                let fh: &[u8] = match r.opaque(255).ok()? {
                    b"read.bin" => FH_READ,
                    b"write.bin" => FH_WRITE,
                    b"dir" => FH_DIR,
                    _ => {
                        x.put_u32(2).put_u32(0); // NFS3ERR_NOENT, no dir attributes
                        return Some(());
                    }
                };
                x.put_u32(0).put_opaque(fh);
                self.post_op(x, fh);
                x.put_u32(0);
            }
            nfs3::READ => {
                let fh = r.opaque(64).ok()?;
                let off = r.u64().ok()? as usize;
                let count = r.u32().ok()? as usize;
                let file = if fh == FH_READ {
                    &self.read
                } else {
                    &self.write
                };
                let start = off.min(file.len());
                let end = start.saturating_add(count).min(file.len());
                let data = file.get(start..end)?.to_vec();
                x.put_u32(0);
                self.post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(u32::from(end == file.len()))
                    .put_ddp_opaque(&data);
            }
            nfs3::WRITE => {
                let fh = r.opaque(64).ok()?;
                let off = r.u64().ok()? as usize;
                let _count = r.u32().ok()?;
                let _stable = r.u32().ok()?;
                let data = r.opaque(4 << 20).ok()?;
                if fh != FH_WRITE {
                    x.put_u32(13).put_u32(0).put_u32(0); // NFS3ERR_ACCES
                    return Some(());
                }
                let end = off.checked_add(data.len())?;
                if self.write.len() < end {
                    self.write.resize(end, 0);
                }
                self.write.get_mut(off..end)?.copy_from_slice(data);
                x.put_u32(0).put_u32(0);
                self.post_op(x, fh);
                x.put_u32(data.len() as u32)
                    .put_u32(nfs3::FILE_SYNC)
                    .put_u32(1)
                    .put_u32(2);
            }
            nfs3::READDIRPLUS => {
                let _dir = r.opaque(64).ok()?;
                let cookie = r.u64().ok()?;
                let _verf = r.fixed(8).ok()?;
                let _dircount = r.u32().ok()?;
                let maxcount = r.u32().ok()? as usize;
                x.put_u32(0);
                self.post_op(x, FH_DIR);
                x.put_u32(0).put_u32(0);
                let mut i = cookie;
                let mut used = 0usize;
                while i < self.entries && used + 200 < maxcount {
                    let name = format!("f{i:05}");
                    x.put_u32(1).put_u32(0).put_u32(100 + i as u32);
                    x.put_opaque(name.as_bytes());
                    x.put_u32(0).put_u32(i as u32 + 1);
                    x.put_u32(1);
                    put_fattr(x, nfs3::NF3REG, 0, 100 + i);
                    x.put_u32(1).put_opaque(name.as_bytes());
                    used += 140;
                    i += 1;
                }
                x.put_u32(0).put_u32(u32::from(i == self.entries));
            }
            _ => return None,
        }
        Some(())
    }
}

/// A one-shot MOUNT v3 server: answers MNT of `/export` with [`ROOT`], anything else with MNT3ERR_NOENT.
fn mountd() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let Ok(rec) = read_record(&mut s) else {
                continue;
            };
            let mut r = Reader::new(&rec);
            let xid = r.u32().unwrap();
            for _ in 0..5 {
                r.u32().unwrap();
            }
            r.u32().unwrap();
            r.opaque(400).unwrap();
            r.u32().unwrap();
            r.opaque(400).unwrap();
            let path = r.opaque(1024).unwrap().to_vec();
            let mut w = Writer::default();
            w.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0);
            if path == b"/export" {
                w.u32(0).opaque(ROOT).u32(1).u32(1);
            } else {
                w.u32(2);
            }
            let mut out = (0x8000_0000u32 | w.buf.len() as u32).to_be_bytes().to_vec();
            out.extend_from_slice(&w.buf);
            let _ = s.write_all(&out);
        }
    });
    port
}

fn start(dir: &Path, entries: u64) -> (PathBuf, u16) {
    let sock = dir.join("lb.sock");
    let mut lb = Loopback::bind(
        &sock,
        Geometry {
            arena_size: 64 << 20,
            ..Geometry::default()
        },
    )
    .unwrap();
    std::thread::spawn(move || lb.run(Duration::from_micros(50)));
    let mut server = Server::connect(&sock).unwrap();
    server.receive_buffers(4, (1 << 20) + 4096);
    let mut fs = Fs {
        read: pattern_at(SEED, 0, READ_SIZE),
        write: Vec::new(),
        entries,
    };
    std::thread::spawn(move || server.serve(nfs3::PROG, nfs3::VERS, |c, r| fs.serve(c, r)));
    (sock, mountd())
}

fn probe(sock: &Path, port: u16, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nfs-probe"))
        .args(["run", "--socket"])
        .arg(sock)
        .args(["--peer", "loopback", "--mount-server", "127.0.0.1"])
        .args(["--mount-port", &port.to_string(), "--export", "/export"])
        .args([
            "--read-size",
            &READ_SIZE.to_string(),
            "--timeout-ms",
            "20000",
        ])
        .args(["--random-rounds", "20", "--dir-entries", "300", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn probe_passes_every_step_against_an_nfsv3_subset_server_through_shared_memory() {
    let d = tmpdir("probe-e2e-pass");
    let (sock, port) = start(&d, 300);
    let out = probe(&sock, port, &["--rdp-maxcount", "8192"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["failed"], 0, "{text}");
    let names: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "mount",
            "null",
            "getattr",
            "lookup",
            "read_1mib_write_chunk",
            "write_1mib_read_chunk",
            "random_sizes",
            "readdirplus_reply_chunk",
            "long_call_inline_write",
            "inflight"
        ]
    );
    // 300 entries at most ~57 per 8 KiB reply: the cookie loop must have taken several calls.
    let rdp = &v["steps"][7]["detail"];
    assert!(
        rdp.as_str().unwrap().starts_with("300 entries in 6 calls"),
        "{rdp}"
    );
}

#[test]
fn probe_fails_with_nonzero_exit_when_the_directory_count_or_export_is_wrong() {
    let d = tmpdir("probe-e2e-fail");
    let (sock, port) = start(&d, 299);
    let out = probe(&sock, port, &["--random-rounds", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], 1);
    assert_eq!(v["steps"][7]["pass"], false);
    assert_eq!(v["steps"][7]["detail"], "299 entries, expected 300");

    let out = probe(&sock, port, &["--export", "/nope"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["steps"][0]["pass"], false);
    assert!(v["steps"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("mountstat3 2"));
}
