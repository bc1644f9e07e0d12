//! The application ABI: shared-memory rings, arena, client and server libraries.
