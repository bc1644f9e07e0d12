//! The `soft` provider: iWARP (RDMAP/DDP/MPA, the Linux `siw` wire) in user space, over TCP or in memory.
