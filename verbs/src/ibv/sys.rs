//! Owned wrappers over the raw rdma-core calls `sideway` does not wrap (queue pairs with SRQs,
//! memory windows, legacy posting and polling, rdma_cm with private data).
//!
//! Each wrapper owns one C object and destroys it on drop; the pointers never leave this
//! module except as arguments to other calls of it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::ptr;

use rdma_mummy_sys as ffi;

pub(super) use ffi::{
    ibv_context, ibv_pd, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status, rdma_cm_id,
};

use crate::{Access, ConnectFailure, Error, PrivateData, Result, SendOp, SendWr};

/// `IBV_WC_WITH_INV`: the completion's union holds the rkey the peer invalidated.
pub(super) const IBV_WC_WITH_INV: u32 = ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
/// The kernel's `IB_WC_WITH_INVALIDATE` bit, which rxe passes through unconverted.
pub(super) const IB_WC_WITH_INVALIDATE_KERNEL: u32 = 1 << 2;

fn os_err(ret: i32) -> io::Error {
    // Verbs calls return either -1 with errno or a positive errno.
    if ret > 0 {
        io::Error::from_raw_os_error(ret)
    } else {
        io::Error::last_os_error()
    }
}

fn post_err(ret: i32) -> Error {
    match ret {
        libc::ENOMEM => Error::QueueFull,
        libc::EINVAL => Error::InvalidArgument("rejected by the device"),
        r => Error::Io(os_err(r)),
    }
}

/// A zeroed work completion (all-integer C struct).
pub(super) const fn zero_wc() -> ibv_wc {
    ibv_wc {
        wr_id: 0,
        status: 0,
        opcode: 0,
        vendor_err: 0,
        byte_len: 0,
        imm_data_invalidated_rkey_union: ffi::imm_data_invalidated_rkey_union_t { imm_data: 0 },
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// A zeroed scatter/gather entry.
pub(super) const fn zero_sge() -> ibv_sge {
    ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }
}

/// The next key of a memory window: same index, the low 8 bits advanced (`ibv_inc_rkey`).
pub(super) fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

fn mw_access(a: Access) -> u32 {
    let mut f = 0;
    if a.contains(Access::REMOTE_READ) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    f
}

/// Sets `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor of the caller's; F_GETFL/F_SETFL only change flags.
    let ok = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A completion channel (nonblocking): a CQ created on it and armed ([`RawCq::arm`]) reports
/// its next completion as an event on the channel's descriptor.
pub(super) struct CompChannel(*mut ffi::ibv_comp_channel);

impl CompChannel {
    pub(super) fn new(ctx: *mut ibv_context) -> io::Result<CompChannel> {
        // SAFETY: `ctx` is a live device context owned by the provider; null means failure.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(io::Error::last_os_error());
        }
        let ch = CompChannel(ch);
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live.
        unsafe { (*self.0).fd }
    }

    /// Takes and acknowledges every pending event (so that the CQs can be destroyed and the
    /// descriptor quiets down).
    pub(super) fn drain(&self) {
        loop {
            let (mut cq, mut cq_ctx) = (ptr::null_mut(), ptr::null_mut());
            // SAFETY: the channel is live and nonblocking: with no event this returns -1 at
            // once (EAGAIN) instead of waiting.
            if unsafe { ffi::ibv_get_cq_event(self.0, &mut cq, &mut cq_ctx) } != 0 {
                return;
            }
            // SAFETY: `cq` is the live CQ the event was reported for (CQs outlive their
            // events: they are destroyed only after the channel was drained).
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the channel is live and every CQ created on it has been destroyed.
        unsafe { ffi::ibv_destroy_comp_channel(self.0) };
    }
}

/// What one asynchronous event of the device concerns (`ibv_get_async_event`), read and
/// acknowledged by [`next_async_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AsyncEvent {
    /// The device failed this queue pair (by number): `IBV_EVENT_QP_FATAL`, `QP_REQ_ERR`,
    /// `QP_ACCESS_ERR`.
    QpFailed(u32),
    /// The last receive of a queue pair on an SRQ was consumed after it failed.
    QpLastWqe(u32),
    /// A completion queue failed (an overrun): the CQ, to compare with the provider's.
    CqFailed(*mut ffi::ibv_cq),
    /// A shared receive queue failed.
    SrqFailed(*mut ffi::ibv_srq),
    /// A port went down / became active (the port number).
    PortDown(u32),
    PortUp(u32),
    /// The device failed.
    DeviceFatal,
    /// Anything else (connection established, path migration, address changes, ...).
    Other(u32),
}

/// `struct ibv_async_event` with the event type as a plain integer: a library newer than
/// the bindings may report a type they do not know, which must not become an invalid enum.
#[repr(C)]
struct RawAsyncEvent {
    element: RawAsyncElement,
    event_type: u32,
}

#[repr(C)]
union RawAsyncElement {
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    srq: *mut ffi::ibv_srq,
    port_num: libc::c_int,
}

/// Makes the device's asynchronous event descriptor nonblocking, so that
/// [`next_async_event`] never waits, and returns it (owned by the context).
pub(super) fn async_fd(ctx: *mut ibv_context) -> io::Result<RawFd> {
    // SAFETY: `ctx` is a live device context; `async_fd` is a plain field of it.
    let fd = unsafe { (*ctx).async_fd };
    set_nonblocking(fd)?;
    Ok(fd)
}

/// The device's next asynchronous event, acknowledged, if one is pending.
pub(super) fn next_async_event(ctx: *mut ibv_context) -> Option<AsyncEvent> {
    let mut ev = RawAsyncEvent {
        element: RawAsyncElement {
            cq: ptr::null_mut(),
        },
        event_type: u32::MAX,
    };
    let raw = (&mut ev as *mut RawAsyncEvent).cast::<ffi::ibv_async_event>();
    // SAFETY: `ctx` is live and its async descriptor nonblocking ([`async_fd`]): with no
    // event this returns -1 at once. `raw` points to a struct laid out as `ibv_async_event`
    // (a pointer-sized union, then a 32-bit type), which the call fills in.
    if unsafe { ffi::ibv_get_async_event(ctx, raw) } != 0 {
        return None;
    }
    use ffi::ibv_event_type as T;
    const QP_FATAL: u32 = T::IBV_EVENT_QP_FATAL as u32;
    const QP_REQ_ERR: u32 = T::IBV_EVENT_QP_REQ_ERR as u32;
    const QP_ACCESS_ERR: u32 = T::IBV_EVENT_QP_ACCESS_ERR as u32;
    const QP_LAST_WQE: u32 = T::IBV_EVENT_QP_LAST_WQE_REACHED as u32;
    const CQ_ERR: u32 = T::IBV_EVENT_CQ_ERR as u32;
    const SRQ_ERR: u32 = T::IBV_EVENT_SRQ_ERR as u32;
    const PORT_ERR: u32 = T::IBV_EVENT_PORT_ERR as u32;
    const PORT_ACTIVE: u32 = T::IBV_EVENT_PORT_ACTIVE as u32;
    const DEVICE_FATAL: u32 = T::IBV_EVENT_DEVICE_FATAL as u32;
    // SAFETY: each union read follows the event type, which says which member the library
    // wrote; the objects it names live at least until the event is acknowledged below
    // (destroying a queue pair, CQ or SRQ waits for its events' acknowledgement).
    let out = unsafe {
        match ev.event_type {
            QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR => AsyncEvent::QpFailed((*ev.element.qp).qp_num),
            QP_LAST_WQE => AsyncEvent::QpLastWqe((*ev.element.qp).qp_num),
            CQ_ERR => AsyncEvent::CqFailed(ev.element.cq),
            SRQ_ERR => AsyncEvent::SrqFailed(ev.element.srq),
            PORT_ERR => AsyncEvent::PortDown(ev.element.port_num as u32),
            PORT_ACTIVE => AsyncEvent::PortUp(ev.element.port_num as u32),
            DEVICE_FATAL => AsyncEvent::DeviceFatal,
            t => AsyncEvent::Other(t),
        }
    };
    // SAFETY: `raw` is the event just returned by `ibv_get_async_event`, acknowledged once.
    unsafe { ffi::ibv_ack_async_event(raw) };
    Some(out)
}

/// An epoll descriptor readable while any of its members is (level-triggered): what the
/// provider offers as its event fd, over the rdma_cm channel, the completion channel and the
/// device's asynchronous events.
pub(super) struct Wake(std::os::fd::OwnedFd);

impl Wake {
    pub(super) fn new(members: &[RawFd]) -> io::Result<Wake> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain constructor; a negative return is failure with errno.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` was just created and is owned by nothing else.
        let wake = Wake(unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) });
        for &fd in members {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            // SAFETY: `ep` and `fd` are open descriptors; `ev` is a valid event for the call.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(wake)
    }

    pub(super) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }
}

/// A completion queue.
pub(super) struct RawCq(*mut ffi::ibv_cq);

impl RawCq {
    /// A CQ of `depth` entries reporting on `channel` once armed.
    pub(super) fn new(ctx: *mut ibv_context, depth: u32, channel: &CompChannel) -> Result<RawCq> {
        let depth = i32::try_from(depth).map_err(|_| Error::InvalidArgument("CQ depth"))?;
        // SAFETY: `ctx` is a live device context and `channel` a live completion channel on
        // it, both owned by the provider, which destroys the CQ first.
        let cq = unsafe { ffi::ibv_create_cq(ctx, depth, ptr::null_mut(), channel.0, 0) };
        if cq.is_null() {
            return Err(Error::Io(io::Error::last_os_error()));
        }
        Ok(RawCq(cq))
    }

    pub(super) fn ptr(&self) -> *mut ffi::ibv_cq {
        self.0
    }

    /// The entries the CQ holds (the device may have made it deeper than asked).
    pub(super) fn capacity(&self) -> u32 {
        // SAFETY: the CQ is live; `cqe` is set by `ibv_create_cq` and read-only afterwards.
        let cqe = unsafe { (*self.0).cqe };
        u32::try_from(cqe).unwrap_or(0)
    }

    /// Asks for an event on the channel at the CQ's next completion.
    pub(super) fn arm(&self) -> bool {
        // SAFETY: the CQ is live.
        unsafe { ffi::ibv_req_notify_cq(self.0, 0) == 0 }
    }

    /// Up to `out.len()` completions; returns how many were written.
    pub(super) fn poll(&self, out: &mut [ibv_wc]) -> Result<usize> {
        let n = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: the CQ is live; `out` has room for `n` completions.
        let got = unsafe { ffi::ibv_poll_cq(self.0, n, out.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| Error::Io(io::Error::other("ibv_poll_cq failed")))
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: the CQ is live and no queue pair of the provider uses it any more.
        unsafe { ffi::ibv_destroy_cq(self.0) };
    }
}

/// A shared receive queue.
pub(super) struct RawSrq(*mut ffi::ibv_srq);

impl RawSrq {
    pub(super) fn new(pd: *mut ibv_pd, depth: u32, max_sge: u32) -> Result<RawSrq> {
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: depth,
                max_sge: max_sge.max(1),
                srq_limit: 0,
            },
        };
        // SAFETY: `pd` is live; `attr` is a valid init structure for the call.
        let srq = unsafe { ffi::ibv_create_srq(pd, &mut attr) };
        if srq.is_null() {
            return Err(Error::Io(io::Error::last_os_error()));
        }
        Ok(RawSrq(srq))
    }

    pub(super) fn ptr(&self) -> *mut ffi::ibv_srq {
        self.0
    }

    pub(super) fn post_recv(&self, wr_id: u64, sg: &[ibv_sge]) -> Result<()> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: sg.as_ptr().cast_mut(),
            num_sge: sg.len() as i32,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the SRQ is live; the request and its list live across the call, which
        // copies them (the device only keeps the addresses they name).
        let ret = unsafe { ffi::ibv_post_srq_recv(self.0, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(post_err(ret));
        }
        Ok(())
    }
}

impl Drop for RawSrq {
    fn drop(&mut self) {
        // SAFETY: the SRQ is live and its queue pairs are gone.
        unsafe { ffi::ibv_destroy_srq(self.0) };
    }
}

/// A type 2 memory window.
pub(super) struct RawMw(*mut ffi::ibv_mw);

impl RawMw {
    pub(super) fn alloc(pd: *mut ibv_pd) -> Result<RawMw> {
        // SAFETY: `pd` is live.
        let mw = unsafe { ffi::ibv_alloc_mw(pd, ffi::ibv_mw_type::IBV_MW_TYPE_2) };
        if mw.is_null() {
            return Err(Error::Io(io::Error::last_os_error()));
        }
        Ok(RawMw(mw))
    }

    /// The key the device gave the window at allocation.
    pub(super) fn rkey(&self) -> u32 {
        // SAFETY: the window is live.
        unsafe { (*self.0).rkey }
    }
}

impl Drop for RawMw {
    fn drop(&mut self) {
        // SAFETY: the window is live; deallocating also invalidates it.
        unsafe { ffi::ibv_dealloc_mw(self.0) };
    }
}

/// A reliable-connected queue pair.
pub(super) struct RawQp(*mut ffi::ibv_qp);

impl RawQp {
    pub(super) fn new(
        pd: *mut ibv_pd,
        send_cq: *mut ffi::ibv_cq,
        recv_cq: *mut ffi::ibv_cq,
        srq: *mut ffi::ibv_srq,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_sge: u32,
    ) -> Result<RawQp> {
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq,
            recv_cq,
            srq,
            cap: ffi::ibv_qp_cap {
                max_send_wr,
                max_recv_wr: if srq.is_null() { max_recv_wr } else { 0 },
                max_send_sge: max_sge,
                max_recv_sge: if srq.is_null() { max_sge } else { 0 },
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD, CQs and SRQ (or null) are live objects of one device context.
        let qp = unsafe { ffi::ibv_create_qp(pd, &mut attr) };
        if qp.is_null() {
            return Err(Error::Io(io::Error::last_os_error()));
        }
        Ok(RawQp(qp))
    }

    pub(super) fn num(&self) -> u32 {
        // SAFETY: the queue pair is live.
        unsafe { (*self.0).qp_num }
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32) -> io::Result<()> {
        // SAFETY: the queue pair is live; `attr` is a valid attribute structure.
        let ret = unsafe { ffi::ibv_modify_qp(self.0, attr, mask as i32) };
        if ret != 0 {
            return Err(os_err(ret));
        }
        Ok(())
    }

    /// RESET to INIT on `port`, remote read and write allowed (keys decide the rest).
    pub(super) fn to_init(&self, port: u8) -> Result<()> {
        let mut a = zero_qp_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let m = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT.0
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        self.modify(&mut a, m).map_err(Error::Io)
    }

    /// To the error state: outstanding work completes as flushed.
    pub(super) fn to_error(&self) {
        let mut a = zero_qp_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        let _ = self.modify(&mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0);
    }

    pub(super) fn post_recv(&self, wr_id: u64, sg: &[ibv_sge]) -> Result<()> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: sg.as_ptr().cast_mut(),
            num_sge: sg.len() as i32,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the queue pair is live; the request and its list live across the call.
        let ret = unsafe { ffi::ibv_post_recv(self.0, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(post_err(ret));
        }
        Ok(())
    }

    fn post(&self, wr: &mut ffi::ibv_send_wr) -> Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: the queue pair is live; `wr` and the list it points to live across the
        // call (the provider copies them into its queue).
        let ret = unsafe { ffi::ibv_post_send(self.0, wr, &mut bad) };
        if ret != 0 {
            return Err(post_err(ret));
        }
        Ok(())
    }

    pub(super) fn post_send(&self, w: &SendWr<'_>, sg: &[ibv_sge]) -> Result<()> {
        self.post(&mut send_wr(w, sg))
    }

    /// Bind `mw` (type 2) under `rkey` to `len` bytes at `addr` of `mr`, unsignaled.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bind_mw(
        &self,
        wr_id: u64,
        mw: &RawMw,
        rkey: u32,
        mr: *mut ffi::ibv_mr,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<()> {
        let mut wr = zero_send_wr();
        wr.wr_id = wr_id;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw: mw.0,
            rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: mw_access(access),
            },
        };
        self.post(&mut wr)?;
        // SAFETY: the window is live; its `rkey` field is the application's record of the
        // current key, which the device checks on the next bind (rdma-core's own
        // `ibv_bind_mw` updates it the same way).
        unsafe { (*mw.0).rkey = rkey };
        Ok(())
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: the queue pair is live; its rdma_cm id no longer refers to it.
        unsafe { ffi::ibv_destroy_qp(self.0) };
    }
}

fn zero_qp_attr() -> ffi::ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is a plain C struct of integers (and a GID union of bytes) for
    // which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// The verbs work request for `w` over the scatter list `sg` (which must outlive its post).
fn send_wr(w: &SendWr<'_>, sg: &[ibv_sge]) -> ffi::ibv_send_wr {
    use ffi::ibv_wr_opcode as O;
    let mut wr = zero_send_wr();
    wr.wr_id = w.wr_id;
    wr.sg_list = sg.as_ptr().cast_mut();
    wr.num_sge = sg.len() as i32;
    wr.send_flags = if w.signaled {
        ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
    } else {
        0
    };
    match w.op {
        SendOp::Send => wr.opcode = O::IBV_WR_SEND,
        SendOp::SendWithInvalidate { rkey } => {
            wr.opcode = O::IBV_WR_SEND_WITH_INV;
            wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            // rdma-core's siw provider (providers/siw/siw.c, push_send_wqe) hands kernel
            // siw the key of every send-queue entry from `wr.rdma.rkey`, never from
            // `invalidate_rkey`: without this the peer is asked to invalidate STag 0 and
            // answers with a Terminate (CANNOT_INVALIDATE), ending the connection. Other
            // providers read `invalidate_rkey` and ignore `wr.rdma` on a Send.
            wr.wr.rdma = ffi::rdma_t {
                remote_addr: 0,
                rkey,
            };
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            wr.opcode = O::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            wr.opcode = O::IBV_WR_RDMA_READ;
            wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
        }
        SendOp::LocalInvalidate { rkey } => {
            wr.opcode = O::IBV_WR_LOCAL_INV;
            wr.num_sge = 0;
            wr.sg_list = ptr::null_mut();
            wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
    }
    wr
}

fn zero_send_wr() -> ffi::ibv_send_wr {
    // SAFETY: `ibv_send_wr` is a plain C struct of integers, nullable pointers and unions of
    // those, for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Queue pair states rdma_cm computes attributes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QpTarget {
    Init,
    Rtr,
    Rts,
}

/// What the provider passes to `rdma_connect` / `rdma_accept`.
pub(super) struct ConnParam<'a> {
    pub private_data: &'a [u8],
    pub responder_resources: u16,
    pub initiator_depth: u16,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub qp_num: u32,
}

impl ConnParam<'_> {
    fn raw(&self) -> Result<ffi::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| Error::InvalidArgument("private data too long"))?;
        Ok(ffi::rdma_conn_param {
            private_data: self.private_data.as_ptr().cast(),
            private_data_len: len,
            responder_resources: self.responder_resources.min(255) as u8,
            initiator_depth: self.initiator_depth.min(255) as u8,
            flow_control: 1,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry.min(7),
            srq: 0,
            qp_num: self.qp_num,
        })
    }
}

/// An rdma_cm event channel (nonblocking).
pub(super) struct EventChannel(*mut ffi::rdma_event_channel);

impl EventChannel {
    pub(super) fn new() -> io::Result<EventChannel> {
        // SAFETY: plain constructor; null means failure with errno.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(io::Error::last_os_error());
        }
        let ch = EventChannel(ch);
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live.
        unsafe { (*self.0).fd }
    }

    pub(super) fn create_id(&self) -> Result<CmId> {
        let mut id = ptr::null_mut();
        // SAFETY: the channel is live; `id` receives the new identifier.
        let ret = unsafe {
            ffi::rdma_create_id(
                self.0,
                &mut id,
                ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 || id.is_null() {
            return Err(Error::Io(io::Error::last_os_error()));
        }
        Ok(CmId(id))
    }

    /// The next event, copied out and acknowledged; `None` when none is pending.
    pub(super) fn next_event(&self) -> Option<CmEventData> {
        let mut ev = ptr::null_mut();
        // SAFETY: the channel is live and nonblocking.
        let ret = unsafe { ffi::rdma_get_cm_event(self.0, &mut ev) };
        if ret != 0 || ev.is_null() {
            return None;
        }
        // SAFETY: `ev` is a live event until acknowledged below; its private data pointer
        // (when non-null) names `private_data_len` readable bytes.
        let data = unsafe {
            let e = &*ev;
            let conn = e.param.conn;
            let pd = if conn.private_data.is_null() {
                PrivateData::EMPTY
            } else {
                PrivateData::new(std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                ))
            };
            use ffi::rdma_cm_event_type as T;
            let kind = match e.event {
                T::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
                T::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
                T::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
                T::RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
                T::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
                T::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
                T::RDMA_CM_EVENT_DISCONNECTED | T::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    CmEventKind::Disconnected
                }
                T::RDMA_CM_EVENT_ADDR_ERROR | T::RDMA_CM_EVENT_ROUTE_ERROR => {
                    CmEventKind::Failed(ConnectFailure::NoRoute)
                }
                T::RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Failed(ConnectFailure::Unreachable),
                T::RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::Failed(ConnectFailure::Handshake),
                _ => CmEventKind::Other,
            };
            CmEventData {
                kind,
                status: e.status,
                id: e.id,
                listen_id: e.listen_id,
                new_id: (kind == CmEventKind::ConnectRequest).then(|| CmId(e.id)),
                private_data: pd,
                responder_resources: u16::from(conn.responder_resources),
                initiator_depth: u16::from(conn.initiator_depth),
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acknowledged exactly once.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        Some(data)
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id of the channel was destroyed before (the provider drops them first).
        unsafe { ffi::rdma_destroy_event_channel(self.0) };
    }
}

/// Connection-manager event kinds the provider acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmEventKind {
    AddrResolved,
    RouteResolved,
    ConnectRequest,
    ConnectResponse,
    Established,
    Rejected,
    /// Address, route or connection errors, and an unreachable peer.
    Failed(ConnectFailure),
    Disconnected,
    Other,
}

/// A copied, acknowledged rdma_cm event.
pub(super) struct CmEventData {
    pub kind: CmEventKind,
    pub status: i32,
    /// The event's id (compare only; for connect requests `new_id` owns it).
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    new_id: Option<CmId>,
    pub private_data: PrivateData,
    pub responder_resources: u16,
    pub initiator_depth: u16,
}

impl CmEventData {
    /// The new identifier of a connect request, now owned by the caller.
    pub(super) fn take_new_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }

    /// Refuse a connect request nobody listens for any more.
    pub(super) fn reject_and_destroy(mut self) {
        if let Some(id) = self.new_id.take() {
            let _ = id.reject(&[]);
        }
    }
}

/// An rdma_cm identifier (destroyed on drop).
pub(super) struct CmId(*mut rdma_cm_id);

/// A connect request's id on its way from one poll thread's provider to another's
/// ([`crate::Provider::hand_over`]); the receiver moves it to its own event channel.
pub(super) struct MovingId(pub(super) CmId);

// SAFETY: librdmacm lets an id be used from any thread as long as calls on it are not
// concurrent; a `MovingId` is the id's only owner while it travels, and the provider that
// takes it migrates it to its own channel before using it. Its events were all acknowledged
// when read, so nothing of it is left on the sending thread's channel.
unsafe impl Send for MovingId {}

/// The IPv4 or IPv6 address in `ss`, as its family says.
fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    let at = ptr::addr_of!(*ss);
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says `ss` holds a sockaddr_in; sockaddr_storage is larger
            // than and aligned for it.
            let sin = unsafe { at.cast::<libc::sockaddr_in>().read() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { at.cast::<libc::sockaddr_in6>().read() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    ss
}

fn cm_ret(ret: i32) -> io::Result<()> {
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl CmId {
    pub(super) fn raw(&self) -> *mut rdma_cm_id {
        self.0
    }

    pub(super) fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut ss = sockaddr(addr);
        // SAFETY: the id is live; `ss` holds a valid socket address of its family.
        cm_ret(unsafe { ffi::rdma_bind_addr(self.0, ptr::addr_of_mut!(ss).cast()) })
            .map_err(Error::Io)
    }

    pub(super) fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is live and bound.
        cm_ret(unsafe { ffi::rdma_listen(self.0, backlog) }).map_err(Error::Io)
    }

    /// The other end's address (`rdma_get_peer_addr`): on a connect request's new id, the
    /// connecting side's. `None` for a family other than IPv4 or IPv6 (an InfiniBand
    /// `AF_IB` address, say).
    pub(super) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; `route.addr`'s destination union is a sockaddr_storage
        // long, and a plain-old-data copy of it is valid whatever rdma_cm wrote there.
        let ss = unsafe {
            ptr::addr_of!((*self.0).route.addr.dst_addr_union.dst_storage).read_unaligned()
        };
        from_sockaddr(&ss)
    }

    /// The bound source port (`rdma_get_src_port`, which the run-time shim lacks: the port
    /// sits at the same offset of `route.addr.src_addr` for IPv4 and IPv6).
    pub(super) fn src_port(&self) -> u16 {
        // SAFETY: the id is live; `route.addr` starts with the source socket address union,
        // at least a sockaddr_in6 long, whose first four bytes are family and port.
        let sin = unsafe {
            ptr::addr_of!((*self.0).route.addr)
                .cast::<libc::sockaddr_in>()
                .read_unaligned()
        };
        u16::from_be(sin.sin_port)
    }

    pub(super) fn resolve_addr(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<()> {
        let mut d = sockaddr(dst);
        let mut s = src.map(|ip| sockaddr(SocketAddr::new(ip, 0)));
        let sp = match &mut s {
            Some(s) => ptr::addr_of_mut!(*s).cast(),
            None => ptr::null_mut(),
        };
        // SAFETY: the id is live; the addresses are valid for the call.
        cm_ret(unsafe {
            ffi::rdma_resolve_addr(self.0, sp, ptr::addr_of_mut!(d).cast(), timeout_ms)
        })
        .map_err(Error::Io)
    }

    pub(super) fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: the id is live with a resolved address.
        cm_ret(unsafe { ffi::rdma_resolve_route(self.0, timeout_ms) })
    }

    /// The name of the device rdma_cm bound the id to, if any.
    pub(super) fn device_name(&self) -> Option<String> {
        // SAFETY: the id is live; `verbs` is null or a context librdmacm keeps open, whose
        // device name is a NUL-terminated string.
        unsafe {
            let v = (*self.0).verbs;
            if v.is_null() {
                return None;
            }
            let n = ffi::ibv_get_device_name((*v).device);
            if n.is_null() {
                return None;
            }
            Some(std::ffi::CStr::from_ptr(n).to_string_lossy().into_owned())
        }
    }

    /// Move `qp` to `target` with the attributes rdma_cm computed for this connection.
    pub(super) fn modify_qp(&self, qp: &RawQp, target: QpTarget) -> io::Result<()> {
        let mut a = zero_qp_attr();
        a.qp_state = match target {
            QpTarget::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
            QpTarget::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
            QpTarget::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
        };
        let mut mask = 0i32;
        // SAFETY: the id is live; `a` and `mask` receive the attributes.
        cm_ret(unsafe { ffi::rdma_init_qp_attr(self.0, &mut a, &mut mask) })?;
        let mut mask = mask as u32;
        if target == QpTarget::Init {
            // On the active side the INIT attributes are computed before the CM connection
            // exists, and rdma_cm then grants no remote access at all (librdmacm repeats INIT
            // after the reply; we connect with our own queue pair). Peers must reach exposed
            // memory: rkeys decide the rest. Seen on rxe (responder ERR_UNSUPPORTED_OPCODE on
            // the NFS server's first RDMA Write) and siw.
            a.qp_access_flags |= ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            mask |= ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        }
        qp.modify(&mut a, mask)
    }

    pub(super) fn connect(&self, p: &ConnParam<'_>) -> io::Result<()> {
        let mut raw = p
            .raw()
            .map_err(|_| io::Error::other("private data too long"))?;
        // SAFETY: the id is live with a resolved route; `raw` and its private data live
        // across the call, which copies them.
        cm_ret(unsafe { ffi::rdma_connect(self.0, &mut raw) })
    }

    pub(super) fn accept(&self, p: &ConnParam<'_>) -> io::Result<()> {
        let mut raw = p
            .raw()
            .map_err(|_| io::Error::other("private data too long"))?;
        // SAFETY: the id is a live connect request; `raw` lives across the call.
        cm_ret(unsafe { ffi::rdma_accept(self.0, &mut raw) })
    }

    pub(super) fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| Error::InvalidArgument("private data too long"))?;
        // SAFETY: the id is a live connect request; the data lives across the call.
        cm_ret(unsafe { ffi::rdma_reject(self.0, private_data.as_ptr().cast(), len) })
            .map_err(Error::Io)
    }

    /// Moves the id to `channel`: its later events are read there.
    pub(super) fn migrate(&self, channel: &EventChannel) -> io::Result<()> {
        // SAFETY: the id and the channel are live; the id has no unacknowledged event (each is
        // acknowledged as it is read), so rdma_migrate_id does not wait.
        cm_ret(unsafe { ffi::rdma_migrate_id(self.0, channel.0) })
    }

    pub(super) fn establish(&self) -> io::Result<()> {
        // SAFETY: the id is live and got a connect response.
        cm_ret(unsafe { ffi::rdma_establish(self.0) })
    }

    /// Start or answer a disconnect; errors (already disconnected) are of no consequence.
    pub(super) fn disconnect(&self) {
        // SAFETY: the id is live.
        unsafe { ffi::rdma_disconnect(self.0) };
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is live and all its events were acknowledged when read.
        unsafe { ffi::rdma_destroy_id(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_keeps_the_window_index_and_changes_the_key() {
        assert_eq!(inc_rkey(0x0000_1234), 0x0000_1235);
        assert_eq!(
            inc_rkey(0x00ab_cdff),
            0x00ab_cd00,
            "key byte wraps, index stays"
        );
        let mut k = 0x0012_3400;
        for _ in 0..255 {
            let n = inc_rkey(k);
            assert_ne!(n, k);
            assert_eq!(n >> 8, 0x1234);
            k = n;
        }
    }

    #[test]
    fn send_with_invalidate_names_its_key_where_every_provider_looks() {
        let w = SendWr {
            wr_id: 7,
            op: SendOp::SendWithInvalidate { rkey: 0x1234_5678 },
            sg: &[],
            signaled: true,
        };
        let wr = send_wr(&w, &[]);
        assert_eq!(wr.opcode, ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_INV);
        // SAFETY: `send_wr` wrote the key into this member of the union.
        let inv = unsafe { wr.imm_data_invalidated_rkey_union.invalidated_rkey };
        assert_eq!(inv, 0x1234_5678);
        // SAFETY: `send_wr` wrote the `rdma` member of this union.
        let rdma = unsafe { wr.wr.rdma };
        assert_eq!(
            rdma.rkey, 0x1234_5678,
            "where rdma-core's siw provider reads it"
        );
        let w = SendWr {
            op: SendOp::Send,
            ..w
        };
        // SAFETY: as above; a plain Send leaves the union zeroed.
        assert_eq!(unsafe { send_wr(&w, &[]).wr.rdma.rkey }, 0);
    }

    #[test]
    fn socket_addresses_in_network_order() {
        let ss = sockaddr("10.99.0.1:20049".parse().unwrap());
        // SAFETY: `sockaddr` wrote a sockaddr_in for an IPv4 address.
        let sin = unsafe { ptr::addr_of!(ss).cast::<libc::sockaddr_in>().read() };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 20049);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 99, 0, 1]);
        let ss = sockaddr("[fe80::1%3]:7".parse().unwrap());
        // SAFETY: `sockaddr` wrote a sockaddr_in6 for an IPv6 address.
        let sin6 = unsafe { ptr::addr_of!(ss).cast::<libc::sockaddr_in6>().read() };
        assert_eq!(sin6.sin6_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(u16::from_be(sin6.sin6_port), 7);
        assert_eq!(sin6.sin6_scope_id, 3);
        assert_eq!(sin6.sin6_addr.s6_addr[0], 0xfe);
    }

    #[test]
    fn peer_addresses_read_back_as_written() {
        for a in ["10.99.0.1:20049", "[fe80::1%3]:7", "[2001:db8::5]:20049"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&sockaddr(a)), Some(a));
        }
        let mut ss = sockaddr("10.99.0.1:1".parse().unwrap());
        ss.ss_family = 27; // AF_IB
        assert_eq!(from_sockaddr(&ss), None);
    }
}
