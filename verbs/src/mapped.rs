//! Safe registration: memory mappings owned by this crate, registered with a provider and
//! kept mapped for as long as the provider may touch them.
//!
//! [`Provider::register`] is `unsafe` because the provider keeps a raw address. A
//! [`Mapped`] owns its mapping (anonymous, or a shared mapping of a file such as an app's
//! memfd), and a [`Registered`] owns the `Mapped` it registered: deregistering gives it
//! back, and dropping a `Registered` that is still registered leaks the mapping instead of
//! unmapping memory the provider may still use. Byte access is bounds-checked copies.

use crate::{Access, Mr, PdId, Provider, Result};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// A private anonymous or shared file mapping owned by this value (unmapped on drop).
#[derive(Debug)]
pub struct Mapped {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to another thread moves
// the only handle (concurrent writers in other processes are tolerated by the byte copies).
unsafe impl Send for Mapped {}

fn map(len: usize, prot: i32, flags: i32, fd: i32, offset: libc::off_t) -> io::Result<Mapped> {
    if len == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
    }
    // SAFETY: a fresh mapping chosen by the kernel (address hint null); it overlaps no Rust
    // object, and the result is checked before use.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>())
        .map(|ptr| Mapped { ptr, len })
        .ok_or_else(|| io::Error::other("mmap returned null"))
}

impl Mapped {
    /// `len` zeroed bytes of private anonymous memory (e.g. a buffer pool).
    pub fn anonymous(len: usize) -> io::Result<Mapped> {
        map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    }

    /// The first `len` bytes of `fd`, mapped shared (e.g. an app's memfd: the app sees every
    /// byte the provider places). The file must be at least `len` bytes long.
    pub fn shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapped> {
        Mapped::shared_range(fd, 0, len)
    }

    /// `len` bytes of `fd` from `offset` (a multiple of the page size), mapped shared: to
    /// register only part of a file (e.g. an app's arena, not its rings).
    pub fn shared_range(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mapped> {
        let size = file_size(fd)?;
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mapping beyond the end of the file",
            ));
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn range(&self, off: u64, n: usize) -> Option<*mut u8> {
        let off = usize::try_from(off).ok()?;
        let end = off.checked_add(n)?;
        if end > self.len {
            return None;
        }
        // SAFETY: off + n <= len, so the offset stays inside the mapping.
        Some(unsafe { self.ptr.as_ptr().add(off) })
    }

    /// Copies `dst.len()` bytes from offset `off`; false (nothing copied) if out of range.
    #[inline]
    pub fn read(&self, off: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.range(off, dst.len()) else {
            return false;
        };
        // SAFETY: `src..src+dst.len()` lies in the mapping (checked); `dst` is private memory
        // and cannot overlap it. Another process may write concurrently: the bytes read are
        // then garbage, which callers treat as untrusted input.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` to offset `off`; false (nothing copied) if out of range.
    #[inline]
    pub fn write(&self, off: u64, src: &[u8]) -> bool {
        let Some(dst) = self.range(off, src.len()) else {
            return false;
        };
        // SAFETY: as for `read`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// Copies `n` bytes from offset `from` to offset `to` of this mapping (ranges may overlap).
    pub fn copy_within(&self, from: u64, to: u64, n: usize) -> bool {
        let (Some(s), Some(d)) = (self.range(from, n), self.range(to, n)) else {
            return false;
        };
        // SAFETY: both ranges lie in the mapping (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, n) };
        true
    }

    /// Copies `n` bytes from offset `from` of `self` to offset `to` of `other`.
    #[inline]
    pub fn copy_to(&self, from: u64, other: &Mapped, to: u64, n: usize) -> bool {
        let (Some(s), Some(d)) = (self.range(from, n), other.range(to, n)) else {
            return false;
        };
        // SAFETY: both ranges are checked against their mappings; two distinct `Mapped`
        // values may map the same file, so `copy` (overlap allowed) is used.
        unsafe { std::ptr::copy(s, d, n) };
        true
    }
}

fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: fstat writes one `stat` into the zeroed buffer we pass; the fd is borrowed valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat`; `fd` is open for the borrow's lifetime.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    u64::try_from(st.st_size).map_err(|_| io::Error::other("negative file size"))
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `map` with this length and is unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A [`Mapped`] registered with a provider (see the module docs for the drop rule).
#[derive(Debug)]
pub struct Registered {
    mr: Mr,
    /// Never dropped while registered: a `Registered` dropped without `deregister` leaks it.
    mem: ManuallyDrop<Mapped>,
}

impl Registered {
    /// Registers all of `mem` in `pd` with `access`.
    pub fn new<P: Provider + ?Sized>(
        p: &mut P,
        pd: PdId,
        mem: Mapped,
        access: Access,
    ) -> Result<Registered> {
        // SAFETY: the mapping stays valid until `deregister` returns it, or forever (leaked)
        // if this value is dropped while registered; nobody relies on its contents while the
        // provider may write (callers read them as untrusted bytes after completions).
        let mr = unsafe { p.register(pd, mem.ptr.as_ptr(), mem.len, access)? };
        Ok(Registered {
            mr,
            mem: ManuallyDrop::new(mem),
        })
    }

    /// The provider's description (id, keys, address, length).
    pub fn mr(&self) -> Mr {
        self.mr
    }

    /// The memory.
    pub fn mem(&self) -> &Mapped {
        &self.mem
    }

    /// Deregisters and returns the mapping (kept leaked if the provider refuses).
    pub fn deregister<P: Provider + ?Sized>(self, p: &mut P) -> Result<Mapped> {
        p.deregister(self.mr.id)?;
        Ok(ManuallyDrop::into_inner(self.mem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::link::MemFabric;
    use crate::soft::{SoftConfig, SoftProvider};

    #[test]
    fn anonymous_mapping_bounds_checked_copies() {
        let m = Mapped::anonymous(4096).expect("map");
        assert!(m.write(4090, b"abcdef"));
        assert!(!m.write(4091, b"abcdef"));
        assert!(!m.write(u64::MAX, b"a"));
        let mut b = [0u8; 6];
        assert!(m.read(4090, &mut b));
        assert_eq!(&b, b"abcdef");
        assert!(m.copy_within(4090, 0, 6));
        assert!(m.read(0, &mut b));
        assert_eq!(&b, b"abcdef");
        assert!(!m.read(4095, &mut b));
    }

    /// Every length and overlap gives what a plain vector's `copy_within` gives, and reads
    /// and writes of every length round-trip.
    #[test]
    fn copies_of_every_small_length_and_overlap() {
        let m = Mapped::anonymous(4096).expect("map");
        let pattern: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=130usize {
            let half = n / 2;
            let pairs = [
                (0, 200),
                (200, 0),
                (10, 13),
                (13, 10),
                (100, 100 + half),
                (100 + half, 100),
                (5, 5),
            ];
            for (from, to) in pairs {
                assert!(m.write(0, &pattern));
                let mut want = pattern.clone();
                want.copy_within(from..from + n, to);
                assert!(m.copy_within(from as u64, to as u64, n));
                let mut got = vec![0u8; 512];
                assert!(m.read(0, &mut got));
                assert_eq!(got, want, "{n} bytes from {from} to {to}");
            }
            assert!(m.write(1000 + n as u64, &pattern[..n]));
            let mut back = vec![0u8; n];
            assert!(m.read(1000 + n as u64, &mut back));
            assert_eq!(back, &pattern[..n], "{n} bytes written and read");
        }
    }

    #[test]
    fn shared_range_maps_part_of_a_file_and_refuses_past_its_end() {
        use std::os::fd::AsFd;
        let path = std::env::temp_dir().join(format!("verbs-mapped-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("file");
        f.set_len(8192).expect("size");
        let whole = Mapped::shared(f.as_fd(), 8192).expect("map whole");
        let tail = Mapped::shared_range(f.as_fd(), 4096, 4096).expect("map tail");
        assert!(tail.write(0, b"xy"));
        let mut b = [0u8; 2];
        assert!(whole.read(4096, &mut b));
        assert_eq!(&b, b"xy", "both mappings see the same file bytes");
        assert!(Mapped::shared_range(f.as_fd(), 4096, 8192).is_err());
        assert!(Mapped::shared(f.as_fd(), 8193).is_err());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn registered_and_deregistered_gives_the_mapping_back() {
        let fabric = MemFabric::new();
        let mut p = SoftProvider::memory(&fabric, SoftConfig::default());
        let pd = p.alloc_pd().expect("pd");
        let r = Registered::new(
            &mut p,
            pd,
            Mapped::anonymous(8192).expect("map"),
            Access::LOCAL_WRITE,
        )
        .expect("register");
        assert_eq!(r.mr().len, 8192);
        let m = r.deregister(&mut p).expect("deregister");
        assert_eq!(m.len(), 8192);
    }
}
