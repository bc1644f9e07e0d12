//! Text rendering of headers in the shape of tshark's "RPC over RDMA" tree, for logs.

use core::fmt;

use crate::chunk::{Chunk, ChunkLists, Segment};

pub(crate) fn fixed(f: &mut fmt::Formatter<'_>, xid: u32, vers: u32, credit: u32) -> fmt::Result {
    writeln!(f, "RPC over RDMA")?;
    writeln!(f, "    XID: 0x{xid:08x}")?;
    writeln!(f, "    Version: {vers}")?;
    writeln!(f, "    Flow Control: {credit}")
}

fn segment(f: &mut fmt::Formatter<'_>, indent: &str, s: &Segment) -> fmt::Result {
    writeln!(
        f,
        "{indent}RDMA segment: handle 0x{:08x}, length {}, offset 0x{:016x}",
        s.handle, s.length, s.offset
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn chunk(f: &mut fmt::Formatter<'_>, name: &str, c: &Chunk<'_>) -> fmt::Result {
    let n = c.len();
    writeln!(f, "        {name} ({n} segment{})", plural(n))?;
    c.segments()
        .try_for_each(|s| segment(f, "            ", &s))
}

pub(crate) fn chunk_lists(f: &mut fmt::Formatter<'_>, c: &ChunkLists<'_>) -> fmt::Result {
    writeln!(f, "    Read list (count: {})", c.reads.len())?;
    for rc in c.reads.chunks() {
        let n = rc.segment_count();
        writeln!(f, "        Read chunk ({n} segment{})", plural(n))?;
        writeln!(f, "            Position: {}", rc.position)?;
        rc.segments()
            .try_for_each(|s| segment(f, "            ", &s))?;
    }
    writeln!(f, "    Write list (count: {})", c.writes.len())?;
    for w in c.writes.iter() {
        chunk(f, "Write chunk", &w)?;
    }
    match &c.reply {
        None => writeln!(f, "    Reply chunk (count: 0)"),
        Some(r) => {
            writeln!(f, "    Reply chunk (count: 1)")?;
            chunk(f, "Reply chunk", r)
        }
    }
}
