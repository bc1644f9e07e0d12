/*
 * A C ONC RPC server of RDMATEST behind rpcrdmad's shared-memory rings (header-only binding).
 * Build: cc -std=c11 -I shm-api/include shm-api/examples/c/server.c -o rdmatest-server
 * Run:   ./rdmatest-server /path/to/app.sock   (prints "ready" once it serves; runs until the
 *        daemon detaches it, then prints how many calls it answered)
 *
 * What it shows (ABI.md sections 3 and 4):
 * - REGISTER the program, then lend the daemon receive buffers (POST_RECV). Each call arrives as
 *   the completion of one of them, its full argument XDR in the buffer (Read chunks already
 *   pulled into place), with a handle for the REPLY.
 * - A REPLY carries the reduced result stream and, for a DDP-eligible result (ECHO's and READ's
 *   opaque data), a piece: the length word stays in the stream, the bytes are a piece record
 *   whose xdr_pos says where they belong. The daemon moves a piece into the caller's Write chunk,
 *   or puts it back inline when the caller offered none.
 * - The arguments come from a remote peer: every length is checked against what arrived.
 * - Buffer ownership: a reply's memory is the daemon's until the REPLY completes. Slot i pairs
 *   receive buffer i with reply area i, and buffer i is lent again only when its reply has
 *   completed, so a new call in it can never find its reply area still in use.
 */
#include "rpcrdma.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>

#define RDMATEST 0x20524454u
#define NULLPROC 0u
#define ECHO 1u
#define READ 2u
#define WRITE 3u
#define SLEEP 4u
#define PROC_UNAVAIL 3u
#define GARBAGE_ARGS 4u

#define SLOTS 8u
#define RECV_SIZE (64u << 10)       /* largest call we take: 64 KiB of argument XDR */
#define READ_MAX (256u << 10)       /* largest READ we serve */
#define REPLY_SIZE (READ_MAX + 64u) /* result data (a piece) plus the reduced stream */
#define TAG_REPLY (1ull << 32)      /* user_data of a REPLY: TAG_REPLY | slot */
#define TAG_REGISTER (1ull << 33) /* user_data of the REGISTER */

struct slot {
    uint32_t recv;  /* receive buffer (arena offset) */
    uint32_t reply; /* reply area: [stream 64 B][piece table 16 B ... padded][data] */
};

static uint8_t pattern_byte(uint32_t seed, uint32_t i)
{
    return (uint8_t)(seed + i * 31u + (i >> 8));
}

/* Big-endian word at p (p may be unaligned: the arguments are bytes from the wire). */
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

static void put32(uint8_t *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

static void submit(struct rr_app *app, const struct rr_sqe *s)
{
    int r;
    while ((r = rr_submit(app, s)) == -EAGAIN)
        sched_yield(); /* the daemon takes descriptors as it polls */
    if (r < 0) {
        fprintf(stderr, "submit: %s\n", strerror(-r));
        exit(1);
    }
}

static void post_recv(struct rr_app *app, const struct slot *sl, uint32_t i)
{
    struct rr_sqe s;
    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_POST_RECV;
    s.user_data = i;
    s.msg_off = sl[i].recv;
    s.msg_len = RECV_SIZE;
    submit(app, &s);
}

/* Answers the call that arrived in slot i (completion c), from slot i's reply area. */
static void answer(struct rr_app *app, const struct slot *sl, uint32_t i, const struct rr_cqe *c)
{
    const uint8_t *args = rr_arena_ptr(app, c->msg_off);
    uint32_t len = c->msg_len <= RECV_SIZE ? c->msg_len : 0; /* the daemon's word, checked anyway */
    uint8_t *stream = rr_arena_ptr(app, sl[i].reply);
    uint32_t table = sl[i].reply + 64, data = sl[i].reply + 128;
    uint8_t *bytes = rr_arena_ptr(app, data);
    uint32_t stream_len = 0, accept = 0;
    struct rr_sqe s;
    memset(&s, 0, sizeof s);

    switch (c->proc_) {
    case NULLPROC:
        break;
    case ECHO: { /* opaque data<>: the result is the same opaque, DDP-eligible */
        uint32_t n = len >= 4 ? get32(args) : 0;
        if (len < 4 || n > len - 4) {
            accept = GARBAGE_ARGS;
            break;
        }
        memcpy(bytes, args + 4, n); /* n < RECV_SIZE <= READ_MAX: fits the reply area */
        put32(stream, n);
        stream_len = 4;
        *rr_piece_at(app, table, 0) = (struct rr_piece){data, n, 4, 0};
        s.n_args = 1;
        s.pieces_off = table;
        break;
    }
    case READ: { /* (count, seed): count bytes of pattern(seed), DDP-eligible */
        if (len < 8 || get32(args) > READ_MAX) {
            accept = GARBAGE_ARGS;
            break;
        }
        uint32_t count = get32(args), seed = get32(args + 4);
        for (uint32_t k = 0; k < count; k++)
            bytes[k] = pattern_byte(seed, k);
        put32(stream, count);
        stream_len = 4;
        *rr_piece_at(app, table, 0) = (struct rr_piece){data, count, 4, 0};
        s.n_args = 1;
        s.pieces_off = table;
        break;
    }
    case WRITE: { /* (seed, opaque data<>): how many bytes match pattern(seed) */
        if (len < 8 || get32(args + 4) > len - 8) {
            accept = GARBAGE_ARGS;
            break;
        }
        uint32_t seed = get32(args), n = get32(args + 4), same = 0;
        for (uint32_t k = 0; k < n; k++)
            same += args[8 + k] == pattern_byte(seed, k);
        put32(stream, same);
        stream_len = 4;
        break;
    }
    case SLEEP: /* (microseconds, at most a second): this server sleeps on its thread, one call
                   at a time; examples/async_server.rs answers other calls meanwhile */
        if (len < 4) {
            accept = GARBAGE_ARGS;
            break;
        }
        uint32_t us = get32(args);
        poll(NULL, 0, (int)((us > 1000000u ? 1000000u : us) + 999u) / 1000);
        break;
    default:
        accept = PROC_UNAVAIL;
    }
    s.opcode = RR_OP_REPLY;
    s.target = c->handle;
    s.user_data = TAG_REPLY | i;
    s.prog = c->prog;
    s.vers = c->vers;
    s.proc_ = accept;
    s.msg_off = sl[i].reply;
    s.msg_len = stream_len; /* 0 unless SUCCESS: nothing was written then */
    submit(app, &s);
}

int main(int argc, char **argv)
{
    struct rr_app app;
    struct rr_sqe s;
    struct rr_cqe c;
    struct slot sl[SLOTS];
    uint64_t answered = 0;
    int r;

    if (argc != 2) {
        fprintf(stderr, "usage: %s <app-socket>\n", argv[0]);
        return 2;
    }
    if ((r = rr_connect(argv[1], &app)) < 0) {
        fprintf(stderr, "connect: %s\n", strerror(-r));
        return 1;
    }
    for (uint32_t i = 0; i < SLOTS; i++) {
        int64_t recv = rr_arena_alloc(&app, RECV_SIZE), reply = rr_arena_alloc(&app, REPLY_SIZE + 128);
        if (recv < 0 || reply < 0) {
            fprintf(stderr, "arena too small for %u slots\n", SLOTS);
            return 1;
        }
        sl[i] = (struct slot){(uint32_t)recv, (uint32_t)reply};
    }

    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_REGISTER;
    s.user_data = TAG_REGISTER;
    s.prog = RDMATEST;
    s.vers = 1;
    submit(&app, &s);
    if (rr_wait(&app, &c, 10000) != 1 || c.kind != RR_OP_REGISTER || c.status != RR_OK) {
        fprintf(stderr, "REGISTER failed: status %u\n", c.status);
        return 1;
    }
    for (uint32_t i = 0; i < SLOTS; i++)
        post_recv(&app, sl, i);
    printf("ready\n");
    fflush(stdout);

    while ((r = rr_wait(&app, &c, -1)) >= 0) {
        if (r == 0)
            continue;
        uint64_t i = c.user_data & 0xffffffffu;
        if (i >= SLOTS)
            continue;
        if (c.kind == RR_OP_POST_RECV && c.status == RR_OK) {
            answer(&app, sl, (uint32_t)i, &c);
        } else if (c.kind == RR_OP_REPLY) {
            /* The reply has gone (or failed: its caller is told by the daemon); its slot is free. */
            answered += c.status == RR_OK;
            post_recv(&app, sl, (uint32_t)i);
        } else {
            fprintf(stderr, "completion kind %u status %u\n", c.kind, c.status);
        }
    }
    printf("detached after %llu replies\n", (unsigned long long)answered);
    rr_close(&app);
    return 0;
}
