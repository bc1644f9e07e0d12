//! Captures for Wireshark to judge: RPC messages written as record-marked TCP segments in a
//! pcap file, and `tshark` reading fields back from it (shared by the binding tests).

use std::path::PathBuf;
use std::process::Command;

/// A pcap file (raw IPv4) of RPC records over one TCP conversation, client port 700 to the
/// NFS port 2049 and back.
pub struct Pcap {
    pub bytes: Vec<u8>,
    seq: [u32; 2],
    frames: u32,
}

impl Pcap {
    pub fn new() -> Self {
        let mut bytes = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
        bytes.extend(2u16.to_le_bytes());
        bytes.extend(4u16.to_le_bytes());
        bytes.extend([0u8; 8]);
        bytes.extend(262_144u32.to_le_bytes());
        bytes.extend(101u32.to_le_bytes()); // LINKTYPE_RAW
        Pcap {
            bytes,
            seq: [1, 1],
            frames: 0,
        }
    }

    /// Adds one RPC message as a record-marked TCP segment; returns its frame number.
    pub fn push(&mut self, to_server: bool, rpc: &[u8]) -> u32 {
        let (src, dst, sport, dport, dir) = if to_server {
            ([10, 0, 0, 1], [10, 0, 0, 2], 700u16, 2049u16, 0)
        } else {
            ([10, 0, 0, 2], [10, 0, 0, 1], 2049, 700, 1)
        };
        let mut payload = (0x8000_0000 | rpc.len() as u32).to_be_bytes().to_vec();
        payload.extend(rpc);
        let total = (20 + 20 + payload.len()) as u16;
        let mut p = vec![0x45, 0];
        p.extend(total.to_be_bytes());
        p.extend([0, 1, 0, 0, 64, 6, 0, 0]);
        p.extend(src);
        p.extend(dst);
        p.extend(sport.to_be_bytes());
        p.extend(dport.to_be_bytes());
        p.extend(self.seq[dir].to_be_bytes());
        p.extend(self.seq[1 - dir].to_be_bytes());
        p.extend([0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend(&payload);
        self.seq[dir] = self.seq[dir].wrapping_add(payload.len() as u32);
        self.frames += 1;
        for v in [self.frames, 0, p.len() as u32, p.len() as u32] {
            self.bytes.extend(v.to_le_bytes());
        }
        self.bytes.extend(p);
        self.frames
    }
}

/// Runs tshark on `file` and returns, per frame, the named fields (values of one field
/// joined by commas).
pub fn tshark(file: &PathBuf, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file).args([
        "-o",
        "tcp.analyze_sequence_numbers:FALSE",
        "-T",
        "fields",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run tshark ({e}): scripts/setup installs it"));
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}
