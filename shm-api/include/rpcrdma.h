/*
 * rpcrdma.h - header-only C binding of the rpcrdmad shared-memory ABI (version 1).
 *
 * The layout and rules are in shm-api/ABI.md; this file mirrors the Rust types in src/abi.rs and the ring
 * protocol in src/ring.rs. Needs C11 and the GCC/Clang __atomic builtins; Linux only (memfd, SCM_RIGHTS).
 *
 * Typical use:
 *   struct rr_app app; rr_connect("/run/rpcrdmad.sock", &app);
 *   int peer = rr_peer_index(&app, "nfs-server");
 *   ... write XDR into rr_arena_ptr(&app, off) ..., fill a struct rr_sqe, rr_submit(&app, &sqe);
 *   struct rr_cqe c; rr_wait(&app, &c, -1);
 * or, in the app's own poll/epoll loop: if (rr_arm(&app) == 1) { poll on rr_fd(&app) ...;
 *   rr_disarm(&app); } while (rr_poll(&app, &c) == 1) ...   (examples/c/event_loop.c)
 */
#ifndef RPCRDMA_H
#define RPCRDMA_H

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define RR_MAGIC 0x314d485352435052ULL /* "RPCRSHM1" little-endian */
#define RR_ABI_VERSION 1u
#define RR_MAX_PIECES 8u

/* Submission opcodes (struct rr_sqe.opcode); completions carry the same value in rr_cqe.kind. */
#define RR_OP_CALL 1u
#define RR_OP_REPLY 2u
#define RR_OP_REGISTER 3u
#define RR_OP_UNREGISTER 4u
#define RR_OP_POST_RECV 5u
#define RR_OP_DETACH 6u /* closing: the daemon frees the app's slot at once (no completion) */
#define RR_OP_CANCEL 7u /* cancel the call whose CALL had this user_data (no completion of its own) */
#define RR_OP_RELEASED 8u /* completion only: the memory of a call completed RR_CQE_LENT is the app's again */

/* Completion flags (rr_cqe.flags). */
#define RR_CQE_LENT 1u /* CALL ended RR_CANCELLED/RR_TIMEOUT while the peer may still reach its
                          buffers (chunks): reuse none of them before its RR_OP_RELEASED */

/* Submission flags. */
#define RR_FLAG_XID_APP 1u
#define RR_FLAG_BACKCHANNEL 2u
#define RR_FLAG_AUTH_SYS 4u /* CALL: an AUTH_SYS credential naming auth_uid/auth_gid (else AUTH_NONE);
                               an app not running as root may name only its own (RR_AUTH_DENIED) */

/* Completion status codes (rr_cqe.status). */
#define RR_OK 0u
#define RR_BAD_OPCODE 1u
#define RR_BAD_FLAGS 2u
#define RR_BAD_RANGE 3u
#define RR_BAD_PIECES 4u
#define RR_UNKNOWN_PEER 5u
#define RR_UNKNOWN_PROGRAM 6u
#define RR_BAD_HANDLE 7u
#define RR_TOO_MANY 8u
#define RR_ALREADY_REGISTERED 9u
#define RR_NOT_REGISTERED 10u
#define RR_REPLY_TOO_LARGE 11u
#define RR_NO_RECV_BUFFER 12u
#define RR_CANCELLED 13u
#define RR_TRANSPORT 14u
#define RR_TIMEOUT 15u
#define RR_CHUNK_REFUSED 16u
#define RR_BAD_REPLY 17u
#define RR_AUTH_DENIED 18u

#define RR_STATE_ATTACHED 1u
#define RR_STATE_DETACHED 2u

struct rr_header {
    uint64_t magic;
    uint32_t abi_version;
    uint32_t header_size;
    uint64_t region_size;
    uint32_t sq_offset, sq_entries;
    uint32_t cq_offset, cq_entries;
    uint32_t arena_offset, arena_size;
    uint32_t peers_offset, peers_count;
    uint32_t app_id, max_outstanding;
    uint32_t app_waiting; /* offset 64: app sets before sleeping on its socket */
    uint8_t pad1[60];
    uint32_t daemon_waiting; /* offset 128: daemon sets while parked */
    uint8_t pad2[60];
    uint32_t state; /* offset 192: RR_STATE_* */
    uint8_t pad3[60];
};

struct rr_sqe {
    uint8_t opcode, flags, n_args, n_results;
    uint32_t target; /* CALL: peer index; REPLY: handle from the incoming call's completion */
    uint64_t user_data;
    uint32_t prog, vers, proc_; /* REPLY: proc_ = accept_stat */
    uint32_t xid;
    uint32_t msg_off, msg_len;
    uint32_t pieces_off;
    uint32_t reply_off, reply_len;
    uint32_t timeout_ms; /* CALL: end it with RR_TIMEOUT after this many ms without a reply; 0 = never */
    uint32_t auth_uid, auth_gid; /* CALL with RR_FLAG_AUTH_SYS: the credential's uid and gid; else 0 */
};

struct rr_cqe {
    uint8_t kind, flags, n_results, reserved0;
    uint32_t status;
    uint64_t user_data;
    uint32_t prog, vers, proc_, xid;
    uint32_t msg_off, msg_len;
    uint32_t handle, peer;
    uint32_t rpc_stat;
    uint32_t auth_flavor; /* POST_RECV: 1 (AUTH_SYS: the caller's auth_uid, auth_gid) or 0 (AUTH_NONE) */
    uint32_t auth_uid, auth_gid;
};

struct rr_piece {
    uint32_t off, len, xdr_pos, used;
};

struct rr_peer {
    char name[60];
    /* The largest reduced reply the daemon receives inline from this peer for a call with no
       result buffer (RR_WRITE_CHUNK_ROOM less per result buffer); 0 if the daemon does not say. */
    uint32_t reply_inline;
};

/* What each result buffer of a call takes from a peer's reply_inline. */
#define RR_WRITE_CHUNK_ROOM 24u

_Static_assert(sizeof(struct rr_header) == 256, "header is 256 bytes");
_Static_assert(sizeof(struct rr_sqe) == 64, "sqe is 64 bytes");
_Static_assert(sizeof(struct rr_cqe) == 64, "cqe is 64 bytes");
_Static_assert(sizeof(struct rr_piece) == 16, "piece is 16 bytes");
_Static_assert(sizeof(struct rr_peer) == 64, "peer entry is 64 bytes");

/* One attachment. Fields are private to this header's functions except base/len/arena/arena_size. */
struct rr_app {
    uint8_t *base;
    size_t len;
    struct rr_header *hdr;
    uint32_t *sq_tail, *sq_head, *cq_tail, *cq_head;
    struct rr_sqe *sqes;
    struct rr_cqe *cqes;
    uint8_t *arena;
    uint32_t arena_size, arena_bump;
    uint32_t sq_mask, cq_mask, sq_local, cq_local;
    int sock; /* the attach socket: closing it detaches; one-byte messages are wake-ups */
    uint32_t wait_spin_us; /* rr_set_wait */
    int wait_yield;
};

/* Connects to the daemon socket at path and maps the region it sends. Returns 0 or -errno. */
static inline int rr_connect(const char *path, struct rr_app *app)
{
    struct sockaddr_un sa;
    uint8_t msg[16];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {msg, sizeof msg};
    struct msghdr mh;
    struct cmsghdr *c;
    struct stat st;
    int memfd = -1, err = -EPROTO;
    uint64_t magic = 0;

    memset(app, 0, sizeof *app);
    app->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (app->sock < 0)
        return -errno;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        close(app->sock);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, path);
    if (connect(app->sock, (struct sockaddr *)&sa, sizeof sa) < 0) {
        err = -errno;
        close(app->sock);
        return err;
    }
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    if (recvmsg(app->sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL) != (ssize_t)sizeof msg)
        goto fail;
    for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&memfd, CMSG_DATA(c), sizeof memfd);
    memcpy(&magic, msg, 8); /* little-endian hosts only, like the daemon */
    if (magic != RR_MAGIC || memfd < 0 || fstat(memfd, &st) < 0 || st.st_size < 256)
        goto fail;
    app->len = (size_t)st.st_size;
    app->base = mmap(NULL, app->len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    close(memfd);
    memfd = -1;
    if (app->base == MAP_FAILED) {
        app->base = NULL;
        goto fail;
    }
    app->hdr = (struct rr_header *)app->base;
    if (app->hdr->magic != RR_MAGIC || app->hdr->abi_version != RR_ABI_VERSION ||
        app->hdr->region_size != app->len ||
        (uint64_t)app->hdr->arena_offset + app->hdr->arena_size > app->len)
        goto fail;
    app->sq_tail = (uint32_t *)(app->base + app->hdr->sq_offset);
    app->sq_head = (uint32_t *)(app->base + app->hdr->sq_offset + 64);
    app->sqes = (struct rr_sqe *)(app->base + app->hdr->sq_offset + 128);
    app->cq_tail = (uint32_t *)(app->base + app->hdr->cq_offset);
    app->cq_head = (uint32_t *)(app->base + app->hdr->cq_offset + 64);
    app->cqes = (struct rr_cqe *)(app->base + app->hdr->cq_offset + 128);
    app->sq_mask = app->hdr->sq_entries - 1;
    app->cq_mask = app->hdr->cq_entries - 1;
    app->arena = app->base + app->hdr->arena_offset;
    app->arena_size = app->hdr->arena_size;
    return 0;
fail:
    if (memfd >= 0)
        close(memfd);
    if (app->base)
        munmap(app->base, app->len);
    close(app->sock);
    memset(app, 0, sizeof *app);
    return err;
}

static inline int rr_submit(struct rr_app *app, const struct rr_sqe *s);

/* Detaches: says so on the ring (RR_OP_DETACH, so the daemon frees the app's slot on its next
   poll), then unmaps and closes everything (a closed socket detaches the app anyway). */
static inline void rr_close(struct rr_app *app)
{
    if (app->base) {
        struct rr_sqe bye;
        memset(&bye, 0, sizeof bye);
        bye.opcode = RR_OP_DETACH;
        (void)rr_submit(app, &bye);
        munmap(app->base, app->len);
    }
    close(app->sock);
    memset(app, 0, sizeof *app);
}

/* The index of the peer called name, or -1. */
static inline int rr_peer_index(const struct rr_app *app, const char *name)
{
    const struct rr_peer *p = (const struct rr_peer *)(app->base + app->hdr->peers_offset);
    for (uint32_t i = 0; i < app->hdr->peers_count; i++)
        if (strncmp(p[i].name, name, sizeof p[i].name) == 0)
            return (int)i;
    return -1;
}

/* The largest reply buffer a call to peer with n_results result buffers can offer without the
   daemon adding a Reply chunk, or 0 if the daemon does not say (size it to your procedure). */
static inline uint32_t rr_reply_inline(const struct rr_app *app, uint32_t peer, uint32_t n_results)
{
    const struct rr_peer *p = (const struct rr_peer *)(app->base + app->hdr->peers_offset);
    if (peer >= app->hdr->peers_count || n_results > p[peer].reply_inline / RR_WRITE_CHUNK_ROOM)
        return 0;
    return p[peer].reply_inline - n_results * RR_WRITE_CHUNK_ROOM;
}

/* Address of arena offset off (no check: use offsets your allocator returned). */
static inline void *rr_arena_ptr(struct rr_app *app, uint32_t off)
{
    return app->arena + off;
}

/* A trivial 64-byte-aligned bump allocator over the arena; returns an offset or -1. rr_arena_reset frees all. */
static inline int64_t rr_arena_alloc(struct rr_app *app, uint32_t len)
{
    uint64_t off = ((uint64_t)app->arena_bump + 63) & ~(uint64_t)63;
    if (off + len > app->arena_size)
        return -1;
    app->arena_bump = (uint32_t)(off + len);
    return (int64_t)off;
}

static inline void rr_arena_reset(struct rr_app *app)
{
    app->arena_bump = 0;
}

/* Piece record i of the table at arena offset table. */
static inline struct rr_piece *rr_piece_at(struct rr_app *app, uint32_t table, uint32_t i)
{
    return (struct rr_piece *)(app->arena + table) + i;
}

static inline int rr_detached(struct rr_app *app)
{
    return __atomic_load_n(&app->hdr->state, __ATOMIC_ACQUIRE) == RR_STATE_DETACHED;
}

/* Puts one descriptor on the submission ring. 0, -EAGAIN (ring full) or -EPIPE (detached). */
static inline int rr_submit(struct rr_app *app, const struct rr_sqe *s)
{
    if (rr_detached(app))
        return -EPIPE;
    /* Acquire pairs with the daemon's Release store of the SQ head after it copied the slot out. */
    uint32_t head = __atomic_load_n(app->sq_head, __ATOMIC_ACQUIRE);
    if (app->sq_local - head > app->sq_mask)
        return -EAGAIN;
    app->sqes[app->sq_local & app->sq_mask] = *s;
    app->sq_local++;
    /* Release pairs with the daemon's Acquire load of the SQ tail: the slot is written before it is seen. */
    __atomic_store_n(app->sq_tail, app->sq_local, __ATOMIC_RELEASE);
    /* SeqCst fence, then load daemon_waiting: pairs with the daemon's store-flag/fence/re-read-tail in park. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&app->hdr->daemon_waiting, __ATOMIC_RELAXED)) {
        uint8_t one = 1; /* a full socket buffer already means "wake up" */
        if (send(app->sock, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        }
    }
    return 0;
}

/* Asks the daemon to cancel the call submitted with user_data (no completion of its own). The call
   still completes once: RR_CANCELLED, or its reply if that came first. If that completion has
   RR_CQE_LENT in its flags, the peer may still write the call's buffers: keep them until a
   completion of kind RR_OP_RELEASED with the same user_data. 0, or rr_submit's -EAGAIN (ring
   full) / -EPIPE. */
static inline int rr_cancel(struct rr_app *app, uint64_t user_data)
{
    struct rr_sqe c;
    memset(&c, 0, sizeof c);
    c.opcode = RR_OP_CANCEL;
    c.user_data = user_data;
    return rr_submit(app, &c);
}

/* Takes one completion if there is one: 1 (copied to *out) or 0. */
static inline int rr_poll(struct rr_app *app, struct rr_cqe *out)
{
    /* Acquire pairs with the daemon's Release store of the CQ tail after writing the slot. */
    uint32_t tail = __atomic_load_n(app->cq_tail, __ATOMIC_ACQUIRE);
    if (tail == app->cq_local)
        return 0;
    *out = app->cqes[app->cq_local & app->cq_mask];
    app->cq_local++;
    /* Release: the slot is read before the daemon may reuse it. */
    __atomic_store_n(app->cq_head, app->cq_local, __ATOMIC_RELEASE);
    return 1;
}

/* Event loops (ABI.md section 5): to sleep in your own poll/epoll on rr_fd instead of rr_wait,
   call rr_arm first. 1: nothing is waiting, sleep until rr_fd is readable (the daemon writes a
   byte with its next completion, or closes the socket when it goes away), then rr_disarm and
   rr_poll; 0: a completion is waiting already (the ask is taken back: rr_poll now); -EPIPE:
   detached.
   Sleeping without rr_arm may never wake; a wake-up without a completion is possible. */
static inline int rr_fd(const struct rr_app *app)
{
    return app->sock;
}

/* Takes back rr_arm's ask and discards the wake-up bytes: 0, or -EPIPE if the daemon closed the
   socket (it went away: the app is detached). */
static inline int rr_disarm(struct rr_app *app)
{
    __atomic_store_n(&app->hdr->app_waiting, 0, __ATOMIC_RELAXED);
    uint8_t buf[64];
    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(app->sock, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0)
            return -EPIPE;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -EPIPE;
    }
    return 0;
}

static inline int rr_arm(struct rr_app *app)
{
    if (rr_detached(app))
        return -EPIPE;
    __atomic_store_n(&app->hdr->app_waiting, 1, __ATOMIC_RELAXED);
    /* SeqCst fence between the flag store and the CQ tail load; pairs with the daemon's wake-up check. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(app->cq_tail, __ATOMIC_ACQUIRE) == app->cq_local)
        return 1;
    return rr_disarm(app) < 0 ? -EPIPE : 0;
}

/* How rr_wait looks before it sleeps (the Rust Client's WaitPolicy): for spin_us microseconds (0, the
   default: 2000 polls), and with yield_cpu between polls it hands the CPU to other runnable threads
   (sched_yield), which helps when busy threads outnumber cores (see bench/README.md, "yield"). */
static inline void rr_set_wait(struct rr_app *app, uint32_t spin_us, int yield_cpu)
{
    app->wait_spin_us = spin_us;
    app->wait_yield = yield_cpu != 0;
}

/* Microseconds of C11's clock (strict -std=c11 has no CLOCK_MONOTONIC; a wall-clock step only
   stretches or cuts one spin window, and the caller's timeout is kept by the sleep below). */
static inline uint64_t rr_now_us(void)
{
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* Waits for one completion (look per rr_set_wait, then sleep on the socket): 1, 0 on timeout
   (timeout_ms < 0: forever), -EPIPE if detached. */
static inline int rr_wait(struct rr_app *app, struct rr_cqe *out, int timeout_ms)
{
    if (app->wait_spin_us == 0) {
        for (int i = 0; i < 2000; i++) {
            if (rr_poll(app, out))
                return 1;
            if (app->wait_yield)
                sched_yield();
        }
    } else {
        /* The window never outlasts the caller's timeout. */
        uint64_t window = app->wait_spin_us;
        if (timeout_ms >= 0 && (uint64_t)timeout_ms * 1000u < window)
            window = (uint64_t)timeout_ms * 1000u;
        uint64_t end = rr_now_us() + window;
        do {
            if (rr_poll(app, out))
                return 1;
            if (app->wait_yield)
                sched_yield();
        } while (rr_now_us() < end && !rr_detached(app));
    }
    for (;;) {
        int armed = rr_arm(app);
        if (armed < 0)
            return -EPIPE;
        if (armed == 0)
            return rr_poll(app, out);
        struct pollfd p = {app->sock, POLLIN, 0};
        int t = timeout_ms < 0 || timeout_ms > 100 ? 100 : timeout_ms;
        int n = poll(&p, 1, t);
        if (rr_disarm(app) < 0)
            return -EPIPE; /* the daemon closed the socket */
        if (timeout_ms >= 0) {
            timeout_ms -= t;
            if (timeout_ms <= 0 && n == 0)
                return rr_poll(app, out);
        }
    }
}

#endif /* RPCRDMA_H */
