//! How a poll thread sizes its buffers: one shared receive queue of `recv_buffers` buffers
//! and one shared send pool of `send_buffers` buffers, both registered once, for every
//! connection of the thread ([`ReceiveQueues::Shared`]); or, with
//! [`ReceiveQueues::PerConnection`], a block of its own per connection slot (its receives:
//! full credits, backchannel credits and a spare; its send buffers), at the price of memory
//! growing with connections × credits.
//!
//! Receive memory is `recv_buffers × recv_size`, whatever the number of connections. The
//! grants stay covered by posted receives (R8166-3.3.1-g/h) because each connection slot
//! owns a fixed share of the queue: `recv_buffers / max_conns` buffers, one of them kept
//! spare (a version-two optional message, AMB-19), the rest split between forward credits and
//! backchannel credits. When the share is smaller than the configured credits, every
//! connection's grant (and request) is capped to fit: the sum of grants never exceeds the
//! receives posted, and every connection keeps at least one credit, so all are served.
//! The send pool must cover what those capped shares can have in flight at once, so a
//! connection never finds it empty.

use super::{PoolSpec, ReceiveQueues, TransportSpec};
use crate::conn::SLOT_TAIL;
use crate::driver::{ConnTemplate, Driver, DriverError};
use crate::mem::MemRef;
use rpcrdma_verbs::{CqId, Mr, PdId, Provider};

pub use rpcrdma_proto::credits::{divide_share, SPARE_RECEIVES};

/// A poll thread's completion queue depth ([`PoolPlan::cq_depth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqDepth {
    /// Entries to create the queue with.
    pub depth: u32,
    /// Entries the worst case needs (every connection failing with a full send queue).
    pub worst: u32,
}

impl CqDepth {
    /// Whether the device's limit made the queue smaller than the worst case needs.
    pub fn clamped(&self) -> bool {
        self.depth < self.worst
    }
}

/// A poll thread's buffer plan: the per-connection template (credits capped to the share)
/// and where the send pool and the shared receive queue lie in one registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    /// Template every connection is created with (`credits`, `recv_slots` = its share).
    pub tmpl: ConnTemplate,
    /// Connection slots the shares are cut for.
    pub max_conns: u32,
    /// Buffers of the shared receive queue.
    pub recv_buffers: u32,
    /// Buffers of the shared send pool.
    pub send_buffers: u32,
    /// Shared pools, or a block per connection (then `recv_buffers` and `send_buffers` are
    /// the sums over the blocks).
    pub receive_queues: ReceiveQueues,
}

impl PoolPlan {
    /// The template each of `max_conns` connections gets from `recv_buffers` shared
    /// receives (credits capped to its share); the error says why none fits.
    pub fn template_for(
        t: &TransportSpec,
        recv_buffers: u32,
        max_conns: u32,
        max_call_size: u32,
    ) -> Result<ConnTemplate, String> {
        let max_conns = max_conns.max(1);
        let share = recv_buffers / max_conns;
        let (credits, bc) = divide_share(t.credits, t.backchannel_credits, share).ok_or_else(|| {
            format!(
                "{recv_buffers} receive buffers cannot give each of {max_conns} connections one credit{} and {SPARE_RECEIVES} spare",
                if t.backchannel_credits > 0 { ", one backchannel credit" } else { "" },
            )
        })?;
        Ok(ConnTemplate {
            version: t.version,
            credits,
            // Calls queued beyond the grant wait in the engine (they hold no buffer); more
            // wait in the poll thread. Per-call state is ~1 KiB, so this follows the capped
            // credits, not the configured ones.
            max_calls: credits.saturating_mul(2),
            send_size: t.inline_send,
            recv_size: t.inline_recv.max(t.recv_buffer_size),
            recv_slots: credits + bc,
            ddp_threshold: t.ddp_threshold,
            max_reads: u32::from(t.ord).max(1),
            max_call_size,
        })
    }

    /// The template of a connection with receives of its own: the configured credits and
    /// backchannel credits in full, plus [`SPARE_RECEIVES`].
    pub fn template_own(t: &TransportSpec, max_call_size: u32) -> ConnTemplate {
        let credits = t.credits.max(1);
        ConnTemplate {
            version: t.version,
            credits,
            max_calls: credits.saturating_mul(2),
            send_size: t.inline_send,
            recv_size: t.inline_recv.max(t.recv_buffer_size),
            recv_slots: credits
                .saturating_add(t.backchannel_credits)
                .saturating_add(SPARE_RECEIVES),
            ddp_threshold: t.ddp_threshold,
            max_reads: u32::from(t.ord).max(1),
            max_call_size,
        }
    }

    /// The plan for `max_conns` connections of transport `t` with pools `p`; the error says
    /// which setting cannot work. Shared pools: the send pool must hold
    /// `max_conns × tmpl.send_slots()`. Per connection: the blocks must fit 4 GiB.
    pub fn new(
        t: &TransportSpec,
        p: PoolSpec,
        max_conns: u32,
        max_call_size: u32,
    ) -> Result<PoolPlan, String> {
        let max_conns = max_conns.max(1);
        if p.receive_queues == ReceiveQueues::PerConnection {
            let tmpl = Self::template_own(t, max_call_size);
            let plan = PoolPlan {
                tmpl,
                max_conns,
                recv_buffers: tmpl.recv_slots.saturating_mul(max_conns),
                send_buffers: tmpl.send_slots().saturating_mul(max_conns),
                receive_queues: p.receive_queues,
            };
            if tmpl.block_len().is_none() || plan.registered_len() > u64::from(u32::MAX) {
                return Err(format!(
                    "{max_conns} connections with buffers of their own ({} receives, {} send buffers each) need more than 4 GiB",
                    tmpl.recv_slots,
                    tmpl.send_slots()
                ));
            }
            return Ok(plan);
        }
        let tmpl = Self::template_for(t, p.recv_buffers, max_conns, max_call_size)?;
        let credits = tmpl.credits;
        let plan = PoolPlan {
            tmpl,
            max_conns,
            recv_buffers: p.recv_buffers,
            send_buffers: p.send_buffers,
            receive_queues: p.receive_queues,
        };
        let need_send = u64::from(tmpl.send_slots()) * u64::from(max_conns);
        if u64::from(p.send_buffers) < need_send {
            return Err(format!(
                "{} send buffers are fewer than {max_conns} connections x {} (calls in flight plus answers, at {credits} credits)",
                p.send_buffers,
                tmpl.send_slots()
            ));
        }
        if plan.registered_len() > u64::from(u32::MAX) {
            return Err("buffer pools larger than 4 GiB".into());
        }
        Ok(plan)
    }

    /// Bytes of one send buffer (the largest Send plus the engine's tail).
    pub fn send_stride(&self) -> u32 {
        self.tmpl.send_size + SLOT_TAIL
    }

    /// Bytes of the shared send pool.
    pub fn send_len(&self) -> u64 {
        u64::from(self.send_buffers) * u64::from(self.send_stride())
    }

    /// Bytes of the shared receive queue's buffers.
    pub fn recv_len(&self) -> u64 {
        u64::from(self.recv_buffers) * u64::from(self.tmpl.recv_size)
    }

    /// Bytes to register: send pool, then receive buffers (page aligned); or the
    /// connections' blocks one after the other.
    pub fn registered_len(&self) -> u64 {
        match self.receive_queues {
            ReceiveQueues::Shared => self.recv_offset() + self.recv_len(),
            ReceiveQueues::PerConnection => {
                u64::from(self.tmpl.block_len().unwrap_or(u32::MAX)) * u64::from(self.max_conns)
            }
        }
    }

    fn recv_offset(&self) -> u64 {
        self.send_len().div_ceil(4096) * 4096
    }

    /// Receive buffers posted per connection slot at most (its grant and calls in
    /// progress); their sum over the slots never exceeds [`recv_buffers`](Self::recv_buffers).
    pub fn share(&self) -> u32 {
        self.tmpl.recv_slots
    }

    /// Completion queue entries for the thread on `provider`. Enough for the worst case:
    /// every connection failing with its send queue full (a failed queue pair flushes every
    /// request it holds, signalled or not, the provider's own binds and invalidations too)
    /// and every receive buffer completed (the shared queue's, or every connection's own).
    /// A device whose largest queue is smaller gets its largest ([`CqDepth::clamped`]), as
    /// long as that still holds what the engine keeps in flight without failures: every
    /// connection's own send queue and the receive buffers; if not, the plan does not fit
    /// the device (the message says so). A queue that overflows ends every connection on it.
    pub fn cq_depth<P: Provider>(&self, provider: &P) -> Result<CqDepth, String> {
        self.cq_depth_for(|n| provider.send_queue_entries(n), provider.max_cq_depth())
    }

    /// [`cq_depth`](Self::cq_depth) for a provider whose queue pair of `n` send requests holds
    /// `sq_entries(n)`, on a device allowing queues of `max` entries.
    fn cq_depth_for(&self, sq_entries: impl Fn(u32) -> u32, max: u32) -> Result<CqDepth, String> {
        let per_qp = self.tmpl.qp_init(PdId(0), CqId::default()).max_send_wr;
        let need = |sq: u32| {
            self.max_conns
                .saturating_mul(sq)
                .saturating_add(self.recv_buffers)
        };
        let (worst, least) = (need(sq_entries(per_qp)), need(per_qp));
        if least > max {
            return Err(format!(
                "a completion queue of {least} entries ({} connections × {per_qp} send \
                 requests + {} receive buffers) is deeper than the device allows ({max}): \
                 lower pools.connections or pools.recv-buffers, or spread the connections \
                 over more cores",
                self.max_conns, self.recv_buffers
            ));
        }
        Ok(CqDepth {
            depth: worst.min(max),
            worst,
        })
    }

    /// A driver over `provider` with this plan's shared pools carved from `region`
    /// (registered, at least [`registered_len`](Self::registered_len) bytes, with
    /// [`REGISTERED_ACCESS`](crate::REGISTERED_ACCESS)).
    pub fn driver<P: Provider>(
        &self,
        provider: P,
        cq: CqId,
        pd: PdId,
        region: Mr,
    ) -> Result<Driver<P>, DriverError> {
        let bad = || DriverError::Config(crate::ConfigError("buffer pools exceed their region"));
        if self.receive_queues == ReceiveQueues::PerConnection {
            let len = u32::try_from(self.registered_len()).map_err(|_| bad())?;
            let blocks = MemRef::new(region.id, 0, len);
            return Driver::new(provider, cq, region, blocks, self.tmpl);
        }
        let send_len = u32::try_from(self.send_len()).map_err(|_| bad())?;
        let recv_len = u32::try_from(self.recv_len()).map_err(|_| bad())?;
        let send = MemRef::new(region.id, 0, send_len);
        let recv = MemRef::new(region.id, self.recv_offset(), recv_len);
        Driver::new_shared(
            provider,
            cq,
            pd,
            region,
            send,
            true,
            recv,
            self.recv_buffers,
            self.tmpl,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(credits: u32, backchannel_credits: u32) -> TransportSpec {
        TransportSpec {
            version: 1,
            inline_send: 4096,
            inline_recv: 4096,
            credits,
            backchannel_credits,
            ddp_threshold: 1024,
            remote_invalidation: true,
            recv_buffer_size: 4096,
            ird: 16,
            ord: 16,
            v2_first_reply_timeout: crate::conn::V2_FIRST_REPLY_TIMEOUT,
            max_segments_per_chunk: 16,
            max_chunks_per_list: 4,
        }
    }

    /// A provider whose send queues hold three entries per request (ibv: window binds and
    /// invalidations): the worst case (every connection flushing a full send queue) while
    /// the device allows it, then the device's limit, then a refusal once even the work in
    /// flight would not fit.
    #[test]
    fn cq_depth_covers_flushes_within_the_device_limit() {
        let own = PoolSpec {
            recv_buffers: 1,
            send_buffers: 1,
            receive_queues: ReceiveQueues::PerConnection,
        };
        let plan = PoolPlan::new(&transport(32, 8), own, 10, 1 << 20).expect("plan");
        let sq = plan.tmpl.qp_init(PdId(0), CqId(0)).max_send_wr;
        let at = |max| plan.cq_depth_for(|n| 3 * n, max);
        let whole = CqDepth {
            depth: 30 * sq + 410,
            worst: 30 * sq + 410,
        };
        assert_eq!(at(u32::MAX), Ok(whole));
        assert_eq!(at(whole.worst), Ok(whole));
        let clamped = at(10 * sq + 410).expect("still holds the work in flight");
        assert_eq!((clamped.depth, clamped.clamped()), (10 * sq + 410, true));
        let e = at(10 * sq + 409).expect_err("too small for the work in flight");
        assert!(
            e.contains("deeper than the device allows (") && e.contains("pools.connections"),
            "{e}"
        );
    }

    /// Receive queues of their own: the configured credits in full whatever the shared sizes
    /// say, a block per connection, and a driver without a shared receive queue.
    #[test]
    fn buffers_of_their_own_hold_full_credits_in_a_block_per_connection() {
        use rpcrdma_verbs::mapped::{Mapped, Registered};
        use rpcrdma_verbs::soft::{link::MemFabric, SoftConfig, SoftProvider};

        let t = transport(32, 8);
        let own = PoolSpec {
            recv_buffers: 1,
            send_buffers: 1,
            receive_queues: ReceiveQueues::PerConnection,
        };
        let plan = PoolPlan::new(&t, own, 10, 1 << 20).expect("plan");
        assert_eq!(
            (plan.tmpl.credits, plan.share()),
            (32, 32 + 8 + SPARE_RECEIVES)
        );
        assert_eq!(plan.recv_buffers, 10 * 41);
        assert_eq!(plan.send_buffers, 10 * plan.tmpl.send_slots());
        let block = u64::from(plan.tmpl.block_len().expect("block"));
        assert_eq!(plan.registered_len(), 10 * block);
        let soft = SoftProvider::memory(&MemFabric::new(), SoftConfig::default());
        let sq = plan.tmpl.qp_init(PdId(0), CqId(0)).max_send_wr;
        let depth = plan.cq_depth(&soft).expect("depth");
        assert_eq!((depth.depth, depth.clamped()), (10 * sq + 410, false));
        // The same sizes shared: one receive for ten connections, refused.
        let shared = PoolSpec {
            receive_queues: ReceiveQueues::Shared,
            ..own
        };
        assert!(PoolPlan::new(&t, shared, 10, 1 << 20).is_err());
        // Blocks past 4 GiB: refused, with the reason.
        let e = PoolPlan::new(&t, own, 20_000, 1 << 20).expect_err("too large");
        assert!(e.contains("4 GiB"), "{e}");

        let mut p = SoftProvider::memory(&MemFabric::new(), SoftConfig::default());
        let pd = p.alloc_pd().expect("pd");
        let cq = p
            .create_cq(plan.cq_depth(&p).expect("cq depth").depth)
            .expect("cq");
        let len = usize::try_from(plan.registered_len()).expect("len");
        let reg = Registered::new(
            &mut p,
            pd,
            Mapped::anonymous(len).expect("map"),
            crate::REGISTERED_ACCESS,
        )
        .expect("register");
        let d = plan.driver(p, cq, pd, reg.mr()).expect("driver");
        assert_eq!(d.free_blocks(), 10);
        assert_eq!(d.qp_init(pd).srq, None);
        // `reg` goes out of scope still registered with the provider the driver owns, and
        // is leaked with its mapping (see `Registered`).
    }

    #[test]
    fn full_credits_when_the_share_holds_them() {
        assert_eq!(divide_share(32, 8, 41), Some((32, 8)));
        assert_eq!(divide_share(32, 0, 100), Some((32, 0)));
    }

    #[test]
    fn small_shares_scale_both_directions_and_keep_one_each() {
        // 12 buffers: 1 spare, 11 split 32:8 -> 2 backchannel, 9 forward.
        assert_eq!(divide_share(32, 8, 12), Some((9, 2)));
        assert_eq!(divide_share(32, 8, 3), Some((1, 1)));
        assert_eq!(divide_share(32, 0, 2), Some((1, 0)));
        assert_eq!(divide_share(32, 8, 2), None);
        assert_eq!(divide_share(32, 0, 1), None);
    }

    #[test]
    fn shares_never_exceed_the_queue() {
        for conns in [1u32, 7, 100, 1000] {
            for bufs in [conns * 2, conns * 3 + 5, 12288, 40000] {
                for (c, b) in [(32, 0), (32, 8), (1, 1), (64, 8)] {
                    if let Some((f, k)) = divide_share(c, b, bufs / conns) {
                        let per = f + k + SPARE_RECEIVES;
                        assert!(u64::from(per) * u64::from(conns) <= u64::from(bufs));
                        assert!(f >= 1 && f <= c && k <= b);
                    }
                }
            }
        }
    }
}
