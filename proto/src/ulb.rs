//! Upper-Layer Bindings (RFC 8166 §6): which XDR items may be reduced (moved to chunks).
