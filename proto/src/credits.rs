//! How many credits a connection may grant from a share of a shared receive queue
//! (RFC 8166 §3.3.1: a responder grants no more credits than it has receives posted).
//! The configuration checker and the poll thread both apply this rule, so it lives here once.

/// Receives each connection keeps unassigned to credits: room for a version-two optional
/// message, which is sent without a credit (AMB-19).
pub const SPARE_RECEIVES: u32 = 1;

/// Forward and backward credits a connection gets from a share of `share` receive buffers,
/// given the configured `credits` and `backchannel` credits: all of them when the share holds
/// them plus [`SPARE_RECEIVES`]; otherwise both scaled down in proportion (backchannel at
/// least 1 if configured, forward at least 1). `None`: the share cannot hold one forward
/// credit (and one backchannel credit, if configured) plus the spare.
///
/// ```
/// use rpcrdma_proto::credits::divide_share;
/// assert_eq!(divide_share(32, 8, 41), Some((32, 8)));
/// assert_eq!(divide_share(32, 8, 12), Some((9, 2)));
/// assert_eq!(divide_share(32, 8, 2), None);
/// ```
pub fn divide_share(credits: u32, backchannel: u32, share: u32) -> Option<(u32, u32)> {
    let credits = credits.max(1);
    let avail = share.checked_sub(SPARE_RECEIVES)?;
    if avail >= credits.saturating_add(backchannel) {
        return Some((credits, backchannel));
    }
    let bc = if backchannel == 0 {
        0
    } else {
        let scaled = u64::from(avail) * u64::from(backchannel)
            / (u64::from(credits) + u64::from(backchannel));
        (scaled as u32).clamp(1, backchannel)
    };
    let fwd = avail.checked_sub(bc).filter(|&f| f >= 1)?;
    Some((fwd.min(credits), bc))
}
