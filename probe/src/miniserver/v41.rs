//! The NFSv4.1 operations (RFC 8881) the Linux kernel's client needs to mount the miniserver
//! and read it: PUTROOTFH, GETATTR with the attributes it asks for, SECINFO_NO_NAME, LOOKUP,
//! LOOKUPP, ACCESS, SAVEFH and RESTOREFH, READDIR and OPEN by name or by handle. Files are
//! the export root's (`read.bin`, `write.bin`, `dir`, `deleg.bin`, the probe's link); `dir`'s
//! own entries are the NFSv3 side's only.

use super::{v4, Fs, FH_DELEG, FH_DIR, FH_LINK, FH_READ, FH_WRITE, MAX_FILE, MAX_IO, ROOT};
use crate::nfs4::{op, put_fixed, ERR_NOENT};
use crate::probe::LINK_NAME;
use crate::xdr::{Reader, Writer};
use rpcrdma_shm::client::XdrBuilder;

const ERR_NOTDIR: u32 = 20;
const ERR_TOOSMALL: u32 = 10_005;
const ERR_RESTOREFH: u32 = 10_030;

/// The attributes served, by bit (`fattr4` numbering): the REQUIRED ones and those the Linux
/// client asks for at mount, for `stat` and for `ls`.
const SUPPORTED: [u32; 2] = [
    bits(&[
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 16, 17, 18, 19, 20, 21, 22, 23, 26, 27, 28,
        29, 30, 31,
    ]),
    bits(&[1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 15, 19, 20, 21, 23]),
];

const fn bits(list: &[u32]) -> u32 {
    let mut w = 0;
    let mut i = 0;
    while i < list.len() {
        w |= 1 << list[i];
        i += 1;
    }
    w
}

/// A `bitmap4` of at most 8 words (`None` beyond: the arguments are refused).
fn bitmap4(r: &mut Reader<'_>) -> Option<Vec<u32>> {
    let n = r.u32().ok().filter(|&n| n <= 8)?;
    (0..n).map(|_| r.u32().ok()).collect()
}

/// One object's attributes as the encoder needs them.
struct Obj<'a> {
    ftype: u32,
    size: u64,
    fileid: u64,
    fh: &'a [u8],
}

/// A fixed time for every timestamp (the files never change but `write.bin`, whose change
/// attribute is its size).
const TIME: u64 = 1_790_000_000;

/// `fattr4` of `o` for the attributes asked for in `want` that are served: the bitmap of those
/// and their values in bit order.
fn fattr4(x: &mut XdrBuilder, want: &[u32], o: &Obj<'_>) {
    let mut got = [0u32; 2];
    let mut v = Writer::default();
    for bit in 0..64u32 {
        let (w, b) = ((bit / 32) as usize, bit % 32);
        let asked = want.get(w).is_some_and(|m| m & (1 << b) != 0);
        if !asked || SUPPORTED[w] & (1 << b) == 0 {
            continue;
        }
        got[w] |= 1 << b;
        let dir = o.ftype == 2;
        let _ = match bit {
            0 => v.u32(2).u32(SUPPORTED[0]).u32(SUPPORTED[1]),
            1 => v.u32(o.ftype),
            2 => v.u32(0), // FH4_PERSISTENT
            3 => v.u64(o.size),
            4 => v.u64(o.size),
            5 | 6 | 9 | 15 | 17 | 18 | 26 | 34 => v.u32(1),
            7 | 16 => v.u32(0),
            8 => v.u64(2).u64(0), // fsid: one file system
            10 => v.u32(90),      // lease time
            11 | 13 => v.u32(0),  // rdattr_error, aclsupport
            19 => v.opaque(o.fh),
            20 | 55 => v.u64(o.fileid),
            21..=23 => v.u64(1_000_000),
            27 => v.u64(MAX_FILE as u64),
            28 => v.u32(1),
            29 => v.u32(255),
            30 | 31 => v.u64(u64::from(MAX_IO)),
            33 => v.u32(match o.ftype {
                2 => 0o755,
                5 => 0o777,
                _ => 0o644,
            }),
            35 => v.u32(if dir { 2 } else { 1 }),
            36 | 37 => v.opaque(b"0"),
            41 => v.u32(0).u32(0),
            42..=44 => v.u64(1 << 30),
            45 => v.u64(o.size),
            47 | 52 | 53 => v.u64(TIME).u32(0),
            51 => v.u64(0).u32(1),
            _ => &mut v,
        };
    }
    let words = if got[1] != 0 { 2 } else { 1 };
    x.put_u32(words as u32);
    for w in got.iter().take(words) {
        x.put_u32(*w);
    }
    x.put_opaque(&v.buf);
}

impl Fs {
    /// The root's entries: (name, handle), `deleg.bin` and the link included when it exists.
    fn root_entries(&self) -> Vec<(&'static [u8], &'static [u8])> {
        let mut e: Vec<(&[u8], &[u8])> = vec![
            (b"read.bin", FH_READ),
            (b"write.bin", FH_WRITE),
            (b"dir", FH_DIR),
            (b"deleg.bin", FH_DELEG),
        ];
        if self.link.is_some() {
            e.push((LINK_NAME.as_bytes(), FH_LINK));
        }
        e
    }

    /// The handle of the root's entry `name`.
    pub(super) fn root_entry(&self, name: &[u8]) -> Option<&'static [u8]> {
        self.root_entries()
            .into_iter()
            .find(|e| e.0 == name)
            .map(|e| e.1)
    }

    fn obj<'a>(&self, fh: &'a [u8]) -> Option<Obj<'a>> {
        // NFSv3's file types are NFSv4's for regular files, directories and links.
        let (ftype, size, fileid) = self.attr(fh)?;
        Some(Obj {
            ftype,
            size,
            fileid,
            fh,
        })
    }

    /// One operation of [`v41`](self) on the current handle `cur` (and the saved one), its
    /// arguments read from `r` and its status and result written after its number: the
    /// status, or `None` if the arguments are malformed (the COMPOUND then fails).
    pub(super) fn op41(
        &mut self,
        opnum: u32,
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
        cur: &mut Option<&'static [u8]>,
        saved: &mut Option<&'static [u8]>,
    ) -> Option<u32> {
        let status = match opnum {
            op::PUTROOTFH => {
                *cur = Some(ROOT);
                0
            }
            op::SAVEFH => match *cur {
                Some(fh) => {
                    *saved = Some(fh);
                    0
                }
                None => v4::ERR_NOFILEHANDLE,
            },
            op::RESTOREFH => match *saved {
                Some(fh) => {
                    *cur = Some(fh);
                    0
                }
                None => ERR_RESTOREFH,
            },
            op::SECINFO_NO_NAME => {
                r.u32().ok()?;
                // AUTH_SYS, then AUTH_NONE (what rpcrdmad's apps send).
                x.put_u32(0).put_u32(2).put_u32(1).put_u32(0);
                return Some(0);
            }
            op::GETATTR => {
                let want = bitmap4(r)?;
                let Some(o) = cur.and_then(|fh| self.obj(fh)) else {
                    x.put_u32(v4::ERR_NOFILEHANDLE);
                    return Some(v4::ERR_NOFILEHANDLE);
                };
                x.put_u32(0);
                fattr4(x, &want, &o);
                return Some(0);
            }
            op::LOOKUP => {
                let name = r.opaque(1024).ok()?;
                match *cur {
                    Some(ROOT) => match self.root_entry(name) {
                        Some(fh) => {
                            *cur = Some(fh);
                            0
                        }
                        None => ERR_NOENT,
                    },
                    Some(FH_DIR) => ERR_NOENT,
                    Some(_) => ERR_NOTDIR,
                    None => v4::ERR_NOFILEHANDLE,
                }
            }
            op::LOOKUPP => match *cur {
                Some(ROOT) => ERR_NOENT,
                Some(_) => {
                    *cur = Some(ROOT);
                    0
                }
                None => v4::ERR_NOFILEHANDLE,
            },
            op::ACCESS => {
                let want = r.u32().ok()?;
                if cur.is_none() {
                    x.put_u32(v4::ERR_NOFILEHANDLE);
                    return Some(v4::ERR_NOFILEHANDLE);
                }
                x.put_u32(0).put_u32(want).put_u32(want);
                return Some(0);
            }
            op::READDIR => return self.readdir4(r, x, *cur),
            _ => {
                x.put_u32(v4::ERR_NOTSUPP);
                return Some(v4::ERR_NOTSUPP);
            }
        };
        x.put_u32(status);
        Some(status)
    }

    /// READDIR of the root (its entries with the attributes asked for, within `maxcount`);
    /// `dir` is listed empty here (its names are the NFSv3 side's).
    fn readdir4(
        &mut self,
        r: &mut Reader<'_>,
        x: &mut XdrBuilder,
        cur: Option<&'static [u8]>,
    ) -> Option<u32> {
        let cookie = r.u64().ok()?;
        r.fixed(8).ok()?;
        let _dircount = r.u32().ok()?;
        let maxcount = r.u32().ok()? as usize;
        let want = bitmap4(r)?;
        let status = match cur {
            None => v4::ERR_NOFILEHANDLE,
            Some(ROOT | FH_DIR) => 0,
            Some(_) => ERR_NOTDIR,
        };
        let entries = if cur == Some(ROOT) {
            self.root_entries()
        } else {
            Vec::new()
        };
        if status != 0 {
            x.put_u32(status);
            return Some(status);
        }
        // Cookies 3.. name the entries (0 is the start; 1 and 2 stand for "." and "..").
        let skip = usize::try_from(cookie.saturating_sub(2)).ok()?;
        let mut list = Vec::new();
        let mut done = true;
        for (k, (name, fh)) in entries.iter().enumerate().skip(skip) {
            let mut e = XdrBuilder::default();
            e.put_u32(1)
                .put_u32(0)
                .put_u32(k as u32 + 3)
                .put_opaque(name);
            fattr4(&mut e, &want, &self.obj(fh)?);
            let e = e.to_full();
            // Status, verifier, the list's end and eof: 20 bytes besides the entries.
            if list.len() + e.len() + 20 > maxcount {
                done = false;
                break;
            }
            list.extend_from_slice(&e);
        }
        if list.is_empty() && !done {
            x.put_u32(ERR_TOOSMALL);
            return Some(ERR_TOOSMALL);
        }
        x.put_u32(0);
        put_fixed(x, &[0; 8]);
        put_fixed(x, &list);
        x.put_u32(0).put_u32(u32::from(done));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fattr4` as the Linux client decodes it: the bitmap of what was served (asked for and
    /// supported) and the values in bit order.
    #[test]
    fn attributes_come_in_bit_order_and_only_those_asked_for_and_served() {
        let fs = Fs::new(7, 4096, 3);
        let o = fs.obj(FH_READ).unwrap();
        // TYPE, SIZE, ACL (not served), FILEID; MODE, NUMLINKS, OWNER; a word-2 bit.
        let want = [
            1 << 1 | 1 << 4 | 1 << 12 | 1 << 20,
            1 << 1 | 1 << 3 | 1 << 4,
            1,
        ];
        let mut x = XdrBuilder::default();
        fattr4(&mut x, &want, &o);
        let b = x.to_full();
        let mut r = Reader::new(&b);
        assert_eq!(r.u32().unwrap(), 2, "two bitmap words");
        assert_eq!(r.u32().unwrap(), 1 << 1 | 1 << 4 | 1 << 20);
        assert_eq!(r.u32().unwrap(), 1 << 1 | 1 << 3 | 1 << 4);
        let vals = r.opaque(1024).unwrap();
        assert_eq!(r.remaining(), 0);
        let mut v = Reader::new(vals);
        assert_eq!(v.u32().unwrap(), 1, "NF4REG");
        assert_eq!(v.u64().unwrap(), 4096, "size");
        assert_eq!(v.u64().unwrap(), 2, "fileid");
        assert_eq!(v.u32().unwrap(), 0o644, "mode");
        assert_eq!(v.u32().unwrap(), 1, "numlinks");
        assert_eq!(v.opaque(16).unwrap(), b"0", "owner");
        assert_eq!(v.remaining(), 0);
    }

    /// READDIR of the root: its entries with cookies from 3 within `maxcount`, resumable
    /// from the last cookie; a bitmap of more than 8 words is refused.
    #[test]
    fn readdir_of_the_root_pages_within_maxcount() {
        let mut fs = Fs::new(7, 4096, 3);
        let list = |fs: &mut Fs, cookie: u64, maxcount: u32| {
            let mut a = XdrBuilder::default();
            a.put_u32((cookie >> 32) as u32).put_u32(cookie as u32);
            a.put_u32(0).put_u32(0).put_u32(maxcount).put_u32(maxcount);
            a.put_u32(1).put_u32(1 << 20); // FILEID
            let a = a.to_full();
            let mut x = XdrBuilder::default();
            let st = fs.readdir4(&mut Reader::new(&a), &mut x, Some(ROOT));
            let b = x.to_full();
            let mut r = Reader::new(&b);
            assert_eq!((st, r.u32().unwrap()), (Some(0), 0));
            r.fixed(8).unwrap();
            let mut names = Vec::new();
            while r.bool().unwrap() {
                let c = r.u64().unwrap();
                names.push((
                    c,
                    String::from_utf8(r.opaque(255).unwrap().to_vec()).unwrap(),
                ));
                r.u32().unwrap();
                r.fixed(4).unwrap();
                r.opaque(64).unwrap();
            }
            (names, r.bool().unwrap())
        };
        let (all, eof) = list(&mut fs, 0, 4096);
        let names: Vec<&str> = all.iter().map(|e| e.1.as_str()).collect();
        assert_eq!(names, ["read.bin", "write.bin", "dir", "deleg.bin"]);
        assert!(eof);
        assert_eq!(all[0].0, 3);
        // Room for two entries (44 and 48 bytes: value follows, cookie, name, a one-word
        // bitmap and the fileid) and the 20 bytes around them, not for a third.
        let (first, eof) = list(&mut fs, 0, 120);
        assert_eq!((first.len(), eof), (2, false));
        let (rest, eof) = list(&mut fs, first[1].0, 4096);
        assert_eq!(rest.len() + 2, 4);
        assert!(eof);
        let mut a = XdrBuilder::default();
        a.put_u32(9);
        assert_eq!(bitmap4(&mut Reader::new(&a.to_full())), None);
    }
}
