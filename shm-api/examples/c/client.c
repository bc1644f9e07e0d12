/*
 * A C ONC RPC client of RDMATEST through rpcrdmad's shared-memory rings (header-only binding).
 * Build: cc -std=c11 -I shm-api/include shm-api/examples/c/client.c -o rdmatest-client
 * Run:   ./rdmatest-client /path/to/app.sock PEER [YIELD-US]   (prints "NULL ok", "ECHO ok", "READ ok",
 *        "TIMEOUT ok", "CANCEL ok", and "RELEASED ok" when the cancelled call's buffer was lent to
 *        the peer, as it is through a daemon)
 * PEER is the name of a configured peer of the daemon ([[peers]] name) with an RDMATEST server
 * app behind it. With YIELD-US, waits look for YIELD-US microseconds, yielding the CPU between
 * polls, before they sleep (rr_set_wait).
 */
#include "rpcrdma.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>

#define RDMATEST 0x20524454u

static uint8_t pattern_byte(uint32_t seed, uint32_t i)
{
    return (uint8_t)(seed + i * 31u + (i >> 8));
}

/* Submits a call and waits for its completion; returns the completion status. */
static uint32_t call(struct rr_app *app, struct rr_sqe *s, struct rr_cqe *c)
{
    int r;
    while ((r = rr_submit(app, s)) == -EAGAIN)
        ;
    if (r < 0 || rr_wait(app, c, 10000) != 1) {
        fprintf(stderr, "submit/wait failed\n");
        exit(1);
    }
    return c->status;
}

int main(int argc, char **argv)
{
    struct rr_app app;
    struct rr_sqe s;
    struct rr_cqe c;
    int peer, r;

    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s <app-socket> <peer> [yield-us]\n", argv[0]);
        return 2;
    }
    if ((r = rr_connect(argv[1], &app)) < 0) {
        fprintf(stderr, "connect: %s\n", strerror(-r));
        return 1;
    }
    if (argc == 4)
        rr_set_wait(&app, (uint32_t)strtoul(argv[3], NULL, 10), 1);
    if ((peer = rr_peer_index(&app, argv[2])) < 0) {
        fprintf(stderr, "the daemon has no peer named \"%s\"\n", argv[2]);
        return 1;
    }

    /* Reply buffers no larger than the daemon receives inline cost no Reply chunk (ABI.md §4);
       a call's result buffer (a Write chunk) takes its share of that room. */
    uint32_t room = rr_reply_inline(&app, (uint32_t)peer, 0);
    uint32_t room1 = rr_reply_inline(&app, (uint32_t)peer, 1);
    if (room == 0)
        room = room1 = 4096;

    /* NULL: empty arguments, empty reply. */
    int64_t reply = rr_arena_alloc(&app, room);
    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_CALL;
    s.target = (uint32_t)peer;
    s.user_data = 1;
    s.prog = RDMATEST;
    s.vers = 1;
    s.proc_ = 0;
    s.reply_off = (uint32_t)reply;
    s.reply_len = room;
    if (call(&app, &s, &c) != RR_OK || c.rpc_stat != 0 || c.msg_len != 0 || c.user_data != 1) {
        fprintf(stderr, "NULL failed: status %u\n", c.status);
        return 1;
    }
    printf("NULL ok\n");

    /* ECHO of 3000 bytes: the data is a DDP piece after the inline length word; the result comes back in
       a result buffer, and the reduced reply holds only the length word. */
    const uint32_t n = 3000;
    int64_t args = rr_arena_alloc(&app, 4), data = rr_arena_alloc(&app, n), res = rr_arena_alloc(&app, n);
    int64_t table = rr_arena_alloc(&app, 2 * sizeof(struct rr_piece));
    if (args < 0 || data < 0 || res < 0 || table < 0)
        return 1;
    *(uint32_t *)rr_arena_ptr(&app, (uint32_t)args) = htonl(n);
    for (uint32_t i = 0; i < n; i++)
        ((uint8_t *)rr_arena_ptr(&app, (uint32_t)data))[i] = pattern_byte(77, i);
    *rr_piece_at(&app, (uint32_t)table, 0) = (struct rr_piece){(uint32_t)data, n, 4, 0};
    *rr_piece_at(&app, (uint32_t)table, 1) = (struct rr_piece){(uint32_t)res, n, 0, 0};
    s.user_data = 2;
    s.proc_ = 1;
    s.msg_off = (uint32_t)args;
    s.msg_len = 4;
    s.n_args = 1;
    s.n_results = 1;
    s.pieces_off = (uint32_t)table;
    s.reply_len = room1;
    if (call(&app, &s, &c) != RR_OK || c.rpc_stat != 0 || c.msg_len != 4 || c.n_results != 1) {
        fprintf(stderr, "ECHO failed: status %u len %u\n", c.status, c.msg_len);
        return 1;
    }
    struct rr_piece *got = rr_piece_at(&app, (uint32_t)table, 1);
    if (ntohl(*(uint32_t *)rr_arena_ptr(&app, c.msg_off)) != n || got->used != n || got->xdr_pos != 4 ||
        memcmp(rr_arena_ptr(&app, (uint32_t)res), rr_arena_ptr(&app, (uint32_t)data), n) != 0) {
        fprintf(stderr, "ECHO mismatch\n");
        return 1;
    }
    printf("ECHO ok\n");

    /* READ 5000 bytes of pattern(9) into a result buffer. */
    const uint32_t m = 5000;
    int64_t rargs = rr_arena_alloc(&app, 8), rbuf = rr_arena_alloc(&app, m);
    int64_t rtable = rr_arena_alloc(&app, sizeof(struct rr_piece));
    if (rargs < 0 || rbuf < 0 || rtable < 0)
        return 1;
    ((uint32_t *)rr_arena_ptr(&app, (uint32_t)rargs))[0] = htonl(m);
    ((uint32_t *)rr_arena_ptr(&app, (uint32_t)rargs))[1] = htonl(9);
    *rr_piece_at(&app, (uint32_t)rtable, 0) = (struct rr_piece){(uint32_t)rbuf, m, 0, 0};
    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_CALL;
    s.flags = RR_FLAG_XID_APP;
    s.xid = 0x1234;
    s.target = (uint32_t)peer;
    s.user_data = 3;
    s.prog = RDMATEST;
    s.vers = 1;
    s.proc_ = 2;
    s.msg_off = (uint32_t)rargs;
    s.msg_len = 8;
    s.n_results = 1;
    s.pieces_off = (uint32_t)rtable;
    s.reply_off = (uint32_t)reply;
    s.reply_len = room1;
    if (call(&app, &s, &c) != RR_OK || c.xid != 0x1234 || rr_piece_at(&app, (uint32_t)rtable, 0)->used != m) {
        fprintf(stderr, "READ failed: status %u\n", c.status);
        return 1;
    }
    for (uint32_t i = 0; i < m; i++)
        if (((uint8_t *)rr_arena_ptr(&app, (uint32_t)rbuf))[i] != pattern_byte(9, i)) {
            fprintf(stderr, "READ mismatch at %u\n", i);
            return 1;
        }
    printf("READ ok\n");

    /* SLEEP 200 ms with a time limit of 20 ms: the daemon ends the call with RR_TIMEOUT. */
    int64_t sargs = rr_arena_alloc(&app, 4);
    if (sargs < 0)
        return 1;
    *(uint32_t *)rr_arena_ptr(&app, (uint32_t)sargs) = htonl(200000);
    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_CALL;
    s.target = (uint32_t)peer;
    s.user_data = 4;
    s.prog = RDMATEST;
    s.vers = 1;
    s.proc_ = 4;
    s.msg_off = (uint32_t)sargs;
    s.msg_len = 4;
    s.reply_off = (uint32_t)reply;
    s.reply_len = room;
    s.timeout_ms = 20;
    if (call(&app, &s, &c) != RR_TIMEOUT || c.user_data != 4) {
        fprintf(stderr, "TIMEOUT failed: status %u\n", c.status);
        return 1;
    }
    printf("TIMEOUT ok\n");

    /* The same without a limit, and with a reply buffer larger than the daemon receives inline
       (so the server would send a long reply through a Reply chunk), cancelled: it ends once,
       RR_CANCELLED (the CANCEL itself has no completion). Through a daemon the server may still
       write that buffer: the completion says so (RR_CQE_LENT), and the buffer is ours again
       only at the call's RR_OP_RELEASED, once the server has answered. */
    int64_t big = rr_arena_alloc(&app, room + 4096);
    if (big < 0)
        return 1;
    s.user_data = 5;
    s.timeout_ms = 0;
    s.reply_off = (uint32_t)big;
    s.reply_len = room + 4096;
    while ((r = rr_submit(&app, &s)) == -EAGAIN)
        ;
    while (r == 0 && (r = rr_cancel(&app, 5)) == -EAGAIN)
        ;
    if (r < 0 || rr_wait(&app, &c, 10000) != 1 || c.status != RR_CANCELLED || c.user_data != 5) {
        fprintf(stderr, "CANCEL failed: %d status %u\n", r, c.status);
        return 1;
    }
    printf("CANCEL ok\n");
    if (c.flags & RR_CQE_LENT) {
        if (rr_wait(&app, &c, 10000) != 1 || c.kind != RR_OP_RELEASED || c.user_data != 5) {
            fprintf(stderr, "RELEASED failed: kind %u\n", c.kind);
            return 1;
        }
        printf("RELEASED ok\n");
    }
    rr_close(&app);
    return 0;
}
